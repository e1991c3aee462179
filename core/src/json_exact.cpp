#include "diaspora/json_exact.hpp"

#include <charconv>
#include <string>

#include <boost/json/basic_parser_impl.hpp>
#include <boost/json/value_stack.hpp>

namespace diaspora {
namespace {

namespace json = boost::json;

// Builds the value on a value_stack as boost::json::parser does, except that a double is
// converted from its text with std::from_chars (correctly rounded).
struct ExactHandler {
  static constexpr std::size_t max_array_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_object_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_string_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_key_size = static_cast<std::size_t>(-1);

  json::value_stack st;
  std::string number;  // the parts of a number split across writes (one write here: rarely used)

  bool on_document_begin(json::error_code&) { return true; }
  bool on_document_end(json::error_code&) { return true; }
  bool on_array_begin(json::error_code&) { return true; }
  bool on_array_end(std::size_t n, json::error_code&) {
    st.push_array(n);
    return true;
  }
  bool on_object_begin(json::error_code&) { return true; }
  bool on_object_end(std::size_t n, json::error_code&) {
    st.push_object(n);
    return true;
  }
  bool on_string_part(json::string_view s, std::size_t, json::error_code&) {
    st.push_chars(s);
    return true;
  }
  bool on_string(json::string_view s, std::size_t, json::error_code&) {
    st.push_string(s);
    return true;
  }
  bool on_key_part(json::string_view s, std::size_t, json::error_code&) {
    st.push_chars(s);
    return true;
  }
  bool on_key(json::string_view s, std::size_t, json::error_code&) {
    st.push_key(s);
    return true;
  }
  bool on_number_part(json::string_view s, json::error_code&) {
    number.append(s.data(), s.size());
    return true;
  }
  bool on_int64(std::int64_t i, json::string_view, json::error_code&) {
    number.clear();
    st.push_int64(i);
    return true;
  }
  bool on_uint64(std::uint64_t u, json::string_view, json::error_code&) {
    number.clear();
    st.push_uint64(u);
    return true;
  }
  bool on_double(double d, json::string_view s, json::error_code&) {
    number.append(s.data(), s.size());
    double exact = 0;
    const auto [end, err] = std::from_chars(number.data(), number.data() + number.size(), exact);
    // from_chars reads what the JSON grammar allows; out of range keeps the parser's value
    // (boost gives inf or 0 there as from_chars would).
    if (err == std::errc{} && end == number.data() + number.size()) d = exact;
    number.clear();
    st.push_double(d);
    return true;
  }
  bool on_bool(bool b, json::error_code&) {
    st.push_bool(b);
    return true;
  }
  bool on_null(json::error_code&) {
    st.push_null();
    return true;
  }
  bool on_comment_part(json::string_view, json::error_code&) { return true; }
  bool on_comment(json::string_view, json::error_code&) { return true; }
};

}  // namespace

boost::json::value parse_json_exact(std::string_view text, boost::json::error_code& ec) {
  json::basic_parser<ExactHandler> p(json::parse_options{});
  p.handler().st.reset();
  const std::size_t n = p.write_some(false, text.data(), text.size(), ec);
  if (!ec && n < text.size()) ec = json::error::extra_data;
  if (ec) return nullptr;
  return p.handler().st.release();
}

boost::json::value parse_json_exact(std::string_view text) {
  json::error_code ec;
  json::value v = parse_json_exact(text, ec);
  if (ec) throw boost::system::system_error(ec);
  return v;
}

}  // namespace diaspora
