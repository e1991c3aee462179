// Functions shared between core's translation units; not installed, not public.
#pragma once

#include <boost/json/value.hpp>

#include <string_view>

namespace diaspora::detail {

/// Validates the data of a Diaspora event type against schemas/events/<type>.schema.json.
/// Throws EventError: unknown_type when there is no schema, invalid_data listing every
/// mismatch as "data.<path>: <message>".
void check_payload_data(std::string_view type, const boost::json::value& data);

}  // namespace diaspora::detail
