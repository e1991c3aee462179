// The baseline (`--baseline retry-after=D`): what an engine without Diaspora does, to
// compare against. No policies; an attempt is retried when it exits with an error
// (Lifecycle::retry_as_baseline) or when it has sent no heartbeat for D seconds, which is
// also the only way a lost worker is noticed (Parsl HTEX: 120 s). Three attempts at most.
//
// Thread safety: the runner thread.
#pragma once

#include "context.hpp"
#include "lifecycle.hpp"
#include "store.hpp"

namespace diaspora::runner {

class Baseline {
 public:
  Baseline(Context& ctx, InstanceStore& store, Lifecycle& lifecycle) : ctx_(ctx), store_(store), lifecycle_(lifecycle) {}
  /// Retries every live attempt silent for longer than retry-after (nothing outside the
  /// baseline).
  void checks();

 private:
  Context& ctx_;
  InstanceStore& store_;
  Lifecycle& lifecycle_;
};

}  // namespace diaspora::runner
