// Resilience engine cost: observations per second per core for the default ensemble (one
// series, and many series interleaved as a site would feed them), and memory per series
// (sizeof + heap, the heap measured with a counting operator new).
//
//   build-res/bin/bench_resilience [--benchmark_filter=...]
// GCC flags free() in a replaced operator delete as "mismatched" (a false positive here).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#include <benchmark/benchmark.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "diaspora/policy.hpp"
#include "diaspora/resilience.hpp"
#include "diaspora/spec.hpp"

namespace res = diaspora::resilience;

// ---- a counting allocator: every heap allocation in this process is counted ----------------
namespace {
std::atomic<std::size_t> g_allocs{0}, g_bytes{0};
}
void* operator new(std::size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  g_bytes.fetch_add(n, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace {

/// A daily-seasonal series with noise, a few spikes and a level shift, 5-minute sampling.
struct Series {
  std::vector<double> t, x;
  explicit Series(std::size_t n, unsigned seed = 1) : t(n), x(n) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> g(0, 2);
    for (std::size_t i = 0; i < n; ++i) {
      t[i] = 1'396'310'400.0 + 300.0 * static_cast<double>(i);
      x[i] = 50 + 20 * std::sin(2 * M_PI * std::fmod(t[i], 86400) / 86400) + g(rng) +
             (i % 5000 == 4999 ? 60 : 0) + (i > n / 2 ? 15 : 0);
    }
  }
};

const Series& series() {
  static const Series s(1 << 20);
  return s;
}

void BM_EnsembleOneSeries(benchmark::State& state) {
  const Series& s = series();
  res::Ensemble e;
  std::size_t i = 0;
  double sink = 0;
  for (auto _ : state) {
    sink += e.update(s.t[i], s.x[i]).score;
    if (++i == s.t.size()) i = 0;
  }
  benchmark::DoNotOptimize(sink);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}
BENCHMARK(BM_EnsembleOneSeries);

// Many series, one observation each in turn: the ensembles no longer stay in L1. `speedup`
// divides the series' time since its start (300: a value a second instead of every 5 minutes).
void many_series(benchmark::State& state, const res::Ensemble::Config& config, double speedup = 1) {
  const Series& s = series();
  std::vector<res::Ensemble> es(static_cast<std::size_t>(state.range(0)), res::Ensemble(config));
  std::size_t i = 0, k = 0;
  double sink = 0;
  for (auto _ : state) {
    sink += es[k].update(s.t[0] + (s.t[i] - s.t[0]) / speedup, s.x[i]).score;
    if (++k == es.size()) {
      k = 0;
      if (++i == s.t.size()) i = 0;
    }
  }
  benchmark::DoNotOptimize(sink);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}
void BM_EnsembleManySeries(benchmark::State& state) { many_series(state, {}); }
BENCHMARK(BM_EnsembleManySeries)->Arg(1000)->Arg(100000);

// The same with the adaptive-resonance detector on (off in the defaults: docs/anomaly.md).
void BM_EnsembleResonanceManySeries(benchmark::State& state) {
  res::Ensemble::Config c;
  c.resonance_weight = 1;
  many_series(state, c);
}
BENCHMARK(BM_EnsembleResonanceManySeries)->Arg(1000);

// The policy engine's ensemble (PolicyOptions::ensemble: a plain level, the likelihood
// calibrated, an anomaly must last 3 s, sustained anomalies not learned) on a signal sampled
// every second, so the 3 s span three values.
void BM_EnsemblePolicyManySeries(benchmark::State& state) { many_series(state, res::PolicyOptions{}.ensemble, 300); }
BENCHMARK(BM_EnsemblePolicyManySeries)->Arg(1000);

void BM_PhiAccrual(benchmark::State& state) {
  res::PhiAccrual p;
  double t = 0, sink = 0;
  for (auto _ : state) {
    p.heartbeat(t += 1.0);
    sink += p.phi(t + 0.5);
  }
  benchmark::DoNotOptimize(sink);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}
BENCHMARK(BM_PhiAccrual);

void BM_ThresholdForecast(benchmark::State& state) {
  res::ThresholdForecaster f(1e10, res::ThresholdForecaster::Direction::kRising);
  double t = 0, sink = 0;
  for (auto _ : state) {
    t += 1.0;
    f.update(t, 1e6 * t);
    if (auto c = f.time_to_cross()) sink += c->at;
  }
  benchmark::DoNotOptimize(sink);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}
BENCHMARK(BM_ThresholdForecast);

// The policy engine as the plugin drives it: step-time observations of 1,000 running
// tasks on two sites, watched by an ensemble policy and a CUSUM policy (each
// observation is evaluated by both), plus a phi-accrual heartbeat policy.
void BM_PolicyEngineObserve(benchmark::State& state) {
  const auto spec = diaspora::parse_spec_string(R"(version: 1
name: bench
sites:
  - {name: a, engine: local, workers: 1000}
  - {name: b, engine: local, workers: 1000}
policies:
  - {name: drift, signal: task.step_time, detector: ensemble, threshold: 0.9, action: migrate}
  - {name: shift, signal: task.step_time, detector: cusum, threshold: 8, action: alert}
  - {name: lost, signal: task.heartbeat_gap, detector: phi-accrual, threshold: 8, action: restart}
)");
  res::PolicyEngine engine(spec);
  constexpr int tasks = 1000;
  std::vector<std::string> ids;
  for (int i = 0; i < tasks; ++i) {
    ids.push_back("task-" + std::to_string(i));
    engine.task_started(ids.back(), i % 2 ? "a" : "b", 0, std::nullopt);
  }
  const Series& s = series();
  std::vector<res::Decision> out;
  std::size_t i = 0, decisions = 0;
  for (auto _ : state) {
    const int k = static_cast<int>(i % tasks);
    engine.observe(res::Observation{ids[static_cast<std::size_t>(k)], k % 2 ? "a" : "b", "task.step_time",
                                    1.0 + 0.01 * s.x[i % s.x.size()], s.t[i % s.t.size()]},
                   out);
    decisions += out.size();
    out.clear();
    ++i;
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
  state.counters["decisions"] = static_cast<double>(decisions);
}
BENCHMARK(BM_PolicyEngineObserve);

/// Memory per series: sizeof plus whatever the heap gained while one ensemble was built
/// and fed 100,000 observations.
void report_memory() {
  const Series& s = series();
  const std::size_t a0 = g_allocs.load(), b0 = g_bytes.load();
  auto* e = new res::Ensemble();
  const std::size_t a1 = g_allocs.load(), b1 = g_bytes.load();
  for (std::size_t i = 0; i < 100000; ++i) benchmark::DoNotOptimize(e->update(s.t[i], s.x[i]));
  const std::size_t a2 = g_allocs.load(), b2 = g_bytes.load();
  delete e;
  std::printf("memory per series: sizeof(Ensemble) = %zu bytes, heap = %zu bytes (%zu allocations) "
              "beyond the object itself; per-observation allocations over 100000 updates: %zu\n",
              sizeof(res::Ensemble), (b1 - b0) - sizeof(res::Ensemble), (a1 - a0) - 1, a2 - a1);
  (void)b2;
}

}  // namespace

int main(int argc, char** argv) {
  report_memory();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
