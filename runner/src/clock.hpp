// The runner's time: seconds since the run started, from a clock the parts are given, so
// that tests drive placement, actions and faults with a clock of their own.
#pragma once

#include <chrono>

namespace diaspora::runner {

class Clock {
 public:
  virtual ~Clock() = default;
  /// Seconds since the run's start. The owner's thread.
  virtual double now() const = 0;
};

/// std::chrono::steady_clock from the moment of construction or the last reset().
class SteadyClock final : public Clock {
 public:
  double now() const override { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  /// Time starts again from 0 (the run's instances begin now).
  void reset() { t0_ = std::chrono::steady_clock::now(); }

 private:
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

}  // namespace diaspora::runner
