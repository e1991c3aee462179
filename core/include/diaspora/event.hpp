// CloudEvents 1.0 events in the JSON format: the one event type every Diaspora component
// (plugin, relay, services, console) produces and consumes.
#pragma once

#include <boost/json/value.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "diaspora/error.hpp"

namespace diaspora {

/// Why an event was refused. Values are stable (they appear in protocol error frames);
/// new codes are only ever appended.
enum class EventErrc {
  malformed_json = 1,     ///< not JSON, or not a JSON object
  too_large = 2,          ///< encoded size above the configured limit
  missing_attribute = 3,  ///< a required attribute (id, source, specversion, type) is absent
  invalid_attribute = 4,  ///< an attribute has the wrong type or format
  invalid_data = 5,       ///< the data payload does not match its type's schema
  unknown_type = 6,       ///< an org.diaspora.* type that Diaspora does not define
};

/// Short stable name of a code, e.g. "invalid_attribute".
std::string_view to_string(EventErrc code) noexcept;

/// Thrown by decode_event / validate for a refused event. `what()` names the attribute
/// and the problem, e.g. "time: must be an RFC 3339 timestamp ...".
class EventError : public Error {
 public:
  EventError(EventErrc code, const std::string& message,
             std::source_location where = std::source_location::current())
      : Error(message, where), code_(code) {}
  EventErrc code() const noexcept { return code_; }

 private:
  EventErrc code_;
};

/// Codec settings.
struct CodecOptions {
  /// Largest accepted encoded event, in bytes (default 1 MiB).
  std::size_t max_event_bytes = std::size_t{1} << 20;
  /// Validate the data of org.diaspora.* types against schemas/events/<type>.schema.json.
  bool validate_payloads = true;
};

/// A CloudEvents 1.0 event.
///
/// Attributes are kept as given (notably `time` keeps its original RFC 3339 text), so a
/// decode/encode round trip reproduces every attribute, including extensions.
///
/// @par Thread Safety
/// A plain value type: distinct objects may be used from different threads; one object
/// needs external synchronisation if shared and modified.
struct Event {
  std::string id;                ///< unique per source; (source, id) is the dedupe key
  std::string source;            ///< URI-reference of the producer
  std::string specversion = "1.0";
  std::string type;              ///< e.g. "org.diaspora.task.started"
  std::optional<std::string> subject;          ///< task or resource id
  std::optional<std::string> time;             ///< RFC 3339 text
  std::optional<std::string> datacontenttype;  ///< e.g. "application/json"
  std::optional<std::string> dataschema;
  /// Structured data (`data` member). Mutually exclusive with data_binary.
  std::optional<boost::json::value> data;
  /// Binary data, carried as `data_base64` on the wire. Mutually exclusive with data.
  std::optional<std::string> data_binary;
  /// Extension attributes: name -> string, integer or boolean.
  std::map<std::string, boost::json::value> extensions;

  /// Sets `time` from a time point (UTC, microsecond precision).
  void set_time(std::chrono::system_clock::time_point t);
  /// Parses `time`; nullopt when absent. Throws EventError when not RFC 3339.
  std::optional<std::chrono::system_clock::time_point> time_point() const;

  friend bool operator==(const Event&, const Event&) = default;
};

/// What check_event_json found: views into the checked JSON value (valid while it lives).
struct EventRef {
  std::string_view id, source, type;
};

/// Checks a parsed JSON value against every CloudEvents rule and, for org.diaspora.*
/// types, the typed payload — the one validator behind decode, encode and the relay —
/// without copying anything. Does not check the encoded size (the caller knows it).
/// Throws EventError. Thread-safe.
EventRef check_event_json(const boost::json::value& v, const CodecOptions& options = {});

/// Decodes one event from its JSON text, checking every CloudEvents rule and, for
/// org.diaspora.* types, the typed payload. Throws EventError. Thread-safe.
Event decode_event(std::string_view json_text, const CodecOptions& options = {});

/// Like decode_event, from an already parsed JSON value (no size check).
Event event_from_json(const boost::json::value& v, const CodecOptions& options = {});

/// Encodes to the JSON format. Throws EventError when the event is invalid (e.g. both
/// data and data_binary set) or its encoding exceeds the limit. Thread-safe.
std::string encode_event(const Event& e, const CodecOptions& options = {});

/// The JSON object form of an event (no size check, but validity is checked).
boost::json::object event_to_json(const Event& e);

/// Checks an event against every rule decode_event applies. Throws EventError.
void validate_event(const Event& e, const CodecOptions& options = {});

/// Microseconds since the Unix epoch, now (the wall clock; the unit of stored and event
/// times). Any thread; never throws.
std::int64_t now_us() noexcept;

/// Current time as RFC 3339 text in UTC with microseconds, e.g. "2026-11-30T07:15:38.123456Z".
std::string format_rfc3339(std::chrono::system_clock::time_point t);

/// Parses RFC 3339 (with 'T' or 't', fraction up to nanoseconds, 'Z' or a numeric
/// offset); nullopt when malformed or out of range.
std::optional<std::chrono::system_clock::time_point> parse_rfc3339(std::string_view text);

/// The same two in the project's unit of times, microseconds since the Unix epoch (as
/// now_us()): format_rfc3339_us(now_us()), parse_rfc3339_us("...") (sub-µs digits cut).
/// Any thread; format may throw std::bad_alloc, parse never throws.
std::string format_rfc3339_us(std::int64_t us);
std::optional<std::int64_t> parse_rfc3339_us(std::string_view text);

/// Standard base64 (RFC 4648 section 4, padded).
std::string base64_encode(std::string_view bytes);
/// Decodes standard padded base64; nullopt when malformed.
std::optional<std::string> base64_decode(std::string_view text);
/// True when `text` is standard padded base64 (no allocation).
bool base64_valid(std::string_view text) noexcept;

/// A random (version 4) UUID string, suitable as an event id. Thread-safe.
std::string make_uuid();

}  // namespace diaspora
