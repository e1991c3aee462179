// Data items: the binary frame codec (core/src/data_item.cpp) and the relay's assembly of
// an item from its put frame and chunks (relay/src/items.cpp), docs/streaming.md.
#include <boost/json.hpp>
#include <gtest/gtest.h>

#include <string>

#include "diaspora/data_item.hpp"
#include "items.hpp"

namespace json = boost::json;
namespace data = diaspora::data;
using diaspora::relay::ItemAssembler;
using diaspora::relay::ItemLimits;
using diaspora::relay::ReadyItem;

namespace {

std::string bytes(std::size_t n, char seed) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + static_cast<char>(i * 131 % 251));
  return s;
}

json::object put(const std::string& id, std::uint64_t size, std::uint64_t chunks, const std::string& sha) {
  json::object ev{{"specversion", "1.0"}, {"id", id},           {"source", "/test"},  {"type", "org.example.frame"},
                  {"itemsize", size},     {"itemchunks", chunks}, {"itemsha256", sha}};
  return json::object{{"op", "put"}, {"topic", "t.data"}, {"seq", 1}, {"event", ev}};
}

}  // namespace

TEST(DataFrames, EachKindRoundTripsAndForeignBytesAreNamed) {
  const std::string payload = bytes(1000, 3);
  // (decode's views point into the frame: keep each frame while it is looked at)
  const std::string put_frame = data::encode_put(0xfedcba9876543210ull, 2, 5, payload);
  auto p = data::decode(put_frame);
  ASSERT_TRUE(p.chunk) << p.error;
  EXPECT_EQ(p.chunk->kind, data::FrameKind::put);
  EXPECT_EQ(p.chunk->ref, 0xfedcba9876543210ull);
  EXPECT_EQ(p.chunk->index, 2u);
  EXPECT_EQ(p.chunk->count, 5u);
  EXPECT_EQ(p.chunk->payload, payload);

  const std::string delivered = data::encode_delivered("\"sub-1\"", "beam.data", 42, 0, 1, payload);
  auto d = data::decode(delivered);
  ASSERT_TRUE(d.chunk) << d.error;
  EXPECT_EQ(d.chunk->subscription, "\"sub-1\"");
  EXPECT_EQ(d.chunk->topic, "beam.data");
  EXPECT_EQ(d.chunk->ref, 42u);
  EXPECT_EQ(d.chunk->payload, payload);

  const std::string stored = data::encode_stored(3, 4, "xyz");
  EXPECT_TRUE(data::is_chunk_record(stored));
  EXPECT_FALSE(data::is_chunk_record(R"({"id":"DSPD"})"));
  auto s = data::decode(stored);
  ASSERT_TRUE(s.chunk);
  EXPECT_EQ(s.chunk->kind, data::FrameKind::stored);
  EXPECT_EQ(s.chunk->payload, "xyz");

  std::string v2 = data::encode_put(1, 0, 1, "a");
  v2[4] = 2;
  EXPECT_NE(data::decode(v2).error.find("version 2; this side speaks version 1"), std::string::npos) << data::decode(v2).error;
  EXPECT_FALSE(data::decode("DSPD").chunk);
  EXPECT_FALSE(data::decode(std::string(30, 'x')).chunk);
  std::string badkind = data::encode_put(1, 0, 1, "a");
  badkind[5] = 9;
  EXPECT_FALSE(data::decode(badkind).chunk);
  EXPECT_FALSE(data::decode(data::encode_put(1, 5, 5, "a")).chunk);  // index not below count
  // A delivered frame cut inside its topic.
  const std::string cut = data::encode_delivered("1", "beam.data", 1, 0, 1, "");
  EXPECT_FALSE(data::decode(cut.substr(0, cut.size() - 3)).chunk);
}

TEST(DataFrames, Sha256MatchesTheKnownDigests) {
  EXPECT_EQ(data::sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(data::sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  data::Sha256 h;
  h.update("a");
  h.update("bc");
  EXPECT_EQ(h.hex(), data::sha256_hex("abc"));
}

TEST(ItemAssembler, AnItemIsReadyOnceItsLastChunkIsInAndItsChecksumMatches) {
  ItemAssembler a(ItemLimits{});
  const std::string item = bytes(2500, 1);
  std::optional<ReadyItem> ready;
  ASSERT_FALSE(a.begin(put("i1", 2500, 3, data::sha256_hex(item)), 9, "t.data", {}, ready));
  EXPECT_FALSE(ready);
  EXPECT_EQ(a.pending_bytes(), 2500u);
  EXPECT_FALSE(a.chunk(data::encode_put(9, 0, 3, item.substr(0, 1000))).ready);
  EXPECT_FALSE(a.chunk(data::encode_put(9, 1, 3, item.substr(1000, 1000))).ready);
  auto out = a.chunk(data::encode_put(9, 2, 3, item.substr(2000)));
  ASSERT_FALSE(out.refusal) << out.refusal->message;
  ASSERT_TRUE(out.ready);
  EXPECT_EQ(out.ready->seq, 9u);
  EXPECT_EQ(out.ready->size, 2500u);
  ASSERT_EQ(out.ready->records.size(), 4u);
  EXPECT_EQ(out.ready->records[0].dedupe_key, "/test\x1fi1");
  EXPECT_EQ(out.ready->records[2].dedupe_key, std::string("/test\x1fi1\x1f") + "1");
  std::string back;
  for (std::size_t i = 1; i < 4; ++i) back += std::string(data::decode(out.ready->records[i].payload).chunk->payload);
  EXPECT_EQ(back, item);
  EXPECT_EQ(a.assembling(), 0u);
  EXPECT_EQ(a.pending_bytes(), 2500u);  // until the store's ack settles it
  a.settled(2500);
  EXPECT_EQ(a.pending_bytes(), 0u);
}

TEST(ItemAssembler, RefusalsDropTheItemAndFreeItsBytes) {
  ItemAssembler a(ItemLimits{1000, 1500, 1u << 20});
  const std::string item = bytes(900, 2);
  std::optional<ReadyItem> ready;
  // A wrong checksum is found at the last chunk.
  ASSERT_FALSE(a.begin(put("i1", 900, 2, data::sha256_hex("no")), 1, "t", {}, ready));
  EXPECT_FALSE(a.chunk(data::encode_put(1, 0, 2, item.substr(0, 450))).refusal);
  auto out = a.chunk(data::encode_put(1, 1, 2, item.substr(450)));
  ASSERT_TRUE(out.refusal);
  EXPECT_EQ(out.refusal->code, "checksum_mismatch");
  EXPECT_EQ(out.seq, 1u);
  EXPECT_EQ(a.pending_bytes(), 0u);
  // Out of order, a count that disagrees, a chunk too long, an unknown seq.
  ASSERT_FALSE(a.begin(put("i2", 900, 2, data::sha256_hex(item)), 2, "t", {}, ready));
  EXPECT_EQ(a.chunk(data::encode_put(2, 1, 2, item.substr(450))).refusal->code, "bad_item");
  EXPECT_EQ(a.chunk(data::encode_put(2, 0, 2, "x")).refusal->code, "unknown_item");  // dropped by the refusal
  ASSERT_FALSE(a.begin(put("i3", 900, 2, data::sha256_hex(item)), 3, "t", {}, ready));
  EXPECT_EQ(a.chunk(data::encode_put(3, 0, 3, item.substr(0, 450))).refusal->code, "bad_item");
  ASSERT_FALSE(a.begin(put("i4", 900, 2, data::sha256_hex(item)), 4, "t", {}, ready));
  EXPECT_EQ(a.chunk(data::encode_put(4, 0, 2, item)).refusal->code, "bad_item");  // leaves nothing for chunk 1
  EXPECT_EQ(a.pending_bytes(), 0u);
  // Limits: an item over max_item_bytes; announced bytes over max_pending_bytes.
  EXPECT_EQ(a.begin(put("big", 1001, 2, data::sha256_hex("")), 5, "t", {}, ready)->code, "item_too_large");
  ASSERT_FALSE(a.begin(put("i6", 900, 2, data::sha256_hex(item)), 6, "t", {}, ready));
  EXPECT_EQ(a.begin(put("i7", 900, 2, data::sha256_hex(item)), 7, "t", {}, ready)->code, "item_backlog");
  EXPECT_EQ(a.begin(put("i6b", 10, 1, data::sha256_hex("")), 6, "t", {}, ready)->code, "duplicate_put");
  // Fields: chunks that cannot carry the size; a checksum that is not hex.
  EXPECT_EQ(a.begin(put("c", 10, 11, data::sha256_hex("")), 8, "t", {}, ready)->code, "bad_request");
  EXPECT_EQ(a.begin(put("c", 10, 0, data::sha256_hex("")), 8, "t", {}, ready)->code, "bad_request");
  EXPECT_EQ(a.begin(put("c", 10, 1, std::string(64, 'G')), 8, "t", {}, ready)->code, "bad_request");
  // An empty item is ready at once (when its checksum is that of no bytes).
  ASSERT_FALSE(a.begin(put("empty", 0, 0, data::sha256_hex("")), 9, "t", {}, ready));
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->records.size(), 1u);
  EXPECT_EQ(a.begin(put("empty2", 0, 0, data::sha256_hex("x")), 10, "t", {}, ready)->code, "checksum_mismatch");
}

TEST(ItemAssembler, TheRelayWideBudgetBoundsEveryConnectionTogetherAndComesBackWhenOneEnds) {
  diaspora::relay::ItemBudget budget(1500);
  const std::string item = bytes(900, 3);
  std::optional<ReadyItem> ready;
  {
    ItemAssembler a(ItemLimits{1000, 1000, 1u << 20}, &budget), b(ItemLimits{1000, 1000, 1u << 20}, &budget);
    ASSERT_FALSE(a.begin(put("a1", 900, 1, data::sha256_hex(item)), 1, "t", {}, ready));
    EXPECT_EQ(budget.used(), 900u);
    const auto refused = b.begin(put("b1", 900, 1, data::sha256_hex(item)), 1, "t", {}, ready);
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->code, "item_backlog");
    EXPECT_NE(refused->message.find("max_item_bytes_total"), std::string::npos) << refused->message;
    auto out = a.chunk(data::encode_put(1, 0, 1, item));
    ASSERT_TRUE(out.ready);
    a.settled(out.ready->size);  // acked: its bytes come back
    EXPECT_EQ(budget.used(), 0u);
    ASSERT_FALSE(b.begin(put("b1", 900, 1, data::sha256_hex(item)), 1, "t", {}, ready));
    EXPECT_EQ(budget.used(), 900u);
  }  // b's session ends with its item half received
  EXPECT_EQ(budget.used(), 0u);
}

TEST(Item, UrisNameATopicAndAnOffset) {
  EXPECT_EQ(data::item_uri("beam.data", 1200), "diaspora://beam.data/1200");
  const auto at = data::parse_item_uri("diaspora://beam.data/1200");
  ASSERT_TRUE(at);
  EXPECT_EQ(at->topic, "beam.data");
  EXPECT_EQ(at->offset, 1200u);
  ASSERT_TRUE(data::parse_item_uri("diaspora://t/9999999999999999999"));  // 19 digits: the most an offset is written with
  EXPECT_EQ(data::parse_item_uri("diaspora://t/9999999999999999999")->offset, 9999999999999999999ull);
  for (const char* bad : {"file:///tmp/x", "diaspora://", "diaspora:///3", "diaspora://t", "diaspora://t/", "diaspora://t/-1",
                          "diaspora://t/1x", "diaspora://t/12345678901234567890", "diaspora://t/u/3"})
    EXPECT_FALSE(data::parse_item_uri(bad)) << bad;
}
