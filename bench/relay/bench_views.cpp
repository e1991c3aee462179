// The relay's views (relay/src/views.hpp) over 100,000 task instances: how fast they are
// built from the log (events/s on one thread) and how long a query takes, against the
// 50 ms target. The log is a real LogStore (fsync never: the disk is not what is measured).
//
//   bench_views [--instances 100000] [--sites 8] [--repeat 21] [--json]
//
// The workload: each instance submitted, started on one of `sites` sites, with two
// heartbeats, and 90 % of them ended (completed, or failed one time in ten): five or six
// events an instance, across two workflows. Queries (median of --repeat runs each): the
// first page of every task, the running ones (a filter over every instance), a site's
// page within one workflow, a page deep in the list (by cursor), the sites, the workflows.
#include <CLI/CLI.hpp>

#include <boost/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <iostream>
#include <string>
#include <vector>

#include "topic_log.hpp"
#include "views.hpp"

namespace fs = std::filesystem;
namespace json = boost::json;
using Clock = std::chrono::steady_clock;
using diaspora::relay::AppendRecord;
using diaspora::relay::FsyncPolicy;
using diaspora::relay::LogOptions;
using diaspora::relay::LogStore;
using diaspora::relay::Views;

namespace {

std::string event(std::uint64_t n, const char* type, const json::object& data) {
  return json::serialize(json::object{{"specversion", "1.0"}, {"id", std::to_string(n)}, {"source", "/bench"},
                                      {"type", std::string("org.diaspora.") + type}, {"data", data}});
}

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The relay's views over many task instances: build rate and query latency"};
  long instances = 100000;
  int sites = 8, repeat = 21, heartbeats = 2;
  bool json_out = false;
  app.add_option("--instances", instances)->check(CLI::Range(1L, 10'000'000L))->capture_default_str();
  app.add_option("--sites", sites)->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--repeat", repeat)->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--heartbeats", heartbeats, "Heartbeats per instance")->check(CLI::Range(0, 1000))->capture_default_str();
  app.add_flag("--json", json_out);
  CLI11_PARSE(app, argc, argv);

  const fs::path dir = fs::temp_directory_path() / ("diaspora-bench-views-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::uint64_t events = 0;
  {
    LogOptions o;
    o.data_dir = dir / "data";
    o.fsync = FsyncPolicy::parse("never");
    LogStore store(o);
    std::vector<std::future<void>> pending;
    std::vector<AppendRecord> batch;
    auto flush = [&](const std::string& topic) {
      if (batch.empty()) return;
      auto p = std::make_shared<std::promise<void>>();
      pending.push_back(p->get_future());
      store.append(topic, "", 0, std::move(batch), [p](const auto&) { p->set_value(); });
      batch.clear();
    };
    for (int wf = 0; wf < 2; ++wf) {
      const std::string topic = "wf" + std::to_string(wf) + ".events";
      for (long i = wf; i < instances; i += 2) {
        const std::string id = "task." + std::to_string(i);
        const std::string site = "site-" + std::to_string(i % sites);
        batch.push_back({"", event(++events, "task.submitted", {{"task_id", id}, {"name", "task"}, {"attempt", 1}})});
        batch.push_back({"", event(++events, "task.started", {{"task_id", id}, {"site", site}, {"attempt", 1}, {"worker", site + "/w0"}})});
        for (int h = 0; h < heartbeats; ++h)
          batch.push_back({"", event(++events, "task.heartbeat", {{"task_id", id}, {"metrics", {{"step_time_s", 0.5 + h}}}})});
        if (i % 10 != 9)
          batch.push_back({"", i % 10 == 3 ? event(++events, "task.failed", {{"task_id", id}, {"site", site}, {"attempt", 1}, {"reason", "exit status 1"}})
                                           : event(++events, "task.completed", {{"task_id", id}, {"site", site}, {"attempt", 1}})});
        if (batch.size() >= 5000) flush(topic);
      }
      flush(topic);
    }
    for (auto& f : pending) f.get();

    Views views(store, Views::Options{dir / "data" / "views"});
    const auto t0 = Clock::now();
    const std::size_t applied = views.catch_up();
    const double build_s = ms_since(t0) / 1000;
    const auto snap0 = Clock::now();
    views.write_snapshot();
    const double snapshot_ms = ms_since(snap0);
    const auto snapshot_bytes = fs::file_size(dir / "data" / "views" / "snapshot.json");

    auto all = [](const std::string&) { return true; };
    struct Query {
      const char* name;
      const char* view;
      std::map<std::string, std::string> params;
    };
    // A cursor half-way through: the key of the instance in the middle.
    json::object half = views.query("tasks", {{"limit", std::to_string(std::min<long>(1000, instances / 2))}}, all);
    std::string cursor = half["next"].is_string() ? std::string(half["next"].as_string()) : "";
    std::vector<Query> queries = {
        {"tasks, first page (100)", "tasks", {}},
        {"tasks?state=running (filter over all)", "tasks", {{"state", "running"}}},
        {"tasks?workflow=wf1&site=site-3", "tasks", {{"workflow", "wf1"}, {"site", "site-3"}}},
        {"tasks?after=<cursor> (a deep page)", "tasks", {{"after", cursor}}},
        {"tasks?q=task.4242 (substring)", "tasks", {{"q", "task.4242"}}},
        {"sites", "sites", {}},
        {"workflows", "workflows", {}},
    };
    json::array rows;
    double worst = 0;
    for (const auto& q : queries) {
      std::vector<double> ms;
      std::int64_t total = 0;
      for (int r = 0; r < repeat; ++r) {
        const auto t = Clock::now();
        json::object page = views.query(q.view, q.params, all);
        const std::string body = json::serialize(page);  // as the API answers it
        ms.push_back(ms_since(t));
        total = page["total"].as_int64();
      }
      std::sort(ms.begin(), ms.end());
      const double median = ms[ms.size() / 2], max = ms.back();
      worst = std::max(worst, median);
      rows.push_back(json::object{{"query", q.name}, {"median_ms", median}, {"max_ms", max}, {"total", total}});
      if (!json_out) std::printf("  %-42s median %7.2f ms  max %7.2f ms  (%lld items match)\n", q.name, median, max,
                                 static_cast<long long>(total));
    }
    const double rate = static_cast<double>(applied) / build_s;
    if (json_out) {
      std::cout << json::serialize(json::object{{"instances", instances}, {"events", applied}, {"build_s", build_s},
                                                {"events_per_s", rate}, {"snapshot_ms", snapshot_ms},
                                                {"snapshot_bytes", snapshot_bytes}, {"queries", rows},
                                                {"worst_median_ms", worst}, {"target_ms", 50}})
                << "\n";
    } else {
      std::printf("views over %ld instances: %zu events applied in %.2f s (%.0f events/s, one thread); snapshot %.0f ms, %.1f MB\n",
                  instances, applied, build_s, rate, snapshot_ms, static_cast<double>(snapshot_bytes) / 1e6);
      std::printf("worst median query: %.2f ms (target <= 50 ms): %s\n", worst, worst <= 50 ? "met" : "NOT met");
    }
  }
  fs::remove_all(dir);
  return 0;
}
