// Reading a report object (report.json's, as report_builder.hpp builds it): lenient getters
// that give a fallback for a missing or mistyped field, so a page or an incident is built
// from a report of an older runner too.
//
// Thread safety: pure functions.
#pragma once

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include <string>

namespace diaspora::runner::report_json {

/// Field `k` as text: a string as is, another value serialized, "" when missing or null.
inline std::string str(const boost::json::object& o, const char* k) {
  const boost::json::value* v = o.if_contains(k);
  if (!v || v->is_null()) return "";
  if (v->is_string()) return std::string(v->get_string());
  return boost::json::serialize(*v);
}

/// Field `k` as a number, `fallback` when missing or not a number.
inline double num(const boost::json::object& o, const char* k, double fallback = -1) {
  const boost::json::value* v = o.if_contains(k);
  return v && v->is_number() ? v->to_number<double>() : fallback;
}

/// Field `k` as an array, an empty one when missing or not an array.
inline const boost::json::array& arr(const boost::json::object& o, const char* k) {
  static const boost::json::array empty;
  const boost::json::value* v = o.if_contains(k);
  return v && v->is_array() ? v->get_array() : empty;
}

}  // namespace diaspora::runner::report_json
