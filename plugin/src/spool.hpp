// The engine plugin's on-disk spool: serialized events wait here while the relay is
// unreachable and are replayed in order later. Append-only segment files with a CRC32C per
// record, a durable read cursor, and recovery after a crash (SIGKILL of the engine).
//
// Internal to the plugin (not installed, not part of its C ABI).
//
// On-disk layout (dir):
//   <segment number, 20 digits zero-padded>.spool   segments in replay order; numbers start at
//                                                   2^40 and grow at the tail; prepend() writes
//                                                   a new head segment numbered below the others
//   cursor                                          the durable read cursor (see spool.cpp)
//   cursor.tmp                                      a cursor being written (replaced by rename)
//   .lock                                           flock()ed by the one Spool using dir
// Other files are ignored and left alone.
//
// Record format (integers little-endian):
//   u32 length   payload bytes, 1 to 64 MiB
//   u32 crc32c   CRC32C of the payload
//   payload      the event, opaque bytes
//
// Durability: append() write()s without fsync, so a record survives a crash of the process
// as soon as append() returns (it is in the page cache) and a crash of the machine only after
// sync(). prepend() fsyncs: its records are durable when it returns. A crash never makes
// the spool return a corrupt record or lose one that had survived as above. Delivery is
// at least once: records read but not yet committed are read again after a restart, and so
// are committed ones when the cursor file is lost or damaged (a power loss: commit() does
// not fsync it).
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "diaspora/error.hpp"

namespace diaspora::plugin {

struct SpoolOptions {
  std::filesystem::path dir;                  ///< created if missing
  std::uint64_t max_bytes = 256ull << 20;     ///< soft bound on bytes(), see Spool::append()
  std::uint64_t segment_bytes = 4ull << 20;   ///< a segment is closed once it reaches this size
  /// Receives one line per recovery finding (truncated tail, skipped records, reset cursor)
  /// and per failed clean-up. Empty = write "diaspora-plugin: spool: <line>" to stderr.
  /// Called on the thread that called into the Spool.
  std::function<void(const std::string& line)> log;
};

/// A spool operation failed. The message names the path and what to do about it.
class SpoolError : public diaspora::Error {
 public:
  using Error::Error;
};

/// A place between two records. Opaque to callers: only obtained from Spool::read() and
/// handed back to Spool::commit(). Later positions compare greater.
struct SpoolPosition {
  std::uint64_t segment = 0;
  std::uint64_t offset = 0;
  friend auto operator<=>(const SpoolPosition&, const SpoolPosition&) = default;
};

/// Records framed as a spool segment stores them (u32 length, u32 CRC32C, payload), built in
/// place: a caller serialises each payload straight into the bytes Spool::append() writes,
/// with no string and no copy per record.
///
/// @par Thread Safety
/// Not thread-safe: one owner at a time.
class SpoolRecords {
 public:
  /// Starts a record and returns the buffer to append its payload to (only append: the
  /// bytes before the payload are the frames of earlier records). Ends the record begun
  /// before, if end() was not called for it.
  std::string& begin();
  /// Ends the record begun last: fills in its frame. A record left empty is dropped (the
  /// spool never stores an empty one). Throws SpoolError, the record dropped, when its
  /// payload is over 64 MiB.
  void end();
  /// Drops the record begun last (its payload could not be completed). No effect without one.
  void cancel() noexcept;
  /// Whole records held (an open one is not counted).
  std::size_t count() const noexcept { return count_; }
  bool empty() const noexcept { return count_ == 0; }
  /// The whole records' frames, byte for byte as a segment stores them (tests write
  /// segments with it). Valid until the next call that changes the records.
  std::string_view bytes() const noexcept { return std::string_view(buf_).substr(0, open_ == std::string::npos ? buf_.size() : open_); }
  /// Drops every record; keeps the buffer's memory unless it grew past 8 MiB.
  void clear() noexcept;

 private:
  friend class Spool;
  std::string buf_;
  std::size_t open_ = std::string::npos;  ///< frame offset of the open record
  std::size_t count_ = 0;
};

/// A bounded, crash-safe FIFO of byte strings on disk, with a read position that runs ahead
/// of a durable cursor (delivered but not yet acknowledged records are re-read after
/// rewind() or a restart).
///
/// @par Thread Safety
/// Not thread-safe: the caller serializes every call (its own mutex). Two Spools never share
/// a directory: the second one, in this process or another, fails to open.
class Spool {
 public:
  /// Opens (creating if needed) options.dir, locks it and recovers: verifies every record
  /// after the cursor, truncates a torn or corrupt tail of the last segment, skips the rest
  /// of an earlier segment after a corrupt record (counted in corrupt_records_skipped()),
  /// and deletes segments that lie before the cursor. A corrupt cursor file restarts
  /// delivery at the oldest segment (re-delivery, never loss).
  /// Throws SpoolError when the directory cannot be created, read or written, or when
  /// another Spool holds it ("spool DIR is in use by another process").
  explicit Spool(SpoolOptions options);
  /// Closes the files and releases the lock. Does not sync. Never throws.
  ~Spool();
  Spool(const Spool&) = delete;
  Spool& operator=(const Spool&) = delete;

  /// Appends `records` at the tail with one write() (no fsync). Records with `droppable`
  /// set (metrics) are refused when bytes() plus their on-disk size (8 + payload bytes each)
  /// would exceed max_bytes: then none is written and 0 is returned. Other records are always
  /// written (the bound is soft for them). Returns the number written: all or none.
  /// Throws SpoolError for an empty record or one over 64 MiB (nothing written), and on an
  /// I/O error such as a full disk: then the partial write is undone, or, should that fail
  /// too, later appends go to a new segment and a restart keeps at most a whole-record
  /// prefix of the failed call.
  std::size_t append(std::span<const std::string_view> records, bool droppable = false);
  /// The same for records framed in place; a record still open in `records` is not written.
  std::size_t append(const SpoolRecords& records, bool droppable = false);

  /// Puts `records` (in this order) before the first unacknowledged record, e.g. the unacked
  /// batches of a connection that dropped. Calls rewind() first. Durable when it returns:
  /// writes a new head segment holding these records followed by the unacknowledged rest of
  /// the current head segment, fdatasyncs it, switches the cursor to it (fsynced temp file +
  /// rename), then deletes the old head segment. A crash at any point leaves either the old
  /// state (the call had no effect) or the new one; never a lost or a duplicated record.
  /// Positions read() returned before the call are void afterwards (commit() refuses those
  /// past the cursor). Throws SpoolError (then the call had no effect) for an empty or
  /// oversized record or an I/O error.
  void prepend(std::span<const std::string_view> records);

  /// Reads records from the read position into `out` (appended): at most max_records and
  /// max_bytes of payload, but at least one record when any is unread and max_records > 0.
  /// Returns the number read and sets `end` to the position after the last one (to commit
  /// later). Advances the read position, not the durable cursor. Never returns a corrupt
  /// record: should one appear on disk after recovery, the rest of its segment is skipped
  /// (logged, counted in corrupt_records_skipped()). Throws SpoolError on an I/O error.
  std::size_t read(std::vector<std::string>& out, std::size_t max_records, std::size_t max_bytes,
                   SpoolPosition& end);
  /// The same, handing each record to `sink` instead of copying it into a string: the view
  /// is valid during the call only. When `sink` throws, or reading does (SpoolError), the
  /// read position stays where it was before this call (the records of this call are read
  /// again) and the exception propagates; the vector overload then leaves in `out` the
  /// records it had taken.
  std::size_t read(const std::function<void(std::string_view)>& sink, std::size_t max_records,
                   std::size_t max_bytes, SpoolPosition& end);

  /// Everything before `end` (from read()) has been delivered: moves the durable cursor there
  /// (temp file + rename, no fsync: a stale cursor only causes re-delivery) and deletes the
  /// segments entirely before it. A position at or before the cursor is ignored. Moves the
  /// read position forward to `end` if it was behind. Throws SpoolError for a position that
  /// read() cannot have returned or when the cursor file cannot be written (then nothing
  /// changed).
  void commit(SpoolPosition end);

  /// Moves the read position back to the durable cursor.
  void rewind() noexcept;

  /// fdatasyncs the tail segment (and the directory after a new segment was created), so
  /// everything appended survives a crash of the machine. Throws SpoolError on failure.
  void sync();

  /// True when read() would return a record.
  bool has_unread() const noexcept;
  /// On-disk bytes (8-byte frame included) of the records at or after the durable cursor:
  /// what a restart would replay.
  std::uint64_t bytes() const noexcept;
  /// Number of those records.
  std::uint64_t records() const noexcept;
  /// Records found corrupt and skipped, during recovery or later reads. Records after a
  /// corrupt one in the same segment cannot be delimited reliably; they are counted by
  /// following the length fields, as far as those stay plausible.
  std::uint64_t corrupt_records_skipped() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> self_;
};

}  // namespace diaspora::plugin
