// The lifecycle of instances and attempts: submitted, queued, placed and started, stopped,
// ended (done, failed, their worker lost), and the instance's end. Each step changes the
// store and the sites, calls the plugin's hook and logs what a user needs to see. What a
// failure leads to is decided here: another attempt still running, the policies' decision
// awaited (for `--failure-grace`), the baseline's retry, or the instance failed.
//
// Thread safety: the runner thread.
#pragma once

#include <string>

#include "action_log.hpp"
#include "context.hpp"
#include "placement.hpp"
#include "sites.hpp"
#include "slot_control.hpp"
#include "store.hpp"

namespace diaspora::runner {

class Lifecycle {
 public:
  Lifecycle(Context& ctx, InstanceStore& store, Sites& sites, ActionLog& actions)
      : ctx_(ctx), store_(store), sites_(sites), actions_(actions) {}
  /// The processes behind the slots (set once, before the first dispatch()).
  void set_control(SlotControl& control) { control_ = &control; }

  /// Instance `index` of task `task`: restored (--resume) or submitted now, its first
  /// attempt queued.
  void submit_instance(std::size_t task, long index);
  /// Queues a new attempt of instance ii (Instance::attempts numbering, queue order: see
  /// InstanceStore::queue_attempt). Returns its index.
  int queue(int ii, Attempt a) { return store_.queue_attempt(ii, std::move(a), ctx_.now()); }
  /// Submits a speculative copy (its own hook id) and queues it.
  int submit_copy(int ii, Attempt a);

  /// Places the queued attempts on free workers (placement) and starts them, in queue
  /// order; an attempt no feasible site has a worker for keeps its place. Nothing while
  /// the run is stopping.
  void dispatch(const Placement& placement);
  /// Marks attempt (ii, ai) running on `slot` now (what start() then carries out).
  void begin(int ii, int ai, Site& site, Slot& slot);
  /// The attempt starts running on `slot`: with `log` false the started hook; with `log`
  /// true the log line and the acknowledgement of the action that asked for it.
  void announce_start(int ii, int ai, Site& site, Slot& slot, bool log);

  /// The runner ends attempt (ii, ai): a queued one is withdrawn, a running one stopped on
  /// its slot (SlotControl::stop). Its outcome and reason are set; the plugin hears it
  /// failed (retryable, `report_failed`) or was cancelled.
  void stop(int ii, int ai, Outcome outcome, const std::string& reason, bool report_failed);
  /// Attempt (ii, ai) ended by itself: done (`ok`), failed, or its worker died (`lost`).
  /// lost: the worker died (not the task's own error); exit_code: a command's exit status
  /// (126 and 127 are never retried); own_error: the task failed by itself (an exit status
  /// != 0, a built-in kind's error): the default protection does not retry it.
  void ended(int ii, int ai, bool ok, const std::string& reason, bool lost = false, std::optional<int> exit_code = {},
             bool own_error = false);
  /// Instance ii is final (logged unless completed).
  void finish(int ii, InstanceState st, const std::string& reason);
  /// The baseline's retry: a new attempt while the instance has had fewer than 3, else it
  /// fails.
  void retry_as_baseline(int ii, const std::string& cause, const std::string& why);
  /// Instances that waited for the policies longer than --failure-grace fail.
  void awaiting_checks();
  /// Every instance not final is cancelled (the run was interrupted).
  void stop_everything(const std::string& why);

  /// A rehearsal job of instance ii is still checkpointing and stopping on some slot: its
  /// next attempt waits.
  bool draining(int ii) const;
  /// Could one of the spec's policies restart, migrate or copy this instance's task?
  /// Whether a policy (or the default retry) may start another attempt after `failed` failed.
  bool policy_can_recover(const Instance& inst, const Attempt& failed) const;

 private:
  void completed(int ii, int ai);

  Context& ctx_;
  InstanceStore& store_;
  Sites& sites_;
  ActionLog& actions_;
  SlotControl* control_ = nullptr;
};

}  // namespace diaspora::runner
