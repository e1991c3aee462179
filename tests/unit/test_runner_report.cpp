// report.json's object (runner/src/report_builder.hpp) built from in-memory state: the
// reaction times, the counts, the deadlines, and the fields docs/run.md lists.
#include "runner_rig.hpp"

#include <boost/json.hpp>

#include <sstream>

#include "live_view.hpp"
#include "report_builder.hpp"
#include "report_files.hpp"

namespace diaspora::runner::testing {
namespace {

namespace json = boost::json;

TEST(RunnerReport, AKilledWorkersReactionTimeIsFromTheFaultToTheRecoveringAttemptRunning) {
  Rig r(two_sites(2, kRestartPolicy + "faults:\n  - {at: 4s, kind: kill-worker, site: fast}\n"));
  r.spec.tasks[0].deadline = Duration(10.0);
  FaultInjector f(r.ctx, r.store, r.sites, r.control, nullptr);
  r.submit();  // burn.0, burn.1 on fast
  r.clock.t = 4;
  f.tick();  // burn.0 (first started) is hit
  const int ii = r.inst("burn.0");
  Slot& slot = r.sites.find("fast")->slots[0];
  slot.inst = slot.att = -1;
  r.clock.t = 4.5;
  r.lifecycle.ended(ii, 0, false, "worker fast/worker-0 died (killed by signal 9 (SIGKILL))", true);
  r.clock.t = 5.25;
  r.act(Rig::action(DIASPORA_ACTION_RESTART, "restart", "A1", "burn.0"));
  ASSERT_TRUE(r.last("burn.0").live());
  // burn.1 completes in time; burn.0 completes after its deadline.
  r.clock.t = 6;
  Slot& s1 = r.sites.find("fast")->slots[1];
  s1.inst = s1.att = -1;
  r.lifecycle.ended(r.inst("burn.1"), 0, true, "");
  r.clock.t = 11;
  const Attempt& again = r.last("burn.0");
  Slot& s2 = r.sites.find(again.site)->slots[static_cast<std::size_t>(again.slot)];
  s2.inst = s2.att = -1;
  r.lifecycle.ended(ii, 1, true, "");

  RunSummary run;
  run.exit_status = 0;
  run.duration_s = 11.0004;
  const json::object rep = build_report(r.ctx, r.store, r.sites, f.all(), r.actions, run);
  const json::object& fault = rep.at("faults").as_array().at(0).as_object();
  EXPECT_EQ(fault.at("kind").as_string(), "kill-worker");
  EXPECT_EQ(fault.at("target").as_string(), "burn.0 on fast/worker-0");
  const json::object& hit = fault.at("hit").as_array().at(0).as_object();
  EXPECT_EQ(hit.at("instance").as_string(), "burn.0");
  EXPECT_DOUBLE_EQ(hit.at("reaction_s").as_double(), 1.25);
  EXPECT_DOUBLE_EQ(hit.at("recovering_attempt_running_s").as_double(), 5.25);
  const json::object& sum = rep.at("summary").as_object();
  EXPECT_EQ(sum.at("instances").as_int64(), 2);
  EXPECT_EQ(sum.at("completed").as_int64(), 2);
  EXPECT_EQ(sum.at("attempts").as_int64(), 3);
  EXPECT_EQ(sum.at("with_deadline").as_int64(), 2);
  EXPECT_EQ(sum.at("deadline_misses").as_int64(), 1);  // burn.0: 11 s of 10
  EXPECT_EQ(sum.at("actions").as_int64(), 1);
  EXPECT_EQ(sum.at("reactions").as_object().at("count").as_int64(), 1);
  EXPECT_DOUBLE_EQ(sum.at("reactions").as_object().at("max_s").as_double(), 1.25);
  EXPECT_DOUBLE_EQ(rep.at("duration_s").as_double(), 11.0);  // to the millisecond
  EXPECT_EQ(rep.at("mode").as_string(), "policies");
  const json::array& atts = rep.at("instances").as_array().at(0).as_object().at("attempts").as_array();
  ASSERT_EQ(atts.size(), 2u);
  EXPECT_EQ(atts[0].as_object().at("outcome").as_string(), "failed");
  EXPECT_EQ(atts[0].as_object().at("worker").as_string(), "fast/worker-0");
  EXPECT_EQ(atts[1].as_object().at("outcome").as_string(), "completed");
  EXPECT_EQ(atts[1].as_object().at("cause").as_string(), "restart (action A1, from fast)");
  const json::object& act = rep.at("actions").as_array().at(0).as_object();
  EXPECT_EQ(act.at("outcome").as_string(), "done");
  EXPECT_DOUBLE_EQ(act.at("done_s").as_double(), 5.25);
  // The incident groups the fault, the lost attempt, the decision and the outcome.
  const json::array& inc = rep.at("incidents").as_array();
  ASSERT_EQ(inc.size(), 1u) << json::serialize(inc);
  const json::object& i0 = inc[0].as_object();
  EXPECT_EQ(i0.at("instance").as_string(), "burn.0");
  EXPECT_EQ(i0.at("faults").as_array().at(0).as_object().at("kind").as_string(), "kill-worker");
  EXPECT_NE(json::serialize(i0.at("evidence")).find("burn.0 attempt 1 on fast failed: worker fast/worker-0 died"),
            std::string::npos) << json::serialize(i0);
  EXPECT_EQ(i0.at("decisions").as_array().at(0).as_object().at("kind").as_string(), "restart");
  EXPECT_EQ(i0.at("state").as_string(), "completed");
  EXPECT_DOUBLE_EQ(i0.at("reaction_s").as_double(), 1.25);
  EXPECT_DOUBLE_EQ(i0.at("decision_s").as_double(), 1.25);
}

TEST(RunnerReport, AnIncidentGroupsAnInstancesEvidenceDecisionsAndOutcomeWithItsCopies) {
  auto att = [](const char* id, int n, const char* site, double start, double end, const char* outcome,
                const char* reason = "") {
    return json::object{{"id", id}, {"number", n}, {"site", site}, {"start_s", start}, {"end_s", end},
                        {"outcome", outcome}, {"reason", reason}};
  };
  json::object rep{{"workflow", "w"}, {"duration_s", 30.0}, {"sites", json::array{}}, {"summary", json::object{}}};
  rep["instances"] = json::array{
      json::object{{"id", "burn.0"}, {"state", "completed"},
                   {"attempts", json::array{att("burn.0", 1, "near", 0, 20, "cancelled"),
                                            att("burn.0@copy1", 1, "far", 6.5, 19, "completed")}}},
      json::object{{"id", "burn.1"}, {"state", "completed"}, {"attempts", json::array{att("burn.1", 1, "near", 0, 10, "completed")}}},
      json::object{{"id", "burn.2"}, {"state", "failed"},
                   {"attempts", json::array{att("burn.2", 1, "near", 1, 2, "failed", "exit status 127")}}}};
  rep["faults"] = json::array{json::object{{"kind", "slow-task"}, {"start_s", 3.0}, {"target", "burn.0 on near/worker-0"},
                                           {"hit", json::array{json::object{{"instance", "burn.0"}}}}}};
  auto action = [](const char* task, const char* kind, double t, const char* reason) {
    return json::object{{"task", task}, {"kind", kind}, {"target_site", "far"}, {"received_s", t}, {"outcome", "done"},
                        {"reason", reason}};
  };
  rep["actions"] = json::array{
      action("burn.0", "speculate", 6.5, "default-slow: task.step_time of task burn.0 on site near: relative 4x; speculate")};
  // Alerts never reach the engine: the report reads them back from the topic.
  rep["alerts"] = json::array{
      json::object{{"t_s", 9.0}, {"task", "burn.0@copy1"}, {"policy", "default-deadline"}, {"attempt", 0},
                   {"reason", "task.deadline_slack ...; speculate budget spent (max_attempts 1): not acting again"}},
      json::object{{"t_s", 2.1}, {"task", "burn.2"}, {"policy", "default-retry"},
                   {"reason", "task burn.2 on site near failed with exit status 127: a retry cannot fix that; not retried"}}};
  rep["anomalies"] = json::array{
      json::object{{"t_s", 1.0}, {"task", "burn.0"}, {"score", 0.2}, {"detector", "relative"}, {"explanation", "before"}},
      json::object{{"t_s", 6.0}, {"task", "burn.0"}, {"score", 1.0}, {"detector", "relative"}, {"explanation", "level 2 s"}},
      json::object{{"t_s", 6.0}, {"task", "burn.1"}, {"score", 0.1}, {"detector", "relative"}, {"explanation", "peer"}}};
  const json::array inc = build_incidents(rep);
  ASSERT_EQ(inc.size(), 2u) << json::serialize(inc);  // burn.1: nothing hit it, nothing named it
  const json::object& first = inc[0].as_object();     // earliest first: burn.2's alert at 2.1 s
  EXPECT_EQ(first.at("instance").as_string(), "burn.2");
  EXPECT_TRUE(first.at("faults").as_array().empty());
  EXPECT_NE(json::serialize(first.at("evidence")).find("exit status 127"), std::string::npos);
  EXPECT_TRUE(first.at("reaction_s").is_null());
  EXPECT_FALSE(first.contains("budget_spent"));  // an alert outside any budget
  EXPECT_EQ(json::serialize(first.at("decisions")),
            R"([{"kind":"alert","policy":"default-retry","target_site":"","outcome":"raised","at_s":2.1E0,)"
            R"("evidence":"task burn.2 on site near failed with exit status 127: a retry cannot fix that"}])");
  const json::object& b0 = inc[1].as_object();
  EXPECT_EQ(b0.at("instance").as_string(), "burn.0");
  const json::array& ds = b0.at("decisions").as_array();
  ASSERT_EQ(ds.size(), 2u);  // the copy's alert is its original's incident, after the action in time
  EXPECT_EQ(ds[1].as_object().at("kind").as_string(), "alert");
  EXPECT_EQ(ds[1].as_object().at("policy").as_string(), "default-deadline");
  EXPECT_EQ(ds[0].as_object().at("policy").as_string(), "default-slow");
  EXPECT_EQ(ds[0].as_object().at("evidence").as_string(),
            "default-slow: task.step_time of task burn.0 on site near: relative 4x");
  EXPECT_TRUE(b0.at("budget_spent").as_bool());
  const std::string ev = json::serialize(b0.at("evidence"));
  EXPECT_NE(ev.find("level 2 s"), std::string::npos) << ev;
  EXPECT_EQ(ev.find("before"), std::string::npos) << ev;  // before the fault: not its evidence
  EXPECT_EQ(ev.find("peer"), std::string::npos) << ev;
  EXPECT_DOUBLE_EQ(b0.at("recovering_attempt_running_s").as_double(), 6.5);
  EXPECT_EQ(b0.at("recovering_site").as_string(), "far");
  EXPECT_DOUBLE_EQ(b0.at("decision_s").as_double(), 3.5);
  EXPECT_DOUBLE_EQ(b0.at("reaction_s").as_double(), 3.5);
  rep["incidents"] = inc;
  const std::string html = report_html(rep);
  EXPECT_NE(html.find("<h2>Incidents</h2>"), std::string::npos);
  EXPECT_NE(html.find("6.5 s: speculate to far (default-slow, done)"), std::string::npos);
  EXPECT_NE(html.find("reaction 3.50 s; a budget was spent"), std::string::npos) << html;
}

TEST(RunnerReport, WhatDidNotHappenIsNullAndAnInterruptedRunSaysWhy) {
  RunOptions o;
  o.baseline_retry_after_s = 30;
  Rig r(two_sites(5), o);
  r.submit();
  r.ctx.stopping = true;
  r.ctx.stop_reason = "interrupted by a signal";
  r.lifecycle.stop_everything("the run was interrupted");
  RunSummary run;
  run.exit_status = 1;
  const json::object rep = build_report(r.ctx, r.store, r.sites, {}, r.actions, run);
  EXPECT_EQ(rep.at("mode").as_string(), "baseline");
  EXPECT_DOUBLE_EQ(rep.at("baseline_retry_after_s").as_double(), 30);
  EXPECT_EQ(rep.at("interrupted").as_string(), "interrupted by a signal");
  EXPECT_EQ(rep.at("summary").as_object().at("cancelled").as_int64(), 5);
  const json::object& queued = rep.at("instances").as_array().at(4).as_object();
  const json::object& a = queued.at("attempts").as_array().at(0).as_object();
  EXPECT_EQ(a.at("outcome").as_string(), "cancelled");
  EXPECT_TRUE(a.at("start_s").is_null());  // it never ran
  EXPECT_FALSE(a.contains("worker"));
  EXPECT_FALSE(rep.at("summary").as_object().at("reactions").as_object().contains("max_s"));
}


TEST(RunnerReport, TheTimelineTicksAreRoundAndALastingFaultIsShadedToTheEnd) {
  json::object rep{{"workflow", "w"}, {"duration_s", 2.5}, {"instances", json::array{}}, {"actions", json::array{}},
                   {"anomalies", json::array{}}, {"sites", json::array{}}, {"summary", json::object{}}};
  rep["faults"] = json::array{json::object{{"kind", "slow-site"}, {"target", "a"}, {"site", "a"}, {"start_s", 0.5},
                                           {"end_s", nullptr}}};
  const std::string html = report_html(rep);
  for (const char* label : {">0.0s<", ">0.5s<", ">1.0s<", ">2.5s<"}) EXPECT_NE(html.find(label), std::string::npos) << label;
  EXPECT_EQ(html.find(">2s<"), std::string::npos);  // 2.5 s is not labelled "2s"
  // The band runs from 0.5 s to the end (a slow-site without for: lasts), not a sliver.
  const auto at = html.find("fill='#ffcdd2'");
  ASSERT_NE(at, std::string::npos);
  const auto w = html.rfind("width='", at);
  const int width = std::stoi(html.substr(w + 7));
  EXPECT_GT(width, 100) << html.substr(w, 80);
}

TEST(RunnerLiveView, SaysEachReasonTheRelaySessionIsDownOnceAnOutageAndWhenItIsBack) {
  Rig r(two_sites(1));
  r.ctx.started = true;
  std::ostringstream out;
  bool up = false;
  std::string error;
  LiveView view(r.ctx, r.store, r.sites, r.actions, out, [&](bool* c) { *c = up; return std::uint64_t{0}; },
                [&] { return error; });
  auto at = [&](double t) {
    r.clock.t = t;
    view.tick();
  };
  at(0.1);  // the first connection, no error yet: nothing to say
  up = true;
  at(0.5);
  EXPECT_EQ(out.str(), "");
  up = false;  // lost; the publisher and the control subscription are refused in turn
  error = "lost the relay session: token expired (unacked events went back to the spool; reconnecting)";
  at(1.0);
  error = "relay wss://h:1: WebSocket upgrade refused: HTTP 401 (token expired at T; issue a new one) (retrying in 120 ms; "
          "events are kept in the spool meanwhile)";
  at(1.3);
  error = "control topic: WebSocket upgrade refused: HTTP 401 (token expired at T; issue a new one) (retrying in 80 ms)";
  at(1.6);
  error = "relay wss://h:1: WebSocket upgrade refused: HTTP 401 (token expired at T; issue a new one) (retrying in 300 ms; "
          "events are kept in the spool meanwhile)";
  at(1.9);  // said already (another delay)
  up = true;
  at(3.6);
  at(4.0);  // still up: nothing more
  const std::string s = out.str();
  EXPECT_NE(s.find("plugin: lost the relay session: token expired (the events"), std::string::npos) << s;
  EXPECT_EQ(s.find("reconnecting)"), std::string::npos) << s;
  EXPECT_NE(s.find("plugin: relay wss://h:1: WebSocket upgrade refused: HTTP 401 (token expired at T; issue a new one) (the"),
            std::string::npos) << s;
  EXPECT_NE(s.find("plugin: control topic:"), std::string::npos) << s;
  EXPECT_NE(s.find("plugin: relay session back after 2.6 s"), std::string::npos) << s;
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 4) << s;
  // A second outage with the same reason is said again.
  up = false;
  at(5.0);
  const std::string again = out.str();
  EXPECT_EQ(std::count(again.begin(), again.end(), '\n'), 5) << again;
}

}  // namespace
}  // namespace diaspora::runner::testing
