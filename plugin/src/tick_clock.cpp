#include "tick_clock.hpp"

#include <time.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace diaspora::plugin {
namespace {

std::int64_t read_ns(clockid_t id) noexcept {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

bool kernel_clocksource_is_tsc() noexcept {
  try {
    std::ifstream in("/sys/devices/system/clocksource/clocksource0/current_clocksource");
    std::string name;
    return static_cast<bool>(in >> name) && name == "tsc";
  } catch (...) {
    return false;
  }
}

constexpr std::int64_t kCalibrationNs = 1'000'000;  // the first rate: from a 1 ms span
constexpr std::int64_t kRefreshNs = 50'000'000;     // a new pair at least this often

}  // namespace

bool TickClock::usable() noexcept {
  static const bool kernel = DIASPORA_HAVE_TSC && kernel_clocksource_is_tsc();
  const char* env = std::getenv("DIASPORA_PLUGIN_TSC");
  return kernel && !(env && std::strcmp(env, "0") == 0);
}

// Three tries, keeping the one whose clock reads sat between the closest counter reads:
// a preemption in the middle of one would otherwise skew the pair by its length.
TickClock::Pair TickClock::sample() const noexcept {
  Pair best;
  std::uint64_t best_window = UINT64_MAX;
  for (int i = 0; i < 3; ++i) {
    const std::uint64_t before = source_();
    const std::int64_t mono = read_ns(CLOCK_MONOTONIC), real = read_ns(CLOCK_REALTIME);
    const std::uint64_t after = source_();
    if (after - before < best_window) {
      best_window = after - before;
      best = Pair{before + (after - before) / 2, mono, real};
    }
  }
  return best;
}

// The first rate is measured here, over 1 ms of waiting, so that every conversion uses
// one (the time of the conversion instead would make the first events' times run ahead
// of later ones'). Refreshes then measure it again over the whole span since the origin.
TickClock::TickClock(Source source) noexcept : source_(source), origin_(sample()), anchor_(origin_) {
  while (read_ns(CLOCK_MONOTONIC) - origin_.mono_ns < kCalibrationNs) {
  }
  refresh();
}

// The rate comes from the whole span since the origin (CLOCK_MONOTONIC, which NTP slews
// but never steps), so it gets more precise as the plugin runs; the anchor's
// CLOCK_REALTIME follows any step of the wall clock from the next refresh on.
void TickClock::refresh() noexcept {
  anchor_ = sample();
  const std::int64_t span_ns = anchor_.mono_ns - origin_.mono_ns;
  const std::uint64_t span_ticks = anchor_.tsc - origin_.tsc;
  if (span_ns >= kCalibrationNs && span_ticks > 0) {
    ns_per_tick_ = static_cast<double>(span_ns) / static_cast<double>(span_ticks);
    refresh_ticks_ = static_cast<std::int64_t>(static_cast<double>(kRefreshNs) / ns_per_tick_);
  }
}

std::int64_t TickClock::to_us(std::uint64_t t) noexcept {
  if (ns_per_tick_ == 0 || static_cast<std::int64_t>(t - anchor_.tsc) > refresh_ticks_) refresh();
  if (ns_per_tick_ == 0) return read_ns(CLOCK_REALTIME) / 1000;  // a counter that did not advance
  const double delta_ns = static_cast<double>(static_cast<std::int64_t>(t - anchor_.tsc)) * ns_per_tick_;
  const std::int64_t ns = anchor_.real_ns + std::llround(delta_ns);
  return ns < 0 ? 0 : ns / 1000;
}

}  // namespace diaspora::plugin
