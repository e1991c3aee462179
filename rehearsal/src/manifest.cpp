#include "manifest.hpp"

#include <cmath>

#include <boost/json.hpp>

#include "diaspora/json_exact.hpp"
#include "diaspora/rehearsal.hpp"

namespace diaspora::rehearsal::detail {

namespace json = boost::json;

Manifest parse_manifest(std::string_view text, const std::string& where,
                        const std::function<void(const Manifest&)>& identity_check) {
  json::value mv;
  try {
    mv = parse_json_exact(text);  // the error matrix's rows exactly as written
  } catch (const std::exception& e) {
    throw RehearsalError("checkpoint " + where + " is not JSON: " + std::string(e.what()));
  }
  Manifest m;
  try {
    const json::object& o = mv.as_object();
    m.strategy = std::string(o.at("strategy").as_string());
    m.dataset = std::string(o.at("dataset").as_string());
    m.tasks = o.at("tasks").to_number<int>();
    if (const auto* metric = o.if_contains("metric")) m.metric = std::string(metric->as_string());
    if (const auto* ema = o.if_contains("ema")) m.ema = ema->to_number<double>();
    if (const auto* st = o.if_contains("stream")) m.stream = st->as_object();
    if (const auto* seed = o.if_contains("seed")) m.seed = *seed;
    if (identity_check) identity_check(m);
    m.step = o.at("step").to_number<std::int64_t>();
    m.task = o.at("task").to_number<int>();
    m.epoch = o.at("epoch").to_number<int>();
    m.batch = o.at("batch").to_number<std::int64_t>();
    m.elapsed_s = o.at("elapsed_s").to_number<double>();
    if (const auto* cpu = o.if_contains("cpu_s")) m.cpu_s = cpu->to_number<double>();  // absent before 2026-12-03
    for (const auto& row : o.at("matrix").as_array()) {
      std::vector<double>& r = m.matrix.emplace_back();
      for (const auto& x : row.as_array()) r.push_back(x.is_null() ? std::nan("") : x.to_number<double>());
    }
    m.world_size = o.at("world_size").to_number<int>();
  } catch (const RehearsalError&) {
    throw;
  } catch (const std::exception& e) {
    throw RehearsalError("checkpoint " + where +
                         " is not a diaspora-train manifest (a field is missing or of the wrong type: " + e.what() + ")");
  }
  if (m.world_size < 1 || m.step < 0 || m.task < 0 || m.epoch < 0 || m.batch < 0)
    throw RehearsalError("checkpoint " + where + " holds an impossible position (world " + std::to_string(m.world_size) +
                         ", task " + std::to_string(m.task) + ", step " + std::to_string(m.step) + ")");
  return m;
}

}  // namespace diaspora::rehearsal::detail
