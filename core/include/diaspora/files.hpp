// POSIX file helpers of the storage layer, shared by everything that writes files that must
// survive a crash: the relay's topic log, the plugin's spool, certificates and secrets,
// diaspora-train's checkpoints and results. Framed records are in diaspora/records.hpp.
//
// @par Thread Safety
// Every function here is reentrant (no shared state); an Fd is owned by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

namespace diaspora {

/// How far write_file_atomic() goes before it returns.
enum class Durability {
  process,       ///< no fsync: the new file survives a crash of the process, not of the machine
  file,          ///< the file is fsynced before the rename; the rename itself is not synced
  file_and_dir,  ///< the file, then the directory (the rename survives a power loss)
};

/// Replaces `path` with `content` atomically: writes `path`.tmp (created with permission
/// bits `mode`, so a secret is never briefly readable by others), syncs it as `durability`
/// says, renames it over `path` and, for Durability::file_and_dir, fsyncs the directory.
/// Readers see the old file or the new one, never a mix.
/// @throws diaspora::Error naming the file when it cannot be created, written, synced or
///         renamed (the .tmp is removed then); for file_and_dir also when the directory
///         cannot be synced (the rename has happened then).
/// @par Thread Safety
/// Reentrant; concurrent calls for the same `path` race on the shared .tmp name.
void write_file_atomic(const std::filesystem::path& path, std::string_view content, unsigned mode = 0644,
                       Durability durability = Durability::file_and_dir);

/// The whole content of the file at `path` (bytes as they are), read at most `max_bytes`.
/// @throws diaspora::Error naming the file and the system's reason when it cannot be
///         opened or read, or when it is larger than `max_bytes`.
/// @par Thread Safety
/// Reentrant.
std::string read_file(const std::filesystem::path& path, std::size_t max_bytes = std::size_t{1} << 30);

}  // namespace diaspora

namespace diaspora::storage {

/// The text of an errno value, e.g. "No space left on device".
std::string errno_text(int err);

/// Writes all `n` bytes at `pos`. Returns 0 or an errno value (EIO when write() makes no
/// progress); EINTR is retried.
int pwrite_all(int fd, const char* p, std::size_t n, std::uint64_t pos);
/// Reads exactly `n` bytes at `pos`. Returns 0 or an errno value (EIO when the file ends
/// first); EINTR is retried.
int pread_all(int fd, char* p, std::size_t n, std::uint64_t pos);
/// fsync()s a directory, making renames and new files in it durable. Returns 0 or an errno.
int fsync_dir(const std::filesystem::path& dir);

/// An owned file descriptor, closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  /// Closes the descriptor (if any).
  void reset() noexcept;

 private:
  int fd_ = -1;
};

/// Takes the lock that makes one process the only user of a data directory: opens (creating
/// it) `dir`/.lock and flock()s it, exclusive and non-blocking. Returns the descriptor that
/// holds the lock (released when it is closed, or when the process dies). On failure returns
/// an empty Fd and sets `err`: EWOULDBLOCK when another open file holds the lock (another
/// process, or another object of this one), else the errno of the open or the flock.
Fd lock_directory(const std::filesystem::path& dir, int& err);

}  // namespace diaspora::storage
