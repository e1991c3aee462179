// Where each event of a publish frame lies in the frame's text. The relay stores each
// published event exactly as the client wrote it, instead of serialising the parsed value
// again; this finds the elements of the frame's "events" array in the text.
//
// Also the checks of a publish frame that need no session.
//
// Internal to the relay (not installed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/json/object.hpp>

#include "diaspora/event.hpp"
#include "topic_log.hpp"

namespace diaspora::relay {

/// The text of each element of the top-level "events" array of `frame`, or nullopt when
/// the frame has no single, plainly spelled "events" key (then the caller serialises the
/// parsed value instead, so that what is stored is always what was validated).
///
/// Precondition: `frame` is text a JSON parser has accepted (every string closed, every
/// escape whole, brackets balanced): the scan does not check the grammar again. On other
/// text the result is unspecified, but the scan never reads outside `frame`.
/// Pure function: any thread. Throws std::bad_alloc only.
std::optional<std::vector<std::string_view>> event_texts(std::string_view frame);

/// Position just past the JSON string that starts at `p` (frame[p] == '"'); frame.size()
/// when it does not end. Same precondition; any thread; never throws.
std::size_t skip_json_string(std::string_view frame, std::size_t p) noexcept;

}  // namespace diaspora::relay

// ---- publish frames ------------------------------------------------------------------------
// The checks of a diaspora.v1 publish frame that need no session (docs/protocol.md,
// "publish"), kept here so that they are unit tested and fuzzed (tests/fuzz/fuzz_frame.cpp)
// apart from the Beast session in server.cpp, which adds the scope check in between.

namespace diaspora::relay {

/// Why a publish frame is refused: the nack's code and message, and the index of the
/// offending event when one event is the cause.
struct PublishRefusal {
  std::string code;
  std::string message;
  std::optional<std::size_t> index;
};

/// A publish frame's 'seq' and 'topic', checked: nullopt and `refusal` set when 'seq' is not
/// a non-negative integer or 'topic' not a valid topic name. Pure: any thread.
std::optional<std::pair<std::uint64_t, std::string>> publish_head(const boost::json::object& frame,
                                                                  PublishRefusal& refusal);

/// Validates one event (parsed `event`, its text `text`) into a log record: the text and
/// its (source, id) dedupe key. Returns the refusal (event_too_large, invalid_event) instead
/// when the text is over `max_event_bytes` or the event is not a valid CloudEvent. Pure.
std::optional<PublishRefusal> event_record(const boost::json::value& event, std::string_view text,
                                           std::size_t max_event_bytes, const CodecOptions& codec,
                                           AppendRecord& record);

/// A publish frame's limits (the relay's configuration).
struct PublishLimits {
  std::size_t max_batch_events = 0;
  std::size_t max_event_bytes = 0;
};

/// Validates a publish frame's 'events' (parsed in `frame`, the frame's text in `text`) into
/// log records, one per event, each holding the event's text as the client wrote it (or as
/// serialised from the parsed value when event_texts() cannot find it) and its (source, id)
/// dedupe key; `bytes` gets their total size. Returns the refusal (with the event's index
/// when one event is the cause) when 'events' is not a non-empty array, holds more events
/// than the limit, or an event is too large or not a valid CloudEvent. Pure: any thread.
std::optional<PublishRefusal> publish_records(const boost::json::object& frame, std::string_view text,
                                              const PublishLimits& limits, const CodecOptions& codec,
                                              std::vector<AppendRecord>& records, std::uint64_t& bytes);

}  // namespace diaspora::relay
