// Data items arriving on a diaspora.v1 connection (docs/streaming.md): a `put` frame
// announces an item (a CloudEvent whose attributes say its size, chunk count and SHA-256),
// binary frames carry its chunks, and once the last one is in and the checksum matches the
// item is one batch for the store: the event, then one record per chunk.
//
// Kept apart from the Beast session (server.cpp) so that it is unit tested
// (tests/unit/test_items.cpp) and fuzzed (tests/fuzz/fuzz_items.cpp).
//
// Internal to the relay (not installed). One assembler per connection, used from that
// connection's strand only.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/object.hpp>

#include "diaspora/data_item.hpp"
#include "diaspora/event.hpp"
#include "event_text.hpp"
#include "store.hpp"

namespace diaspora::relay {

/// The relay's limits on items (relay.yaml `max_item_bytes`, `max_pending_item_bytes`).
struct ItemLimits {
  std::uint64_t max_item_bytes = 128ull << 20;
  /// Items announced on one connection and not yet acknowledged, in bytes: a put beyond it is
  /// refused (`item_backlog`) until acks come back.
  std::uint64_t max_pending_bytes = 256ull << 20;
  std::size_t max_event_bytes = 1u << 20;
};

/// Bytes of items the whole relay holds for its connections (announced, not yet
/// acknowledged): relay.yaml `max_item_bytes_total`. Shared by every assembler; any thread.
class ItemBudget {
 public:
  explicit ItemBudget(std::uint64_t limit) : limit_(limit) {}
  /// Takes `n` bytes when they fit under the limit.
  bool take(std::uint64_t n) noexcept;
  void give(std::uint64_t n) noexcept { used_.fetch_sub(n, std::memory_order_acq_rel); }
  std::uint64_t used() const noexcept { return used_.load(std::memory_order_acquire); }
  std::uint64_t limit() const noexcept { return limit_; }

 private:
  const std::uint64_t limit_;
  std::atomic<std::uint64_t> used_{0};
};

/// An item whose chunks are all in and whose checksum matched: the batch to append.
struct ReadyItem {
  std::string topic;
  std::uint64_t seq = 0;
  std::vector<AppendRecord> records;  ///< the announcing event, then each chunk (data_item.hpp, kind 3)
  std::uint64_t bytes = 0;            ///< the item's size plus the event's
  std::uint64_t size = 0;             ///< the item's size (what ItemAssembler::settled() takes back)
  std::optional<std::int64_t> deadline_us;  ///< its itemdeadline, when it has one
};

/// What a binary frame led to: nothing yet, an item ready, or a refusal (for the put `seq`
/// when the frame named a known one; else for the connection).
struct ChunkOutcome {
  std::optional<ReadyItem> ready;
  std::optional<PublishRefusal> refusal;
  std::optional<std::uint64_t> seq;  ///< the put the refusal answers, when known
};

class ItemAssembler {
 public:
  /// `budget` (may be null): the relay-wide bound this connection's items count against too.
  explicit ItemAssembler(ItemLimits limits, ItemBudget* budget = nullptr) : limits_(limits), budget_(budget) {}
  /// Gives back to the budget what this connection still holds (a session that ended
  /// with items half received).
  ~ItemAssembler();
  ItemAssembler(const ItemAssembler&) = delete;
  ItemAssembler& operator=(const ItemAssembler&) = delete;

  /// A `put` frame whose seq and topic were checked (publish_head) and allowed: validates
  /// its `event` (a CloudEvent with integer `itemsize` and `itemchunks`, a 64-hex-digit
  /// `itemsha256`, an optional RFC 3339 `itemdeadline`). On success returns nullopt and the
  /// item waits for its chunks; an empty item (size 0, no chunks) is ready at once, in
  /// `ready`. Refusals: bad_request (fields), invalid_event, event_too_large,
  /// item_too_large, item_backlog (max_pending_bytes, or the relay-wide budget),
  /// duplicate_put (seq pending already).
  std::optional<PublishRefusal> begin(const boost::json::object& frame, std::uint64_t seq, std::string topic,
                                      const CodecOptions& codec, std::optional<ReadyItem>& ready);

  /// A binary frame: one chunk of a pending item (data_item.hpp, kind 1), in index order.
  /// A refusal drops the item (nothing of it is written): the producer puts it again.
  ChunkOutcome chunk(std::string_view frame);

  /// An item handed to the store was acknowledged (or refused): its bytes no longer count.
  void settled(std::uint64_t bytes) noexcept { release(bytes); }

  /// Announced bytes not yet settled (assembling or in the store).
  std::uint64_t pending_bytes() const noexcept { return pending_bytes_; }
  /// Items waiting for chunks.
  std::size_t assembling() const noexcept { return items_.size(); }

 private:
  struct Pending {
    std::string topic;
    std::uint64_t size = 0, received = 0;
    std::uint32_t chunks = 0, next = 0;
    std::string sha256;
    std::optional<std::int64_t> deadline_us;
    std::unique_ptr<data::Sha256> hash;
    std::vector<AppendRecord> records;
  };
  /// The item's batch once its bytes have the announced SHA-256; nullopt when they do not.
  std::optional<ReadyItem> finish(std::uint64_t seq, Pending& p);
  void release(std::uint64_t bytes) noexcept;

  ItemLimits limits_;
  ItemBudget* budget_;
  std::map<std::uint64_t, Pending> items_;  // by put seq
  std::uint64_t pending_bytes_ = 0;
};

}  // namespace diaspora::relay
