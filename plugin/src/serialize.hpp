// Records -> CloudEvents JSON text, written straight into the publish frame being built
// (no DOM, no intermediate Event). The output always satisfies check_event_json and the
// payload schemas (a unit test runs every kind through the core validator): strings are
// escaped and invalid UTF-8 becomes U+FFFD.
#pragma once

#include <boost/json/object.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "diaspora/event.hpp"  // now_us
#include "diaspora/payloads.hpp"
#include "record.hpp"

namespace diaspora::plugin {

/// Fixed per handle.
struct EventContext {
  std::string source;    ///< /diaspora/<workflow>/<engine id>
  std::string workflow;  ///< spec name
  std::string engine;    ///< engine id
};

/// Fields the task tracker derives for an event.
struct Derived {
  std::optional<double> queue_wait_s;  ///< started
  std::optional<double> runtime_s;     ///< completed, failed
  std::int64_t heartbeat_seq = -1;     ///< heartbeat: per-task count, from 0
  std::uint64_t coalesced = 0;         ///< metric: samples merged into this one (0 = none)
};

/// Appends the event for `r` with CloudEvents id `id`.
void append_event(std::string& out, const RecordView& r, std::string_view id, const EventContext& ctx,
                  const Derived& derived);

/// Appends an event of `type` with the given data object (plugin-generated events:
/// warnings, stats, action outcomes). Not on a hot path.
void append_event(std::string& out, std::string_view type, std::string_view id, std::optional<std::string_view> subject,
                  const boost::json::object& data, const EventContext& ctx, std::int64_t time_us);

/// The same for one of core's typed payloads (diaspora/payloads.hpp): type Payload::type,
/// data its JSON form.
template <class Payload>
void append_event(std::string& out, std::string_view id, std::optional<std::string_view> subject,
                  const Payload& payload, const EventContext& ctx, std::int64_t time_us) {
  append_event(out, Payload::type, id, subject, events::to_json(payload).as_object(), ctx, time_us);
}

/// JSON string literal of `s`, quotes included; control characters escaped, invalid
/// UTF-8 replaced by U+FFFD.
void append_json_string(std::string& out, std::string_view s);

/// RFC 3339 UTC timestamp with microseconds, e.g. 2026-11-30T10:00:00.123456Z (quoted).
void append_time(std::string& out, std::int64_t time_us);

}  // namespace diaspora::plugin
