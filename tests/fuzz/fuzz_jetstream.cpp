// Fuzz target: what the relay on JetStream reads back from the cluster, where anyone who can
// write to it can put anything: stream names (topic_of_stream_name), keys of the groups
// bucket (parse_group_key), the numbers kept in the buckets and in the streams'
// republished `Nats-Sequence` headers (parse_stored_number), and the names themselves
// (jetstream_unname), the records themselves (stored_event_text) and the leader's answers to
// message gets (parse_message_get). The first byte steers: even, the rest is read as the cluster would
// give it; odd, it is split into two parts ("\n--\n") that are encoded as the relay encodes
// them, and must read back as they were. Invariants: what is read back is what the relay
// would have written for it (a name encodes back to itself; a topic or group read back is a
// valid name; a number prints back to its text), and what the relay writes reads back.
#include <charconv>

#include "diaspora/event.hpp"
#include "jetstream_store.hpp"
#include "fuzz_support.hpp"

using namespace diaspora::relay;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  diaspora::fuzz::Input in(data, size);
  const std::uint8_t steer = in.byte();
  if (steer % 2 == 0) {
    const std::string_view text = in.rest();
    if (auto name = jetstream_unname(text)) FUZZ_CHECK(jetstream_name(*name) == text);
    if (auto topic = topic_of_stream_name(text, "DIASPORA")) {
      FUZZ_CHECK(valid_topic_name(*topic));
      FUZZ_CHECK("DIASPORA-" + jetstream_name(*topic) == text);
    }
    if (auto gt = parse_group_key(text)) {
      FUZZ_CHECK(valid_topic_name(gt->first) && valid_topic_name(gt->second));
      FUZZ_CHECK(jetstream_name(gt->first) + "." + jetstream_name(gt->second) == text);
    }
    if (stored_event_text(text)) FUZZ_CHECK(text.find('{') != std::string_view::npos);  // one JSON object
    if (auto got = parse_message_get(text, 7)) FUZZ_CHECK(!got->removed || got->data.empty());
    if (auto n = parse_stored_number(text)) {
      char buf[24];
      auto [end, ec] = std::to_chars(buf, buf + sizeof buf, *n);
      FUZZ_CHECK(ec == std::errc());
      // Leading zeros are accepted (a number of the same value); nothing else differs.
      std::string_view digits = text;
      while (digits.size() > 1 && digits.front() == '0') digits.remove_prefix(1);
      FUZZ_CHECK(std::string_view(buf, static_cast<std::size_t>(end - buf)) == digits);
    }
    return 0;
  }
  const std::string a(in.part()), b(in.part());
  {  // a leader's answer carrying `a` at sequence 9 reads back as `a`, and at no other
    const std::string answer = R"({"type":"io.nats.jetstream.api.v1.stream_msg_get_response","message":{"subject":"s","seq":9,"data":")" +
                               diaspora::base64_encode(a) + R"(","time":"2026-12-07T08:00:00.123456789Z"}})";
    const auto got = parse_message_get(answer, 9);
    FUZZ_CHECK(got && !got->removed && got->data == a);
    FUZZ_CHECK(!parse_message_get(answer, 10));
  }
  const std::string na = jetstream_name(a), nb = jetstream_name(b);
  const auto back = jetstream_unname(na);
  FUZZ_CHECK(back && *back == a);
  FUZZ_CHECK(na.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") == std::string::npos);
  const auto topic = topic_of_stream_name("DIASPORA-" + na, "DIASPORA");
  FUZZ_CHECK(topic.has_value() == valid_topic_name(a));
  if (topic) FUZZ_CHECK(*topic == a);
  const auto gt = parse_group_key(na + "." + nb);
  FUZZ_CHECK(gt.has_value() == (valid_topic_name(a) && valid_topic_name(b)));
  if (gt) FUZZ_CHECK(gt->first == a && gt->second == b);
  FUZZ_CHECK(!topic_of_stream_name("OTHER-" + na, "DIASPORA"));
  return 0;
}
