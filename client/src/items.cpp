// Data items over a RelayClient (items.hpp, docs/streaming.md).
#include "diaspora/items.hpp"

#include <boost/json.hpp>

#include <atomic>

#include "diaspora/client.hpp"

namespace diaspora::items {

namespace json = boost::json;

PutResult put(RelayClient& client, std::string_view topic, std::uint64_t seq, json::object event, std::string_view bytes,
              const PutOptions& options) {
  if (options.chunk_bytes == 0 || options.chunk_bytes > data::kMaxChunkBytes)
    throw Error("chunk size " + std::to_string(options.chunk_bytes) + " is not 1 to " + std::to_string(data::kMaxChunkBytes) + " bytes");
  PutResult r;
  r.sha256 = data::sha256_hex(bytes);
  const std::uint64_t chunks = data::chunk_count(bytes.size(), options.chunk_bytes);
  if (chunks > 0xffffffffull) throw Error("an item of " + std::to_string(bytes.size()) + " bytes needs more than 2^32 chunks");
  r.chunks = static_cast<std::uint32_t>(chunks);
  event["itemsize"] = bytes.size();
  event["itemchunks"] = r.chunks;
  event["itemsha256"] = r.sha256;
  if (options.deadline) event["itemdeadline"] = *options.deadline;
  client.send(json::serialize(json::object{{"op", "put"}, {"topic", topic}, {"seq", seq}, {"event", std::move(event)}}));
  for (std::uint32_t i = 0; i < r.chunks; ++i)
    client.send_binary(data::encode_put(seq, i, r.chunks, bytes.substr(std::size_t{i} * options.chunk_bytes, options.chunk_bytes)));
  for (;;) {
    const std::string frame = client.receive();
    if (client.last_binary()) continue;
    auto m = RelayClient::parse_frame(frame);
    if (!m) continue;
    const json::value* op = m->if_contains("op");
    const json::value* s = m->if_contains("seq");
    const bool ours = s && s->is_number() && s->to_number<std::uint64_t>() == seq;
    if (op && *op == "error" && !m->contains("ref"))
      throw ItemError(json::value_to<std::string>(m->at("code")), "the relay: " + json::value_to<std::string>(m->at("message")));
    if (!ours) continue;
    if (*op == "nack")
      throw ItemError(json::value_to<std::string>(m->at("code")),
                      "the relay refused the item: " + json::value_to<std::string>(m->at("message")));
    if (*op != "ack") continue;
    r.offset = m->at("first_offset").to_number<std::uint64_t>();
    const json::value* dup = m->if_contains("duplicate_batch");
    // A resend of the same put (its seq), or a new put of an item the relay holds already
    // (its event's source and id): nothing written.
    r.duplicate = (dup && dup->is_bool() && dup->get_bool()) ||
                  (m->at("count").to_number<std::uint64_t>() == 0 && m->at("duplicates").to_number<std::uint64_t>() > 0);
    const json::value* late = m->if_contains("late");
    r.late = late && late->is_bool() && late->get_bool();
    return r;
  }
}

Item fetch(RelayClient& client, std::string_view topic, std::uint64_t offset) {
  static std::atomic<std::uint64_t> fetches{0};
  const std::string sub = "item-" + std::to_string(++fetches);
  const std::string sub_json = json::serialize(json::value(sub));
  client.send(frames::subscribe(sub, topic, frames::From{offset}));
  Item item;
  item.offset = offset;
  std::uint64_t size = 0, count = 0, next = 0;
  std::string want_sha;
  bool have_event = false;
  data::Sha256 hash;
  auto done = [&] {
    client.send(json::serialize(json::object{{"op", "unsubscribe"}, {"id", sub}}));
    if (item.bytes.size() != size)
      throw ItemError("checksum_mismatch", "the item at offset " + std::to_string(offset) + " has " +
                                               std::to_string(item.bytes.size()) + " bytes, its event says " + std::to_string(size));
    if (hash.hex() != want_sha)
      throw ItemError("checksum_mismatch", "the item at offset " + std::to_string(offset) + " of " + std::string(topic) +
                                               ": its bytes do not have the SHA-256 its event announces");
    return std::move(item);
  };
  for (;;) {
    const std::string frame = client.receive();
    if (client.last_binary()) {
      const data::Decoded d = data::decode(frame);
      if (!d.chunk || d.chunk->kind != data::FrameKind::delivered || d.chunk->subscription != sub_json) continue;
      if (!have_event || d.chunk->ref != offset + 1 + next || d.chunk->index != next || d.chunk->count != count)
        throw ItemError(have_event ? "incomplete_item" : "no_item",
                        "chunk at offset " + std::to_string(d.chunk->ref) + " is not the next of the item at " +
                            std::to_string(offset) + (have_event ? " (the item is incomplete)" : ""));
      hash.update(d.chunk->payload);
      item.bytes += d.chunk->payload;
      if (++next == count) return done();
      continue;
    }
    auto m = RelayClient::parse_frame(frame);
    if (!m) continue;
    const json::value* op = m->if_contains("op");
    const json::value* id = m->if_contains("id");
    if (op && *op == "error" && m->contains("ref") && m->at("ref") == json::value(sub))
      throw ItemError(json::value_to<std::string>(m->at("code")), "the relay: " + json::value_to<std::string>(m->at("message")));
    if (!op || *op != "events" || !id || *id != json::value(sub)) continue;
    for (const json::value& entry : m->at("events").as_array()) {
      if (have_event) {
        // An event where the next chunk was due: the item's put was cut short (a relay
        // crash kept part of it and no resend completed it), or its event was published
        // without chunks.
        client.send(json::serialize(json::object{{"op", "unsubscribe"}, {"id", sub}}));
        throw ItemError("incomplete_item", "the item at offset " + std::to_string(offset) + " of " + std::string(topic) +
                                               " is incomplete: " + std::to_string(next) + " of its " + std::to_string(count) +
                                               " chunks are stored (its put was cut short and not completed)");
      }
      const json::object& first = entry.as_object();
      const std::uint64_t at = first.at("offset").to_number<std::uint64_t>();
      const json::object& ev = first.at("event").as_object();
      if (at != offset)
        throw ItemError("no_item", "offset " + std::to_string(offset) + " of " + std::string(topic) +
                                       " is no longer retained (the first offset delivered is " + std::to_string(at) + ")");
      const json::value* sz = ev.if_contains("itemsize");
      const json::value* ch = ev.if_contains("itemchunks");
      const json::value* sh = ev.if_contains("itemsha256");
      if (!sz || !sz->is_number() || !ch || !ch->is_number() || !sh || !sh->is_string())
        throw ItemError("no_item", "offset " + std::to_string(offset) + " of " + std::string(topic) +
                                       " holds an event that announces no data item (type " +
                                       (ev.contains("type") ? json::serialize(ev.at("type")) : std::string("?")) + ")");
      size = sz->to_number<std::uint64_t>();
      count = ch->to_number<std::uint64_t>();
      want_sha = std::string(sh->get_string());
      item.event = ev;
      item.bytes.reserve(size);
      have_event = true;
      if (count == 0) return done();
    }
  }
}

}  // namespace diaspora::items
