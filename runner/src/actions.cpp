#include "actions.hpp"

#include <algorithm>

namespace diaspora::runner {

void ActionExecutor::handle(const diaspora_action& a, const std::function<void()>& dispatch) {
  ActionRecord rec;
  rec.id = a.id;
  rec.kind = a.kind_name;
  rec.task = a.task_id;
  rec.site = a.site;
  rec.target = a.target_site;
  rec.reason = a.reason;
  rec.origin = a.origin;
  rec.received_t = ctx_.now();
  const ActionRecord& r = log_.add(std::move(rec));
  ctx_.say("action " + r.kind + (r.task.empty() ? "" : " " + r.task) + (r.target.empty() ? "" : " -> " + r.target) + " (" +
           r.origin + "): " + r.reason);
  carry_out(a, dispatch);
}

void ActionExecutor::carry_out(const diaspora_action& a, const std::function<void()>& dispatch) {
  if (ctx_.stopping) return ack(a.id, false, "the run is stopping");
  if (a.kind == DIASPORA_ACTION_DRAIN || a.kind == DIASPORA_ACTION_UNDRAIN) return drain(a, dispatch);
  if (a.kind == DIASPORA_ACTION_THROTTLE) {
    const double now_at = streams_.throttle();
    return ack(a.id, true, "new instances at " + std::to_string(static_cast<int>(now_at * 100)) + " % of their rate for 60 s");
  }
  int ai = -1;
  const int ii = store_.find(a.task_id, &ai);
  if (ii < 0) return ack(a.id, false, "no task instance '" + std::string(a.task_id) + "' in this run");
  const Instance& inst = store_.at(ii);
  if (inst.state == InstanceState::completed || inst.state == InstanceState::cancelled)
    return ack(a.id, false, inst.id + " already " + std::string(to_string(inst.state)));
  if (ai < 0) return ack(a.id, false, "no attempt of '" + std::string(a.task_id) + "'");
  switch (a.kind) {
    case DIASPORA_ACTION_RESTART:
    case DIASPORA_ACTION_MIGRATE: return restart_or_migrate(a, ii, ai);
    case DIASPORA_ACTION_SPECULATE: return speculate(a, ii, ai);
    case DIASPORA_ACTION_CHECKPOINT: return checkpoint(a, ii, ai);
    case DIASPORA_ACTION_CANCEL: {
      for (int k = 0; k < static_cast<int>(inst.attempts.size()); ++k)
        lifecycle_.stop(ii, k, Outcome::cancelled, std::string("cancelled by action ") + a.id, false);
      lifecycle_.finish(ii, InstanceState::cancelled, std::string("cancelled by action ") + a.id + ": " + a.reason);
      return ack(a.id, true, inst.id + " cancelled");
    }
    default: return ack(a.id, false, "unknown action kind " + std::string(a.kind_name));
  }
}

void ActionExecutor::restart_or_migrate(const diaspora_action& a, int ii, int ai) {
  const bool migrate = a.kind == DIASPORA_ACTION_MIGRATE;
  const Instance& inst = store_.at(ii);
  const TaskSpec& ts = ctx_.task(inst.task);
  const std::string target = migrate ? std::string(a.target_site) : std::string();
  if (migrate) {
    const Site* t = sites_.find(target);
    if (!t) return ack(a.id, false, "no site '" + target + "' in this run");
    if (t->drained) return ack(a.id, false, "site '" + target + "' is drained (an operator's drain; undrain it first)");
    if (t->remote() && !ts.kind)
      return ack(a.id, false, "site '" + target + "' (engine: " + std::string(to_string(t->spec->engine)) +
                                  ") runs built-in kinds only, not " + ts.name);
    if (!ts.allowed_sites.empty() && std::find(ts.allowed_sites.begin(), ts.allowed_sites.end(), target) == ts.allowed_sites.end())
      return ack(a.id, false, "site '" + target + "' is not in " + ts.name + "'s allowed_sites");
  }
  const Attempt& cur = store_.attempt(ii, ai);
  const std::string hook_id = cur.hook_id;
  bool queued_one = false;
  for (const auto& x : inst.attempts) queued_one |= x.hook_id == hook_id && x.queued();
  if (queued_one && !migrate)  // e.g. a second policy reacting to the same trouble
    return ack(a.id, false, "not needed: a new attempt of " + hook_id + " is already waiting for a worker");
  const std::string from = cur.site;
  if (cur.live() && a.site[0] != '\0' && from != a.site)  // decided on an attempt that has moved since
    return ack(a.id, false, hook_id + " is no longer on " + a.site + " (attempt " + std::to_string(cur.number) + " runs on " +
                                from + ")");
  if (cur.live()) {
    if (Site* s = sites_.find(from); s && migrate) Sites::add_penalty(*s, 1.0, ctx_.now());
    lifecycle_.stop(ii, ai, Outcome::stopped,
                    std::string("stopped for ") + (migrate ? "migration to " + target : "restart") + " (action " + a.id + ")", true);
  }
  for (int k = 0; k < static_cast<int>(inst.attempts.size()); ++k)  // a migrate replaces a waiting attempt
    if (inst.attempts[static_cast<std::size_t>(k)].hook_id == hook_id && inst.attempts[static_cast<std::size_t>(k)].queued())
      lifecycle_.stop(ii, k, Outcome::cancelled, "replaced by action " + std::string(a.id), false);
  Attempt n;
  n.hook_id = hook_id;
  n.speculative = store_.attempt(ii, ai).speculative;
  n.pin_site = target;
  n.action_id = a.id;
  n.cause = std::string(a.kind_name) + " (action " + a.id + (from.empty() ? "" : ", from " + from) + ")";
  lifecycle_.queue(ii, std::move(n));  // acknowledged when the new attempt starts
}

void ActionExecutor::speculate(const diaspora_action& a, int ii, int ai) {
  Instance& inst = store_.at(ii);
  if (inst.state != InstanceState::running)
    return ack(a.id, false, inst.id + " is not running (" + std::string(to_string(inst.state)) + ")");
  if (ctx_.is_job(inst.task))
    return ack(a.id, false, "a rehearsal job is not copied (two trainers would share its checkpoints); migrate it instead");
  Attempt n;
  n.hook_id = inst.id + "@copy" + std::to_string(++inst.copies);
  n.speculative = true;
  n.pin_site = a.target_site;
  if (n.pin_site.empty()) n.avoid_site = store_.attempt(ii, ai).site;
  n.action_id = a.id;
  n.cause = std::string("speculate (action ") + a.id + ")";
  lifecycle_.submit_copy(ii, std::move(n));  // acknowledged when the copy starts
}

void ActionExecutor::checkpoint(const diaspora_action& a, int ii, int ai) {
  const Attempt& cur = store_.attempt(ii, ai);
  if (!cur.live()) return ack(a.id, false, cur.hook_id + " is not running");
  Site* s = sites_.find(cur.site);
  Slot& slot = s->slots[static_cast<std::size_t>(cur.slot)];
  if (slot.cmd_pid > 0 && ctx_.is_job(store_.at(ii).task) && cur.step <= 0 && cur.progress <= 0)
    return ack(a.id, false, cur.hook_id + " has not started training yet (nothing to checkpoint)");
  if (slot.cmd_pid > 0) {
    control_.request_checkpoint(*s, slot);
    return ack(a.id, true, "SIGUSR1 sent to the command's process group");
  }
  slot.pending_checkpoint = a.id;
  if (!control_.request_checkpoint(*s, slot)) {
    slot.pending_checkpoint.clear();
    return ack(a.id, false, "the worker is gone");
  }
  // acknowledged on "checkpointed"
}

// drain: nothing new starts on the site (attempts running there finish; waiting attempts
// pinned to it are placed elsewhere); undrain: it takes new work again.
void ActionExecutor::drain(const diaspora_action& a, const std::function<void()>& dispatch) {
  const bool drain = a.kind == DIASPORA_ACTION_DRAIN;
  const std::string name = a.site[0] != '\0' ? a.site : a.target_site;
  if (name.empty()) return ack(a.id, false, std::string("a ") + a.kind_name + " names the site ('site')");
  Site* s = sites_.find(name);
  if (!s) return ack(a.id, false, "no site '" + name + "' in this run");
  if (s->drained == drain) return ack(a.id, true, "site '" + name + "' was already " + (drain ? "drained" : "taking work"));
  s->drained = drain;
  const long running = s->busy();
  long moved = 0;
  if (drain)
    for (auto [ii, ai] : store_.queue()) {
      Attempt& q = store_.attempt(ii, ai);
      if (q.queued() && q.pin_site == name) {
        q.pin_site.clear();
        q.avoid_site = name;
        ++moved;
      }
    }
  dispatch();
  return ack(a.id, true,
             drain ? "site '" + name + "' drained: nothing new starts there; " + std::to_string(running) +
                         " running attempt(s) finish there" + (moved ? ", " + std::to_string(moved) + " waiting one(s) placed elsewhere" : "")
                   : "site '" + name + "' takes new work again");
}

}  // namespace diaspora::runner
