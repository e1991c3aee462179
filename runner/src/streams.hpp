// Rate streams: a task with `rate:` makes its instances over time (rate x duration of them,
// at the rate), slowed by the throttle action. After a resume, the instances the earlier
// run submitted are submitted again (or restored) at once and the stream goes on from the
// next one.
//
// Thread safety: the runner thread.
#pragma once

#include <vector>

#include "context.hpp"
#include "lifecycle.hpp"

namespace diaspora::runner {

class Streams {
 public:
  Streams(Context& ctx, Lifecycle& lifecycle) : ctx_(ctx), lifecycle_(lifecycle) {}

  /// Submits each count task's instances, and sets up each rate task's stream.
  void start(const InstanceStore& store);
  /// Submits the stream instances due by now (nothing while the run is stopping); ends a
  /// throttle whose time is over.
  void tick();
  /// The throttle action: new instances at half the current rate (at least 1/16 of the
  /// spec's) for the next 60 s. Returns the fraction of the rate now.
  double throttle();
  /// A stream still has instances to make (not while stopping).
  bool open() const;
  /// Seconds until the next instance is due (at most `cap`).
  double next_due(double cap) const;
  /// Is `task_name`'s stream still making instances?
  bool making(const std::string& task_name) const;

 private:
  struct Stream {
    std::size_t task = 0;
    double next_t = 0, end_t = 0, rate = 0;
    long created = 0, total = 0;
    long first_index = 0;  ///< the index of its first instance (after a resume, past the earlier run's)
  };
  Context& ctx_;
  Lifecycle& lifecycle_;
  std::vector<Stream> streams_;
  double throttle_ = 1, throttle_until_ = 0;
};

}  // namespace diaspora::runner
