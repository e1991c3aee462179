#include "event_text.hpp"

#include <cstddef>
#include <cstring>

#include <boost/json.hpp>

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

// ---- publish frames ------------------------------------------------------------------------

namespace diaspora::relay {

namespace json = boost::json;

std::optional<std::pair<std::uint64_t, std::string>> publish_head(const json::object& o, PublishRefusal& refusal) {
  const json::value* seqv = o.if_contains("seq");
  if (!seqv || !(seqv->is_uint64() || (seqv->is_int64() && seqv->get_int64() >= 0))) {
    refusal = {"bad_request", "'seq' must be a non-negative integer", std::nullopt};
    return std::nullopt;
  }
  const json::value* tv = o.if_contains("topic");
  if (!tv || !tv->is_string() || !valid_topic_name(tv->get_string())) {
    refusal = {"bad_topic", "'topic' must be 1-200 characters of A-Z a-z 0-9 . _ - (not starting with '.')",
               std::nullopt};
    return std::nullopt;
  }
  return std::pair<std::uint64_t, std::string>{seqv->to_number<std::uint64_t>(), std::string(tv->get_string())};
}

std::optional<PublishRefusal> event_record(const json::value& ev, std::string_view text, std::size_t max_event_bytes,
                                           const CodecOptions& codec, AppendRecord& rec) {
  if (text.size() > max_event_bytes)
    return PublishRefusal{"event_too_large",
                          "event of " + std::to_string(text.size()) + " bytes exceeds the limit of " +
                              std::to_string(max_event_bytes),
                          std::nullopt};
  try {
    EventRef e = check_event_json(ev, codec);
    rec.dedupe_key.clear();
    rec.dedupe_key.reserve(e.source.size() + 1 + e.id.size());
    rec.dedupe_key.append(e.source).append(1, '\x1f').append(e.id);
  } catch (const EventError& err) {
    return PublishRefusal{"invalid_event", std::string(to_string(err.code())) + ": " + err.what(), std::nullopt};
  }
  rec.payload.assign(text);
  return std::nullopt;
}

std::optional<PublishRefusal> publish_records(const json::object& o, std::string_view frame_text,
                                              const PublishLimits& limits, const CodecOptions& codec,
                                              std::vector<AppendRecord>& records, std::uint64_t& bytes) {
  const json::value* evs = o.if_contains("events");
  if (!evs || !evs->is_array() || evs->get_array().empty())
    return PublishRefusal{"bad_request", "'events' must be a non-empty array of CloudEvents", std::nullopt};
  const json::array& arr = evs->get_array();
  if (arr.size() > limits.max_batch_events)
    return PublishRefusal{"batch_too_large",
                          "batch of " + std::to_string(arr.size()) + " events exceeds the limit of " +
                              std::to_string(limits.max_batch_events),
                          std::nullopt};
  records.assign(arr.size(), AppendRecord{});
  bytes = 0;
  auto texts = event_texts(frame_text);
  if (texts && texts->size() != arr.size()) texts.reset();
  for (std::size_t i = 0; i < arr.size(); ++i) {
    auto err = texts ? event_record(arr[i], (*texts)[i], limits.max_event_bytes, codec, records[i])
                     : event_record(arr[i], json::serialize(arr[i]), limits.max_event_bytes, codec, records[i]);
    if (err) {
      err->index = i;
      return err;
    }
    bytes += records[i].payload.size();
  }
  return std::nullopt;
}

}  // namespace diaspora::relay
