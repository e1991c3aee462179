// The topic log's record: a storage frame (diaspora/records.hpp) whose body is
//   u64 offset        consecutive per topic from 0; a segment's first record has its base offset
//   i64 time_us       append time, microseconds since the epoch
//   u64 producer_seq  the batch's seq
//   u16 producer_id_len, producer id bytes
//   u16 dedupe_key_len, dedupe key bytes
//   payload           the rest of the record
// (integers little-endian; a whole record is at most 16 MiB). Each record carries its
// producer id, seq and dedupe key so that both de-dupe tables can be rebuilt from the log
// itself on recovery, with no side file to keep consistent.
//
// Internal to the relay. Thread safety: free functions are reentrant; a WriteBuffer or a
// RecordScanner belongs to one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "diaspora/records.hpp"

namespace diaspora::relay {

constexpr std::size_t kFixedBodyBytes = 8 + 8 + 8 + 2 + 2;  // offset, time, seq, two u16 lengths
constexpr std::size_t kMaxRecordBytes = 16u << 20;          // frame included
constexpr std::size_t kMaxFieldBytes = 0xffff;              // producer id, dedupe key
constexpr storage::FrameLimits kRecordLimits{kFixedBodyBytes, kMaxRecordBytes - storage::kFrameHeaderBytes};

/// Bytes the record takes in a segment, frame included.
inline std::size_t record_size(std::string_view producer, std::string_view key, std::string_view payload) {
  return storage::kFrameHeaderBytes + kFixedBodyBytes + producer.size() + key.size() + payload.size();
}

/// The writer's output buffer: grows without zero-filling (every byte is written right
/// after extend()) and is reused from group to group, so its pages stay mapped instead of
/// being faulted in afresh for each group commit (the profile showed both costs).
class WriteBuffer {
 public:
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  std::size_t capacity() const noexcept { return cap_; }
  const char* data() const noexcept { return data_.get(); }
  char* data() noexcept { return data_.get(); }
  void clear() noexcept { size_ = 0; }
  /// Makes room for n bytes in all. Throws std::bad_alloc.
  void reserve(std::size_t n);
  /// Appends n bytes the caller must fill; returns where they start. Throws std::bad_alloc.
  char* extend(std::size_t n) {
    reserve(size_ + n);
    char* at = data_.get() + size_;
    size_ += n;
    return at;
  }

 private:
  std::unique_ptr<char[]> data_;
  std::size_t size_ = 0;
  std::size_t cap_ = 0;
};

/// Appends one framed record to `out`. The caller has checked the sizes (kMaxFieldBytes,
/// kMaxRecordBytes). Throws std::bad_alloc.
void encode_record(WriteBuffer& out, std::uint64_t offset, std::int64_t time_us, std::uint64_t seq,
                   std::string_view producer, std::string_view key, std::string_view payload);

/// A record's fields; the views point into the reader's buffer.
struct RecordView {
  std::uint64_t offset = 0;
  std::int64_t time_us = 0;
  std::uint64_t seq = 0;
  std::string_view producer, key, payload;
};

/// The fields of a record body of `n` bytes; nullopt when they do not fit in it.
std::optional<RecordView> parse_body(const char* p, std::size_t n);

/// Reads records sequentially from [pos, end) of a segment file through a read-ahead
/// window, verifying frame bounds and CRC. Never returns a record whose CRC fails.
class RecordScanner {
 public:
  enum class Status { record, end, bad, io_error };

  RecordScanner(int fd, std::uint64_t pos, std::uint64_t end, std::size_t window) : pos_(pos) {
    window_.reset(fd, end, window);
  }

  Status next();
  const RecordView& record() const { return record_; }
  std::uint64_t record_pos() const { return record_pos_; }
  /// After next(): the end of the returned record, or where the bad record starts.
  std::uint64_t pos() const { return pos_; }
  /// After bad or io_error: what is wrong.
  const std::string& reason() const { return reason_; }

 private:
  storage::FileWindow window_;
  std::uint64_t pos_;
  RecordView record_;
  std::uint64_t record_pos_ = 0;
  std::string reason_;
};

}  // namespace diaspora::relay
