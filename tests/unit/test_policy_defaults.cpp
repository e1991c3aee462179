// The default protection set and the task's normal (diaspora/policy.hpp, docs/anomaly.md
// "Default protection"), on a simulated clock: specs with no policies retry a failed
// attempt off a suspect site, never retry an exit 127, ignore what an action itself caused,
// move work off a slowed site within a few steps, and do nothing on a noisy fault-free run.
#include <gtest/gtest.h>

#include <boost/json.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "diaspora/error.hpp"
#include "diaspora/policy.hpp"
#include "diaspora/spec.hpp"
#include "test_helpers.hpp"

namespace res = diaspora::resilience;
using diaspora::WorkflowSpec;

namespace {

WorkflowSpec spec_of(const std::string& yaml) { return diaspora::parse_spec_string(yaml, "defaults.yaml"); }

std::string two_sites(const std::string& extra = {}, const std::string& far_speed = "1") {
  return "version: 1\nname: d\nsites:\n  - {name: near, engine: local, workers: 2}\n  - {name: far, engine: local, workers: 2, speed: " + far_speed +
         "}\ntasks:\n  - {name: burn, kind: cpu-burn, count: 4, preferred_sites: [near]}\n" + extra;
}

std::string dump(const std::vector<res::Decision>& ds) {
  std::string s;
  for (const auto& d : ds) s += d.action + " " + d.task_id + " -> " + d.target_site + " t=" + std::to_string(d.time_s) + ": " + d.reason + "\n";
  return s;
}

/// Uniform (in (0, 1)) and log-normal noise, deterministic.
struct Noise {
  diaspora::test::Rng rng;
  double uniform() { return rng.next() + 0x1.0p-54; }  // never 0: log() below
  double lognormal(double sigma) {
    const double u1 = uniform(), u2 = uniform();
    return std::exp(sigma * std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
};

/// Tasks stepping on sites: each step reports task.step_time and a heartbeat. `slow(site,
/// t)` multiplies a step's time. A migrate/restart decision starts a new attempt at once.
struct Sim {
  explicit Sim(res::PolicyEngine& e) : eng(e) {}
  struct Task {
    std::string id, site;
    double next = 0;
    int steps = 0;
  };
  res::PolicyEngine& eng;
  std::vector<Task> tasks;
  double base = 0.5, sigma = 0.05;
  bool uniform = false;  // steps uniform in [0.2, 1.8] x base instead of log-normal
  std::function<double(const std::string&, double)> slow = [](const std::string&, double) { return 1.0; };
  std::function<double(const std::string&)> site_factor = [](const std::string&) { return 1.0; };
  std::function<double(const std::string&, double)> slow_task = [](const std::string&, double) { return 1.0; };
  Noise noise{7};
  std::vector<res::Decision> out;

  void start(const std::string& id, const std::string& site, double t) {
    tasks.push_back({id, site, t, 0});
    eng.task_started(id, site, t, std::nullopt);
  }
  void run(double until, int max_steps) {
    for (double t = 0; t <= until; t += 0.05) {
      for (auto& k : tasks) {
        if (k.steps >= max_steps || t < k.next) continue;
        const double v = base * site_factor(k.site) * slow(k.site, t) * slow_task(k.id, t) *
                         (uniform ? 0.2 + 1.6 * noise.uniform() : noise.lognormal(sigma));
        k.next = t + v;
        if (++k.steps == max_steps) {  // its last step: done
          eng.task_finished(k.id, t + v);
          continue;
        }
        eng.heartbeat(k.id, k.site, t);
        const std::size_t before = out.size();
        eng.observe({k.id, k.site, "task.step_time", v, t}, out);
        for (std::size_t i = before; i < out.size(); ++i)
          if (out[i].action == "migrate" || out[i].action == "restart") {
            auto& d = out[i];
            for (auto& m : tasks)
              if (m.id == d.task_id) {
                m.site = d.target_site;
                m.next = t + 0.2;
                eng.task_started(m.id, m.site, t + 0.2, std::nullopt);
              }
          }
      }
      eng.tick(t, out);
    }
  }
};

int count(const std::vector<res::Decision>& ds, const std::string& action, const std::string& policy = {}) {
  int n = 0;
  for (const auto& d : ds) n += d.action == action && (policy.empty() || d.policy == policy);
  return n;
}

// ---- failures -------------------------------------------------------------------------------

TEST(PolicyDefaults, AFailedAttemptIsRetriedOffItsSiteWithNoPolicyWritten) {
  res::PolicyEngine eng(spec_of(two_sites()));
  EXPECT_EQ(eng.policy_count(), 4u);  // default-retry, default-revive, default-slow, default-deadline
  std::vector<res::Decision> out;
  eng.task_started("burn.0", "near", 0, std::nullopt);
  eng.task_failed("burn.0", "near", 2, {}, out);
  ASSERT_EQ(out.size(), 1u) << dump(out);
  EXPECT_EQ(out[0].policy, "default-retry");
  EXPECT_EQ(out[0].action, "migrate") << out[0].reason;  // near just failed it: suspect
  EXPECT_EQ(out[0].target_site, "far");
  EXPECT_NE(out[0].reason.find("restart off suspect site near"), std::string::npos) << out[0].reason;
}

TEST(PolicyDefaults, ARetryDoesNotQueueOnAFullSiteWhenItsOwnIsOnlySuspect) {
  res::PolicyEngine eng(spec_of(two_sites()));
  std::vector<res::Decision> out;
  eng.task_started("burn.2", "far", 0, std::nullopt);  // far's two workers are busy
  eng.task_started("burn.3", "far", 0, std::nullopt);
  eng.task_started("burn.0", "near", 0, std::nullopt);
  eng.task_failed("burn.0", "near", 2, {}, out);
  ASSERT_EQ(out.size(), 1u) << dump(out);
  EXPECT_EQ(out[0].action, "restart") << out[0].reason;  // near (health 0.5) beats a wait for far
  EXPECT_EQ(out[0].target_site, "near");
  eng.task_finished("burn.3", 3);  // a worker of far is free again: the next retry moves
  eng.task_started("burn.1", "near", 3, std::nullopt);
  eng.task_failed("burn.1", "near", 4, {}, out);
  ASSERT_EQ(out.size(), 2u) << dump(out);
  EXPECT_EQ(out[1].action, "migrate") << out[1].reason;
  EXPECT_EQ(out[1].target_site, "far");
}

TEST(PolicyDefaults, OnOneSiteTheRetryIsARestartThere) {
  res::PolicyEngine eng(spec_of("version: 1\nname: d\nsites: [{name: only, engine: local, workers: 2}]\ntasks: [{name: t, kind: sleep}]\n"));
  EXPECT_EQ(eng.policy_count(), 2u);  // no default-slow or default-deadline: nowhere to move to
  std::vector<res::Decision> out;
  eng.task_started("t.0", "only", 0, std::nullopt);
  eng.task_failed("t.0", "only", 1, {}, out);
  ASSERT_EQ(out.size(), 1u) << dump(out);
  EXPECT_EQ(out[0].action, "restart");
  EXPECT_EQ(out[0].target_site, "only");
}

TEST(PolicyDefaults, ThreeRetriesThenTheBudgetIsSpentOnce) {
  res::PolicyEngine eng(spec_of("version: 1\nname: d\nsites: [{name: only, engine: local, workers: 2}]\ntasks: [{name: t, kind: sleep}]\n"));
  std::vector<res::Decision> out;
  for (int k = 0; k < 6; ++k) {
    eng.task_started("t.0", "only", 10.0 * k, std::nullopt);
    eng.task_failed("t.0", "only", 10.0 * k + 1, {}, out);
  }
  EXPECT_EQ(count(out, "restart"), 3) << dump(out);
  ASSERT_EQ(count(out, "alert"), 1) << dump(out);
  EXPECT_NE(out.back().reason.find("budget spent"), std::string::npos);
}

TEST(PolicyDefaults, AnExitARetryCannotFixIsNotRetriedAndDoesNotBlameTheSite) {
  res::PolicyEngine eng(spec_of(two_sites()));
  std::vector<res::Decision> out;
  eng.task_started("burn.0", "near", 0, std::nullopt);
  res::PolicyEngine::Failure f;
  f.exit_code = 127;
  eng.task_failed("burn.0", "near", 1, f, out);
  ASSERT_EQ(out.size(), 1u) << dump(out);
  EXPECT_EQ(out[0].action, "alert");
  EXPECT_NE(out[0].reason.find("exit status 127 (command not found): a retry cannot fix that"), std::string::npos)
      << out[0].reason;
  EXPECT_DOUBLE_EQ(eng.site_health_detail("near")->failures, 0.0);
  // exit 1 is the task's own error: the default retries lost attempts only (as Ray does).
  f.exit_code = 1;
  eng.task_started("burn.1", "near", 2, std::nullopt);
  eng.task_failed("burn.1", "near", 3, f, out);
  EXPECT_EQ(out.size(), 1u) << dump(out);
  res::PolicyEngine::Failure raised;
  raised.kind = res::PolicyEngine::Failure::Kind::error;  // an exception
  eng.task_started("burn.2", "near", 4, std::nullopt);
  eng.task_failed("burn.2", "near", 5, raised, out);
  EXPECT_EQ(out.size(), 1u) << dump(out);
  EXPECT_DOUBLE_EQ(eng.site_health_detail("near")->failures, 0.0);  // not the site's doing
  // A worker that died (killed by a signal: no exit status) is retried.
  res::PolicyEngine::Failure lost;
  lost.kind = res::PolicyEngine::Failure::Kind::lost;
  eng.task_started("burn.3", "near", 6, std::nullopt);
  eng.task_failed("burn.3", "near", 7, lost, out);
  EXPECT_EQ(count(out, "migrate", "default-retry"), 1) << dump(out);
}

TEST(PolicyDefaults, ASpecPolicyOnFailuresStillRetriesTheTasksOwnErrors) {
  res::PolicyEngine eng(spec_of(two_sites("policies:\n  - {name: again, signal: task.failures, detector: threshold, "
                                          "threshold: 1, action: restart}\n")));
  std::vector<res::Decision> out;
  res::PolicyEngine::Failure f;
  f.exit_code = 1;
  eng.task_started("burn.0", "near", 0, std::nullopt);
  eng.task_failed("burn.0", "near", 1, f, out);
  ASSERT_EQ(out.size(), 1u) << dump(out);
  EXPECT_EQ(out[0].policy, "again");
  EXPECT_EQ(out[0].action, "restart");  // an error does not make the site suspect
  f.exit_code = 127;  // but never what a retry cannot fix
  eng.task_started("burn.1", "near", 2, std::nullopt);
  eng.task_failed("burn.1", "near", 3, f, out);
  ASSERT_EQ(out.size(), 2u) << dump(out);
  EXPECT_EQ(out[1].action, "alert");
}

TEST(PolicyDefaults, AFailureTheEngineRetriesItselfIsNotRetriedTwice) {
  res::PolicyEngine eng(spec_of(two_sites()));
  std::vector<res::Decision> out;
  eng.task_started("burn.0", "near", 0, std::nullopt);
  res::PolicyEngine::Failure f;
  f.engine_retries = true;
  eng.task_failed("burn.0", "near", 1, f, out);
  EXPECT_TRUE(out.empty()) << dump(out);
  EXPECT_GT(eng.site_health_detail("near")->failures, 0.9);  // still counts against the site
}

TEST(PolicyDefaults, TheAttemptAnActionStoppedIsNotNewEvidence) {
  // A hung attempt: heartbeats stop, default-revive restarts it; the engine then reports the
  // attempt it stopped as failed. That failure must not fire default-retry.
  res::PolicyEngine eng(spec_of("version: 1\nname: d\nsites: [{name: only, engine: local, workers: 2}]\ntasks: [{name: t, kind: sleep}]\n"));
  std::vector<res::Decision> out;
  eng.task_started("t.0", "only", 0, std::nullopt);
  for (int k = 0; k <= 10; ++k) eng.heartbeat("t.0", "only", k * 1.0);
  double t = 10;
  while (out.empty() && t < 30) eng.tick(t += 0.1, out);
  ASSERT_EQ(out.size(), 1u) << dump(out);
  EXPECT_EQ(out[0].policy, "default-revive");
  EXPECT_EQ(out[0].action, "restart");
  eng.task_failed("t.0", "only", t + 0.1, {}, out);  // stopped for the restart
  EXPECT_EQ(out.size(), 1u) << dump(out);
  eng.task_started("t.0", "only", t + 0.2, std::nullopt);
  for (int k = 1; k <= 5; ++k) eng.heartbeat("t.0", "only", t + k);
  eng.task_failed("t.0", "only", t + 5.5, {}, out);  // the new attempt's own failure counts
  EXPECT_EQ(count(out, "restart", "default-retry"), 1) << dump(out);
  // A failed attempt is not silent: no phi-accrual restart after it.
  const std::size_t n = out.size();
  for (int k = 0; k < 100; ++k) eng.tick(t + 6 + k * 0.5, out);
  EXPECT_EQ(out.size(), n) << dump(out);
}

TEST(PolicyDefaults, AnAttemptThatHangsBeforeItsFirstHeartbeatIsRevivedOnceItsTaskShowsWhenOneComes) {
  // Phi-accrual needs a history of gaps; an attempt that hangs as it starts has none. The
  // default set judges its silence against how soon its task's attempts send their first
  // heartbeat (0.5 s here): revived after max(5 x that, that + 3 s, 10 s), not before; and
  // not at all while no attempt of the task has sent one (nothing to compare with).
  res::PolicyEngine eng(spec_of("version: 1\nname: d\nsites: [{name: only, engine: local, workers: 4}]\ntasks: [{name: t, kind: sleep}]\n"));
  std::vector<res::Decision> out;
  eng.task_started("t.0", "only", 0, std::nullopt);  // hangs as it starts
  for (double t = 0.1; t < 20; t += 0.1) eng.tick(t, out);
  EXPECT_TRUE(out.empty()) << "no attempt of t has sent a heartbeat yet: " << dump(out);
  // t.1 beats every 0.5 s from its start: now t.0's 20 s of silence is judged.
  eng.task_started("t.1", "only", 20, std::nullopt);
  double t = 20;
  auto run_to = [&](double until) {
    while (t < until - 1e-9) {
      t += 0.1;
      if (std::fmod(t - 20 + 1e-6, 0.5) < 0.1) eng.heartbeat("t.1", "only", t);
      eng.tick(t, out);
    }
  };
  run_to(21);
  ASSERT_EQ(out.size(), 1u) << dump(out);
  EXPECT_EQ(out[0].policy, "default-revive");
  EXPECT_EQ(out[0].task_id, "t.0");
  EXPECT_EQ(out[0].action, "restart");
  EXPECT_NE(out[0].explanation.find("no heartbeat in the"), std::string::npos) << out[0].explanation;
  eng.task_failed("t.0", "only", t, {}, out);  // the engine stopped it for the restart: no new evidence
  ASSERT_EQ(out.size(), 1u) << dump(out);
  // t.2 starts and never sends a heartbeat: revived 10 s after its start, not sooner.
  eng.task_started("t.2", "only", 30, std::nullopt);
  run_to(30);
  run_to(39.8);
  EXPECT_EQ(out.size(), 1u) << dump(out);
  run_to(40.5);
  ASSERT_EQ(out.size(), 2u) << dump(out);
  EXPECT_EQ(out[1].task_id, "t.2");
  EXPECT_EQ(out[1].action, "restart");
  EXPECT_GE(out[1].time_s, 40 - 1e-6);
  // t.1, beating all along, was never judged silent.
  for (const auto& d : out) EXPECT_NE(d.task_id, "t.1") << dump(out);
}

TEST(PolicyDefaults, SilenceTheSitesAttemptsShareMovesTheRestartOffIt) {
  res::PolicyEngine eng(spec_of(two_sites()));
  std::vector<res::Decision> out;
  for (const char* id : {"burn.0", "burn.1", "burn.2"}) eng.task_started(id, std::string(id) == "burn.2" ? "far" : "near", 0, std::nullopt);
  for (int k = 0; k <= 10; ++k)
    for (const char* id : {"burn.0", "burn.1", "burn.2"}) eng.heartbeat(id, std::string(id) == "burn.2" ? "far" : "near", k * 0.5);
  // near freezes at 5 s; far keeps beating.
  double t = 5;
  while (out.empty() && t < 30) {
    t += 0.1;
    if (std::fmod(t, 0.5) < 0.1) eng.heartbeat("burn.2", "far", t);
    eng.tick(t, out);
  }
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out[0].policy, "default-revive");
  EXPECT_EQ(out[0].action, "migrate") << out[0].reason;
  EXPECT_EQ(out[0].target_site, "far");
  EXPECT_NE(out[0].reason.find("1 other attempt is there silent too"), std::string::npos) << out[0].reason;
  EXPECT_GE(out[0].time_s, 5 + 3.0) << "a silence of 3 s beyond the mean gap at least";
  EXPECT_LE(out[0].time_s, 5 + 4.0);
}

const std::string kRecon = "version: 1\nname: d\nsites:\n  - {name: near, engine: local, workers: 2}\n"
                           "  - {name: far, engine: local, workers: 2}\ntasks:\n  - {name: recon, kind: sleep, "
                           "deadline: 100s}\n";

/// 83 s of work that goes 3x slower from 20 s (it would end at ~200 s): `id` reports its
/// progress and a heartbeat on `site` each second up to 100 s (up to the first decision
/// when `until_decided`); the attempts in `beating` (id, site) heartbeat beside it.
void slows_at_20s(res::PolicyEngine& eng, const std::string& id, const std::string& site,
                  std::vector<res::Decision>& out, bool until_decided = false,
                  const std::vector<std::pair<std::string, std::string>>& beating = {}) {
  double p = 0;
  for (double t = 1; t < 100 && !(until_decided && !out.empty()); t += 1) {
    p += t < 20 ? 0.012 : 0.004;
    eng.task_progress(id, std::min(p, 1.0), t);
    eng.heartbeat(id, site, t);
    for (const auto& [b, bsite] : beating) eng.heartbeat(b, bsite, t);
    eng.tick(t, out);
  }
}

TEST(PolicyDefaults, ATaskForecastToMissItsDeadlineGetsACopyBeforeItMisses) {
  res::PolicyEngine eng(spec_of(kRecon));
  std::vector<res::Decision> out;
  eng.task_started("recon.0", "near", 0, std::nullopt);
  slows_at_20s(eng, "recon.0", "near", out, true);
  ASSERT_EQ(out.size(), 1u) << dump(out);
  EXPECT_EQ(out[0].policy, "default-deadline");
  EXPECT_EQ(out[0].action, "speculate");
  EXPECT_EQ(out[0].target_site, "far");
  EXPECT_LT(out[0].time_s, 60) << out[0].reason;  // well before the deadline at 100 s
  ASSERT_TRUE(out[0].eta_s);
  EXPECT_GT(*out[0].eta_s, 100);  // what it foresaw: a miss
  EXPECT_NE(out[0].reason.find("deadline in "), std::string::npos) << out[0].reason;  // from now, not the clock's zero
  // A task whose copy already runs (another default made one) gets no second copy; nor
  // does the copy while its original runs.
  for (const bool copy_late : {false, true}) {
    res::PolicyEngine copied(spec_of(kRecon));
    std::vector<res::Decision> none_again;
    copied.task_started("recon.0", "near", 0, std::nullopt);
    copied.task_started("recon.0@copy1", "far", 0, std::nullopt);
    if (copy_late)
      slows_at_20s(copied, "recon.0@copy1", "far", none_again, false, {{"recon.0", "near"}});
    else
      slows_at_20s(copied, "recon.0", "near", none_again, false, {{"recon.0@copy1", "far"}});
    EXPECT_TRUE(none_again.empty()) << copy_late << "\n" << dump(none_again);
  }
  // Without a deadline nothing is forecast, and nothing is decided.
  res::PolicyEngine none(spec_of(two_sites()));
  std::vector<res::Decision> quiet;
  none.task_started("burn.0", "near", 0, std::nullopt);
  slows_at_20s(none, "burn.0", "near", quiet);
  EXPECT_TRUE(quiet.empty()) << dump(quiet);
}

TEST(PolicyDefaults, NoCopyForADeadlineWhereTheCopyWouldMissItToo) {
  // Earlier instances of recon completed on far in `run` s; recon.3 starts on near at 0
  // (deadline 100 s) and slows at 20 s: a copy helps only if it can end by 100 s.
  for (const double run : {30.0, 95.0}) {
    res::PolicyEngine eng(spec_of(kRecon));
    std::vector<res::Decision> out;
    for (int i = 0; i < 3; ++i) {
      const std::string id = "recon." + std::to_string(i);
      eng.task_started(id, "far", -200, std::nullopt);
      eng.observe({id, "far", "task.runtime", run, -200 + run}, out);
      eng.task_finished(id, -200 + run);
    }
    eng.task_started("recon.3", "near", 0, std::nullopt);
    slows_at_20s(eng, "recon.3", "near", out, true);
    ASSERT_EQ(out.size(), 1u) << run << "\n" << dump(out);
    EXPECT_EQ(out[0].policy, "default-deadline");
    if (run < 50) {
      EXPECT_EQ(out[0].action, "speculate") << out[0].reason;
    } else {
      EXPECT_EQ(out[0].action, "alert") << out[0].reason;
      EXPECT_NE(out[0].reason.find("no copy: one on far would run about 95.0 s"), std::string::npos) << out[0].reason;
    }
  }
}

TEST(PolicyDefaults, ACopySpendsItsOriginalsBudget) {
  res::PolicyEngine eng(spec_of(two_sites("policies:\n  - {name: copy-silent, signal: task.heartbeat_gap, detector: "
                                          "phi-accrual, action: speculate, max_attempts: 1}\n")));
  std::vector<res::Decision> out;
  auto beat_then_fall_silent = [&](const std::string& id, const std::string& site, double from) {
    eng.task_started(id, site, from, std::nullopt);
    for (int k = 0; k <= 10; ++k) eng.heartbeat(id, site, from + k * 0.5);
    for (double t = from + 5; t < from + 20; t += 0.25) eng.tick(t, out);
  };
  beat_then_fall_silent("burn.0", "near", 0);
  ASSERT_EQ(out.size(), 1u) << dump(out);
  EXPECT_EQ(out[0].action, "speculate");
  beat_then_fall_silent("burn.0@copy1", "far", 20);  // the copy hangs too: no copy of the copy
  ASSERT_EQ(out.size(), 2u) << dump(out);
  EXPECT_EQ(out[1].action, "alert");
  EXPECT_NE(out[1].reason.find("budget spent (max_attempts 1)"), std::string::npos) << out[1].reason;
}

TEST(PolicyDefaults, OffAndObserve) {
  {
    res::PolicyEngine eng(spec_of(two_sites("defaults: off\n")));
    EXPECT_EQ(eng.policy_count(), 0u);
    std::vector<res::Decision> out;
    eng.task_started("burn.0", "near", 0, std::nullopt);
    eng.task_failed("burn.0", "near", 1, {}, out);
    EXPECT_TRUE(out.empty()) << dump(out);
  }
  res::PolicyEngine eng(spec_of(two_sites("defaults: observe\n")));
  std::vector<res::Decision> out;
  eng.task_started("burn.0", "near", 0, std::nullopt);
  eng.task_failed("burn.0", "near", 1, {}, out);
  ASSERT_EQ(out.size(), 1u) << dump(out);
  EXPECT_EQ(out[0].action, "alert");
  EXPECT_NE(out[0].reason.find("observe only (defaults: observe): would restart off suspect site near"),
            std::string::npos)
      << out[0].reason;
}

TEST(PolicyDefaults, ASpecPolicyOnTheSameSignalReplacesTheDefaultForItsTargets) {
  // Every task: default-retry gives way entirely.
  res::PolicyEngine all(spec_of(two_sites("policies:\n  - {name: tell, signal: task.failures, detector: threshold, "
                                          "threshold: 1, action: alert}\n")));
  EXPECT_EQ(all.policy_count(), 4u);  // tell, default-revive, default-slow, default-deadline
  std::vector<res::Decision> out;
  all.task_started("burn.0", "near", 0, std::nullopt);
  all.task_failed("burn.0", "near", 1, {}, out);
  ASSERT_EQ(out.size(), 1u) << dump(out);
  EXPECT_EQ(out[0].policy, "tell");
  // Only task `a`: the default still retries `b`.
  res::PolicyEngine some(spec_of("version: 1\nname: d\nsites: [{name: s, engine: local, workers: 2}]\ntasks: [{name: a, kind: sleep}, "
                                 "{name: b, kind: sleep}]\npolicies:\n  - {name: tell, signal: task.failures, detector: "
                                 "threshold, threshold: 1, action: alert, targets: [a]}\n"));
  out.clear();
  some.task_started("a.0", "s", 0, std::nullopt);
  some.task_started("b.0", "s", 0, std::nullopt);
  some.task_failed("a.0", "s", 1, {}, out);
  some.task_failed("b.0", "s", 1, {}, out);
  ASSERT_EQ(out.size(), 2u) << dump(out);
  EXPECT_EQ(out[0].policy, "tell");
  EXPECT_EQ(out[1].policy, "default-retry");
  EXPECT_EQ(out[1].task_id, "b.0");
}

// ---- the task's normal ------------------------------------------------------------------------

/// The issue's first scenario: 4 instances, two on each site; near slows 4x at 5 s.
std::vector<res::Decision> slowed_near(const std::string& spec_yaml, double* first_move = nullptr) {
  res::PolicyEngine eng(spec_of(spec_yaml));
  Sim sim{eng};
  sim.slow = [](const std::string& site, double t) { return site == "near" && t >= 5 ? 4.0 : 1.0; };
  sim.start("burn.0", "near", 0);
  sim.start("burn.1", "near", 0);
  sim.start("burn.2", "far", 0);
  sim.start("burn.3", "far", 0);
  sim.run(40, 40);
  if (first_move)
    for (const auto& d : sim.out)
      if (d.action == "migrate") {
        *first_move = d.time_s;
        break;
      }
  return sim.out;
}

TEST(PolicyDefaults, ASlowedSitesWorkMovesWithinAFewStepsWithNoPolicyWritten) {
  double first = -1;
  const auto out = slowed_near(two_sites(), &first);
  ASSERT_EQ(count(out, "migrate", "default-slow"), 2) << dump(out);
  for (const auto& d : out) {
    if (d.action != "migrate") continue;
    EXPECT_TRUE(d.task_id == "burn.0" || d.task_id == "burn.1") << dump(out);
    EXPECT_EQ(d.target_site, "far");
    EXPECT_NE(d.reason.find("the task's normal"), std::string::npos) << d.reason;
  }
  EXPECT_GT(first, 5.0);
  EXPECT_LT(first, 5.0 + 5.0) << dump(out);  // two 2 s steps, at most
}

TEST(PolicyDefaults, AStragglerIsCopiedWhereAWorkerIsFreeNotMoved) {
  // burn.0 alone slows 4x at 5 s (a bad node); burn.1 beside it on near keeps its pace.
  for (const bool far_full : {false, true}) {
    res::PolicyEngine eng(spec_of(two_sites()));
    Sim sim{eng};
    sim.slow_task = [](const std::string& id, double t) { return id == "burn.0" && t >= 5 ? 4.0 : 1.0; };
    sim.start("burn.0", "near", 0);
    sim.start("burn.1", "near", 0);
    sim.start("burn.2", "far", 0);
    if (far_full) sim.start("burn.3", "far", 0);
    sim.run(25, 60);
    EXPECT_EQ(count(sim.out, "migrate"), 0) << dump(sim.out);
    if (far_full) {  // a copy queued behind far's work would finish later: it waits
      EXPECT_EQ(sim.out.size(), 0u) << dump(sim.out);
      continue;
    }
    ASSERT_EQ(count(sim.out, "speculate", "default-slow"), 1) << dump(sim.out);
    const auto& d = sim.out[0];
    EXPECT_EQ(d.task_id, "burn.0");
    EXPECT_EQ(d.target_site, "far");
    EXPECT_NE(d.reason.find("straggler"), std::string::npos) << d.reason;
    EXPECT_GT(d.time_s, 5.0);
    EXPECT_LT(d.time_s, 5.0 + 5.0) << dump(sim.out);
  }
}

TEST(PolicyDefaults, NormalsLearnedInOneRunSeedTheNext) {
  // Run 1, fault-free: both instances on near teach burn's normal there.
  std::string kept;
  {
    res::PolicyEngine eng(spec_of(two_sites()));
    Sim sim{eng};
    sim.start("burn.0", "near", 0);
    sim.start("burn.1", "near", 0);
    sim.run(10, 20);
    EXPECT_TRUE(sim.out.empty()) << dump(sim.out);
    kept = eng.export_normals();
  }
  EXPECT_NE(kept.find("\"workflow\":\"d\""), std::string::npos) << kept;
  EXPECT_NE(kept.find("\"burn\":{\"task.step_time\":[{\"site\":\"near\""), std::string::npos) << kept;
  // Run 2: near is 4x slower from the start and every instance runs there. With nothing
  // learned its slow steps are its normal; seeded, its first judged steps move.
  auto moves_when_slowed_from_the_start = [&](bool seeded) {
    res::PolicyEngine eng(spec_of(two_sites()));
    if (seeded) {
      EXPECT_EQ(eng.import_normals(kept), 1u);
    }
    Sim sim{eng};
    sim.slow = [](const std::string& site, double) { return site == "near" ? 4.0 : 1.0; };
    sim.start("burn.0", "near", 0);
    sim.start("burn.1", "near", 0);
    sim.run(20, 40);
    for (const auto& d : sim.out) EXPECT_LT(d.time_s, 4 * 0.5 * 4) << dump(sim.out);  // within its first 4 steps
    return count(sim.out, "migrate", "default-slow");
  };
  EXPECT_EQ(moves_when_slowed_from_the_start(false), 0);
  EXPECT_EQ(moves_when_slowed_from_the_start(true), 2);
}

TEST(PolicyDefaults, BadNormalsAreRefusedWholeSayingWhatIsWrong) {
  res::PolicyEngine eng(spec_of(two_sites()));
  auto refused = [&](const std::string& text, const std::string& says) {
    try {
      eng.import_normals(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const diaspora::Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused("{", "not JSON");
  refused("[]", "not a JSON object");
  refused(R"({"version":2,"workflow":"d","families":{}})", "version must be 1");
  refused(R"({"version":1,"workflow":"other","families":{}})", "learned by workflow 'other', not 'd'");
  refused(R"({"version":1,"workflow":"d","families":{"burn":{"task.cpu":[]}}})", "unknown series 'task.cpu'");
  const std::string good = R"({"site":"near","speed":1,"log_mean":-0.7,"log_var":0.01,"n":20})";
  refused(R"({"version":1,"workflow":"d","families":{"burn":{"task.step_time":[)" + good +
              R"(]},"sim":{"task.step_time":[{"site":"near","speed":1,"log_mean":"x","log_var":0,"n":5}]}}})",
          "family 'sim', task.step_time: a normal needs site");
  refused(R"({"version":1,"workflow":"d","families":{"burn":{"task.step_time":[{"site":"near","speed":0,"log_mean":0,"log_var":0,"n":5}]}}})",
          "speed (> 0)");
  // The refused file above loaded nothing, not even its good family: the engine's export is still empty.
  EXPECT_EQ(eng.export_normals(), R"({"version":1,"workflow":"d","families":{}})");
  EXPECT_EQ(eng.import_normals(R"({"version":1,"workflow":"d","families":{"burn":{"task.step_time":[)" + good + "]}}}"), 1u);
  const auto doc = boost::json::parse(eng.export_normals());  // seeded: as 10 values at most
  EXPECT_EQ(doc.at("families").at("burn").at("task.step_time").at(0).at("n").to_number<double>(), 10.0);
}

TEST(PolicyDefaults, ATaskNearlyDoneIsNotMovedToStartAgain) {
  for (const double done : {0.2, 0.9}) {
    res::PolicyEngine eng(spec_of(two_sites()));
    std::vector<res::Decision> out;
    eng.task_started("burn.0", "near", 0, std::nullopt);
    eng.task_started("burn.1", "far", 0, std::nullopt);
    double t = 0;
    for (int k = 0; k < 10; ++k, t += 0.5)
      for (const char* id : {"burn.0", "burn.1"}) eng.observe({id, std::string(id) == "burn.0" ? "near" : "far", "task.step_time", 0.5, t}, out);
    eng.task_progress("burn.0", done, t);
    for (int k = 0; k < 6; ++k, t += 2) eng.observe({"burn.0", "near", "task.step_time", 2.0, t}, out);  // 4x slower
    // At 4x the time left outlasts a fresh run below 75 % done: moved at 20 %, kept at 90 %.
    EXPECT_EQ(out.size(), done < 0.75 ? 1u : 0u) << done << "\n" << dump(out);
  }
}

TEST(PolicyDefaults, TheNaturalPolicyActsFromTheFirstStep) {
  // {signal: task.step_time, action: migrate, to_sites: [far]} with the default detector
  // (the ensemble, which alone needs 150 observations of an attempt).
  double first = -1;
  const auto out = slowed_near(two_sites("policies:\n  - {name: leave, signal: task.step_time, action: migrate, "
                                         "to_sites: [far]}\n"),
                               &first);
  EXPECT_EQ(count(out, "migrate", "default-slow"), 0) << dump(out);  // replaced
  ASSERT_EQ(count(out, "migrate", "leave"), 2) << dump(out);
  EXPECT_LT(first, 5.0 + 5.0) << dump(out);
  // The user's "ensemble 0.8 for 2" form fires too (4x is a score of 1).
  const auto strict = slowed_near(two_sites("policies:\n  - {name: leave, signal: task.step_time, detector: ensemble, "
                                            "threshold: 0.8, for: 2, action: migrate, to_sites: [far]}\n"));
  EXPECT_EQ(count(strict, "migrate", "leave"), 2) << dump(strict);
}

TEST(PolicyDefaults, ANoisyFaultFreeRunTakesNoAction) {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    res::PolicyEngine eng(spec_of(two_sites()));
    Sim sim{eng};
    sim.sigma = 0.3;  // log-normal: one step in 100 is over 2x the median
    sim.noise = Noise{seed};
    for (int i = 0; i < 8; ++i) sim.start("burn." + std::to_string(i), i % 2 ? "far" : "near", 0);
    sim.run(120, 200);
    EXPECT_TRUE(sim.out.empty()) << "seed " << seed << "\n" << dump(sim.out);
  }
  // Steps anywhere between 0.1 and 0.9 s (9x apart): the normal's spread widens the ratio.
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    res::PolicyEngine eng(spec_of(two_sites()));
    Sim sim{eng};
    sim.uniform = true;
    sim.noise = Noise{seed};
    for (int i = 0; i < 8; ++i) sim.start("burn." + std::to_string(i), i % 2 ? "far" : "near", 0);
    sim.run(120, 150);
    EXPECT_TRUE(sim.out.empty()) << "uniform, seed " << seed << "\n" << dump(sim.out);
  }
}

TEST(PolicyDefaults, ADeclaredSlowerSiteIsNotTakenForASlowedOne) {
  res::PolicyEngine eng(spec_of(two_sites({}, "0.5")));
  Sim sim{eng};
  sim.site_factor = [](const std::string& site) { return site == "far" ? 2.0 : 1.0; };
  for (int i = 0; i < 4; ++i) sim.start("burn." + std::to_string(i), i % 2 ? "far" : "near", 0);
  sim.run(60, 60);
  EXPECT_TRUE(sim.out.empty()) << dump(sim.out);
}

TEST(PolicyDefaults, ASiteIsJudgedAgainstItsOwnPastOnceItHasOne) {
  // far is declared 4x slower than near but runs as fast (local sites of one host, the
  // examples' declared speeds): near, which learned its own normal first, is not taken for
  // slowed once far's normal (scaled by the declared speeds: 4x faster on near) exists.
  res::PolicyEngine eng(spec_of(two_sites({}, "0.25")));
  Sim sim{eng};
  sim.start("burn.0", "near", 0);
  sim.start("burn.1", "near", 0);
  sim.run(5, 10);
  sim.start("burn.2", "far", 5);
  sim.start("burn.3", "near", 6);
  sim.run(40, 60);
  EXPECT_TRUE(sim.out.empty()) << dump(sim.out);
  // It still sees its own slowdown.
  res::PolicyEngine slowed(spec_of(two_sites({}, "0.25")));
  Sim later{slowed};
  later.slow = [](const std::string& site, double t) { return site == "near" && t >= 8 ? 4.0 : 1.0; };
  later.start("burn.0", "near", 0);
  later.start("burn.2", "far", 0);
  later.run(30, 40);
  EXPECT_EQ(count(later.out, "migrate", "default-slow"), 1) << dump(later.out);
}

TEST(PolicyDefaults, RelativeOnSeriesThatComeOnceAnAttempt) {
  // task.runtime (a completed attempt's) and task.queue_wait come once an attempt: each
  // value teaches and is judged (the first-value rule is for step times).
  res::PolicyEngine eng(spec_of(two_sites("policies:\n  - {name: long-run, signal: task.runtime, detector: relative, "
                                          "action: alert}\n  - {name: long-wait, signal: task.queue_wait, detector: "
                                          "relative, action: alert}\n")));
  std::vector<res::Decision> out;
  for (int i = 0; i < 5; ++i) {
    const std::string id = "burn." + std::to_string(i);
    eng.task_started(id, "near", i, std::nullopt);
    eng.observe({id, "near", "task.queue_wait", 0.5 + 0.01 * i, double(i)}, out);
    eng.observe({id, "near", "task.runtime", 10.0 + 0.1 * i, i + 10.0}, out);
    eng.task_finished(id, i + 10.0);
  }
  EXPECT_TRUE(out.empty()) << dump(out);
  eng.task_started("burn.5", "near", 20, std::nullopt);
  eng.observe({"burn.5", "near", "task.queue_wait", 2.0, 20}, out);  // 4x its normal wait
  eng.observe({"burn.5", "near", "task.runtime", 31.0, 51}, out);    // 3x its normal run time
  ASSERT_EQ(out.size(), 2u) << dump(out);
  EXPECT_EQ(out[0].policy, "long-wait");
  EXPECT_EQ(out[1].policy, "long-run");
  EXPECT_NE(out[1].reason.find("3.0"), std::string::npos) << out[1].reason;
}

TEST(PolicyDefaults, TheRelativeDetectorAndTheSensitivityKnob) {
  // sensitivity 0.5: worse than normal means 3x; a 2.5x slowdown is then no anomaly.
  {
    res::PolicyEngine eng(spec_of(two_sites("sensitivity: 0.5\n")));
    Sim sim{eng};
    sim.slow = [](const std::string& site, double t) { return site == "near" && t >= 5 ? 2.5 : 1.0; };
    sim.start("burn.0", "near", 0);
    sim.start("burn.1", "far", 0);
    sim.run(40, 40);
    EXPECT_EQ(count(sim.out, "migrate"), 0) << dump(sim.out);
  }
  // An explicit `relative` policy with its own ratio.
  res::PolicyEngine eng(spec_of(two_sites("policies:\n  - {name: rel, signal: task.step_time, detector: relative, "
                                          "threshold: 1.5, for: 2, action: alert}\n")));
  Sim sim{eng};
  sim.slow = [](const std::string& site, double t) { return site == "near" && t >= 5 ? 2.0 : 1.0; };
  sim.start("burn.0", "near", 0);
  sim.start("burn.1", "far", 0);
  sim.run(40, 40);
  ASSERT_GE(count(sim.out, "alert", "rel"), 1) << dump(sim.out);
  EXPECT_NE(sim.out[0].reason.find("x >= 1.5x the task's normal"), std::string::npos) << sim.out[0].reason;
}

TEST(PolicyDefaults, BadRelativePoliciesAndSensitivityAreLocatedErrors) {
  auto errors = [](const std::string& extra) {
    try {
      res::PolicyEngine eng(spec_of(two_sites(extra)));
    } catch (const diaspora::SpecError& e) {
      std::string s;
      for (const auto& d : e.diagnostics()) s += d.str() + "\n";
      return s;
    }
    return std::string();
  };
  EXPECT_NE(errors("policies:\n  - {name: r, signal: site.throughput, detector: relative, action: alert}\n")
                .find("detector 'relative' compares a task with its normal"),
            std::string::npos);
  EXPECT_NE(errors("policies:\n  - {name: r, signal: task.step_time, detector: relative, threshold: 0.8, action: alert}\n")
                .find("it must be > 1"),
            std::string::npos);
  auto load = diaspora::load_spec_string(two_sites("sensitivity: 0\n"), "s.yaml");
  EXPECT_FALSE(load.ok());
  load = diaspora::load_spec_string(two_sites("defaults: maybe\n"), "s.yaml");
  ASSERT_FALSE(load.ok());
  EXPECT_EQ(load.diagnostics[0].path, "defaults") << load.diagnostics[0].str();
}

}  // namespace
