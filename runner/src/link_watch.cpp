#include "link_watch.hpp"

#include <boost/json/value.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "diaspora/event.hpp"  // parse_rfc3339_us
#include "diaspora/topic_reader.hpp"

namespace diaspora::runner {

namespace json = boost::json;

LinkWatch::LinkWatch(Context& ctx, InstanceStore& store) : ctx_(ctx), store_(store) {
  wanted_ = std::any_of(ctx.spec.policies.begin(), ctx.spec.policies.end(),
                        [](const PolicySpec& p) { return p.signal == "task.link_wait"; });
}
LinkWatch::~LinkWatch() = default;

std::string LinkWatch::topic() const { return ctx_.prefix() + ".links"; }

void LinkWatch::tick() {
  if (!wanted_ || ctx_.relay_url.empty() || ctx_.now() < next_try_) return;
  try {
    if (!reader_) {
      RelayClientOptions o = relay_options_from_files(ctx_.relay_url, ctx_.ca_file, ctx_.token_file, "diaspora-run-links");
      o.timeout = std::chrono::milliseconds(2000);  // the runner's loop must not stall on a relay that is away
      reader_ = std::make_unique<TopicReader>(o, topic());
    }
    for (const json::object& e : reader_->poll(std::chrono::milliseconds(0))) take(e);
    backoff_ = 1;
  } catch (const RelayClientError&) {  // the relay is away (a stop-relay fault, a restart): again later
    reader_.reset();
    next_try_ = ctx_.now() + backoff_;
    backoff_ = std::min(backoff_ * 2, 30.0);
  }
}

void LinkWatch::take(const json::object& e) {
  const json::value* type = e.if_contains("type");
  const json::value* time = e.if_contains("time");
  const json::value* data = e.if_contains("data");
  if (!type || !type->is_string() || type->get_string() != "org.diaspora.resource.status" || !data || !data->is_object())
    return;
  const auto us = time && time->is_string() ? parse_rfc3339_us(time->get_string()) : std::nullopt;
  if (!us || *us < ctx_.started_us) return;  // an earlier run's
  const json::object& d = data->get_object();
  const json::value* kind = d.if_contains("kind");
  const json::value* task = d.if_contains("task_id");
  const json::value* state = d.if_contains("state");
  if (!kind || !kind->is_string() || kind->get_string() != "link" || !task || !task->is_string()) return;
  int ai = -1;
  const int ii = store_.find(std::string(task->get_string()), &ai);
  if (ii < 0 || ai < 0 || !store_.attempt(ii, ai).live()) return;  // not one of this run's running attempts
  double wait = 0;  // the longest wait of a frame that is not bulk (bulk waits by design: paced)
  const json::value* metrics = d.if_contains("metrics");
  if (state && state->is_string() && state->get_string() != "up" && metrics && metrics->is_object())
    for (const auto& kv : metrics->get_object())
      if (kv.key().starts_with("wait_max_s_") && kv.key() != "wait_max_s_bulk" && kv.value().is_number())
        wait = std::max(wait, kv.value().to_number<double>());
  if (!std::isfinite(wait)) return;
  const diaspora_metric_value m{"link_wait_s", wait};
  ctx_.hooks.task_heartbeat(store_.attempt(ii, ai), {&m, 1});
  ++told_;
}

}  // namespace diaspora::runner
