// The action executor (runner/src/actions.hpp) on in-memory state: what each action does
// to the attempts, when it is acknowledged, and each refusal with its reason.
#include <algorithm>

#include "runner_rig.hpp"

namespace diaspora::runner::testing {
namespace {

TEST(RunnerActions, RestartStopsTheAttemptAndIsAcknowledgedWhenTheNewOneRuns) {
  Rig r(two_sites(1));
  r.submit();
  ASSERT_EQ(r.last("burn.0").site, "fast");
  r.clock.t = 3;
  r.act(Rig::action(DIASPORA_ACTION_RESTART, "restart", "A1", "burn.0", "", "fast"));
  const Instance& inst = r.store.at(r.inst("burn.0"));
  ASSERT_EQ(inst.attempts.size(), 2u);
  EXPECT_EQ(inst.attempts[0].outcome, Outcome::stopped);
  EXPECT_EQ(inst.attempts[0].reason, "stopped for restart (action A1)");
  EXPECT_EQ(r.control.count("stop fast/worker-0"), 1);
  // The policies hear the stopped attempt failed (retryable), then the new one start.
  EXPECT_EQ(r.hooks.with("failed burn.0 retryable: stopped for restart").size(), 1u);
  EXPECT_TRUE(inst.attempts[1].live());
  EXPECT_EQ(inst.attempts[1].number, 2);
  EXPECT_EQ(inst.attempts[1].cause, "restart (action A1, from fast)");
  EXPECT_EQ(r.hooks.with("action A1 done: attempt 2 of burn.0 running on").size(), 1u);
  EXPECT_EQ(r.actions.all().back().outcome, "done");
  EXPECT_DOUBLE_EQ(r.actions.all().back().done_t, 3);
}

TEST(RunnerActions, MigrateMovesTheAttemptToTheTargetAndPenalisesTheSourceSite) {
  Rig r(two_sites(1));
  r.submit();
  r.act(Rig::action(DIASPORA_ACTION_MIGRATE, "migrate", "M1", "burn.0", "slow", "fast"));
  EXPECT_EQ(r.last("burn.0").site, "slow");
  EXPECT_EQ(r.last("burn.0").pin_site, "slow");
  EXPECT_GT(Sites::penalty(*r.sites.find("fast"), 0), 0.9);
  EXPECT_EQ(r.hooks.with("action M1 done").size(), 1u);
}

TEST(RunnerActions, EachRefusalSaysWhy) {
  Rig r(two_sites(2));
  r.spec.tasks[0].allowed_sites = {"fast", "slow"};
  r.submit();
  struct Case {
    diaspora_action a;
    std::string says;
  };
  const std::vector<Case> cases = {
      {Rig::action(DIASPORA_ACTION_RESTART, "restart", "R1", "nope.3"), "no task instance 'nope.3' in this run"},
      {Rig::action(DIASPORA_ACTION_MIGRATE, "migrate", "R2", "burn.0", "mars"), "no site 'mars' in this run"},
      {Rig::action(DIASPORA_ACTION_RESTART, "restart", "R3", "burn.0", "", "slow"),
       "burn.0 is no longer on slow (attempt 1 runs on fast)"},
      {Rig::action(DIASPORA_ACTION_SPECULATE, "speculate", "R4", "burn.0@copy9"), "no attempt of 'burn.0@copy9'"},
      {Rig::action(DIASPORA_ACTION_DRAIN, "drain", "R5", ""), "a drain names the site ('site')"},
      {Rig::action(77, "teleport", "R6", "burn.0"), "unknown action kind teleport"},
  };
  for (const auto& c : cases) {
    r.act(c.a);
    EXPECT_EQ(r.hooks.calls.back(), "action " + std::string(c.a.id) + " failed: " + c.says);
  }
  EXPECT_TRUE(r.last("burn.0").live());  // nothing was stopped by a refused action
  EXPECT_EQ(r.control.count("stop"), 0);
  r.sites.find("slow")->drained = true;
  r.act(Rig::action(DIASPORA_ACTION_MIGRATE, "migrate", "R7", "burn.0", "slow"));
  EXPECT_EQ(r.hooks.calls.back(), "action R7 failed: site 'slow' is drained (an operator's drain; undrain it first)");
  r.spec.tasks[0].allowed_sites = {"fast"};
  r.sites.find("slow")->drained = false;
  r.act(Rig::action(DIASPORA_ACTION_MIGRATE, "migrate", "R8", "burn.0", "slow"));
  EXPECT_EQ(r.hooks.calls.back(), "action R8 failed: site 'slow' is not in burn's allowed_sites");
  r.ctx.stopping = true;
  r.act(Rig::action(DIASPORA_ACTION_RESTART, "restart", "R9", "burn.0"));
  EXPECT_EQ(r.hooks.calls.back(), "action R9 failed: the run is stopping");
}

TEST(RunnerActions, ASecondRestartWhileANewAttemptWaitsIsNotNeeded) {
  Rig r("version: 1\nname: rig\nsites:\n  - {name: only, engine: local, workers: 1}\n"
        "tasks:\n  - {name: burn, kind: cpu-burn, args: {seconds: 5}, count: 2}\n");
  r.submit();  // burn.0 runs, burn.1 waits
  r.sites.find("only")->slots[0].ready = false;  // its worker is being replaced: nothing is free
  r.act(Rig::action(DIASPORA_ACTION_RESTART, "restart", "A1", "burn.0"));
  ASSERT_TRUE(r.last("burn.0").queued());
  r.act(Rig::action(DIASPORA_ACTION_RESTART, "restart", "A2", "burn.0"));
  EXPECT_EQ(r.hooks.calls.back(), "action A2 failed: not needed: a new attempt of burn.0 is already waiting for a worker");
  // A migrate replaces the waiting attempt.
  r.act(Rig::action(DIASPORA_ACTION_MIGRATE, "migrate", "A3", "burn.0", "only"));
  const auto& atts = r.store.at(r.inst("burn.0")).attempts;
  ASSERT_EQ(atts.size(), 3u);
  EXPECT_EQ(atts[1].outcome, Outcome::cancelled);
  EXPECT_EQ(atts[1].reason, "replaced by action A3");
  EXPECT_TRUE(atts[2].queued());
  // The recovering attempt goes first when the worker is back.
  r.sites.find("only")->slots[0].ready = true;
  r.dispatch();
  EXPECT_TRUE(r.last("burn.0").live());
  EXPECT_TRUE(r.last("burn.1").queued());
  EXPECT_EQ(r.hooks.with("action A1").size(), 0u);  // the replaced attempt's action never ran
  EXPECT_EQ(r.hooks.with("action A3 done").size(), 1u);
}

TEST(RunnerActions, SpeculateStartsACopyElsewhereAndTheFirstToFinishWins) {
  Rig r(two_sites(1));
  r.submit();
  r.act(Rig::action(DIASPORA_ACTION_SPECULATE, "speculate", "S1", "burn.0"));
  const int ii = r.inst("burn.0");
  const Instance& inst = r.store.at(ii);
  ASSERT_EQ(inst.attempts.size(), 2u);
  EXPECT_EQ(inst.attempts[1].hook_id, "burn.0@copy1");
  EXPECT_EQ(inst.attempts[1].site, "slow");  // avoids the copied attempt's site
  EXPECT_EQ(r.hooks.with("submitted burn.0@copy1").size(), 1u);
  EXPECT_TRUE(inst.attempts[0].live());
  // The copy finishes first: the original is cancelled, the instance completed.
  Slot& slot = r.sites.find("slow")->slots[static_cast<std::size_t>(inst.attempts[1].slot)];
  slot.inst = slot.att = -1;
  r.lifecycle.ended(ii, 1, true, "");
  EXPECT_EQ(inst.state, InstanceState::completed);
  EXPECT_EQ(inst.attempts[0].outcome, Outcome::cancelled);
  EXPECT_EQ(inst.attempts[0].reason, "burn.0@copy1 attempt 1 finished first");
  EXPECT_EQ(r.control.count("stop fast/worker-0"), 1);
  EXPECT_EQ(r.store.open(), 0);
}

TEST(RunnerActions, CancelEndsTheInstanceAndCheckpointAsksTheWorker) {
  Rig r(two_sites(2));
  r.submit();
  r.act(Rig::action(DIASPORA_ACTION_CHECKPOINT, "checkpoint", "C1", "burn.1"));
  EXPECT_EQ(r.control.count("checkpoint"), 1);
  const Attempt& a = r.last("burn.1");
  EXPECT_EQ(r.sites.find(a.site)->slots[static_cast<std::size_t>(a.slot)].pending_checkpoint, "C1");
  EXPECT_EQ(r.hooks.with("action C1").size(), 0u);  // acknowledged on the worker's "checkpointed"
  r.act(Rig::action(DIASPORA_ACTION_CANCEL, "cancel", "X1", "burn.0"));
  EXPECT_EQ(r.store.at(r.inst("burn.0")).state, InstanceState::cancelled);
  EXPECT_EQ(r.hooks.calls.back(), "action X1 done: burn.0 cancelled");
  r.act(Rig::action(DIASPORA_ACTION_RESTART, "restart", "X2", "burn.0"));
  EXPECT_EQ(r.hooks.calls.back(), "action X2 failed: burn.0 already cancelled");
}

TEST(RunnerActions, DrainMovesWaitingAttemptsAndStartsNothingNewThere) {
  Rig r(two_sites(6));
  r.submit();  // 4 running, 2 waiting
  r.store.attempt(r.store.queue().front().first, r.store.queue().front().second).pin_site = "slow";
  r.act(Rig::action(DIASPORA_ACTION_DRAIN, "drain", "D1", "", "", "slow"));
  EXPECT_EQ(r.hooks.calls.back(),
            "action D1 done: site 'slow' drained: nothing new starts there; 2 running attempt(s) finish there, 1 waiting "
            "one(s) placed elsewhere");
  // A worker frees up on slow: nothing starts there.
  Slot& s0 = r.sites.find("slow")->slots[0];
  const int ii = s0.inst, ai = s0.att;
  s0.inst = s0.att = -1;
  r.lifecycle.ended(ii, ai, true, "");
  r.dispatch();
  EXPECT_EQ(r.running_on("slow"), 1);
  EXPECT_EQ(r.store.queue().size(), 2u);
  r.act(Rig::action(DIASPORA_ACTION_DRAIN, "drain", "D2", "", "", "slow"));
  EXPECT_EQ(r.hooks.calls.back(), "action D2 done: site 'slow' was already drained");
  r.act(Rig::action(DIASPORA_ACTION_UNDRAIN, "undrain", "D3", "", "", "slow"));
  EXPECT_EQ(r.running_on("slow"), 2);
}

TEST(RunnerActions, ThrottleHalvesTheStreamRateDownToASixteenth) {
  Rig r(two_sites(1));
  for (double want : {0.5, 0.25, 0.125, 0.0625, 0.0625}) {
    r.act(Rig::action(DIASPORA_ACTION_THROTTLE, "throttle", "T", ""));
    EXPECT_EQ(r.hooks.calls.back(), "action T done: new instances at " + std::to_string(static_cast<int>(want * 100)) +
                                        " % of their rate for 60 s");
  }
}

// docs/run.md: a throttle halves a stream's rate for 60 s, then the stream goes back to its
// full rate (and says so).
TEST(RunnerActions, AThrottleEndsAfterSixtySeconds) {
  Rig r("version: 1\nname: rig\nsites:\n  - {name: fast, engine: local, workers: 2}\n"
        "tasks:\n  - {name: flow, kind: sleep, args: {seconds: 0.1}, rate: 4, duration: 300s}\n");
  r.submit();
  auto made_by = [&](double t) {
    r.clock.t = t;
    r.streams.tick();
    return r.store.size();
  };
  const int at10 = made_by(10);
  r.act(Rig::action(DIASPORA_ACTION_THROTTLE, "throttle", "T", ""));
  EXPECT_EQ(std::count(r.hooks.calls.begin(), r.hooks.calls.end(), "action T done: new instances at 50 % of their rate for 60 s"),
            1);
  const int at70 = made_by(69.9);
  EXPECT_NEAR(at70 - at10, 120, 2);  // 2 a second while throttled
  EXPECT_EQ(std::count(r.log.begin(), r.log.end(), "throttle over: new instances at the full rate again"), 0);
  const int at100 = made_by(100);
  EXPECT_NEAR(at100 - at70, 120, 2);  // 4 a second again
  EXPECT_EQ(std::count(r.log.begin(), r.log.end(), "throttle over: new instances at the full rate again"), 1);
}

TEST(RunnerLifecycle, AFailureWaitsForThePoliciesThenFailsAfterTheGrace) {
  RunOptions o;
  o.failure_grace_s = 10;
  Rig r(two_sites(1, kRestartPolicy), o);
  r.submit();
  const int ii = r.inst("burn.0");
  Slot& slot = r.sites.find("fast")->slots[0];
  slot.inst = slot.att = -1;
  r.lifecycle.ended(ii, 0, false, "exit status 1");
  EXPECT_EQ(r.store.at(ii).state, InstanceState::awaiting);
  // Not retryable: the runner does not retry it itself, the policies may.
  EXPECT_EQ(r.hooks.calls.back(), "failed burn.0: exit status 1");
  r.clock.t = 9.9;
  r.lifecycle.awaiting_checks();
  EXPECT_EQ(r.store.at(ii).state, InstanceState::awaiting);
  r.clock.t = 10;
  r.lifecycle.awaiting_checks();
  EXPECT_EQ(r.store.at(ii).state, InstanceState::failed);
  EXPECT_EQ(r.store.at(ii).reason, "exit status 1 (no policy restarted it within 10 s)");
}

TEST(RunnerLifecycle, TheDefaultRetryWaitsForThreeLostAttemptsButNeverForTheTasksOwnError) {
  Rig r(two_sites(2));  // no policies, defaults: on
  r.submit();
  const int ii = r.inst("burn.0");
  for (int k = 0; k < 4; ++k) {
    Attempt& a = r.store.attempt(ii, static_cast<int>(r.store.at(ii).attempts.size()) - 1);
    if (a.live()) {
      Slot& slot = r.sites.find(a.site)->slots[static_cast<std::size_t>(a.slot)];
      slot.inst = slot.att = -1;
    }
    r.lifecycle.ended(ii, static_cast<int>(r.store.at(ii).attempts.size()) - 1, false, "worker died (killed by signal 9)");
    if (k < 3) {
      EXPECT_EQ(r.store.at(ii).state, InstanceState::awaiting) << k;
      Attempt n;  // what default-retry's restart queues
      n.hook_id = "burn.0";
      r.lifecycle.queue(ii, std::move(n));
      r.dispatch();
    }
  }
  EXPECT_EQ(r.store.at(ii).attempts.size(), 4u);
  EXPECT_EQ(r.store.at(ii).state, InstanceState::failed);  // the default budget is spent: no grace wait
  const int jj = r.inst("burn.1");
  Slot& slot = r.sites.find(r.last("burn.1").site)->slots[static_cast<std::size_t>(r.last("burn.1").slot)];
  slot.inst = slot.att = -1;
  r.lifecycle.ended(jj, 0, false, "command exit status 127 (command not found?)", false, 127);
  EXPECT_EQ(r.store.at(jj).state, InstanceState::failed);
  EXPECT_EQ(r.hooks.calls.back(), "failed burn.1: command exit status 127 (command not found?)");
  // The task's own error (exit status 1): the default does not retry it either.
  Rig e(two_sites(1));
  e.submit();
  Slot& s1 = e.sites.find(e.last("burn.0").site)->slots[static_cast<std::size_t>(e.last("burn.0").slot)];
  s1.inst = s1.att = -1;
  e.lifecycle.ended(e.inst("burn.0"), 0, false, "command exit status 1", false, 1);
  EXPECT_EQ(e.store.at(e.inst("burn.0")).state, InstanceState::failed);
}

TEST(RunnerLifecycle, WithoutARecoveringPolicyAFailureIsFinalAndTheBaselineRetriesThreeTimes) {
  Rig none(two_sites(1, "defaults: off\n"));
  none.submit();
  none.sites.find("fast")->slots[0].inst = -1;
  none.lifecycle.ended(none.inst("burn.0"), 0, false, "boom");
  EXPECT_EQ(none.store.at(none.inst("burn.0")).state, InstanceState::failed);
  EXPECT_EQ(none.hooks.calls.back(), "failed burn.0: boom");  // not retryable

  RunOptions o;
  o.baseline_retry_after_s = 120;
  Rig b(two_sites(1), o);
  b.submit();
  const int ii = b.inst("burn.0");
  for (int k = 0; k < 3; ++k) {
    const Attempt& a = b.last("burn.0");
    ASSERT_TRUE(a.live()) << k;
    Slot& slot = b.sites.find(a.site)->slots[static_cast<std::size_t>(a.slot)];
    slot.inst = slot.att = -1;
    b.lifecycle.ended(ii, k, false, "boom");
    b.dispatch();
  }
  EXPECT_EQ(b.store.at(ii).attempts.size(), 3u);
  EXPECT_EQ(b.store.at(ii).state, InstanceState::failed);
  EXPECT_EQ(b.store.at(ii).reason, "boom (3 attempts)");
}

}  // namespace
}  // namespace diaspora::runner::testing
