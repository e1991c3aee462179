// Placement (runner/src/placement.hpp) on in-memory state: which free worker each queued
// attempt gets, filter then score, at times the test sets.
#include "runner_rig.hpp"

namespace diaspora::runner::testing {
namespace {

TEST(RunnerPlacement, FirstAttemptsFillTheFasterSiteFirstThenSpreadByLoad) {
  Rig r(two_sites(3));
  r.submit();
  // fast scores 1.0, then 0.75 with one of its two busy (slow: 0.5); then it is full.
  EXPECT_EQ(r.running_on("fast"), 2);
  EXPECT_EQ(r.running_on("slow"), 1);
  EXPECT_EQ(r.control.count("start fast/"), 2);
  EXPECT_EQ(r.last("burn.0").site, "fast");
  // Each start is announced to the plugin with its worker, and logged.
  EXPECT_EQ(r.hooks.with("started burn.0 1 fast/worker-0").size(), 1u);
}

TEST(RunnerPlacement, NothingFreeMeansTheAttemptWaitsInTheQueue) {
  Rig r(two_sites(6));
  r.submit();
  EXPECT_EQ(r.running_on("fast") + r.running_on("slow"), 4);
  ASSERT_EQ(r.store.queue().size(), 2u);
  EXPECT_TRUE(r.store.attempt(r.store.queue().front().first, r.store.queue().front().second).queued());
}

TEST(RunnerPlacement, ASiteRunningATaskAtUnderHalfSpeedIsSkippedWhileAnotherRunsItWell) {
  Rig r(two_sites(1));
  Site& fast = *r.sites.find("fast");
  Site& slow = *r.sites.find("slow");
  r.clock.t = 10;
  // Recent step times: the fast site runs burn 4x slower than the slow one (a slowed site).
  for (int k = 0; k < 10; ++k) {
    Sites::observe_step_time(fast, "burn", 0.4, r.clock.t);
    Sites::observe_step_time(slow, "burn", 0.1, r.clock.t);
  }
  EXPECT_LT(r.placement.speed(fast, "burn", r.clock.t), 0.5);
  EXPECT_DOUBLE_EQ(r.placement.speed(slow, "burn", r.clock.t), 1.0);
  Instance inst;
  inst.id = "burn.0";
  Attempt a;
  const auto c = r.placement.choose(inst, a, r.clock.t);
  ASSERT_TRUE(c);
  EXPECT_EQ(c.site->name(), "slow");
  // 31 s later the measurements are stale: the declared speeds decide again.
  EXPECT_EQ(r.placement.choose(inst, a, r.clock.t + 31).site->name(), "fast");
}

TEST(RunnerPlacement, TheBaselineIgnoresObservedSpeedAndFailures) {
  RunOptions o;
  o.baseline_retry_after_s = 120;
  Rig r(two_sites(1), o);
  Site& fast = *r.sites.find("fast");
  for (int k = 0; k < 10; ++k) Sites::observe_step_time(fast, "burn", 1.0, 0);
  Sites::observe_step_time(*r.sites.find("slow"), "burn", 0.1, 0);
  Sites::add_penalty(fast, 5, 0);
  Instance inst;
  Attempt a;
  EXPECT_EQ(r.placement.choose(inst, a, 1).site->name(), "fast");
}

TEST(RunnerPlacement, RecentFailuresLowerASiteUntilTheyDecay) {
  Rig r(two_sites(1));
  Site& fast = *r.sites.find("fast");
  Sites::add_penalty(fast, 2, 0);  // score 1 / 3 < slow's 0.5
  Instance inst;
  Attempt a;
  EXPECT_EQ(r.placement.choose(inst, a, 1).site->name(), "slow");
  EXPECT_EQ(r.placement.choose(inst, a, 120).site->name(), "fast");  // 2 e^-2 = 0.27: 0.79 > 0.5
}

TEST(RunnerPlacement, PinnedAvoidedDrainedAndAllowedSitesFilterFirst) {
  Rig r(two_sites(1));
  Instance inst;
  Attempt pinned;
  pinned.pin_site = "slow";
  EXPECT_EQ(r.placement.choose(inst, pinned, 0).site->name(), "slow");
  Attempt avoid;
  avoid.avoid_site = "fast";
  EXPECT_EQ(r.placement.choose(inst, avoid, 0).site->name(), "slow");
  r.sites.find("slow")->drained = true;
  EXPECT_FALSE(r.placement.choose(inst, pinned, 0));  // pinned to a drained site: it waits
  EXPECT_FALSE(r.placement.choose(inst, avoid, 0));
  EXPECT_EQ(r.placement.choose(inst, Attempt{}, 0).site->name(), "fast");

  Rig only(two_sites(1) + "");
  only.spec.tasks[0].allowed_sites = {"slow"};
  EXPECT_EQ(only.placement.choose(inst, Attempt{}, 0).site->name(), "slow");
}

TEST(RunnerPlacement, PreferredSitesComeFirstWhileInGoodStanding) {
  Rig r(two_sites(1));
  r.spec.tasks[0].preferred_sites = {"slow"};
  Instance inst;
  EXPECT_EQ(r.placement.choose(inst, Attempt{}, 0).site->name(), "slow");
  Sites::add_penalty(*r.sites.find("slow"), 1, 0);  // 0.25 < half its declared 0.5
  EXPECT_EQ(r.placement.choose(inst, Attempt{}, 0).site->name(), "fast");
}

TEST(RunnerPlacement, AFailedInstanceAwaitingThePoliciesKeepsAWorkerOfItsSite) {
  Rig r("version: 1\nname: rig\nsites:\n  - {name: only, engine: local, workers: 2}\n"
        "tasks:\n  - {name: burn, kind: cpu-burn, args: {seconds: 5}, count: 3}\n" + kRestartPolicy);
  r.submit();
  ASSERT_EQ(r.running_on("only"), 2);
  const Attempt& first = r.last("burn.0");
  ASSERT_TRUE(first.live());
  // burn.0's worker dies: a policy may restart it, so it awaits and keeps that worker.
  Slot& slot = r.sites.find("only")->slots[static_cast<std::size_t>(first.slot)];
  slot.inst = slot.att = -1;
  r.lifecycle.ended(r.inst("burn.0"), 0, false, "worker died", true);
  EXPECT_EQ(r.store.at(r.inst("burn.0")).state, InstanceState::awaiting);
  EXPECT_EQ(r.store.reserved("only"), 1);
  r.dispatch();
  EXPECT_TRUE(r.last("burn.2").queued());  // a first attempt does not take the kept worker
  // The policy's restart (a recovering attempt) takes it.
  r.act(Rig::action(DIASPORA_ACTION_RESTART, "restart", "A1", "burn.0"));
  EXPECT_TRUE(r.last("burn.0").live());
  EXPECT_EQ(r.last("burn.0").number, 2);
  EXPECT_TRUE(r.last("burn.2").queued());
  EXPECT_EQ(r.hooks.with("action A1 done").size(), 1u);
}

TEST(RunnerPlacement, RecoveringAttemptsQueueBeforeFirstAttempts) {
  Rig r("version: 1\nname: rig\nsites:\n  - {name: only, engine: local, workers: 1}\n"
        "tasks:\n  - {name: sh, command: 'true', count: 2}\n");
  r.streams.start(r.store);
  // A recovering attempt of sh.1 goes before sh.0's and sh.1's first attempts.
  Attempt again;
  again.hook_id = "sh.1";
  r.lifecycle.queue(r.inst("sh.1"), again);
  const auto front = r.store.queue().front();
  EXPECT_EQ(r.store.attempt(front.first, front.second).hook_id, "sh.1");
  EXPECT_EQ(r.store.attempt(front.first, front.second).number, 2);
  EXPECT_EQ(r.store.at(r.inst("sh.1")).state, InstanceState::pending);
  r.dispatch();
  EXPECT_EQ(r.store.at(r.inst("sh.1")).attempts.back().site, "only");  // placed first
  EXPECT_TRUE(r.last("sh.0").queued());
}

}  // namespace
}  // namespace diaspora::runner::testing
