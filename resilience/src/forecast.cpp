// Phi-accrual failure detection and trend forecasts (completion time, threshold crossing).
#include <algorithm>
#include <cmath>
#include <limits>

#include "diaspora/resilience.hpp"
#include "math.hpp"

namespace diaspora::resilience {

using detail::require;
using detail::warm_alpha;

// ---- PhiAccrual ---------------------------------------------------------------------------

PhiAccrual::PhiAccrual(const Config& config) : c_(config) {
  require(c_.alpha > 0 && c_.alpha <= 1, "PhiAccrual", "alpha");
  require(c_.min_std_fraction > 0, "PhiAccrual", "min_std_fraction");
  require(c_.acceptable_pause >= 0, "PhiAccrual", "acceptable_pause");
  require(c_.first_gap > 0, "PhiAccrual", "first_gap");
}

void PhiAccrual::heartbeat(double t) noexcept {
  if (!std::isfinite(t)) return;
  if (n_ == 0) {
    last_ = t;
    mean_ = c_.first_gap;
    var_ = 0.25 * c_.first_gap * c_.first_gap;
    n_ = 1;
    return;
  }
  if (t < last_) return;
  const double gap = t - last_;
  last_ = t;
  ++n_;
  const double a = warm_alpha(c_.alpha, n_ - 1);
  const double dev = gap - mean_;
  mean_ += a * dev;
  var_ = (1 - a) * (var_ + a * dev * dev);
}

double PhiAccrual::phi(double now) const noexcept {
  if (n_ == 0 || !std::isfinite(now)) return 0;
  const double elapsed = now - last_;
  const double mean = mean_ + c_.acceptable_pause;
  const double sd = std::max(std::sqrt(var_), c_.min_std_fraction * mean_);
  const double z = (elapsed - mean) / std::max(sd, 1e-12);
  // phi = -log10 P(gap > elapsed).
  const double p = detail::neg_log_upper_tail(z) / std::log(10.0);
  return std::clamp(p, 0.0, 300.0);
}

// ---- TrendModel -----------------------------------------------------------------------------

TrendModel::TrendModel(const Config& config) : c_(config) {
  require(c_.alpha > 0 && c_.alpha <= 1, "TrendModel", "alpha");
  require(c_.beta > 0 && c_.beta <= 1, "TrendModel", "beta");
  require(c_.scale_alpha > 0 && c_.scale_alpha <= 1, "TrendModel", "scale_alpha");
}

void TrendModel::update(double t, double x) noexcept {
  if (!std::isfinite(t) || !std::isfinite(x)) return;
  if (n_ == 0) {
    level_ = x;
    t_ = t;
    n_ = 1;
    return;
  }
  const double dt = t - t_;
  if (dt <= 0) {  // same instant: refine the level only
    level_ += c_.alpha * (x - level_);
    return;
  }
  ++n_;
  const double predicted = level_ + slope_ * dt;
  const double r = x - predicted;
  sigma_ += warm_alpha(c_.scale_alpha, n_ - 1) * (std::fabs(r) * 1.25 - sigma_);
  const double prev_level = level_;
  level_ = predicted + c_.alpha * r;
  const double step_slope = (level_ - prev_level) / dt;
  if (n_ == 2) {
    slope_ = step_slope;
  } else {
    const double b = warm_alpha(c_.beta, n_ - 1);
    slope_sigma_ += b * (std::fabs(step_slope - slope_) * 1.25 - slope_sigma_);
    slope_ += b * (step_slope - slope_);
  }
  t_ = t;
}

// ---- forecasts ------------------------------------------------------------------------------

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

/// Time for `level` to reach `target` moving at `rate` (> 0 towards it), from t0, with
/// the interval of rate -/+ 2 rate_sigma.
TimeForecast reach(double t0, double distance, double rate, double rate_sigma) {
  const double fast = rate + 2 * rate_sigma;
  const double slow = rate - 2 * rate_sigma;
  return {t0 + distance / rate, t0 + distance / fast, slow > 0 ? t0 + distance / slow : kInf};
}
}  // namespace

CompletionForecaster::CompletionForecaster(double total, TrendModel::Config config)
    : total_(total), model_(config) {
  require(std::isfinite(total) && total > 0, "CompletionForecaster", "total");
}

std::optional<TimeForecast> CompletionForecaster::expected_completion() const noexcept {
  if (model_.count() == 0) return std::nullopt;
  const double t0 = model_.last_time();
  if (model_.level() >= total_) return TimeForecast{t0, t0, t0};
  if (model_.count() < 2 || !(model_.slope() > 0)) return std::nullopt;
  return reach(t0, total_ - model_.level(), model_.slope(), model_.slope_sigma());
}

ThresholdForecaster::ThresholdForecaster(double threshold, Direction direction, TrendModel::Config config)
    : threshold_(threshold), dir_(direction), model_(config) {
  require(std::isfinite(threshold), "ThresholdForecaster", "threshold");
}

std::optional<TimeForecast> ThresholdForecaster::time_to_cross() const noexcept {
  if (model_.count() == 0) return std::nullopt;
  const double t0 = model_.last_time();
  const double sign = dir_ == Direction::kRising ? 1.0 : -1.0;
  const double distance = sign * (threshold_ - model_.level());
  if (distance <= 0) return TimeForecast{t0, t0, t0};
  const double rate = sign * model_.slope();
  if (model_.count() < 2 || !(rate > 0)) return std::nullopt;
  return reach(t0, distance, rate, model_.slope_sigma());
}

}  // namespace diaspora::resilience
