#include "baseline.hpp"

namespace diaspora::runner {

void Baseline::checks() {
  if (!ctx_.baseline()) return;
  const double t = ctx_.now(), limit = *ctx_.opt.baseline_retry_after_s;
  // The live attempts: those on a worker, and those whose worker died unnoticed (lost).
  std::vector<InstanceStore::Ref> silent;
  for (int ii = 0; ii < store_.size(); ++ii)
    for (int ai = 0; ai < static_cast<int>(store_.at(ii).attempts.size()); ++ai) {
      const Attempt& a = store_.attempt(ii, ai);
      if (a.live() && t - a.last_beat >= limit) silent.emplace_back(ii, ai);
    }
  for (auto [ii, ai] : silent) {
    Attempt& a = store_.attempt(ii, ai);
    const std::string why = "no heartbeat for " + std::to_string(static_cast<int>(limit)) + " s (baseline retry-after)";
    if (a.lost) {
      a.outcome = Outcome::failed;
      a.reason = why;
      a.end_t = t;
      ctx_.hooks.task_failed(a, true, why);
    } else {
      lifecycle_.stop(ii, ai, Outcome::failed, why, true);
    }
    ctx_.say("baseline: " + store_.attempt(ii, ai).hook_id + " " + why);
    lifecycle_.retry_as_baseline(ii, "baseline: retry after heartbeat silence", why);
  }
}

}  // namespace diaspora::runner
