// The fault injector (runner/src/faults.hpp) on in-memory state: each fault at its time,
// what it hits, the slow-site duty cycle, the stop-relay fault's restart.
#include "runner_rig.hpp"

namespace diaspora::runner::testing {
namespace {

std::string with_faults(const std::string& faults, int count = 3) { return two_sites(count, "faults:\n" + faults); }

TEST(RunnerFaults, SlowSiteRunsADutyCycleForItsTimeAndRecordsWhatItHit) {
  Rig r(with_faults("  - {at: 2s, kind: slow-site, site: fast, factor: 4, for: 1s}\n"));
  FaultInjector f(r.ctx, r.store, r.sites, r.control, nullptr);
  r.submit();
  r.clock.t = 1.9;
  f.tick();
  EXPECT_EQ(f.all()[0].start_t, -1);
  r.clock.t = 2;
  f.tick();
  const Fault& x = f.all()[0];
  EXPECT_DOUBLE_EQ(x.start_t, 2);
  EXPECT_DOUBLE_EQ(x.end_t, 3);
  EXPECT_EQ(x.target, "fast");
  EXPECT_EQ(x.hit.size(), 2u);  // the two attempts running on fast
  EXPECT_EQ(r.hooks.with("resource fast degraded").size(), 1u);
  // Stopped 75 ms, running 25 ms of each 100 ms: a quarter of the time.
  f.duty_cycle();
  EXPECT_EQ(r.control.count("pause fast/"), 2);
  EXPECT_NEAR(f.next_toggle(1), 0.075, 1e-9);
  r.clock.t = 2.075;
  f.duty_cycle();
  EXPECT_EQ(r.control.count("resume fast/"), 2);
  EXPECT_NEAR(f.next_toggle(1), 0.025, 1e-9);
  EXPECT_EQ(r.control.count("pause slow/"), 0);
  r.clock.t = 3;
  f.tick();
  f.duty_cycle();
  EXPECT_TRUE(f.all()[0].done);
  EXPECT_EQ(r.hooks.with("resource fast up").size(), 1u);
  EXPECT_FALSE(r.sites.find("fast")->stopped_phase);
  const long pauses = r.control.count("pause");
  r.clock.t = 4;
  f.duty_cycle();
  EXPECT_EQ(r.control.count("pause"), pauses);  // over
}

TEST(RunnerFaults, KillWorkerHitsTheOldestRunningAttemptOnItsSite) {
  Rig r(with_faults("  - {at: 5s, kind: kill-worker, site: fast}\n  - {at: 6s, kind: kill-worker, site: slow}\n", 2));
  FaultInjector f(r.ctx, r.store, r.sites, r.control, nullptr);
  r.submit();  // burn.0 on fast/worker-0 at t=0, burn.1 on fast/worker-1
  r.store.attempt(r.inst("burn.1"), 0).start_t = -0.5;  // burn.1 started first
  r.clock.t = 5;
  f.tick();
  EXPECT_EQ(r.control.calls.back(), "kill fast/worker-1");
  EXPECT_EQ(f.all()[0].target, "burn.1 on fast/worker-1");
  ASSERT_EQ(f.all()[0].hit.size(), 1u);
  EXPECT_EQ(f.all()[0].hit[0].second, 1u);  // the attempts burn.1 had then
  EXPECT_EQ(r.hooks.with("resource fast/worker-1 down").size(), 1u);
  r.clock.t = 6;
  f.tick();  // nothing runs on slow: armed, not done
  EXPECT_TRUE(f.all()[1].armed);
  EXPECT_FALSE(f.all()[1].done);
  EXPECT_EQ(f.all()[1].start_t, -1);
  EXPECT_EQ(r.control.count("kill"), 1);
  f.end_all();  // the run ended with nothing on slow
  EXPECT_EQ(f.all()[1].note, "nothing ran there after its time: no effect");
  EXPECT_TRUE(f.all()[1].done);
  EXPECT_EQ(r.control.count("kill"), 1);
}

TEST(RunnerFaults, KillWorkerDueBeforeAnythingRunsThereHitsTheFirstAttemptThatDoes) {
  // A slow machine (or an engine's queue) may not have an attempt running on the site at
  // the fault's time: the fault waits for one instead of passing with no effect.
  Rig r(with_faults("  - {at: 1s, kind: kill-worker, site: fast}\n", 2));
  FaultInjector f(r.ctx, r.store, r.sites, r.control, nullptr);
  r.clock.t = 1;
  f.tick();  // nothing submitted yet
  EXPECT_TRUE(f.all()[0].armed);
  EXPECT_EQ(r.control.count("kill"), 0);
  r.clock.t = 1.5;
  f.tick();
  EXPECT_EQ(r.control.count("kill"), 0);
  r.submit();
  r.clock.t = 2.5;
  f.tick();
  EXPECT_EQ(r.control.count("kill"), 1);
  EXPECT_FALSE(f.all()[0].armed);
  EXPECT_TRUE(f.all()[0].done);
  EXPECT_DOUBLE_EQ(f.all()[0].start_t, 2.5);  // reaction times count from when it hit
  EXPECT_EQ(f.all()[0].hit.size(), 1u);
  EXPECT_TRUE(f.all()[0].note.empty());
  r.clock.t = 3;
  f.tick();
  EXPECT_EQ(r.control.count("kill"), 1);  // once
}

TEST(RunnerFaults, HangTaskPicksAnInstanceOfItsTaskAndStoppingRunsNoFault) {
  Rig r(with_faults("  - {at: 1s, kind: hang-task, task: burn}\n  - {at: 2s, kind: kill-worker, site: fast}\n"));
  FaultInjector f(r.ctx, r.store, r.sites, r.control, nullptr);
  r.submit();
  r.clock.t = 1;
  f.tick();
  EXPECT_EQ(r.control.count("hang "), 1);
  EXPECT_EQ(r.hooks.with("resource").size(), 1u);
  r.ctx.stopping = true;
  r.clock.t = 2;
  f.tick();
  EXPECT_EQ(f.all()[1].start_t, -1);  // the run is stopping: no new fault
}

TEST(RunnerFaults, StopRelayStopsWithoutWaitingAndStartsAgainWhenTheStopHasFinished) {
  Rig r(with_faults("  - {at: 1s, kind: stop-relay, for: 2s}\n", 1));
  FakeRelay relay;
  relay.stop_ticks = 2;  // the stop takes a while: two tries fail
  FaultInjector f(r.ctx, r.store, r.sites, r.control, &relay);
  r.clock.t = 1;
  f.tick();
  EXPECT_EQ(relay.stops, 1);
  EXPECT_FALSE(relay.running());
  EXPECT_EQ(r.hooks.with("resource relay down").size(), 1u);
  r.clock.t = 3;
  f.tick();  // due, but the stop has not finished: tried again 0.2 s later
  EXPECT_FALSE(f.all()[0].done);
  EXPECT_NEAR(f.all()[0].end_t, 3.2, 1e-9);
  r.clock.t = f.all()[0].end_t;
  f.tick();
  EXPECT_FALSE(f.all()[0].done);
  r.clock.t = f.all()[0].end_t;
  f.tick();
  EXPECT_TRUE(f.all()[0].done);
  EXPECT_TRUE(relay.running());
  EXPECT_EQ(r.hooks.with("resource relay up").size(), 1u);

  Rig none(with_faults("  - {at: 1s, kind: stop-relay, for: 2s}\n", 1));
  FaultInjector g(none.ctx, none.store, none.sites, none.control, nullptr);
  none.clock.t = 1;
  g.tick();
  EXPECT_EQ(g.all()[0].note, "the relay is not embedded: no effect");
}

}  // namespace
}  // namespace diaspora::runner::testing
