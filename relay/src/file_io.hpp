// Small POSIX file helpers shared by the relay's topic log and the plugin's spool.
// Each returns 0 or an errno value (EIO when a file ends before `n` bytes); EINTR is
// retried. Thread-safe (no shared state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

namespace diaspora::relay {

/// Writes all `n` bytes at `pos`.
int pwrite_all(int fd, const char* p, std::size_t n, std::uint64_t pos);
/// Reads exactly `n` bytes at `pos`.
int pread_all(int fd, char* p, std::size_t n, std::uint64_t pos);
/// fsync()s a directory, making renames and new files in it durable.
int fsync_dir(const std::filesystem::path& dir);

}  // namespace diaspora::relay
