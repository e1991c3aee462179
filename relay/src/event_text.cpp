#include "event_text.hpp"

#include <cstddef>
#include <cstring>

namespace diaspora::relay {

// memchr to each quote; an odd run of backslashes before it means the quote is escaped.
std::size_t skip_json_string(std::string_view t, std::size_t p) noexcept {
  for (std::size_t q = p + 1;;) {
    const void* hit = std::memchr(t.data() + q, '"', t.size() - q);
    if (!hit) return t.size();  // not reached on valid JSON
    q = static_cast<std::size_t>(static_cast<const char*>(hit) - t.data());
    std::size_t b = q;
    while (t[b - 1] == '\\') --b;
    if ((q - b) % 2 == 0) return q + 1;
    ++q;
  }
}

namespace {

std::size_t skip_ws(std::string_view t, std::size_t p) noexcept {
  while (p < t.size() && (t[p] == ' ' || t[p] == '\t' || t[p] == '\n' || t[p] == '\r')) ++p;
  return p;
}

// Position just past the JSON value that starts at p.
std::size_t skip_value(std::string_view t, std::size_t p) noexcept {
  if (p >= t.size()) return t.size();
  if (t[p] == '"') return skip_json_string(t, p);
  if (t[p] == '{' || t[p] == '[') {
    int depth = 0;
    do {
      if (p >= t.size()) return t.size();  // not reached on valid JSON
      const char c = t[p];
      if (c == '"') {
        p = skip_json_string(t, p);
        continue;
      }
      if (c == '{' || c == '[') ++depth;
      else if (c == '}' || c == ']') --depth;
      ++p;
    } while (depth > 0);
    return p;
  }
  while (p < t.size() && t[p] != ',' && t[p] != '}' && t[p] != ']' && t[p] != ' ' && t[p] != '\t' && t[p] != '\n' &&
         t[p] != '\r')
    ++p;
  return p;
}

}  // namespace

std::optional<std::vector<std::string_view>> event_texts(std::string_view t) {
  std::size_t p = skip_ws(t, 0);
  if (p >= t.size() || t[p] != '{') return std::nullopt;
  ++p;
  std::vector<std::string_view> out;
  int found = 0;
  for (;;) {
    p = skip_ws(t, p);
    if (p >= t.size()) return std::nullopt;
    if (t[p] == '}') break;
    if (t[p] != '"') return std::nullopt;
    const std::size_t key_end = skip_json_string(t, p);
    if (key_end >= t.size()) return std::nullopt;
    const std::string_view key = t.substr(p + 1, key_end - p - 2);
    if (key.find('\\') != std::string_view::npos) return std::nullopt;  // escaped key: take the slow path
    p = skip_ws(t, skip_ws(t, key_end) + 1);  // past ':'
    if (p >= t.size()) return std::nullopt;
    if (key == "events") {
      if (++found > 1 || t[p] != '[') return std::nullopt;
      for (++p;;) {
        p = skip_ws(t, p);
        if (p >= t.size()) return std::nullopt;
        if (t[p] == ']') break;
        const std::size_t e = skip_value(t, p);
        out.push_back(t.substr(p, e - p));
        p = skip_ws(t, e);
        if (p < t.size() && t[p] == ',') ++p;
      }
      ++p;  // past ']'
    } else {
      p = skip_value(t, p);
    }
    p = skip_ws(t, p);
    if (p < t.size() && t[p] == ',') ++p;
  }
  if (found != 1) return std::nullopt;
  return out;
}

}  // namespace diaspora::relay
