#include "faults.hpp"

#include <signal.h>

#include <algorithm>

namespace diaspora::runner {

namespace {
/// One step of a duty cycle that runs 1/factor of every 100 ms: at or after `next`, flips
/// `stopped` and sets the next switch. True when it flipped.
bool duty_step(bool& stopped, double& next, double factor, double t) {
  constexpr double kPeriod = 0.1;
  if (t < next) return false;
  stopped = !stopped;
  const double run = kPeriod / factor;
  next = t + (stopped ? kPeriod - run : run);
  return true;
}
}  // namespace

FaultInjector::FaultInjector(Context& ctx, InstanceStore& store, Sites& sites, SlotControl& control, RelayControl* relay)
    : ctx_(ctx), store_(store), sites_(sites), control_(control), relay_(relay) {
  for (const auto& f : ctx_.spec.faults) {
    Fault x;
    x.spec = &f;
    faults_.push_back(x);
  }
}

// The live attempt that started first (on `site` when given, of `task` when given) whose
// work runs now: a remote attempt still in its engine's queue, or whose worker has
// connected but not yet been sent its task, is not hit.
InstanceStore::Ref FaultInjector::oldest_running(const std::string& site, const std::optional<std::string>& task) const {
  InstanceStore::Ref best{-1, -1};
  double oldest = 1e300;
  for (int ii = 0; ii < store_.size(); ++ii) {
    const Instance& inst = store_.at(ii);
    if (task && ctx_.task(inst.task).name != *task) continue;
    for (int ai = 0; ai < static_cast<int>(inst.attempts.size()); ++ai) {
      const Attempt& a = inst.attempts[static_cast<std::size_t>(ai)];
      if (!a.live() || a.lost || (!site.empty() && a.site != site)) continue;
      if (const Site* s = sites_.find(a.site); s && s->remote()) {
        const Slot& slot = s->slots[static_cast<std::size_t>(a.slot)];
        if (!slot.connected || !slot.pending_run.empty()) continue;  // its task not sent (nor its start published) yet
      }
      if (a.start_t < oldest) oldest = a.start_t, best = {ii, ai};
    }
  }
  return best;
}

void FaultInjector::begin(Fault& f, double t) {
  const FaultSpec& fs = *f.spec;
  const std::string kind(to_string(fs.kind));
  switch (fs.kind) {
    case FaultKind::slow_site: {
      f.start_t = t;
      Site* s = sites_.find(*fs.site);
      s->slow_factor = fs.factor;
      s->slow_until = fs.lasts ? t + fs.lasts->count() : 1e300;
      s->next_toggle = t;
      f.end_t = fs.lasts ? t + fs.lasts->count() : -1;
      f.target = s->name();
      for (int ii = 0; ii < store_.size(); ++ii)
        for (const auto& a : store_.at(ii).attempts)
          if (a.live() && a.site == s->name()) f.hit.emplace_back(ii, store_.at(ii).attempts.size());
      ctx_.hooks.resource(s->name(), "site", "degraded", s->name(), "fault_slow_site_factor", fs.factor);
      ctx_.say("fault slow-site: " + f.target + " runs " + std::to_string(fs.factor).substr(0, 4) + "x slower" +
               (fs.lasts ? " for " + std::to_string(static_cast<int>(fs.lasts->count())) + " s" : ""));
      return;
    }
    case FaultKind::kill_worker:
    case FaultKind::hang_task:
    case FaultKind::slow_task: {
      const std::string site_name = fs.site.value_or("");
      const auto [ii, ai] = oldest_running(site_name, fs.task);
      if (ii < 0) {
        // Armed: it hits the first attempt that runs there from now on (a slow machine may
        // not have started one by `at`); end_all() notes it when none ever did.
        if (!f.armed) ctx_.say("fault " + kind + ": nothing running" + (site_name.empty() ? "" : " on " + site_name) +
                               " yet; it hits the first attempt that runs there");
        f.armed = true;
        return;
      }
      f.start_t = t;
      f.armed = false;
      f.done = fs.kind != FaultKind::slow_task;
      const Attempt& a = store_.attempt(ii, ai);
      Site& s = *sites_.find(a.site);
      Slot& slot = s.slots[static_cast<std::size_t>(a.slot)];
      const std::string worker = worker_name(s.name(), slot.index);
      f.target = a.hook_id + " on " + worker;
      f.hit.emplace_back(ii, store_.at(ii).attempts.size());
      if (fs.kind == FaultKind::kill_worker) {
        f.note = control_.kill_worker(s, slot);
        ctx_.hooks.resource(worker, "worker", "down", s.name(), "fault_kill_worker", 1);
      } else if (fs.kind == FaultKind::slow_task) {
        f.slowed = {ii, ai};
        f.next_toggle = t;
        f.end_t = fs.lasts ? t + fs.lasts->count() : -1;
        ctx_.hooks.resource(worker, "worker", "degraded", s.name(), "fault_slow_task_factor", fs.factor);
        ctx_.say("fault slow-task: " + f.target + " runs " + std::to_string(fs.factor).substr(0, 4) + "x slower" +
                 (fs.lasts ? " for " + std::to_string(static_cast<int>(fs.lasts->count())) + " s" : ""));
        return;
      } else {
        control_.hang(s, slot);
        ctx_.hooks.resource(worker, "worker", "degraded", s.name(), "fault_hang_task", 1);
      }
      ctx_.say("fault " + kind + ": " + f.target);
      return;
    }
    case FaultKind::stop_relay: {
      f.start_t = t;
      if (!relay_) {
        f.note = "the relay is not embedded: no effect";
        f.done = true;
        return;
      }
      ctx_.hooks.resource("relay", "relay", "down", "", "fault_stop_relay", 1);
      relay_->stop_async();
      f.end_t = fs.lasts ? t + fs.lasts->count() : -1;
      f.target = ctx_.relay_url;
      ctx_.say("fault stop-relay: relay stopped" +
               (fs.lasts ? " for " + std::to_string(static_cast<int>(fs.lasts->count())) + " s" : ""));
      return;
    }
  }
}

void FaultInjector::tick() {
  const double t = ctx_.now();
  for (Fault& f : faults_) {
    const FaultSpec& fs = *f.spec;
    if (f.start_t < 0 && t >= fs.at.count() && !ctx_.stopping) {
      begin(f, t);
      continue;
    }
    if (f.start_t < 0 || f.done || f.end_t < 0 || t < f.end_t) continue;
    if (fs.kind == FaultKind::slow_task) {
      end_slow_task(f, "over");
      continue;
    }
    f.done = true;
    if (fs.kind == FaultKind::stop_relay && relay_) {
      if (!restart_relay()) {
        f.done = false;  // try again shortly
        f.end_t = t + 0.2;
        continue;
      }
      ctx_.hooks.resource("relay", "relay", "up", "", "fault_stop_relay", 0);
    } else if (fs.kind == FaultKind::slow_site) {
      ctx_.hooks.resource(*fs.site, "site", "up", *fs.site, "fault_slow_site_factor", 1);
      ctx_.say("fault slow-site over: " + *fs.site);
    }
  }
}

void FaultInjector::duty_cycle() {
  const double t = ctx_.now();
  for (auto& s : sites_.all()) {
    const bool slowed = s.slow_factor > 1 && t < s.slow_until;
    if (!slowed) {
      if (s.stopped_phase) {
        s.stopped_phase = false;
        for (auto& slot : s.slots) control_.pause(s, slot, false);
      }
      continue;
    }
    if (!duty_step(s.stopped_phase, s.next_toggle, s.slow_factor, t)) continue;
    for (auto& slot : s.slots) control_.pause(s, slot, s.stopped_phase);
  }
  for (Fault& f : faults_) {
    if (f.spec->kind != FaultKind::slow_task || f.slowed.first < 0 || f.done) continue;
    const Attempt& a = store_.attempt(f.slowed.first, f.slowed.second);
    if (!a.live()) {  // the straggler ended (done, stopped, or its copy won): its worker is free again
      end_slow_task(f, "over (" + a.hook_id + " ended)");
      continue;
    }
    if (!duty_step(f.stopped_phase, f.next_toggle, f.spec->factor, t)) continue;
    Site& s = *sites_.find(a.site);
    control_.pause(s, s.slots[static_cast<std::size_t>(a.slot)], f.stopped_phase);
  }
}

void FaultInjector::end_slow_task(Fault& f, const std::string& why) {
  f.done = true;
  f.end_t = ctx_.now();  // the report shades it to when it ended
  if (f.slowed.first < 0) return;
  const Attempt& a = store_.attempt(f.slowed.first, f.slowed.second);
  Site* s = sites_.find(a.site);
  if (s && a.slot >= 0 && f.stopped_phase) control_.pause(*s, s->slots[static_cast<std::size_t>(a.slot)], false);
  f.stopped_phase = false;
  if (s && a.slot >= 0)
    ctx_.hooks.resource(worker_name(s->name(), s->slots[static_cast<std::size_t>(a.slot)].index), "worker", "up",
                        s->name(), "fault_slow_task_factor", 1);
  ctx_.say("fault slow-task " + why + ": " + f.target);
}

void FaultInjector::end_all() {
  for (Fault& f : faults_)
    if (f.armed) {
      f.armed = false;
      f.done = true;
      f.note = "nothing ran there after its time: no effect";
    }
  for (auto& s : sites_.all()) s.slow_until = 0;
  for (Fault& f : faults_)
    if (f.spec->kind == FaultKind::slow_task && !f.done && f.start_t >= 0) end_slow_task(f, "over");
  duty_cycle();
}

double FaultInjector::next_toggle(double cap) const {
  double next = cap;
  for (const auto& s : sites_.all())
    if (s.slow_factor > 1) next = std::min(next, std::max(0.0, s.next_toggle - ctx_.now()));
  for (const auto& f : faults_)
    if (f.spec->kind == FaultKind::slow_task && f.slowed.first >= 0 && !f.done)
      next = std::min(next, std::max(0.0, f.next_toggle - ctx_.now()));
  return next;
}

bool FaultInjector::restart_relay() {
  if (!relay_ || relay_->running()) return true;
  std::string why;
  if (relay_->try_start(&why)) {
    ctx_.say("relay started again on " + ctx_.relay_url);
    relay_retry_said_ = false;
    return true;
  }
  if (!relay_retry_said_ && !why.empty()) ctx_.say("relay: cannot start again yet (" + why + "); retrying");
  relay_retry_said_ = !why.empty() || relay_retry_said_;
  return false;
}

}  // namespace diaspora::runner
