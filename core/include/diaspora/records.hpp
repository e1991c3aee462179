// Framed records in segment files: the on-disk format shared by the relay's topic log and
// the plugin's spool, with its writer (seal_frame) and its checking reader (read_frame).
//
// A frame (integers little-endian):
//   u32 length   bytes of the body that follows
//   u32 crc32c   CRC32C of those `length` bytes
//   body         what the user of the frame puts there (the spool: an event; the log: its
//                record fields and the event)
// A reader never hands out a body whose CRC fails. Segment files are named by a 20-digit
// zero-padded number and an extension (e.g. 00000000000000000042.log), so that their names
// sort in number order.
//
// @par Thread Safety
// Free functions are reentrant. A FileWindow belongs to one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace diaspora::storage {

// ---- little-endian integers ----------------------------------------------------------------
inline void put_le(char* p, std::uint64_t v, int bytes) noexcept {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
inline std::uint64_t get_le(const char* p, int bytes) noexcept {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(p[i]);
  return v;
}
inline std::uint16_t get_u16(const char* p) noexcept { return static_cast<std::uint16_t>(get_le(p, 2)); }
inline std::uint32_t get_u32(const char* p) noexcept { return static_cast<std::uint32_t>(get_le(p, 4)); }
inline std::uint64_t get_u64(const char* p) noexcept { return get_le(p, 8); }

// ---- frames ----------------------------------------------------------------------------------
/// Bytes of a frame's header (length + CRC).
inline constexpr std::size_t kFrameHeaderBytes = 8;

/// Body lengths a reader accepts; anything outside is a corrupt frame.
struct FrameLimits {
  std::uint32_t min_body = 1;
  std::uint32_t max_body = 64u << 20;
};

/// The writer: fills in the header at `frame` for the `body_len` bytes already written
/// right after it. Never throws.
void seal_frame(char* frame, std::uint32_t body_len) noexcept;

/// Buffered reads of one file's bytes [0, limit) through a read-ahead window.
class FileWindow {
 public:
  /// Reads `fd` (not owned) up to `limit`, `window` bytes at a time; drops what is buffered.
  void reset(int fd, std::uint64_t limit, std::size_t window);
  /// The file grew (an append): what is buffered stays valid.
  void extend(std::uint64_t limit) noexcept { limit_ = limit; }
  std::uint64_t limit() const noexcept { return limit_; }
  /// Points `p` at bytes [off, off + n) of the file, valid until the next call. Returns 0,
  /// -1 when they pass the limit, or an errno value (EIO when the file is shorter).
  int view(std::uint64_t off, std::size_t n, const char*& p);

 private:
  int fd_ = -1;
  std::uint64_t limit_ = 0;
  std::size_t window_ = 64u << 10;
  std::uint64_t buf_off_ = 0;
  std::unique_ptr<char[]> buf_;  // not zero-filled: every byte used was read into it first
  std::size_t cap_ = 0;
  std::size_t size_ = 0;
};

/// One frame as read_frame() found it.
struct Frame {
  enum class Status {
    ok,        ///< a whole frame (and, when checked, a good CRC)
    end,       ///< `pos` is at the limit: no more frames
    torn,      ///< a partial header or body before the limit: what an interrupted write leaves
    corrupt,   ///< an impossible length or a CRC mismatch
    io_error,  ///< the file could not be read (err)
  };
  Status status = Status::end;
  std::uint32_t length = 0;       ///< body bytes (ok, or torn after a whole header)
  std::uint32_t crc = 0;
  const char* body = nullptr;     ///< when read with check_crc: valid until the window's next call
  int err = 0;                    ///< io_error: the errno value
  std::string why;                ///< torn, corrupt, io_error: what is wrong, for a log line
  /// Bytes the whole frame takes in the file.
  std::uint64_t size() const noexcept { return kFrameHeaderBytes + length; }
};

/// The reader: the frame at `pos` of `w`. With check_crc the body is read and verified;
/// without, only the header (length and bounds). Never throws except std::bad_alloc.
Frame read_frame(FileWindow& w, std::uint64_t pos, const FrameLimits& limits, bool check_crc);

/// Frames lost from the bad frame at `from` to the window's limit, counted by following the
/// length fields while they stay plausible; only frames ending after `after` count. At least
/// one when anything after `after` is lost.
std::uint64_t count_lost_frames(FileWindow& w, std::uint64_t from, std::uint64_t after, const FrameLimits& limits);

// ---- segment files ---------------------------------------------------------------------------
/// "<number, 20 digits zero-padded><ext>", e.g. segment_name(42, ".log").
std::string segment_name(std::uint64_t number, std::string_view ext);
/// The largest segment number parse_segment_name() accepts (2^62): offsets and segment
/// numbers stay far below it, so the next one never wraps.
inline constexpr std::uint64_t kMaxSegmentNumber = std::uint64_t{1} << 62;
/// The number of a segment_name() with extension `ext`; nullopt for any other name and for
/// a number above kMaxSegmentNumber.
std::optional<std::uint64_t> parse_segment_name(std::string_view name, std::string_view ext);
/// The segment files (regular files named by segment_name() with `ext`) in `dir`, by number.
/// Throws std::filesystem::filesystem_error when `dir` cannot be read.
std::vector<std::pair<std::uint64_t, std::filesystem::path>> list_segments(const std::filesystem::path& dir,
                                                                           std::string_view ext);

}  // namespace diaspora::storage
