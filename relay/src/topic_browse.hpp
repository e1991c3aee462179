// Browsing a topic from a point (GET /api/v1/topics/{topic}/events, docs/protocol.md): a
// scan of the stored events forward or backward from an offset, an append time or an end,
// with filters applied by the relay over the whole topic (not over what a page loaded),
// bounded in matches and in records scanned, and the range scanned reported so that a
// client can say what it looked at and page on. Exports as JSON lines or CSV.
//
// Internal to the relay. Thread safety: pure functions of their arguments; browse() reads
// the store, which is safe from any thread (the relay runs it on its query thread).
#pragma once

#include <boost/json/object.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "store.hpp"

namespace diaspora::relay {

/// A query parameter that cannot be used; the message names it and says what it takes.
struct BrowseError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Which stored events match. Empty fields match anything. `id` is compared exactly; `type`,
/// `source` and `subject` are substrings of those attributes and `text` a substring of any
/// string, number or key anywhere in the event (its data included), all without regard
/// to ASCII case.
struct EventFilter {
  std::string id, type, source, subject, text;
  bool any() const { return !id.empty() || !type.empty() || !source.empty() || !subject.empty() || !text.empty(); }
  /// Whether `event` (a parsed CloudEvent) matches.
  bool matches(const boost::json::object& event) const;
};

enum class BrowseFormat { json, jsonl, csv };

/// What to scan.
struct BrowseRequest {
  enum class Start { offset, time, earliest, latest } start = Start::latest;
  std::uint64_t offset = 0;  ///< Start::offset: the first offset looked at (the last, backward)
  std::int64_t time_us = 0;  ///< Start::time: the first record appended at or after it
  bool backward = false;     ///< newest first, from the start point down
  std::size_t limit = 100;   ///< matches returned at most (1..10,000)
  std::size_t max_scan = 100000;  ///< records looked at at most (1..1,000,000)
  EventFilter filter;
  BrowseFormat format = BrowseFormat::json;
};

/// Parses the query parameters: from (an offset, "earliest" or "latest"), from_time
/// (RFC 3339), direction (forward | backward; default forward, backward from "latest"),
/// limit, max_scan, id, type, source, subject, q, format (json | jsonl | csv). Throws
/// BrowseError naming the parameter that cannot be used, or an unknown one.
BrowseRequest parse_browse(const std::map<std::string, std::string>& query);

/// The events found and what was scanned to find them.
struct BrowseResult {
  struct Item {
    std::uint64_t offset = 0;
    std::int64_t appended_us = 0;  ///< when the relay appended it
    boost::json::object event;
  };
  std::vector<Item> events;  ///< in the order scanned (descending offsets when backward)
  std::uint64_t first_offset = 0, end_offset = 0;  ///< the topic's retained range [first, end)
  std::uint64_t records = 0;                        ///< records looked at
  std::optional<std::uint64_t> scanned_low, scanned_high;  ///< lowest and highest offset looked at
  /// Where the next page in the same direction starts: forward, the offset after the last
  /// looked at (at the end: the end, to poll for more); backward, the one before the
  /// lowest looked at (none once the scan reached the topic's first offset).
  std::optional<std::uint64_t> next;
  bool reached_end = false;       ///< the scan got to the topic's end (its first offset, backward)
  bool limited_by_scan = false;   ///< stopped by max_scan before `limit` matches and before the end
};

/// Scans `topic` as asked. An unknown topic has nothing to scan (empty result).
BrowseResult browse(const Store& store, const std::string& topic, const BrowseRequest& request);

/// The result as the reply body: a JSON object (format json), one compact CloudEvent per
/// line (jsonl), or CSV with a header row (offset, appended, time, id, source, type,
/// subject, data; RFC 4180 quoting).
std::string render_browse(const std::string& topic, const BrowseRequest& request, const BrowseResult& result);

}  // namespace diaspora::relay
