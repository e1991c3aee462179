#include "kinds.hpp"

#include <cmath>
#include <set>

#include "diaspora/error.hpp"
#include "worker.hpp"

namespace diaspora::runner {

namespace json = boost::json;

namespace {

struct ArgRule {
  const char* key;
  bool number;      ///< number > 0 (else: string)
  double max = 0;   ///< numbers: upper bound, 0 = none
  bool integer = false;
  bool power_of_two = false;
  std::set<std::string> choices = {};  ///< strings: allowed values
};

const std::map<std::string, std::vector<ArgRule>>& rules() {
  static const std::map<std::string, std::vector<ArgRule>> r = {
      {"sleep", {{"seconds", true, 86400}, {"step", true, 3600}}},
      {"cpu-burn", {{"seconds", true, 86400}, {"step", true, 3600}}},
      {"ptycho-reconstruct",
       {{"iterations", true, 100000, true},
        {"object_size", true, 1024, true, true},
        {"probe_size", true, 256, true, true},
        {"scan_step", true, 256, true},
        {"photons", true, 1e12},
        {"probe_modes", true, 8, true},
        {"seed", true, 4294967295.0, true},
        {"alpha", true, 2},
        {"beta", true, 2},
        {"algorithm", false, 0, false, false, {"ePIE", "epie"}}}},
  };
  return r;
}

}  // namespace

double arg_number(const json::object& args, const char* key, double fallback) {
  const json::value* v = args.if_contains(key);
  if (!v) return fallback;
  double x = 0;
  if (v->is_int64()) x = static_cast<double>(v->get_int64());
  else if (v->is_uint64()) x = static_cast<double>(v->get_uint64());
  else if (v->is_double()) x = v->get_double();
  else throw Error(std::string("args.") + key + ": must be a number > 0");
  if (!std::isfinite(x) || x <= 0) throw Error(std::string("args.") + key + ": must be a number > 0");
  return x;
}

std::string arg_string(const json::object& args, const char* key, const std::string& fallback) {
  const json::value* v = args.if_contains(key);
  if (!v) return fallback;
  if (!v->is_string()) throw Error(std::string("args.") + key + ": must be a string");
  return std::string(v->get_string());
}

std::vector<std::string> check_kind_args(const std::string& kind, const std::map<std::string, json::value>& args) {
  std::vector<std::string> out;
  auto it = rules().find(kind);
  if (it == rules().end()) return {"kind: unknown built-in kind '" + kind + "'"};
  std::string known;
  for (const auto& r : it->second) known += std::string(known.empty() ? "" : ", ") + r.key;
  for (const auto& [k, v] : args) {
    const ArgRule* rule = nullptr;
    for (const auto& r : it->second)
      if (k == r.key) rule = &r;
    if (!rule) {
      out.push_back("args." + k + ": unknown argument of '" + kind + "' (known: " + known + ")");
      continue;
    }
    json::object one{{k, v}};
    try {
      if (rule->number) {
        const double x = arg_number(one, rule->key, 1);
        if (rule->max > 0 && x > rule->max)
          out.push_back("args." + k + ": must be at most " + std::to_string(static_cast<long long>(rule->max)));
        if (rule->integer && x != std::floor(x)) out.push_back("args." + k + ": must be a whole number");
        if (rule->power_of_two && (static_cast<long long>(x) & (static_cast<long long>(x) - 1)) != 0)
          out.push_back("args." + k + ": must be a power of two (8, 16, 32, ...)");
      } else {
        const std::string s = arg_string(one, rule->key, "");
        if (!rule->choices.empty() && !rule->choices.count(s)) {
          std::string c;
          for (const auto& x : rule->choices) c += std::string(c.empty() ? "" : ", ") + x;
          out.push_back("args." + k + ": '" + s + "' is not supported (use one of: " + c + ")");
        }
      }
    } catch (const Error& e) {
      out.push_back(e.what());
    }
  }
  if (kind == "ptycho-reconstruct" && out.empty()) {
    json::object a;
    for (const auto& [k, v] : args) a[k] = v;
    const double n = arg_number(a, "object_size", 64), m = arg_number(a, "probe_size", 16);
    if (m > n) out.push_back("args.probe_size: must not exceed args.object_size (" + std::to_string(static_cast<int>(n)) + ")");
  }
  return out;
}

}  // namespace diaspora::runner
