// diaspora::client's frame builders: what they produce parses as the frame docs/protocol.md
// describes, with the topic and group escaped.
#include <boost/json.hpp>

#include "diaspora/client.hpp"
#include "test_helpers.hpp"

namespace json = boost::json;
namespace frames = diaspora::frames;

TEST(ClientFrames, PublishHeadEventsAndTailMakeOnePublishFrame) {
  const std::string e1 = R"({"specversion":"1.0","id":"1","source":"/s","type":"t"})";
  const std::string e2 = R"({"specversion":"1.0","id":"2","source":"/s","type":"t"})";
  const std::string whole = frames::publish("task.events", 7, {e1, e2});
  EXPECT_EQ(whole, frames::publish_head("task.events", 7) + e1 + "," + e2 + std::string(frames::kPublishTail));
  const json::object o = json::parse(whole).as_object();
  EXPECT_EQ(o.at("op"), "publish");
  EXPECT_EQ(o.at("topic"), "task.events");
  EXPECT_EQ(o.at("seq").to_number<int>(), 7);
  ASSERT_EQ(o.at("events").as_array().size(), 2u);
  EXPECT_EQ(o.at("events").as_array()[1].as_object().at("id"), "2");
  EXPECT_EQ(json::parse(frames::publish("t", 0, {})).as_object().at("events").as_array().size(), 0u);
}

TEST(ClientFrames, TopicIsEscaped) {
  const json::object o = json::parse(frames::publish("a\"b\\c", 1, {})).as_object();
  EXPECT_EQ(o.at("topic"), "a\"b\\c");
}

TEST(ClientFrames, SubscribeFromAPositionOrAnOffsetWithOrWithoutAGroup) {
  json::object o = json::parse(frames::subscribe("s1", "task.*", "earliest")).as_object();
  EXPECT_EQ(o.at("op"), "subscribe");
  EXPECT_EQ(o.at("id"), "s1");
  EXPECT_EQ(o.at("topic"), "task.*");
  EXPECT_EQ(o.at("from"), "earliest");
  EXPECT_FALSE(o.contains("group"));
  o = json::parse(frames::subscribe("s2", "x", std::uint64_t{42}, "g")).as_object();
  EXPECT_EQ(o.at("from").to_number<std::uint64_t>(), 42u);
  EXPECT_EQ(o.at("group"), "g");
}

TEST(ClientFrames, Commit) {
  const json::object o = json::parse(frames::commit("g", "t", 18446744073709551615ull)).as_object();
  EXPECT_EQ(o.at("op"), "commit");
  EXPECT_EQ(o.at("group"), "g");
  EXPECT_EQ(o.at("topic"), "t");
  EXPECT_EQ(o.at("offset").as_uint64(), 18446744073709551615ull);
}
