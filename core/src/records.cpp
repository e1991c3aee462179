#include "diaspora/records.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>

#include "diaspora/crc32c.hpp"
#include "diaspora/files.hpp"

namespace diaspora::storage {

namespace {
constexpr std::size_t kShrinkAbove = 8u << 20;  // release a buffer grown by a huge record
}  // namespace

void seal_frame(char* frame, std::uint32_t body_len) noexcept {
  put_le(frame, body_len, 4);
  put_le(frame + 4, crc32c(frame + kFrameHeaderBytes, body_len), 4);
}

void FileWindow::reset(int fd, std::uint64_t limit, std::size_t window) {
  fd_ = fd;
  limit_ = limit;
  window_ = window;
  buf_off_ = 0;
  size_ = 0;
  if (cap_ > kShrinkAbove) buf_.reset(), cap_ = 0;
}

int FileWindow::view(std::uint64_t off, std::size_t n, const char*& p) {
  if (off > limit_ || limit_ - off < n) return -1;
  if (off >= buf_off_ && off - buf_off_ + n <= size_) {
    p = buf_.get() + (off - buf_off_);
    return 0;
  }
  const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(std::max(n, window_), limit_ - off));
  if (want > cap_ || (cap_ > kShrinkAbove && want <= window_)) {
    buf_.reset();  // the old buffer goes first: never both at once
    buf_ = std::make_unique_for_overwrite<char[]>(want);  // default-initialised: no zero fill of a window read over at once
    cap_ = want;
  }
  size_ = 0;
  if (int err = pread_all(fd_, buf_.get(), want, off)) return err;
  size_ = want;
  buf_off_ = off;
  p = buf_.get();
  return 0;
}

Frame read_frame(FileWindow& w, std::uint64_t pos, const FrameLimits& limits, bool check_crc) {
  Frame f;
  if (pos >= w.limit()) return f;
  auto io_error = [&f](int err) {
    f.status = Frame::Status::io_error;
    f.err = err < 0 ? EIO : err;
    f.why = "read error: " + errno_text(f.err);
    return f;
  };
  if (w.limit() - pos < kFrameHeaderBytes) {
    f.status = Frame::Status::torn;
    f.why = "a partial record header (" + std::to_string(w.limit() - pos) + " trailing bytes)";
    return f;
  }
  const char* h = nullptr;
  if (int err = w.view(pos, kFrameHeaderBytes, h)) return io_error(err);
  f.length = get_u32(h);
  f.crc = get_u32(h + 4);
  if (f.length < limits.min_body || f.length > limits.max_body) {
    f.status = Frame::Status::corrupt;
    f.why = "impossible record length " + std::to_string(f.length);
    return f;
  }
  if (w.limit() - pos - kFrameHeaderBytes < f.length) {
    f.status = Frame::Status::torn;
    f.why = "a partial record (" + std::to_string(f.size()) + " bytes, " + std::to_string(w.limit() - pos) + " left)";
    return f;
  }
  if (check_crc) {
    if (int err = w.view(pos + kFrameHeaderBytes, f.length, f.body)) return io_error(err);
    if (crc32c(f.body, f.length) != f.crc) {
      f.status = Frame::Status::corrupt;
      f.why = "checksum mismatch";
      return f;
    }
  }
  f.status = Frame::Status::ok;
  return f;
}

std::uint64_t count_lost_frames(FileWindow& w, std::uint64_t from, std::uint64_t after, const FrameLimits& limits) {
  std::uint64_t n = 0;
  std::uint64_t pos = from;
  while (pos < w.limit()) {
    std::uint64_t end = w.limit();
    bool plausible = false;
    const char* h = nullptr;
    if (w.limit() - pos >= kFrameHeaderBytes && w.view(pos, kFrameHeaderBytes, h) == 0) {
      const std::uint32_t len = get_u32(h);
      plausible = len >= limits.min_body && len <= limits.max_body && w.limit() - pos - kFrameHeaderBytes >= len;
      if (plausible) end = pos + kFrameHeaderBytes + len;
    }
    if (end > after) ++n;
    if (!plausible) break;
    pos = end;
  }
  return n;
}

std::string segment_name(std::uint64_t number, std::string_view ext) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%020llu", static_cast<unsigned long long>(number));
  std::string name(digits);
  name += ext;
  return name;
}

std::optional<std::uint64_t> parse_segment_name(std::string_view name, std::string_view ext) {
  if (name.size() != 20 + ext.size() || name.substr(20) != ext) return std::nullopt;
  if (!std::all_of(name.begin(), name.begin() + 20, [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  std::uint64_t n = 0;
  auto [end, ec] = std::from_chars(name.data(), name.data() + 20, n);
  if (ec != std::errc() || end != name.data() + 20) return std::nullopt;  // above 2^64 - 1
  // Numbers count records or segments: no writer comes near 2^62. A file named beyond it
  // (damaged, or not ours) would leave no room for the next offset, which would wrap to 0
  // (found by tests/fuzz/fuzz_log.cpp): it is not a segment.
  if (n > kMaxSegmentNumber) return std::nullopt;
  return n;
}

std::vector<std::pair<std::uint64_t, std::filesystem::path>> list_segments(const std::filesystem::path& dir,
                                                                           std::string_view ext) {
  std::vector<std::pair<std::uint64_t, std::filesystem::path>> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    if (auto n = parse_segment_name(e.path().filename().string(), ext)) files.emplace_back(*n, e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace diaspora::storage
