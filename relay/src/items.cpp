// Data items assembled from a put frame and its chunks (items.hpp, docs/streaming.md).
#include "items.hpp"

#include <boost/json.hpp>

#include <algorithm>

namespace diaspora::relay {

namespace json = boost::json;

namespace {

PublishRefusal refuse(std::string code, std::string message) { return PublishRefusal{std::move(code), std::move(message), std::nullopt}; }

std::optional<std::uint64_t> whole(const json::value* v) {
  if (!v) return std::nullopt;
  if (v->is_uint64()) return v->get_uint64();
  if (v->is_int64() && v->get_int64() >= 0) return static_cast<std::uint64_t>(v->get_int64());
  return std::nullopt;
}

bool hex64(std::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

}  // namespace

bool ItemBudget::take(std::uint64_t n) noexcept {
  std::uint64_t cur = used_.load(std::memory_order_acquire);
  do {
    if (cur + n > limit_) return false;
  } while (!used_.compare_exchange_weak(cur, cur + n, std::memory_order_acq_rel));
  return true;
}

ItemAssembler::~ItemAssembler() { release(pending_bytes_); }

void ItemAssembler::release(std::uint64_t bytes) noexcept {
  bytes = std::min(pending_bytes_, bytes);
  pending_bytes_ -= bytes;
  if (budget_) budget_->give(bytes);
}

std::optional<PublishRefusal> ItemAssembler::begin(const json::object& frame, std::uint64_t seq, std::string topic,
                                                   const CodecOptions& codec, std::optional<ReadyItem>& ready) {
  const json::value* ev = frame.if_contains("event");
  if (!ev || !ev->is_object()) return refuse("bad_request", "'event' must be the item's CloudEvent (a JSON object)");
  const json::object& e = ev->get_object();
  const auto size = whole(e.if_contains("itemsize"));
  const auto chunks = whole(e.if_contains("itemchunks"));
  const json::value* sha = e.if_contains("itemsha256");
  if (!size) return refuse("bad_request", "the item's event needs 'itemsize': its size in bytes, a whole number");
  if (!chunks) return refuse("bad_request", "the item's event needs 'itemchunks': how many chunks follow, a whole number");
  if (!sha || !sha->is_string() || !hex64(sha->get_string()))
    return refuse("bad_request", "the item's event needs 'itemsha256': the SHA-256 of its bytes, 64 lower-case hex digits");
  if (const json::value* dl = e.if_contains("itemdeadline"))
    if (!dl->is_string() || !parse_rfc3339_us(dl->get_string()))
      return refuse("bad_request", "'itemdeadline' must be an RFC 3339 timestamp (e.g. 2026-12-06T17:00:00Z)");
  if (*size > limits_.max_item_bytes)
    return refuse("item_too_large", "item of " + std::to_string(*size) + " bytes exceeds the relay's max_item_bytes of " +
                                        std::to_string(limits_.max_item_bytes));
  // Every chunk holds at least one byte and at most kMaxChunkBytes.
  const std::uint64_t fewest = data::chunk_count(*size, data::kMaxChunkBytes);
  if (*chunks < fewest || *chunks > *size || *chunks > 0xffffffffull)
    return refuse("bad_request", "'itemchunks' " + std::to_string(*chunks) + " cannot carry " + std::to_string(*size) +
                                     " bytes: each chunk holds 1 to " + std::to_string(data::kMaxChunkBytes) +
                                     " bytes (so " + std::to_string(fewest) + " to " + std::to_string(*size) + " chunks)");
  if (items_.count(seq))
    return refuse("duplicate_put", "an item with seq " + std::to_string(seq) + " is still waiting for its chunks on this connection");
  if (pending_bytes_ + *size > limits_.max_pending_bytes)
    return refuse("item_backlog", "items of " + std::to_string(pending_bytes_) + " bytes are announced and not yet acknowledged "
                                      "on this connection (max_pending_item_bytes " + std::to_string(limits_.max_pending_bytes) +
                                      "): wait for their acks before putting this one of " + std::to_string(*size));
  AppendRecord head;
  const std::string text = json::serialize(*ev);
  if (auto r = event_record(*ev, text, limits_.max_event_bytes, codec, head)) return r;
  if (budget_ && !budget_->take(*size))
    return refuse("item_backlog", "the relay holds " + std::to_string(budget_->used()) + " bytes of items being received "
                                      "(max_item_bytes_total " + std::to_string(budget_->limit()) +
                                      "): put this one of " + std::to_string(*size) + " again later");
  Pending p;
  if (const json::value* dl = e.if_contains("itemdeadline")) p.deadline_us = parse_rfc3339_us(dl->get_string());
  p.topic = std::move(topic);
  p.size = *size;
  p.chunks = static_cast<std::uint32_t>(*chunks);
  p.sha256 = std::string(sha->get_string());
  p.hash = std::make_unique<data::Sha256>();
  p.records.reserve(p.chunks + 1);
  p.records.push_back(std::move(head));
  pending_bytes_ += p.size;
  if (p.chunks == 0) {
    if ((ready = finish(seq, p))) return std::nullopt;
    release(p.size);
    return refuse("checksum_mismatch", "the empty item's 'itemsha256' is not the SHA-256 of no bytes (" +
                                           data::sha256_hex({}) + ")");
  }
  items_.emplace(seq, std::move(p));
  return std::nullopt;
}

ChunkOutcome ItemAssembler::chunk(std::string_view frame) {
  ChunkOutcome out;
  const data::Decoded d = data::decode(frame);
  if (!d.chunk) {
    out.refusal = refuse("bad_request", d.error);
    return out;
  }
  const data::Chunk& c = *d.chunk;
  if (c.kind != data::FrameKind::put) {
    out.refusal = refuse("bad_request", "a client sends data frames of kind 1 (put chunk), not " + std::to_string(static_cast<int>(c.kind)));
    return out;
  }
  auto it = items_.find(c.ref);
  if (it == items_.end()) {
    out.seq = c.ref;
    out.refusal = refuse("unknown_item", "no item with seq " + std::to_string(c.ref) +
                                             " is waiting for chunks on this connection (send its put first)");
    return out;
  }
  Pending& p = it->second;
  out.seq = c.ref;
  auto drop = [&](std::string code, std::string message) {
    release(p.size);
    items_.erase(it);
    out.refusal = refuse(std::move(code), std::move(message) + "; nothing of the item was written");
    return out;
  };
  if (c.count != p.chunks)
    return drop("bad_item", "chunk says the item has " + std::to_string(c.count) + " chunks, its put said " + std::to_string(p.chunks));
  if (c.index != p.next)
    return drop("bad_item", "chunk " + std::to_string(c.index) + " arrived where chunk " + std::to_string(p.next) + " was due (send them in order)");
  if (c.payload.empty() || c.payload.size() > data::kMaxChunkBytes)
    return drop("bad_item", "chunk of " + std::to_string(c.payload.size()) + " bytes: a chunk holds 1 to " +
                                std::to_string(data::kMaxChunkBytes));
  const std::uint64_t left_after = p.size - p.received - std::min<std::uint64_t>(p.size - p.received, c.payload.size());
  const std::uint64_t chunks_after = p.chunks - p.next - 1;
  if (c.payload.size() > p.size - p.received || left_after < chunks_after || (chunks_after == 0 && left_after != 0))
    return drop("bad_item", "chunk " + std::to_string(c.index) + " of " + std::to_string(c.payload.size()) +
                                " bytes does not fit the item's size of " + std::to_string(p.size) + " (" +
                                std::to_string(p.received) + " received before it)");
  p.hash->update(c.payload);
  p.received += c.payload.size();
  AppendRecord rec;
  rec.dedupe_key = p.records.front().dedupe_key + '\x1f' + std::to_string(c.index);
  rec.payload = data::encode_stored(c.index, c.count, c.payload);
  p.records.push_back(std::move(rec));
  if (++p.next < p.chunks) return out;
  out.ready = finish(c.ref, p);
  if (!out.ready) return drop("checksum_mismatch", "the item's bytes do not have the SHA-256 its put announced");
  items_.erase(it);
  return out;
}

std::optional<ReadyItem> ItemAssembler::finish(std::uint64_t seq, Pending& p) {
  if (p.hash->hex() != p.sha256) return std::nullopt;
  ReadyItem item;
  item.topic = std::move(p.topic);
  item.seq = seq;
  item.bytes = p.size + p.records.front().payload.size();
  item.size = p.size;
  item.deadline_us = p.deadline_us;
  item.records = std::move(p.records);
  return item;
}

}  // namespace diaspora::relay
