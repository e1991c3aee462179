// diaspora::parse_json_exact (core/include/diaspora/json_exact.hpp): the document boost's
// parser reads, with each double the nearest to its text.
#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <charconv>
#include <cmath>
#include <random>

#include "diaspora/json_exact.hpp"

namespace json = boost::json;

namespace {

TEST(JsonExact, ReadsTheDoubleThatWasWrittenWhereBoostIsOneUlpOff) {
  // This number (a trainer's error, printed shortest by boost::json::serialize) is one
  // that Boost 1.81's parser reads 1 ulp high.
  const char* text = R"({"m":[[0.011907458305358887,null]],"n":-3,"u":18446744073709551615,"s":"a\u00e9","t":true})";
  const json::value v = diaspora::parse_json_exact(text);
  double want = 0;
  const std::string_view num = "0.011907458305358887";
  std::from_chars(num.data(), num.data() + num.size(), want);
  EXPECT_EQ(v.at("m").at(0).at(0).as_double(), want);
  EXPECT_TRUE(v.at("m").at(0).at(1).is_null());
  EXPECT_EQ(v.at("n").as_int64(), -3);
  EXPECT_EQ(v.at("u").as_uint64(), 18446744073709551615ull);
  EXPECT_EQ(v.at("s").as_string(), "a\xc3\xa9");
  EXPECT_TRUE(v.at("t").as_bool());
  // Everything else as boost reads it.
  json::value b = json::parse(text);
  b.at("m").at(0).at(0) = want;
  EXPECT_EQ(v, b);
}

TEST(JsonExact, EveryShortestPrintedDoubleReadsBackBitForBit) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> mant(-1, 1);
  std::uniform_int_distribution<int> ex(-300, 300);
  for (int i = 0; i < 20000; ++i) {
    const double d = std::ldexp(mant(rng), ex(rng));
    const std::string s = json::serialize(json::array{d});
    EXPECT_EQ(diaspora::parse_json_exact(s).as_array()[0].as_double(), d) << s;
  }
}

TEST(JsonExact, SyntaxErrorsAndTrailingDataAreErrors) {
  json::error_code ec;
  EXPECT_TRUE(diaspora::parse_json_exact(" {\"a\": 1.5}\n", ec).is_object());
  EXPECT_FALSE(ec);
  EXPECT_TRUE(diaspora::parse_json_exact("{\"a\": }", ec).is_null());
  EXPECT_TRUE(ec);
  ec = {};
  diaspora::parse_json_exact("[1] [2]", ec);
  EXPECT_TRUE(ec);
  ec = {};
  diaspora::parse_json_exact("", ec);
  EXPECT_TRUE(ec);
  EXPECT_THROW(diaspora::parse_json_exact("[1,"), boost::system::system_error);
}

}  // namespace
