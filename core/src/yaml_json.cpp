// YAML -> JSON with source positions, and schema validation with located diagnostics.
// Every YAML input of Diaspora goes through here, so all report errors the same way.
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cmath>
#include <optional>
#include <regex>
#include <sstream>
#include <utility>
#include <vector>

#include "diaspora/json_schema.hpp"
#include "diaspora/spec.hpp"

namespace diaspora {

namespace json = boost::json;
using schema::format_path;
using schema::Path;

std::string Diagnostic::str() const {
  std::string out = file;
  if (line > 0) out += ":" + std::to_string(line) + ":" + std::to_string(column);
  out += ": error: ";
  if (!path.empty()) out += path + ": ";
  out += message;
  return out;
}

namespace {

Location location_of(const YAML::Mark& m) {
  return {m.line >= 0 ? m.line + 1 : 1, m.column >= 0 ? m.column + 1 : 1};
}

// The YAML 1.2 core schema's number forms, scanned by hand (std::regex took most of a
// spec's load time: four matches, with allocations, for every plain scalar).
bool all_of(std::string_view s, bool (*in)(char)) {
  return !s.empty() && std::all_of(s.begin(), s.end(), in);
}
bool dec(char c) { return c >= '0' && c <= '9'; }
bool oct(char c) { return c >= '0' && c <= '7'; }
bool hex(char c) { return dec(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
std::string_view unsigned_part(std::string_view s) {
  return !s.empty() && (s[0] == '-' || s[0] == '+') ? s.substr(1) : s;
}
std::size_t leading_digits(std::string_view s) {
  std::size_t n = 0;
  while (n < s.size() && dec(s[n])) ++n;
  return n;
}
// [-+]? ( \.[0-9]+ | [0-9]+ (\.[0-9]*)? ) ([eE][-+]?[0-9]+)?
bool is_float(std::string_view s) {
  s = unsigned_part(s);
  const std::size_t whole = leading_digits(s);
  s.remove_prefix(whole);
  if (!s.empty() && s[0] == '.') {
    s.remove_prefix(1);
    const std::size_t frac = leading_digits(s);
    if (whole == 0 && frac == 0) return false;
    s.remove_prefix(frac);
  } else if (whole == 0) {
    return false;
  }
  if (s.empty()) return true;
  if (s[0] != 'e' && s[0] != 'E') return false;
  return all_of(unsigned_part(s.substr(1)), dec);
}

// YAML 1.2 core schema resolution of a plain scalar.
json::value resolve_plain(const std::string& s) {
  const std::string_view v(s);
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  // strtod never throws: an out-of-range value becomes +-HUGE_VAL (then range-checked by
  // the schema) instead of an exception.
  if (all_of(unsigned_part(v), dec)) {
    std::int64_t n = 0;
    const char* first = s.data() + (s[0] == '+' ? 1 : 0);
    auto [ptr, ec] = std::from_chars(first, s.data() + s.size(), n);
    if (ec == std::errc() && ptr == s.data() + s.size()) return n;
    return std::strtod(s.c_str(), nullptr);  // too large for 64 bits: a number
  }
  if (v.starts_with("0o") && all_of(v.substr(2), oct)) return static_cast<std::int64_t>(std::strtoull(s.c_str() + 2, nullptr, 8));
  if (v.starts_with("0x") && all_of(v.substr(2), hex)) return static_cast<std::int64_t>(std::strtoull(s.c_str() + 2, nullptr, 16));
  if (is_float(v)) return std::strtod(s.c_str(), nullptr);
  if (s == ".inf" || s == ".Inf" || s == ".INF" || s == "+.inf") return HUGE_VAL;
  if (s == "-.inf" || s == "-.Inf" || s == "-.INF") return -HUGE_VAL;
  if (s == ".nan" || s == ".NaN" || s == ".NAN") return NAN;
  return json::value(s);
}

json::value scalar_value(const YAML::Node& n) {
  const std::string& tag = n.Tag();
  const std::string& s = n.Scalar();
  if (tag == "?") return resolve_plain(s);
  if (tag == "tag:yaml.org,2002:int" || tag == "tag:yaml.org,2002:float" || tag == "tag:yaml.org,2002:bool" ||
      tag == "tag:yaml.org,2002:null") {
    json::value v = resolve_plain(s);
    return v;
  }
  return json::value(s);  // "!" (quoted), !!str and any other tag: a string
}

struct Converter {
  YamlDocument& doc;
  std::string file;

  json::value convert(const YAML::Node& n, Path& path) {
    doc.value_locations.emplace(format_path(path), location_of(n.Mark()));
    switch (n.Type()) {
      case YAML::NodeType::Null:
      case YAML::NodeType::Undefined: return nullptr;
      case YAML::NodeType::Scalar: return scalar_value(n);
      case YAML::NodeType::Sequence: {
        json::array a;
        std::size_t i = 0;
        for (const auto& item : n) {
          path.emplace_back(i++);
          a.push_back(convert(item, path));
          path.pop_back();
        }
        return a;
      }
      case YAML::NodeType::Map: {
        json::object o;
        for (const auto& kv : n) {
          Location key_loc = location_of(kv.first.Mark());
          if (!kv.first.IsScalar()) {
            doc.errors.push_back({file, key_loc.line, key_loc.column, format_path(path),
                                  "mapping keys must be plain strings"});
            continue;
          }
          std::string key = kv.first.Scalar();
          path.emplace_back(key);
          std::string where = format_path(path);
          if (o.contains(key)) {
            Location first = doc.key_locations[where];
            doc.errors.push_back({file, key_loc.line, key_loc.column, where,
                                  "duplicate key '" + key + "' (first defined at " + std::to_string(first.line) +
                                      ":" + std::to_string(first.column) + ")"});
            path.pop_back();
            continue;
          }
          doc.key_locations.emplace(where, key_loc);
          o[key] = convert(kv.second, path);
          // An empty value (`engine:` and nothing after it): yaml-cpp marks it at the next
          // token, often on a later line; an error about it belongs on its key.
          if (kv.second.IsNull() && location_of(kv.second.Mark()).line != key_loc.line)
            doc.value_locations[where] = key_loc;
          path.pop_back();
        }
        return o;
      }
    }
    return nullptr;
  }
};

// The lines of `text`, numbered from 1 (index 0 unused).
std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> lines{std::string_view{}};
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = text.find('\n', start);
    lines.push_back(text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return lines;
}

bool is_document_marker(std::string_view line) {
  return line.starts_with("---") && (line.size() == 3 || line[3] == ' ' || line[3] == '\t' || line[3] == '\r');
}

// The '---' that starts the document whose first node is at `first`.
Location document_start(const std::vector<std::string_view>& lines, Location first) {
  for (int l = std::min<int>(first.line, static_cast<int>(lines.size()) - 1); l >= 1; --l)
    if (is_document_marker(lines[static_cast<std::size_t>(l)])) return {l, 1};
  return first;
}

// The '[' or '{' open at `until` (1-based line and column) that no ']' or '}' ever closes
// in the whole text: where an unclosed flow collection starts. Quoted strings (a quote that
// starts a scalar, not the apostrophe of "it's") and comments are skipped.
std::optional<Location> unclosed_flow(const std::vector<std::string_view>& lines, Location until) {
  struct Open {
    Location at;
    bool closed = false;
  };
  std::vector<Open> opens;
  std::vector<std::size_t> stack;        // indexes into opens
  std::vector<std::size_t> at_error;     // the stack when the scan passed `until`
  bool passed = false;
  for (int l = 1; l < static_cast<int>(lines.size()); ++l) {
    const std::string_view s = lines[static_cast<std::size_t>(l)];
    char quote = 0;
    for (std::size_t c = 0; c <= s.size(); ++c) {
      if (!passed && (l > until.line || (l == until.line && static_cast<int>(c) + 1 >= until.column))) {
        passed = true;
        at_error = stack;
      }
      if (c == s.size()) break;
      const char ch = s[c];
      if (quote) {
        if (ch == quote) quote = 0;
        else if (ch == '\\' && quote == '"') ++c;
        continue;
      }
      const char before = c == 0 ? ' ' : s[c - 1];
      if (ch == '#' && (before == ' ' || before == '\t')) break;  // a comment
      if ((ch == '"' || ch == '\'') && std::string_view(" \t[{,:-").find(before) != std::string_view::npos) quote = ch;
      else if (ch == '[' || ch == '{') {
        stack.push_back(opens.size());
        opens.push_back({{l, static_cast<int>(c) + 1}});
      } else if ((ch == ']' || ch == '}') && !stack.empty()) {
        opens[stack.back()].closed = true;
        stack.pop_back();
      }
    }
  }
  if (!passed) at_error = stack;
  for (auto it = at_error.rbegin(); it != at_error.rend(); ++it)
    if (!opens[*it].closed) return opens[*it].at;
  return std::nullopt;
}

// `key:value` written without the space YAML needs after ':' (then it is one plain string),
// on the error line or the content line before it; where its key starts. Sequence items
// (`- host:7443`) are plain strings on purpose and are not taken for it.
std::optional<std::pair<Location, std::string>> missing_space_after_colon(const std::vector<std::string_view>& lines,
                                                                          Location at) {
  static const std::regex re(R"(^(\s*)([A-Za-z_][A-Za-z0-9_.-]*):([^\s/].*?)\s*$)");
  std::vector<int> candidates;
  if (at.line >= 1 && at.line < static_cast<int>(lines.size())) candidates.push_back(at.line);
  for (int l = std::min<int>(at.line, static_cast<int>(lines.size())) - 1; l >= 1; --l) {
    const std::string_view s = lines[static_cast<std::size_t>(l)];
    const auto first = s.find_first_not_of(" \t\r");
    if (first == std::string_view::npos || s[first] == '#') continue;
    candidates.push_back(l);
    break;
  }
  for (int l : candidates) {
    const std::string_view line = lines[static_cast<std::size_t>(l)];
    if (line.size() > 1000) continue;  // std::regex recurses per character
    const std::string s(line);
    std::smatch m;
    if (std::regex_match(s, m, re))
      return std::make_pair(Location{l, static_cast<int>(m.length(1)) + 1}, m.str(2) + ":" + m.str(3));
  }
  return std::nullopt;
}

// A YAML syntax error, placed where the construct at fault starts when yaml-cpp reports it
// later (an unclosed flow collection, `key:value` without a space).
Diagnostic syntax_error(const std::string& file, std::string_view text, const YAML::Exception& e) {
  Location l = location_of(e.mark);
  std::string message = "YAML syntax: " + e.msg;
  const auto lines = lines_of(text);
  // A '[' or '{' still open where the parser gave up is the likely cause, whatever it says.
  if (auto start = unclosed_flow(lines, l)) {
    message += " (the '" + std::string(1, lines[static_cast<std::size_t>(start->line)][start->column - 1]) +
               "' here is never closed; the parser gave up at " + std::to_string(l.line) + ":" +
               std::to_string(l.column) + ")";
    l = *start;
  } else if (auto hit = missing_space_after_colon(lines, l)) {
    message = "YAML syntax: '" + hit->second + "' is one plain string, not a key and a value: put a space after "
              "the ':' (the parser gave up at " + std::to_string(l.line) + ":" + std::to_string(l.column) + ": " +
              e.msg + ")";
    l = hit->first;
  }
  return {file, l.line, l.column, "", message};
}

}  // namespace

namespace {

// Where the documents of a YAML stream start, for at most two of them: the parser's events
// are ignored. YAML::LoadAll is not used: yaml-cpp 0.7 loops forever, allocating, on a
// stream that starts with a flow entry (",key: 1"; found by tests/fuzz/fuzz_spec.cpp), as
// it keeps returning a document without consuming anything.
class DocumentStarts final : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> starts;
  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// The marks of the first two documents; `stuck` is set when the parser stops advancing
// (where it is stuck).
std::vector<YAML::Mark> document_starts(const std::string& text, std::optional<YAML::Mark>& stuck) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts h;
  while (h.starts.size() < 2) {
    const std::size_t before = h.starts.size();
    if (!parser.HandleNextDocument(h) || h.starts.size() == before) break;
    // A "document" that begins where the one before it began consumed nothing: not one.
    if (h.starts.size() == 2 && h.starts[1].pos <= h.starts[0].pos) {
      stuck = h.starts[1];
      h.starts.pop_back();
      break;
    }
  }
  return h.starts;
}

}  // namespace

YamlDocument parse_yaml(std::string_view text, std::string_view file_name) {
  YamlDocument doc;
  std::string file(file_name);
  try {
    const std::string source(text);
    std::optional<YAML::Mark> stuck;
    const std::vector<YAML::Mark> starts = document_starts(source, stuck);
    if (stuck) {
      const Location l = location_of(*stuck);
      doc.errors.push_back({file, l.line, l.column, "",
                            "YAML syntax: the parser cannot read on from here (a stray ',' or flow "
                            "indicator outside [ ] or { }?)"});
      return doc;
    }
    if (starts.empty()) {
      doc.errors.push_back({file, 1, 1, "(root)", "the file is empty; a spec is a YAML mapping"});
      return doc;
    }
    if (starts.size() > 1) {
      Location l = document_start(lines_of(text), location_of(starts[1]));
      doc.errors.push_back({file, l.line, l.column, "(root)",
                            "more than one YAML document ('---'); put one spec per file"});
    }
    const YAML::Node first = YAML::Load(source);
    Converter c{doc, file};
    Path path;
    doc.root = c.convert(first, path);
  } catch (const YAML::Exception& e) {
    doc.errors.push_back(syntax_error(file, text, e));
  }
  return doc;
}

namespace {
Location locate(const YamlDocument& doc, Path path, bool at_key) {
  if (at_key) {
    auto it = doc.key_locations.find(format_path(path));
    if (it != doc.key_locations.end()) return it->second;
  }
  for (;;) {
    auto it = doc.value_locations.find(format_path(path));
    if (it != doc.value_locations.end()) return it->second;
    if (path.empty()) return {1, 1};
    path.pop_back();
  }
}
}  // namespace

std::vector<Diagnostic> validate_yaml(const YamlDocument& doc, std::string_view schema_name,
                                      std::string_view file_name) {
  std::vector<Diagnostic> out = doc.errors;
  bool syntax_failed = std::any_of(out.begin(), out.end(), [](const Diagnostic& d) { return d.path.empty(); });
  if (syntax_failed) return out;
  const schema::Schema* s = schema::builtin(schema_name);
  if (!s) {
    out.push_back({std::string(file_name), 0, 0, "", "internal error: no built-in schema " + std::string(schema_name)});
    return out;
  }
  if (doc.root.is_null()) {
    if (out.empty()) out.push_back({std::string(file_name), 1, 1, "(root)", "the document is empty; expected a mapping"});
    return out;
  }
  for (const auto& issue : s->validate(doc.root)) {
    Location l = locate(doc, issue.path, issue.at_key);
    out.push_back({std::string(file_name), l.line, l.column, format_path(issue.path), issue.message});
  }
  return out;
}

}  // namespace diaspora
