// The relay's scan for each event's text in a publish frame (relay/src/event_text.cpp),
// checked against Boost.JSON on frames with hostile strings, odd spacing and nesting.
#include <boost/json.hpp>
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "event_text.hpp"

namespace json = boost::json;
using diaspora::relay::event_texts;
using diaspora::relay::skip_json_string;

namespace {

// A random string of the characters that matter to the scan, escaped by Boost.JSON's
// serializer, sometimes long enough for the 16-byte steps.
std::string random_string(std::mt19937& rng) {
  static const std::vector<std::string> alphabet{"a", "b", "\"", "\\", "{", "}", "[", "]", ",", ":", " ", "\n", "\t", "/", "\x01", "\u00e9"};
  std::uniform_int_distribution<int> len(0, 1);
  const std::size_t n = len(rng) ? std::uniform_int_distribution<std::size_t>(0, 8)(rng)
                                 : std::uniform_int_distribution<std::size_t>(14, 70)(rng);
  std::string s;
  for (std::size_t i = 0; i < n; ++i) s += alphabet[std::uniform_int_distribution<std::size_t>(0, alphabet.size() - 1)(rng)];
  return s;
}

json::value random_value(std::mt19937& rng, int depth) {
  switch (std::uniform_int_distribution<int>(0, depth > 2 ? 2 : 4)(rng)) {
    case 0: return json::value(random_string(rng));
    case 1: return json::value(std::uniform_int_distribution<int>(-1000, 1000)(rng) / 7.0);
    case 2: return std::uniform_int_distribution<int>(0, 1)(rng) ? json::value(true) : json::value(nullptr);
    case 3: {
      json::array a;
      for (int i = std::uniform_int_distribution<int>(0, 3)(rng); i > 0; --i) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    default: {
      json::object o;
      for (int i = std::uniform_int_distribution<int>(0, 3)(rng); i > 0; --i) o[random_string(rng)] = random_value(rng, depth + 1);
      return o;
    }
  }
}

// Whitespace as a hand-written frame might have it.
std::string ws(std::mt19937& rng) {
  static const char* spaces[] = {"", "", " ", "\n  ", "\t", "\r\n"};
  return spaces[std::uniform_int_distribution<int>(0, 5)(rng)];
}

}  // namespace

TEST(EventTexts, AgreesWithTheParserOnRandomFrames) {
  std::mt19937 rng(7);
  for (int round = 0; round < 300; ++round) {
    const int events = std::uniform_int_distribution<int>(1, 20)(rng);
    std::vector<std::string> texts;
    std::string frame = "{" + ws(rng) + "\"op\"" + ws(rng) + ":" + ws(rng) + "\"publish\"," + ws(rng);
    // Keys before and after "events", holding values the scan must step over whole.
    frame += "\"x\":" + json::serialize(random_value(rng, 0)) + "," + ws(rng) + "\"events\"" + ws(rng) + ":" + ws(rng) + "[";
    for (int i = 0; i < events; ++i) {
      json::object e{{"id", std::to_string(i)}, {"data", random_value(rng, 0)}, {"s", random_string(rng)}};
      texts.push_back(json::serialize(e));
      frame += ws(rng) + texts.back() + ws(rng) + (i + 1 < events ? "," : "");
    }
    frame += "]" + ws(rng) + ",\"seq\":" + std::to_string(round) + ",\"y\":" + json::serialize(random_value(rng, 0)) + ws(rng) + "}";
    ASSERT_NO_THROW(json::parse(frame)) << frame;
    const auto got = event_texts(frame);
    ASSERT_TRUE(got.has_value()) << frame;
    ASSERT_EQ(got->size(), texts.size()) << frame;
    for (std::size_t i = 0; i < texts.size(); ++i) EXPECT_EQ((*got)[i], texts[i]) << "event " << i << " of " << frame;
  }
}

TEST(EventTexts, ScalarEventsAndEmptyContainers) {
  const auto got = event_texts(R"({"events":[1, -2.5e3 ,true,null,"s\"]",{},[],{"a":[]}]})");
  ASSERT_TRUE(got.has_value());
  const std::vector<std::string_view> want{"1", "-2.5e3", "true", "null", R"("s\"]")", "{}", "[]", R"({"a":[]})"};
  EXPECT_EQ(*got, want);
}

TEST(EventTexts, NoSinglePlainEventsKeyMeansNoTexts) {
  EXPECT_FALSE(event_texts(R"({"op":"publish"})").has_value());
  EXPECT_FALSE(event_texts(R"({"events":[1],"events":[2]})").has_value());  // duplicate: the slow path decides
  EXPECT_FALSE(event_texts(R"({"ev\u0065nts":[1]})").has_value());          // escaped key
  EXPECT_FALSE(event_texts(R"({"events":{"a":1}})").has_value());           // not an array
  EXPECT_FALSE(event_texts(R"([1,2])").has_value());
  EXPECT_FALSE(event_texts("").has_value());
}

TEST(EventTexts, TruncatedTextNeverReadsPastTheEnd) {
  // Not valid JSON (outside the precondition): the scan must still stay inside the text.
  const std::string frame = R"({"events":[{"a":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"},{"b":[1,2]}]})";
  for (std::size_t n = 0; n < frame.size(); ++n) {
    const std::string cut = frame.substr(0, n);  // its own allocation: ASan sees any overread
    // Whatever it finds lies inside the text (an overread itself is caught under ASan, in
    // make test-asan; this assertion holds in every build).
    if (auto texts = event_texts(cut)) {
      for (std::string_view t : *texts) {
        EXPECT_TRUE(t.data() >= cut.data() && t.data() + t.size() <= cut.data() + cut.size()) << n;
      }
    }
  }
}

TEST(EventTexts, StringEndsAfterEveryKindOfEscape) {
  std::string long_one(40, 'x');  // escapes past the first 16-byte steps
  long_one.append(R"(\\)").append(17, 'y').append(R"(\")");
  const std::vector<std::string> bodies{R"(plain)", R"(a\"b)", R"(ends\\)", R"(\\\")", R"(\u0022\u005c)", R"(\/\b\f\n\r\t)",
                                        long_one, ""};
  for (const std::string& body : bodies) {
    const std::string s = "\"" + body + "\"";
    ASSERT_NO_THROW(json::parse(s)) << s;  // each is one valid JSON string
    std::string followed = s;
    followed += R"(,"next")";
    EXPECT_EQ(skip_json_string(followed, 0), s.size()) << s;
  }
}
