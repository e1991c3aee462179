// Engine plugin benchmarks (issue 4): the cost of a hook call seen by the engine thread,
// and events per second from hooks to acked in a real relay.
//
//  1. Google Benchmark of diaspora_task_heartbeat from 1 and 4 engine threads, with a
//     counting operator new: `allocs/call` must be 0. Side by side, the naive peer an
//     engine author would write first: format the event JSON in the hook and push it on
//     a mutex-protected deque.
//  2. Per-call latency distribution (median, p99) of the same hook, timed one call at a
//     time with the TSC (calibrated against steady_clock, the timer's own cost removed).
//  3. End to end: one engine thread calls hooks as fast as it can (the queue overflows:
//     the overload figure), then at offered rates in 1-ms bursts (no spill = a sustained
//     rate); the embedded relay (TLS, token auth, payload validation on/off, fsync before
//     ack) acks them. Side by side: a plain diaspora.v1 producer publishing pre-serialised
//     events (the relay's ceiling). Each run starts after sync(): the disk has written
//     back what earlier runs (and the hook benchmarks) left dirty.
//
// Section 3 runs first. Flags: --e2e-only (skip 1 and 2), --hook-only (skip 3),
// --e2e-events=N, --e2e-rates=R1,R2,... (events/s, 0 = flat out), --e2e-queue=SLOTS,
// --e2e-validate=on|off|both, --e2e-spill-queue=SLOTS and --e2e-spill-rate=R (the
// small-queue row; 0 slots: none), --hook-queue=SLOTS.
//
// The hook queue is drained between timed bursts (timing paused), so the figures are the
// fast path's, not the spill path's (which writes to disk and is measured by its tests).
// GCC flags free() in a replaced operator delete as "mismatched" (a false positive here).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#include <benchmark/benchmark.h>
#include <boost/json.hpp>
#include <x86intrin.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <mutex>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "diaspora/certs.hpp"
#include "diaspora/event.hpp"
#include "diaspora/plugin.h"
#include "diaspora/relay.hpp"
#include "diaspora/client.hpp"
#include "diaspora/token.hpp"
#include "../relay/workload.hpp"

// ---- allocation counting (per thread: the plugin's own threads allocate freely) -------------

static thread_local std::uint64_t t_allocs = 0;

void* operator new(std::size_t n) {
  ++t_allocs;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  ++t_allocs;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a) {
  ++t_allocs;
  if (void* p = std::aligned_alloc(static_cast<std::size_t>(a), (n + static_cast<std::size_t>(a) - 1) & ~(static_cast<std::size_t>(a) - 1))) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace {

using Clock = std::chrono::steady_clock;

// ---- an embedded relay ------------------------------------------------------------------------

struct Env {
  std::filesystem::path dir;
  std::unique_ptr<diaspora::Relay> relay;
  std::string url, token;
  std::filesystem::path ca, token_file;

  explicit Env(bool validate_payloads = true) {
    dir = std::filesystem::temp_directory_path() / ("diaspora-bench-plugin-" + diaspora::make_uuid().substr(0, 8));
    diaspora::write_dev_certificates(dir / "certs");
    diaspora::write_secret_file(dir / "secret");
    diaspora::RelayConfig cfg;
    cfg.listen = "127.0.0.1:0";
    cfg.data_dir = dir / "data";
    cfg.tls_cert = dir / "certs/server.pem";
    cfg.tls_key = dir / "certs/server-key.pem";
    cfg.auth_secret_file = dir / "secret";
    cfg.fsync = "always";
    cfg.validate_payloads = validate_payloads;
    relay = std::make_unique<diaspora::Relay>(cfg);
    relay->start();
    url = "wss://127.0.0.1:" + std::to_string(relay->port());
    ca = dir / "certs/ca.pem";
    diaspora::TokenClaims c;
    c.subject = "bench";
    c.scopes = {"publish:*", "subscribe:*"};
    c.issued_at = std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now());
    c.expires_at = c.issued_at + std::chrono::hours(2);
    token = diaspora::issue_token(diaspora::load_secret_file(dir / "secret"), c);
    token_file = dir / "token";
    std::ofstream(token_file) << token << "\n";
  }
  ~Env() {
    relay.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  diaspora_plugin* open(const std::string& name, std::size_t queue_size = 65536) const {
    const std::string spec = "version: 1\nname: " + name + "\nrelay: {url: '" + url + "', ca_file: '" + ca.string() +
                             "', token_file: '" + token_file.string() + "'}\nplugin: {spool_dir: '" +
                             (dir / ("spool-" + name)).string() +
                             "', control: false, queue_size: " + std::to_string(queue_size) +
                             ", batch: {max_events: 2000, max_delay: 5ms}}\nsites: [{name: local, engine: local}]\n";
    diaspora_plugin* h = nullptr;
    char err[2048];
    if (diaspora_open_yaml(spec.c_str(), &h, err, sizeof err) != DIASPORA_OK) {
      std::fprintf(stderr, "open: %s\n", err);
      std::exit(1);
    }
    return h;
  }
};

Env* g_env = nullptr;
diaspora_plugin* g_plugin = nullptr;

diaspora_stats stats(diaspora_plugin* h) {
  diaspora_stats s{};
  s.struct_size = sizeof s;
  diaspora_get_stats(h, &s);
  return s;
}

// Waits until everything accepted so far is acked (the queue is empty again).
void drain(diaspora_plugin* h) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    auto s = stats(h);
    if (s.events_acked + s.events_lost >= s.events_accepted) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::fprintf(stderr, "drain: timed out\n");
  std::exit(1);
}

// The hook under test: a heartbeat with two metrics, as an engine would send (or with
// `metrics` of them: "cpu", "memory_bytes", then "m2", "m3", ...).
struct Heartbeat {
  std::string id;
  std::vector<std::string> names;
  std::vector<diaspora_metric_value> m;
  diaspora_task_info info{};
  explicit Heartbeat(int thread, int metrics = 2) : id("task-" + std::to_string(thread)) {
    for (int k = 0; k < metrics; ++k) names.push_back(k == 0 ? "cpu" : k == 1 ? "memory_bytes" : "m" + std::to_string(k));
    for (int k = 0; k < metrics; ++k) m.push_back({names[static_cast<std::size_t>(k)].c_str(), k == 1 ? 1.5e9 : 0.5});
    info.struct_size = sizeof info;
    info.task_id = id.c_str();
    info.site = "edge";
    info.worker = "w-1";
    info.step = -1;
    info.metrics = m.data();
    info.metric_count = m.size();
  }
};

// Calls per thread between drains: an eighth of the hook queue, so that the bursts of four
// threads fit it with room to spare (the figures are the fast path's, not the spool's).
std::int64_t g_burst = 512;
std::barrier<> g_bar1(1), g_bar4(4);

void BM_PluginHook(benchmark::State& state) {
  Heartbeat hb(state.thread_index(), static_cast<int>(state.range(0)));
  std::int64_t n = 0;
  std::uint64_t allocs = 0, failed = 0;
  for (auto _ : state) {
    const std::uint64_t a0 = t_allocs;
    failed += diaspora_task_heartbeat(g_plugin, &hb.info) != DIASPORA_OK;
    allocs += t_allocs - a0;
    if (++n % g_burst == 0) {  // every thread runs the same number of iterations
      state.PauseTiming();
      std::barrier<>& bar = state.threads() == 1 ? g_bar1 : g_bar4;
      bar.arrive_and_wait();
      if (state.thread_index() == 0) drain(g_plugin);
      bar.arrive_and_wait();
      state.ResumeTiming();
    }
  }
  state.counters["allocs/call"] = benchmark::Counter(static_cast<double>(allocs), benchmark::Counter::kAvgIterations);
  state.counters["failed"] = static_cast<double>(failed);
  state.counters["spilled"] = static_cast<double>(stats(g_plugin).events_spilled);
}
// Arg: metrics per heartbeat. 12 checks that no per-metric work allocates (argument
// labels such as "metrics[11].name" are formatted only when a check fails).
BENCHMARK(BM_PluginHook)->Arg(2)->Threads(1)->Threads(4)->UseRealTime();
BENCHMARK(BM_PluginHook)->Arg(12)->Threads(1)->UseRealTime();

// The naive peer: serialise in the hook, push under a mutex; a consumer thread drains.
struct NaivePlugin {
  std::mutex mu;
  std::deque<std::string> q;
};
NaivePlugin g_naive;

void naive_heartbeat(const diaspora_task_info& i) {
  std::string e = "{\"specversion\":\"1.0\",\"id\":\"" + diaspora::make_uuid() +
                  "\",\"source\":\"/diaspora/bench/engine\",\"type\":\"org.diaspora.task.heartbeat\",\"data\":{\"task_id\":\"" +
                  i.task_id + "\",\"site\":\"" + i.site + "\",\"worker\":\"" + i.worker + "\",\"metrics\":{";
  for (std::size_t k = 0; k < i.metric_count; ++k)
    e += (k ? ",\"" : "\"") + std::string(i.metrics[k].name) + "\":" + std::to_string(i.metrics[k].value);
  e += "}}}";
  std::lock_guard lock(g_naive.mu);
  g_naive.q.push_back(std::move(e));
}

void BM_NaiveHook(benchmark::State& state) {
  Heartbeat hb(state.thread_index());
  std::uint64_t allocs = 0;
  std::int64_t n = 0;
  for (auto _ : state) {
    const std::uint64_t a0 = t_allocs;
    naive_heartbeat(hb.info);
    allocs += t_allocs - a0;
    if (++n % g_burst == 0 && state.thread_index() == 0) {
      state.PauseTiming();
      std::lock_guard lock(g_naive.mu);
      g_naive.q.clear();
      state.ResumeTiming();
    }
  }
  state.counters["allocs/call"] = benchmark::Counter(static_cast<double>(allocs), benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_NaiveHook)->Threads(1)->Threads(4)->UseRealTime();

// ---- per-call distribution ---------------------------------------------------------------------

double tsc_per_ns() {
  const auto t0 = Clock::now();
  const auto c0 = __rdtsc();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto c1 = __rdtsc();
  const auto t1 = Clock::now();
  return static_cast<double>(c1 - c0) / static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
}

struct Dist {
  double median, p99;
};

template <class Call>
Dist distribution(int threads, int calls_per_thread, double per_ns, Call call, bool drain_plugin) {
  std::vector<std::vector<std::uint64_t>> samples(static_cast<std::size_t>(threads));
  // The timer's own cost: back-to-back reads.
  std::vector<std::uint64_t> empty(10000);
  for (auto& e : empty) {
    unsigned aux;
    const auto a = __rdtscp(&aux);
    const auto b = __rdtscp(&aux);
    e = b - a;
  }
  std::sort(empty.begin(), empty.end());
  const std::uint64_t overhead = empty[empty.size() / 2];
  for (int done = 0; done < calls_per_thread; done += static_cast<int>(g_burst)) {
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        Heartbeat hb(t);
        auto& s = samples[static_cast<std::size_t>(t)];
        for (int i = 0; i < g_burst; ++i) {
          unsigned aux;
          const auto a = __rdtscp(&aux);
          call(hb);
          const auto b = __rdtscp(&aux);
          s.push_back(b - a > overhead ? b - a - overhead : 0);
        }
      });
    for (auto& t : ts) t.join();
    if (drain_plugin) drain(g_plugin);
  }
  std::vector<std::uint64_t> all;
  for (auto& s : samples) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end());
  auto at = [&](double q) { return static_cast<double>(all[static_cast<std::size_t>(q * static_cast<double>(all.size() - 1))]) / per_ns; };
  return {at(0.5), at(0.99)};
}

// ---- end to end ----------------------------------------------------------------------------------

std::size_t g_e2e_queue = 65536;  // hook queue slots of the end-to-end plugins

struct EndToEnd {
  double events_per_s = 0;
  std::uint64_t spilled = 0;  // hook calls that found the queue full (the queue then went to the spool)
};

// `rate` 0: the engine thread calls hooks as fast as it can, so the queue overflows and
// most events take the spool path (the overload figure). `rate` > 0: the engine offers
// that many events per second in 1-ms bursts (a sustained load); with `spilled` 0 every
// event went hook -> queue -> publisher -> relay, and the figure is the sustained rate.
EndToEnd plugin_end_to_end(std::uint64_t events, double rate, std::size_t queue) {
  diaspora::bench::settle_disk();  // earlier runs' writeback is not this run's
  diaspora_plugin* h = g_env->open("e2e-" + std::to_string(static_cast<long long>(rate)) + "-" + std::to_string(queue), queue);
  // Let it connect first: the figure is hooks -> acked, not the TLS handshake.
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (stats(h).connected == 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const std::uint64_t acked0 = stats(h).events_acked;
  Heartbeat hb(0);
  const auto t0 = Clock::now();
  const std::uint64_t per_ms = rate > 0 ? static_cast<std::uint64_t>(rate / 1000.0) : events;
  for (std::uint64_t i = 0, tick = 0; i < events; ++tick) {
    if (rate > 0) std::this_thread::sleep_until(t0 + std::chrono::milliseconds(tick));
    for (std::uint64_t k = 0; k < per_ms && i < events; ++k, ++i) diaspora_task_heartbeat(h, &hb.info);
  }
  while (stats(h).events_acked < acked0 + events) std::this_thread::sleep_for(std::chrono::microseconds(200));
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto st = stats(h);
  diaspora_close(h, 10000);
  return {static_cast<double>(events) / s, st.events_spilled};
}

double direct_producer(std::uint64_t events) {
  diaspora::bench::settle_disk();
  diaspora::RelayClientOptions o;
  o.url = g_env->url;
  o.ca_file = g_env->ca;
  o.token = g_env->token;
  o.producer_id = "direct-" + diaspora::make_uuid().substr(0, 8);
  diaspora::RelayClient c(o);
  const std::size_t batch = 2000, window = 16;  // as the plugins' batch.max_events
  std::uint64_t sent = 0, acked = 0, seq = 0;
  std::size_t inflight = 0;
  const auto t0 = Clock::now();
  std::string frame;
  while (acked < events) {
    while (sent < events && inflight < window) {
      frame = "{\"op\":\"publish\",\"topic\":\"direct.events\",\"seq\":" + std::to_string(seq++) + ",\"events\":[";
      for (std::size_t i = 0; i < batch && sent < events; ++i, ++sent) {
        if (i) frame += ',';
        frame += "{\"specversion\":\"1.0\",\"id\":\"" + std::to_string(sent) +
                 "\",\"source\":\"/diaspora/bench/direct\",\"type\":\"org.diaspora.task.heartbeat\",\"time\":\"2026-11-30T10:00:00.000000Z\","
                 "\"subject\":\"task-0\",\"datacontenttype\":\"application/json\",\"data\":{\"task_id\":\"task-0\",\"site\":\"edge\","
                 "\"worker\":\"w-1\",\"seq\":" + std::to_string(sent) + ",\"metrics\":{\"cpu\":0.5,\"memory_bytes\":1500000000}}}";
      }
      frame += "]}";
      c.send(frame);
      ++inflight;
    }
    auto m = c.receive_json();
    if (m["op"] == "ack") {
      acked += static_cast<std::uint64_t>(m["count"].to_number<std::int64_t>() + m["duplicates"].to_number<std::int64_t>());
      --inflight;
    } else {
      std::fprintf(stderr, "direct producer: %s\n", boost::json::serialize(m).c_str());
      std::exit(1);
    }
  }
  return static_cast<double>(events) / std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t e2e_events = 2000000;
  std::size_t hook_queue = 65536;
  bool e2e_only = false;
  std::string e2e_validate = "both";
  std::vector<double> e2e_rates = {0, 500000, 550000, 600000};  // 0: flat out (the overload figure)
  // A queue this small overflows many times a second at 500k events/s: the row shows that
  // the spill path (spool, then back to the live path) sustains the rate. 0: no such row.
  std::size_t spill_queue = 1024;
  double spill_rate = 500000;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]).rfind("--e2e-events=", 0) == 0) e2e_events = std::stoull(argv[i] + 13);
    if (std::string(argv[i]).rfind("--hook-queue=", 0) == 0) hook_queue = std::stoull(argv[i] + 13);
    if (std::string(argv[i]) == "--e2e-only") e2e_only = true;
    if (std::string(argv[i]) == "--hook-only") e2e_validate = "none";
    if (std::string(argv[i]).rfind("--e2e-queue=", 0) == 0) g_e2e_queue = std::stoull(argv[i] + 12);
    if (std::string(argv[i]).rfind("--e2e-spill-queue=", 0) == 0) spill_queue = std::stoull(argv[i] + 18);
    if (std::string(argv[i]).rfind("--e2e-spill-rate=", 0) == 0) spill_rate = std::stod(argv[i] + 17);
    if (std::string(argv[i]).rfind("--e2e-validate=", 0) == 0) e2e_validate = argv[i] + 15;  // on | off | both
    if (std::string(argv[i]).rfind("--e2e-rates=", 0) == 0) {  // comma-separated events/s
      e2e_rates.clear();
      std::stringstream in(argv[i] + 12);
      for (std::string r; std::getline(in, r, ',');) e2e_rates.push_back(std::stod(r));
    }
  }
  benchmark::Initialize(&argc, argv);
  // End to end first: the hook section pushes millions of events through a relay that
  // writes them all to disk, and the disk (page cache, the VM's volume) is not back to
  // its usual speed for a while after that, however the files are removed.
  for (bool validate : {true, false}) {
    if (e2e_validate == "none" || (validate && e2e_validate == "off") || (!validate && e2e_validate == "on")) continue;
    Env e2e(validate);
    g_env = &e2e;
    std::printf("\n== end to end: hooks -> acked by the relay (embedded, TLS, fsync always, payload validation %s), %llu events\n",
                validate ? "on" : "off", static_cast<unsigned long long>(e2e_events));
    std::vector<EndToEnd> plugin;
    for (double rate : e2e_rates) plugin.push_back(plugin_end_to_end(e2e_events, rate, g_e2e_queue));
    const bool spill_row = validate && spill_queue > 0;
    const EndToEnd spilling = spill_row ? plugin_end_to_end(e2e_events, spill_rate, spill_queue) : EndToEnd{};
    const double direct = direct_producer(e2e_events);
    std::printf("%-52s %12s %10s %8s\n", "", "events/s", "spilled", "/direct");
    auto row = [&](const char* label, const EndToEnd& r) {
      std::printf("%-52s %12.0f %10llu %7.2fx\n", label, r.events_per_s, static_cast<unsigned long long>(r.spilled),
                  r.events_per_s / direct);
    };
    char label[64];
    for (std::size_t i = 0; i < plugin.size(); ++i) {
      if (e2e_rates[i] > 0)
        std::snprintf(label, sizeof label, "plugin, engine offers %.0fk events/s", e2e_rates[i] / 1000);
      else
        std::snprintf(label, sizeof label, "plugin, engine calls hooks flat out (overload)");
      row(label, plugin[i]);
    }
    if (spill_row) {
      std::snprintf(label, sizeof label, "  same, %zu-slot queue (spills), offers %.0fk", spill_queue, spill_rate / 1000);
      row(label, spilling);
    }
    std::printf("%-52s %12.0f\n", "direct diaspora.v1 producer (pre-serialised)", direct);
  }

  if (!e2e_only) {
    // The hook benchmarks' relay and its log (gigabytes of events) are removed at the end
    // of this scope.
    Env env;
    g_env = &env;
    g_burst = static_cast<std::int64_t>(std::max<std::size_t>(hook_queue / 8, 64));
    g_plugin = env.open("hooks", hook_queue);
    {
      const auto deadline = Clock::now() + std::chrono::seconds(30);
      while (stats(g_plugin).connected == 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::printf("\n== hook call, Google Benchmark (mean per call; allocs/call counted on the engine thread)\n");
    benchmark::RunSpecifiedBenchmarks();
    drain(g_plugin);

    std::printf("\n== hook call, per-call distribution (TSC, timer cost removed)\n");
    const double per_ns = tsc_per_ns();
    std::printf("%-34s %10s %10s\n", "", "median ns", "p99 ns");
    for (int threads : {1, 4}) {
      const Dist p = distribution(threads, 65536, per_ns, [](Heartbeat& hb) { diaspora_task_heartbeat(g_plugin, &hb.info); }, true);
      const Dist pt = distribution(threads, 65536, per_ns, [](Heartbeat& hb) {
        hb.info.timestamp_us = 1'764'496'800'000'000;  // the engine passes its own time: no clock read
        diaspora_task_heartbeat(g_plugin, &hb.info);
      }, true);
      const Dist n = distribution(threads, 65536, per_ns, [](Heartbeat& hb) { naive_heartbeat(hb.info); }, false);
      {
        std::lock_guard lock(g_naive.mu);
        g_naive.q.clear();
      }
      std::printf("diaspora_task_heartbeat, %d thr     %10.0f %10.0f\n", threads, p.median, p.p99);
      std::printf("  same, engine passes timestamp_us   %10.0f %10.0f\n", pt.median, pt.p99);
      std::printf("naive (format + mutex), %d thr      %10.0f %10.0f\n", threads, n.median, n.p99);
      std::printf("ratio naive / plugin               %9.1fx %9.1fx\n", n.median / p.median, n.p99 / p.p99);
    }
    diaspora_close(g_plugin, 10000);
    g_plugin = nullptr;
    g_env = nullptr;
  }
  return 0;
}
