// The default ensemble: forecaster residual -> spike / likelihood / CUSUM / range
// surprises (nats) -> one score in [0, 1] with re-alert suppression.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "diaspora/resilience.hpp"
#include "math.hpp"

namespace diaspora::resilience {

using detail::require;

Ensemble::Ensemble(const Config& config)
    : c_{.z_cap = config.z_cap,
         .max_nats = config.max_nats,
         .spike_weight = config.spike_weight,
         .cusum_weight = config.cusum_weight,
         .cusum_k = config.cusum.k,
         .range_margin = config.range_margin,
         .range_nats = config.range_nats,
         .range_min_z = config.range_min_z,
         .alert_level = config.alert_level,
         .suppress_factor = config.suppress_factor,
         .alert_score = config.alert_score,
         .context_weight = config.context_weight,
         .resonance_weight = config.resonance_weight,
         .sustain_s = config.sustain_s,
         .range_warmup = config.range_warmup,
         .warmup = config.warmup,
         .suppress = config.suppress,
         .calibrate_likelihood = config.calibrate_likelihood,
         .learn_sustained = config.learn_sustained},
      fc_(config.forecaster), lh_(config.likelihood), cusum_(config.cusum), spike_tail_(config.calibration),
      cusum_tail_(config.calibration), likelihood_tail_(config.calibration), ctx_lh_(config.likelihood) {
  require(c_.z_cap > 0, "Ensemble", "z_cap");
  require(c_.max_nats > 0, "Ensemble", "max_nats");
  require(c_.spike_weight >= 0, "Ensemble", "spike_weight");
  require(c_.cusum_weight >= 0, "Ensemble", "cusum_weight");
  require(c_.range_nats >= 0, "Ensemble", "range_nats");
  require(c_.warmup >= 0, "Ensemble", "warmup");
  require(c_.range_warmup >= 0, "Ensemble", "range_warmup");
  require(c_.alert_level > 0 && c_.alert_level <= 1, "Ensemble", "alert_level");
  require(c_.suppress >= 0, "Ensemble", "suppress");
  require(c_.suppress_factor >= 0 && c_.suppress_factor <= 1, "Ensemble", "suppress_factor");
  require(c_.alert_score >= 0 && c_.alert_score <= 1, "Ensemble", "alert_score");
  require(c_.sustain_s >= 0 && std::isfinite(c_.sustain_s), "Ensemble", "sustain_s");
  require(c_.context_weight >= 0, "Ensemble", "context_weight");
  if (c_.context_weight > 0) ctx_ = ContextNovelty(config.context);
  require(c_.resonance_weight >= 0, "Ensemble", "resonance_weight");
  if (c_.resonance_weight > 0) art_ = Resonance(config.resonance);
}

Score Ensemble::update(double t, double x) noexcept {
  Score s;
  if (!std::isfinite(x) || !std::isfinite(t)) return s;
  s.index = n_;
  s.value = x;
  s.expected = fc_.forecast(t);
  const double z = fc_.update(t, x);
  s.z = z;

  const double az = std::fabs(z);
  // Two-sided Gaussian tail of |z|, calibrated against this series' own residual tail.
  const auto gauss = [](double v) { return detail::neg_log_upper_tail(v) - std::log(2.0); };
  const double spike =
      c_.spike_weight <= 0 ? 0.0 : c_.spike_weight * spike_tail_.update(az, gauss(az), [&](int k) { return gauss(spike_tail_.level(k)); });
  // The likelihood and the calibrations learn this observation at the end (learn()), once its
  // score says whether it is part of a sustained anomaly (learn_sustained).
  const double ln = lh_.observe(std::min(az / c_.z_cap, 1.0));
  s.likelihood_nats = ln;
  if (c_.calibrate_likelihood)  // the likelihood's own model is the prior: its nats as they are
    s.likelihood_nats = likelihood_tail_.surprise(ln, ln, [&](int k) { return likelihood_tail_.level(k); });
  const int change = cusum_.update(z);
  // CUSUM's exp(-2kS) tail, calibrated the same way (residuals are rarely independent).
  const double two_k = 2.0 * c_.cusum_k;
  const double cs = cusum_.surprise() / two_k;
  s.cusum_nats = c_.cusum_weight <= 0 ? 0.0 : c_.cusum_weight *
                 cusum_tail_.surprise(cs, two_k * cs, [&](int k) { return two_k * cusum_tail_.level(k); });

  // The novelty's long-run history includes the contexts' learning (the first observations
  // are all new): judged against it the detector is conservative for a while (scoring only
  // after the warm-up cost 3 points of NAB; docs/anomaly.md, "Context novelty").
  if (ctx_.enabled()) s.context_nats = c_.context_weight * ctx_lh_.update(ctx_.update(x));
  if (art_.enabled()) s.resonance = art_.update(x);
  const double art_nats = c_.resonance_weight * s.resonance * c_.max_nats;

  bool range = false;
  if (n_ == 0) {
    min_ = max_ = x;
  } else {
    const double m = c_.range_margin * (max_ - min_);
    range = c_.range_margin >= 0 && n_ >= static_cast<std::uint64_t>(std::max(c_.warmup, c_.range_warmup)) &&
            (x > max_ + m || x < min_ - m) && az >= c_.range_min_z;
    min_ = std::min(min_, x);
    max_ = std::max(max_, x);
  }
  ++n_;

  const double lim = c_.alert_level * c_.max_nats;
  const double spike_n = std::max(spike, 0.0);
  double nats = std::max({spike_n, s.likelihood_nats, s.cusum_nats, s.context_nats, art_nats});
  if (range) nats = std::max(nats, c_.range_nats);
  if (spike_n >= lim) s.fired |= kSpike;
  if (s.likelihood_nats >= lim) s.fired |= kLikelihood;
  if (s.cusum_nats >= lim || change != 0) s.fired |= (change < 0 || (change == 0 && z < 0)) ? kChangeDown : kChangeUp;
  if (range) s.fired |= kRange;
  if (s.context_nats >= lim) s.fired |= kContext;
  if (art_nats >= lim) s.fired |= kResonance;

  if (s.index < static_cast<std::uint64_t>(c_.warmup)) {
    learn(ln, cs);
    s.fired = 0;
    return s;
  }
  double score = std::clamp(nats / c_.max_nats, 0.0, 1.0);
  if (c_.sustain_s > 0) score = sustained(t, score);
  if (c_.learn_sustained || score < c_.alert_level) learn(ln, cs);
  if (suppress_left_ > 0) {
    --suppress_left_;
    if (score > 0) s.fired |= kSuppressed;
    score *= c_.suppress_factor;
  } else if (score >= c_.alert_level) {
    suppress_left_ = c_.suppress;
    if (c_.alert_score > 0) score = std::max(score, c_.alert_score);
  }
  s.score = score;
  return s;
}

// What this observation teaches the likelihood and the tail calibrations (learn_sustained).
void Ensemble::learn(double likelihood_nats, double cusum_stat) noexcept {
  lh_.learn();
  if (c_.calibrate_likelihood) likelihood_tail_.learn(likelihood_nats);
  if (c_.cusum_weight > 0) cusum_tail_.learn(cusum_stat);
}

double Ensemble::sustained(double t, double score) noexcept {
  const std::size_t slot = static_cast<std::size_t>(s_index_ % kSustain);
  double low = score;
  const std::uint64_t kept = std::min<std::uint64_t>(s_index_, kSustain - 1);
  for (std::uint64_t back = 1; back <= kept; ++back) {
    const std::size_t i = static_cast<std::size_t>((s_index_ - back) % kSustain);
    if (!(recent_t_[i] > t - c_.sustain_s)) break;
    low = std::min(low, static_cast<double>(recent_score_[i]));
  }
  recent_t_[slot] = t;
  recent_score_[slot] = static_cast<float>(score);
  ++s_index_;
  return low;
}

std::string explain(const Score& s) {
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof buf, "score %.2f [", s.score);
  out += buf;
  static constexpr struct { std::uint32_t bit; const char* name; } kNames[] = {
      {kSpike, "spike"}, {kLikelihood, "likelihood"}, {kChangeUp, "change-up"},
      {kChangeDown, "change-down"}, {kRange, "out-of-range"}, {kContext, "context"}, {kResonance, "resonance"}, {kSuppressed, "suppressed"}};
  bool first = true;
  for (const auto& n : kNames) {
    if (s.fired & n.bit) {
      if (!first) out += ',';
      out += n.name;
      first = false;
    }
  }
  if (first) out += "none";
  std::snprintf(buf, sizeof buf,
                "] value %.6g expected %.6g [%.6g, %.6g] z %+.1f; likelihood %.1f nats; cusum %.1f nats",
                s.value, s.expected.mean, s.expected.lower, s.expected.upper, s.z, s.likelihood_nats,
                s.cusum_nats);
  out += buf;
  return out;
}

bool set_config_field(Ensemble::Config& c, std::string_view name, double v) {
  struct Field { std::string_view name; double* d; int* i; };
  const Field fields[] = {
      {"z_cap", &c.z_cap, nullptr},
      {"max_nats", &c.max_nats, nullptr},
      {"spike_weight", &c.spike_weight, nullptr},
      {"cusum_weight", &c.cusum_weight, nullptr},
      {"range_margin", &c.range_margin, nullptr},
      {"range_nats", &c.range_nats, nullptr},
      {"range_min_z", &c.range_min_z, nullptr},
      {"range_warmup", nullptr, &c.range_warmup},
      {"warmup", nullptr, &c.warmup},
      {"alert_level", &c.alert_level, nullptr},
      {"suppress", nullptr, &c.suppress},
      {"suppress_factor", &c.suppress_factor, nullptr},
      {"alert_score", &c.alert_score, nullptr},
      {"sustain_s", &c.sustain_s, nullptr},
      {"context_weight", &c.context_weight, nullptr},
      {"context.levels", nullptr, &c.context.levels},
      {"context.orders", nullptr, &c.context.orders},
      {"context.buckets", nullptr, &c.context.buckets},
      {"resonance_weight", &c.resonance_weight, nullptr},
      {"resonance.step", nullptr, &c.resonance.step},
      {"resonance.probation", nullptr, &c.resonance.probation},
      {"resonance.categories", nullptr, &c.resonance.categories},
      {"resonance.initial_vigilance", &c.resonance.initial_vigilance, nullptr},
      {"forecaster.alpha", &c.forecaster.alpha, nullptr},
      {"forecaster.gamma_day", &c.forecaster.gamma_day, nullptr},
      {"forecaster.gamma_weekend", &c.forecaster.gamma_weekend, nullptr},
      {"forecaster.gamma_week", &c.forecaster.gamma_week, nullptr},
      {"forecaster.error_alpha", &c.forecaster.error_alpha, nullptr},
      {"forecaster.clip", &c.forecaster.clip, nullptr},
      {"forecaster.interval_z", &c.forecaster.interval_z, nullptr},
      {"forecaster.min_days", &c.forecaster.min_days, nullptr},
      {"likelihood.window", nullptr, &c.likelihood.window},
      {"likelihood.history", &c.likelihood.history, nullptr},
      {"likelihood.min_sigma", &c.likelihood.min_sigma, nullptr},
      {"likelihood.warmup", nullptr, &c.likelihood.warmup},
      {"cusum.k", &c.cusum.k, nullptr},
      {"cusum.h", &c.cusum.h, nullptr},
      {"cusum.clip", &c.cusum.clip, nullptr},
      {"calibration.base", &c.calibration.base, nullptr},
      {"calibration.history", &c.calibration.history, nullptr},
  };
  struct Flag { std::string_view name; bool* b; };
  const Flag flags[] = {{"forecaster.random_walk", &c.forecaster.random_walk},
                        {"forecaster.plain_level", &c.forecaster.plain_level},
                        {"calibrate_likelihood", &c.calibrate_likelihood},
                        {"learn_sustained", &c.learn_sustained}};
  for (const auto& f : flags) {
    if (f.name != name) continue;
    *f.b = v != 0;
    return true;
  }
  for (const auto& f : fields) {
    if (f.name != name) continue;
    if (f.d) *f.d = v;
    else *f.i = static_cast<int>(std::lround(v));
    return true;
  }
  return false;
}

}  // namespace diaspora::resilience
