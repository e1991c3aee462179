// The action executor: carries out each action the plugin delivers (a policy's decision or
// an operator's request) on the run's state, and acknowledges it: at once when it is done
// or refused (with the reason), or when the attempt it asked for starts (restart, migrate,
// speculate) or the checkpoint is written. Refusals say what is wrong: a task or site this
// run does not have, an instance already final, a site drained or not allowed, a new
// attempt already waiting, an attempt that has moved since the decision.
//
// Thread safety: the runner thread.
#pragma once

#include <functional>

#include "diaspora/plugin.h"
#include "action_log.hpp"
#include "context.hpp"
#include "lifecycle.hpp"
#include "sites.hpp"
#include "slot_control.hpp"
#include "store.hpp"
#include "streams.hpp"

namespace diaspora::runner {

class ActionExecutor {
 public:
  ActionExecutor(Context& ctx, InstanceStore& store, Sites& sites, Lifecycle& lifecycle, ActionLog& log, SlotControl& control,
                 Streams& streams)
      : ctx_(ctx), store_(store), sites_(sites), lifecycle_(lifecycle), log_(log), control_(control), streams_(streams) {}

  /// Records action `a`, logs it and carries it out. `dispatch` places what it queued
  /// (a drain moves waiting attempts elsewhere at once).
  void handle(const diaspora_action& a, const std::function<void()>& dispatch);

 private:
  void carry_out(const diaspora_action& a, const std::function<void()>& dispatch);
  void restart_or_migrate(const diaspora_action& a, int ii, int ai);
  void speculate(const diaspora_action& a, int ii, int ai);
  void checkpoint(const diaspora_action& a, int ii, int ai);
  void drain(const diaspora_action& a, const std::function<void()>& dispatch);
  void ack(const std::string& id, bool ok, const std::string& message) { log_.acknowledge(id, ok, message); }

  Context& ctx_;
  InstanceStore& store_;
  Sites& sites_;
  Lifecycle& lifecycle_;
  ActionLog& log_;
  SlotControl& control_;
  Streams& streams_;
};

}  // namespace diaspora::runner
