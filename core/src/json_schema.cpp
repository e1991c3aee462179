#include "diaspora/json_schema.hpp"

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <bitset>
#include <cstring>
#include <optional>
#include <regex>
#include <set>
#include <unordered_map>

namespace diaspora::detail {
const std::vector<std::pair<std::string_view, std::string_view>>& embedded_schemas();
}

namespace diaspora::schema {

namespace json = boost::json;

std::string format_path(const Path& path) {
  if (path.empty()) return "(root)";
  std::string out;
  for (const auto& seg : path) {
    if (const auto* key = std::get_if<std::string>(&seg)) {
      if (!out.empty()) out += '.';
      out += *key;
    } else {
      out += '[' + std::to_string(std::get<std::size_t>(seg)) + ']';
    }
  }
  return out;
}

namespace {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
      // Adjacent transposition counts as one edit ("wrokers" -> "workers").
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        cur[j] = std::min(cur[j], prev[j - 1]);  // approximation of Damerau distance
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string quote_list(const json::array& values) {
  std::string out;
  for (const auto& v : values) {
    if (!out.empty()) out += ", ";
    out += json::serialize(v);
  }
  return out;
}

const char* kind_name(const json::value& v) {
  switch (v.kind()) {
    case json::kind::null: return "null";
    case json::kind::bool_: return "boolean";
    case json::kind::int64:
    case json::kind::uint64: return "integer";
    case json::kind::double_: {
      double d = v.get_double();
      return (std::isfinite(d) && std::floor(d) == d) ? "integer" : "number";
    }
    case json::kind::string: return "string";
    case json::kind::array: return "array";
    case json::kind::object: return "object";
  }
  return "unknown";
}

// JSON Schema type names as bits; an integer-valued number is both "integer" and "number".
enum : unsigned { kNull = 1, kBoolean = 2, kInteger = 4, kNumber = 8, kString = 16, kArray = 32, kObject = 64 };

unsigned type_bit(std::string_view name) {
  if (name == "null") return kNull;
  if (name == "boolean") return kBoolean;
  if (name == "integer") return kInteger;
  if (name == "number") return kNumber;
  if (name == "string") return kString;
  if (name == "array") return kArray;
  if (name == "object") return kObject;
  return 0;  // an unknown name matches nothing
}

unsigned type_bits(const json::value& v) {
  switch (v.kind()) {
    case json::kind::null: return kNull;
    case json::kind::bool_: return kBoolean;
    case json::kind::int64:
    case json::kind::uint64: return kInteger | kNumber;
    case json::kind::double_: {
      const double d = v.get_double();
      return std::isfinite(d) && std::floor(d) == d ? kInteger | kNumber : kNumber;
    }
    case json::kind::string: return kString;
    case json::kind::array: return kArray;
    case json::kind::object: return kObject;
  }
  return 0;
}

double as_double(const json::value& v) {
  if (v.is_int64()) return static_cast<double>(v.get_int64());
  if (v.is_uint64()) return static_cast<double>(v.get_uint64());
  return v.get_double();
}

std::string number_text(const json::value& v) {
  if (v.is_double()) {
    double d = v.get_double();
    if (std::floor(d) == d && std::fabs(d) < 1e15) return std::to_string(static_cast<long long>(d));
  }
  return json::serialize(v);
}

// JSON Schema equality: numbers compare by value (1 == 1.0), containers deeply.
bool json_equal(const json::value& a, const json::value& b) {
  if (a.is_number() && b.is_number()) return as_double(a) == as_double(b);
  if (a.kind() != b.kind()) return false;
  if (a.is_array()) {
    const auto &x = a.get_array(), &y = b.get_array();
    if (x.size() != y.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!json_equal(x[i], y[i])) return false;
    return true;
  }
  if (a.is_object()) {
    const auto &x = a.get_object(), &y = b.get_object();
    if (x.size() != y.size()) return false;
    for (const auto& kv : x) {
      auto it = y.find(kv.key());
      if (it == y.end() || !json_equal(kv.value(), it->value())) return false;
    }
    return true;
  }
  return a == b;
}

std::size_t utf8_length(std::string_view s) {
  std::size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

const std::set<std::string_view>& known_keywords() {
  static const std::set<std::string_view> k = {
      "$schema", "$id", "$defs", "$ref", "$comment", "title", "description", "default",
      "examples", "deprecated", "readOnly", "writeOnly", "errorMessage", "type", "enum",
      "const", "properties", "patternProperties", "additionalProperties", "required",
      "propertyNames", "items", "minItems", "maxItems", "uniqueItems", "minimum", "maximum",
      "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "pattern", "allOf",
      "anyOf", "oneOf", "not", "if", "then", "else"};
  return k;
}

}  // namespace

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = 3;
  for (const auto& c : candidates) {
    // The distance is at least the difference in length: skip candidates that cannot win
    // (a long unknown key costs nothing then, instead of a length x length table each).
    const std::size_t gap = word.size() > c.size() ? word.size() - c.size() : c.size() - word.size();
    if (gap >= best_d) continue;
    std::size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  if (best.empty() && word.size() >= 3) {
    for (const auto& c : candidates)
      if (c.starts_with(word) || word.starts_with(c)) return c;
  }
  return best;
}

// A compiled "pattern". The schemas' patterns are mostly a run of character classes and
// literals with counts (^[A-Za-z0-9_.:-]{1,128}$): those are matched here directly, by a
// small backtracking matcher over (byte set, min, max) atoms; std::regex (slow: it showed
// in the relay's profile) serves the rest (groups, alternation, '.', \s ...). Both work
// on bytes, as std::regex over char does.
class Pattern {
 public:
  explicit Pattern(const std::string& source) {
    if (!compile(source)) regex_.emplace(source, std::regex::ECMAScript);
  }

  bool fast() const noexcept { return !regex_; }

  bool search(std::string_view text) const {
    if (regex_) return std::regex_search(text.begin(), text.end(), *regex_);
    if (anchored_start_) return match(0, text, 0);
    for (std::size_t start = 0; start <= text.size(); ++start)
      if (match(0, text, start)) return true;
    return false;
  }

 private:
  struct Atom {
    std::bitset<256> set;
    std::size_t min = 1, max = 1;
  };

  bool compile(std::string_view p) {
    std::size_t i = 0;
    if (i < p.size() && p[i] == '^') {
      anchored_start_ = true;
      ++i;
    }
    while (i < p.size()) {
      const char c = p[i];
      if (c == '$' && i + 1 == p.size()) {
        anchored_end_ = true;
        return true;
      }
      Atom a;
      if (c == '[') {
        ++i;
        if (i < p.size() && p[i] == '^') return false;  // negated: bytes vs characters differ
        bool closed = false;
        while (i < p.size()) {
          char x = p[i];
          if (x == ']') {
            closed = true;
            ++i;
            break;
          }
          if (x == '\\') {
            if (i + 1 >= p.size() || std::isalnum(static_cast<unsigned char>(p[i + 1]))) return false;
            x = p[++i];
          }
          if (i + 2 < p.size() && p[i + 1] == '-' && p[i + 2] != ']') {
            char hi = p[i + 2];
            if (hi == '\\') return false;
            for (int ch = static_cast<unsigned char>(x); ch <= static_cast<unsigned char>(hi); ++ch) a.set.set(static_cast<std::size_t>(ch));
            i += 3;
          } else {
            a.set.set(static_cast<unsigned char>(x));
            ++i;
          }
        }
        if (!closed) return false;
      } else if (c == '\\') {
        if (i + 1 >= p.size() || std::isalnum(static_cast<unsigned char>(p[i + 1]))) return false;  // \s, \d, ...
        a.set.set(static_cast<unsigned char>(p[i + 1]));
        i += 2;
      } else if (std::strchr("()|.*+?{}[]^$", c)) {
        return false;
      } else {
        a.set.set(static_cast<unsigned char>(c));
        ++i;
      }
      if (i < p.size()) {  // quantifier
        if (p[i] == '+') {
          a.max = std::string_view::npos;
          ++i;
        } else if (p[i] == '*') {
          a.min = 0;
          a.max = std::string_view::npos;
          ++i;
        } else if (p[i] == '?') {
          a.min = 0;
          ++i;
        } else if (p[i] == '{') {
          const auto close = p.find('}', i);
          if (close == std::string_view::npos) return false;
          const std::string_view body = p.substr(i + 1, close - i - 1);
          const auto comma = body.find(',');
          auto num = [](std::string_view d, std::size_t& out) {
            if (d.empty() || d.size() > 6) return false;
            out = 0;
            for (char ch : d) {
              if (ch < '0' || ch > '9') return false;
              out = out * 10 + static_cast<std::size_t>(ch - '0');
            }
            return true;
          };
          if (comma == std::string_view::npos) {
            if (!num(body, a.min)) return false;
            a.max = a.min;
          } else {
            if (!num(body.substr(0, comma), a.min)) return false;
            if (comma + 1 == body.size()) a.max = std::string_view::npos;
            else if (!num(body.substr(comma + 1), a.max) || a.max < a.min) return false;
          }
          i = close + 1;
        }
      }
      atoms_.push_back(a);
    }
    return true;
  }

  bool match(std::size_t k, std::string_view t, std::size_t pos) const {
    if (k == atoms_.size()) return !anchored_end_ || pos == t.size();
    const Atom& a = atoms_[k];
    std::size_t n = 0;  // greedy, then give back
    while (n < a.max && pos + n < t.size() && a.set.test(static_cast<unsigned char>(t[pos + n]))) ++n;
    if (n < a.min) return false;
    for (std::size_t c = n + 1; c-- > a.min;)
      if (match(k + 1, t, pos + c)) return true;
    return false;
  }

  std::vector<Atom> atoms_;
  bool anchored_start_ = false, anchored_end_ = false;
  std::optional<std::regex> regex_;
};

struct Schema::Impl {
  json::value doc;
  std::string name;
  std::unordered_map<const json::string*, Pattern> regexes;  // "pattern" values
  std::unordered_map<const char*, Pattern> key_regexes;        // "patternProperties" keys, by their text in doc

  /// One schema object's keywords, found once when the schema is loaded: the interpreter
  /// used to search each object for some 25 keywords per validated value (linear
  /// searches with string compares, the bulk of payload validation in the relay's profile).
  struct Keywords {
    const json::value* error_message = nullptr;  // "errorMessage"
    const json::value* ref = nullptr;  // "$ref"
    const json::value* type = nullptr;  // "type"
    const json::value* enum_ = nullptr;  // "enum"
    const json::value* const_ = nullptr;  // "const"
    const json::value* min_length = nullptr;  // "minLength"
    const json::value* max_length = nullptr;  // "maxLength"
    const json::value* pattern = nullptr;  // "pattern"
    const json::value* all_of = nullptr;  // "allOf"
    const json::value* any_of = nullptr;  // "anyOf"
    const json::value* one_of = nullptr;  // "oneOf"
    const json::value* not_ = nullptr;  // "not"
    const json::value* if_ = nullptr;  // "if"
    const json::value* then_ = nullptr;  // "then"
    const json::value* else_ = nullptr;  // "else"
    const json::value* minimum = nullptr;  // "minimum"
    const json::value* maximum = nullptr;  // "maximum"
    const json::value* exclusive_minimum = nullptr;  // "exclusiveMinimum"
    const json::value* exclusive_maximum = nullptr;  // "exclusiveMaximum"
    const json::value* properties = nullptr;  // "properties"
    const json::value* pattern_properties = nullptr;  // "patternProperties"
    const json::value* additional_properties = nullptr;  // "additionalProperties"
    const json::value* property_names = nullptr;  // "propertyNames"
    const json::value* required = nullptr;  // "required"
    const json::value* min_items = nullptr;  // "minItems"
    const json::value* max_items = nullptr;  // "maxItems"
    const json::value* items = nullptr;  // "items"
    const json::value* unique_items = nullptr;  // "uniqueItems"
    const json::value* ref_target = nullptr;  // what "$ref" resolves to
    unsigned type_mask = 0;                    // "type" as type_bits() of the names
    const Pattern* pattern_re = nullptr;       // "pattern", compiled (set by finish())
    // Only keywords that look at a string ("type", "minLength", "maxLength", "pattern",
    // "errorMessage"): an object key checked by "propertyNames" against such a schema is
    // checked as it is, without making a JSON value of it.
    bool string_only = false;
  };
  std::unordered_map<const json::object*, Keywords> keywords;
  // The same, for lookups while validating: open addressing by the schema object's
  // address (keywords_of() runs once per validated value; std::unordered_map's modulo
  // and node hop showed in the relay's profile). Built by finish(); empty slots are null.
  std::vector<std::pair<const json::object*, const Keywords*>> table;
  std::size_t table_mask = 0;

  static std::size_t slot_of(const json::object* o, std::size_t mask) noexcept {
    return static_cast<std::size_t>((reinterpret_cast<std::uintptr_t>(o) >> 4) * 0x9E3779B97F4A7C15ULL >> 20) & mask;
  }
  /// After check(): resolves each "pattern" and fills the lookup table.
  void finish() {
    std::size_t cap = 16;
    while (cap < keywords.size() * 2) cap <<= 1;
    table.assign(cap, {nullptr, nullptr});
    table_mask = cap - 1;
    for (auto& [obj, k] : keywords) {
      if (k.pattern && k.pattern->is_string())
        if (auto it = regexes.find(&k.pattern->get_string()); it != regexes.end()) k.pattern_re = &it->second;
      k.string_only = !(k.ref || k.enum_ || k.const_ || k.all_of || k.any_of || k.one_of || k.not_ || k.if_ ||
                        k.minimum || k.maximum || k.exclusive_minimum || k.exclusive_maximum || k.properties ||
                        k.pattern_properties || k.additional_properties || k.property_names || k.required ||
                        k.min_items || k.max_items || k.items || k.unique_items);
      std::size_t i = slot_of(obj, table_mask);
      while (table[i].first) i = (i + 1) & table_mask;
      table[i] = {obj, &k};
    }
  }

  Keywords compile(const json::object& so) const {
    Keywords out;
    for (const auto& kv : so) {
      const std::string_view key = kv.key();
      if (key == "errorMessage") out.error_message = &kv.value();
      else if (key == "$ref") out.ref = &kv.value();
      else if (key == "type") out.type = &kv.value();
      else if (key == "enum") out.enum_ = &kv.value();
      else if (key == "const") out.const_ = &kv.value();
      else if (key == "minLength") out.min_length = &kv.value();
      else if (key == "maxLength") out.max_length = &kv.value();
      else if (key == "pattern") out.pattern = &kv.value();
      else if (key == "allOf") out.all_of = &kv.value();
      else if (key == "anyOf") out.any_of = &kv.value();
      else if (key == "oneOf") out.one_of = &kv.value();
      else if (key == "not") out.not_ = &kv.value();
      else if (key == "if") out.if_ = &kv.value();
      else if (key == "then") out.then_ = &kv.value();
      else if (key == "else") out.else_ = &kv.value();
      else if (key == "minimum") out.minimum = &kv.value();
      else if (key == "maximum") out.maximum = &kv.value();
      else if (key == "exclusiveMinimum") out.exclusive_minimum = &kv.value();
      else if (key == "exclusiveMaximum") out.exclusive_maximum = &kv.value();
      else if (key == "properties") out.properties = &kv.value();
      else if (key == "patternProperties") out.pattern_properties = &kv.value();
      else if (key == "additionalProperties") out.additional_properties = &kv.value();
      else if (key == "propertyNames") out.property_names = &kv.value();
      else if (key == "required") out.required = &kv.value();
      else if (key == "minItems") out.min_items = &kv.value();
      else if (key == "maxItems") out.max_items = &kv.value();
      else if (key == "items") out.items = &kv.value();
      else if (key == "uniqueItems") out.unique_items = &kv.value();
    }
    if (out.type) {
      auto add = [&](const json::value& n) {
        if (n.is_string()) out.type_mask |= type_bit(n.get_string());
      };
      if (out.type->is_array())
        for (const auto& n : out.type->get_array()) add(n);
      else
        add(*out.type);
    }
    if (out.ref && out.ref->is_string()) out.ref_target = resolve(out.ref->get_string());
    return out;
  }
  const Keywords& keywords_of(const json::object& so) const {
    if (!table.empty())
      for (std::size_t i = slot_of(&so, table_mask); table[i].first; i = (i + 1) & table_mask)
        if (table[i].first == &so) return *table[i].second;
    thread_local Keywords scratch;  // not reached: check() registers every schema object
    scratch = compile(so);
    return scratch;
  }

  void check(const json::value& s, const std::string& where) {
    if (s.is_bool()) return;
    if (!s.is_object()) throw SchemaError(name + ": " + where + ": a schema must be an object or a boolean");
    keywords.emplace(&s.get_object(), compile(s.get_object()));
    for (const auto& kv : s.get_object()) {
      std::string_view key = kv.key();
      std::string here = where + "/" + std::string(key);
      if (!known_keywords().count(key))
        throw SchemaError(name + ": " + here + ": unsupported keyword '" + std::string(key) + "'");
      const json::value& v = kv.value();
      if (key == "pattern") {
        if (!v.is_string()) throw SchemaError(name + ": " + here + ": pattern must be a string");
        try {
          regexes.emplace(&v.get_string(), Pattern(std::string(v.get_string())));
        } catch (const std::regex_error& e) {
          throw SchemaError(name + ": " + here + ": bad regular expression: " + e.what());
        }
      } else if (key == "properties" || key == "patternProperties" || key == "$defs") {
        if (!v.is_object()) throw SchemaError(name + ": " + here + ": must be an object");
        for (const auto& p : v.get_object()) {
          if (key == "patternProperties") {
            try {
              key_regexes.emplace(p.key().data(), Pattern(std::string(p.key())));
            } catch (const std::regex_error& e) {
              throw SchemaError(name + ": " + here + ": bad regular expression '" + std::string(p.key()) + "': " + e.what());
            }
          }
          check(p.value(), here + "/" + std::string(p.key()));
        }
      } else if (key == "additionalProperties" || key == "propertyNames" || key == "items" ||
                 key == "not" || key == "if" || key == "then" || key == "else") {
        check(v, here);
      } else if (key == "allOf" || key == "anyOf" || key == "oneOf") {
        if (!v.is_array() || v.get_array().empty())
          throw SchemaError(name + ": " + here + ": must be a non-empty array");
        std::size_t i = 0;
        for (const auto& sub : v.get_array()) check(sub, here + "/" + std::to_string(i++));
      } else if (key == "$ref") {
        if (!v.is_string() || !resolve(v.get_string()))
          throw SchemaError(name + ": " + here + ": unresolvable $ref (only local '#/$defs/...' refs are supported)");
      } else if (key == "required" || key == "enum") {
        if (!v.is_array()) throw SchemaError(name + ": " + here + ": must be an array");
      }
    }
  }

  const json::value* resolve(std::string_view ref) const {
    if (ref == "#") return &doc;
    if (!ref.starts_with("#/")) return nullptr;
    const json::value* cur = &doc;
    std::string_view rest = ref.substr(2);
    while (!rest.empty()) {
      auto slash = rest.find('/');
      std::string_view token = rest.substr(0, slash);
      rest = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
      if (!cur->is_object()) return nullptr;
      auto it = cur->get_object().find(token);
      if (it == cur->get_object().end()) return nullptr;
      cur = &it->value();
    }
    return cur;
  }

  bool regex_search(const json::string& pattern, std::string_view text) const {
    auto it = regexes.find(&pattern);
    if (it != regexes.end()) return it->second.search(text);
    return Pattern(std::string(pattern)).search(text);
  }

  using ViewPath = std::vector<std::variant<std::string_view, std::size_t>>;

  // Issues own their path; while validating, the path is views into the instance's keys
  // (a string per visited key showed in the relay's profile).
  static Path own(const ViewPath& vp) {
    Path p;
    p.reserve(vp.size());
    for (const auto& seg : vp) {
      if (const auto* key = std::get_if<std::string_view>(&seg)) p.emplace_back(std::in_place_type<std::string>, *key);
      else p.emplace_back(std::get<std::size_t>(seg));
    }
    return p;
  }

  template <class Report>
  void string_keywords(const Keywords& k, std::string_view str, Report& report) const {
    std::size_t len = utf8_length(str);
    if (const auto* m = k.min_length; m && len < as_double(*m))
      report(as_double(*m) == 1 ? std::string("must not be empty")
                                : "must be at least " + number_text(*m) + " characters long");
    if (const auto* m = k.max_length; m && len > as_double(*m))
      report("must be at most " + number_text(*m) + " characters long");
    if (const auto* p = k.pattern;
        p && !(k.pattern_re ? k.pattern_re->search(str) : regex_search(p->get_string(), str)))
      report("must match the pattern " + json::serialize(*p));
  }

  // Validates `v` against schema `s`, appending issues under `path`.
  void validate(const json::value& s, const json::value& v, ViewPath& path, std::vector<Issue>& out) const {
    if (s.is_bool()) {
      if (!s.get_bool()) out.push_back({own(path), "is not allowed here", false});
      return;
    }
    const json::object& so = s.get_object();
    const Keywords& k = keywords_of(so);
    const json::value* custom = k.error_message;
    auto value_issue = [&](std::string generic) {
      out.push_back({own(path), custom && custom->is_string() ? std::string(custom->get_string()) : std::move(generic), false});
    };

    if (k.ref) validate(*k.ref_target, v, path, out);  // check() made sure it resolves

    if (const auto* t = k.type; t && !(k.type_mask & type_bits(v))) {
      std::string expected;
      bool structural = false;
      auto consider = [&](std::string_view tname) {
        if (!expected.empty()) expected += " or ";
        expected += tname;
        if (tname == "object" || tname == "array") structural = true;
      };
      if (t->is_string()) consider(t->get_string());
      else for (const auto& n : t->get_array()) consider(n.get_string());
      std::string generic = "expected " + expected + ", got " + kind_name(v);
      if (structural) out.push_back({own(path), generic, false});
      else value_issue(generic);
      return;  // the other keywords would only repeat the type mismatch
    }
    if (const auto* e = k.enum_) {
      const auto& arr = e->get_array();
      if (std::none_of(arr.begin(), arr.end(), [&](const json::value& c) { return json_equal(c, v); }))
        value_issue("must be one of: " + quote_list(arr) + (v.is_string() ? suggestion(v.get_string(), arr) : ""));
    }
    if (const auto* c = k.const_) {
      if (!json_equal(*c, v)) value_issue("must be " + json::serialize(*c));
    }
    if (v.is_number()) number_keywords(k, v, value_issue);
    if (v.is_string()) string_keywords(k, v.get_string(), value_issue);
    if (v.is_object()) object_keywords(k, v.get_object(), path, out);
    if (v.is_array()) array_keywords(k, v.get_array(), path, out);

    if (const auto* all = k.all_of)
      for (const auto& sub : all->get_array()) validate(sub, v, path, out);
    if (const auto* any = k.any_of) {
      std::size_t best_count = SIZE_MAX;
      std::vector<Issue> best;
      bool matched = false;
      for (const auto& sub : any->get_array()) {
        std::vector<Issue> trial;
        validate(sub, v, path, trial);
        if (trial.empty()) { matched = true; break; }
        if (trial.size() < best_count) { best_count = trial.size(); best = std::move(trial); }
      }
      if (!matched) {
        if (custom) value_issue("");
        else out.insert(out.end(), best.begin(), best.end());
      }
    }
    if (const auto* one = k.one_of) {
      std::size_t matched = 0;
      for (const auto& sub : one->get_array()) {
        std::vector<Issue> trial;
        validate(sub, v, path, trial);
        if (trial.empty()) ++matched;
      }
      if (matched != 1)
        value_issue("must match exactly one of " + std::to_string(one->get_array().size()) +
                    " alternatives (matched " + std::to_string(matched) + ")");
    }
    if (const auto* n = k.not_) {
      std::vector<Issue> trial;
      validate(*n, v, path, trial);
      if (trial.empty()) out.push_back({own(path), not_message(*n), false});
    }
    if (const auto* cond = k.if_) {
      std::vector<Issue> trial;
      validate(*cond, v, path, trial);
      if (trial.empty()) {
        if (const auto* then = k.then_) validate(*then, v, path, out);
      } else if (const auto* els = k.else_) {
        validate(*els, v, path, out);
      }
    }
  }

  static std::string suggestion(std::string_view word, const json::array& choices) {
    std::vector<std::string> names;
    for (const auto& c : choices)
      if (c.is_string()) names.emplace_back(c.get_string());
    std::string best = closest_match(word, names);
    return best.empty() ? "" : "; did you mean '" + best + "'?";
  }

  static std::string not_message(const json::value& n) {
    // {"not": {"required": ["a", "b"]}} reads better as a sentence.
    if (n.is_object() && n.get_object().size() == 1 && n.get_object().contains("required")) {
      std::string keys;
      const auto& req = n.get_object().at("required").get_array();
      for (std::size_t i = 0; i < req.size(); ++i) {
        if (i) keys += i + 1 == req.size() ? " and " : ", ";
        keys += "'" + std::string(req[i].get_string()) + "'";
      }
      return keys + " cannot be used together";
    }
    return "must not match the forbidden schema";
  }

  template <class Report>
  static void number_keywords(const Keywords& k, const json::value& v, Report& report) {
    double x = as_double(v);
    if (const auto* m = k.minimum; m && x < as_double(*m)) report("must be >= " + number_text(*m));
    if (const auto* m = k.maximum; m && x > as_double(*m)) report("must be <= " + number_text(*m));
    if (const auto* m = k.exclusive_minimum; m && x <= as_double(*m))
      report("must be > " + number_text(*m));
    if (const auto* m = k.exclusive_maximum; m && x >= as_double(*m))
      report("must be < " + number_text(*m));
  }

  void object_keywords(const Keywords& k, const json::object& obj, ViewPath& path, std::vector<Issue>& out) const {
    const json::object* props = nullptr;
    if (const auto* p = k.properties) props = &p->get_object();
    const json::object* pattern_props = nullptr;
    if (const auto* p = k.pattern_properties) pattern_props = &p->get_object();
    const json::value* additional = k.additional_properties;
    const json::value* names = k.property_names;

    for (const auto& kv : obj) {
      const std::string_view key = kv.key();
      path.emplace_back(std::in_place_type<std::string_view>, key);
      if (names) {
        const Keywords* nk = names->is_object() ? &keywords_of(names->get_object()) : nullptr;
        if (nk && nk->string_only && (!nk->type || (nk->type_mask & kString))) {  // the key as it is
          auto key_issue = [&](std::string generic) {
            const json::value* custom = nk->error_message;
            out.push_back({own(path), "key '" + std::string(key) + "' " +
                                          (custom && custom->is_string() ? std::string(custom->get_string()) : std::move(generic)),
                           true});
          };
          string_keywords(*nk, key, key_issue);
        } else {
          std::vector<Issue> trial;
          ViewPath empty = path;
          validate(*names, json::value(kv.key()), empty, trial);
          for (auto& issue : trial) out.push_back({own(path), "key '" + std::string(key) + "' " + issue.message, true});
        }
      }
      bool covered = false;
      if (props) {
        if (const auto* sub = props->if_contains(kv.key())) {
          covered = true;
          validate(*sub, kv.value(), path, out);
        }
      }
      if (pattern_props) {
        for (const auto& pp : *pattern_props) {
          if (key_regexes.at(pp.key().data()).search(key)) {
            covered = true;
            validate(pp.value(), kv.value(), path, out);
          }
        }
      }
      if (!covered && additional) {
        if (additional->is_bool() && !additional->get_bool()) {
          std::string msg = "unknown key '" + std::string(key) + "'";
          if (props) {
            std::vector<std::string> known;
            for (const auto& p : *props) known.emplace_back(p.key());
            std::string best = closest_match(key, known);
            if (!best.empty()) msg += "; did you mean '" + best + "'?";
          }
          out.push_back({own(path), msg, true});
        } else {
          validate(*additional, kv.value(), path, out);
        }
      }
      path.pop_back();
    }
    if (const auto* req = k.required) {
      for (const auto& r : req->get_array())
        if (!obj.contains(r.get_string()))
          out.push_back({own(path), "missing required key '" + std::string(r.get_string()) + "'", false});
    }
  }

  void array_keywords(const Keywords& k, const json::array& arr, ViewPath& path, std::vector<Issue>& out) const {
    if (const auto* m = k.min_items; m && arr.size() < as_double(*m))
      out.push_back({own(path), as_double(*m) == 1 ? std::string("must not be empty")
                                              : "must have at least " + number_text(*m) + " items", false});
    if (const auto* m = k.max_items; m && arr.size() > as_double(*m))
      out.push_back({own(path), "must have at most " + number_text(*m) + " items", false});
    if (const auto* items = k.items) {
      for (std::size_t i = 0; i < arr.size(); ++i) {
        path.emplace_back(i);
        validate(*items, arr[i], path, out);
        path.pop_back();
      }
    }
    if (const auto* u = k.unique_items; u && u->is_bool() && u->get_bool()) {
      for (std::size_t i = 1; i < arr.size(); ++i)
        for (std::size_t j = 0; j < i; ++j)
          if (json_equal(arr[i], arr[j])) {
            path.emplace_back(i);
            out.push_back({own(path), "duplicate item " + json::serialize(arr[i]) + " (same as item " +
                                     std::to_string(j) + ")", false});
            path.pop_back();
            break;
          }
    }
  }
};

Schema::Schema(json::value document, std::string name) : self_(std::make_unique<Impl>()) {
  self_->doc = std::move(document);
  self_->name = std::move(name);
  self_->check(self_->doc, "#");
  self_->finish();
}
Schema::~Schema() = default;
Schema::Schema(Schema&&) noexcept = default;
Schema& Schema::operator=(Schema&&) noexcept = default;

const std::string& Schema::name() const noexcept { return self_->name; }

std::vector<Issue> Schema::validate(const json::value& instance) const {
  std::vector<Issue> out;
  Impl::ViewPath path;
  path.reserve(8);
  self_->validate(self_->doc, instance, path, out);
  return out;
}

namespace {
struct Registry {
  std::map<std::string, std::unique_ptr<Schema>, std::less<>> schemas;
  Registry() {
    for (const auto& [name, text] : detail::embedded_schemas()) {
      boost::system::error_code ec;
      json::value doc = json::parse(text, ec);
      if (ec) throw SchemaError("built-in schema " + std::string(name) + " is not valid JSON: " + ec.message());
      schemas.emplace(std::string(name), std::make_unique<Schema>(std::move(doc), std::string(name)));
    }
  }
};
const Registry& registry() {
  static const Registry r;  // thread-safe initialisation (C++11 magic statics)
  return r;
}
}  // namespace

const Schema* builtin(std::string_view name) {
  const auto& all = registry().schemas;
  auto it = all.find(name);
  return it == all.end() ? nullptr : it->second.get();
}

std::vector<std::string> builtin_names() {
  std::vector<std::string> out;
  for (const auto& [name, schema] : registry().schemas) out.push_back(name);
  return out;
}

bool pattern_search(const std::string& pattern, std::string_view text, bool* fast) {
  Pattern p(pattern);
  if (fast) *fast = p.fast();
  return p.search(text);
}

}  // namespace diaspora::schema
