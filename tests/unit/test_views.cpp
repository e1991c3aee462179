// The relay's views (relay/src/views.hpp): materialised from events appended to a real
// LogStore; filters and pages; who may see what; the snapshot, loaded by a new instance
// with the same answers, set aside when it is corrupt or ahead of the log; bad records
// skipped without losing the rest.
#include <boost/json.hpp>

#include <filesystem>
#include <fstream>
#include <future>

#include "test_helpers.hpp"
#include "topic_log.hpp"
#include "views.hpp"

namespace fs = std::filesystem;
namespace json = boost::json;
using diaspora::relay::AppendRecord;
using diaspora::relay::FsyncPolicy;
using diaspora::relay::LogOptions;
using diaspora::relay::LogStore;
using diaspora::relay::ViewQueryError;
using diaspora::relay::Views;
using diaspora::test::TempDir;

namespace {

struct Fixture {
  TempDir dir;
  std::unique_ptr<LogStore> store;
  int seq = 0;

  Fixture() { open(); }
  void open() {
    LogOptions o;
    o.data_dir = dir.path() / "data";
    o.fsync = FsyncPolicy::parse("never");
    store = std::make_unique<LogStore>(o);
  }
  Views::Options options() const { return Views::Options{dir.path() / "data" / "views"}; }

  void publish(const std::string& topic, const std::vector<std::string>& events) {
    std::vector<AppendRecord> recs;
    for (const auto& e : events) recs.push_back({"", e});
    std::promise<void> p;
    store->append(topic, "", 0, std::move(recs), [&](const auto&) { p.set_value(); });
    p.get_future().get();
  }
  std::string ev(const std::string& type, const json::object& data) {
    return json::serialize(json::object{{"specversion", "1.0"}, {"id", "e" + std::to_string(++seq)}, {"source", "/t"},
                                        {"type", "org.diaspora." + type}, {"data", data}});
  }
};

bool all(const std::string&) { return true; }

json::object q(const Views& v, const char* view, std::map<std::string, std::string> params = {},
               std::function<bool(const std::string&)> may = all) {
  return v.query(view, params, may);
}

// A small workflow: two instances on two sites, one fails and restarts, an anomaly, an
// action by a policy and one by an operator, a site resource going down.
void workflow(Fixture& f, const std::string& wf) {
  f.publish(wf + ".events", {
      f.ev("task.submitted", {{"task_id", "t.0"}, {"name", "t"}, {"attempt", 1}}),
      f.ev("task.submitted", {{"task_id", "t.1"}, {"name", "t"}, {"attempt", 1}}),
      f.ev("task.started", {{"task_id", "t.0"}, {"site", "a"}, {"worker", "a/w0"}, {"attempt", 1}}),
      f.ev("task.started", {{"task_id", "t.1"}, {"site", "b"}, {"worker", "b/w0"}, {"attempt", 1}}),
      f.ev("task.progress", {{"task_id", "t.0"}, {"progress", 0.5}, {"metrics", {{"step_time_s", 0.25}}}}),
      f.ev("task.failed", {{"task_id", "t.1"}, {"site", "b"}, {"attempt", 1}, {"reason", "worker died"}}),
      f.ev("anomaly.predicted", {{"series", "task.step_time"}, {"score", 0.9}, {"detector", "ewma"},
                                 {"explanation", "step time 8x"}, {"task_id", "t.1"}, {"site", "b"}}),
      f.ev("action.requested", {{"action_id", "p1"}, {"action", "restart"}, {"reason", "failed"}, {"task_id", "t.1"},
                                {"policy", "restart-failed"}}),
      f.ev("task.submitted", {{"task_id", "t.1"}, {"name", "t"}, {"attempt", 2}}),
      f.ev("task.started", {{"task_id", "t.1"}, {"site", "a"}, {"worker", "a/w1"}, {"attempt", 2}}),
      f.ev("action.done", {{"action_id", "p1"}, {"status", "done"}, {"message", "attempt 2 running"}}),
      f.ev("task.completed", {{"task_id", "t.0"}, {"site", "a"}, {"attempt", 1}}),
      f.ev("resource.status", {{"resource_id", "b"}, {"kind", "site"}, {"state", "down"}, {"site", "b"}}),
  });
  f.publish(wf + ".control.engine", {
      f.ev("action.requested", {{"action_id", "op1"}, {"action", "cancel"}, {"reason", "operator"}, {"task_id", "t.1"}}),
  });
}

}  // namespace

TEST(Views, MaterialiseTasksSitesActionsAndWorkflows) {
  Fixture f;
  workflow(f, "beam");
  Views v(*f.store, f.options());
  EXPECT_EQ(v.catch_up(), 14u);
  EXPECT_TRUE(v.caught_up());

  auto tasks = q(v, "tasks");
  ASSERT_EQ(tasks["total"].as_int64(), 2);
  const auto& t0 = tasks["items"].as_array()[0].as_object();
  EXPECT_EQ(t0.at("task_id").as_string(), "t.0");
  EXPECT_EQ(t0.at("state").as_string(), "completed");
  EXPECT_EQ(t0.at("progress").as_double(), 1.0);
  EXPECT_EQ(t0.at("step_time_s").as_double(), 0.25);
  const auto& t1 = tasks["items"].as_array()[1].as_object();
  EXPECT_EQ(t1.at("state").as_string(), "running");
  EXPECT_EQ(t1.at("attempt").as_int64(), 2);
  EXPECT_EQ(t1.at("site").as_string(), "a");
  EXPECT_EQ(t1.at("anomaly_score").as_double(), 0.9);
  const auto& attempts = t1.at("attempts").as_array();
  ASSERT_EQ(attempts.size(), 2u);
  EXPECT_EQ(attempts[0].at("site").as_string(), "b");
  EXPECT_EQ(attempts[0].at("outcome").as_string(), "failed");
  EXPECT_EQ(attempts[0].at("reason").as_string(), "worker died");
  EXPECT_EQ(attempts[1].at("outcome").as_string(), "running");

  auto sites = q(v, "sites");
  ASSERT_EQ(sites["total"].as_int64(), 2);
  const auto& a = sites["items"].as_array()[0].as_object();
  const auto& b = sites["items"].as_array()[1].as_object();
  EXPECT_EQ(a.at("completed").as_int64(), 1);
  EXPECT_EQ(a.at("running").as_int64(), 1);
  EXPECT_EQ(b.at("failed").as_int64(), 1);
  EXPECT_EQ(b.at("state").as_string(), "down");
  EXPECT_EQ(b.at("health").as_double(), 0.0);
  EXPECT_GT(a.at("health").as_double(), 0.9);
  EXPECT_DOUBLE_EQ(b.at("failures").as_double(), 1.0);  // its one failure, just now: site_health()'s input
  EXPECT_DOUBLE_EQ(a.at("failures").as_double(), 0.0);
  EXPECT_EQ(b.at("scores").as_array().size(), 1u);
  EXPECT_EQ(b.at("explanation").as_string(), "step time 8x");

  auto actions = q(v, "actions");
  ASSERT_EQ(actions["total"].as_int64(), 2);
  std::map<std::string, json::object> by_id;
  for (const auto& x : actions["items"].as_array()) by_id[std::string(x.at("action_id").as_string())] = x.as_object();
  EXPECT_EQ(by_id["p1"].at("origin").as_string(), "policy");
  EXPECT_EQ(by_id["p1"].at("status").as_string(), "done");
  EXPECT_EQ(by_id["p1"].at("message").as_string(), "attempt 2 running");
  EXPECT_EQ(by_id["op1"].at("origin").as_string(), "operator");
  EXPECT_EQ(by_id["op1"].at("status").as_string(), "pending");

  auto wfs = q(v, "workflows");
  ASSERT_EQ(wfs["total"].as_int64(), 1);
  const auto& w = wfs["items"].as_array()[0].as_object();
  EXPECT_EQ(w.at("workflow").as_string(), "beam");
  EXPECT_EQ(w.at("events").as_int64(), 14);
  EXPECT_EQ(w.at("states").at("completed").as_int64(), 1);
  EXPECT_EQ(w.at("states").at("running").as_int64(), 1);
  EXPECT_FALSE(w.at("states").as_object().contains("pending"));

  EXPECT_EQ(q(v, "resources", {{"kind", "site"}, {"state", "down"}})["total"].as_int64(), 1);
}

TEST(Views, FiltersPagesAndAccess) {
  Fixture f;
  workflow(f, "a1");
  workflow(f, "b2");
  std::vector<std::string> many;
  for (int i = 0; i < 25; ++i) many.push_back(f.ev("task.submitted", {{"task_id", "m." + std::to_string(i)}, {"name", "m"}}));
  f.publish("b2.events", many);
  f.publish("other", {f.ev("task.submitted", {{"task_id", "x"}})});  // not a views topic
  Views v(*f.store, f.options());
  v.catch_up();
  EXPECT_EQ(q(v, "tasks")["total"].as_int64(), 29);
  EXPECT_EQ(q(v, "tasks", {{"workflow", "a1"}})["total"].as_int64(), 2);
  EXPECT_EQ(q(v, "tasks", {{"state", "pending"}})["total"].as_int64(), 25);
  EXPECT_EQ(q(v, "tasks", {{"site", "a"}, {"workflow", "b2"}})["total"].as_int64(), 2);  // t.1 restarted on a
  EXPECT_EQ(q(v, "tasks", {{"q", "m.1"}})["total"].as_int64(), 11);  // m.1, m.10 .. m.19
  // Pages: 10 + 10 + 9, no item twice, the cursor from `next`.
  std::set<std::string> seen;
  std::map<std::string, std::string> params{{"limit", "10"}};
  int pages = 0;
  for (;;) {
    auto page = q(v, "tasks", params);
    ++pages;
    for (const auto& it : page["items"].as_array())
      EXPECT_TRUE(seen.insert(std::string(it.at("workflow").as_string()) + "/" + std::string(it.at("task_id").as_string())).second);
    if (page["next"].is_null()) break;
    params["after"] = std::string(page["next"].as_string());
  }
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen.size(), 29u);
  // A token that may subscribe to a1.events only sees a1.
  auto only_a1 = [](const std::string& wf) { return wf == "a1"; };
  EXPECT_EQ(q(v, "tasks", {}, only_a1)["total"].as_int64(), 2);
  EXPECT_EQ(q(v, "workflows", {}, only_a1)["total"].as_int64(), 1);
  // Bad queries say what is allowed.
  EXPECT_THROW(q(v, "tasks", {{"limit", "0"}}), ViewQueryError);
  EXPECT_THROW(q(v, "tasks", {{"limit", "12x"}}), ViewQueryError);
  try {
    q(v, "tasks", {{"colour", "red"}});
    FAIL();
  } catch (const ViewQueryError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown parameter 'colour' for the tasks view (known: workflow, limit, after, state"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(q(v, "nope"), ViewQueryError);
}

// The totals of the console's queries (a workflow, a state) come from counts the views keep
// as they change, and the page walk stops one item past the page: both must agree with a
// full walk (`q=` matches every id and forces one), through a first sight of an instance in
// an anomaly, restarts, state changes and eviction, and again after a snapshot is loaded.
TEST(Views, CountedTotalsAgreeWithAWalkAndPagesStillCoverEverything) {
  Fixture f;
  workflow(f, "a1");
  workflow(f, "b2");
  std::vector<std::string> evs;
  evs.push_back(f.ev("anomaly.predicted", {{"series", "task.step_time"}, {"score", 0.7}, {"task_id", "early"}}));
  for (int i = 0; i < 40; ++i) {
    const std::string id = "m." + std::to_string(i);
    evs.push_back(f.ev("task.submitted", {{"task_id", id}, {"name", "m"}, {"attempt", 1}}));
    if (i % 2) evs.push_back(f.ev("task.started", {{"task_id", id}, {"site", "a"}, {"attempt", 1}}));
    if (i % 4 == 1) evs.push_back(f.ev("task.completed", {{"task_id", id}, {"site", "a"}, {"attempt", 1}}));
  }
  evs.push_back(f.ev("task.submitted", {{"task_id", "early"}, {"name", "e"}, {"attempt", 1}}));
  evs.push_back(f.ev("task.progress", {{"task_id", "silent"}, {"progress", 0.1}}));  // seen first in progress
  f.publish("b2.events", evs);
  auto check = [&](const Views& v) {
    for (const std::string wf : {"", "a1", "b2", "none"})
      for (const std::string state : {"", "pending", "running", "completed", "failed", "nothing"}) {
        std::map<std::string, std::string> p;
        if (!wf.empty()) p["workflow"] = wf;
        if (!state.empty()) p["state"] = state;
        auto walked = p;
        walked["q"] = "";
        SCOPED_TRACE("workflow=" + wf + " state=" + state);
        const auto total = q(v, "tasks", p)["total"].as_int64();
        EXPECT_EQ(total, q(v, "tasks", walked)["total"].as_int64());
        // Pages of 7 through the counted path: every item once, as many as the total.
        std::set<std::string> seen;
        p["limit"] = "7";
        for (int pages = 0; pages < 20; ++pages) {
          auto page = q(v, "tasks", p);
          for (const auto& it : page["items"].as_array())
            EXPECT_TRUE(seen.insert(std::string(it.at("workflow").as_string()) + "/" +
                                    std::string(it.at("task_id").as_string())).second);
          if (page["next"].is_null()) break;
          p["after"] = std::string(page["next"].as_string());
        }
        EXPECT_EQ(static_cast<std::int64_t>(seen.size()), total);
      }
    auto only_a1 = [](const std::string& wf) { return wf == "a1"; };
    EXPECT_EQ(q(v, "tasks", {}, only_a1)["total"].as_int64(), q(v, "tasks", {{"q", ""}}, only_a1)["total"].as_int64());
  };
  {
    Views v(*f.store, f.options());
    v.catch_up();
    EXPECT_EQ(q(v, "tasks", {{"workflow", "b2"}})["total"].as_int64(), 2 + 40 + 2);
    check(v);
  }  // the destructor writes the snapshot
  Views again(*f.store, f.options());
  check(again);
}

TEST(Views, SnapshotGivesTheSameAnswersAndTheRestIsReadOn) {
  Fixture f;
  workflow(f, "beam");
  json::object before_tasks, before_sites, before_actions;
  {
    Views v(*f.store, f.options());
    v.catch_up();
    before_tasks = q(v, "tasks");
    before_sites = q(v, "sites");
    before_actions = q(v, "actions");
  }  // the destructor writes the snapshot
  ASSERT_TRUE(fs::exists(f.dir.path() / "data" / "views" / "snapshot.json"));
  {
    Views v(*f.store, f.options());
    EXPECT_NE(v.snapshot_note().find("snapshot loaded"), std::string::npos) << v.snapshot_note();
    EXPECT_TRUE(v.caught_up());
    EXPECT_EQ(v.catch_up(), 0u);  // nothing read again
    EXPECT_EQ(q(v, "tasks"), before_tasks);
    EXPECT_EQ(q(v, "sites"), before_sites);
    EXPECT_EQ(q(v, "actions"), before_actions);
    f.publish("beam.events", {f.ev("task.completed", {{"task_id", "t.1"}, {"site", "a"}, {"attempt", 2}})});
    EXPECT_EQ(v.catch_up(), 1u);
    EXPECT_EQ(q(v, "tasks", {{"state", "completed"}})["total"].as_int64(), 2);
  }
  // Rebuilt from the log alone (no snapshot), the answers are the same as with it.
  json::object with = [&] {
    Views v(*f.store, f.options());
    return q(v, "tasks");
  }();
  fs::remove(f.dir.path() / "data" / "views" / "snapshot.json");
  Views v(*f.store, f.options());
  EXPECT_NE(v.snapshot_note().find("no snapshot"), std::string::npos);
  v.catch_up();
  json::object without = q(v, "tasks");
  without["version"] = with["version"];  // the change counter differs (it counts per run): the rest must not
  EXPECT_EQ(without, with);
}

TEST(Views, CorruptOrAheadSnapshotIsSetAsideAndRebuilt) {
  Fixture f;
  workflow(f, "beam");
  const fs::path snap = f.dir.path() / "data" / "views" / "snapshot.json";
  fs::create_directories(snap.parent_path());
  std::ofstream(snap) << "{\"format\": 1, \"offsets\": {tr";
  {
    Views v(*f.store, f.options());
    EXPECT_NE(v.snapshot_note().find("snapshot set aside"), std::string::npos) << v.snapshot_note();
    EXPECT_TRUE(fs::exists(snap.parent_path() / "snapshot.json.bad"));
    v.catch_up();
    EXPECT_EQ(q(v, "tasks")["total"].as_int64(), 2);
  }
  // A snapshot that claims more of a topic than the log holds (the log lost its tail).
  std::string text;
  {
    std::ifstream in(snap);
    std::stringstream s;
    s << in.rdbuf();
    text = s.str();
  }
  json::object root = json::parse(text).as_object();
  root["offsets"].as_object()["beam.events"] = 1000;
  std::ofstream(snap) << json::serialize(root);
  Views v(*f.store, f.options());
  EXPECT_NE(v.snapshot_note().find("ahead of the log on beam.events"), std::string::npos) << v.snapshot_note();
  v.catch_up();
  EXPECT_EQ(q(v, "tasks")["total"].as_int64(), 2);
}

TEST(Views, BadRecordsAreSkippedAndTheRestKept) {
  Fixture f;
  f.publish("w.events", {"not json", "[1,2]", f.ev("task.submitted", {{"name", "no id"}}),
                         f.ev("task.submitted", {{"task_id", "ok"}}), "{\"type\": \"org.diaspora.task.started\"}"});
  Views v(*f.store, f.options());
  v.catch_up();
  EXPECT_EQ(v.applied(), 1u);
  EXPECT_EQ(v.skipped(), 4u);
  EXPECT_EQ(q(v, "tasks")["total"].as_int64(), 1);
}

TEST(Views, ChangesSinceAVersion) {
  Fixture f;
  Views v(*f.store, f.options());
  f.publish("w.events", {f.ev("task.submitted", {{"task_id", "x"}})});
  v.catch_up();
  const std::uint64_t at = v.version();
  f.publish("w.events", {f.ev("task.started", {{"task_id", "x"}, {"site", "s"}})});
  v.catch_up();
  bool lost = true;
  auto ch = v.changes_since(at, 100, &lost);
  EXPECT_FALSE(lost);
  std::set<std::string> views;
  for (const auto& c : ch) {
    EXPECT_GT(c.version, at);
    views.insert(c.view);
  }
  EXPECT_EQ(views, (std::set<std::string>{"workflows", "tasks", "sites"}));
  EXPECT_TRUE(v.changes_since(v.version(), 100, &lost).empty());
}

TEST(Views, ReaderThreadFollowsTheLog) {
  Fixture f;
  Views v(*f.store, f.options());
  f.store->set_commit_listener([&](const std::string& topic, std::uint64_t) { v.notify(topic); });
  v.start();
  f.publish("w.events", {f.ev("task.submitted", {{"task_id", "x"}})});
  for (int i = 0; i < 200 && !(v.caught_up() && v.applied() == 1); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(q(v, "tasks")["total"].as_int64(), 1);
  v.stop();         // as the relay stops: the reader first,
  f.store.reset();  // then the log (its writer may still notify),
}                   // then the views (the last snapshot)

TEST(Views, HeartbeatsWithin250msOfTheLastReadInFullOnlyMoveTheTime) {
  Fixture f;
  std::vector<std::string> evs = {f.ev("task.submitted", {{"task_id", "x"}}), f.ev("task.started", {{"task_id", "x"}, {"site", "s"}})};
  for (int i = 0; i < 10; ++i) evs.push_back(f.ev("task.heartbeat", {{"task_id", "x"}, {"metrics", {{"step_time_s", 1.0 + i}}}}));
  f.publish("w.events", evs);  // one batch: one append time
  Views v(*f.store, f.options());
  v.catch_up();
  auto x = q(v, "tasks")["items"].as_array()[0].as_object();
  EXPECT_EQ(x.at("step_time_s").as_double(), 1.0);  // the first, read in full; the next 9 within 250 ms
  EXPECT_EQ(x.at("last_heartbeat_us").as_int64(), x.at("beat_applied_us").as_int64());
  EXPECT_EQ(q(v, "workflows")["items"].as_array()[0].at("events").as_int64(), 12);  // every one counted
  EXPECT_EQ(v.applied(), 12u);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  f.publish("w.events", {f.ev("task.heartbeat", {{"task_id", "x"}, {"metrics", {{"step_time_s", 42.0}}}})});
  v.catch_up();
  x = q(v, "tasks")["items"].as_array()[0].as_object();
  EXPECT_EQ(x.at("step_time_s").as_double(), 42.0);  // 300 ms later: read in full
  EXPECT_GT(x.at("last_heartbeat_us").as_int64(), x.at("started_us").as_int64() + 250'000);
}

TEST(Views, ProgressMetricsOfATrainingJobMakeItsSeries) {
  Fixture f;
  std::vector<std::string> evs = {f.ev("task.submitted", {{"task_id", "job"}, {"name", "rehearsal"}})};
  for (int i = 0; i < 70; ++i)
    evs.push_back(f.ev("task.progress", {{"task_id", "job"}, {"progress", i / 70.0}, {"step", i},
                                         {"metrics", {{"loss", 1.0 / (i + 1)}, {"buffer_fill", 10.0 * i}, {"step_time_s", 0.1}}}}));
  evs.push_back(f.ev("task.progress", {{"task_id", "plain"}, {"progress", 0.5}, {"metrics", {{"step_time_s", 0.2}}}}));
  f.publish("w.events", evs);
  Views v(*f.store, f.options());
  v.catch_up();
  auto items = q(v, "tasks")["items"].as_array();
  const auto& job = items[0].as_object();
  ASSERT_EQ(job.at("task_id").as_string(), "job");
  const auto& series = job.at("series").as_array();
  ASSERT_EQ(series.size(), 64u);  // the last 64 of 70
  EXPECT_EQ(series.front().at("step").as_int64(), 6);
  EXPECT_EQ(series.back().at("values").at("buffer_fill").as_double(), 690.0);
  EXPECT_FALSE(series.back().at("values").as_object().contains("step_time_s"));
  EXPECT_DOUBLE_EQ(job.at("metrics").at("loss").as_double(), 1.0 / 70);
  EXPECT_EQ(items[1].at("series").as_array().size(), 0u);  // step time only: no series
  EXPECT_EQ(items[1].at("step_time_s").as_double(), 0.2);
}

TEST(Views, EvaluationsAreKeptApartFromTheSeries) {
  Fixture f;
  std::vector<std::string> evs = {f.ev("task.submitted", {{"task_id", "job"}, {"name", "rehearsal"}}),
                                  f.ev("task.started", {{"task_id", "job"}, {"site", "s"}})};
  for (int task = 0; task < 3; ++task) {
    for (int i = 0; i < 30; ++i)  // heartbeats with a training job's metrics also make its series
      evs.push_back(f.ev("task.heartbeat", {{"task_id", "job"}, {"metrics", {{"loss", 1.0}, {"step_time", 0.1}}}}));
    json::object m{{"eval_after_task", task}, {"average_accuracy", 0.9 - 0.05 * task}};
    for (int j = 0; j <= task; ++j) m["accuracy.t" + std::to_string(j)] = 0.9 - 0.05 * (task - j);
    evs.push_back(f.ev("task.heartbeat", {{"task_id", "job"}, {"metrics", m}}));  // within 250 ms: read in full all the same
  }
  f.publish("w.events", evs);
  Views v(*f.store, f.options());
  v.catch_up();
  const auto job = q(v, "tasks")["items"].as_array()[0].as_object();
  const auto& evals = job.at("evals").as_array();
  ASSERT_EQ(evals.size(), 3u);
  EXPECT_EQ(evals[2].at("after_task").as_int64(), 2);
  EXPECT_DOUBLE_EQ(evals[2].at("values").at("accuracy.t0").as_double(), 0.8);
  EXPECT_FALSE(evals[2].at("values").as_object().contains("eval_after_task"));
  EXPECT_FALSE(job.at("metrics").as_object().contains("accuracy.t0"));  // not a running metric
  EXPECT_GE(job.at("series").as_array().size(), 1u);
  for (const auto& p : job.at("series").as_array()) EXPECT_FALSE(p.at("values").as_object().contains("accuracy.t0"));
}

// The fast path finds its keys wherever they sit: every alignment against the 16-byte
// blocks the search compares at once, and the tail it checks byte by byte.
TEST(Views, EvaluationsAreFoundAtEveryPositionInTheText) {
  Fixture f;
  std::vector<std::string> evs = {f.ev("task.submitted", {{"task_id", "job"}}), f.ev("task.started", {{"task_id", "job"}, {"site", "s"}})};
  constexpr int kEvals = 48;
  for (int i = 0; i < kEvals; ++i) {
    evs.push_back(f.ev("task.heartbeat", {{"task_id", "job"}, {"metrics", {{"loss", 1.0}}}}));  // within 250 ms of the last full read
    evs.push_back(f.ev("task.heartbeat", {{"task_id", "job"},
                                          {"metrics", {{"pad", std::string(static_cast<std::size_t>(i), 'y')}, {"eval_after_task", i}}}}));
  }
  f.publish("w.events", evs);
  Views v(*f.store, f.options());
  v.catch_up();
  const auto job = q(v, "tasks")["items"].as_array()[0].as_object();
  const auto& evals = job.at("evals").as_array();
  ASSERT_EQ(evals.size(), static_cast<std::size_t>(kEvals));
  for (int i = 0; i < kEvals; ++i) EXPECT_EQ(evals[static_cast<std::size_t>(i)].at("after_task").as_int64(), i);
  EXPECT_EQ(q(v, "workflows")["items"].as_array()[0].at("events").as_int64(), 2 + 2 * kEvals);
}

TEST(Views, SiteHealthOverTimeThresholdsAndDrain) {
  Fixture f;
  f.publish("w.events", {f.ev("task.submitted", {{"task_id", "t.0"}}),
                         json::serialize(json::object{{"specversion", "1.0"}, {"id", "s1"}, {"source", "/diaspora/w/edge"},
                                                      {"type", "org.diaspora.task.started"},
                                                      {"data", {{"task_id", "t.0"}, {"site", "a"}}}}),
                         f.ev("anomaly.predicted", {{"series", "task.heartbeat_gap:t.0"}, {"score", 0.99999}, {"detector", "phi-accrual"},
                                                    {"site", "a"}, {"policy", "lost"}, {"score_threshold", 0.9999}})});
  f.publish("w.events", {f.ev("task.failed", {{"task_id", "t.0"}, {"site", "a"}, {"reason", "lost"}})});
  Views v(*f.store, f.options());
  v.catch_up();
  auto site = q(v, "sites")["items"].as_array()[0].as_object();
  EXPECT_EQ(site.at("engine").as_string(), "edge");
  EXPECT_FALSE(site.at("drained").as_bool());
  const auto& score = site.at("scores").as_array()[0];
  EXPECT_DOUBLE_EQ(score.at("threshold").as_double(), 0.9999);
  EXPECT_EQ(score.at("policy").as_string(), "lost");
  const auto& hist = site.at("history").as_array();
  ASSERT_GE(hist.size(), 1u);  // the prediction lowered it; the failure within a second replaced that point
  EXPECT_NEAR(hist.back().at("health").as_double(), site.at("health").as_double(), 0.01);  // changes under 0.01 wait
  EXPECT_LT(site.at("health").as_double(), 0.01);
  EXPECT_EQ(v.engine_of_site("w", "a"), "edge");
  EXPECT_EQ(v.engine_of_site("w", "b"), "");
  // A drain is the site's once the engine says it is done; an undrain's done clears it.
  f.publish("w.control.edge", {f.ev("action.requested", {{"action_id", "op1"}, {"action", "drain"}, {"site", "a"}, {"reason", "r"}})});
  v.catch_up();
  EXPECT_FALSE(q(v, "sites")["items"].as_array()[0].at("drained").as_bool());  // asked, not done
  f.publish("w.events", {f.ev("action.done", {{"action_id", "op1"}, {"status", "done"}, {"action", "drain"}})});
  v.catch_up();
  EXPECT_TRUE(q(v, "sites")["items"].as_array()[0].at("drained").as_bool());
  f.publish("w.control.edge", {f.ev("action.requested", {{"action_id", "op2"}, {"action", "undrain"}, {"site", "a"}, {"reason", "r"}})});
  f.publish("w.events", {f.ev("action.done", {{"action_id", "op2"}, {"status", "failed"}, {"message", "no"}})});
  v.catch_up();
  EXPECT_TRUE(q(v, "sites")["items"].as_array()[0].at("drained").as_bool());  // a failed undrain changes nothing
}

// At a federated centre each site's events come through a source of their own: a task
// migrated from site a to site b may be seen done at b before its failure at a arrives.
// The late events of the earlier attempt fill in its record; the task stays completed.
// The views of a workflow "fed" after `events` (on fed.events): its one task, and the
// workflow's count of each state.
static std::pair<json::object, json::object> one_task_after(Fixture& f, const std::vector<std::string>& events) {
  f.publish("fed.events", events);
  Views v(*f.store, f.options());
  v.catch_up();
  auto tasks = q(v, "tasks");
  EXPECT_EQ(tasks["total"].as_int64(), 1);
  return {tasks["items"].as_array().at(0).as_object(),
          q(v, "workflows")["items"].as_array().at(0).as_object().at("states").as_object()};
}

TEST(Views, ALateFirstSubmissionWithoutAnAttemptNumberDoesNotUndoTheLatestAttempt) {
  // As a federated centre saw it (test_relay_federation under load): site b's attempt 2 of
  // the migrated task came first, then site a's whole story, whose submission (the first)
  // names no attempt.
  Fixture f;
  const auto [t, states] = one_task_after(f, {
      f.ev("task.started", {{"task_id", "t.0"}, {"site", "b"}, {"worker", "b/w1"}, {"attempt", 2}}),
      f.ev("task.completed", {{"task_id", "t.0"}, {"site", "b"}, {"attempt", 2}}),
      f.ev("task.submitted", {{"task_id", "t.0"}, {"name", "t"}, {"site", "a"}}),
      f.ev("task.started", {{"task_id", "t.0"}, {"site", "a"}, {"worker", "a/w1"}, {"attempt", 1}}),
      f.ev("task.failed", {{"task_id", "t.0"}, {"site", "a"}, {"attempt", 1}, {"reason", "worker died"}}),
  });
  EXPECT_EQ(t.at("state").as_string(), "completed");
  EXPECT_EQ(t.at("site").as_string(), "b");
  EXPECT_EQ(t.at("attempts").as_array().size(), 2u);
  EXPECT_EQ(states.at("completed").as_int64(), 1);
  EXPECT_FALSE(states.contains("pending"));
}

TEST(Views, ALateEventOfAnEarlierAttemptDoesNotUndoTheLatestOne) {
  Fixture f;
  f.publish("fed.events", {
      f.ev("task.submitted", {{"task_id", "t.0"}, {"name", "t"}, {"attempt", 1}}),
      f.ev("task.submitted", {{"task_id", "t.0"}, {"name", "t"}, {"attempt", 2}}),  // site b's, first at the centre
      f.ev("task.started", {{"task_id", "t.0"}, {"site", "b"}, {"worker", "b/w0"}, {"attempt", 2}}),
      f.ev("task.completed", {{"task_id", "t.0"}, {"site", "b"}, {"attempt", 2}}),
      f.ev("task.started", {{"task_id", "t.0"}, {"site", "a"}, {"worker", "a/w0"}, {"attempt", 1}}),  // site a's, late
      f.ev("task.heartbeat", {{"task_id", "t.0"}, {"site", "a"}, {"attempt", 1}}),
      f.ev("task.failed", {{"task_id", "t.0"}, {"site", "a"}, {"attempt", 1}, {"reason", "worker died"}}),
  });
  Views v(*f.store, f.options());
  v.catch_up();
  auto tasks = q(v, "tasks");
  ASSERT_EQ(tasks["total"].as_int64(), 1);
  const auto& t = tasks["items"].as_array()[0].as_object();
  EXPECT_EQ(t.at("state").as_string(), "completed");
  EXPECT_EQ(t.at("attempt").as_int64(), 2);
  EXPECT_EQ(t.at("site").as_string(), "b");
  const auto& attempts = t.at("attempts").as_array();
  ASSERT_EQ(attempts.size(), 2u);
  EXPECT_EQ(attempts[0].at("attempt").as_int64(), 1);
  EXPECT_EQ(attempts[0].at("site").as_string(), "a");
  EXPECT_EQ(attempts[0].at("outcome").as_string(), "failed");
  EXPECT_EQ(attempts[0].at("reason").as_string(), "worker died");
  EXPECT_EQ(attempts[1].at("outcome").as_string(), "completed");
  auto sites = q(v, "sites");
  ASSERT_EQ(sites["total"].as_int64(), 2);
  const auto& a = sites["items"].as_array()[0].as_object();
  EXPECT_EQ(a.at("failed").as_int64(), 1);  // the late failure still counts against its site
  EXPECT_EQ(a.at("running").as_int64(), 0);
  const auto wf = q(v, "workflows")["items"].as_array()[0].as_object();
  EXPECT_EQ(wf.at("states").at("completed").as_int64(), 1);
  EXPECT_FALSE(wf.at("states").as_object().contains("failed"));
}
