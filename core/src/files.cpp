#include "diaspora/files.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "diaspora/error.hpp"

namespace diaspora {

void write_file_atomic(const std::filesystem::path& path, std::string_view content, unsigned mode,
                       Durability durability) {
  using storage::errno_text;
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, static_cast<mode_t>(mode));
  if (fd < 0) throw Error(tmp.string() + ": cannot create: " + errno_text(errno));
  auto fail = [&](const char* what, int err) {
    if (fd >= 0) ::close(fd);
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw Error(tmp.string() + ": " + what + ": " + errno_text(err));
  };
  ::fchmod(fd, static_cast<mode_t>(mode));  // in case the file existed with other permissions
  if (int err = storage::pwrite_all(fd, content.data(), content.size(), 0)) fail("write failed", err);
  if (durability != Durability::process && ::fsync(fd) != 0) fail("fsync failed", errno);
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) fail("close failed", errno);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail(("cannot rename to " + path.string()).c_str(), ec.value());
  if (durability != Durability::file_and_dir) return;
  const std::filesystem::path dir = path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
  if (int err = storage::fsync_dir(dir))
    throw Error(dir.string() + ": fsync failed after renaming " + path.string() + ": " + errno_text(err));
}

std::string read_file(const std::filesystem::path& path, std::size_t max_bytes) {
  using storage::errno_text;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path.string() + ": cannot open: " + errno_text(errno));
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw Error(path.string() + ": cannot read: " + errno_text(err));
    }
    if (n == 0) break;
    if (out.size() + static_cast<std::size_t>(n) > max_bytes) {
      ::close(fd);
      throw Error(path.string() + ": larger than " + std::to_string(max_bytes) + " bytes");
    }
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace diaspora

namespace diaspora::storage {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

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

void Fd::reset() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Fd lock_directory(const std::filesystem::path& dir, int& err) {
  err = 0;
  const std::filesystem::path path = dir / ".lock";
  Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd) {
    err = errno;
    return fd;
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    err = errno;
    return Fd();
  }
  return fd;
}

}  // namespace diaspora::storage
