#include "diaspora/event.hpp"

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <random>

#include "diaspora/json_exact.hpp"
#include "diaspora/json_schema.hpp"
#include "diaspora/payloads.hpp"
#include "internal.hpp"

namespace diaspora {

namespace json = boost::json;

std::string_view to_string(EventErrc code) noexcept {
  switch (code) {
    case EventErrc::malformed_json: return "malformed_json";
    case EventErrc::too_large: return "too_large";
    case EventErrc::missing_attribute: return "missing_attribute";
    case EventErrc::invalid_attribute: return "invalid_attribute";
    case EventErrc::invalid_data: return "invalid_data";
    case EventErrc::unknown_type: return "unknown_type";
  }
  return "unknown";
}

// ---- RFC 3339 ----------------------------------------------------------------------

namespace {

bool digits(std::string_view s, std::size_t pos, std::size_t n, int& out) {
  if (pos + n > s.size()) return false;
  out = 0;
  for (std::size_t i = pos; i < pos + n; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    out = out * 10 + (s[i] - '0');
  }
  return true;
}

// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
long long days_from_civil(int y, unsigned m, unsigned d) {
  y -= m <= 2;
  const long long era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<long long>(doe) - 719468;
}

bool leap(int y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

}  // namespace

std::optional<std::chrono::system_clock::time_point> parse_rfc3339(std::string_view s) {
  int Y, M, D, h, m, sec;
  if (!digits(s, 0, 4, Y) || s.size() < 20 || s[4] != '-' || !digits(s, 5, 2, M) || s[7] != '-' ||
      !digits(s, 8, 2, D) || (s[10] != 'T' && s[10] != 't') || !digits(s, 11, 2, h) || s[13] != ':' ||
      !digits(s, 14, 2, m) || s[16] != ':' || !digits(s, 17, 2, sec))
    return std::nullopt;
  static constexpr std::array<int, 12> mdays = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (M < 1 || M > 12 || D < 1 || D > mdays[M - 1] + (M == 2 && leap(Y) ? 1 : 0) || h > 23 || m > 59 || sec > 60)
    return std::nullopt;
  std::size_t pos = 19;
  long long nanos = 0;
  if (pos < s.size() && s[pos] == '.') {
    ++pos;
    std::size_t start = pos;
    while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') {
      if (pos - start < 9) nanos = nanos * 10 + (s[pos] - '0');
      ++pos;
    }
    std::size_t n = pos - start;
    if (n == 0 || n > 9) return std::nullopt;
    for (std::size_t i = n; i < 9; ++i) nanos *= 10;
  }
  if (pos >= s.size()) return std::nullopt;
  long long offset_s = 0;
  if (s[pos] == 'Z' || s[pos] == 'z') {
    ++pos;
  } else if (s[pos] == '+' || s[pos] == '-') {
    int oh, om;
    if (!digits(s, pos + 1, 2, oh) || pos + 3 >= s.size() || s[pos + 3] != ':' || !digits(s, pos + 4, 2, om) ||
        oh > 23 || om > 59)
      return std::nullopt;
    offset_s = (oh * 3600LL + om * 60LL) * (s[pos] == '-' ? -1 : 1);
    pos += 6;
  } else {
    return std::nullopt;
  }
  if (pos != s.size()) return std::nullopt;
  // A leap second (:60) is folded onto the next second, as POSIX time does.
  long long secs = days_from_civil(Y, static_cast<unsigned>(M), static_cast<unsigned>(D)) * 86400LL + h * 3600LL +
                   m * 60LL + sec - offset_s;
  // The clock counts nanoseconds in 64 bits: years 1678 to 2261 (a year such as 5612 would
  // overflow it; found by tests/fuzz/fuzz_event.cpp under UBSan).
  constexpr long long kClockSeconds = std::numeric_limits<std::int64_t>::max() / 1'000'000'000 - 1;
  if (secs > kClockSeconds || secs < -kClockSeconds) return std::nullopt;
  auto d = std::chrono::seconds(secs) + std::chrono::nanoseconds(nanos);
  return std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(d));
}

std::int64_t now_us() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

std::string format_rfc3339(std::chrono::system_clock::time_point t) {
  using namespace std::chrono;
  return format_rfc3339_us(duration_cast<microseconds>(t.time_since_epoch()).count());
}

std::optional<std::int64_t> parse_rfc3339_us(std::string_view text) {
  using namespace std::chrono;
  const auto t = parse_rfc3339(text);
  if (!t) return std::nullopt;
  return duration_cast<microseconds>(t->time_since_epoch()).count();
}

std::string format_rfc3339_us(std::int64_t us) {
  long long secs = us / 1000000;
  long long frac = us % 1000000;
  if (frac < 0) {
    frac += 1000000;
    --secs;
  }
  std::time_t tt = static_cast<std::time_t>(secs);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, frac);
  return buf;
}

void Event::set_time(std::chrono::system_clock::time_point t) { time = format_rfc3339(t); }

std::optional<std::chrono::system_clock::time_point> Event::time_point() const {
  if (!time) return std::nullopt;
  auto tp = parse_rfc3339(*time);
  if (!tp) throw EventError(EventErrc::invalid_attribute, "time: '" + *time + "' is not an RFC 3339 timestamp");
  return tp;
}

// ---- base64 --------------------------------------------------------------------------

namespace {
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
int b64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}
}  // namespace

std::string base64_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    unsigned v = (static_cast<unsigned char>(in[i]) << 16) | (static_cast<unsigned char>(in[i + 1]) << 8) |
                 static_cast<unsigned char>(in[i + 2]);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i < in.size()) {
    unsigned v = static_cast<unsigned char>(in[i]) << 16;
    if (i + 1 < in.size()) v |= static_cast<unsigned char>(in[i + 1]) << 8;
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += i + 1 < in.size() ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

namespace {
// Decodes standard padded base64, handing each byte to `sink`; false when malformed.
template <class Sink>
bool decode_base64(std::string_view in, Sink&& sink) {
  if (in.size() % 4 != 0) return false;
  for (std::size_t i = 0; i < in.size(); i += 4) {
    int a = b64_value(in[i]), b = b64_value(in[i + 1]);
    bool last = i + 4 == in.size();
    bool pad2 = last && in[i + 2] == '=' && in[i + 3] == '=';
    bool pad1 = last && !pad2 && in[i + 3] == '=';
    int c = pad2 ? 0 : b64_value(in[i + 2]);
    int d = (pad1 || pad2) ? 0 : b64_value(in[i + 3]);
    if (a < 0 || b < 0 || c < 0 || d < 0) return false;
    unsigned v = (a << 18) | (b << 12) | (c << 6) | d;
    sink(static_cast<char>((v >> 16) & 0xFF));
    if (!pad2) sink(static_cast<char>((v >> 8) & 0xFF));
    if (!pad1 && !pad2) sink(static_cast<char>(v & 0xFF));
  }
  return true;
}
}  // namespace

bool base64_valid(std::string_view in) noexcept {
  return decode_base64(in, [](char) {});
}

std::optional<std::string> base64_decode(std::string_view in) {
  std::string out;
  out.reserve(in.size() / 4 * 3);
  if (!decode_base64(in, [&out](char c) { out += c; })) return std::nullopt;
  return out;
}


std::string make_uuid() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uint64_t hi = rng(), lo = rng();
  hi = (hi & 0xFFFFFFFFFFFF0FFFULL) | 0x0000000000004000ULL;  // version 4
  lo = (lo & 0x3FFFFFFFFFFFFFFFULL) | 0x8000000000000000ULL;  // variant 10
  char buf[37];
  std::snprintf(buf, sizeof buf, "%08x-%04x-%04x-%04x-%012llx", static_cast<unsigned>(hi >> 32),
                static_cast<unsigned>((hi >> 16) & 0xFFFF), static_cast<unsigned>(hi & 0xFFFF),
                static_cast<unsigned>(lo >> 48), static_cast<unsigned long long>(lo & 0xFFFFFFFFFFFFULL));
  return buf;
}

// ---- codec ---------------------------------------------------------------------------

namespace detail {
void check_payload_data(std::string_view type, const json::value& data) {
  // A stream mostly repeats a few types: remember the last one's schema per thread.
  thread_local std::string last_type;
  thread_local const schema::Schema* last_schema = nullptr;
  if (!last_schema || type != last_type) {
    last_schema = schema::builtin("events/" + std::string(type) + ".schema.json");
    last_type.assign(type);
  }
  const schema::Schema* s = last_schema;
  if (!s) throw EventError(EventErrc::unknown_type, "type: no schema for '" + std::string(type) + "'");
  auto issues = s->validate(data);
  if (issues.empty()) return;
  std::string msg;
  for (const auto& issue : issues) {
    if (!msg.empty()) msg += "; ";
    msg += (issue.path.empty() ? std::string("data") : "data." + schema::format_path(issue.path)) + ": " + issue.message;
  }
  throw EventError(EventErrc::invalid_data, msg);
}
}  // namespace detail

namespace {

bool valid_extension_name(std::string_view name) {
  if (name.empty() || name.size() > 20) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return false;
  return true;
}

[[noreturn]] void fail(EventErrc code, const std::string& message) { throw EventError(code, message); }

constexpr std::array<std::string_view, 10> kContextAttributes = {
    "id", "source", "specversion", "type", "subject", "time", "datacontenttype", "dataschema", "data", "data_base64"};

// The JSON form of an event, unchecked (the one validator below checks it).
json::object to_object(const Event& e) {
  json::object o;
  o["specversion"] = e.specversion;
  o["id"] = e.id;
  o["source"] = e.source;
  o["type"] = e.type;
  if (e.subject) o["subject"] = *e.subject;
  if (e.time) o["time"] = *e.time;
  if (e.datacontenttype) o["datacontenttype"] = *e.datacontenttype;
  if (e.dataschema) o["dataschema"] = *e.dataschema;
  for (const auto& [name, value] : e.extensions) {
    if (std::find(kContextAttributes.begin(), kContextAttributes.end(), name) != kContextAttributes.end())
      fail(EventErrc::invalid_attribute, "extension '" + name + "' shadows a context attribute");
    o[name] = value;
  }
  if (e.data) o["data"] = *e.data;
  if (e.data_binary) o["data_base64"] = base64_encode(*e.data_binary);
  return o;
}

}  // namespace

// The single implementation of the CloudEvents rules (and the Diaspora payload rules):
// decode, encode and the relay all go through it. Works on the parsed JSON in place.
namespace {

// Whether every number in `v` is finite. The parser reads a number beyond the range of a
// double (1e999) as infinity, which no JSON text can carry back: an event holding one would
// not survive an encode/decode round trip. Recursive, without allocating (every event the
// relay takes goes through here); the parser bounds the depth (32 levels).
bool all_numbers_finite(const json::value& v) {
  switch (v.kind()) {
    case json::kind::double_: return std::isfinite(v.get_double());
    case json::kind::object:
      for (const auto& kv : v.get_object())
        if (!all_numbers_finite(kv.value())) return false;
      return true;
    case json::kind::array:
      for (const auto& e : v.get_array())
        if (!all_numbers_finite(e)) return false;
      return true;
    default: return true;
  }
}

}  // namespace

EventRef check_event_json(const json::value& v, const CodecOptions& options) {
  if (!v.is_object()) fail(EventErrc::malformed_json, "an event must be a JSON object");
  const json::object& o = v.get_object();
  EventRef ref;
  std::string_view specversion, datacontenttype;
  bool has_datacontenttype = false;
  const json::value* data = nullptr;
  bool has_binary = false;
  auto str = [](std::string_view key, const json::value& val, std::size_t max_len) -> std::string_view {
    if (!val.is_string()) fail(EventErrc::invalid_attribute, std::string(key) + ": expected string");
    std::string_view s = val.get_string();
    if (s.empty()) {
      bool required = key == "id" || key == "source" || key == "type";
      fail(required ? EventErrc::missing_attribute : EventErrc::invalid_attribute,
           std::string(key) + (required ? ": required attribute is missing or empty" : ": must not be empty"));
    }
    if (s.size() > max_len)
      fail(EventErrc::invalid_attribute, std::string(key) + ": longer than " + std::to_string(max_len) + " bytes");
    return s;
  };
  bool has_id = false, has_source = false, has_type = false, has_specversion = false;
  for (const auto& kv : o) {
    std::string_view key = kv.key();
    const json::value& val = kv.value();
    if (key == "id") {
      ref.id = str(key, val, 256);
      has_id = true;
    } else if (key == "source") {
      ref.source = str(key, val, 1024);
      has_source = true;
    } else if (key == "type") {
      ref.type = str(key, val, 256);
      has_type = true;
    } else if (key == "specversion") {
      if (!val.is_string()) fail(EventErrc::invalid_attribute, "specversion: expected string");
      specversion = val.get_string();
      has_specversion = true;
    } else if (key == "subject") str(key, val, 1024);
    else if (key == "datacontenttype") {
      datacontenttype = str(key, val, 256);
      has_datacontenttype = true;
    } else if (key == "dataschema") str(key, val, 4096);
    else if (key == "time") {
      std::string_view t = str(key, val, 64);
      if (!parse_rfc3339(t))
        fail(EventErrc::invalid_attribute,
             "time: must be an RFC 3339 timestamp such as 2026-11-30T07:15:38.123Z (years 1678 to 2261), got '" + std::string(t) + "'");
    } else if (key == "data") data = &val;
    else if (key == "data_base64") {
      if (!val.is_string() || !base64_valid(val.get_string()))
        fail(EventErrc::invalid_attribute, "data_base64: must be standard base64 (RFC 4648, with padding)");
      has_binary = true;
    } else {
      if (!valid_extension_name(key))
        fail(EventErrc::invalid_attribute, "key '" + std::string(key) +
                                               "' is not a valid CloudEvents attribute name: lower-case letters "
                                               "and digits, at most 20");
      bool integral_double =
          val.is_double() && std::isfinite(val.get_double()) && std::floor(val.get_double()) == val.get_double();
      if (!(val.is_string() || val.is_int64() || val.is_uint64() || val.is_bool() || integral_double))
        fail(EventErrc::invalid_attribute,
             std::string(key) + ": extension attributes must be a string, an integer or a boolean");
    }
  }
  const std::pair<bool, const char*> required[] = {
      {has_id, "id"}, {has_source, "source"}, {has_specversion, "specversion"}, {has_type, "type"}};
  for (const auto& [present, name] : required)
    if (!present) fail(EventErrc::missing_attribute, std::string(name) + ": required attribute is missing");
  if (specversion != "1.0")
    fail(EventErrc::invalid_attribute, "specversion: must be \"1.0\", got \"" + std::string(specversion) + "\"");
  if (data && has_binary) fail(EventErrc::invalid_attribute, "'data' and 'data_base64' cannot be used together");
  if (data && !all_numbers_finite(*data))
    fail(EventErrc::invalid_data, "data: holds a number out of the range of a double (such as 1e999): JSON cannot "
                                  "carry it back (found by tests/fuzz/fuzz_event.cpp)");
  if (options.validate_payloads && ref.type.starts_with("org.diaspora.")) {
    if (!events::is_known_type(ref.type))
      fail(EventErrc::unknown_type,
           "type: '" + std::string(ref.type) + "' is not a Diaspora event type (see schemas/events/)");
    if (has_binary) fail(EventErrc::invalid_data, "data_base64: " + std::string(ref.type) + " carries JSON data, not binary");
    if (!data) fail(EventErrc::invalid_data, "data: missing; " + std::string(ref.type) + " requires a data object");
    if (has_datacontenttype && datacontenttype != "application/json")
      fail(EventErrc::invalid_attribute, "datacontenttype: " + std::string(ref.type) +
                                             " requires 'application/json', got '" + std::string(datacontenttype) + "'");
    detail::check_payload_data(ref.type, *data);
  }
  return ref;
}

void validate_event(const Event& e, const CodecOptions& options) { check_event_json(to_object(e), options); }

Event event_from_json(const json::value& v, const CodecOptions& options) {
  check_event_json(v, options);
  Event e;
  for (const auto& kv : v.get_object()) {
    std::string_view key = kv.key();
    const json::value& val = kv.value();
    auto text = [&] { return std::string(val.get_string()); };
    if (key == "id") e.id = text();
    else if (key == "source") e.source = text();
    else if (key == "specversion") e.specversion = text();
    else if (key == "type") e.type = text();
    else if (key == "subject") e.subject = text();
    else if (key == "time") e.time = text();
    else if (key == "datacontenttype") e.datacontenttype = text();
    else if (key == "dataschema") e.dataschema = text();
    else if (key == "data") e.data = val;
    else if (key == "data_base64") e.data_binary = base64_decode(val.get_string());
    else e.extensions.emplace(std::string(key), val);
  }
  return e;
}

Event decode_event(std::string_view text, const CodecOptions& options) {
  if (text.size() > options.max_event_bytes)
    fail(EventErrc::too_large, "event of " + std::to_string(text.size()) + " bytes exceeds the limit of " +
                                   std::to_string(options.max_event_bytes) + " bytes");
  // Numbers read exactly (diaspora/json_exact.hpp): Boost's parser may be one unit in the
  // last place off, so that a decoded event encoded and decoded again would differ from
  // itself (found by tests/fuzz/fuzz_event.cpp).
  boost::system::error_code ec;
  json::value v = parse_json_exact(text, ec);
  if (ec) fail(EventErrc::malformed_json, "not valid JSON: " + ec.message());
  return event_from_json(v, options);
}

json::object event_to_json(const Event& e) {
  json::object o = to_object(e);
  check_event_json(o, CodecOptions{.max_event_bytes = SIZE_MAX, .validate_payloads = false});
  return o;
}

std::string encode_event(const Event& e, const CodecOptions& options) {
  json::object o = to_object(e);
  check_event_json(o, options);
  std::string out = json::serialize(o);
  if (out.size() > options.max_event_bytes)
    fail(EventErrc::too_large, "encoded event of " + std::to_string(out.size()) + " bytes exceeds the limit of " +
                                   std::to_string(options.max_event_bytes) + " bytes");
  return out;
}

}  // namespace diaspora
