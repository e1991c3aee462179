// A site's health: the one definition the policies' target choice, the relay's views (what
// the console shows) and `diaspora run`'s terminal view all use (docs/anomaly.md, "Site
// health"). Each fills in what it observes of the site; what it cannot observe keeps the
// neutral default.
//
// @par Thread Safety
// Pure functions: any thread.
#pragma once

#include <string_view>

namespace diaspora {

/// How long a failure (or a move off the site) weighs: its count halves every 600 s.
inline constexpr double kSiteFailureHalfLifeS = 600;

/// What a site's health is computed from.
struct SiteHealthInputs {
  double speed = 1;         ///< relative speed in [0, 1] (declared speed / the fastest, or observed)
  double failures = 0;      ///< recent failures and moves off it, decayed (decay_failures)
  double failure_rate = 0;  ///< share of its recent attempt ends that failed, [0, 1]
  double anomaly = 0;       ///< its recent anomaly level, [0, 1]
  double queue = 0;         ///< tasks waiting there beyond its workers
  double workers = 1;       ///< its workers (at least 1)
  double state = 1;         ///< site_state_factor() of its last resource status
};

/// speed x state x (1 - anomaly) x (1 - failure_rate) / (1 + failures) / (1 + queue / workers),
/// each input clamped to its range; the result is in [0, 1].
double site_health(const SiteHealthInputs& in);

/// `count` failures recorded `age_s` seconds ago, decayed: count x 2^(-age / half_life).
double decay_failures(double count, double age_s, double half_life_s = kSiteFailureHalfLifeS);

/// A site's org.diaspora.resource.status state as a factor: "down" 0, "degraded" 0.5,
/// anything else 1.
double site_state_factor(std::string_view state);

}  // namespace diaspora
