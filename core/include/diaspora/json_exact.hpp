// JSON text to a boost::json::value whose numbers are exact: each floating-point number is
// the double nearest to its text, as Python's json and JavaScript's JSON.parse read it.
// Boost 1.81's own parser may land one unit in the last place off (0.011907458305358887
// reads as ...888), so a value read back from a file diaspora wrote (a trainer's
// summary.json, a checkpoint's metrics) would differ from the one written. Use this where
// a number read from a file goes back out or is compared with the number written.
//
// @par Thread Safety
// Reentrant (no shared state).
#pragma once

#include <string_view>

#include <boost/json/value.hpp>

namespace diaspora {

/// Parses one JSON document (RFC 8259, nothing after it but whitespace).
/// @param ec set on a syntax error (as boost::json::parse sets it); the value is null then.
boost::json::value parse_json_exact(std::string_view text, boost::json::error_code& ec);

/// The same.
/// @throws boost::system::system_error on a syntax error (as boost::json::parse throws).
boost::json::value parse_json_exact(std::string_view text);

}  // namespace diaspora
