#include "file_io.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace diaspora::relay {

int pwrite_all(int fd, const char* p, std::size_t n, std::uint64_t pos) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(pos));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;
    p += w;
    n -= static_cast<std::size_t>(w);
    pos += static_cast<std::uint64_t>(w);
  }
  return 0;
}

int pread_all(int fd, char* p, std::size_t n, std::uint64_t pos) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(pos));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) return EIO;
    p += r;
    n -= static_cast<std::size_t>(r);
    pos += static_cast<std::uint64_t>(r);
  }
  return 0;
}

int fsync_dir(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  const int rc = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return rc;
}

}  // namespace diaspora::relay
