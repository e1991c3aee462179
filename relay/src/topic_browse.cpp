#include "topic_browse.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>

#include "diaspora/data_item.hpp"
#include "diaspora/event.hpp"
#include "diaspora/utf8.hpp"

namespace diaspora::relay {

namespace json = boost::json;

namespace {

constexpr std::size_t kChunk = 512;               // records read from the log at a time
constexpr std::size_t kChunkBytes = 8u << 20;     // and their payload bytes at most

bool contains_ci(std::string_view hay, std::string_view needle) {
  if (needle.empty()) return true;
  auto eq = [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
  };
  return std::search(hay.begin(), hay.end(), needle.begin(), needle.end(), eq) != hay.end();
}

bool any_text_contains(const json::value& v, std::string_view needle) {
  switch (v.kind()) {
    case json::kind::string: return contains_ci(v.get_string(), needle);
    case json::kind::object:
      for (const auto& [k, x] : v.get_object())
        if (contains_ci(k, needle) || any_text_contains(x, needle)) return true;
      return false;
    case json::kind::array:
      for (const auto& x : v.get_array())
        if (any_text_contains(x, needle)) return true;
      return false;
    case json::kind::null: return false;
    default: return contains_ci(json::serialize(v), needle);  // numbers and booleans as written
  }
}

std::string_view attr(const json::object& e, const char* name) {
  const json::value* v = e.if_contains(name);
  return v && v->is_string() ? std::string_view(v->get_string()) : std::string_view();
}

std::uint64_t whole(const std::string& key, const std::string& v, std::uint64_t lo, std::uint64_t hi) {
  std::uint64_t n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || end != v.data() + v.size() || n < lo || n > hi)
    throw BrowseError("'" + key + "' must be a whole number from " + std::to_string(lo) + " to " + std::to_string(hi) +
                      ", not '" + v + "'");
  return n;
}

std::string csv_field(std::string_view s) {
  if (s.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(s);
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

}  // namespace

bool EventFilter::matches(const json::object& e) const {
  if (!id.empty() && attr(e, "id") != id) return false;
  if (!contains_ci(attr(e, "type"), type) || !contains_ci(attr(e, "source"), source) ||
      !contains_ci(attr(e, "subject"), subject))
    return false;
  return text.empty() || any_text_contains(e, text);
}

BrowseRequest parse_browse(const std::map<std::string, std::string>& q) {
  BrowseRequest r;
  bool direction_given = false;
  for (const auto& [k, v] : q) {
    if (k == "from") {
      if (v == "earliest") r.start = BrowseRequest::Start::earliest;
      else if (v == "latest") r.start = BrowseRequest::Start::latest;
      else {
        r.start = BrowseRequest::Start::offset;
        r.offset = whole("from", v, 0, UINT64_MAX - 1);
      }
    } else if (k == "from_time") {
      auto t = parse_rfc3339_us(v);
      if (!t) throw BrowseError("'from_time' must be an RFC 3339 time (2026-12-06T10:00:00Z), not '" + v + "'");
      r.start = BrowseRequest::Start::time;
      r.time_us = *t;
    } else if (k == "direction") {
      if (v != "forward" && v != "backward") throw BrowseError("'direction' must be forward or backward, not '" + v + "'");
      r.backward = v == "backward";
      direction_given = true;
    } else if (k == "limit") {
      r.limit = whole("limit", v, 1, 10000);
    } else if (k == "max_scan") {
      r.max_scan = whole("max_scan", v, 1, 1000000);
    } else if (k == "id") {
      r.filter.id = v;
    } else if (k == "type") {
      r.filter.type = v;
    } else if (k == "source") {
      r.filter.source = v;
    } else if (k == "subject") {
      r.filter.subject = v;
    } else if (k == "q") {
      r.filter.text = v;
    } else if (k == "format") {
      if (v == "json") r.format = BrowseFormat::json;
      else if (v == "jsonl") r.format = BrowseFormat::jsonl;
      else if (v == "csv") r.format = BrowseFormat::csv;
      else throw BrowseError("'format' must be json, jsonl or csv, not '" + v + "'");
    } else {
      throw BrowseError("unknown parameter '" + k +
                        "' (known: from, from_time, direction, limit, max_scan, id, type, source, subject, q, format)");
    }
  }
  if (q.count("from") && q.count("from_time")) throw BrowseError("give 'from' or 'from_time', not both");
  // Without a start, the newest first; from a point, forward unless asked otherwise.
  if (!direction_given) r.backward = r.start == BrowseRequest::Start::latest;
  return r;
}

BrowseResult browse(const Store& store, const std::string& topic, const BrowseRequest& rq) {
  BrowseResult out;
  out.first_offset = store.first_offset(topic);
  out.end_offset = store.committed_offset(topic);
  const std::uint64_t first = out.first_offset, end = out.end_offset;
  auto consider = [&](std::uint64_t offset, std::int64_t appended_us, std::string_view payload) {
    ++out.records;
    out.scanned_low = std::min(out.scanned_low.value_or(offset), offset);
    out.scanned_high = std::max(out.scanned_high.value_or(offset), offset);
    if (data::is_chunk_record(payload)) return;  // a data item's chunk (docs/streaming.md): not an event
    boost::system::error_code ec;
    json::value v = json::parse(payload, ec);
    if (ec || !v.is_object()) return;  // the log holds validated events only; a damaged one is passed over
    if (rq.filter.matches(v.get_object())) out.events.push_back({offset, appended_us, std::move(v.get_object())});
  };
  auto more = [&] { return out.events.size() < rq.limit && out.records < rq.max_scan; };

  if (!rq.backward) {
    std::uint64_t cur = first;
    switch (rq.start) {
      case BrowseRequest::Start::offset: cur = std::max(rq.offset, first); break;
      case BrowseRequest::Start::time: cur = std::max(store.offset_at_time(topic, rq.time_us), first); break;
      case BrowseRequest::Start::earliest: cur = first; break;
      case BrowseRequest::Start::latest: cur = end; break;
    }
    while (cur < end && more()) {
      const std::size_t want = std::min<std::uint64_t>({kChunk, rq.max_scan - out.records, end - cur});
      std::uint64_t last = cur;
      const std::size_t seen = store.visit(topic, cur, want, kChunkBytes, [&](const Store::RecordRef& r) {
        if (r.offset >= end || !more()) return;
        consider(r.offset, r.time_us, r.payload);
        last = r.offset;
      });
      if (seen == 0) break;
      cur = last + 1;
    }
    out.next = std::max(cur, first);
    out.reached_end = cur >= end;
  } else {
    std::uint64_t hi = 0;  // exclusive: the scan looks at hi - 1 first
    switch (rq.start) {
      case BrowseRequest::Start::offset: hi = rq.offset >= end ? end : rq.offset + 1; break;
      case BrowseRequest::Start::time: hi = store.offset_at_time(topic, rq.time_us + 1); break;  // appended at or before it
      case BrowseRequest::Start::earliest: hi = std::min(first + 1, end); break;
      case BrowseRequest::Start::latest: hi = end; break;
    }
    std::vector<std::pair<Store::RecordRef, std::string>> chunk;
    while (hi > first && more()) {
      std::uint64_t lo = hi - std::min<std::uint64_t>({kChunk, rq.max_scan - out.records, hi - first});
      for (;;) {
        chunk.clear();
        store.visit(topic, lo, hi - lo, kChunkBytes, [&](const Store::RecordRef& r) {
          if (r.offset < hi) chunk.push_back({r, std::string(r.payload)});
        });
        // The byte bound (or offsets lost at the top) stopped the read short of hi: the
        // newer part comes first, so read from where it stopped.
        if (chunk.empty() || chunk.back().first.offset + 1 >= hi) break;
        lo = chunk.back().first.offset + 1;
      }
      std::uint64_t low = lo;  // the scan goes on below this
      for (auto it = chunk.rbegin(); it != chunk.rend(); ++it) {
        if (!more()) {
          low = it->first.offset + 1;
          break;
        }
        consider(it->first.offset, it->first.time_us, it->second);
      }
      hi = low;
    }
    out.reached_end = hi <= first;
    if (!out.reached_end) out.next = hi - 1;
  }
  out.limited_by_scan = out.records >= rq.max_scan && out.events.size() < rq.limit && !out.reached_end;
  return out;
}

std::string render_browse(const std::string& topic, const BrowseRequest& rq, const BrowseResult& r) {
  if (rq.format == BrowseFormat::jsonl) {
    std::string out;
    for (const auto& e : r.events) out += json::serialize(e.event) + "\n";
    return out;
  }
  if (rq.format == BrowseFormat::csv) {
    std::string out = "offset,appended,time,id,source,type,subject,data\n";
    for (const auto& e : r.events) {
      const json::value* data = e.event.if_contains("data");
      const json::value* b64 = e.event.if_contains("data_base64");
      const std::string payload = data ? (data->is_string() ? std::string(data->get_string()) : json::serialize(*data))
                                       : b64 && b64->is_string() ? std::string(b64->get_string()) : std::string();
      out += std::to_string(e.offset) + "," + format_rfc3339_us(e.appended_us) + "," + csv_field(attr(e.event, "time")) +
             "," + csv_field(attr(e.event, "id")) + "," + csv_field(attr(e.event, "source")) + "," +
             csv_field(attr(e.event, "type")) + "," + csv_field(attr(e.event, "subject")) + "," + csv_field(payload) + "\n";
    }
    return out;
  }
  json::array events;
  for (const auto& e : r.events)
    events.push_back(json::object{{"offset", e.offset}, {"appended", format_rfc3339_us(e.appended_us)}, {"event", e.event}});
  json::object scanned{{"records", r.records}};
  scanned["low"] = r.scanned_low ? json::value(*r.scanned_low) : json::value(nullptr);
  scanned["high"] = r.scanned_high ? json::value(*r.scanned_high) : json::value(nullptr);
  json::object filter;
  for (const auto& [k, v] : {std::pair<const char*, const std::string*>{"id", &rq.filter.id}, {"type", &rq.filter.type},
                             {"source", &rq.filter.source}, {"subject", &rq.filter.subject}, {"q", &rq.filter.text}})
    if (!v->empty()) filter[k] = *v;
  json::object o{{"topic", topic},
                 {"direction", rq.backward ? "backward" : "forward"},
                 {"first_offset", r.first_offset},
                 {"end_offset", r.end_offset},
                 {"events", std::move(events)},
                 {"scanned", std::move(scanned)},
                 {"reached_end", r.reached_end},
                 {"limited_by_scan", r.limited_by_scan},
                 {"limit", rq.limit},
                 {"max_scan", rq.max_scan},
                 {"filter", std::move(filter)}};
  o["next"] = r.next ? json::value(*r.next) : json::value(nullptr);
  return valid_utf8(json::serialize(o)) + "\n";  // the filter is echoed as asked: its bytes may not be UTF-8
}

}  // namespace diaspora::relay
