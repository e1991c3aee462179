// The engine plugin's parts: the serialiser (every record kind yields a valid event), the
// task tracker, the lock-free slot queue under contention, and the whole plugin with many
// engine threads against an embedded relay (real TLS on 127.0.0.1) -- the test that also
// runs under ThreadSanitizer (make test-tsan).
#include <arpa/inet.h>
#include <boost/json.hpp>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <ctime>

#include <sys/resource.h>
#include <cmath>
#include <cstdint>
#include <future>
#include <map>
#include <set>
#include <thread>

#include "diaspora/certs.hpp"
#include "diaspora/event.hpp"
#include "diaspora/plugin.h"
#include "diaspora/relay.hpp"
#include "diaspora/client.hpp"
#include "diaspora/token.hpp"
#include "record.hpp"
#include "serialize.hpp"
#include "test_helpers.hpp"
#include "tick_clock.hpp"
#include "tracker.hpp"

namespace dp = diaspora::plugin;
namespace json = boost::json;
using diaspora::test::TempDir;

namespace {

// A task hook's argument for task `id` (no step, no site): what most tests report.
diaspora_task_info task_info(const char* id) {
  diaspora_task_info info{};
  info.struct_size = sizeof info;
  info.task_id = id;
  info.step = -1;
  return info;
}

}  // namespace

namespace {

// A record built the way the hooks build one.
struct TestRecord {
  dp::RecordHead head;
  char arena[4096];

  TestRecord(dp::Kind kind, std::string_view key, std::int64_t t = 1'700'000'000'000'000) {
    head.kind = kind;
    head.time_us = t;
    put(dp::f_key, key);
  }
  TestRecord& put(dp::Field f, std::string_view s) {
    dp::ArenaWriter{head, arena}.put(f, s);
    return *this;
  }
  TestRecord& metric(std::string_view name, double v) {
    dp::ArenaWriter w{head, arena};
    if (head.metric_count == 0) w.begin_metrics();
    w.metric(name, v);
    return *this;
  }
  dp::RecordView view() const { return {&head, arena}; }
};

json::object serialize_and_check(const dp::RecordView& r, const dp::Derived& d = {}) {
  dp::EventContext ctx{"/diaspora/wf/engine-1", "wf", "engine-1"};
  std::string text;
  dp::append_event(text, r, "id-1", ctx, d);
  json::value v = json::parse(text);
  EXPECT_NO_THROW(diaspora::check_event_json(v)) << text;  // CloudEvents rules + payload schema
  return v.as_object();
}

}  // namespace

TEST(PluginSerialize, EveryKindIsAValidEvent) {
  using K = dp::Kind;
  for (K k : {K::submitted, K::started, K::heartbeat, K::progress, K::completed, K::failed, K::cancelled}) {
    TestRecord r(k, "task-1");
    r.put(dp::f_site, "edge").put(dp::f_worker, "w-3").put(dp::f_name, "reconstruct").put(dp::f_text, "worker lost");
    r.head.attempt = 2;
    r.head.flags = dp::has_exit_code | dp::retryable | dp::has_step | dp::has_deadline;
    r.head.exit_code = 137;
    r.head.number = k == K::progress ? 0.25 : 30.0;
    r.head.integer = 12;
    r.metric("step_time_s", 0.125).metric("memory_bytes", 3e9);
    dp::Derived d;
    d.queue_wait_s = 1.5;
    d.runtime_s = 9.25;
    d.heartbeat_seq = 4;
    json::object e = serialize_and_check(r.view(), d);
    EXPECT_EQ(e["subject"], "task-1");
    EXPECT_EQ(e["source"], "/diaspora/wf/engine-1");
    EXPECT_EQ(e["time"], "2023-11-14T22:13:20.000000Z");
    json::object& data = e["data"].as_object();
    EXPECT_EQ(data["task_id"], "task-1");
    EXPECT_EQ(data["workflow"], "wf");
    EXPECT_EQ(data["attempt"], 2);
    if (k == K::started) {
      EXPECT_EQ(data["queue_wait_s"], 1.5);
    }
    if (k == K::completed) {
      EXPECT_EQ(data["runtime_s"], 9.25);
    }
    if (k == K::failed) {
      EXPECT_EQ(data["reason"], "worker lost");
    }
    if (k == K::failed) {
      EXPECT_EQ(data["retryable"], true);
    }
    if (k == K::heartbeat) {
      EXPECT_EQ(data["seq"], 4);
    }
    if (k == K::progress) {
      EXPECT_EQ(data["progress"], 0.25);
    }
    if (k == K::heartbeat || k == K::progress) {
      EXPECT_EQ(data["metrics"].as_object()["memory_bytes"], 3e9);
    }
  }
  TestRecord m(K::metric, "edge");
  m.put(dp::f_name, "queue_length");
  m.head.scope = DIASPORA_SCOPE_SITE;
  m.head.number = 7;
  dp::Derived d;
  d.coalesced = 4;
  json::object e = serialize_and_check(m.view(), d);
  EXPECT_EQ(e["data"].as_object()["count"], 5);  // the kept sample plus 4 merged into it
  EXPECT_EQ(e["data"].as_object()["scope"], "site");

  TestRecord data(K::data, "detector-0");
  data.put(dp::f_text, "file:///data/f.h5").put(dp::f_extra, "crc32c:1a2b3c4d").put(dp::f_site, "edge");
  data.head.flags = dp::has_bytes;
  data.head.integer = 41;
  data.head.integer2 = 1 << 20;
  e = serialize_and_check(data.view());
  EXPECT_EQ(e["data"].as_object()["seq"], 41);

  TestRecord res(K::resource, "node-7");
  res.put(dp::f_name, "node").put(dp::f_extra, "degraded").metric("load", 3.5);
  e = serialize_and_check(res.view());
  EXPECT_EQ(e["data"].as_object()["state"], "degraded");
}

TEST(PluginSerialize, HostileStringsStayValidJson) {
  const std::string nasty = std::string("q\"uote\\ back\nline\ttab\x01\x7f ") + "\xff\xfe bad utf8 \xe2\x82 end é€😀";
  TestRecord r(dp::Kind::failed, nasty);
  r.put(dp::f_text, nasty);
  json::object e = serialize_and_check(r.view());
  const std::string reason(e["data"].as_object()["reason"].as_string());
  EXPECT_NE(reason.find("q\"uote\\ back\nline\ttab\x01"), std::string::npos);
  EXPECT_NE(reason.find("\xEF\xBF\xBD"), std::string::npos);  // U+FFFD for the invalid bytes
  EXPECT_NE(reason.find("é€😀"), std::string::npos);           // valid multi-byte text kept
}

TEST(PluginSerialize, TimesAreRfc3339WithMicroseconds) {
  std::string out;
  dp::append_time(out, 1'764'496'800'123'456);  // 2025-11-30T10:00:00.123456Z
  EXPECT_EQ(out, "\"2025-11-30T10:00:00.123456Z\"");
  out.clear();
  dp::append_time(out, 0);
  EXPECT_EQ(out, "\"1970-01-01T00:00:00.000000Z\"");
}

TEST(PluginTracker, LifecycleDerivedSeriesAndInvalidTransitions) {
  dp::TaskTracker tracker;
  std::vector<std::pair<std::string, double>> seen;
  tracker.sink = [&](const dp::Observation& o) { seen.emplace_back(std::string(o.series), o.value); };
  const std::int64_t t0 = 1'000'000'000;
  EXPECT_TRUE(tracker.observe(TestRecord(dp::Kind::submitted, "a", t0).view()).warning.empty());
  auto started = tracker.observe(TestRecord(dp::Kind::started, "a", t0 + 2'500'000).view());
  ASSERT_TRUE(started.derived.queue_wait_s);
  EXPECT_DOUBLE_EQ(*started.derived.queue_wait_s, 2.5);
  EXPECT_EQ(tracker.observe(TestRecord(dp::Kind::heartbeat, "a", t0 + 3'500'000).view()).derived.heartbeat_seq, 0);
  EXPECT_EQ(tracker.observe(TestRecord(dp::Kind::heartbeat, "a", t0 + 4'000'000).view()).derived.heartbeat_seq, 1);
  TestRecord p1(dp::Kind::progress, "a", t0 + 5'000'000), p2(dp::Kind::progress, "a", t0 + 7'000'000);
  p1.head.number = 0.2;
  p2.head.number = 0.6;
  tracker.observe(p1.view());
  tracker.observe(p2.view());
  auto done = tracker.observe(TestRecord(dp::Kind::completed, "a", t0 + 12'500'000).view());
  ASSERT_TRUE(done.derived.runtime_s);
  EXPECT_DOUBLE_EQ(*done.derived.runtime_s, 10.0);
  EXPECT_EQ(tracker.state("a"), dp::TaskState::completed);

  std::map<std::string, double> last;
  for (auto& [s, v] : seen) last[s] = v;
  EXPECT_DOUBLE_EQ(last["task.queue_wait_s"], 2.5);
  EXPECT_DOUBLE_EQ(last["task.runtime_s"], 10.0);
  EXPECT_DOUBLE_EQ(last["task.progress_rate"], 0.2);  // 0.4 in 2 s
  EXPECT_DOUBLE_EQ(last["task.heartbeat_gap_s"], 2.0);

  // Out of order: reported, counted, state still follows the engine.
  auto bad = tracker.observe(TestRecord(dp::Kind::started, "a", t0 + 13'000'000).view());
  EXPECT_NE(bad.warning.find("'started' while completed"), std::string::npos) << bad.warning;
  EXPECT_TRUE(tracker.observe(TestRecord(dp::Kind::heartbeat, "b").view()).warning.size() > 0);
  EXPECT_EQ(tracker.invalid_transitions(), 2u);
  // A failed task may be submitted again (a retry).
  tracker.observe(TestRecord(dp::Kind::submitted, "c").view());
  tracker.observe(TestRecord(dp::Kind::failed, "c").view());
  EXPECT_TRUE(tracker.observe(TestRecord(dp::Kind::submitted, "c").view()).warning.empty());
}

TEST(PluginTracker, MemoryIsBounded) {
  dp::TaskTracker tracker(100);
  for (int i = 0; i < 1000; ++i) {
    const std::string id = "t" + std::to_string(i);
    tracker.observe(TestRecord(dp::Kind::submitted, id).view());
    if (i % 2 == 0) tracker.observe(TestRecord(dp::Kind::cancelled, id).view());
  }
  EXPECT_LE(tracker.size(), 100u);
}

TEST(PluginQueue, ManyProducersManyConsumersEachItemOnce) {
  dp::SlotQueue q(1024);
  constexpr int producers = 4, per = 50000;
  std::atomic<int> consumed{0};
  std::vector<std::vector<int>> seen(producers);
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p)
    threads.emplace_back([&, p] {
      for (int i = 0; i < per;) {
        if (q.try_push([&](dp::Slot& s, std::uint64_t) {
              s.head.attempt = p;
              s.head.integer = i;
            }))
          ++i;
        else
          std::this_thread::yield();
      }
    });
  for (int c = 0; c < 2; ++c)
    threads.emplace_back([&] {
      std::vector<std::pair<int, int>> mine;
      while (consumed.load() < producers * per) {
        if (q.try_pop([&](dp::Slot& s, std::uint64_t) {
              mine.emplace_back(s.head.attempt, static_cast<int>(s.head.integer));
            }))
          consumed++;
        else
          std::this_thread::yield();
      }
      std::lock_guard lock(mu);
      for (auto [p, i] : mine) seen[static_cast<std::size_t>(p)].push_back(i);
    });
  for (auto& t : threads) t.join();
  for (auto& s : seen) {
    std::sort(s.begin(), s.end());
    ASSERT_EQ(s.size(), static_cast<std::size_t>(per));
    for (int i = 0; i < per; ++i) ASSERT_EQ(s[static_cast<std::size_t>(i)], i);
  }
  EXPECT_EQ(q.size_approx(), 0u);
}

// ---- the whole plugin, many engine threads, a real relay -------------------------------------

namespace {

struct EmbeddedRelay {
  TempDir dir;
  std::unique_ptr<diaspora::Relay> relay;
  std::string url, token;

  // port 0: a free port, the relay listening at once. A given port: credentials and
  // url now, the relay only when start() is called (a relay that comes up late).
  explicit EmbeddedRelay(std::uint16_t port = 0) {
    diaspora::write_dev_certificates(dir.path() / "certs");
    diaspora::write_secret_file(dir.path() / "secret");
    if (port == 0) {
      start(0);
      port = relay->port();
    }
    url = "wss://127.0.0.1:" + std::to_string(port);
    diaspora::TokenClaims c;
    c.subject = "test";
    c.scopes = {"publish:*", "subscribe:*"};
    c.issued_at = std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now());
    c.expires_at = c.issued_at + std::chrono::hours(1);
    token = diaspora::issue_token(diaspora::load_secret_file(dir.path() / "secret"), c);
    std::ofstream(dir.path() / "token") << token << "\n";
  }

  void start(std::uint16_t port) {
    diaspora::RelayConfig cfg;
    cfg.listen = "127.0.0.1:" + std::to_string(port);
    cfg.data_dir = dir.path() / "data";
    cfg.tls_cert = dir.path() / "certs/server.pem";
    cfg.tls_key = dir.path() / "certs/server-key.pem";
    cfg.auth_secret_file = dir.path() / "secret";
    cfg.fsync = "never";
    relay = std::make_unique<diaspora::Relay>(cfg);
    relay->start();
  }

  std::string spec(const std::string& extra_plugin = "") const {
    return "version: 1\nname: conc\nrelay: {url: '" + url + "', ca_file: '" + (dir.path() / "certs/ca.pem").string() +
           "', token_file: '" + (dir.path() / "token").string() + "'}\nplugin: {spool_dir: '" +
           (dir.path() / "spool").string() + "', control: false" + extra_plugin +
           "}\nsites: [{name: local, engine: local}]\n";
  }

  // Every event of the topic, read from the start until `n` task events arrived.
  std::vector<json::object> read(std::size_t n) const {
    diaspora::RelayClientOptions o;
    o.url = url;
    o.ca_file = dir.path() / "certs/ca.pem";
    o.token = token;
    diaspora::RelayClient c(o);
    c.send(R"({"op":"subscribe","id":"t","topic":"conc.events","from":"earliest"})");
    std::vector<json::object> out;
    std::size_t tasks = 0;
    while (tasks < n) {
      json::object m = c.receive_json();
      if (m["op"] != "events") continue;
      for (auto& e : m["events"].as_array()) {
        json::object ev = e.as_object()["event"].as_object();
        if (ev["type"].as_string().starts_with("org.diaspora.task.")) ++tasks;
        out.push_back(std::move(ev));
      }
    }
    return out;
  }
};

}  // namespace

TEST(PluginConcurrency, ManyEngineThreadsEveryEventOnceInOrderPerThread) {
  EmbeddedRelay relay;
  diaspora_plugin* h = nullptr;
  char err[2048];
  // A small queue so that hooks also take the spill path while the publisher drains.
  ASSERT_EQ(diaspora_open_yaml(relay.spec(", queue_size: 64").c_str(), &h, err, sizeof err), DIASPORA_OK) << err;
  constexpr int threads = 4, tasks = 500;
  std::vector<std::thread> engine;
  std::atomic<int> failures{0};
  for (int k = 0; k < threads; ++k)
    engine.emplace_back([&, k] {
      for (int t = 0; t < tasks; ++t) {
        const std::string id = "th" + std::to_string(k) + "-" + std::to_string(t);
        diaspora_task_info info = task_info(id.c_str());
        diaspora_metric_value m{"k", 0};
        failures += diaspora_task_submitted(h, &info) != DIASPORA_OK;
        failures += diaspora_task_started(h, &info) != DIASPORA_OK;
        info.metrics = &m;
        info.metric_count = 1;
        for (int b = 0; b < 3; ++b) {
          m.value = b;
          failures += diaspora_task_heartbeat(h, &info) != DIASPORA_OK;
        }
        info.metrics = nullptr;
        info.metric_count = 0;
        failures += diaspora_task_completed(h, &info) != DIASPORA_OK;
        diaspora_metric sample{sizeof(diaspora_metric), DIASPORA_SCOPE_SITE, "local", "load", 1.0 * t, 0};
        failures += diaspora_metric_sample(h, &sample) != DIASPORA_OK;
      }
    });
  for (auto& t : engine) t.join();
  EXPECT_EQ(failures.load(), 0);
  diaspora_stats st{};
  st.struct_size = sizeof st;
  ASSERT_EQ(diaspora_get_stats(h, &st), DIASPORA_OK);
  EXPECT_EQ(st.events_accepted, static_cast<std::uint64_t>(threads * tasks * 7));
  ASSERT_EQ(diaspora_close(h, 60000), DIASPORA_OK);

  const auto events = relay.read(static_cast<std::size_t>(threads * tasks * 6));
  std::set<std::string> ids;
  std::map<std::string, std::vector<std::string>> per_task;
  std::vector<int> last_task(threads, -1);
  for (const auto& e : events) {
    EXPECT_TRUE(ids.insert(std::string(e.at("id").as_string())).second) << "duplicate " << e.at("id");
    const std::string type(e.at("type").as_string());
    if (!type.starts_with("org.diaspora.task.")) continue;
    const std::string task(e.at("data").at("task_id").as_string());
    const int k = std::stoi(task.substr(2, task.find('-') - 2)), t = std::stoi(task.substr(task.find('-') + 1));
    EXPECT_GE(t, last_task[static_cast<std::size_t>(k)]) << "thread " << k << ": task order broken at " << task;
    last_task[static_cast<std::size_t>(k)] = t;
    per_task[task].push_back(type.substr(type.rfind('.') + 1));
  }
  ASSERT_EQ(per_task.size(), static_cast<std::size_t>(threads * tasks));
  const std::vector<std::string> lifecycle{"submitted", "started", "heartbeat", "heartbeat", "heartbeat", "completed"};
  for (const auto& [task, kinds] : per_task) EXPECT_EQ(kinds, lifecycle) << task;
}

// Metric samples that find the queue full are merged per series instead of spilled: each
// published sample says how many it stands for, and none is lost or counted twice.
TEST(PluginConcurrency, CoalescedMetricSamplesAreCountedAndPublished) {
  EmbeddedRelay relay;
  diaspora_plugin* h = nullptr;
  char err[2048];
  ASSERT_EQ(diaspora_open_yaml(relay.spec(", queue_size: 16").c_str(), &h, err, sizeof err), DIASPORA_OK) << err;
  constexpr int samples = 20000;
  diaspora_metric m{sizeof(diaspora_metric), DIASPORA_SCOPE_SITE, "local", "load", 0, 0};
  for (int i = 0; i < samples; ++i) {  // far faster than the publisher drains 16 slots
    m.value = i;
    ASSERT_EQ(diaspora_metric_sample(h, &m), DIASPORA_OK);
  }
  diaspora_stats st{};
  st.struct_size = sizeof st;
  ASSERT_EQ(diaspora_get_stats(h, &st), DIASPORA_OK);
  EXPECT_EQ(st.events_accepted, static_cast<std::uint64_t>(samples));
  EXPECT_EQ(st.events_spilled, 0u);  // one series: every full-queue sample merges
  ASSERT_EQ(diaspora_close(h, 60000), DIASPORA_OK);

  // The relay: the samples' counts add up to every sample; the merged ones were counted
  // in the plugin's statistics events (one may come during the run: the counters only
  // grow, and the one published at close has them all).
  diaspora::RelayClientOptions o;
  o.url = relay.url;
  o.ca_file = relay.dir.path() / "certs/ca.pem";
  o.token = relay.token;
  diaspora::RelayClient c(o);
  c.send(R"({"op":"subscribe","id":"t","topic":"conc.events","from":"earliest"})");
  std::int64_t represented = 0, published = 0, merged_in_stats = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((represented < samples || merged_in_stats != samples - published) && std::chrono::steady_clock::now() < deadline) {
    auto f = c.poll_receive(std::chrono::milliseconds(200));
    if (!f) continue;
    json::object msg = json::parse(*f).as_object();
    if (msg["op"] != "events") continue;
    for (auto& e : msg["events"].as_array()) {
      const json::object& ev = e.as_object().at("event").as_object();
      const json::object& d = ev.at("data").as_object();
      if (ev.at("type") == "org.diaspora.metric") {
        ++published;
        const json::value* count = d.if_contains("count");
        represented += count ? count->to_number<std::int64_t>() : 1;
        if (count) {
          EXPECT_GE(count->to_number<std::int64_t>(), 2);
        }
      } else if (ev.at("type") == "org.diaspora.plugin.stats") {
        merged_in_stats = std::max(merged_in_stats, d.at("metrics_coalesced").to_number<std::int64_t>());
      }
    }
  }
  EXPECT_EQ(represented, samples);
  EXPECT_LT(published, samples) << "the queue never filled: nothing was coalesced";
  EXPECT_EQ(merged_in_stats, samples - published);
  EXPECT_EQ(static_cast<std::int64_t>(st.metrics_coalesced), merged_in_stats);
}

// Hooks called without a time stamp their records with the CPU's counter (when the kernel
// keeps time with it) and the publisher converts; either way an event's time is the
// wall-clock time of its hook call.
namespace {

std::int64_t wall_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

namespace {

// A tick source independent of the CPU's counter: 2.5 ticks per nanosecond of
// CLOCK_MONOTONIC, from an arbitrary origin (so the conversion is exercised on any kernel).
std::uint64_t monotonic_ticks() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const std::uint64_t ns = static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
  return 1'000'000'007u + ns * 5 / 2;
}

void check_ticks_become_wall_clock_time(dp::TickClock::Source source) {
  dp::TickClock clock(source);
  // Right after construction (the rate measured over 1 ms) and later on.
  for (int round = 0; round < 3; ++round) {
    const std::int64_t before = wall_us();
    const std::uint64_t t = source();
    const std::int64_t after = wall_us();
    const std::int64_t us = clock.to_us(t);
    EXPECT_GE(us, before - 200) << "round " << round;
    EXPECT_LE(us, after + 200) << "round " << round;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // A reading converted long after it was taken keeps its own time, not the conversion's,
  // also across a refresh of the pair (every 50 ms).
  const std::int64_t then = wall_us();
  const std::uint64_t old = source();
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  const std::int64_t now = wall_us();
  const std::uint64_t fresh = source();
  EXPECT_NEAR(static_cast<double>(clock.to_us(fresh)), static_cast<double>(now), 500.0);
  EXPECT_NEAR(static_cast<double>(clock.to_us(old)), static_cast<double>(then), 500.0);
  EXPECT_LT(clock.to_us(old), clock.to_us(fresh));
}

}  // namespace

// The conversion itself, on every machine: an injected counter.
TEST(PluginClock, InjectedTicksBecomeWallClockTime) { check_ticks_become_wall_clock_time(&monotonic_ticks); }

// The CPU's own counter, where the plugin uses it.
TEST(PluginClock, TicksBecomeWallClockTime) {
  if (!dp::TickClock::usable())  // the plugin reads the clock in the hook there instead
    GTEST_SKIP() << "the kernel does not keep time with the TSC here: TickClock is not used (the conversion is "
                    "tested with an injected counter: PluginClock.InjectedTicksBecomeWallClockTime)";
  check_ticks_become_wall_clock_time(&dp::TickClock::ticks);
}

TEST(PluginClock, HookTimesAreTheWallClockWithAndWithoutTicks) {
  struct Unset {
    ~Unset() { unsetenv("DIASPORA_PLUGIN_TSC"); }
  } unset;  // also when an assertion ends the test early
  for (const char* tsc : {"1", "0"}) {
    SCOPED_TRACE(std::string("DIASPORA_PLUGIN_TSC=") + tsc);
    ASSERT_EQ(setenv("DIASPORA_PLUGIN_TSC", tsc, 1), 0);
    EmbeddedRelay relay;
    diaspora_plugin* h = nullptr;
    char err[2048];
    ASSERT_EQ(diaspora_open_yaml(relay.spec().c_str(), &h, err, sizeof err), DIASPORA_OK) << err;
    std::map<std::string, std::pair<std::int64_t, std::int64_t>> window;  // task -> (before, after) its hooks
    for (int t = 0; t < 20; ++t) {
      const std::string id = "clock-" + std::to_string(t);
      diaspora_task_info info = task_info(id.c_str());
      const std::int64_t before = wall_us();
      EXPECT_EQ(diaspora_task_submitted(h, &info), DIASPORA_OK);
      EXPECT_EQ(diaspora_task_completed(h, &info), DIASPORA_OK);
      window[id] = {before, wall_us()};
      std::this_thread::sleep_for(std::chrono::milliseconds(t < 10 ? 1 : 10));  // also past a refresh
    }
    ASSERT_EQ(diaspora_close(h, 60000), DIASPORA_OK);
    unsetenv("DIASPORA_PLUGIN_TSC");
    std::size_t checked = 0;
    for (const auto& e : relay.read(40)) {
      if (!e.at("type").as_string().starts_with("org.diaspora.task.")) continue;
      const auto at = diaspora::parse_rfc3339(std::string_view(e.at("time").as_string()));
      ASSERT_TRUE(at.has_value()) << e.at("time");
      const std::int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(at->time_since_epoch()).count();
      const auto& [before, after] = window.at(std::string(e.at("data").at("task_id").as_string()));
      EXPECT_GE(us, before - 200) << e.at("data").at("task_id");
      EXPECT_LE(us, after + 200) << e.at("data").at("task_id");
      ++checked;
    }
    EXPECT_EQ(checked, 40u);
  }
}

// The resilience engine inside the plugin: the spec's policy watches heartbeat silence;
// when a task's heartbeats stop, a `restart` action reaches the engine (here by polling,
// with the relay unreachable: decisions do not need it).
namespace {

// A plugin with the relay unreachable (decisions do not need it) and a policy that
// restarts a task whose heartbeats stop.
diaspora_plugin* open_with_restart_policy(const TempDir& dir) {
  std::ofstream(dir.path() / "token") << "t\n";
  const std::string spec = "version: 1\nname: pol\nrelay: {url: 'wss://127.0.0.1:1', token_file: '" +
                           (dir.path() / "token").string() + "'}\nplugin: {spool_dir: '" + (dir.path() / "spool").string() +
                           "', control: false}\nsites: [{name: a, engine: local}, {name: b, engine: local}]\n"
                           "policies:\n  - name: restart-lost\n    signal: task.heartbeat_gap\n    detector: phi-accrual\n"
                           "    threshold: 8\n    cooldown: 30s\n    action: restart\n    max_attempts: 2\n";
  diaspora_plugin* h = nullptr;
  char err[2048];
  EXPECT_EQ(diaspora_open_yaml(spec.c_str(), &h, err, sizeof err), DIASPORA_OK) << err;
  return h;
}

// Task `id` on site a: submitted, started, a heartbeat every 50 ms for 0.75 s, then silence.
void beat_then_fall_silent(diaspora_plugin* h, const char* id) {
  diaspora_task_info info = task_info(id);
  info.site = "a";
  ASSERT_EQ(diaspora_task_submitted(h, &info), DIASPORA_OK);
  ASSERT_EQ(diaspora_task_started(h, &info), DIASPORA_OK);
  for (int i = 0; i < 15; ++i) {
    ASSERT_EQ(diaspora_task_heartbeat(h, &info), DIASPORA_OK);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

TEST(PluginPolicies, SilentTaskIsRestartedThroughTheActionPath) {
  TempDir dir;
  diaspora_plugin* h = open_with_restart_policy(dir);
  ASSERT_NE(h, nullptr);
  ASSERT_NO_FATAL_FAILURE(beat_then_fall_silent(h, "worker-1"));
  diaspora_action a{};
  a.struct_size = sizeof a;
  const auto silent_since = std::chrono::steady_clock::now();
  int rc = DIASPORA_ERR_EMPTY;
  while (rc == DIASPORA_ERR_EMPTY && std::chrono::steady_clock::now() - silent_since < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    rc = diaspora_poll_action(h, &a);
  }
  const double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - silent_since).count();
  ASSERT_EQ(rc, DIASPORA_OK) << "no action after 10 s of silence";
  EXPECT_EQ(std::string(a.kind_name), "restart");
  EXPECT_EQ(a.kind, DIASPORA_ACTION_RESTART);
  EXPECT_EQ(std::string(a.task_id), "worker-1");
  EXPECT_EQ(std::string(a.origin), "local");
  EXPECT_NE(std::string(a.reason).find("restart-lost"), std::string::npos) << a.reason;
  EXPECT_LT(waited_s, 5.0) << "suspected too late: " << a.reason;  // 50 ms beats; generous for sanitizer builds
  EXPECT_EQ(diaspora_action_done(h, a.id, "restarted"), DIASPORA_OK);
  diaspora_stats st{};
  st.struct_size = sizeof st;
  ASSERT_EQ(diaspora_get_stats(h, &st), DIASPORA_OK);
  EXPECT_GE(st.actions_received, 1u);
  diaspora_close(h, 0);
}

TEST(PluginPolicies, AnInvalidPolicyIsRefusedAtOpen) {
  TempDir dir;
  std::ofstream(dir.path() / "token") << "t\n";
  // phi-accrual only makes sense on heartbeat signals: the engine refuses it, located.
  const std::string spec = "version: 1\nname: pol\nrelay: {url: 'wss://127.0.0.1:1', token_file: '" +
                           (dir.path() / "token").string() + "'}\nplugin: {spool_dir: '" + (dir.path() / "spool").string() +
                           "', control: false}\nsites: [{name: a, engine: local}]\n"
                           "policies:\n  - name: odd\n    signal: task.runtime\n    detector: phi-accrual\n"
                           "    threshold: 8\n    action: restart\n";
  diaspora_plugin* h = nullptr;
  char err[2048];
  EXPECT_EQ(diaspora_open_yaml(spec.c_str(), &h, err, sizeof err), DIASPORA_ERR_CONFIG);
  EXPECT_EQ(h, nullptr);
  EXPECT_NE(std::string(err).find("<yaml>:"), std::string::npos) << err;
  EXPECT_NE(std::string(err).find("odd"), std::string::npos) << err;
}

// A loopback port held bound but not listening (connections to it are refused) until
// the descriptor is closed, so that nothing else takes it meanwhile.
struct ReservedPort {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  std::uint16_t port = 0;
  ReservedPort() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port = ntohs(a.sin_port);
  }
  void release() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  ~ReservedPort() { release(); }
};

// "Wait for ever" (INT64_MAX ms) must not overflow the deadline into the past: close waits
// for a relay that comes up late, and every event is delivered instead of spooled.
TEST(PluginClose, AForeverTimeoutWaitsForALateRelay) {
  ReservedPort port;
  EmbeddedRelay relay(port.port);
  diaspora_plugin* h = nullptr;
  char err[2048];
  ASSERT_EQ(diaspora_open_yaml(relay.spec(", reconnect_max: 200ms").c_str(), &h, err, sizeof err), DIASPORA_OK) << err;
  constexpr int tasks = 20;
  for (int t = 0; t < tasks; ++t) {
    const std::string id = "late-" + std::to_string(t);
    diaspora_task_info info = task_info(id.c_str());
    ASSERT_EQ(diaspora_task_submitted(h, &info), DIASPORA_OK);
  }
  // close runs on a thread of its own, detached if the test fails while it still waits
  // (a close that never returns must fail the test, not hang it).
  auto result = std::make_shared<std::promise<int>>();
  std::future<int> closed = result->get_future();
  std::thread closer([h, result] { result->set_value(diaspora_close(h, INT64_MAX)); });
  struct DetachOnExit {
    std::thread& t;
    ~DetachOnExit() {
      if (t.joinable()) t.detach();
    }
  } guard{closer};
  EXPECT_EQ(closed.wait_for(std::chrono::milliseconds(1500)), std::future_status::timeout)
      << "close returned before the relay was up: the deadline overflowed";
  port.release();
  relay.start(port.port);
  ASSERT_EQ(closed.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "close still waiting 60 s later";
  closer.join();
  EXPECT_EQ(closed.get(), DIASPORA_OK);
  const auto events = relay.read(tasks);
  std::set<std::string> ids;
  for (const auto& e : events)
    if (e.at("type").as_string().starts_with("org.diaspora.task.")) ids.insert(std::string(e.at("data").at("task_id").as_string()));
  EXPECT_EQ(ids.size(), static_cast<std::size_t>(tasks));
}

// A validation message names the argument that failed, also past the tenth metric (the
// label is formatted only on failure, so the hook path does not allocate).
TEST(PluginAbi, TheMessageNamesTheMetricThatFailed) {
  TempDir dir;
  std::ofstream(dir.path() / "token") << "t\n";
  const std::string spec = "version: 1\nname: lbl\nrelay: {url: 'wss://127.0.0.1:1', token_file: '" +
                           (dir.path() / "token").string() + "'}\nplugin: {spool_dir: '" + (dir.path() / "spool").string() +
                           "', control: false}\nsites: [{name: a, engine: local}]\n";
  diaspora_plugin* h = nullptr;
  char err[2048];
  ASSERT_EQ(diaspora_open_yaml(spec.c_str(), &h, err, sizeof err), DIASPORA_OK) << err;
  std::vector<std::string> names;
  for (int i = 0; i < 12; ++i) names.push_back("m" + std::to_string(i));
  std::vector<diaspora_metric_value> m;
  for (const auto& n : names) m.push_back({n.c_str(), 1.0});
  diaspora_task_info info = task_info("t");
  info.metrics = m.data();
  info.metric_count = m.size();
  ASSERT_EQ(diaspora_task_heartbeat(h, &info), DIASPORA_OK);
  auto last_error = [h] {
    char buf[1024];
    diaspora_last_error(h, buf, sizeof buf);
    return std::string(buf);
  };
  m[11].name = "bad name";
  EXPECT_EQ(diaspora_task_heartbeat(h, &info), DIASPORA_ERR_INVALID);
  EXPECT_NE(last_error().find("metrics[11].name 'bad name'"), std::string::npos) << last_error();
  m[11].name = nullptr;
  EXPECT_EQ(diaspora_task_heartbeat(h, &info), DIASPORA_ERR_NULL);
  EXPECT_NE(last_error().find("metrics[11].name is NULL"), std::string::npos) << last_error();
  m[11].name = names[11].c_str();
  m[10].value = std::nan("");
  EXPECT_EQ(diaspora_task_heartbeat(h, &info), DIASPORA_ERR_INVALID);
  EXPECT_NE(last_error().find("metrics[10].value is not finite"), std::string::npos) << last_error();
  diaspora_close(h, 0);
}

// Actions that arrived while no callback was installed stay with diaspora_poll_action when
// one is installed later; the callback does not receive them.
TEST(PluginActions, ActionsBeforeTheCallbackStayPollable) {
  TempDir dir;
  diaspora_plugin* h = open_with_restart_policy(dir);
  ASSERT_NE(h, nullptr);
  ASSERT_NO_FATAL_FAILURE(beat_then_fall_silent(h, "w"));
  diaspora_stats st{};
  st.struct_size = sizeof st;
  const auto t0 = std::chrono::steady_clock::now();
  do {  // the restart is decided while nobody listens
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_EQ(diaspora_get_stats(h, &st), DIASPORA_OK);
  } while (st.actions_received == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  ASSERT_GE(st.actions_received, 1u) << "no action after 10 s of silence";
  std::atomic<int> called{0};
  auto cb = [](const diaspora_action*, void* user) { static_cast<std::atomic<int>*>(user)->fetch_add(1); };
  ASSERT_EQ(diaspora_set_action_callback(h, cb, &called), DIASPORA_OK);
  diaspora_action a{};
  a.struct_size = sizeof a;
  ASSERT_EQ(diaspora_poll_action(h, &a), DIASPORA_OK) << "the action decided before the callback was lost to polling";
  EXPECT_EQ(std::string(a.kind_name), "restart");
  EXPECT_EQ(std::string(a.task_id), "w");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(called.load(), 0) << "the callback received an action that was already waiting for polling";
  EXPECT_EQ(diaspora_action_done(h, a.id, "restarted"), DIASPORA_OK);
  diaspora_close(h, 0);
}

// What the callback may call (docs/plugin.md): acknowledging its action works; changing the
// callback or closing the plugin from inside it is refused with CLOSED (it runs on the
// control thread, which close() joins), and the plugin goes on.
TEST(PluginActions, TheCallbackMayAcknowledgeButNotCloseOrReplaceItself) {
  TempDir dir;
  diaspora_plugin* h = open_with_restart_policy(dir);
  ASSERT_NE(h, nullptr);
  struct Seen {
    diaspora_plugin* h;
    std::atomic<int> calls{0}, replace_rc{0}, close_rc{0}, done_rc{-100};
  } seen{h};
  auto cb = [](const diaspora_action* a, void* user) {
    auto& s = *static_cast<Seen*>(user);
    s.replace_rc = diaspora_set_action_callback(s.h, nullptr, nullptr);
    s.close_rc = diaspora_close(s.h, 0);
    s.done_rc = diaspora_action_done(s.h, a->id, "restarted from the callback");
    s.calls.fetch_add(1);
  };
  ASSERT_EQ(diaspora_set_action_callback(h, cb, &seen), DIASPORA_OK);
  ASSERT_NO_FATAL_FAILURE(beat_then_fall_silent(h, "cb-task"));
  const auto t0 = std::chrono::steady_clock::now();
  while (seen.calls.load() == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GE(seen.calls.load(), 1) << "no action reached the callback";
  EXPECT_EQ(seen.replace_rc.load(), DIASPORA_ERR_CLOSED);
  EXPECT_EQ(seen.close_rc.load(), DIASPORA_ERR_CLOSED);
  EXPECT_EQ(seen.done_rc.load(), DIASPORA_OK);
  // (The reason is in diaspora_last_error, but the publisher thread may overwrite it at once
  // with its own: the return codes are the contract.)
  // The plugin still works: a hook, then a close from this thread.
  diaspora_task_info info = task_info("after");
  EXPECT_EQ(diaspora_task_submitted(h, &info), DIASPORA_OK);
  EXPECT_EQ(diaspora_close(h, 0), DIASPORA_ERR_TIMEOUT);  // the relay is unreachable: the rest is spooled
}

// The loss accounting (docs/plugin.md "Bounds"): past `spool_limit` coalesced metric
// samples are refused and counted in events_lost; every other event is kept, delivered once
// the relay is up; close then reports the loss with DIASPORA_ERR_IO although everything
// else was acked.
TEST(PluginLoss, SamplesPastTheSpoolLimitAreLostAndCloseSaysSo) {
  ReservedPort port;
  EmbeddedRelay relay(port.port);  // not up yet: everything goes to the spool
  diaspora_plugin* h = nullptr;
  char err[2048];
  ASSERT_EQ(diaspora_open_yaml(relay.spec(", queue_size: 16, spool_limit: 0, reconnect_max: 200ms").c_str(), &h, err,
                               sizeof err),
            DIASPORA_OK)
      << err;
  diaspora_task_info info = task_info("kept");
  ASSERT_EQ(diaspora_task_submitted(h, &info), DIASPORA_OK);  // always spooled, whatever the limit
  diaspora_metric m{sizeof(diaspora_metric), DIASPORA_SCOPE_SITE, "local", "load", 0, 0};
  diaspora_stats st{};
  st.struct_size = sizeof st;
  const auto t0 = std::chrono::steady_clock::now();
  do {  // far faster than the publisher drains 16 slots: samples coalesce, then are refused
    for (int i = 0; i < 2000; ++i) {
      m.value = i;
      ASSERT_EQ(diaspora_metric_sample(h, &m), DIASPORA_OK);  // the hook itself never fails for this
    }
    ASSERT_EQ(diaspora_get_stats(h, &st), DIASPORA_OK);
  } while (st.events_lost == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
  ASSERT_GT(st.events_lost, 0u) << "no coalesced sample was refused past spool_limit 0";
  EXPECT_GT(st.metrics_coalesced, 0u);
  port.release();
  relay.start(port.port);
  // Everything that was kept is delivered, then close reports the loss.
  EXPECT_EQ(diaspora_close(h, 60000), DIASPORA_ERR_IO);
  const auto events = relay.read(1);
  const bool kept = std::any_of(events.begin(), events.end(), [](const json::object& e) {
    return e.at("type") == "org.diaspora.task.submitted" && e.at("data").at("task_id") == "kept";
  });
  EXPECT_TRUE(kept);
}

// A hook whose event cannot be spooled (the queue full, the spool's disk refusing writes:
// here a file-size limit on the process) returns DIASPORA_ERR_IO and counts the event lost;
// the plugin goes on once the disk takes writes again.
TEST(PluginLoss, AHookWhoseSpoolWriteFailsReturnsIo) {
  TempDir dir;
  std::ofstream(dir.path() / "token") << "t\n";
  const std::string spec = "version: 1\nname: io\nrelay: {url: 'wss://127.0.0.1:1', token_file: '" +
                           (dir.path() / "token").string() + "'}\nplugin: {spool_dir: '" + (dir.path() / "spool").string() +
                           "', control: false, queue_size: 16}\nsites: [{name: a, engine: local}]\n";
  diaspora_plugin* h = nullptr;
  char err[2048];
  ASSERT_EQ(diaspora_open_yaml(spec.c_str(), &h, err, sizeof err), DIASPORA_OK) << err;
  struct FileSizeLimit {  // writes past 16 KiB fail with EFBIG (SIGXFSZ ignored) until restored
    rlimit old{};
    void (*old_handler)(int);
    FileSizeLimit() : old_handler(std::signal(SIGXFSZ, SIG_IGN)) {
      ::getrlimit(RLIMIT_FSIZE, &old);
      rlimit small = old;
      small.rlim_cur = 16 << 10;
      ::setrlimit(RLIMIT_FSIZE, &small);
    }
    ~FileSizeLimit() {
      ::setrlimit(RLIMIT_FSIZE, &old);
      std::signal(SIGXFSZ, old_handler);
    }
  };
  int io = 0, ok = 0;
  {
    FileSizeLimit limit;
    const auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; io == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20); ++t) {
      const std::string id = "t" + std::to_string(t);
      diaspora_task_info info = task_info(id.c_str());
      const int rc = diaspora_task_submitted(h, &info);
      if (rc == DIASPORA_ERR_IO) ++io;
      else if (rc == DIASPORA_OK) ++ok;
      else ADD_FAILURE() << "rc " << rc;
    }
  }
  ASSERT_GT(io, 0) << "no hook saw the spool fail (" << ok << " accepted)";
  diaspora_last_error(h, err, sizeof err);
  EXPECT_NE(std::string(err).find("the event is lost"), std::string::npos) << err;
  diaspora_stats st{};
  st.struct_size = sizeof st;
  ASSERT_EQ(diaspora_get_stats(h, &st), DIASPORA_OK);
  EXPECT_GE(st.events_lost, static_cast<std::uint64_t>(io));
  // The disk takes writes again: hooks succeed.
  diaspora_task_info info = task_info("after");
  EXPECT_EQ(diaspora_task_submitted(h, &info), DIASPORA_OK);
  EXPECT_NE(diaspora_close(h, 0), DIASPORA_OK);  // the relay never came: TIMEOUT (or IO)
}
