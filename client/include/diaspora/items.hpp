// Data items through a relay (docs/streaming.md), over a RelayClient: put an item (its
// event and chunks, then the ack) and fetch one by the offset of its event. Used by the
// `diaspora put` / `diaspora get` commands and the plugin's item calls.
//
// A RelayClient is used from one thread; so are these. A put or fetch reads the
// connection's frames until its own answer and passes over the others (replies to other
// requests, other subscriptions' deliveries): give each its own connection when the
// connection carries other traffic that must not be lost.
#pragma once

#include <boost/json/object.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "diaspora/client.hpp"
#include "diaspora/data_item.hpp"

namespace diaspora::items {

struct PutOptions {
  std::size_t chunk_bytes = data::kDefaultChunkBytes;  ///< 1 to data::kMaxChunkBytes
  std::optional<std::string> deadline;                 ///< RFC 3339 itemdeadline, if any
};

struct PutResult {
  std::uint64_t offset = 0;  ///< where the item's event is (for a duplicate: the topic's end, as the relay says)
  std::uint32_t chunks = 0;
  bool duplicate = false;    ///< the relay held it already (same producer and seq, or same event source and id): nothing written now
  bool late = false;         ///< stored after its deadline
  std::string sha256;
};

/// Thrown when the relay refuses a put (its nack's code and message) or when what is at an
/// offset is not a whole item with its checksum. Not for connection failures
/// (RelayClientError).
class ItemError : public Error {
 public:
  ItemError(std::string code, const std::string& message, std::source_location where = std::source_location::current())
      : Error(message, where), code_(std::move(code)) {}
  const std::string& code() const noexcept { return code_; }

 private:
  std::string code_;
};

/// Puts `bytes` on `topic` as one item announced by `event` (a CloudEvent: specversion,
/// id, source, type and any data; its itemsize, itemchunks, itemsha256 and itemdeadline
/// are set here), as the connection's batch `seq`; returns once the relay acked it.
/// Throws ItemError (the nack), RelayClientError (connection, timeout), Error for a
/// chunk size out of range.
PutResult put(RelayClient& client, std::string_view topic, std::uint64_t seq, boost::json::object event,
              std::string_view bytes, const PutOptions& options = {});

struct Item {
  std::uint64_t offset = 0;
  boost::json::object event;
  std::string bytes;
};

/// The item whose event is at `offset` of `topic`: subscribes there, reads the event and
/// its chunks, checks size and SHA-256, unsubscribes. Throws ItemError ("no_item" when the
/// offset holds an event that announces no item or is no longer retained,
/// "incomplete_item" when another event follows before its last chunk, "checksum_mismatch"), RelayClientError (connection; the client's timeout while nothing
/// comes, e.g. an offset past the topic's end).
Item fetch(RelayClient& client, std::string_view topic, std::uint64_t offset);

}  // namespace diaspora::items
