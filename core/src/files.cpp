#include "diaspora/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "diaspora/error.hpp"

namespace diaspora {

void write_file_atomic(const std::filesystem::path& path, std::string_view content, unsigned mode) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, static_cast<mode_t>(mode));
  if (fd < 0) throw Error(tmp.string() + ": cannot create: " + std::strerror(errno));
  auto fail = [&](const char* what, int err) {
    if (fd >= 0) ::close(fd);
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw Error(tmp.string() + ": " + what + ": " + std::strerror(err));
  };
  ::fchmod(fd, static_cast<mode_t>(mode));  // in case the file existed with other permissions
  std::size_t off = 0;
  while (off < content.size()) {
    ssize_t n = ::write(fd, content.data() + off, content.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write failed", errno);
    }
    off += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync failed", errno);
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) fail("close failed", errno);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail(("cannot rename to " + path.string()).c_str(), ec.value());
  const std::filesystem::path dir = path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) throw Error(dir.string() + ": cannot open to sync the rename of " + path.string() + ": " + std::strerror(errno));
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0) throw Error(dir.string() + ": fsync failed after renaming " + path.string() + ": " + std::strerror(err));
}

}  // namespace diaspora
