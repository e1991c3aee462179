// Event times from the CPU's time-stamp counter. A hook that is not given a time stamps
// its record with the raw counter (one instruction, ~7 ns here, against ~16 ns for
// clock_gettime through the vDSO); the publisher turns ticks into wall-clock microseconds
// when it serialises the record, against a (counter, clock) pair it refreshes as it goes.
// Used only when the kernel itself keeps time with the TSC: it then checked that the
// counter runs at a constant rate, keeps running in idle states and agrees across CPUs.
#pragma once

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define DIASPORA_HAVE_TSC 1
#else
#define DIASPORA_HAVE_TSC 0
#endif

namespace diaspora::plugin {

/// Converts time-stamp-counter readings to wall-clock microseconds.
///
/// Thread safety: ticks() and usable() from any thread; a TickClock object is not
/// synchronised: one thread at a time calls to_us() (the plugin calls it under its
/// spool mutex, where every record is serialised).
class TickClock {
 public:
  /// The counter now. Only meaningful when usable() is true. Any thread; never fails.
  static std::uint64_t ticks() noexcept {
#if DIASPORA_HAVE_TSC
    return __rdtsc();
#else
    return 0;
#endif
  }

  /// True when this CPU has a time-stamp counter and the kernel's current clocksource is
  /// "tsc" (read once from /sys/devices/system/clocksource/clocksource0/current_clocksource),
  /// and the environment variable DIASPORA_PLUGIN_TSC is not "0" (read at each call; the
  /// plugin calls this once, at open). Any thread.
  static bool usable() noexcept;

  /// A counter to read: ticks() in the plugin; tests inject another (a counter made from
  /// CLOCK_MONOTONIC) to exercise the conversion where the kernel does not use the TSC.
  using Source = std::uint64_t (*)() noexcept;

  /// Takes the first (counter, clock) pair from `source` and measures the counter's rate
  /// over 1 ms (spinning: the plugin's open takes that much longer).
  explicit TickClock(Source source = &TickClock::ticks) noexcept;

  /// Wall-clock microseconds since the epoch of counter reading `t`, taken after this
  /// object was made. Refreshes the pair (and the rate, measured over the whole span
  /// since construction) when `t` is more than 50 ms past it, so a record is converted
  /// against a pair taken close to it. Never fails; if the counter has not advanced since
  /// construction it returns the clock's time now.
  std::int64_t to_us(std::uint64_t t) noexcept;

 private:
  struct Pair {
    std::uint64_t tsc = 0;
    std::int64_t mono_ns = 0;  ///< CLOCK_MONOTONIC: the rate (never stepped)
    std::int64_t real_ns = 0;  ///< CLOCK_REALTIME: what events carry
  };
  Pair sample() const noexcept;
  void refresh() noexcept;

  Source source_;
  Pair origin_, anchor_;
  double ns_per_tick_ = 0;          // 0 only if the counter did not advance
  std::int64_t refresh_ticks_ = 0;  // anchor age that triggers a refresh
};

}  // namespace diaspora::plugin
