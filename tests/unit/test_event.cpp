#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <map>
#include <set>
#include <sstream>

#include "diaspora/event.hpp"
#include "diaspora/payloads.hpp"
#include "test_helpers.hpp"

namespace json = boost::json;
using diaspora::decode_event;
using diaspora::encode_event;
using diaspora::Event;
using diaspora::EventErrc;
using diaspora::EventError;

namespace {

EventErrc code_of(std::string_view text, const diaspora::CodecOptions& o = {}) {
  try {
    decode_event(text, o);
  } catch (const EventError& e) {
    return e.code();
  }
  ADD_FAILURE() << "accepted: " << text;
  return EventErrc::malformed_json;
}

}  // namespace

TEST(Event, RoundTripKeepsEveryAttributeAndExtension) {
  const std::string text = R"({"specversion":"1.0","id":"e-1","source":"/diaspora/wf/site-a",
    "type":"com.example.thing","subject":"task-7","time":"2026-11-30T09:15:38.5+02:00",
    "datacontenttype":"application/json","dataschema":"https://example.org/s.json",
    "traceparent":"00-abc-01","priority":7,"sampled":true,"data":{"x":[1,2.5,"y"]}})";
  Event e = decode_event(text);
  EXPECT_EQ(e.id, "e-1");
  EXPECT_EQ(e.subject.value(), "task-7");
  EXPECT_EQ(e.time.value(), "2026-11-30T09:15:38.5+02:00");  // kept as written
  ASSERT_EQ(e.extensions.size(), 3u);
  EXPECT_EQ(e.extensions.at("priority"), json::value(7));
  EXPECT_EQ(e.extensions.at("sampled"), json::value(true));
  Event again = decode_event(encode_event(e));
  EXPECT_EQ(again, e);
  EXPECT_EQ(json::parse(encode_event(e)), json::parse(text));
}

TEST(Event, BinaryDataTravelsAsBase64) {
  Event e;
  e.id = "b-1";
  e.source = "/x";
  e.type = "com.example.blob";
  e.data_binary = std::string("\x00\x01\xfe\xff" "abc", 7);
  std::string wire = encode_event(e);
  EXPECT_NE(wire.find("\"data_base64\":\"AAH+/2FiYw==\""), std::string::npos) << wire;
  EXPECT_EQ(decode_event(wire).data_binary, e.data_binary);
}

TEST(Event, DataAndDataBase64AreMutuallyExclusive) {
  EXPECT_EQ(code_of(R"({"specversion":"1.0","id":"1","source":"/s","type":"t","data":1,"data_base64":"AA=="})"),
            EventErrc::invalid_attribute);
  Event e;
  e.id = "1";
  e.source = "/s";
  e.type = "t";
  e.data = json::value(1);
  e.data_binary = "x";
  EXPECT_THROW(encode_event(e), EventError);
}

TEST(Event, RequiredAttributesAndSpecversion) {
  EXPECT_EQ(code_of(R"({"specversion":"1.0","source":"/s","type":"t"})"), EventErrc::missing_attribute);
  EXPECT_EQ(code_of(R"({"specversion":"1.0","id":"1","type":"t"})"), EventErrc::missing_attribute);
  EXPECT_EQ(code_of(R"({"id":"1","source":"/s","type":"t"})"), EventErrc::missing_attribute);
  EXPECT_EQ(code_of(R"({"specversion":"0.3","id":"1","source":"/s","type":"t"})"), EventErrc::invalid_attribute);
  EXPECT_EQ(code_of(R"({"specversion":"1.0","id":"","source":"/s","type":"t"})"), EventErrc::missing_attribute);
  EXPECT_EQ(code_of(R"({"specversion":"1.0","id":7,"source":"/s","type":"t"})"), EventErrc::invalid_attribute);
  EXPECT_EQ(code_of("[1,2]"), EventErrc::malformed_json);
  EXPECT_EQ(code_of("{not json"), EventErrc::malformed_json);
}

TEST(Event, ExtensionNamesAndValuesFollowTheSpec) {
  EXPECT_EQ(code_of(R"({"specversion":"1.0","id":"1","source":"/s","type":"t","Bad":"x"})"),
            EventErrc::invalid_attribute);
  EXPECT_EQ(code_of(R"({"specversion":"1.0","id":"1","source":"/s","type":"t","abcdefghijklmnopqrstu":"x"})"),
            EventErrc::invalid_attribute);
  EXPECT_EQ(code_of(R"({"specversion":"1.0","id":"1","source":"/s","type":"t","ext":{"a":1}})"),
            EventErrc::invalid_attribute);
  EXPECT_EQ(code_of(R"({"specversion":"1.0","id":"1","source":"/s","type":"t","ext":1.5})"),
            EventErrc::invalid_attribute);
}

TEST(Event, SizeLimitIsConfigurable) {
  std::string big(2000, 'x');
  std::string text = R"({"specversion":"1.0","id":"1","source":"/s","type":"t","data":")" + big + "\"}";
  EXPECT_NO_THROW(decode_event(text));  // default 1 MiB
  EXPECT_EQ(code_of(text, {.max_event_bytes = 1024}), EventErrc::too_large);
  std::string huge = R"({"specversion":"1.0","id":"1","source":"/s","type":"t","data":")" +
                     std::string((1u << 20) + 1, 'y') + "\"}";
  EXPECT_EQ(code_of(huge), EventErrc::too_large);
  Event e = decode_event(text);
  EXPECT_THROW(encode_event(e, {.max_event_bytes = 1024}), EventError);
}

TEST(Event, Rfc3339ParsingAndFormatting) {
  using namespace std::chrono;
  auto t = diaspora::parse_rfc3339("2026-11-30T07:15:38.123456Z");
  ASSERT_TRUE(t);
  EXPECT_EQ(diaspora::format_rfc3339(*t), "2026-11-30T07:15:38.123456Z");
  auto with_offset = diaspora::parse_rfc3339("2026-11-30T09:15:38.123456+02:00");
  ASSERT_TRUE(with_offset);
  EXPECT_EQ(*with_offset, *t);
  EXPECT_TRUE(diaspora::parse_rfc3339("2024-02-29T00:00:00z"));
  for (const char* bad : {"2026-11-30 07:15:38Z", "2026-13-01T00:00:00Z", "2023-02-29T00:00:00Z",
                          "2026-11-30T07:15:38", "2026-11-30T24:00:00Z", "2026-11-30T07:15:38.Z",
                          "2026-11-30T07:15:38.1234567891Z", "2026-11-30T07:15:38+2:00", "2026-11-30T07:15:38Zx"})
    EXPECT_FALSE(diaspora::parse_rfc3339(bad)) << bad;
  // The same in microseconds since the epoch (the unit of event times).
  const auto us = diaspora::parse_rfc3339_us("2026-11-30T09:15:38.123456+02:00");
  ASSERT_TRUE(us);
  EXPECT_EQ(*us, duration_cast<microseconds>(t->time_since_epoch()).count());
  EXPECT_EQ(diaspora::format_rfc3339_us(*us), "2026-11-30T07:15:38.123456Z");
  EXPECT_FALSE(diaspora::parse_rfc3339_us("2026-11-30T07:15:38"));
  // The clock's range (nanoseconds in 64 bits): beyond it a time is refused, not wrapped
  // (found by tests/fuzz/fuzz_event.cpp under UBSan).
  EXPECT_TRUE(diaspora::parse_rfc3339("2261-12-31T23:59:59Z"));
  EXPECT_TRUE(diaspora::parse_rfc3339("1678-01-01T00:00:00Z"));
  EXPECT_FALSE(diaspora::parse_rfc3339("5612-11-30T07:15:38.123Z"));
  EXPECT_FALSE(diaspora::parse_rfc3339("0001-01-01T00:00:00Z"));
  Event e;
  e.set_time(*t);
  EXPECT_EQ(e.time_point(), t);
}

TEST(Event, Base64) {
  for (std::string s : {"", "f", "fo", "foo", "foob", "fooba", "foobar"}) {
    auto enc = diaspora::base64_encode(s);
    EXPECT_EQ(diaspora::base64_decode(enc), s);
  }
  EXPECT_EQ(diaspora::base64_encode("foobar"), "Zm9vYmFy");
  EXPECT_FALSE(diaspora::base64_decode("Zm9"));
  EXPECT_FALSE(diaspora::base64_decode("Zm9v!A=="));
  EXPECT_FALSE(diaspora::base64_decode("Z==="));
}

TEST(Event, UuidsAreV4AndDistinct) {
  std::string a = diaspora::make_uuid(), b = diaspora::make_uuid();
  EXPECT_NE(a, b);
  ASSERT_EQ(a.size(), 36u);
  EXPECT_EQ(a[14], '4');
  EXPECT_NE(std::string("89ab").find(a[19]), std::string::npos);
}

// The corpus under tests/data/events/ is also checked by python-jsonschema against
// schemas/ (tests/python/test_corpus.py); both must agree with the directory it sits in.
TEST(EventCorpus, ValidFilesDecode) {
  auto files = diaspora::test::files_in(diaspora::test::source_dir() / "tests/data/events/valid", ".json");
  ASSERT_GE(files.size(), 14u);
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    std::string text = diaspora::test::read_file(f);
    try {
      Event e = decode_event(text);
      EXPECT_EQ(json::parse(encode_event(e)), json::parse(text)) << "round trip changed the event";
    } catch (const EventError& e) {
      ADD_FAILURE() << e.what();
    }
  }
}

// Each invalid file is refused for its own reason: tests/data/events/invalid/EXPECT.tsv
// names what the message must contain (the Python reference checker reads it too).
TEST(EventCorpus, InvalidFilesAreRefusedForTheirReason) {
  const auto dir = diaspora::test::source_dir() / "tests/data/events/invalid";
  std::map<std::string, std::string> expect;
  std::istringstream in(diaspora::test::read_file(dir / "EXPECT.tsv"));
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos) << line;
    const auto end = line.find('\t', tab + 1);  // a third column is the Python checker's wording
    expect[line.substr(0, tab)] = line.substr(tab + 1, end == std::string::npos ? std::string::npos : end - tab - 1);
  }
  auto files = diaspora::test::files_in(dir, ".json");
  ASSERT_GE(files.size(), 20u);
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    ASSERT_TRUE(expect.count(f.filename().string())) << "no line in EXPECT.tsv for " << f.filename();
    try {
      decode_event(diaspora::test::read_file(f));
      ADD_FAILURE() << "accepted";
    } catch (const EventError& e) {
      EXPECT_NE(std::string(e.what()).find(expect[f.filename().string()]), std::string::npos)
          << "the reason '" << e.what() << "' does not name '" << expect[f.filename().string()] << "'";
    }
  }
  EXPECT_EQ(expect.size(), files.size()) << "EXPECT.tsv names files that do not exist";
}

TEST(EventCorpus, EveryDiasporaTypeHasAValidExample) {
  std::set<std::string> seen;
  for (const auto& f : diaspora::test::files_in(diaspora::test::source_dir() / "tests/data/events/valid", ".json"))
    seen.insert(decode_event(diaspora::test::read_file(f)).type);
  for (auto t : diaspora::events::all_types()) EXPECT_TRUE(seen.count(std::string(t))) << t;
}
