#include "policy_bridge.hpp"

#include <algorithm>
#include <cmath>

#include "diaspora/policy.hpp"

namespace diaspora::plugin {

namespace {

// A metric name as a signal name: "step_time_s" on a task -> "task.step_time".
std::string signal_name(std::string_view scope, std::string_view metric) {
  if (metric.ends_with("_s")) metric.remove_suffix(2);
  std::string s(scope);
  s += '.';
  s += metric;
  return s;
}

}  // namespace

PolicyBridge::PolicyBridge(const WorkflowSpec& spec) : engine_(std::make_unique<resilience::PolicyEngine>(spec)) {}

PolicyBridge::~PolicyBridge() = default;

void PolicyBridge::observe(std::string_view signal, std::string_view task, std::string_view site, double value,
                           std::int64_t time_us) {
  if (!std::isfinite(value)) return;
  engine_->observe(resilience::Observation{task, site, signal, value, static_cast<double>(time_us) / 1e6}, decisions_);
}

void PolicyBridge::feed(const RecordView& r, const TaskTracker::Result& res) {
  const RecordHead& h = *r.head;
  const double t = static_cast<double>(h.time_us) / 1e6;
  const std::string_view key = r.str(f_key), site = r.str(f_site);
  auto metrics = [&](std::string_view scope, std::string_view task, std::string_view where) {
    r.for_each_metric([&](std::string_view name, double v) { observe(signal_name(scope, name), task, where, v, h.time_us); });
  };
  switch (h.kind) {
    case Kind::started:
      engine_->task_started(key, site, t, res.deadline_s);
      break;
    case Kind::progress:
      engine_->task_progress(key, h.number, t);
      [[fallthrough]];
    case Kind::heartbeat:
      engine_->heartbeat(key, site, t);
      metrics("task", key, site);
      break;
    case Kind::failed: {
      // Kept (not forgotten) either way: a retry, the engine's or a policy's, keeps its budgets.
      resilience::PolicyEngine::Failure f;
      if (h.flags & has_exit_code) f.exit_code = h.exit_code;
      f.engine_retries = (h.flags & retryable) != 0;
      f.kind = h.integer == DIASPORA_FAILURE_ERROR  ? resilience::PolicyEngine::Failure::Kind::error
               : h.integer == DIASPORA_FAILURE_LOST ? resilience::PolicyEngine::Failure::Kind::lost
                                                    : resilience::PolicyEngine::Failure::Kind::unknown;
      engine_->task_failed(key, site, t, f, decisions_);
      break;
    }
    case Kind::completed:
    case Kind::cancelled:
      engine_->task_finished(key, t);
      break;
    case Kind::metric:
      if (h.scope == DIASPORA_SCOPE_TASK) observe(signal_name("task", r.str(f_name)), key, {}, h.number, h.time_us);
      else if (h.scope == DIASPORA_SCOPE_SITE) observe(signal_name("site", r.str(f_name)), {}, key, h.number, h.time_us);
      else observe(signal_name("resource", r.str(f_name)), {}, {}, h.number, h.time_us);
      break;
    case Kind::resource:
      metrics("resource", {}, site);
      break;
    default:
      break;
  }
}

void PolicyBridge::tick(std::int64_t now_us) { engine_->tick(static_cast<double>(now_us) / 1e6, decisions_); }

std::string PolicyBridge::export_normals() const { return engine_->export_normals(); }
std::size_t PolicyBridge::import_normals_file(const std::filesystem::path& file) {
  return engine_->import_normals_file(file);
}

std::vector<resilience::Decision> PolicyBridge::take_decisions() {
  std::vector<resilience::Decision> out;
  out.swap(decisions_);
  return out;
}

events::AnomalyPredicted PolicyBridge::anomaly_of(const resilience::Decision& d) {
  events::AnomalyPredicted p;
  p.series = d.signal + (d.task_id.empty() ? (d.site.empty() ? "" : ":" + d.site) : ":" + d.task_id);
  p.score = std::clamp(std::isfinite(d.score) ? d.score : 1.0, 0.0, 1.0);
  p.detector = d.detector.empty() ? std::string("policy") : d.detector;
  if (!d.explanation.empty()) p.explanation = d.explanation.substr(0, 4000);
  if (std::isfinite(d.value)) p.value = d.value;
  if (d.eta_s && std::isfinite(*d.eta_s)) {
    p.forecast = events::Forecast{d.signal, std::max(0.0, *d.eta_s - d.time_s), std::nullopt};
    if (std::isfinite(d.threshold)) p.forecast->threshold = d.threshold;
  }
  if (!d.task_id.empty()) p.task_id = d.task_id;
  if (!d.site.empty()) p.site = d.site;
  if (!d.policy.empty()) p.policy = d.policy;
  if (std::isfinite(d.score_threshold)) p.score_threshold = std::clamp(d.score_threshold, 0.0, 1.0);
  return p;
}

Action PolicyBridge::action_of(const resilience::Decision& d, std::string id) {
  Action a;
  a.id = std::move(id);
  a.kind = action_kind(d.action);
  a.kind_name = d.action;
  a.task_id = d.task_id;
  a.site = d.site;
  a.target_site = d.action == "migrate" || d.action == "speculate" ? d.target_site : std::string();
  a.reason = d.reason.substr(0, DIASPORA_MAX_TEXT);
  a.policy = d.policy.substr(0, 256);  // the event schema's bound
  a.attempt = d.attempt;
  a.issued_us = static_cast<std::int64_t>(d.time_s * 1e6);
  return a;
}

}  // namespace diaspora::plugin
