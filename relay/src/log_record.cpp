#include "log_record.hpp"

#include <algorithm>
#include <cstring>

namespace diaspora::relay {

using storage::kFrameHeaderBytes;

void WriteBuffer::reserve(std::size_t n) {
  if (n <= cap_) return;
  const std::size_t cap = std::max(n, cap_ + cap_ / 2);
  std::unique_ptr<char[]> grown(new char[cap]);  // uninitialised on purpose
  if (size_ > 0) std::memcpy(grown.get(), data_.get(), size_);
  data_ = std::move(grown);
  cap_ = cap;
}

void encode_record(WriteBuffer& out, std::uint64_t offset, std::int64_t time_us, std::uint64_t seq,
                   std::string_view producer, std::string_view key, std::string_view payload) {
  // One extend and plain stores: this runs once per event on the writer thread.
  const std::size_t total = record_size(producer, key, payload);
  char* const frame = out.extend(total);
  char* p = frame + kFrameHeaderBytes;
  auto put = [&p](std::uint64_t v, int bytes) {
    storage::put_le(p, v, bytes);
    p += bytes;
  };
  auto put_bytes = [&p](std::string_view b) {
    if (!b.empty()) std::memcpy(p, b.data(), b.size());
    p += b.size();
  };
  put(offset, 8);
  put(static_cast<std::uint64_t>(time_us), 8);
  put(seq, 8);
  put(producer.size(), 2);
  put_bytes(producer);
  put(key.size(), 2);
  put_bytes(key);
  put_bytes(payload);
  storage::seal_frame(frame, static_cast<std::uint32_t>(total - kFrameHeaderBytes));
}

std::optional<RecordView> parse_body(const char* p, std::size_t n) {
  using storage::get_u16;
  using storage::get_u64;
  if (n < kFixedBodyBytes) return std::nullopt;
  RecordView r;
  r.offset = get_u64(p);
  r.time_us = static_cast<std::int64_t>(get_u64(p + 8));
  r.seq = get_u64(p + 16);
  std::size_t pos = 24;
  const std::size_t plen = get_u16(p + pos);
  pos += 2;
  if (pos + plen + 2 > n) return std::nullopt;
  r.producer = {p + pos, plen};
  pos += plen;
  const std::size_t klen = get_u16(p + pos);
  pos += 2;
  if (pos + klen > n) return std::nullopt;
  r.key = {p + pos, klen};
  pos += klen;
  r.payload = {p + pos, n - pos};
  return r;
}

RecordScanner::Status RecordScanner::next() {
  using storage::Frame;
  const Frame f = storage::read_frame(window_, pos_, kRecordLimits, true);
  switch (f.status) {
    case Frame::Status::end:
      return Status::end;
    case Frame::Status::io_error:
      reason_ = f.why;
      return Status::io_error;
    case Frame::Status::torn:
    case Frame::Status::corrupt:
      reason_ = f.why;
      return Status::bad;
    case Frame::Status::ok:
      break;
  }
  auto r = parse_body(f.body, f.length);
  if (!r) {
    reason_ = "malformed record fields";
    return Status::bad;
  }
  record_ = *r;
  record_pos_ = pos_;
  pos_ += f.size();
  return Status::record;
}

}  // namespace diaspora::relay
