#include "lifecycle.hpp"

#include <algorithm>

#include "diaspora/policy.hpp"

namespace diaspora::runner {

void Lifecycle::submit_instance(std::size_t task, long index) {
  Instance inst;
  inst.id = ctx_.task(task).name + "." + std::to_string(index);
  inst.task = task;
  inst.index = index;
  inst.submitted_t = ctx_.now();
  const int ii = store_.add(std::move(inst));
  if (ii < 0) return;  // restored: the run this one resumes completed it
  Attempt a;
  a.hook_id = store_.at(ii).id;
  const TaskSpec& ts = ctx_.task(task);
  ctx_.hooks.task_submitted(a, ts.name, ts.deadline ? ts.deadline->count() : 0.0);
  queue(ii, std::move(a));
}

int Lifecycle::submit_copy(int ii, Attempt a) {
  ctx_.hooks.task_submitted(a, ctx_.task(store_.at(ii).task).name, 0.0);
  return queue(ii, std::move(a));
}

bool Lifecycle::draining(int ii) const {
  for (const auto& s : sites_.all())
    for (const auto& slot : s.slots)
      if (slot.draining_inst == ii) return true;
  return false;
}

void Lifecycle::dispatch(const Placement& placement) {
  if (ctx_.stopping) return;
  auto& queue = store_.queue();
  for (auto it = queue.begin(); it != queue.end() && sites_.idle() > 0;) {
    const auto [ii, ai] = *it;
    const Attempt& a = store_.attempt(ii, ai);
    if (!a.queued()) {  // cancelled while waiting
      it = queue.erase(it);
      continue;
    }
    const Placement::Choice c = draining(ii) ? Placement::Choice{} : placement.choose(store_.at(ii), a, ctx_.now());
    if (!c) {
      ++it;
      continue;
    }
    it = queue.erase(it);
    begin(ii, ai, *c.site, *c.slot);
    control_->start(ii, ai, *c.site, *c.slot);
  }
}

void Lifecycle::begin(int ii, int ai, Site& s, Slot& slot) {
  Instance& inst = store_.at(ii);
  Attempt& a = store_.attempt(ii, ai);
  a.site = s.name();
  a.slot = slot.index;
  a.start_t = a.last_beat = ctx_.now();
  a.outcome = Outcome::running;
  slot.inst = ii;
  slot.att = ai;
  if (!a.speculative || inst.state == InstanceState::awaiting || inst.state == InstanceState::pending)
    inst.state = InstanceState::running;
  store_.stop_waiting(ii);
}

void Lifecycle::announce_start(int ii, int ai, Site& s, Slot& slot, bool log) {
  Attempt& a = store_.attempt(ii, ai);
  const std::string worker = worker_name(s.name(), slot.index);
  if (!log) {
    a.start_t = a.last_beat = ctx_.now();
    ctx_.hooks.task_started(a, worker);
    return;
  }
  ctx_.say("start " + a.hook_id + " attempt " + std::to_string(a.number) + " on " + worker + " (" + a.cause + ")");
  actions_.acknowledge(a.action_id, true, "attempt " + std::to_string(a.number) + " of " + a.hook_id + " running on " + worker);
}

void Lifecycle::stop(int ii, int ai, Outcome outcome, const std::string& reason, bool report_failed) {
  Attempt& a = store_.attempt(ii, ai);
  if (a.queued()) {
    a.outcome = outcome;
    a.reason = reason;
    a.end_t = ctx_.now();
    return;
  }
  if (!a.live()) return;
  Site* s = sites_.find(a.site);
  if (s && a.slot >= 0) {
    Slot& slot = s->slots[static_cast<std::size_t>(a.slot)];
    if (slot.inst == ii && slot.att == ai) {
      control_->stop(*s, slot);
      slot.inst = slot.att = -1;
      slot.ready = s->remote() || (slot.cmd_pid > 0 && slot.pid > 0 && slot.ready);  // a command's worker stays usable
    }
  }
  a.outcome = outcome;
  a.reason = reason;
  a.end_t = ctx_.now();
  if (report_failed) ctx_.hooks.task_failed(a, true, reason);  // the action that stopped it queued the next attempt
  else ctx_.hooks.task_cancelled(a, reason);
}

bool Lifecycle::policy_can_recover(const Instance& inst, const Attempt& failed) const {
  // A retry cannot fix a command that is missing or not executable.
  if (resilience::retry_cannot_fix(failed.exit_code)) return false;
  if (ctx_.spec.defaults == DefaultsMode::on && !failed.own_error) {  // default-retry: kDefaultRetries retries of lost attempts
    long failures = 0;
    for (const auto& x : inst.attempts) failures += x.outcome == Outcome::failed && !x.own_error && x.hook_id == failed.hook_id;
    if (failures <= resilience::kDefaultRetries) return true;
  }
  const std::string& name = ctx_.task(inst.task).name;
  for (const auto& p : ctx_.spec.policies) {
    if (p.action != ActionKind::restart && p.action != ActionKind::migrate && p.action != ActionKind::speculate) continue;
    if (!p.signal.starts_with("task.")) continue;
    if (p.targets.empty() || std::find(p.targets.begin(), p.targets.end(), name) != p.targets.end()) return true;
  }
  return false;
}

void Lifecycle::finish(int ii, InstanceState st, const std::string& reason) {
  if (!store_.finish(ii, st, reason, ctx_.now())) return;
  if (st != InstanceState::completed) ctx_.say(std::string(to_string(st)) + " " + store_.at(ii).id + ": " + reason);
}

void Lifecycle::completed(int ii, int ai) {
  Instance& inst = store_.at(ii);
  const Attempt& a = inst.attempts[static_cast<std::size_t>(ai)];
  for (std::size_t k = 0; k < inst.attempts.size(); ++k)
    if (static_cast<int>(k) != ai && (inst.attempts[k].live() || inst.attempts[k].queued()))
      stop(ii, static_cast<int>(k), Outcome::cancelled, a.hook_id + " attempt " + std::to_string(a.number) + " finished first", false);
  finish(ii, InstanceState::completed, "");
  const TaskSpec& ts = ctx_.task(inst.task);
  const double took = a.end_t - inst.submitted_t;  // what the deadline counts
  const bool late = ts.deadline && took > ts.deadline->count();
  auto secs = [](double s) {
    const std::string t = std::to_string(s);
    return t.substr(0, t.find('.') + 2) + " s";
  };
  ctx_.say("done " + a.hook_id + " on " + a.site + ": ran " + secs(a.end_t - a.start_t) + " (attempt " +
           std::to_string(a.number) + "), " + secs(took) + " since submitted" + (late ? " (deadline missed)" : ""));
  if (const boost::json::value* f = inst.result.if_contains("file"); f && f->is_string()) {
    const boost::json::value* b = inst.result.if_contains("bytes");
    const boost::json::value* c = inst.result.if_contains("checksum");
    const std::string checksum = c && c->is_string() ? std::string(c->get_string()) : "";
    if (ts.output == TaskSpec::Output::item && ctx_.items)  // announced once the relay holds it (Runner::announce_items)
      ctx_.items->add({ts.name, inst.index, std::string(f->get_string()), checksum, a.site, ctx_.data_topic(ts.name)});
    else
      ctx_.hooks.data_arrived(ts.name, inst.index, b && b->is_int64() ? static_cast<long>(b->get_int64()) : -1,
                              "file://" + std::string(f->get_string()), checksum, a.site);
  }
}

void Lifecycle::ended(int ii, int ai, bool ok, const std::string& reason, bool lost, std::optional<int> exit_code,
                      bool own_error) {
  Instance& inst = store_.at(ii);
  Attempt& a = store_.attempt(ii, ai);
  Site* s = sites_.find(a.site);
  if (lost && ctx_.baseline()) {
    // The baseline does not see a lost worker: the attempt looks alive until its silence
    // exceeds retry-after (Baseline::checks).
    a.lost = true;
    return;
  }
  a.end_t = ctx_.now();
  a.reason = reason;
  a.exit_code = exit_code;
  a.own_error = own_error || (exit_code && *exit_code != 0);
  if (ok) {
    a.outcome = Outcome::completed;
    ctx_.hooks.task_completed(a);
    if (s) ++s->completed;
    if (inst.state != InstanceState::completed) completed(ii, ai);
    return;
  }
  a.outcome = Outcome::failed;
  if (s) {
    ++s->failed;
    Sites::add_penalty(*s, 1.0, ctx_.now());
  }
  ctx_.say("failed " + a.hook_id + " attempt " + std::to_string(a.number) + " on " + a.site + ": " + reason);
  bool others_alive = false;
  for (const auto& x : inst.attempts) others_alive |= x.live() || x.queued();
  const std::string told = a.reason.empty() ? std::string("failed") : a.reason;
  if (ctx_.baseline()) {
    ctx_.hooks.task_failed(a, true, told);
    if (!others_alive) retry_as_baseline(ii, "baseline: retry after an error", reason);
    return;
  }
  const bool recoverable = policy_can_recover(inst, a) && !ctx_.stopping;
  ctx_.hooks.task_failed(a, false, told);  // the runner does not retry it: the policies may
  if (others_alive) return;
  if (recoverable) store_.await(ii, ctx_.now());
  else finish(ii, InstanceState::failed, reason);
}

void Lifecycle::retry_as_baseline(int ii, const std::string& cause, const std::string& why) {
  Instance& inst = store_.at(ii);
  if (inst.attempts.size() < 3 && !ctx_.stopping) {
    Attempt n;
    n.hook_id = inst.id;
    n.cause = cause;
    queue(ii, std::move(n));
  } else {
    finish(ii, InstanceState::failed, why + " (3 attempts)");
  }
}

void Lifecycle::awaiting_checks() {
  const double t = ctx_.now();
  for (int ii : std::vector<int>(store_.awaiting().begin(), store_.awaiting().end())) {
    const Instance& inst = store_.at(ii);
    if (t - inst.awaiting_since < ctx_.opt.failure_grace_s) continue;
    std::string last;
    for (const auto& a : inst.attempts)
      if (!a.reason.empty()) last = a.reason;
    finish(ii, InstanceState::failed,
           last + " (no policy restarted it within " + std::to_string(static_cast<int>(ctx_.opt.failure_grace_s)) + " s)");
  }
}

void Lifecycle::stop_everything(const std::string& why) {
  for (int ii = 0; ii < store_.size(); ++ii) {
    if (store_.at(ii).final()) continue;
    for (int ai = 0; ai < static_cast<int>(store_.at(ii).attempts.size()); ++ai) stop(ii, ai, Outcome::cancelled, why, false);
    finish(ii, InstanceState::cancelled, why);
  }
}

}  // namespace diaspora::runner
