// Fuzz target: data items (docs/streaming.md) as the relay reads them from a client: a put
// frame (JSON) and the binary chunk frames that follow, fed to the assembler as a session
// does (relay/src/items.cpp), and any bytes to the frame decoder (core/src/data_item.cpp).
// Invariants: a frame that decodes encodes back to the same bytes; a ready item's records
// are its event, then its chunks in order, whose bytes have the announced size and SHA-256;
// the assembler's announced bytes never exceed its bound and come back to zero once every
// item is settled or refused, and the relay-wide budget holds exactly what the assembler
// holds, all of it given back when the assembler goes.
#include <boost/json.hpp>

#include "diaspora/data_item.hpp"
#include "fuzz_support.hpp"
#include "items.hpp"

using namespace diaspora;
namespace json = boost::json;

namespace {

// A session's worth: put frames (JSON) and chunk frames (parts starting with the magic),
// fed to one assembler (a connection) that counts against `budget`.
void session(fuzz::Input& in, relay::ItemBudget& budget) {
  const relay::ItemLimits limits{1u << 16, 1u << 17, 4096};
  relay::ItemAssembler a(limits, &budget);
  std::vector<std::uint64_t> to_settle;
  for (std::string_view part : in.parts()) {
    if (data::is_chunk_record(part)) {
      const relay::ChunkOutcome out = a.chunk(part);
      FUZZ_CHECK(!(out.ready && out.refusal));
      if (out.refusal) FUZZ_CHECK(!out.refusal->code.empty() && !out.refusal->message.empty());
      if (out.ready) {
        const relay::ReadyItem& it = *out.ready;
        FUZZ_CHECK(!it.records.empty());
        std::string all;
        for (std::size_t i = 1; i < it.records.size(); ++i) {
          const data::Decoded d = data::decode(it.records[i].payload);
          FUZZ_CHECK(d.chunk && d.chunk->kind == data::FrameKind::stored && d.chunk->index == i - 1 &&
                     d.chunk->count == it.records.size() - 1);
          all += d.chunk->payload;
        }
        FUZZ_CHECK(all.size() == it.size);
        const json::value ev = json::parse(it.records.front().payload);
        FUZZ_CHECK(data::sha256_hex(all) == ev.at("itemsha256").as_string());
        to_settle.push_back(it.size);
      }
    } else {
      boost::system::error_code ec;
      const json::value v = json::parse(part, ec);
      if (ec || !v.is_object()) continue;
      relay::PublishRefusal refusal;
      const auto head = relay::publish_head(v.get_object(), refusal);
      if (!head) continue;
      std::optional<relay::ReadyItem> ready;
      if (const auto r = a.begin(v.get_object(), head->first, head->second, CodecOptions{}, ready)) {
        FUZZ_CHECK(!r->code.empty() && !r->message.empty() && !ready);
      } else if (ready) {
        FUZZ_CHECK(ready->size == 0 && ready->records.size() == 1);
        to_settle.push_back(0);
      }
    }
    FUZZ_CHECK(a.pending_bytes() <= limits.max_pending_bytes && budget.used() == a.pending_bytes());
  }
  for (const std::uint64_t n : to_settle) a.settled(n);
  if (a.assembling() == 0) FUZZ_CHECK(a.pending_bytes() == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  fuzz::Input in(bytes, size);
  const std::uint8_t mode = in.byte();

  if (mode % 2 == 0) {  // one frame, any kind
    const std::string_view frame = in.rest();
    const data::Decoded d = data::decode(frame);
    FUZZ_CHECK(d.chunk.has_value() != !d.error.empty());
    if (!d.chunk) return 0;
    const data::Chunk& c = *d.chunk;
    FUZZ_CHECK(c.index < c.count);
    std::string again;
    switch (c.kind) {
      case data::FrameKind::put: again = data::encode_put(c.ref, c.index, c.count, c.payload); break;
      case data::FrameKind::delivered: again = data::encode_delivered(c.subscription, c.topic, c.ref, c.index, c.count, c.payload); break;
      case data::FrameKind::stored: again = data::encode_stored(c.index, c.count, c.payload); break;
    }
    // Not kept: the reserved field, and a stored record's ref (always written 0).
    const std::size_t from = c.kind == data::FrameKind::stored ? 16 : 8;
    FUZZ_CHECK(again.size() == frame.size() && again.substr(0, 6) == frame.substr(0, 6) &&
               again.substr(from) == frame.substr(from));
    return 0;
  }

  relay::ItemBudget budget(3u << 15);  // below the connection's bound: both refusals are reached
  session(in, budget);
  FUZZ_CHECK(budget.used() == 0);  // the assembler gave back what it held when it went
  return 0;
}
