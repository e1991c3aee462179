#include <boost/json/parse.hpp>

#include <random>
#include <regex>

#include "diaspora/json_schema.hpp"
#include "test_helpers.hpp"

namespace json = boost::json;
using diaspora::schema::Schema;
using diaspora::schema::SchemaError;

namespace {

std::vector<std::string> errors(const char* schema, const char* instance) {
  Schema s(json::parse(schema));
  std::vector<std::string> out;
  for (const auto& i : s.validate(json::parse(instance)))
    out.push_back(diaspora::schema::format_path(i.path) + ": " + i.message);
  return out;
}

}  // namespace

TEST(JsonSchema, TypesIncludingIntegerValuedNumbers) {
  EXPECT_TRUE(errors(R"({"type":"integer"})", "3").empty());
  EXPECT_TRUE(errors(R"({"type":"integer"})", "3.0").empty());  // 2020-12: 3.0 is an integer
  EXPECT_EQ(errors(R"({"type":"integer"})", "3.5"),
            std::vector<std::string>{"(root): expected integer, got number"});
  EXPECT_EQ(errors(R"({"type":["integer","string"]})", "true"),
            std::vector<std::string>{"(root): expected integer or string, got boolean"});
}

TEST(JsonSchema, ObjectsReportEveryProblemWithPaths) {
  const char* s = R"({"type":"object","additionalProperties":false,"required":["name","workers"],
    "properties":{"name":{"type":"string"},"workers":{"type":"integer","minimum":1}}})";
  auto e = errors(s, R"({"name":5,"wrokers":2})");
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0], "name: expected string, got integer");
  EXPECT_EQ(e[1], "wrokers: unknown key 'wrokers'; did you mean 'workers'?");
  EXPECT_EQ(e[2], "(root): missing required key 'workers'");
  EXPECT_EQ(errors(s, R"({"name":"a","workers":0})"), std::vector<std::string>{"workers: must be >= 1"});
}

TEST(JsonSchema, ArraysRefsAndUniqueness) {
  const char* s = R"({"$defs":{"n":{"type":"string","minLength":1}},
    "type":"array","minItems":1,"uniqueItems":true,"items":{"$ref":"#/$defs/n"}})";
  EXPECT_EQ(errors(s, "[]"), std::vector<std::string>{"(root): must not be empty"});
  EXPECT_EQ(errors(s, R"(["a",""])"), std::vector<std::string>{"[1]: must not be empty"});
  EXPECT_EQ(errors(s, R"(["a","b","a"])"), std::vector<std::string>{"[2]: duplicate item \"a\" (same as item 0)"});
}

TEST(JsonSchema, CombinatorsAndCustomMessages) {
  const char* s = R"({"type":"object","oneOf":[{"required":["command"]},{"required":["kind"]}],
    "errorMessage":"needs exactly one of command or kind","not":{"required":["count","rate"]},
    "properties":{"d":{"type":"string","pattern":"^[0-9]+s$","errorMessage":"must be a duration"},
                  "e":{"enum":["local","dask"]}}})";
  EXPECT_TRUE(errors(s, R"({"command":"x"})").empty());
  EXPECT_EQ(errors(s, R"({"command":"x","kind":"y"})"),
            std::vector<std::string>{"(root): needs exactly one of command or kind"});
  EXPECT_EQ(errors(s, R"({"kind":"y","count":1,"rate":2})"),
            std::vector<std::string>{"(root): 'count' and 'rate' cannot be used together"});
  EXPECT_EQ(errors(s, R"({"kind":"y","d":"5m"})"), std::vector<std::string>{"d: must be a duration"});
  EXPECT_EQ(errors(s, R"({"kind":"y","e":"dsak"})"),
            std::vector<std::string>{"e: must be one of: \"local\", \"dask\"; did you mean 'dask'?"});
}

// A key checked by a string-only schema (checked as it is) and by any other schema (made a
// JSON value and validated): the same messages, at the key's path, deep in the instance.
TEST(JsonSchema, PropertyNamesOnBothPaths) {
  const char* plain = R"({"properties":{"m":{"type":"object","propertyNames":{"type":"string","pattern":"^[a-z]+$",
    "maxLength":4},"additionalProperties":{"type":"number"}}}})";
  EXPECT_TRUE(errors(plain, R"({"m":{"cpu":1,"mem":2}})").empty());
  EXPECT_EQ(errors(plain, R"({"m":{"cpu":1,"Disk":2,"network":"x"}})"),
            (std::vector<std::string>{"m.Disk: key 'Disk' must match the pattern \"^[a-z]+$\"",
                                      "m.network: key 'network' must be at most 4 characters long",
                                      "m.network: expected number, got string"}));
  const char* custom = R"({"propertyNames":{"pattern":"^[a-z]+$","errorMessage":"is not a lower-case name"}})";
  EXPECT_EQ(errors(custom, R"({"a":1,"B":2})"), std::vector<std::string>{"B: key 'B' is not a lower-case name"});
  const char* general = R"({"propertyNames":{"enum":["cpu","mem"]}})";
  EXPECT_TRUE(errors(general, R"({"cpu":1})").empty());
  EXPECT_EQ(errors(general, R"({"cpu":1,"men":2})"),
            std::vector<std::string>{"men: key 'men' must be one of: \"cpu\", \"mem\"; did you mean 'mem'?"});
}

TEST(JsonSchema, IfThenElse) {
  const char* s = R"({"if":{"properties":{"kind":{"const":"slow"}},"required":["kind"]},
    "then":{"required":["factor"]},"else":{"not":{"required":["factor"]}}})";
  EXPECT_TRUE(errors(s, R"({"kind":"slow","factor":2})").empty());
  EXPECT_EQ(errors(s, R"({"kind":"slow"})"), std::vector<std::string>{"(root): missing required key 'factor'"});
  EXPECT_EQ(errors(s, R"({"kind":"fast","factor":2})"),
            std::vector<std::string>{"(root): 'factor' cannot be used together"});
}

TEST(JsonSchema, RejectsWhatItDoesNotUnderstand) {
  EXPECT_THROW(Schema(json::parse(R"({"type":"string","format":"uri"})")), SchemaError);
  EXPECT_THROW(Schema(json::parse(R"({"$ref":"other.json#/x"})")), SchemaError);
  EXPECT_THROW(Schema(json::parse(R"({"pattern":"(unclosed"})")), SchemaError);
  EXPECT_THROW(Schema(json::parse(R"({"anyOf":[]})")), SchemaError);
}

TEST(JsonSchema, BuiltinsLoadAndMatchTheFilesOnDisk) {
  auto names = diaspora::schema::builtin_names();
  EXPECT_GE(names.size(), 16u);
  for (const auto& n : names) {
    SCOPED_TRACE(n);
    auto on_disk = diaspora::test::source_dir() / "schemas" / n;
    ASSERT_TRUE(std::filesystem::exists(on_disk));
  }
  EXPECT_NE(diaspora::schema::builtin("workflow.schema.json"), nullptr);
  EXPECT_EQ(diaspora::schema::builtin("nope.json"), nullptr);
}

TEST(JsonSchema, ClosestMatch) {
  std::vector<std::string> c = {"workers", "engine", "endpoint", "speed"};
  EXPECT_EQ(diaspora::schema::closest_match("wrokers", c), "workers");
  EXPECT_EQ(diaspora::schema::closest_match("engin", c), "engine");
  EXPECT_EQ(diaspora::schema::closest_match("xyzzy", c), "");
}

// The fast pattern matcher must agree with std::regex on every pattern our schemas use
// (and a few more shapes), over random and edge-case strings.
TEST(JsonSchemaPattern, FastMatcherAgreesWithStdRegex) {
  std::vector<std::string> patterns = {"^[A-Za-z0-9_.:-]{1,128}$", "^[a-z0-9]+:[0-9a-fA-F]+$", "^org\\.diaspora\\.",
                                       "^[A-Za-z][A-Za-z0-9_.-]{0,63}$", "ab*c?d+", "^x{2,}$", "[0-9]{3}", "^a?a?a?aaa$",
                                       "^[0-9]+(s|m|h|d)$", "^(always|never|interval:[0-9]{1,7})$"};
  std::mt19937 rng(7);
  const std::string alphabet = "aAbcdxz09:.-_/ \xc3\xa9odrg";
  int fast_count = 0;
  for (const auto& p : patterns) {
    bool fast = false;
    diaspora::schema::pattern_search(p, "", &fast);
    fast_count += fast;
    const std::regex re(p, std::regex::ECMAScript);
    std::vector<std::string> texts = {"", "a", "org.diaspora.task", "crc32c:1a2B", "x", "xx", "aaa", "12s", "never",
                                      std::string(128, 'a'), std::string(129, 'a'), "abbbcdd", "zz123zz"};
    for (int k = 0; k < 400; ++k) {
      std::string t;
      const int n = static_cast<int>(rng() % 12);
      for (int j = 0; j < n; ++j) t += alphabet[rng() % alphabet.size()];
      texts.push_back(t);
    }
    for (const auto& t : texts)
      EXPECT_EQ(diaspora::schema::pattern_search(p, t), std::regex_search(t, re)) << "pattern " << p << " text '" << t << "'";
  }
  EXPECT_GE(fast_count, 8);  // all but the two with groups take the fast path
}
