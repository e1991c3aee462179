// A run's decisions on in-memory state, for the runner's unit tests (test_runner_*.cpp):
// the real store, sites, lifecycle, placement, action executor and fault injector, driven
// by a clock the test sets, with the plugin's hooks and the slots' processes recorded
// instead of carried out (no process, no relay, no plugin).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "action_log.hpp"
#include "actions.hpp"
#include "clock.hpp"
#include "context.hpp"
#include "faults.hpp"
#include "lifecycle.hpp"
#include "placement.hpp"
#include "rehearsal_jobs.hpp"
#include "sites.hpp"
#include "slot_control.hpp"
#include "store.hpp"
#include "streams.hpp"

namespace diaspora::runner::testing {

struct ManualClock final : Clock {
  double t = 0;
  double now() const override { return t; }
};

/// Each hook as a line: "failed burn.0 retryable: why", "action A1 done: ...".
struct RecordingHooks final : Hooks {
  std::vector<std::string> calls;
  void task_submitted(const Attempt& a, const std::string&, double) override { calls.push_back("submitted " + a.hook_id); }
  void task_started(const Attempt& a, const std::string& worker) override {
    calls.push_back("started " + a.hook_id + " " + std::to_string(a.number) + " " + worker);
  }
  void task_progress(const Attempt& a, double, long, std::span<const diaspora_metric_value>) override {
    calls.push_back("progress " + a.hook_id);
  }
  void task_heartbeat(const Attempt& a, std::span<const diaspora_metric_value>) override { calls.push_back("heartbeat " + a.hook_id); }
  void task_progress_line(const Attempt& a, const ProgressLine&) override { calls.push_back("line " + a.hook_id); }
  void task_completed(const Attempt& a) override { calls.push_back("completed " + a.hook_id); }
  void task_failed(const Attempt& a, bool retryable, const std::string& reason) override {
    calls.push_back("failed " + a.hook_id + (retryable ? " retryable: " : ": ") + reason);
  }
  void task_cancelled(const Attempt& a, const std::string& reason) override { calls.push_back("cancelled " + a.hook_id + ": " + reason); }
  void data_arrived(const std::string& stream, long seq, long, const std::string&, const std::string&, const std::string&) override {
    calls.push_back("data " + stream + "." + std::to_string(seq));
  }
  void resource(const std::string& id, const char*, const char* state, const std::string&, const std::string&, double) override {
    calls.push_back("resource " + id + " " + state);
  }
  void action_result(const std::string& id, bool ok, const std::string& message) override {
    calls.push_back("action " + id + (ok ? " done: " : " failed: ") + message);
  }
  /// The calls that start with `prefix`.
  std::vector<std::string> with(const std::string& prefix) const {
    std::vector<std::string> out;
    for (const auto& c : calls)
      if (c.starts_with(prefix)) out.push_back(c);
    return out;
  }
};

/// The slots' processes: each call recorded; start() announces the attempt running, as
/// a worker that takes it does.
struct RecordingControl final : SlotControl {
  std::vector<std::string> calls;
  Lifecycle* lifecycle = nullptr;
  std::string kill_note;  ///< what kill_worker() answers ("" = killed)
  bool start(int ii, int ai, Site& s, Slot& slot) override {
    calls.push_back("start " + worker_name(s.name(), slot.index));
    lifecycle->announce_start(ii, ai, s, slot, false);
    lifecycle->announce_start(ii, ai, s, slot, true);
    return true;
  }
  void stop(Site& s, Slot& slot) override { calls.push_back("stop " + worker_name(s.name(), slot.index)); }
  void pause(Site& s, Slot& slot, bool paused) override {
    calls.push_back(std::string(paused ? "pause " : "resume ") + worker_name(s.name(), slot.index));
  }
  std::string kill_worker(Site& s, Slot& slot) override {
    calls.push_back("kill " + worker_name(s.name(), slot.index));
    return kill_note;
  }
  void hang(Site& s, Slot& slot) override { calls.push_back("hang " + worker_name(s.name(), slot.index)); }
  bool request_checkpoint(Site& s, Slot& slot) override {
    calls.push_back("checkpoint " + worker_name(s.name(), slot.index));
    return true;
  }
  long count(const std::string& prefix) const {
    return std::count_if(calls.begin(), calls.end(), [&](const std::string& c) { return c.starts_with(prefix); });
  }
};

/// The stop-relay fault's relay: stopping takes `stop_ticks` calls of try_start().
struct FakeRelay final : RelayControl {
  bool up = true, stopping = false;
  int stop_ticks = 0, stops = 0;
  void stop_async() override {
    up = false;
    stopping = true;
    ++stops;
  }
  bool running() const override { return up; }
  bool try_start(std::string*) override {
    if (stopping && stop_ticks-- > 0) return false;
    stopping = false;
    up = true;
    return true;
  }
};

inline WorkflowSpec parse_rig_spec(const std::string& yaml) { return RehearsalJobs::with_job_tasks(parse_spec_string(yaml, "rig.yaml")); }

/// The parts of a run on a spec's YAML, every slot ready (its worker said so).
struct Rig {
  explicit Rig(const std::string& yaml, RunOptions options = {})
      : spec(parse_rig_spec(yaml)), opt(std::move(options)),
        ctx{spec, spec.tasks.size() - spec.rehearsal.size(), opt, clock, hooks, [this](const std::string& l) { log.push_back(l); }} {
    control.lifecycle = &lifecycle;
    lifecycle.set_control(control);
    for (auto& s : sites.all())
      for (auto& sl : s.slots) sl.ready = true;
  }

  WorkflowSpec spec;
  RunOptions opt;
  ManualClock clock;
  RecordingHooks hooks;
  std::vector<std::string> log;
  Context ctx;
  InstanceStore store;
  Sites sites{spec.sites};
  ActionLog actions{ctx};
  Lifecycle lifecycle{ctx, store, sites, actions};
  Placement placement{ctx, sites, store};
  RecordingControl control;
  Streams streams{ctx, lifecycle};
  ActionExecutor executor{ctx, store, sites, lifecycle, actions, control, streams};

  /// Every count task's instances submitted, then placed.
  void submit() {
    streams.start(store);
    dispatch();
  }
  void dispatch() { lifecycle.dispatch(placement); }
  /// The instance with this id (fails the test when there is none).
  int inst(const std::string& id) const {
    const int ii = store.index_of(id);
    EXPECT_GE(ii, 0) << id;
    return ii;
  }
  /// Its latest attempt.
  const Attempt& last(const std::string& id) const { return store.at(inst(id)).attempts.back(); }
  /// Running attempts on `site`.
  long running_on(const std::string& site) const {
    long n = 0;
    for (const auto& i : store.all())
      for (const auto& a : i.attempts) n += a.live() && a.site == site;
    return n;
  }
  /// An action as the plugin delivers it.
  static diaspora_action action(int kind, const char* kind_name, const std::string& id, const std::string& task,
                                const std::string& target = "", const std::string& site = "") {
    diaspora_action a{};
    a.struct_size = sizeof a;
    std::snprintf(a.id, sizeof a.id, "%s", id.c_str());
    a.kind = kind;
    std::snprintf(a.kind_name, sizeof a.kind_name, "%s", kind_name);
    std::snprintf(a.task_id, sizeof a.task_id, "%s", task.c_str());
    std::snprintf(a.site, sizeof a.site, "%s", site.c_str());
    std::snprintf(a.target_site, sizeof a.target_site, "%s", target.c_str());
    std::snprintf(a.reason, sizeof a.reason, "test");
    std::snprintf(a.origin, sizeof a.origin, "local");
    return a;
  }
  void act(const diaspora_action& a) {
    executor.handle(a, [this] { dispatch(); });
    dispatch();
  }
};

/// Two local sites (fast: 2 workers, speed 1; slow: 2 workers, speed 0.5), a task `burn` of
/// `count` built-in instances, the policies given.
inline std::string two_sites(int count, const std::string& extra = "") {
  return "version: 1\nname: rig\nsites:\n"
         "  - {name: fast, engine: local, workers: 2, speed: 1.0}\n"
         "  - {name: slow, engine: local, workers: 2, speed: 0.5}\n"
         "tasks:\n  - {name: burn, kind: cpu-burn, args: {seconds: 5}, count: " +
         std::to_string(count) + "}\n" + extra;
}

inline const std::string kRestartPolicy =
    "policies:\n  - {name: restart-lost, signal: task.heartbeat_gap, detector: phi-accrual, threshold: 8, action: restart}\n";

}  // namespace diaspora::runner::testing
