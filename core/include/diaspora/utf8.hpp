// UTF-8 checks for text that came from outside (request targets, query parameters, names
// in a spec) before it goes into JSON: a JSON text must be valid UTF-8, and Boost.JSON's
// serializer copies a string's bytes as they are.
//
// @par Thread Safety
// Pure functions: any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace diaspora {

/// Length (2 to 4) of the valid UTF-8 sequence of a non-ASCII character that starts at
/// s[i], or 0 when none does there (a stray continuation byte, an overlong form, a
/// surrogate, a code point above U+10FFFF, a sequence cut short). `i` < s.size().
std::size_t utf8_sequence_length(std::string_view s, std::size_t i) noexcept;

/// `s` with every byte that does not belong to a valid UTF-8 sequence replaced by U+FFFD.
std::string valid_utf8(std::string_view s);

}  // namespace diaspora
