// Streaming building blocks: robust level/scale, calendar Holt-Winters, CUSUM, anomaly
// likelihood. Each update is O(1) and allocation-free.
#include <algorithm>
#include <cmath>

#include "diaspora/resilience.hpp"
#include "math.hpp"

namespace diaspora::resilience {

using detail::require;
using detail::warm_alpha;

// ---- RobustLevel -------------------------------------------------------------------------

RobustLevel::RobustLevel(const Config& config) : c_(config) {
  require(c_.alpha > 0 && c_.alpha <= 1, "RobustLevel", "alpha");
  require(c_.scale_alpha > 0 && c_.scale_alpha <= 1, "RobustLevel", "scale_alpha");
  require(c_.clip > 0, "RobustLevel", "clip");
}

double RobustLevel::z(double x) const noexcept {
  if (n_ < 2) return 0;
  const double floor = 1e-9 * abs_mean_ + 1e-300;
  return (x - level_) / std::max(1.25 * scale_, floor);
}

double RobustLevel::update(double x) noexcept {
  if (!std::isfinite(x)) return 0;
  if (n_ == 0) {
    level_ = x;
    abs_mean_ = std::fabs(x);
    n_ = 1;
    return 0;
  }
  const double zz = z(x);
  ++n_;
  const double r = x - level_;
  const double lim = c_.clip * 1.25 * scale_;
  const double rc = n_ > 2 ? std::clamp(r, -lim, lim) : r;
  level_ += warm_alpha(c_.alpha, n_) * rc;
  scale_ += warm_alpha(c_.scale_alpha, n_ - 1) * (std::fabs(rc) - scale_);
  abs_mean_ += warm_alpha(c_.scale_alpha, n_) * (std::fabs(x) - abs_mean_);
  return zz;
}

// ---- SeasonalForecaster -------------------------------------------------------------------

namespace {
constexpr double kDay = 86400.0;

inline int half_hour_of_day(double t) noexcept {
  double s = std::fmod(t, kDay);
  if (s < 0) s += kDay;
  return std::min(47, static_cast<int>(s / 1800.0));
}

inline int day_of_week(double t) noexcept {  // Monday = 0 (1970-01-01 was a Thursday)
  const auto d = static_cast<long long>(std::floor(t / kDay));
  return static_cast<int>(((d + 3) % 7 + 7) % 7);
}
}  // namespace

SeasonalForecaster::SeasonalForecaster(const Config& config) : c_(config) {
  require(c_.alpha > 0 && c_.alpha <= 1, "SeasonalForecaster", "alpha");
  require(c_.gamma_day > 0 && c_.gamma_day <= 1, "SeasonalForecaster", "gamma_day");
  require(c_.gamma_weekend >= 0 && c_.gamma_weekend <= 1, "SeasonalForecaster", "gamma_weekend");
  require(c_.gamma_week >= 0 && c_.gamma_week <= 1, "SeasonalForecaster", "gamma_week");
  require(c_.error_alpha > 0 && c_.error_alpha <= 1, "SeasonalForecaster", "error_alpha");
  require(c_.clip > 0, "SeasonalForecaster", "clip");
  require(c_.interval_z > 0, "SeasonalForecaster", "interval_z");
  require(c_.min_days >= 0, "SeasonalForecaster", "min_days");
}

double SeasonalForecaster::seasonal(int bucket, int weekday) const noexcept {
  const auto b = static_cast<std::size_t>(bucket);
  double s = static_cast<double>(day_[b]) + static_cast<double>(week_[static_cast<std::size_t>(weekday)]);
  if (weekday >= 5) s += static_cast<double>(weekend_[b]);
  return s;
}

bool SeasonalForecaster::seasonal_ready() const noexcept {
  return n_ > 1 && (last_t_ - first_t_) >= c_.min_days * kDay;
}

double SeasonalForecaster::sigma() const noexcept {
  const double floor = 1e-3 * spread_ + 1e-300;
  return std::max(1.25 * err_[static_cast<int>(best_)], floor);
}

Forecast SeasonalForecaster::forecast(double t) const noexcept {
  if (n_ == 0) return {};
  double m = c_.plain_level ? plain_ : level_;
  if (best_ == Model::kSeasonal) {
    m = level_ + seasonal(half_hour_of_day(t), day_of_week(t));
  } else if (best_ == Model::kRandomWalk) {
    m = last_x_ + (seasonal_ready() ? seasonal(half_hour_of_day(t), day_of_week(t)) - last_season_ : 0.0);
  }
  const double w = c_.interval_z * sigma();
  return {m, m - w, m + w};
}

double SeasonalForecaster::update(double t, double x) noexcept {
  if (!std::isfinite(x) || !std::isfinite(t)) return 0;
  const int bi = half_hour_of_day(t);
  const int d = day_of_week(t);
  const auto b = static_cast<std::size_t>(bi);
  if (n_ == 0) {
    level_ = plain_ = last_x_ = x;
    first_t_ = last_t_ = t;
    n_ = 1;
    return 0;
  }
  const bool ready = seasonal_ready();
  const double season = seasonal(bi, d);
  const double used = ready ? season : 0.0;
  const double f[3] = {level_ + used, c_.plain_level ? plain_ : level_,
                       last_x_ + (ready ? season - last_season_ : 0.0)};
  const double sig = sigma();
  const double r = x - f[static_cast<int>(best_)];
  // A residual of a million sigmas is as surprising as residuals get (and keeps the
  // tails finite when a constant series first moves).
  const double z = n_ >= 2 ? std::clamp(r / sig, -1e6, 1e6) : 0.0;

  ++n_;
  const double gap = t - last_t_;
  if (gap > 0) gap_ += warm_alpha(0.05, n_ - 1) * (std::min(gap, kDay) - gap_);
  last_t_ = std::max(last_t_, t);
  const double lim = c_.clip * sig;
  const auto clip = [&](double v) { return n_ > 3 ? std::clamp(v, -lim, lim) : v; };
  const double ea = warm_alpha(c_.error_alpha, n_ - 1);
  for (int m = 0; m < 3; ++m) {
    const double lim_m = c_.clip * std::max(1.25 * err_[m], 1e-3 * spread_);
    const double e = std::fabs(x - f[m]);
    err_[m] += ea * ((n_ > 3 ? std::min(e, lim_m) : e) - err_[m]);
  }
  spread_ += ea * (std::fabs(x - level_) - spread_);
  best_ = Model::kLevel;
  if (c_.random_walk && err_[2] < err_[1]) best_ = Model::kRandomWalk;
  if (ready && err_[0] < 0.95 * err_[static_cast<int>(best_)]) best_ = Model::kSeasonal;

  // Holt-Winters (additive, no trend): the level follows the deseasonalized value, then
  // the calendar terms learn what the new level leaves.
  level_ += warm_alpha(c_.alpha, n_) * clip(x - level_ - season);
  plain_ += warm_alpha(c_.alpha, n_) * clip(x - plain_);
  const double e = clip(x - level_ - season);
  if (d < 5 || visits_[b] == 0) {
    if (visits_[b] < 65535) ++visits_[b];
    day_[b] = static_cast<float>(day_[b] + std::max(c_.gamma_day, 1.0 / visits_[b]) * e);
  } else {
    weekend_[b] = static_cast<float>(weekend_[b] + c_.gamma_weekend * e);
  }
  const double gw = std::min(1.0, c_.gamma_week * gap_ / kDay);
  week_[static_cast<std::size_t>(d)] = static_cast<float>(week_[static_cast<std::size_t>(d)] + gw * e);
  last_x_ = x;
  last_season_ = seasonal(bi, d);
  return z;
}

// ---- Cusum --------------------------------------------------------------------------------

Cusum::Cusum(const Config& config) : c_(config) {
  require(c_.k > 0, "Cusum", "k");
  require(c_.h > 0, "Cusum", "h");
  require(c_.clip > c_.k, "Cusum", "clip");
}

int Cusum::update(double z) noexcept {
  if (!std::isfinite(z)) return 0;
  const double zc = std::clamp(z, -c_.clip, c_.clip);
  up_ = std::max(0.0, up_ + zc - c_.k);
  down_ = std::max(0.0, down_ - zc - c_.k);
  peak_ = 2.0 * c_.k * std::max(up_, down_);
  int alarm = 0;
  if (up_ >= c_.h) alarm = 1;
  else if (down_ >= c_.h) alarm = -1;
  if (alarm != 0) up_ = down_ = 0;
  return alarm;
}

// ---- AnomalyLikelihood ----------------------------------------------------------------------

AnomalyLikelihood::AnomalyLikelihood(const Config& config) : c_(config) {
  require(c_.window >= 1 && c_.window <= 32, "AnomalyLikelihood", "window");
  require(c_.history >= c_.window, "AnomalyLikelihood", "history");
  require(c_.min_sigma > 0, "AnomalyLikelihood", "min_sigma");
  require(c_.warmup >= 0, "AnomalyLikelihood", "warmup");
}

double AnomalyLikelihood::update(double raw) noexcept {
  const double nats = observe(raw);
  learn();
  return nats;
}

double AnomalyLikelihood::observe(double raw) noexcept {
  if (!std::isfinite(raw)) return 0;
  raw = std::clamp(raw, 0.0, 1.0);
  if (filled_ == c_.window) sum_ -= ring_[static_cast<std::size_t>(pos_)];
  else ++filled_;
  ring_[static_cast<std::size_t>(pos_)] = static_cast<float>(raw);
  sum_ += static_cast<float>(raw);
  pos_ = (pos_ + 1) % c_.window;
  const double avg = sum_ / filled_;

  ++n_;
  double nats = 0;
  if (n_ > static_cast<std::uint64_t>(c_.warmup)) {
    const double sd = std::max(std::sqrt(var_), c_.min_sigma);
    const double zz = (avg - mean_) / sd;
    if (zz > 0) nats = detail::neg_log_upper_tail(zz) - std::log(2.0);  // 0 at the mean
    nats = std::max(nats, 0.0);
  }
  pending_ = true;
  return nats;
}

void AnomalyLikelihood::learn() noexcept {
  if (!pending_) return;
  pending_ = false;
  const double a = warm_alpha(1.0 / c_.history, n_);
  const double dev = sum_ / filled_ - mean_;
  mean_ += a * dev;
  var_ = (1 - a) * (var_ + a * dev * dev);
}

// ---- TailCalibrator -------------------------------------------------------------------------

TailCalibrator::TailCalibrator(const Config& config) : c_(config) {
  require(c_.base > 0, "TailCalibrator", "base");
  require(c_.history >= 1, "TailCalibrator", "history");
}

double TailCalibrator::level(int k) const noexcept { return c_.base * std::exp2(0.5 * k); }

int TailCalibrator::level_index(double x) const noexcept {
  if (!(x >= c_.base)) return -1;
  return std::min(11, static_cast<int>(std::floor(2.0 * std::log2(x / c_.base))));
}

void TailCalibrator::learn(double x) noexcept {
  ++n_;
  const double a = warm_alpha(1.0 / c_.history, n_);
  const int k = level_index(x);
  for (int i = 0; i < 12; ++i) {
    const double hit = i <= k ? 1.0 : 0.0;
    rate_[static_cast<std::size_t>(i)] =
        static_cast<float>(rate_[static_cast<std::size_t>(i)] + a * (hit - rate_[static_cast<std::size_t>(i)]));
  }
}

}  // namespace diaspora::resilience

// ---- ContextNovelty ------------------------------------------------------------------------

namespace diaspora::resilience {

ContextNovelty::ContextNovelty(const Config& config) : c_(config), enabled_(true) {
  require(c_.levels >= 2 && c_.levels <= 64, "ContextNovelty", "levels");
  require(c_.orders >= 1 && c_.orders <= 8, "ContextNovelty", "orders");
  require(c_.buckets >= 16 && c_.buckets <= kMaxBuckets && (c_.buckets & (c_.buckets - 1)) == 0, "ContextNovelty",
          "buckets");
}

double ContextNovelty::update(double x) noexcept {
  if (!enabled_ || !std::isfinite(x)) return 0;
  if (n_++ == 0) min_ = max_ = x;
  min_ = std::min(min_, x);
  max_ = std::max(max_, x);
  const double span = max_ - min_;
  const int bin = span > 0 ? std::min(c_.levels - 1, static_cast<int>((x - min_) / span * c_.levels)) : 0;
  int novel = 0, judged = 0;
  // FNV-1a over (bin, history...), one multiply a symbol (xoring two symbols before a
  // multiply would make 2 -> 7 and 5 -> 2 one context).
  std::uint64_t h = (1469598103934665603ull ^ static_cast<std::uint64_t>(bin)) * 1099511628211ull;
  for (int j = 1; j <= std::min(seen_, c_.orders); ++j) {
    h = (h ^ (history_[static_cast<std::size_t>(j - 1)] + 1u)) * 1099511628211ull;
    const std::uint64_t mixed = (h ^ static_cast<std::uint64_t>(j)) * 0x9E3779B97F4A7C15ull;
    const auto bucket = static_cast<std::size_t>(mixed >> 40) & static_cast<std::size_t>(c_.buckets - 1);
    std::uint16_t tag = static_cast<std::uint16_t>(mixed >> 16);
    if (tag == 0) tag = 1;  // 0 marks an empty slot
    std::uint16_t* slots = table_.data() + bucket * 4;
    ++judged;
    if (slots[0] == tag || slots[1] == tag || slots[2] == tag || slots[3] == tag) continue;
    ++novel;
    std::uint8_t& packed = next_[bucket / 4];
    const unsigned shift = 2 * (bucket % 4), slot = (packed >> shift) & 3u;
    slots[slot] = tag;
    packed = static_cast<std::uint8_t>((packed & ~(3u << shift)) | (((slot + 1) & 3u) << shift));
  }
  for (int k = std::min(seen_, 7); k > 0; --k) history_[static_cast<std::size_t>(k)] = history_[static_cast<std::size_t>(k - 1)];
  history_[0] = static_cast<std::uint8_t>(bin);
  seen_ = std::min(seen_ + 1, 8);
  return judged > 0 ? static_cast<double>(novel) / judged : 0.0;
}

}  // namespace diaspora::resilience
