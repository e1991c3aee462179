// Where each event of a publish frame lies in the frame's text. The relay stores each
// published event exactly as the client wrote it, instead of serialising the parsed value
// again; this finds the elements of the frame's "events" array in the text.
//
// Internal to the relay (not installed).
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

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
