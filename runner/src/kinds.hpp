// The built-in task kinds' arguments: read by the kinds in the worker, checked by the
// runner before anything starts (so a bad `args:` is a spec error, not a failed task).
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <map>
#include <string>
#include <vector>

namespace diaspora::runner {

/// args[key] as a number > 0 (integers accepted), or `fallback` when absent. Throws
/// diaspora::Error ("args.KEY: must be a number > 0") for anything else.
double arg_number(const boost::json::object& args, const char* key, double fallback);

/// args[key] as a string, or `fallback` when absent; throws diaspora::Error when not a string.
std::string arg_string(const boost::json::object& args, const char* key, const std::string& fallback);

/// Problems of a built-in kind's `args` ("args.KEY: ..."), empty when they are usable:
/// unknown keys (with the known ones), wrong types, values out of range.
std::vector<std::string> check_kind_args(const std::string& kind, const std::map<std::string, boost::json::value>& args);

}  // namespace diaspora::runner
