// Resonance: a bounded, streaming dual-vigilance fuzzy ART over windows of a downsampled
// series (the manner of ARTime; resilience.hpp says what it does).
#include <algorithm>
#include <cmath>

#include "diaspora/resilience.hpp"
#include "math.hpp"

namespace diaspora::resilience {

using detail::require;

namespace {

constexpr int kLevels = 80;          // discretisation of the normalised point
constexpr double kChomp = 0.075;     // a point this close to the running median snaps to it
constexpr double kMaskWindows = 1.5; // masking after an anomaly or a new cluster, in windows
constexpr double kMaxUpper = 0.97;   // cap on the upper vigilance

// In-place orthonormal Haar transform of 8 values: [approximation, coarsest detail, ...,
// finest details], as a full three-level decomposition.
void haar8(std::array<double, Resonance::kWindow>& v) noexcept {
  constexpr double r = 0.70710678118654752;
  std::array<double, Resonance::kWindow> t{};
  for (int len = Resonance::kWindow; len > 1; len /= 2) {
    const int half = len / 2;
    for (int k = 0; k < half; ++k) {
      t[static_cast<std::size_t>(k)] = (v[static_cast<std::size_t>(2 * k)] + v[static_cast<std::size_t>(2 * k + 1)]) * r;
      t[static_cast<std::size_t>(half + k)] = (v[static_cast<std::size_t>(2 * k)] - v[static_cast<std::size_t>(2 * k + 1)]) * r;
    }
    std::copy_n(t.begin(), len, v.begin());
  }
}

// Scales values to [0, 1] by their own minimum and maximum (all 0 if they are equal).
template <std::size_t N>
void stretch(std::array<double, N>& v) noexcept {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  const double a = *lo, span = *hi - *lo;
  for (double& x : v) x = span > 0 ? (x - a) / span : 0.0;
}

std::uint8_t byte(double v) noexcept { return static_cast<std::uint8_t>(std::lround(std::clamp(v, 0.0, 1.0) * 255.0)); }

}  // namespace

Resonance::Resonance(const Config& config) : c_(config), enabled_(true) {
  require(c_.step >= 1 && c_.step <= 1024, "Resonance", "step");
  require(c_.probation >= 2 * kWindow && c_.probation <= 65536, "Resonance", "probation");
  require(c_.categories >= 4 && c_.categories <= kMaxCategories, "Resonance", "categories");
  require(c_.initial_vigilance > 0 && c_.initial_vigilance < 1, "Resonance", "initial_vigilance");
  require(!(c_.lower > c_.upper), "Resonance", "lower");
  rho_lb_ = rho_ub_ = c_.initial_vigilance;
  block_min_.fill(1.0f);
}

Resonance::Config Resonance::for_probation(std::uint64_t observations, Config base) {
  constexpr std::uint64_t kPointsPerProbation = 13 * kWindow;
  const auto step = std::clamp<std::uint64_t>(observations / kPointsPerProbation, 1, 1024);
  base.step = static_cast<int>(step);
  base.probation = static_cast<int>(std::clamp<std::uint64_t>(observations / step, 2 * kWindow, 65536));
  return base;
}

double Resonance::update(double x) noexcept {
  if (!enabled_ || !std::isfinite(x)) return 0;
  if (!seen_) {
    seen_ = true;
    min_ = std::isfinite(c_.lower) ? std::min(c_.lower, x) : x;
    max_ = std::isfinite(c_.upper) ? std::max(c_.upper, x) : x;
  }
  min_ = std::min(min_, x);
  max_ = std::max(max_, x);
  if (in_step_ == 0) lo_ = hi_ = x, sum_ = 0;
  lo_ = std::min(lo_, x);
  hi_ = std::max(hi_, x);
  sum_ += x;
  if (++in_step_ < c_.step) return 0;

  const int level = point();
  in_step_ = 0;
  std::rotate(window_.begin(), window_.begin() + 1, window_.end());
  window_.back() = static_cast<std::uint8_t>(level);
  ++points_;
  if (points_ < static_cast<std::uint32_t>(kWindow)) return 0;

  // Features: the window stretched to [0, 1], Haar-transformed and stretched again; then the
  // window as it is (its levels say where the series is in its range).
  std::array<double, kWindow> w{};
  for (int k = 0; k < kWindow; ++k) w[static_cast<std::size_t>(k)] = window_[static_cast<std::size_t>(k)] / double{kLevels};
  stretch(w);
  haar8(w);
  stretch(w);
  Box in{};
  for (int k = 0; k < kWindow; ++k) {
    const auto h = byte(w[static_cast<std::size_t>(k)]);
    const auto v = byte(window_[static_cast<std::size_t>(k)] / double{kLevels});
    in[static_cast<std::size_t>(k)] = h;
    in[static_cast<std::size_t>(kWindow + k)] = v;
    in[static_cast<std::size_t>(kFeatures + k)] = static_cast<std::uint8_t>(255 - h);
    in[static_cast<std::size_t>(kFeatures + kWindow + k)] = static_cast<std::uint8_t>(255 - v);
  }
  return learn(in);
}

int Resonance::point() noexcept {
  const double mean = sum_ / c_.step;
  // The extreme farthest from the recent level stands for the step when it is 10 % off the
  // mean (a short spike survives downsampling).
  level_ = points_ == 0 ? mean : (level_ + mean) / 2;
  double d = std::fabs(hi_ - level_) < std::fabs(lo_ - level_) ? lo_ : hi_;
  if (std::fabs(d - mean) < 0.1 * std::fabs(mean)) d = mean;
  const double span = max_ - min_;
  const double u = span > 0 ? std::clamp((d - min_) / span, 0.0, 1.0) : 0.0;
  const int level = static_cast<int>(std::lround(u * kLevels));
  // The median of the levels so far, from their histogram (halved before a count overflows,
  // which keeps the median); a level within kChomp of it snaps to it.
  if (levels_[static_cast<std::size_t>(level)] == 0xFF)
    for (auto& h : levels_) h = static_cast<std::uint8_t>(h / 2);
  ++levels_[static_cast<std::size_t>(level)];
  std::uint32_t total = 0, below = 0;
  for (auto h : levels_) total += h;
  int median = 0;
  while ((below += levels_[static_cast<std::size_t>(median)]) * 2 < total) ++median;
  return std::abs(level - median) < kChomp * kLevels ? median : level;
}

void Resonance::touch(int k) noexcept {
  auto* const at = std::find(recent_.begin(), recent_.begin() + used_, static_cast<std::uint8_t>(k));
  std::rotate(recent_.begin(), at, at + 1);
}

double Resonance::learn(const Box& in) noexcept {
  const std::uint32_t i = points_ - kWindow + 1;  // 1-based index of this feature window
  const auto mask = static_cast<std::uint32_t>(kMaskWindows * kWindow);
  const auto trend = static_cast<std::uint32_t>(c_.probation);
  const bool after_anomaly = anomalies_ > 0 && i - last_anomaly_ <= mask;
  const bool adapt = i > trend && ((anomalies_ > 0 && i - last_anomaly_ == mask) || i - last_adapt_ >= trend / 2);
  if (i > trend + mask && mask_new_ && quiet_ >= mask) mask_new_ = false;

  // Match against every category: overlap |min(in, w)| / |w|, cubed, times the overlap of
  // the current level (the window's last value and its complement) squared.
  constexpr std::size_t e = kFeatures - 1, ec = 2 * kFeatures - 1;
  double best = 0, best_energy = 0;
  bool resonated = false;
  for (int k = 0; k < used_; ++k) {
    Box& b = box_[static_cast<std::size_t>(k)];
    int overlap = 0, size = 0;
    for (std::size_t d = 0; d < b.size(); ++d) {
      overlap += std::min(in[d], b[d]);
      size += b[d];
    }
    const double fs = static_cast<double>(overlap) / std::max(size, 1);
    const int esize = b[e] + b[ec];
    const double energy = static_cast<double>(std::min(in[e], b[e]) + std::min(in[ec], b[ec])) / std::max(esize, 1);
    const double m = fs * fs * fs * energy * energy;
    if (m > best) best = m, best_energy = energy;
    if (m >= rho_ub_) {  // resonance: fast learning, the box grows to hold the input
      for (std::size_t d = 0; d < b.size(); ++d) b[d] = std::min(in[d], b[d]);
      touch(k);
      resonated = true;
    }
  }
  const bool new_cluster = used_ > 0 && best < rho_lb_;
  if (!resonated) {  // a new category (of the best one's cluster, or of a new cluster)
    int slot = used_;
    if (used_ == c_.categories) slot = recent_[static_cast<std::size_t>(used_ - 1)];  // the least recent
    else recent_[used_++] = static_cast<std::uint8_t>(slot);
    box_[static_cast<std::size_t>(slot)] = in;
    touch(slot);
  }

  last_match_ = static_cast<float>(best);
  quiet_ = new_cluster ? 0 : quiet_ + 1;
  match_sum_ += best;
  if (i <= trend && i > trend / 2) probation_sum_ += static_cast<float>(best);
  // The lowest match of about the last probation/2 windows, by blocks.
  const std::uint32_t block = std::max<std::uint32_t>(1, (trend / 2 + 1 + 3) / 4);
  cur_min_ = std::min(cur_min_, static_cast<float>(best));
  if (++in_block_ == block) {
    block_min_[block_pos_] = cur_min_;
    block_pos_ = static_cast<std::uint8_t>((block_pos_ + 1) % 4);
    cur_min_ = 1;
    in_block_ = 0;
  }
  // The recent shortfall below the upper vigilance (where it exceeds 0.05; capped at 0.37).
  const double gap = rho_ub_ - best, a = 1.0 / (trend + 1);
  short_num_ += static_cast<float>(a * ((gap > 0.05 ? std::min(0.37, gap) : 0.0) - short_num_));
  short_den_ += static_cast<float>(a * ((gap > 0.05 ? 1.0 : 0.0) - short_den_));
  // An anomaly's match is the lowest seen while it is masked.
  if (anomalies_ > 0 && i - last_anomaly_ < mask && best < anomaly_last_) anomaly_last_ = static_cast<float>(best);

  const bool masking = mask_new_ || after_anomaly;
  const bool far_worse = anomalies_ > 0 && best < anomaly_last_ * (after_anomaly ? 0.90 : 0.70);
  double confidence = 0;
  if (i > trend && new_cluster && (!masking || far_worse)) {
    const double fs = std::min(0.999, best);
    const double up = ((1 - fs) - (1 - rho_ub_)) / (1 - fs), low = ((1 - fs) - (1 - rho_lb_)) / (1 - fs);
    confidence = std::clamp(0.35 * up + 0.65 * low + 1.5 * (1.0 - best_energy), 1e-6, 1.0);
    if (anomalies_ > 0) anomaly_sum_ += anomaly_last_;
    anomaly_last_ = static_cast<float>(best);
    ++anomalies_;
    last_anomaly_ = i;
  }
  mask_new_ = mask_new_ || new_cluster;
  if (i == trend) rho_lb_ = rho_ub_ = probation_sum_ / static_cast<float>(trend - trend / 2);
  if (adapt) {
    adapt_vigilance();
    last_adapt_ = i;
    mask_new_ = true;
  }
  return confidence;
}

void Resonance::adapt_vigilance() noexcept {
  const std::uint32_t i = points_ - kWindow + 1;
  float low = cur_min_;
  for (float b : block_min_) low = std::min(low, b);
  const double ub = std::min(kMaxUpper, match_sum_ / static_cast<double>(i));
  double lb = rho_lb_;
  if (lb <= low) {
    lb += (low - lb) * 0.19;
  } else {
    double fall = 0;
    if (i > 2u * static_cast<std::uint32_t>(c_.probation) && short_den_ > 1e-9f) fall = short_num_ / short_den_;
    lb -= std::max(0.01, fall) / 2;
    if (anomalies_ > 0) lb = std::max(lb, static_cast<double>((anomaly_sum_ + anomaly_last_) / static_cast<float>(anomalies_)));
  }
  rho_ub_ = static_cast<float>(ub);
  rho_lb_ = static_cast<float>(std::min(ub, lb));
}

}  // namespace diaspora::resilience
