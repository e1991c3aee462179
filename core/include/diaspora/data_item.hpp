// Data items: binary payloads (a detector frame, a scan, a model checkpoint) carried by the
// fabric in chunks, each item announced by a CloudEvent that says its size, chunk count and
// SHA-256 (docs/streaming.md). This header is the one definition of the binary frames and
// stored chunk records that the relay, the client and the tests share:
//
//   header (24 bytes, integers big-endian)
//     0  magic      "DSPD"
//     4  version    1 (kDataFrameVersion)
//     5  kind       1 put chunk (client -> relay), 2 delivered chunk (relay -> client),
//                   3 stored chunk (a record in the relay's log)
//     6  reserved   u16, 0
//     8  ref        u64: the put's seq (kind 1), the chunk's offset in its topic (kind 2),
//                   0 (kind 3)
//    16  index      u32: the chunk's index in its item, from 0
//    20  count      u32: the item's number of chunks
//   kind 2 only, then: u16 subscription id length, the id (its JSON text), u16 topic length,
//   the topic
//   then the chunk's bytes, up to the end of the frame.
//
// A frame of another version is refused with a message naming both versions, so old and new
// clients and relays tell each other what is wrong instead of misreading bytes.
//
// Pure functions: any thread; encoders throw std::bad_alloc only, decoders never throw.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace diaspora::data {

inline constexpr std::string_view kMagic = "DSPD";
inline constexpr std::uint8_t kDataFrameVersion = 1;
inline constexpr std::size_t kHeaderBytes = 24;
/// The largest chunk a relay accepts (what a JetStream message holds by default, less room
/// for its headers). Producers send 256 KiB by default (kDefaultChunkBytes).
inline constexpr std::size_t kMaxChunkBytes = 1000u * 1024u;
inline constexpr std::size_t kDefaultChunkBytes = 256u * 1024u;

enum class FrameKind : std::uint8_t { put = 1, delivered = 2, stored = 3 };

/// One decoded chunk frame or record. The views point into the decoded bytes.
struct Chunk {
  FrameKind kind = FrameKind::put;
  std::uint64_t ref = 0;  ///< put: seq; delivered: offset; stored: 0
  std::uint32_t index = 0;
  std::uint32_t count = 0;
  std::string_view subscription;  ///< delivered only: the subscription id's JSON text
  std::string_view topic;         ///< delivered only
  std::string_view payload;
};

/// Result of decode(): the chunk, or why the bytes are not one.
struct Decoded {
  std::optional<Chunk> chunk;
  std::string error;  ///< when !chunk: what is wrong, for a bad_request message
};

/// A put chunk (kind 1): the `index`-th of `count` chunks of the item the put `seq` announced.
std::string encode_put(std::uint64_t seq, std::uint32_t index, std::uint32_t count, std::string_view payload);
/// A delivered chunk (kind 2): stored at `offset` of `topic`, for the subscription whose id's
/// JSON text is `subscription_json` (at most 65,535 bytes each, as topics and ids are).
std::string encode_delivered(std::string_view subscription_json, std::string_view topic, std::uint64_t offset,
                             std::uint32_t index, std::uint32_t count, std::string_view payload);
/// A stored chunk record (kind 3).
std::string encode_stored(std::uint32_t index, std::uint32_t count, std::string_view payload);

/// Decodes a frame or record of any kind. Refuses (error set) bytes shorter than the
/// header, without the magic, of another version ("data frame version 2; this side speaks
/// version 1"), of an unknown kind, with an index not below its count, or with lengths
/// beyond the end.
Decoded decode(std::string_view bytes);

/// Whether a stored record is a chunk (starts with the magic; an event's JSON text never does).
inline bool is_chunk_record(std::string_view record) noexcept { return record.starts_with(kMagic); }

/// The number of chunks of an item of `size` bytes sent in chunks of `chunk_bytes` (> 0).
inline std::uint64_t chunk_count(std::uint64_t size, std::uint64_t chunk_bytes) noexcept {
  return size == 0 ? 0 : (size + chunk_bytes - 1) / chunk_bytes;
}

/// Where an item is: its event's topic and offset, written "diaspora://TOPIC/OFFSET" (what
/// `diaspora put` prints, what org.diaspora.data.arrived's uri may carry).
struct ItemLocation {
  std::string topic;
  std::uint64_t offset = 0;
};
/// "diaspora://TOPIC/OFFSET".
std::string item_uri(std::string_view topic, std::uint64_t offset);
/// Parses "diaspora://TOPIC/OFFSET" (a topic of 1 or more characters without '/', a decimal
/// offset); nullopt for anything else.
std::optional<ItemLocation> parse_item_uri(std::string_view uri);

/// Lower-case hex SHA-256 of `bytes` (64 characters).
std::string sha256_hex(std::string_view bytes);

/// SHA-256 over bytes that arrive in pieces (an item's chunks). One thread at a time.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(std::string_view bytes);
  /// The digest of everything given, lower-case hex; ends this hash (update() no more).
  std::string hex();

 private:
  void* ctx_;  // EVP_MD_CTX (OpenSSL stays out of the header)
};

}  // namespace diaspora::data
