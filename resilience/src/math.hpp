// Small numeric helpers shared by the resilience sources (internal).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include "diaspora/error.hpp"

namespace diaspora::resilience::detail {

/// -ln of the standard normal upper tail Q(z) = P(Z > z), accurate for any z (the
/// asymptotic expansion takes over where erfc underflows).
inline double neg_log_upper_tail(double z) noexcept {
  if (z < 5.0) return -std::log(0.5 * std::erfc(z * 0.70710678118654752));
  // Q(z) ~ phi(z)/z * (1 - 1/z^2 + 3/z^4): relative error < 1e-3 for z >= 5.
  const double z2 = z * z;
  return 0.5 * z2 + std::log(z * 2.5066282746310002) - std::log1p(-1.0 / z2 + 3.0 / (z2 * z2));
}

/// Exponential smoothing factor that starts as a running mean (1/n) and settles at alpha,
/// so early estimates are not biased towards the zero they start from.
inline double warm_alpha(double alpha, unsigned long long n) noexcept {
  return std::max(alpha, 1.0 / static_cast<double>(n ? n : 1));
}

inline void require(bool ok, const char* what, const char* field) {
  if (!ok) throw Error(std::string(what) + ": " + field + " is out of range");
}

}  // namespace diaspora::resilience::detail
