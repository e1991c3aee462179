// Fuzz target: a CloudEvent's JSON text (decode_event: every CloudEvents rule and the typed
// payloads of org.diaspora.* types), and the attribute parsers under it (RFC 3339 times,
// base64). Invariants: an event that decodes encodes to text that decodes to the same
// event and encodes to the same text; check_event_json agrees with decode_event; a
// timestamp that parses prints as one that parses to the same instant; base64_valid agrees
// with base64_decode, and what decodes encodes back to something that decodes the same.
#include <boost/json.hpp>

#include "diaspora/event.hpp"
#include "diaspora/json_exact.hpp"
#include "fuzz_support.hpp"

using namespace diaspora;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::optional<Event> decoded;
  try {
    decoded = decode_event(text);
  } catch (const EventError&) {
  }
  if (decoded) {
    const std::string again = encode_event(*decoded);
    const Event e2 = decode_event(again);  // an encoded event decodes: throws (a finding) if not
    FUZZ_CHECK(e2 == *decoded);
    FUZZ_CHECK(encode_event(e2) == again);
  }
  boost::system::error_code ec;
  const boost::json::value v = parse_json_exact(text, ec);  // as decode_event reads it
  if (!ec && size <= CodecOptions{}.max_event_bytes) {
    bool checked = true;
    try {
      check_event_json(v);
    } catch (const EventError&) {
      checked = false;
    }
    FUZZ_CHECK(checked == decoded.has_value());
  }

  if (size <= 64) {
    if (const auto us = parse_rfc3339_us(text)) {
      const auto back = parse_rfc3339_us(format_rfc3339_us(*us));
      FUZZ_CHECK(back && *back == *us);
    }
    const auto bytes = base64_decode(text);
    FUZZ_CHECK(bytes.has_value() == base64_valid(text));
    if (bytes) FUZZ_CHECK(base64_decode(base64_encode(*bytes)) == bytes);
  }
  return 0;
}
