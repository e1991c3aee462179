// Diaspora's resilience engine, detection part: streaming anomaly detectors, an ensemble
// that turns them into one anomaly score in [0, 1] per series with an explanation, a
// phi-accrual failure detector, and forecasts (completion time, threshold crossing).
//
// Pure computation: no I/O, no threads, no clocks. Every time is a `double` number of
// seconds (any epoch; the seasonal model reads the hour of day and the day of week of
// Unix time, so pass seconds since 1970-01-01 in the series' local time for calendars to
// line up).
//
// Cost model: every update() is O(1) time, does not allocate and does not throw; each
// object has a fixed size (no heap). Objects are plain values: copy one to snapshot it.
//
// @par Thread Safety
// None of these classes locks. Distinct objects may be used from distinct threads; one
// object must not be used from two threads at once without outside synchronisation.
// const member functions on an object nobody is updating are safe to call concurrently.
//
// Errors: constructors validate their Config and throw diaspora::Error naming the bad
// field; nothing else throws. Non-finite inputs (NaN, ±inf) are ignored by update()
// (the state does not change and the returned score is 0), so one bad reading cannot
// poison a detector.
#pragma once

#include <array>
#include <cmath>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace diaspora::resilience {

// =========================================================================================
// Building blocks
// =========================================================================================

/// Robust level and scale of a series: an exponentially weighted mean whose updates are
/// clipped (Huber) at `clip` scales, and an exponentially weighted mean absolute
/// deviation (a streaming stand-in for median/MAD: for Gaussian noise scale() ~ 0.8 sigma,
/// z() divides by 1.25 * scale()). A spike moves the level by at most clip*alpha scales.
class RobustLevel {
 public:
  struct Config {
    double alpha = 0.05;       ///< level smoothing, (0, 1]
    double scale_alpha = 0.02; ///< scale smoothing, (0, 1]
    double clip = 4.0;         ///< Huber clip, in scales (> 0)
  };
  RobustLevel() : RobustLevel(Config{}) {}
  /// Throws diaspora::Error if a field is out of range.
  explicit RobustLevel(const Config& config);

  /// Feeds one value; returns its z-score against the state *before* the update
  /// (0 for the first value or a non-finite one).
  double update(double x) noexcept;
  double level() const noexcept { return level_; }
  /// Mean absolute deviation around the level (0 until two values were seen).
  double scale() const noexcept { return scale_; }
  /// z-score of x against the current state, without updating.
  double z(double x) const noexcept;
  std::uint64_t count() const noexcept { return n_; }

 private:
  Config c_;
  double level_ = 0, scale_ = 0, abs_mean_ = 0;
  std::uint64_t n_ = 0;
};

/// A forecast with a central prediction interval.
struct Forecast {
  double mean = 0;
  double lower = 0;  ///< interval bounds (mean -/+ z * sigma; see Config::interval_z)
  double upper = 0;
};

/// Seasonality-aware forecaster with prediction intervals. Three one-step forecasts
/// compete and the one with the smallest exponentially weighted absolute error is used
/// (that error, x1.25, is also its sigma):
///  - Holt-Winters (additive, no trend) whose seasonal terms are calendar buckets rather
///    than a period in observations: a half-hour-of-day profile (48 terms), a weekend
///    correction to it (48) and a day-of-week offset (7), so any sampling rate and
///    irregular sampling work and memory is fixed;
///  - the level alone (no seasonality);
///  - the last value plus the seasonal change since it (a random walk, for series that
///    wander).
/// Each profile term starts as the mean of its first visits, then is smoothed with
/// gamma_day per visit; the weekend correction and weekday offsets start at 0.
/// Seasonal terms are only used after `min_days` days of data.
class SeasonalForecaster {
 public:
  struct Config {
    double alpha = 0.05;        ///< level smoothing, per observation
    double gamma_day = 0.2;     ///< half-hour-of-day term smoothing, per visit
    double gamma_weekend = 0.1; ///< weekend correction smoothing, per visit
    double gamma_week = 0.1;    ///< day-of-week offset smoothing, per day of data
    double error_alpha = 0.01;  ///< smoothing of the competing models' absolute errors
    double clip = 8.0;          ///< Huber clip of the learning residual, in sigmas
    double interval_z = 3.0;    ///< half-width of forecast() intervals, in sigmas
    double min_days = 1.0;      ///< days of history before seasonal terms may be used
    bool random_walk = false;   ///< let the random-walk model compete (off: it explains
                                ///< away pattern changes, which hurts detection)
    /// The level-only model forecasts an exponentially weighted level of the values (true)
    /// rather than the Holt-Winters level, which leaves out the calendar terms: while those
    /// are still learning (the first min_days) or after an outage taught them a bias, the
    /// Holt-Winters level stays off by that bias for the rest of a half-hour. Off for NAB
    /// (the tuning protocol measured it lower there), on for the policy engine
    /// (docs/anomaly.md, "Workflow traces").
    bool plain_level = false;
  };
  /// The competing models (see model()).
  enum class Model : std::uint8_t { kSeasonal, kLevel, kRandomWalk };

  SeasonalForecaster() : SeasonalForecaster(Config{}) {}
  /// Throws diaspora::Error if a field is out of range.
  explicit SeasonalForecaster(const Config& config);

  /// Forecast for time t by the current best model (no update). Before the first
  /// value: {0, 0, 0}.
  Forecast forecast(double t) const noexcept;
  /// Feeds (t, x); returns the standardized one-step residual (x - forecast) / sigma of
  /// the model that was best before the update (0 for the first two values).
  double update(double t, double x) noexcept;
  /// Residual sigma of the current best model (1.25 x its mean absolute error), with a
  /// floor of 1e-3 of the series' typical spread.
  double sigma() const noexcept;
  Model model() const noexcept { return best_; }
  std::uint64_t count() const noexcept { return n_; }

 private:
  double seasonal(int bucket, int weekday) const noexcept;
  bool seasonal_ready() const noexcept;
  Config c_;
  double level_ = 0, plain_ = 0, last_x_ = 0, last_season_ = 0, first_t_ = 0, last_t_ = 0, gap_ = 0;
  double err_[3] = {0, 0, 0};
  double spread_ = 0;
  std::uint64_t n_ = 0;
  Model best_ = Model::kLevel;
  std::array<float, 48> day_{};
  std::array<float, 48> weekend_{};
  std::array<float, 7> week_{};
  std::array<std::uint16_t, 48> visits_{};
};

/// Two-sided CUSUM change-point detector on standardized residuals (z, clipped at
/// +-clip): S+ = max(0, S+ + z - k), S- = max(0, S- - z - k). An alarm is raised when
/// either side reaches h; both sides then restart from 0. For N(0,1) input the
/// statistic's stationary tail is about exp(-2kS), so surprise() = 2kS nats.
class Cusum {
 public:
  struct Config {
    double k = 0.5;    ///< allowance (half the shift to detect, in sigmas), > 0
    double h = 12.0;   ///< alarm level, > 0
    double clip = 4.0; ///< input clip, > k
  };
  Cusum() : Cusum(Config{}) {}
  explicit Cusum(const Config& config);
  /// Feeds one z; returns +1 (alarm, upward change), -1 (downward) or 0.
  int update(double z) noexcept;
  double upper() const noexcept { return up_; }
  double lower() const noexcept { return down_; }
  /// -ln of the approximate tail probability of the larger side, 2 k max(S+, S-), as it
  /// was at the last update before any alarm reset.
  double surprise() const noexcept { return peak_; }

 private:
  Config c_;
  double up_ = 0, down_ = 0, peak_ = 0;
};

/// Numenta-style anomaly likelihood: how unusual the recent mean of a raw score in [0, 1]
/// is against that mean's long-run distribution. Keeps a ring of the last `window` raw
/// scores (window <= 32) and exponentially weighted mean/variance of their mean
/// (time constant `history` observations). surprise() is -ln of the Gaussian upper tail.
class AnomalyLikelihood {
 public:
  struct Config {
    int window = 7;          ///< short-term mean, 1..32 observations
    double history = 2000;   ///< long-run time constant, in observations (>= window)
    double min_sigma = 0.02; ///< floor on the long-run sigma
    int warmup = 100;        ///< observations before surprise() may be non-zero
  };
  AnomalyLikelihood() : AnomalyLikelihood(Config{}) {}
  explicit AnomalyLikelihood(const Config& config);
  /// Feeds one raw score (clamped to [0, 1]); returns surprise in nats (>= 0). The same as
  /// observe(raw) then learn().
  double update(double raw) noexcept;
  /// Feeds one raw score and returns its surprise without adding the short-term mean to the
  /// long-run distribution; learn() adds it (a caller that does not call it before the next
  /// observe() leaves that mean out: a sustained anomaly kept out of what is normal).
  double observe(double raw) noexcept;
  /// Adds the short-term mean of the last observe() to the long-run mean and variance.
  void learn() noexcept;
  double short_mean() const noexcept { return sum_ / static_cast<double>(filled_ ? filled_ : 1); }

 private:
  Config c_;
  std::array<float, 32> ring_{};
  int pos_ = 0, filled_ = 0;
  double sum_ = 0, mean_ = 0, var_ = 0;
  std::uint64_t n_ = 0;
  bool pending_ = false;  ///< observe() has a mean that learn() has not added
};

/// Empirical tail calibration of a non-negative statistic (|z|, a CUSUM sum, ...): keeps
/// exponentially weighted exceedance rates p_k = P(stat > L_k) on a fixed geometric
/// ladder L_k = base * 2^(k/2), k = 0..11, and returns the surprise of a value x as
/// -ln max(prior(x), p_k * prior(x) / prior(L_k)) for the highest L_k <= x, where prior is
/// the caller's model tail (given in nats). So a statistic is never judged more surprising
/// than its model says, and is judged less surprising when this series has shown heavier
/// tails than the model (heavy-tailed or autocorrelated residuals), while a value beyond
/// anything recent still counts as rare.
class TailCalibrator {
 public:
  struct Config {
    double base = 2.0;      ///< lowest ladder level (> 0)
    double history = 2000;  ///< time constant of the rates, in observations (>= 1)
  };
  TailCalibrator() : TailCalibrator(Config{}) {}
  explicit TailCalibrator(const Config& config);
  /// Surprise (nats) of x given prior_nats(x) = -ln prior(x), without learning x.
  /// prior_at_level(k) must give -ln prior(L_k); it is called at most once.
  template <class PriorAtLevel>
  double surprise(double x, double prior_nats_x, PriorAtLevel&& prior_at_level) const noexcept {
    int k = level_index(x);
    double nats = prior_nats_x;
    if (k >= 0) {
      const double emp = -std::log(std::max(static_cast<double>(rate_[static_cast<std::size_t>(k)]), 1e-300)) +
                         (prior_nats_x - prior_at_level(k));
      nats = std::min(nats, emp);
    }
    return nats < 0 ? 0 : nats;
  }
  /// surprise(), then learn(x).
  template <class PriorAtLevel>
  double update(double x, double prior_nats_x, PriorAtLevel&& prior_at_level) noexcept {
    const double nats = surprise(x, prior_nats_x, prior_at_level);
    learn(x);
    return nats;
  }
  /// Counts x in the exceedance rates.
  void learn(double x) noexcept;
  double level(int k) const noexcept;

 private:
  int level_index(double x) const noexcept;
  Config c_;
  std::array<float, 12> rate_{};
  std::uint64_t n_ = 0;
};

/// Context novelty, in the manner of CAD OSE (Smirnov's Contextual Anomaly Detector, NAB's
/// contextOSE): each value is discretised into one of `levels` bins of the range seen so
/// far; a context is the bins of the last j values (j = 1..orders) followed by the current
/// bin; the novelty of an observation is the share of its `orders` contexts never seen
/// before. Contexts are kept as 16-bit fingerprints in a fixed table (`buckets` x 4 slots,
/// the oldest slot of a bucket replaced), so memory is bounded whatever the series: the
/// table is part of the object (1,152 bytes: up to 512 contexts), no heap.
class ContextNovelty {
 public:
  static constexpr int kMaxBuckets = 128;
  struct Config {
    int levels = 8;     ///< bins of the value's range, 2..64
    int orders = 4;     ///< longest context (values before the current one), 1..8
    int buckets = 128;  ///< table buckets of 4 fingerprints, a power of two 16..kMaxBuckets
  };
  /// Disabled: update() returns 0.
  ContextNovelty() = default;
  /// Enabled. Throws diaspora::Error if a field is out of range.
  explicit ContextNovelty(const Config& config);

  /// Feeds one value (finite); returns its novelty in [0, 1] (0 while disabled and for the
  /// first value). O(orders), no allocation.
  double update(double x) noexcept;
  bool enabled() const noexcept { return enabled_; }

 private:
  Config c_;
  bool enabled_ = false;
  std::array<std::uint16_t, 4 * kMaxBuckets> table_{};  ///< buckets x 4 fingerprints, 0 = empty
  std::array<std::uint8_t, kMaxBuckets / 4> next_{};    ///< per bucket, 2 bits: the slot replaced next
  std::array<std::uint8_t, 8> history_{};               ///< the last bins, newest first
  int seen_ = 0;                                        ///< bins in history_ (up to 8)
  double min_ = 0, max_ = 0;
  std::uint64_t n_ = 0;
};

/// Adaptive resonance, in the manner of ARTime (Hampton's NAB detector, built on dual-vigilance
/// fuzzy ART): the series is downsampled (`step` observations make one point: their mean,
/// or the extreme farthest from the recent level when it is 10 % off the mean), normalised
/// by the range seen so far, discretised into 80 levels and snapped to a running median when
/// within 0.075 of it. Each point's features are its window of the last kWindow points and a
/// Haar transform of that window (16 values in [0, 1], complement-coded, kept as bytes). A
/// category is a hyperbox of such windows; a window resonates with a category when their
/// match (fuzzy-ART overlap cubed, times the overlap of the current level squared) reaches the
/// upper vigilance, and then teaches it (fast learning); a match between the lower and the
/// upper vigilance opens a category of the same cluster; a match below the lower vigilance
/// for every category opens a new cluster: an anomaly, unless the detector is masking (1.5
/// windows after an anomaly or a new cluster, and after each vigilance change, until
/// that many points pass without a new cluster; a far worse match still counts).
///
/// The vigilances adapt to the series: the first `probation` points learn at
/// `initial_vigilance`, then both are set to the mean match of the second half of the
/// probation; every probation/2 points (and 1.5 windows after an anomaly) the upper follows
/// the mean match (at most 0.97), the lower rises towards the lowest recent match or falls by
/// half the recent mean shortfall, never below the mean match of past anomalies.
///
/// Memory is bounded: at most `categories` (<= kMaxCategories) hyperboxes of 32 bytes, the
/// least recently resonating replaced when a new one is needed; the whole object has a fixed
/// size (about 1.3 KiB), no heap. update() is O(1): every `step`-th call matches the window
/// against the categories (at most kMaxCategories x 32 byte operations).
class Resonance {
 public:
  static constexpr int kWindow = 8;                ///< points per feature window
  static constexpr int kFeatures = 2 * kWindow;    ///< Haar coefficients, then the window
  static constexpr int kMaxCategories = 32;
  struct Config {
    int step = 6;                    ///< observations per downsampled point, 1..1024
    int probation = 104;             ///< points learned before anomalies count, 2*kWindow..65536
    int categories = kMaxCategories; ///< category cap, 4..kMaxCategories
    double initial_vigilance = 0.8;  ///< vigilance during the probation, (0, 1)
    /// The series' range when it is known beforehand (NAB hands every detector the min and
    /// max of its series; a metric may have natural bounds): values are normalised by it,
    /// widened by any value beyond it. NaN (the default): the range seen so far.
    double lower = std::numeric_limits<double>::quiet_NaN();
    double upper = std::numeric_limits<double>::quiet_NaN();
  };
  /// `base` with a probation that covers `observations` (about 13 windows of points: the
  /// step is observations / 104 rounded down, at least 1). NAB's probationary period is 15 %
  /// of a series, at most 750 observations.
  static Config for_probation(std::uint64_t observations, Config base);
  /// Disabled: update() returns 0.
  Resonance() = default;
  /// Enabled. Throws diaspora::Error if a field is out of range.
  explicit Resonance(const Config& config);

  /// Feeds one value (finite). Returns the confidence in (0, 1] of an anomaly completed by
  /// this observation (a point whose window resonates with no category), else 0 (always 0
  /// while disabled, during the probation and between points). O(1), no allocation.
  double update(double x) noexcept;
  bool enabled() const noexcept { return enabled_; }
  int categories() const noexcept { return used_; }
  double vigilance_low() const noexcept { return rho_lb_; }
  double vigilance_high() const noexcept { return rho_ub_; }
  /// The best match of the last point's window (0 before the first window).
  double last_match() const noexcept { return last_match_; }
  /// Whether the probation is over (anomalies are reported).
  bool learned() const noexcept { return points_ >= static_cast<std::uint32_t>(c_.probation + kWindow - 1); }
  const Config& config() const noexcept { return c_; }

 private:
  using Box = std::array<std::uint8_t, 2 * kFeatures>;  ///< [lower corner; 255 - upper corner]
  int point() noexcept;                                ///< the downsampled point's level, 0..80
  double learn(const Box& input) noexcept;             ///< returns the anomaly confidence
  void adapt_vigilance() noexcept;
  void touch(int k) noexcept;                          ///< k (listed) becomes the most recently used
  Config c_;
  std::array<Box, kMaxCategories> box_{};
  std::array<std::uint8_t, kMaxCategories> recent_{};  ///< categories, most recently resonating first
  std::array<std::uint8_t, kWindow> window_{};         ///< the last points' levels, oldest first
  std::array<std::uint8_t, 81> levels_{};              ///< histogram of the levels (halved when full)
  bool enabled_ = false, seen_ = false, mask_new_ = false;
  std::uint8_t used_ = 0, block_pos_ = 0;
  // Downsampling and normalisation (the step's sum and extremes, the recent level, the range).
  double sum_ = 0, lo_ = 0, hi_ = 0, level_ = 0, min_ = 0, max_ = 0;
  std::int32_t in_step_ = 0;
  std::uint32_t points_ = 0;
  // Vigilance and masking.
  double match_sum_ = 0;                        ///< every match (their mean sets rho_ub)
  float rho_lb_ = 0, rho_ub_ = 0, probation_sum_ = 0, last_match_ = 0;
  float short_num_ = 0, short_den_ = 0;         ///< recent shortfall below rho_ub (smoothed)
  float anomaly_sum_ = 0, anomaly_last_ = 0;    ///< matches of past anomalies (the last apart)
  std::uint32_t anomalies_ = 0, last_anomaly_ = 0, last_adapt_ = 0, quiet_ = 0, in_block_ = 0;
  std::array<float, 4> block_min_{};            ///< minima of the last blocks of matches
  float cur_min_ = 1;
};

// =========================================================================================
// The ensemble: one anomaly score per series
// =========================================================================================

/// Which detectors fired on an observation (bit set in Score::fired).
enum Detector : std::uint32_t {
  kSpike = 1u << 0,       ///< a single residual far outside the prediction interval
  kLikelihood = 1u << 1,  ///< the recent residuals are unusually large (anomaly likelihood)
  kChangeUp = 1u << 2,    ///< CUSUM: the level moved up
  kChangeDown = 1u << 3,  ///< CUSUM: the level moved down
  kRange = 1u << 4,       ///< the value left the range seen so far by a margin
  kSuppressed = 1u << 5,  ///< a detection is being held back (re-alert suppression)
  kContext = 1u << 6,     ///< the recent values formed contexts never seen before (ContextNovelty)
  kResonance = 1u << 7,   ///< the recent window resonated with no learned category (Resonance)
};

/// One observation's result. Trivially copyable; explain() formats it.
struct Score {
  double score = 0;     ///< anomaly score in [0, 1]; 0 during warm-up
  std::uint32_t fired = 0;  ///< bitwise OR of Detector
  double value = 0;     ///< the observation
  Forecast expected;    ///< seasonal forecast made before seeing it
  double z = 0;         ///< standardized residual against `expected`
  double likelihood_nats = 0;  ///< anomaly-likelihood surprise
  double cusum_nats = 0;       ///< change-point surprise (before any reset)
  double context_nats = 0;     ///< context-novelty surprise (0 while context_weight is 0)
  double resonance = 0;        ///< adaptive-resonance anomaly confidence in [0, 1] (0: none)
  std::uint64_t index = 0;     ///< 0-based observation number in the series
};

/// The score counted on the side a signal goes bad, as the policy engine's `ensemble`
/// detector counts it: `s.score` when the residual is on that side (`bad_dir` > 0: above
/// its forecast, z > 0; < 0: below, z < 0), else 0; `bad_dir` == 0 counts both sides.
/// Pure; any thread; no errors.
inline double bad_side_score(const Score& s, int bad_dir) {
  return bad_dir == 0 || bad_dir * s.z > 0 ? s.score : 0.0;
}

/// Formats a Score as one line, e.g.
/// `score 0.91 [spike,change-up] value 92 expected 61.2 [55.0, 67.4] z +5.2; likelihood 14.1 nats; cusum 12.3 nats`.
/// Allocates; not meant for the per-observation path.
std::string explain(const Score& s);

/// The default ensemble for one series. Per observation (t, x):
///  1. the SeasonalForecaster gives a forecast and a standardized residual z;
///  2. detectors turn it into surprises in nats (-ln p, p the chance of seeing it under
///     normal behaviour):
///     - likelihood: the AnomalyLikelihood of min(|z| / z_cap, 1) (a burst of large
///       residuals, judged against this series' own history of residuals);
///     - change: a two-sided CUSUM of z, tail-calibrated (TailCalibrator) on this series;
///     - spike: the single-point two-sided Gaussian tail of |z|, tail-calibrated
///       (off by default: spike_weight = 0; the likelihood already reacts to a spike and
///       the single-point test fired on too many ordinary outliers on NAB);
///     - out-of-range: a value beyond the range seen so far by `range_margin` of that range
///       that is also >= range_min_z sigmas off its forecast scores `range_nats`;
///     - context: the ContextNovelty of the value (the share of its contexts of recent
///       binned values never seen before) judged by an AnomalyLikelihood of its own, times
///       context_weight;
///     - resonance: a Resonance anomaly of confidence c scores resonance_weight * c *
///       max_nats (off by default: the tuning protocol does not choose it);
///  3. the score is the largest surprise mapped to [0, 1] by nats / max_nats (clamped;
///     0.5 ~ p = 1e-5);
///  4. re-alert suppression: after an observation scores >= alert_level, the next
///     `suppress` observations are multiplied by suppress_factor (0), so one event gives
///     one alert at its onset rather than a run of them; the alert itself scores
///     alert_score (1: an alert is the detector's decision, not a level to tune).
/// The first `warmup` observations score 0 (the models learn). Defaults are the settings
/// measured on NAB in docs/anomaly.md. sizeof(Ensemble) is about 4 KiB (the context
/// table 1.1 KiB and the resonance detector 1.3 KiB of it, the latter even while off), no heap.
class Ensemble {
 public:
  struct Config {
    SeasonalForecaster::Config forecaster{};
    AnomalyLikelihood::Config likelihood{};
    Cusum::Config cusum{};
    double z_cap = 8.0;          ///< raw score for the likelihood = min(|z| / z_cap, 1)
    double max_nats = 23.0;      ///< surprise mapped to score 1 (23 nats ~ p = 1e-10)
    double spike_weight = 0.0;   ///< multiplier on the spike surprise (0, the default, disables)
    double cusum_weight = 1.0;   ///< multiplier on the CUSUM surprise (0 disables)
    double range_margin = 0.02;  ///< fraction of the seen range; < 0 disables
    double range_nats = 23.0;    ///< surprise of a range excursion
    double range_min_z = 3.0;    ///< ... that is also at least this many sigmas off forecast
    int range_warmup = 150;      ///< observations before range excursions count
    int warmup = 150;            ///< observations scored 0
    double alert_level = 0.5;    ///< score that starts a suppression period
    int suppress = 50;           ///< suppression length, in observations (0: none)
    double suppress_factor = 0.0;///< scores inside the period are multiplied by this
    double alert_score = 1.0;    ///< an alert (the observation that starts a suppression
                                 ///< period) scores at least this; 0: its own score
                                 ///< (chosen by bench/nab/loco.py: docs/anomaly.md)
    TailCalibrator::Config calibration{};  ///< for the spike and CUSUM surprises
    /// Multiplier on the context surprise (0 disables): the novelty of each observation's
    /// contexts (ContextNovelty) judged by its own AnomalyLikelihood (the `likelihood`
    /// settings), as Numenta judges HTM's raw anomaly score. 1 with 8 bins and contexts of
    /// up to 4 values: chosen by bench/nab/loco.py (docs/anomaly.md, "Context novelty").
    double context_weight = 1.0;
    ContextNovelty::Config context{.levels = 8, .orders = 4, .buckets = 128};
    /// Multiplier on the adaptive-resonance anomaly (0 disables): an anomaly of confidence c
    /// (Resonance) is a surprise of resonance_weight * c * max_nats.
    double resonance_weight = 0.0;
    Resonance::Config resonance{};
    /// Tail-calibrate the likelihood surprise as the spike and CUSUM surprises are (a
    /// TailCalibrator on its nats, `calibration` settings): a burst this series shows now
    /// and then (late heartbeats) stops alerting, one beyond anything recent still alerts.
    /// Off for NAB (the tuning protocol measured it lower there), on for the policy engine
    /// (docs/anomaly.md, "Workflow traces").
    bool calibrate_likelihood = false;
    /// An anomaly must be sustained: the score is the lowest of the observations of the last
    /// `sustain_s` seconds (the present one among them, at most the last kSustain), so a blip
    /// that one observation of a fast signal shows (a heartbeat late by a few seconds on a
    /// 1 Hz gap) does not alert, while a slower signal (one value a minute) is judged on each
    /// value as before. Score::fired still names what fired on this value. 0 (the default):
    /// each observation on its own.
    double sustain_s = 0.0;
    /// false: an observation whose score (after sustain_s) reaches alert_level is kept out
    /// of what the likelihood and the likelihood's and CUSUM's tail calibrations learn as
    /// normal, so a fault that lasts (a heartbeat stalled for minutes) does not teach them
    /// that such surprises are common and hide the next one; blips that do not last are
    /// still learned, and the forecaster learns every value (a new level becomes normal).
    /// true (the default): every observation is learned.
    bool learn_sustained = true;
  };
  static constexpr int kSustain = 4;  ///< observations sustain_s may span
  Ensemble() : Ensemble(Config{}) {}
  /// Throws diaspora::Error if a field is out of range.
  explicit Ensemble(const Config& config);

  /// Feeds one observation (t in seconds, non-decreasing; x the value); returns its
  /// score. O(1), no allocation, never throws. A non-finite x returns a zero Score and
  /// leaves the state unchanged.
  Score update(double t, double x) noexcept;
  std::uint64_t count() const noexcept { return n_; }

 private:
  /// What update() reads of the Config (the detectors keep their own settings): a series
  /// costs these bytes, not a whole Config.
  struct Settings {
    double z_cap, max_nats, spike_weight, cusum_weight, cusum_k, range_margin, range_nats, range_min_z;
    double alert_level, suppress_factor, alert_score, context_weight, resonance_weight, sustain_s;
    int range_warmup, warmup, suppress;
    bool calibrate_likelihood, learn_sustained;
  };
  Settings c_;
  SeasonalForecaster fc_;
  AnomalyLikelihood lh_;
  Cusum cusum_;
  TailCalibrator spike_tail_, cusum_tail_, likelihood_tail_;
  ContextNovelty ctx_;  ///< enabled only when context_weight > 0
  AnomalyLikelihood ctx_lh_;
  Resonance art_;  ///< enabled only when resonance_weight > 0
  double min_ = 0, max_ = 0;
  std::uint64_t n_ = 0;
  std::int64_t suppress_left_ = 0;
  std::array<double, kSustain> recent_t_{};  ///< the last scores and their times (sustain_s)
  std::array<float, kSustain> recent_score_{};
  std::uint64_t s_index_ = 0;  ///< scores kept in recent_*
  double sustained(double t, double score) noexcept;
  void learn(double likelihood_nats, double cusum_stat) noexcept;
};

/// Sets one Ensemble::Config field by its dotted name (as in `diaspora-nab --config`):
/// `z_cap`, `suppress`, `forecaster.alpha`, `likelihood.window`, `cusum.h`, ... Returns
/// false if the name is unknown. Does not validate the value (the Ensemble constructor
/// does).
bool set_config_field(Ensemble::Config& config, std::string_view name, double value);

// =========================================================================================
// Failure detection
// =========================================================================================

/// Phi-accrual failure detector (Hayashibara et al., 2004): instead of a fixed timeout,
/// suspicion phi = -log10 P(the next heartbeat is later than now), with inter-arrival
/// times modelled as Gaussian (exponentially weighted mean and variance of the gaps).
/// phi 1 ~ 10 % chance of a false suspicion, phi 8 ~ 1e-8. It rises continuously while
/// heartbeats are missing and drops to ~0 at the next one.
class PhiAccrual {
 public:
  struct Config {
    double alpha = 0.1;            ///< smoothing of the gap mean/variance
    double min_std_fraction = 0.1; ///< std floor as a fraction of the mean gap
    double acceptable_pause = 0;   ///< seconds added to the expected gap (GC pauses ...)
    double first_gap = 1.0;        ///< assumed gap (s) after the first heartbeat, > 0
  };
  PhiAccrual() : PhiAccrual(Config{}) {}
  explicit PhiAccrual(const Config& config);
  /// Records a heartbeat that arrived at time t (seconds). Earlier-than-last times are
  /// ignored.
  void heartbeat(double t) noexcept;
  /// Suspicion at time `now` (>= 0; 0 before the first heartbeat; capped at 300).
  double phi(double now) const noexcept;
  double mean_gap() const noexcept { return mean_; }
  std::uint64_t count() const noexcept { return n_; }

 private:
  Config c_;
  double last_ = 0, mean_ = 0, var_ = 0;
  std::uint64_t n_ = 0;
};

// =========================================================================================
// Forecasts
// =========================================================================================

/// Holt's linear trend (level + slope per second) on an irregularly sampled series, with
/// an exponentially weighted residual sigma. The base of the two forecasts below.
class TrendModel {
 public:
  struct Config {
    double alpha = 0.3;        ///< level smoothing
    double beta = 0.1;         ///< slope smoothing
    double scale_alpha = 0.1;  ///< residual sigma smoothing
  };
  TrendModel() : TrendModel(Config{}) {}
  explicit TrendModel(const Config& config);
  /// Feeds (t, x); t must not go backwards (an earlier or equal t only updates the level).
  void update(double t, double x) noexcept;
  double level() const noexcept { return level_; }
  /// Slope in units per second (0 until two distinct times were seen).
  double slope() const noexcept { return slope_; }
  double sigma() const noexcept { return sigma_; }
  /// Spread of the per-step slope around slope() (units per second).
  double slope_sigma() const noexcept { return slope_sigma_; }
  double last_time() const noexcept { return t_; }
  std::uint64_t count() const noexcept { return n_; }
  /// Level extrapolated to time t.
  double at(double t) const noexcept { return level_ + slope_ * (t - t_); }

 private:
  Config c_;
  double level_ = 0, slope_ = 0, sigma_ = 0, slope_sigma_ = 0, t_ = 0;
  std::uint64_t n_ = 0;
};

/// A forecast time with an interval (seconds, same epoch as the inputs).
struct TimeForecast {
  double at = 0;
  double earliest = 0;
  double latest = 0;  ///< +inf when the slow end of the interval never gets there
};

/// Expected completion time of a task from its progress series (fraction done in
/// [0, 1], or any counter with a known total). Uses TrendModel: ETA = t + (total -
/// level) / slope; the interval uses slope -/+ 2 slope_sigma().
class CompletionForecaster {
 public:
  /// total: progress value meaning "done" (> 0). Throws diaspora::Error otherwise.
  explicit CompletionForecaster(double total = 1.0, TrendModel::Config config = {});
  void update(double t, double progress) noexcept { model_.update(t, progress); }
  /// nullopt until two distinct times were seen or while progress is not increasing.
  /// Once done: {last_time, last_time, last_time}.
  std::optional<TimeForecast> expected_completion() const noexcept;
  const TrendModel& model() const noexcept { return model_; }

 private:
  double total_;
  TrendModel model_;
};

/// Time until a metric crosses a threshold (memory towards an OOM limit: rising;
/// throughput towards a QoS floor: falling), extrapolating TrendModel's level and slope.
class ThresholdForecaster {
 public:
  enum class Direction { kRising, kFalling };
  /// Throws diaspora::Error if threshold is not finite.
  ThresholdForecaster(double threshold, Direction direction, TrendModel::Config config = {});
  void update(double t, double x) noexcept { model_.update(t, x); }
  /// Time of crossing; {last_time, ...} if already crossed; nullopt while the trend does
  /// not head towards the threshold or fewer than two distinct times were seen.
  std::optional<TimeForecast> time_to_cross() const noexcept;
  const TrendModel& model() const noexcept { return model_; }

 private:
  double threshold_;
  Direction dir_;
  TrendModel model_;
};

}  // namespace diaspora::resilience
