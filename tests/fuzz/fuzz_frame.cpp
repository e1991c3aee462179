// Fuzz target: a diaspora.v1 frame as the relay reads it from a client (parsed as the
// session does, in one arena; a publish checked by publish_head/publish_records, with the
// event-text scan event_texts() that stores each event as the client wrote it), and as a
// client reads a relay's frame (RelayClient::parse_frame). Invariants: every record the
// relay would store is text that parses to exactly the event that was validated; where the
// scan finds the events, each is that element of the parsed array; parse_frame accepts
// every JSON object the relay accepts, as the same object.
#include <boost/json.hpp>

#include "diaspora/client.hpp"
#include "event_text.hpp"
#include "fuzz_support.hpp"

using namespace diaspora;
namespace json = boost::json;

namespace {

// Compared as serialized: a number out of range parses as infinity or NaN (NaN != NaN).
bool same(const json::value& a, const json::value& b) { return json::serialize(a) == json::serialize(b); }

bool parses_to(std::string_view text, const json::value& want) {
  boost::system::error_code ec;
  const json::value v = json::parse(text, ec);
  return !ec && same(v, want);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  boost::system::error_code ec;
  json::monotonic_resource arena(text.size() * 2 + 1024);
  const json::value msg = json::parse(text, ec, &arena);

  const auto client_view = RelayClient::parse_frame(text);
  if (!ec && msg.is_object()) FUZZ_CHECK(client_view && same(*client_view, msg));  // (it allows more depth)
  if (ec || !msg.is_object()) return 0;
  const json::object& o = msg.get_object();

  if (const auto texts = relay::event_texts(text)) {
    const json::value* evs = o.if_contains("events");
    if (evs && evs->is_array() && evs->get_array().size() == texts->size())
      for (std::size_t i = 0; i < texts->size(); ++i) FUZZ_CHECK(parses_to((*texts)[i], evs->get_array()[i]));
  }

  relay::PublishRefusal refusal;
  if (!relay::publish_head(o, refusal)) {
    FUZZ_CHECK(!refusal.code.empty() && !refusal.message.empty());
    return 0;
  }
  std::vector<relay::AppendRecord> records;
  std::uint64_t bytes = 0;
  const relay::PublishLimits limits{64, 4096};
  if (const auto err = relay::publish_records(o, text, limits, CodecOptions{}, records, bytes)) {
    FUZZ_CHECK(!err->code.empty() && !err->message.empty());
    return 0;
  }
  const json::array& events = o.at("events").as_array();
  FUZZ_CHECK(records.size() == events.size());
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < records.size(); ++i) {
    FUZZ_CHECK(parses_to(records[i].payload, events[i]));
    FUZZ_CHECK(records[i].payload.size() <= limits.max_event_bytes);
    FUZZ_CHECK(records[i].dedupe_key.find('\x1f') != std::string::npos);
    total += records[i].payload.size();
  }
  FUZZ_CHECK(total == bytes);
  return 0;
}
