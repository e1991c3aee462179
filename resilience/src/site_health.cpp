#include "diaspora/site_health.hpp"

#include <algorithm>
#include <cmath>

namespace diaspora {

double site_health(const SiteHealthInputs& in) {
  const double unit[] = {std::clamp(in.speed, 0.0, 1.0), std::clamp(in.state, 0.0, 1.0), 1 - std::clamp(in.anomaly, 0.0, 1.0),
                         1 - std::clamp(in.failure_rate, 0.0, 1.0)};
  double h = unit[0] * unit[1] * unit[2] * unit[3];
  h /= 1 + std::max(0.0, in.failures);
  h /= 1 + std::max(0.0, in.queue) / std::max(1.0, in.workers);
  return std::clamp(h, 0.0, 1.0);
}

double decay_failures(double count, double age_s, double half_life_s) {
  if (count <= 0) return 0;
  return count * std::exp2(-std::max(0.0, age_s) / half_life_s);
}

double site_state_factor(std::string_view state) {
  if (state == "down") return 0;
  if (state == "degraded") return 0.5;
  return 1;
}

}  // namespace diaspora
