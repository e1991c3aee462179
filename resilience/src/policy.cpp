// Policies: the spec's `policies` compiled into rules over the detectors (hysteresis,
// cooldowns, attempt budgets, target choice by site health). docs/anomaly.md, "Policies".
#include "diaspora/policy.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <deque>
#include <limits>
#include <variant>

#include <boost/json.hpp>

#include "diaspora/error.hpp"
#include "diaspora/files.hpp"
#include "diaspora/site_health.hpp"
#include "math.hpp"

namespace diaspora::resilience {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kMinNormal = 3;          // values before a site's normal is used
constexpr double kNormalMemory = 50;      // values a normal averages over, at most
constexpr double kNoiseSigmas = 2.5;      // a noisy normal allows this many log-space deviations
constexpr std::size_t kMaxFamilies = 10000;
constexpr std::size_t kMaxFamilySites = 64;
constexpr double kSeedWeight = 10;         // a seeded normal counts as this many values at most
constexpr double kSuspect = 0.75;         // a restart leaves a site below 0.75 x the best candidate's health
constexpr double kReallyBad = 0.25;       // ... even for a candidate with no free worker

enum class Scope { task, site, resource };
enum class Det { ensemble, ewma, holt_winters, cusum, phi, forecast, threshold, relative };

struct SignalInfo {
  std::string_view name;
  Scope scope;
  int dir;  // +1: higher is worse; -1: lower is worse
  const char* unit;
};
// Order matches the schema's enum (schemas/workflow.schema.json, $defs.policy.signal).
constexpr SignalInfo kSignals[] = {
    {"task.step_time", Scope::task, +1, " s"},     {"task.runtime", Scope::task, +1, " s"},
    {"task.queue_wait", Scope::task, +1, " s"},    {"task.heartbeat_gap", Scope::task, +1, " s"},
    {"task.progress_rate", Scope::task, -1, "/s"}, {"task.deadline_slack", Scope::task, -1, " s"},
    {"task.failures", Scope::task, +1, ""},        {"site.throughput", Scope::site, -1, ""},
    {"site.queue_length", Scope::site, +1, ""},    {"site.failure_rate", Scope::site, +1, ""},
    {"site.heartbeat_gap", Scope::site, +1, " s"}, {"resource.cpu", Scope::resource, +1, ""},
    {"resource.memory", Scope::resource, +1, ""},  {"resource.gpu", Scope::resource, +1, ""},
    {"task.link_wait", Scope::task, +1, " s"},
};
constexpr int kNumSignals = static_cast<int>(sizeof(kSignals) / sizeof(kSignals[0]));
enum : int { kStepTime = 0, kRuntime = 1, kTaskHeartbeat = 3, kProgressRate = 4, kDeadlineSlack = 5, kFailures = 6, kQueueLength = 8,
             kFailureRate = 9, kSiteHeartbeat = 10 };

int signal_index(std::string_view s) noexcept {
  for (int i = 0; i < kNumSignals; ++i)
    if (kSignals[i].name == s) return i;
  return -1;
}

struct DetectorInfo {
  std::string_view name;
  Det det;
};
constexpr DetectorInfo kDetectors[] = {
    {"ensemble", Det::ensemble}, {"ewma", Det::ewma},       {"holt-winters", Det::holt_winters},
    {"cusum", Det::cusum},       {"phi-accrual", Det::phi}, {"forecast", Det::forecast},
    {"threshold", Det::threshold}, {"relative", Det::relative},
};

/// The task signals that have a per-task normal (learned across instances and attempts):
/// their index among the relative series, or -1.
constexpr int kRelSeries = 3;
int rel_series(int signal) noexcept { return signal >= 0 && signal <= 2 ? signal : -1; }

bool task_action(ActionKind a) noexcept {
  return a == ActionKind::restart || a == ActionKind::migrate || a == ActionKind::speculate ||
         a == ActionKind::checkpoint;
}

/// A task id names a spec task (or rehearsal job) when it equals it or extends it after a
/// separator ("simulate-17", "simulate.3", "simulate[2]", ...).
bool name_matches(std::string_view name, std::string_view id) noexcept {
  if (id == name) return true;
  if (id.size() <= name.size() || !id.starts_with(name)) return false;
  const char c = id[name.size()];
  return c == '-' || c == '_' || c == '.' || c == ':' || c == '/' || c == '#' || c == '[' || c == '@';
}

std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  int n = std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return std::string(buf, n < 0 ? 0 : std::min<std::size_t>(static_cast<std::size_t>(n), sizeof buf - 1));
}

struct Policy {
  const PolicySpec* spec = nullptr;
  int signal = 0;
  Scope scope = Scope::task;
  int dir = 1;
  Det det = Det::ensemble;
  double threshold = 0;
  std::int64_t for_count = 1;
  double cooldown = 60;
  int max_attempts = 3;
  bool all_targets = true;
  std::vector<std::string> task_targets;  // task or rehearsal-job names
  std::vector<int> site_targets;          // site indices
  std::vector<int> to_sites;              // empty: every other site
  int task_slot = -1, site_slot = -1;
  bool quiet = false;                     // ensemble with no threshold written: the quiet-series rule
  bool builtin = false;                   // one of the default set (defaults: on / observe)
  std::vector<std::string> exclude_tasks; // builtin: targets a spec policy on its signal took over
  std::vector<int> exclude_sites;
};

/// The level an attempt is at, against its task's normal (`relative`, and the ensemble
/// before it has warmed up).
struct RelEval {
  bool ready = false;
  double ratio = 1;   // how many times worse than normal (>= 1 is worse)
  double level = 0;   // the attempt's smoothed value
  double normal = 0;  // the task's normal it is compared with
  double normal_n = 0;
  double allowance = 1;  // > 1: the normal's own spread widened "worse than normal" this much
  std::string normal_site;  // where that normal was learned
};

struct CusumState {
  RobustLevel level;
  Cusum cusum;
};

/// An ensemble series' history at the quiet threshold (PolicyOptions::quiet_threshold).
struct QuietGate {
  double first_t = std::numeric_limits<double>::quiet_NaN();  // its first value
  std::uint32_t runs = 0;  // runs of scores at or over the quiet threshold
  bool over = false;       // the last score was at or over it
};

struct DetState {
  std::variant<std::monostate, Ensemble, RobustLevel, SeasonalForecaster, CusumState, ThresholdForecaster> v;
  QuietGate quiet;  // ensemble policies with no threshold written
};

/// Per (policy, task) or (policy, site): hysteresis, cooldown, budget and the detector.
struct Slot {
  std::unique_ptr<DetState> det;
  std::int64_t run = 0;  // consecutive observations over the threshold
  double last_fire = -kInf;
  int attempts = 0;
  bool exhausted = false;  // the "budget spent" alert was given
  void reset_series() {
    det.reset();
    run = 0;
  }
};

/// One evaluation of a policy on one observation.
struct Eval {
  bool ready = false;  // past warm-up
  bool over = false;
  double value = 0;      // shown and compared (oriented where the detector is one-sided)
  double shown_threshold = 0;
  double score = 0;      // [0, 1] for Decision::score
  double score_threshold = std::numeric_limits<double>::quiet_NaN();  // the threshold on the score's scale
  double badness = 0;    // [0, 1] for the site's anomaly level
  double x = 0;          // the observation
  std::optional<double> eta;
  Score ens{};
  double a = 0, b = 0, c = 0;  // detector-specific detail for the explanation
  Forecast fc{};
  bool stalled = false;
  bool relative = false;  // judged against the task's normal (RelEval below)
  RelEval rel{};
  bool borrowed = false;  // phi: no heartbeat since it started; judged by its family's time to a first one
};

}  // namespace

struct PolicyEngine::Impl {
  struct SiteState {
    const SiteSpec* spec = nullptr;
    PhiAccrual hb;
    std::optional<double> last_hb;
    double anomaly = 0;
    double failures = 0, failures_t = 0;
    double failure_rate = 0;
    std::optional<double> queue;
    std::int64_t running = 0;
    std::vector<Slot> slots;
  };
  struct TaskState {
    int site = -1;              // index into sites_, -1 when not a spec site
    std::string site_name;
    const TaskSpec* spec = nullptr;
    PhiAccrual hb;
    std::optional<double> last_hb;
    CompletionForecaster progress{1.0};
    std::optional<double> deadline;  // absolute
    double last_activity = 0;
    double last_fraction = 0;
    bool observed_slack = false, observed_rate = false;
    bool running = false;  // an attempt runs (started or beating, not failed or acted on)
    bool acted = false;    // a restart/migrate was decided: its stopped attempt is no evidence
    std::string family;    // what its normal is learned across (family_of, or its spec task)
    std::array<double, kRelSeries> att_level{};  // this attempt's smoothed value per series
    std::array<int, kRelSeries> att_n{};
    double max_gap = 0;    // the longest recent heartbeat gap (decays 10 % a heartbeat)
    double started_at = -1;  // when its attempt started (-1: not reported)
    double last_ratio = 0;  // its latest step-time level against its task's normal
    double ratio_t = -1;    // when that was judged (-1: never)
    std::vector<Slot> slots;
  };
  /// A task family's normal for one series on one site: the geometric mean of the values
  /// its attempts reported there that were not themselves "worse than normal".
  struct Normal {
    std::string site;
    double speed = 1;  // the site's declared speed (1 for a site the spec does not name)
    double log_mean = 0;
    double log_var = 0;  // the values' spread (log space): a noisy task allows more
    double n = 0;
  };
  struct Family {
    std::array<std::vector<Normal>, kRelSeries> normals;
  };

  WorkflowSpec spec_;
  PolicyOptions opt_;
  std::vector<Policy> policies_;
  std::vector<std::vector<int>> by_signal_ = std::vector<std::vector<int>>(kNumSignals);
  std::vector<SiteState> sites_;
  std::map<std::string, int, std::less<>> site_index_;
  std::map<std::string, TaskState, std::less<>> tasks_;
  std::map<std::string, double, std::less<>> first_beat_;  // family -> time from start to first heartbeat
  std::map<std::string, Family, std::less<>> families_;
  std::deque<PolicySpec> builtin_specs_;  // the default set's policies (stable addresses)
  double rel_ratio_ = 2;                  // "worse than normal": 1 + 1/sensitivity
  int task_slots_ = 0, site_slots_ = 0;
  double max_speed_ = 1;
  double now_ = -kInf;
  double last_prune_ = -kInf;

  // ---- compilation ---------------------------------------------------------------------

  Impl(const WorkflowSpec& spec, PolicyOptions opt) : spec_(spec), opt_(std::move(opt)) {
    // Validates the options the way the detectors do (throws diaspora::Error).
    (void)Ensemble(opt_.ensemble);
    (void)PhiAccrual(opt_.phi);
    detail::require(opt_.min_heartbeats >= 1, "PolicyOptions", "min_heartbeats");
    detail::require(opt_.min_observations >= 1, "PolicyOptions", "min_observations");
    detail::require(opt_.forecast_horizon_s >= 0, "PolicyOptions", "forecast_horizon_s");
    detail::require(opt_.health_alpha > 0 && opt_.health_alpha <= 1, "PolicyOptions", "health_alpha");
    detail::require(opt_.failure_half_life_s > 0, "PolicyOptions", "failure_half_life_s");
    detail::require(opt_.min_target_health >= 0 && opt_.min_target_health <= 1, "PolicyOptions", "min_target_health");
    detail::require(opt_.task_ttl_s > 0, "PolicyOptions", "task_ttl_s");
    detail::require(opt_.quiet_threshold >= 0 && opt_.quiet_threshold <= 1, "PolicyOptions", "quiet_threshold");
    detail::require(opt_.quiet_rate_per_hour >= 0 && std::isfinite(opt_.quiet_rate_per_hour), "PolicyOptions",
                    "quiet_rate_per_hour");
    detail::require(opt_.quiet_min_hours >= 0 && std::isfinite(opt_.quiet_min_hours), "PolicyOptions", "quiet_min_hours");

    for (std::size_t i = 0; i < spec_.sites.size(); ++i) {
      site_index_.emplace(spec_.sites[i].name, static_cast<int>(i));
      max_speed_ = i == 0 ? spec_.sites[i].speed : std::max(max_speed_, spec_.sites[i].speed);
    }
    if (!(max_speed_ > 0)) max_speed_ = 1;

    std::vector<Diagnostic> diags;
    if (!(std::isfinite(spec_.sensitivity) && spec_.sensitivity > 0)) {
      Diagnostic d;
      d.file = spec_.file.empty() ? "<spec>" : spec_.file;
      d.path = "sensitivity";
      d.message = "sensitivity must be a number > 0 (1: worse than normal means 2x the task's normal)";
      diags.push_back(std::move(d));
    } else {
      rel_ratio_ = 1 + 1 / spec_.sensitivity;
    }
    for (std::size_t i = 0; i < spec_.policies.size(); ++i) compile(spec_.policies[i], i, diags);
    if (!diags.empty()) throw SpecError(std::move(diags));
    add_defaults();

    sites_.resize(spec_.sites.size());
    for (std::size_t i = 0; i < sites_.size(); ++i) {
      sites_[i].spec = &spec_.sites[i];
      sites_[i].hb = PhiAccrual(opt_.phi);
      sites_[i].slots.resize(static_cast<std::size_t>(site_slots_));
    }
  }

  /// The default protection set (docs/anomaly.md, "Default protection"). A spec policy on
  /// the same signal takes a default's place for the targets it names (all of them when it
  /// names none).
  void add_defaults() {
    if (spec_.defaults == DefaultsMode::off) return;
    auto add = [&](PolicySpec ps, std::vector<std::string> exclude) {
      const int sig = signal_index(ps.signal);
      std::vector<int> exclude_sites;
      for (const Policy& q : policies_) {
        if (q.builtin || q.signal != sig) continue;
        if (q.all_targets) return;
        exclude.insert(exclude.end(), q.task_targets.begin(), q.task_targets.end());
        exclude_sites.insert(exclude_sites.end(), q.site_targets.begin(), q.site_targets.end());
      }
      builtin_specs_.push_back(std::move(ps));
      std::vector<Diagnostic> diags;
      compile(builtin_specs_.back(), spec_.policies.size() + builtin_specs_.size() - 1, diags);
      if (!diags.empty()) throw SpecError(std::move(diags));  // a bug in this table, not in the spec
      Policy& p = policies_.back();
      p.builtin = true;
      p.exclude_tasks = std::move(exclude);
      p.exclude_sites = std::move(exclude_sites);
    };
    auto make = [](const char* name, const char* signal, const char* detector, double threshold, std::int64_t for_count,
                   double cooldown, ActionKind action, std::int64_t max_attempts) {
      PolicySpec ps;
      ps.name = name;
      ps.signal = signal;
      ps.detector = detector;
      ps.threshold = threshold;
      ps.for_count = for_count;
      ps.cooldown = Duration{cooldown};
      ps.action = action;
      ps.max_attempts = max_attempts;
      return ps;
    };
    // A crashed attempt or a lost worker: retried, 3 times (Ray's default for system
    // failures), off a suspect site (consider()); never an exit a retry cannot fix.
    add(make("default-retry", "task.failures", "threshold", 1, 1, 0, ActionKind::restart, kDefaultRetries), {});
    // A silent attempt: restarted once its heartbeats stop (phi-accrual).
    add(make("default-revive", "task.heartbeat_gap", "phi-accrual", 8, 1, 10, ActionKind::restart, 3), {});
    // A slowed attempt (a slowed site): moved once its step time is worse than its task's
    // normal for 2 steps. Rehearsal jobs are left to the spec's own policies.
    if (spec_.sites.size() >= 2) {
      std::vector<std::string> jobs;
      for (const auto& j : spec_.rehearsal) jobs.push_back(j.name);
      add(make("default-slow", "task.step_time", "relative", rel_ratio_, 2, 30, ActionKind::migrate, 2), jobs);
      // Proactive: a task whose progress forecasts a missed deadline (3 ticks running) gets
      // a copy on the healthiest other site before it misses; the first to finish wins and
      // the original keeps its progress. Once per task; not for rehearsal jobs (not copied).
      add(make("default-deadline", "task.deadline_slack", "forecast", 0, 3, 30, ActionKind::speculate, 1), jobs);
    }
  }

  void compile(const PolicySpec& ps, std::size_t i, std::vector<Diagnostic>& diags) {
    auto bad = [&](std::string_view key, const std::string& msg) {
      Diagnostic d;
      d.file = spec_.file.empty() ? "<spec>" : spec_.file;
      // At the value of the key at fault, like every other spec error; else at the policy.
      const auto at = key.empty() ? ps.field_locations.end() : ps.field_locations.find(std::string(key));
      const Location l = at == ps.field_locations.end() ? ps.location : at->second;
      d.line = l.line;
      d.column = l.column;
      d.path = "policies[" + std::to_string(i) + "]" + (key.empty() ? "" : "." + std::string(key));
      d.message = "policy '" + ps.name + "': " + msg;
      diags.push_back(std::move(d));
    };
    const std::size_t before = diags.size();
    Policy p;
    p.spec = &ps;
    p.signal = signal_index(ps.signal);
    if (p.signal < 0) {
      bad("signal", "unknown signal '" + ps.signal + "'");
      return;
    }
    const SignalInfo& sig = kSignals[p.signal];
    p.scope = sig.scope;
    p.dir = sig.dir;
    bool det_ok = false;
    for (const auto& d : kDetectors)
      if (d.name == ps.detector) p.det = d.det, det_ok = true;
    if (!det_ok) {
      bad("detector", "unknown detector '" + ps.detector + "'");
      return;
    }
    if (p.det == Det::phi && p.signal != kTaskHeartbeat && p.signal != kSiteHeartbeat)
      bad("detector", "phi-accrual watches heartbeats: use it with task.heartbeat_gap or site.heartbeat_gap, not " +
                          ps.signal);
    const bool slack = p.signal == kDeadlineSlack;
    switch (p.det) {
      case Det::ensemble:
        p.threshold = ps.threshold.value_or(0.5);
        p.quiet = !ps.threshold;
        break;
      case Det::ewma:
      case Det::holt_winters: p.threshold = ps.threshold.value_or(4.0); break;
      case Det::cusum: p.threshold = ps.threshold.value_or(12.0); break;
      case Det::phi: p.threshold = ps.threshold.value_or(8.0); break;
      case Det::relative: p.threshold = ps.threshold.value_or(rel_ratio_); break;
      case Det::forecast:
      case Det::threshold:
        if (slack) {
          p.threshold = ps.threshold.value_or(0.0);
        } else if (!ps.threshold) {
          bad("threshold", "detector '" + ps.detector + "' needs a threshold: (the value of " + ps.signal +
                               (p.det == Det::forecast ? " whose crossing is forecast)" : " to compare with)"));
        } else {
          p.threshold = *ps.threshold;
        }
        break;
    }
    if (!std::isfinite(p.threshold)) bad("threshold", "threshold must be a finite number");
    if (p.det == Det::ensemble && !(p.threshold > 0 && p.threshold <= 1))
      bad("threshold", "an ensemble score is in [0, 1]: threshold must be in (0, 1], not " + fmt("%g", p.threshold));
    if (p.det == Det::relative && rel_series(p.signal) < 0)
      bad("detector", "detector 'relative' compares a task with its normal: use it with task.step_time, task.runtime or "
                      "task.queue_wait, not " + ps.signal);
    if (p.det == Det::relative && !(p.threshold > 1))
      bad("threshold", "a relative threshold is how many times worse than the task's normal: it must be > 1 (2: twice "
                       "as slow), not " + fmt("%g", p.threshold));
    if (p.det == Det::phi && !(p.threshold > 0))
      bad("threshold", "a phi threshold must be > 0 (8 ~ a 1e-8 chance of a false suspicion)");
    if (ps.for_count < 1) bad("for", "for: must be >= 1");
    p.for_count = std::max<std::int64_t>(1, ps.for_count);
    p.cooldown = ps.cooldown.count();
    if (!(p.cooldown >= 0)) bad("cooldown", "cooldown must be >= 0");
    if (ps.max_attempts < 1 || ps.max_attempts > 1000000) bad("max_attempts", "max_attempts must be in 1..1000000");
    p.max_attempts = static_cast<int>(std::clamp<std::int64_t>(ps.max_attempts, 1, 1000000));

    if (p.scope == Scope::site && task_action(ps.action))
      bad("action", "action '" + std::string(to_string(ps.action)) + "' acts on a task, but " + ps.signal +
                        " is a per-site signal (use throttle or alert)");
    if ((ps.action == ActionKind::migrate || ps.action == ActionKind::speculate) && spec_.sites.size() < 2)
      bad("action", "action '" + std::string(to_string(ps.action)) + "' needs at least two sites");

    p.all_targets = ps.targets.empty();
    for (std::size_t j = 0; j < ps.targets.size(); ++j) {
      const std::string& t = ps.targets[j];
      if (auto it = site_index_.find(t); it != site_index_.end()) {
        p.site_targets.push_back(it->second);
        continue;
      }
      bool known = std::any_of(spec_.tasks.begin(), spec_.tasks.end(), [&](const TaskSpec& ts) { return ts.name == t; }) ||
                   std::any_of(spec_.rehearsal.begin(), spec_.rehearsal.end(),
                               [&](const RehearsalJobSpec& r) { return r.name == t; });
      if (!known) {
        bad("targets[" + std::to_string(j) + "]", "unknown target '" + t + "' (not a site, task or rehearsal job)");
        continue;
      }
      p.task_targets.push_back(t);
    }
    if (p.scope == Scope::site && !p.all_targets && p.site_targets.empty())
      bad("targets", ps.signal + " is a per-site signal but targets name no site: the policy could never fire");
    for (std::size_t j = 0; j < ps.to_sites.size(); ++j) {
      auto it = site_index_.find(ps.to_sites[j]);
      if (it == site_index_.end())
        bad("to_sites[" + std::to_string(j) + "]", "unknown site '" + ps.to_sites[j] + "'");
      else
        p.to_sites.push_back(it->second);
    }
    if (diags.size() != before) return;
    if (p.scope != Scope::site) p.task_slot = task_slots_++;
    if (p.scope != Scope::task) p.site_slot = site_slots_++;
    by_signal_[static_cast<std::size_t>(p.signal)].push_back(static_cast<int>(policies_.size()));
    policies_.push_back(std::move(p));
  }

  // ---- state -------------------------------------------------------------------------------

  void advance(double now) {
    if (std::isfinite(now) && now > now_) now_ = now;
  }
  double clock() const { return std::isfinite(now_) ? now_ : 0.0; }

  int find_site(std::string_view name) const {
    auto it = site_index_.find(name);
    return it == site_index_.end() ? -1 : it->second;
  }

  const TaskSpec* task_spec(std::string_view id) const {
    const TaskSpec* best = nullptr;
    for (const auto& t : spec_.tasks)
      if (name_matches(t.name, id) && (!best || t.name.size() > best->name.size())) best = &t;
    return best;
  }

  void set_site(TaskState& t, std::string_view site) {
    if (site.empty() || site == t.site_name) return;
    if (t.site >= 0) --sites_[static_cast<std::size_t>(t.site)].running;
    t.site_name.assign(site);
    t.site = find_site(site);
    if (t.site >= 0) ++sites_[static_cast<std::size_t>(t.site)].running;
  }

  TaskState& task(std::string_view id, std::string_view site, double now) {
    auto it = tasks_.find(id);
    if (it == tasks_.end()) {
      it = tasks_.emplace(std::string(id), TaskState{}).first;
      TaskState& t = it->second;
      t.spec = task_spec(id);
      // The instances of one spec task (or job) share a normal; an id that matches none is
      // its own family (one function called with other arguments is not comparable).
      t.family = t.spec ? t.spec->name : std::string(id);
      for (const auto& j : spec_.rehearsal)
        if (!t.spec && name_matches(j.name, id)) t.family = j.name;
      t.hb = PhiAccrual(opt_.phi);
      t.slots.resize(static_cast<std::size_t>(task_slots_));
    }
    TaskState& t = it->second;
    set_site(t, site);
    if (std::isfinite(now)) t.last_activity = std::max(t.last_activity, now);
    return t;
  }

  /// A heartbeat of t's attempt arrived at `now`: the first since it started tells its family
  /// how long an attempt takes to send one (the longest lately: it decays 10 % a first beat).
  void first_heard(const TaskState& t, double now) {
    if (t.last_hb || t.started_at < 0 || now < t.started_at || t.family.empty()) return;
    double& first = first_beat_[t.family];
    first = std::max(now - t.started_at, 0.9 * first);
  }

  /// A heartbeat of t's attempt at `at` (later than its last one).
  static void record_heartbeat(TaskState& t, double at) {
    if (t.last_hb) t.max_gap = std::max(at - *t.last_hb, 0.9 * t.max_gap);
    t.hb.heartbeat(at);
    t.last_hb = at;
    t.running = true;
  }

  void forget(std::map<std::string, TaskState, std::less<>>::iterator it) {
    if (it->second.site >= 0) --sites_[static_cast<std::size_t>(it->second.site)].running;
    // A family of its own (an id no spec task names) goes with it: nothing else learns from it.
    if (!it->second.spec && it->second.family == it->first) families_.erase(it->first);
    tasks_.erase(it);
  }

  double decayed_failures(const SiteState& s, double now) const {
    return decay_failures(s.failures, now - s.failures_t, opt_.failure_half_life_s);
  }
  void add_failures(SiteState& s, double k, double now) {
    s.failures = decayed_failures(s, now) + k;
    s.failures_t = std::max(s.failures_t, now);
  }

  SiteHealth health(const SiteState& s, double now) const {
    SiteHealth h;
    h.speed = std::clamp(s.spec->speed / max_speed_, 0.0, 1.0);
    h.workers = std::max<std::int64_t>(1, s.spec->workers);
    h.queue = s.queue ? std::max(0.0, *s.queue)
                      : static_cast<double>(std::max<std::int64_t>(0, s.running - h.workers));
    h.failures = decayed_failures(s, now);
    h.failure_rate = s.failure_rate;
    h.anomaly = std::clamp(s.anomaly, 0.0, 1.0);
    SiteHealthInputs in;
    in.speed = h.speed;
    in.failures = h.failures;
    in.failure_rate = h.failure_rate;
    in.anomaly = h.anomaly;
    in.queue = h.queue;
    in.workers = static_cast<double>(h.workers);
    h.health = diaspora::site_health(in);
    return h;
  }

  bool watches(const Policy& p, std::string_view task_id, int site) const {
    if (p.builtin) {
      if (site >= 0 && std::find(p.exclude_sites.begin(), p.exclude_sites.end(), site) != p.exclude_sites.end()) return false;
      if (!task_id.empty())
        for (const auto& n : p.exclude_tasks)
          if (name_matches(n, task_id)) return false;
      return true;
    }
    if (p.all_targets) return true;
    if (site >= 0 && std::find(p.site_targets.begin(), p.site_targets.end(), site) != p.site_targets.end()) return true;
    if (!task_id.empty())
      for (const auto& n : p.task_targets)
        if (name_matches(n, task_id)) return true;
    return false;
  }

  // ---- the task's normal ---------------------------------------------------------------------

  double site_speed(int site) const {
    return site >= 0 && sites_[static_cast<std::size_t>(site)].spec->speed > 0 ? sites_[static_cast<std::size_t>(site)].spec->speed
                                                                               : 1.0;
  }

  /// A normal's value expected on a site of declared speed `speed`: a time on a site twice
  /// as fast is expected to take twice as long there.
  static double expected_at(const Normal& nm, double speed) { return std::exp(nm.log_mean) * nm.speed / speed; }

  /// One value of a relative series of an attempt: updates the attempt's smoothed level,
  /// compares it with the task's normal (the best normal of any site, scaled by the sites'
  /// declared speeds) and lets the value join its site's normal unless it is itself worse
  /// than normal. O(sites that ran the task).
  RelEval rel_eval(TaskState& t, int rs, double x) {
    RelEval r;
    if (!(x >= 0) || !std::isfinite(x)) return r;
    double& lvl = t.att_level[static_cast<std::size_t>(rs)];
    int& n = t.att_n[static_cast<std::size_t>(rs)];
    // Step times come many an attempt: its first (start-up: imports, a cold cache) neither
    // counts nor teaches, and it is judged from its third. A run time or a queue wait comes
    // once an attempt: judged and taught from that one value.
    const bool stepwise = rs == kStepTime;
    if (++n == 1 && stepwise) return r;
    const int first = stepwise ? 2 : 1;
    lvl = n == first ? x : lvl + 0.5 * (x - lvl);
    r.level = lvl;
    auto fit = families_.find(t.family);
    if (fit == families_.end()) {
      if (families_.size() >= kMaxFamilies) return r;  // bounded: unknown ids can be many
      fit = families_.emplace(t.family, Family{}).first;
    }
    auto& normals = fit->second.normals[static_cast<std::size_t>(rs)];
    const double own_speed = site_speed(t.site);
    Normal* own = nullptr;
    for (auto& nm : normals)
      if (nm.site == t.site_name) own = &nm;
    // Its own site's normal once it has one (the site against its own past: declared speeds
    // may be wrong); until then the best of the other sites' (a site slow from its first
    // step is still seen: its slow values do not join its normal).
    const bool own_ready = own && own->n >= kMinNormal;
    for (auto& nm : normals) {
      if (nm.n < kMinNormal || (own_ready && &nm != own)) continue;
      const double expected = expected_at(nm, own_speed);
      if (!r.ready || expected < r.normal) {
        r.ready = true;
        r.normal = expected;
        r.normal_n = nm.n;
        r.normal_site = nm.site;
        // Values that vary by more than the ratio in normal times widen it: 2.5 of their
        // log-space deviations (a log-normal sigma of 0.3 allows 2.1x).
        r.allowance = std::max(1.0, std::exp(kNoiseSigmas * std::sqrt(nm.log_var)) / rel_ratio_);
      }
    }
    const double floor = 1e-9;
    const bool worse = r.ready && x / std::max(r.normal * r.allowance, floor) >= rel_ratio_;
    if (stepwise && n < 3) r.ready = false;  // step times: judged on two values of its own at least
    if (r.ready) r.ratio = lvl / std::max(r.normal * r.allowance, floor);
    if (!worse && x > 0) {
      if (!own && normals.size() < kMaxFamilySites) own = &normals.emplace_back(Normal{t.site_name, own_speed, 0, 0, 0});
      if (own) {
        own->n += 1;
        const double w = 1 / std::min(own->n, kNormalMemory), d = std::log(x) - own->log_mean;
        own->log_mean += w * d;
        own->log_var = (1 - w) * (own->log_var + w * d * d);
      }
    }
    return r;
  }

  // ---- detectors -----------------------------------------------------------------------------

  /// z of x against a RobustLevel, its scale floored at 1 % of the level so that a nearly
  /// constant series (timings repeating to the microsecond) does not make jitter look huge.
  static double floored_z(const RobustLevel& rl, double x) {
    if (rl.count() < 2) return 0;
    const double sd = std::max({1.25 * rl.scale(), 0.01 * std::fabs(rl.level()), 1e-12});
    return (x - rl.level()) / sd;
  }

  /// The threshold an ensemble policy with none written compares this score with (`normal`,
  /// or the quiet threshold on a quiet series: PolicyOptions::quiet_threshold); then counts
  /// the score in the series' history at the quiet threshold.
  double quiet_threshold(QuietGate& g, double t, double score, double normal) const {
    const double low = opt_.quiet_threshold;
    if (!(low > 0 && low < normal)) return normal;
    if (std::isnan(g.first_t)) g.first_t = t;
    const double hours = (t - g.first_t) / 3600.0;
    const bool quiet = hours >= opt_.quiet_min_hours && g.runs <= opt_.quiet_rate_per_hour * hours;
    const bool over = score >= low;
    if (over && !g.over) ++g.runs;
    g.over = over;
    return quiet ? low : normal;
  }

  /// The relative form of an evaluation: how many times worse than normal, as a score that
  /// is 0.5 at the sensitivity's ratio and 1 at its square (2x: 0.5, 4x: 1 by default).
  double rel_score(double ratio) const { return ratio > 1 ? std::clamp(0.5 * std::log(ratio) / std::log(rel_ratio_), 0.0, 1.0) : 0.0; }

  Eval run_detector(const Policy& p, Slot& s, double t, double x, const RelEval* rel = nullptr) {
    Eval e;
    e.x = x;
    if (!std::isfinite(x) || !std::isfinite(t)) return e;
    if (!s.det) {
      s.det = std::make_unique<DetState>();
      switch (p.det) {
        case Det::ensemble: s.det->v.emplace<Ensemble>(opt_.ensemble); break;
        case Det::ewma: s.det->v.emplace<RobustLevel>(); break;
        case Det::holt_winters: s.det->v.emplace<SeasonalForecaster>(); break;
        case Det::cusum: s.det->v.emplace<CusumState>(CusumState{RobustLevel{}, Cusum{{0.5, 1e300, 4.0}}}); break;
        case Det::forecast:
          if (p.signal != kDeadlineSlack)
            s.det->v.emplace<ThresholdForecaster>(p.threshold, p.dir > 0 ? ThresholdForecaster::Direction::kRising
                                                                          : ThresholdForecaster::Direction::kFalling);
          break;
        default: break;
      }
    }
    const double min_n = static_cast<double>(opt_.min_observations);
    auto z_score = [](double z) { return std::clamp(detail::neg_log_upper_tail(z) / 23.0, 0.0, 1.0); };
    // A z-score against the policy's threshold, on the side the signal goes bad.
    auto judge_z = [&](Eval& ev, const auto& pol, bool warm, double z) {
      ev.ready = warm;
      ev.value = z;
      ev.shown_threshold = pol.dir * pol.threshold;
      ev.over = warm && pol.dir * z >= pol.threshold;
      ev.score = z_score(pol.dir * z);
      ev.score_threshold = z_score(pol.threshold);
      ev.badness = ev.over ? 1 : 0;
    };
    switch (p.det) {
      case Det::ensemble: {
        auto& en = std::get<Ensemble>(s.det->v);
        e.ens = en.update(t, x);
        e.ready = en.count() > static_cast<std::uint64_t>(std::max(0, opt_.ensemble.warmup));
        e.value = bad_side_score(e.ens, p.dir);
        e.shown_threshold = p.quiet ? quiet_threshold(s.det->quiet, t, e.value, p.threshold) : p.threshold;
        e.over = e.value >= e.shown_threshold;
        e.score = e.ens.score;
        e.score_threshold = e.shown_threshold;
        e.badness = e.value;
        // Before it has warmed up, and whenever it says less, the task's normal speaks: a
        // baseline from the first step.
        if (rel && rel->ready && rel_score(rel->ratio) > (e.ready ? e.value : 0)) {
          e.ready = true;
          e.relative = true;
          e.rel = *rel;
          e.value = rel_score(rel->ratio);
          e.shown_threshold = e.score_threshold = p.threshold;  // the quiet threshold is the ensemble's
          e.over = e.value >= p.threshold;
          e.score = e.value;
          e.badness = e.value;
        }
        break;
      }
      case Det::relative:
        if (rel) {
          e.ready = rel->ready;
          e.relative = true;
          e.rel = *rel;
          e.value = rel->ratio;
          e.shown_threshold = p.threshold;
          e.over = e.ready && rel->ratio >= p.threshold;
          e.score = rel_score(rel->ratio);
          e.score_threshold = rel_score(p.threshold);
          e.badness = e.over ? 1 : 0;
        }
        break;
      case Det::ewma: {
        auto& rl = std::get<RobustLevel>(s.det->v);
        e.a = rl.level();
        e.b = 1.25 * rl.scale();
        const bool warm = static_cast<double>(rl.count()) >= min_n;
        const double z = floored_z(rl, x);
        rl.update(x);
        judge_z(e, p, warm, z);
        break;
      }
      case Det::holt_winters: {
        auto& fc = std::get<SeasonalForecaster>(s.det->v);
        e.fc = fc.forecast(t);
        const bool warm = static_cast<double>(fc.count()) >= min_n;
        const double z = fc.update(t, x);
        judge_z(e, p, warm, z);
        break;
      }
      case Det::cusum: {
        auto& cs = std::get<CusumState>(s.det->v);
        e.a = cs.level.level();
        const bool warm = static_cast<double>(cs.level.count()) >= min_n;
        const double z = floored_z(cs.level, x);
        cs.level.update(x);
        if (warm) cs.cusum.update(z);
        e.ready = warm;
        e.value = p.dir > 0 ? cs.cusum.upper() : cs.cusum.lower();
        e.shown_threshold = p.threshold;
        e.over = warm && e.value >= p.threshold;
        e.score = std::clamp(e.value / 23.0, 0.0, 1.0);  // surprise 2kS nats, k = 0.5
        e.score_threshold = std::clamp(p.threshold / 23.0, 0.0, 1.0);
        e.badness = e.over ? 1 : 0;
        break;
      }
      case Det::threshold:
      case Det::forecast:
        if (p.det == Det::threshold || p.signal == kDeadlineSlack) {
          e.ready = true;
          e.value = x;
          e.shown_threshold = p.threshold;
          e.over = p.dir > 0 ? x >= p.threshold : x <= p.threshold;
          e.score = 1;
          e.badness = e.over ? 1 : 0;
        } else {
          auto& tf = std::get<ThresholdForecaster>(s.det->v);
          tf.update(t, x);
          e.ready = static_cast<double>(tf.model().count()) >= min_n;
          e.shown_threshold = opt_.forecast_horizon_s;
          e.value = kInf;
          if (auto c = tf.time_to_cross()) {
            e.value = std::max(0.0, c->at - t);
            e.eta = c->at;
            e.a = c->earliest, e.b = c->latest;
          }
          e.c = tf.model().slope();
          e.over = e.ready && e.value <= opt_.forecast_horizon_s;
          e.score = 1;
          e.badness = e.over ? 1 : 0;
        }
        break;
      case Det::phi: break;  // evaluated by phi_eval
    }
    return e;
  }

  /// The default set's silence check for an attempt that has sent no heartbeat since it
  /// started (one that hangs as it starts): silent for 5x the time its family's attempts
  /// took to send their first (the longest seen lately), 3 s more than that, and at least
  /// kUnheardFloorS (a start that is slow for once, e.g. a cold cache, is not a hang). No
  /// verdict before an attempt of its family has sent one.
  static constexpr double kUnheardFloorS = 10.0;
  Eval unheard_eval(const TaskState& t, double now) const {
    Eval e;
    auto f = first_beat_.find(t.family);
    if (t.started_at < 0 || f == first_beat_.end() || !(f->second > 0)) return e;
    e.ready = true;
    e.borrowed = true;
    e.x = now - t.started_at;
    e.a = f->second;
    e.value = e.x / e.a;
    e.shown_threshold = 5;
    e.over = e.x >= std::max({5 * e.a, e.a + 3.0, kUnheardFloorS});
    e.score = std::min(1.0, e.value / 5);
    e.score_threshold = 1;
    e.badness = e.over ? 1 : 0;
    return e;
  }

  Eval phi_eval(const Policy& p, const PhiAccrual& hb, std::optional<double> last_hb, double now,
                double max_gap = 0) const {
    Eval e;
    if (hb.count() < static_cast<std::uint64_t>(opt_.min_heartbeats) || !last_hb) return e;
    const double phi = hb.phi(now);
    e.ready = true;
    e.value = phi;
    e.x = now - *last_hb;
    e.a = hb.mean_gap();
    e.b = static_cast<double>(hb.count());
    e.shown_threshold = p.threshold;
    e.over = phi >= p.threshold;
    // The default set also wants a silence that is long in absolute terms: heartbeats that
    // come once a step are as irregular as the steps, which phi's Gaussian does not expect.
    // A slowed attempt's steps (one heartbeat each) grow long but keep coming: twice the
    // longest recent gap is not yet silence.
    if (p.builtin) e.over = e.over && e.x >= std::max({5 * hb.mean_gap(), hb.mean_gap() + 3.0, 2 * max_gap});
    e.score = 1 - std::pow(10.0, -phi);
    e.score_threshold = 1 - std::pow(10.0, -p.threshold);
    e.badness = e.over ? 1 : 0;
    return e;
  }

  // ---- deciding --------------------------------------------------------------------------------

  std::string value_text(const Policy& p, const Eval& e) const {
    const char* op = p.det == Det::forecast && p.signal != kDeadlineSlack ? "<=" : (p.dir > 0 ? ">=" : "<=");
    const char* unit = kSignals[p.signal].unit;
    switch (p.det) {
      case Det::ensemble:
        if (e.relative) return fmt("score %.2f >= %g (%.1fx the task's normal)", e.value, p.threshold, e.rel.ratio);
        if (e.value < p.threshold) return fmt("score %.2f >= %g (a quiet series)", e.value, e.shown_threshold);
        return fmt("score %.2f >= %g", e.value, p.threshold);
      case Det::relative: return fmt("%.2fx >= %gx the task's normal", e.value, p.threshold);
      case Det::ewma:
      case Det::holt_winters: return fmt("z %+.1f %s %+g", e.value, op, e.shown_threshold);
      case Det::cusum: return fmt("%s sum %.1f >= %g sigmas", p.dir > 0 ? "upward" : "downward", e.value, p.threshold);
      case Det::phi:
        if (e.borrowed) return fmt("silence %.1fx >= 5x its task's time to a first heartbeat", e.value);
        return fmt("phi %.1f >= %g", e.value, p.threshold);
      case Det::threshold: return fmt("value %.4g%s %s %g%s", e.value, unit, op, p.threshold, unit);
      case Det::forecast:
        if (p.signal == kDeadlineSlack) {
          if (e.stalled) return fmt("deadline passed %.1f s ago with progress not increasing", -e.value);
          return fmt("deadline slack %.1f s %s %g s", e.value, op, p.threshold);
        }
        return fmt("forecast to cross %g in %.0f s %s horizon %g s", p.threshold, e.value, op, opt_.forecast_horizon_s);
    }
    return {};
  }

  std::string explanation(const Policy& p, const Eval& e, const TaskState* t) const {
    switch (p.det) {
      case Det::relative:
      case Det::ensemble:
        if (e.relative)
          return fmt("attempt's level %.4g%s (last value %.4g), task's normal %.4g%s from %.0f values on %s", e.rel.level,
                     kSignals[p.signal].unit, e.x, e.rel.normal, kSignals[p.signal].unit, e.rel.normal_n,
                     e.rel.normal_site.empty() ? "?" : e.rel.normal_site.c_str()) +
                 (e.rel.allowance > 1 ? fmt(", widened %.2fx for its noise", e.rel.allowance) : std::string());
        return explain(e.ens);
      case Det::ewma: return fmt("value %.4g, level %.4g, scale %.3g", e.x, e.a, e.b);
      case Det::holt_winters:
        return fmt("value %.4g, expected %.4g [%.4g, %.4g]", e.x, e.fc.mean, e.fc.lower, e.fc.upper);
      case Det::cusum: return fmt("value %.4g, level before %.4g", e.x, e.a);
      case Det::phi:
        if (e.borrowed)
          return fmt("no heartbeat in the %.1f s since it started (its task's attempts send their first within "
                     "%.2f s)", e.x, e.a);
        return fmt("last heartbeat %.1f s ago, mean gap %.2f s over %.0f heartbeats", e.x, e.a, e.b);
      case Det::threshold: return fmt("value %.4g", e.x);
      case Det::forecast:
        if (p.signal == kDeadlineSlack) {
          if (!t || !t->deadline || !e.eta) return fmt("deadline slack %.4g s", e.x);
          // In seconds from now: the engine's clock may be the epoch.
          return fmt("expected completion in %.1f s [%.1f, %s], deadline in %.1f s, progress %.3f", *e.eta - clock(),
                     std::max(0.0, e.a - clock()), std::isfinite(e.b) ? fmt("%.1f", e.b - clock()).c_str() : "never",
                     *t->deadline - clock(), t->last_fraction);
        }
        if (!e.eta) return fmt("value %.4g, trend %+.3g/s", e.x, e.c);
        return fmt("value %.4g, trend %+.3g/s, crossing in %.1f s [%.1f, %s]", e.x, e.c, *e.eta - clock(),
                   std::max(0.0, e.a - clock()), std::isfinite(e.b) ? fmt("%.1f", e.b - clock()).c_str() : "never");
    }
    return {};
  }

  static std::string health_text(const SiteHealth& h) {
    return fmt("health %.2f (speed %.2f, queue %.0f/%lld workers, failures %.1f, failure rate %.2f, anomaly %.2f)",
               h.health, h.speed, h.queue, static_cast<long long>(h.workers), h.failures, h.failure_rate, h.anomaly);
  }

  /// Picks the target of a migrate/speculate; returns -1 and says why in `why`.
  int choose_target(const Policy& p, const TaskState& t, double now, std::string& why) const {
    int best = -1, second = -1;
    double best_h = -1, second_h = -1;
    int candidates = 0;
    auto preferred_rank = [&](int site) {
      if (!t.spec) return 1 << 20;
      const auto& pref = t.spec->preferred_sites;
      auto it = std::find(pref.begin(), pref.end(), sites_[static_cast<std::size_t>(site)].spec->name);
      return it == pref.end() ? 1 << 20 : static_cast<int>(it - pref.begin());
    };
    auto visit = [&](int site) {
      if (site == t.site) return;
      const SiteSpec& ss = *sites_[static_cast<std::size_t>(site)].spec;
      if (ss.name == t.site_name) return;
      if (t.spec && !t.spec->allowed_sites.empty() &&
          std::find(t.spec->allowed_sites.begin(), t.spec->allowed_sites.end(), ss.name) == t.spec->allowed_sites.end())
        return;
      ++candidates;
      const double h = health(sites_[static_cast<std::size_t>(site)], now).health;
      const bool better = best < 0 || h > best_h + 1e-12 ||
                          (std::abs(h - best_h) <= 1e-12 && preferred_rank(site) < preferred_rank(best));
      if (better) {
        second = best, second_h = best_h;
        best = site, best_h = h;
      } else if (second < 0 || h > second_h) {
        second = site, second_h = h;
      }
    };
    if (p.to_sites.empty())
      for (int i = 0; i < static_cast<int>(sites_.size()); ++i) visit(i);
    else
      for (int i : p.to_sites) visit(i);
    if (best < 0) {
      why = "no candidate site (to_sites and the task's allowed_sites leave none besides " + t.site_name + ")";
      return -1;
    }
    const SiteState& b = sites_[static_cast<std::size_t>(best)];
    SiteHealth bh = health(b, now);
    if (bh.health < opt_.min_target_health) {
      why = fmt("no healthy target: best candidate %s has ", b.spec->name.c_str()) + health_text(bh) +
            fmt(" < %g", opt_.min_target_health);
      return -1;
    }
    why = b.spec->name + ": " + health_text(bh) + fmt(", best of %d candidate%s", candidates, candidates == 1 ? "" : "s");
    if (second >= 0) why += fmt(" (next %s %.2f)", sites_[static_cast<std::size_t>(second)].spec->name.c_str(), second_h);
    if (t.site >= 0) why += fmt("; source %s %.2f", t.site_name.c_str(), health(sites_[static_cast<std::size_t>(t.site)], now).health);
    return best;
  }

  /// The instance a speculative copy's id ("ID@copyN") is a copy of; any other id itself.
  static std::string_view original_of(std::string_view id) {
    const std::size_t at = id.find("@copy");
    return at == std::string_view::npos || at == 0 ? id : id.substr(0, at);
  }

  /// The slot whose attempt budget a decision spends: a copy's is its original's when the
  /// original is tracked, so that copies of copies stay in one budget.
  Slot& budget_of(const Policy& p, Slot& own, std::string_view task_id) {
    const std::string_view base = original_of(task_id);
    if (base == task_id || p.task_slot < 0) return own;
    auto it = tasks_.find(base);
    return it == tasks_.end() ? own : it->second.slots[static_cast<std::size_t>(p.task_slot)];
  }

  /// Whether `site` has a worker free: fewer attempts running there (as far as the engine's
  /// reports tell, `except` left out) than its workers.
  bool has_room(int site, std::string_view except) const {
    std::int64_t n = 0;
    for (const auto& [uid, u] : tasks_) n += u.site == site && u.running && uid != except;
    return n < std::max<std::int64_t>(1, sites_[static_cast<std::size_t>(site)].spec->workers);
  }

  /// Other running attempts on t's site whose last heartbeat is over twice their mean gap old.
  int silent_peers(const TaskState& t, std::string_view id, double now) const {
    int n = 0;
    for (const auto& [uid, u] : tasks_)
      if (uid != id && u.site == t.site && u.running && u.last_hb &&
          u.hb.count() >= static_cast<std::uint64_t>(opt_.min_heartbeats) && now - *u.last_hb > 2 * u.hb.mean_gap())
        ++n;
    return n;
  }

  /// The task family's normal run time (task.runtime of completed attempts) on `site`,
  /// scaled from the best site's by declared speed; -1 when none is known yet.
  double expected_runtime(const TaskState& t, int site) const {
    auto fit = families_.find(t.family);
    if (fit == families_.end()) return -1;
    double best = -1;
    for (const auto& nm : fit->second.normals[kRuntime])
      if (nm.n >= kMinNormal) {
        const double e = expected_at(nm, site_speed(site));
        if (best < 0 || e < best) best = e;
      }
    return best;
  }

  /// Whether another attempt of `id`'s instance runs: its original (for a copy "ID@copyN")
  /// or a speculative copy of it.
  bool other_attempt_running(std::string_view id) const {
    const std::string_view base = original_of(id);
    if (base != id)
      if (auto it = tasks_.find(base); it != tasks_.end() && it->second.running) return true;
    const std::string prefix = std::string(base) + "@copy";
    for (auto it = tasks_.lower_bound(prefix); it != tasks_.end() && it->first.starts_with(prefix); ++it)
      if (it->first != id && it->second.running) return true;
    return false;
  }

  /// Whether t's slowness is its own (a straggler: a bad node, a noisy neighbour) rather
  /// than its site's: another attempt on its site was judged during t's latest slow step
  /// (within `window` seconds) and every such attempt runs near its own normal (ratio under
  /// the midpoint of 1 and `ratio`); none is stale-fine while silent for over `window`.
  bool straggler(const TaskState& t, std::string_view id, double ratio, double window, double now) const {
    if (t.site < 0) return false;
    int fine = 0;
    for (const auto& [uid, u] : tasks_) {
      if (uid == id || u.site != t.site || !u.running || u.ratio_t < 0) continue;
      if (u.last_ratio >= 0.5 * (1 + ratio)) return false;  // its site's peers are slow too
      if (now - u.ratio_t <= window) ++fine;
    }
    return fine > 0;
  }

  void feed_anomaly(SiteState* ss, double badness) const {
    if (ss) ss->anomaly += opt_.health_alpha * (std::clamp(badness, 0.0, 1.0) - ss->anomaly);
  }

  /// Hysteresis, cooldown, budget; emits a Decision when the policy fires.
  void consider(const Policy& p, Slot& s, const Eval& e, std::string_view task_id, TaskState* t,
                std::string_view site, SiteState* ss, double now, std::vector<Decision>& out) {
    if (!e.ready) {
      s.run = 0;
      return;
    }
    feed_anomaly(ss, e.badness);
    if (!e.over) {
      s.run = 0;
      return;
    }
    // default-slow moves a task that starts again elsewhere: worth it only while what is left
    // here, at `ratio` times the normal pace, outlasts a whole run at the normal pace
    // (progress < 1 - 1/ratio; LATE's "time left" rule).
    if (p.builtin && e.relative && p.spec->action == ActionKind::migrate && t && e.rel.ratio > 1 &&
        t->last_fraction >= 1 - 1 / e.rel.ratio) {
      s.run = 0;
      return;
    }
    ++s.run;
    if (s.run < p.for_count) return;
    if (now < s.last_fire + p.cooldown) return;
    // An instance with two attempts running (an original and its copy) has its second
    // chance: a default moves or copies neither (one action per incident).
    if (p.builtin && (p.spec->action == ActionKind::migrate || p.spec->action == ActionKind::speculate) &&
        other_attempt_running(task_id))
      return;
    // A straggler on a site whose other attempts run at their normal pace is copied, not
    // moved (LATE): the copy runs where a worker is free and the first to finish wins. With
    // no free worker there it waits, judged again at its next step (a queued copy would
    // finish later than the straggler).
    bool copy_straggler = false;
    std::string copy_why;
    int copy_target = -1;
    if (p.builtin && e.relative && p.spec->action == ActionKind::migrate && t &&
        straggler(*t, task_id, p.threshold, std::max(1.0, e.rel.level * static_cast<double>(p.for_count)), now)) {
      copy_target = choose_target(p, *t, now, copy_why);
      if (copy_target >= 0) {
        if (!has_room(copy_target, task_id)) return;
        copy_straggler = true;
      }
    }

    const PolicySpec& ps = *p.spec;
    std::string subject = task_id.empty() ? "site " + std::string(site)
                                          : "task " + std::string(task_id) + " on site " +
                                                (site.empty() ? std::string("?") : std::string(site));
    std::string what = ps.name + ": " + ps.signal + " of " + subject + ": " + ps.detector + " " + value_text(p, e) +
                       fmt(" for %lld observation%s", static_cast<long long>(s.run), s.run == 1 ? "" : "s");
    Decision d;
    d.task_id.assign(task_id);
    d.site.assign(site);
    d.policy = ps.name;
    d.score = std::clamp(e.score, 0.0, 1.0);
    d.signal = ps.signal;
    d.detector = ps.detector;
    d.explanation = explanation(p, e, t);
    d.value = std::isfinite(e.value) ? e.value : 0;
    d.threshold = e.shown_threshold;
    d.score_threshold = e.score_threshold;
    d.time_s = now;
    d.eta_s = e.eta;

    // A speculative copy ("ID@copyN") spends its original's budget: a copy of a copy counts.
    Slot& b = budget_of(p, s, task_id);
    if (b.attempts >= p.max_attempts) {
      if (!b.exhausted) {
        b.exhausted = true;
        s.last_fire = now;
        s.run = 0;
        d.action = "alert";
        d.attempt = 0;
        d.reason = what + " (" + d.explanation + "); " + std::string(to_string(ps.action)) +
                   fmt(" budget spent (max_attempts %d): not acting again", p.max_attempts);
        out.push_back(std::move(d));
      }
      return;
    }

    ++b.attempts;
    s.last_fire = now;
    s.run = 0;
    if (p.det == Det::cusum && s.det) std::get<CusumState>(s.det->v).cusum = Cusum{{0.5, 1e300, 4.0}};
    d.attempt = b.attempts;
    std::string act;
    switch (ps.action) {
      case ActionKind::restart: {
        d.action = "restart";
        d.target_site.assign(site);
        act = "restart on site " + std::string(site.empty() ? "?" : site);
        // A restart does not go back to a site under suspicion when a healthier one is allowed.
        std::string why;
        const int target = t && t->site >= 0 && sites_.size() > 1 ? choose_target(p, *t, now, why) : -1;
        if (target >= 0) {
          const double own = health(sites_[static_cast<std::size_t>(t->site)], now).health;
          const double best = health(sites_[static_cast<std::size_t>(target)], now).health;
          // Silence that other attempts on the same site share is the site's, not the task's.
          const int silent = p.det == Det::phi ? silent_peers(*t, task_id, now) : 0;
          // Waiting for a slot there would cost more than the suspicion: a full candidate
          // takes the restart only from a site that is really bad.
          if ((own < kSuspect * best || (silent > 0 && own <= best)) && (has_room(target, task_id) || own < kReallyBad)) {
            d.action = "migrate";
            d.target_site = sites_[static_cast<std::size_t>(target)].spec->name;
            act = (silent > 0 ? fmt("restart off suspect site %s (%d other attempt%s there silent too): on ",
                                    t->site_name.c_str(), silent, silent == 1 ? " is" : "s are")
                              : fmt("restart off suspect site %s (health %.2f < %.2f x the best candidate's): on ",
                                    t->site_name.c_str(), own, kSuspect)) +
                  why;
          }
        }
        break;
      }
      case ActionKind::migrate:
      case ActionKind::speculate: {
        std::string why;
        const char* verb = ps.action == ActionKind::migrate ? "migrate" : "speculate";
        std::string lead = ps.action == ActionKind::migrate ? " to " : " a copy on ";
        int target = -1;
        if (copy_straggler) {
          verb = "speculate";
          lead = " (a straggler: the other attempts on " + t->site_name + " run at their normal pace) a copy on ";
          target = copy_target;
          why = std::move(copy_why);
        } else if (t) {
          target = choose_target(p, *t, now, why);
        }
        // A copy for a deadline is made only where it may finish first: not when the task's
        // run time there (its normal, from completed attempts) already ends after it.
        double copy_runs = -1;
        if (target >= 0 && p.builtin && p.signal == kDeadlineSlack && t && t->deadline)
          copy_runs = expected_runtime(*t, target);
        if (target < 0) {
          d.action = "alert";
          act = std::string("cannot ") + verb + ": " + (t ? why : std::string("no task"));
        } else if (copy_runs > 0 && now + copy_runs > *t->deadline) {
          d.action = "alert";
          act = fmt("no copy: one on %s would run about %.1f s (the task's normal run time there) and end %.1f s after "
                    "the deadline too",
                    sites_[static_cast<std::size_t>(target)].spec->name.c_str(), copy_runs,
                    now + copy_runs - *t->deadline);
        } else {
          d.action = verb;
          d.target_site = sites_[static_cast<std::size_t>(target)].spec->name;
          act = verb + lead + why;
        }
        break;
      }
      case ActionKind::checkpoint:
        d.action = "checkpoint";
        act = "checkpoint task " + std::string(task_id);
        break;
      case ActionKind::throttle:
        d.action = "throttle";
        act = task_id.empty() ? "throttle site " + std::string(site) : "throttle task " + std::string(task_id);
        break;
      case ActionKind::alert:
        d.action = "alert";
        act = "alert";
        break;
    }
    if (p.builtin && spec_.defaults == DefaultsMode::observe) {  // decided, reported, not done
      act = "observe only (defaults: observe): would " + act;
      d.action = "alert";
    }
    if (d.action == "restart" || d.action == "migrate") {
      if (ss) add_failures(*ss, 1, now);
      if (t) t->acted = true;  // the attempt it stops is a consequence, not new evidence
    }
    d.reason = what + " (" + d.explanation + "); " + act + fmt("; attempt %d of %d", b.attempts, p.max_attempts);
    out.push_back(std::move(d));
  }

  SiteState* site_state(int idx) { return idx >= 0 ? &sites_[static_cast<std::size_t>(idx)] : nullptr; }

  // ---- entry points ------------------------------------------------------------------------------

  /// `failure`: what task_failed() knows of a task.failures observation (nullptr: nothing).
  void observe(const Observation& o, std::vector<Decision>& out, const Failure* failure = nullptr) {
    // A failure the engine retries itself is retried by no policy; the task's own error is
    // not the site's doing and not default-retry's business (it retries lost attempts).
    const bool engine_retries = failure && failure->engine_retries;
    const bool task_error = failure && (failure->kind == Failure::Kind::error ||
                                        (failure->kind == Failure::Kind::unknown && failure->exit_code &&
                                         *failure->exit_code != 0));
    const int sig = signal_index(o.signal);
    if (sig < 0 || !std::isfinite(o.time_s)) return;
    advance(o.time_s);
    const double now = o.time_s;
    const SignalInfo& info = kSignals[sig];
    const bool per_task = info.scope == Scope::task || (info.scope == Scope::resource && !o.task_id.empty());
    const int site_idx = find_site(o.site);
    SiteState* ss = site_state(site_idx);

    if (sig == kFailures && per_task && !o.task_id.empty() && o.value > 0) {
      auto it = tasks_.find(o.task_id);
      if (it != tasks_.end()) {
        it->second.running = false;
        if (it->second.acted) {  // the attempt an action stopped: what the action did, not new trouble
          it->second.acted = false;
          return;
        }
      }
    }
    // Inputs of the health score, whatever the policies.
    if (std::isfinite(o.value) && ss) {
      if (sig == kQueueLength) ss->queue = o.value;
      if (sig == kFailureRate) ss->failure_rate = std::clamp(o.value, 0.0, 1.0);
      if (sig == kFailures && o.value > 0 && !task_error) add_failures(*ss, o.value, now);
    }

    if (per_task) {
      if (o.task_id.empty()) return;
      const auto& list = by_signal_[static_cast<std::size_t>(sig)];
      TaskState& t = task(o.task_id, o.site, now);
      if (sig == kDeadlineSlack) t.observed_slack = true;
      if (sig == kProgressRate) t.observed_rate = true;
      if (sig == kTaskHeartbeat && std::isfinite(o.value) && o.value >= 0) {
        const double at = now - o.value;
        first_heard(t, now);
        if (!t.last_hb || at > *t.last_hb + 1e-9) record_heartbeat(t, at);
      }
      SiteState* tss = site_state(t.site);
      const int rs = rel_series(sig);
      std::optional<RelEval> rel;
      if (rs >= 0 && std::isfinite(o.value)) rel = rel_eval(t, rs, o.value);
      if (rel && rel->ready && rs == kStepTime) t.last_ratio = rel->ratio, t.ratio_t = now;  // its pace (straggler())
      for (int pi : list) {
        const Policy& p = policies_[static_cast<std::size_t>(pi)];
        if (!watches(p, o.task_id, t.site)) continue;
        if (engine_retries && (p.spec->action == ActionKind::restart || p.spec->action == ActionKind::migrate ||
                               p.spec->action == ActionKind::speculate))
          continue;  // never two retries of one failure
        if (task_error && p.builtin) continue;
        Slot& s = t.slots[static_cast<std::size_t>(p.task_slot)];
        Eval e = p.det == Det::phi ? phi_eval(p, t.hb, t.last_hb, now, t.max_gap)
                                   : run_detector(p, s, now, o.value, rel ? &*rel : nullptr);
        consider(p, s, e, o.task_id, &t, t.site_name, tss, now, out);
      }
      return;
    }
    if (!ss) return;
    if (sig == kSiteHeartbeat && std::isfinite(o.value) && o.value >= 0) {
      const double at = now - o.value;
      if (!ss->last_hb || at > *ss->last_hb + 1e-9) {
        ss->hb.heartbeat(at);
        ss->last_hb = at;
      }
    }
    for (int pi : by_signal_[static_cast<std::size_t>(sig)]) {
      const Policy& p = policies_[static_cast<std::size_t>(pi)];
      if (p.site_slot < 0 || !watches(p, {}, site_idx)) continue;
      if (info.scope == Scope::resource && task_action(p.spec->action)) continue;  // needs a task
      Slot& s = ss->slots[static_cast<std::size_t>(p.site_slot)];
      Eval e = p.det == Det::phi ? phi_eval(p, ss->hb, ss->last_hb, now) : run_detector(p, s, now, o.value);
      consider(p, s, e, {}, nullptr, ss->spec->name, ss, now, out);
    }
  }

  void tick(double now, std::vector<Decision>& out) {
    if (!std::isfinite(now)) return;
    advance(now);
    const auto& hb_pols = by_signal_[kTaskHeartbeat];
    const auto& slack_pols = by_signal_[kDeadlineSlack];
    const auto& rate_pols = by_signal_[kProgressRate];
    for (auto& [id, t] : tasks_) {
      SiteState* tss = site_state(t.site);
      for (int pi : hb_pols) {
        const Policy& p = policies_[static_cast<std::size_t>(pi)];
        if (p.det != Det::phi || !t.running || !watches(p, id, t.site)) continue;
        Slot& s = t.slots[static_cast<std::size_t>(p.task_slot)];
        // No heartbeat since it started: phi has nothing to go on; the default set judges
        // the silence against how long its family's attempts take to send their first.
        consider(p, s, !t.last_hb && p.builtin ? unheard_eval(t, now) : phi_eval(p, t.hb, t.last_hb, now, t.max_gap),
                 id, &t, t.site_name, tss, now, out);
      }
      const TrendModel& m = t.progress.model();
      // The trend's early slope is biased low (Holt starts from 0): judge after warm-up.
      if (m.count() < static_cast<std::uint64_t>(opt_.min_observations)) continue;
      if (!t.observed_slack && t.deadline && !slack_pols.empty()) {
        auto f = t.progress.expected_completion();
        std::optional<double> slack;
        bool stalled = false;
        if (f) {
          slack = *t.deadline - std::max(f->at, now);
        } else if (now >= *t.deadline) {
          slack = *t.deadline - now;
          stalled = true;
        }
        if (slack) {
          for (int pi : slack_pols) {
            const Policy& p = policies_[static_cast<std::size_t>(pi)];
            if (!watches(p, id, t.site)) continue;
            Slot& s = t.slots[static_cast<std::size_t>(p.task_slot)];
            Eval e = run_detector(p, s, now, *slack);
            e.stalled = stalled;
            if (f) {
              e.eta = std::max(f->at, now);
              e.a = f->earliest;
              e.b = f->latest;
            }
            consider(p, s, e, id, &t, t.site_name, tss, now, out);
          }
        }
      }
      if (!t.observed_rate && !rate_pols.empty()) {
        const double rate = m.slope();
        for (int pi : rate_pols) {
          const Policy& p = policies_[static_cast<std::size_t>(pi)];
          if (!watches(p, id, t.site)) continue;
          Slot& s = t.slots[static_cast<std::size_t>(p.task_slot)];
          consider(p, s, run_detector(p, s, now, rate), id, &t, t.site_name, tss, now, out);
        }
      }
    }
    for (std::size_t i = 0; i < sites_.size(); ++i) {
      SiteState& ss = sites_[i];
      for (int pi : by_signal_[kSiteHeartbeat]) {
        const Policy& p = policies_[static_cast<std::size_t>(pi)];
        if (p.det != Det::phi || !watches(p, {}, static_cast<int>(i))) continue;
        Slot& s = ss.slots[static_cast<std::size_t>(p.site_slot)];
        consider(p, s, phi_eval(p, ss.hb, ss.last_hb, now), {}, nullptr, ss.spec->name, &ss, now, out);
      }
    }
    if (now - last_prune_ >= 60) {
      last_prune_ = now;
      for (auto it = tasks_.begin(); it != tasks_.end();) {
        auto next = std::next(it);
        if (now - it->second.last_activity > opt_.task_ttl_s) forget(it);
        it = next;
      }
    }
  }
};

PolicyEngine::PolicyEngine(const WorkflowSpec& spec, PolicyOptions options)
    : impl_(std::make_unique<Impl>(spec, std::move(options))) {}
PolicyEngine::~PolicyEngine() = default;
PolicyEngine::PolicyEngine(PolicyEngine&&) noexcept = default;
PolicyEngine& PolicyEngine::operator=(PolicyEngine&&) noexcept = default;

void PolicyEngine::task_started(std::string_view task, std::string_view site, double now,
                                std::optional<double> deadline_s) {
  if (task.empty()) return;
  impl_->advance(now);
  auto& t = impl_->task(task, site, now);
  for (auto& s : t.slots) s.reset_series();
  t.hb = PhiAccrual(impl_->opt_.phi);
  t.last_hb.reset();
  t.progress = CompletionForecaster(1.0);
  t.last_fraction = 0;
  t.observed_slack = t.observed_rate = false;
  t.running = true;
  t.acted = false;
  t.att_level = {};
  t.att_n = {};
  t.max_gap = 0;
  t.started_at = std::isfinite(now) ? now : -1;
  if (!t.deadline && std::isfinite(now)) {
    if (deadline_s && std::isfinite(*deadline_s))
      t.deadline = now + *deadline_s;
    else if (t.spec && t.spec->deadline)
      t.deadline = now + t.spec->deadline->count();
  }
}

void PolicyEngine::task_progress(std::string_view task, double fraction, double now) {
  if (task.empty() || !std::isfinite(fraction) || !std::isfinite(now)) return;
  impl_->advance(now);
  auto& t = impl_->task(task, {}, now);
  t.progress.update(now, fraction);
  t.last_fraction = fraction;
}

void PolicyEngine::heartbeat(std::string_view task, std::string_view site, double now) {
  if (task.empty() || !std::isfinite(now)) return;
  impl_->advance(now);
  auto& t = impl_->task(task, site, now);
  if (t.last_hb && now < *t.last_hb) return;
  impl_->first_heard(t, now);
  Impl::record_heartbeat(t, now);
}

void PolicyEngine::task_failed(std::string_view task, std::string_view site, double now, const Failure& f,
                               std::vector<Decision>& out) {
  if (task.empty() || !std::isfinite(now)) return;
  Impl& m = *impl_;
  m.advance(now);
  auto& t = m.task(task, site, now);
  t.running = false;
  if (retry_cannot_fix(f.exit_code)) {
    if (t.acted) {
      t.acted = false;
      return;
    }
    // Not the site's fault, and no retry fixes it: said once, in place of a retry.
    bool watched = false;
    for (int pi : m.by_signal_[kFailures]) watched |= m.watches(m.policies_[static_cast<std::size_t>(pi)], task, t.site);
    if (!watched) return;
    Decision d;
    d.action = "alert";
    d.task_id.assign(task);
    d.site = t.site_name;
    d.policy = "default-retry";
    d.attempt = -1;  // not one of the policy's attempts (nor its budget's end)
    d.signal = "task.failures";
    d.detector = "threshold";
    d.value = *f.exit_code;
    d.threshold = 1;
    d.score = 1;
    d.time_s = now;
    d.explanation = fmt("exit status %d (%s)", *f.exit_code, *f.exit_code == 127 ? "command not found" : "not executable");
    d.reason = "task " + std::string(task) + " on site " + (t.site_name.empty() ? std::string("?") : t.site_name) +
               " failed with " + d.explanation + ": a retry cannot fix that; not retried";
    out.push_back(std::move(d));
    return;
  }
  m.observe(Observation{task, site, "task.failures", 1, now}, out, &f);
}

void PolicyEngine::task_finished(std::string_view task, double now) {
  impl_->advance(now);
  auto it = impl_->tasks_.find(task);
  if (it != impl_->tasks_.end()) impl_->forget(it);
}

void PolicyEngine::observe(const Observation& o, std::vector<Decision>& out) { impl_->observe(o, out); }
void PolicyEngine::tick(double now, std::vector<Decision>& out) { impl_->tick(now, out); }

double PolicyEngine::site_health(std::string_view site) const {
  auto h = site_health_detail(site);
  return h ? h->health : 0.0;
}

std::optional<SiteHealth> PolicyEngine::site_health_detail(std::string_view site) const {
  int i = impl_->find_site(site);
  if (i < 0) return std::nullopt;
  return impl_->health(impl_->sites_[static_cast<std::size_t>(i)], impl_->clock());
}

std::string PolicyEngine::export_normals() const {
  namespace json = boost::json;
  json::object fams;
  for (const auto& [name, fam] : impl_->families_) {
    json::object series;
    for (int rs = 0; rs < kRelSeries; ++rs) {
      json::array list;
      for (const auto& nm : fam.normals[static_cast<std::size_t>(rs)])
        if (nm.n >= kMinNormal)
          list.push_back(json::object{{"site", nm.site}, {"speed", nm.speed}, {"log_mean", nm.log_mean},
                                      {"log_var", nm.log_var}, {"n", nm.n}});
      if (!list.empty()) series[kSignals[rs].name] = std::move(list);
    }
    if (!series.empty()) fams[name] = std::move(series);
  }
  return json::serialize(json::object{{"version", 1}, {"workflow", impl_->spec_.name}, {"families", std::move(fams)}});
}

std::size_t PolicyEngine::import_normals(std::string_view text) {
  namespace json = boost::json;
  auto bad = [](const std::string& what) -> std::size_t { throw Error("normals: " + what); };
  boost::system::error_code ec;
  const json::value doc = json::parse(text, ec);
  if (ec) return bad("not JSON (" + ec.message() + ")");
  const json::object* root = doc.if_object();
  if (!root) return bad("not a JSON object");
  const json::value* v = root->if_contains("version");
  if (!v || !v->is_int64() || v->get_int64() != 1) return bad("version must be 1 (a file written by this version)");
  const json::value* wf = root->if_contains("workflow");
  if (!wf || !wf->is_string()) return bad("no workflow name");
  if (wf->get_string() != impl_->spec_.name)
    return bad("learned by workflow '" + std::string(wf->get_string()) + "', not '" + impl_->spec_.name +
               "': another workflow's task names mean other tasks");
  const json::value* fv = root->if_contains("families");
  if (!fv || !fv->is_object()) return bad("no families object");
  if (fv->get_object().size() > kMaxFamilies) return bad("more than 10000 families");
  // Checked whole before anything is loaded: a bad file changes nothing.
  std::map<std::string, Impl::Family, std::less<>> loaded;
  std::size_t count = 0;
  for (const auto& [fname, fval] : fv->get_object()) {
    const std::string where = "family '" + std::string(fname) + "'";
    if (fname.empty() || !fval.is_object()) return bad(where + ": not an object of series");
    Impl::Family fam;
    for (const auto& [sname, list] : fval.get_object()) {
      int rs = -1;
      for (int k = 0; k < kRelSeries; ++k)
        if (sname == kSignals[k].name) rs = k;
      if (rs < 0) return bad(where + ": unknown series '" + std::string(sname) + "' (task.step_time, task.runtime, task.queue_wait)");
      if (!list.is_array() || list.get_array().size() > kMaxFamilySites)
        return bad(where + ", " + std::string(sname) + ": not an array of at most 64 site normals");
      for (const auto& e : list.get_array()) {
        const json::object* o = e.if_object();
        auto number = [&](const char* k) {
          const json::value* x = o ? o->if_contains(k) : nullptr;
          return x && x->is_number() ? x->to_number<double>() : std::numeric_limits<double>::quiet_NaN();
        };
        const json::value* site = o ? o->if_contains("site") : nullptr;
        Impl::Normal nm;
        nm.speed = number("speed");
        nm.log_mean = number("log_mean");
        nm.log_var = number("log_var");
        nm.n = number("n");
        if (!site || !site->is_string() || site->get_string().empty() || !(nm.speed > 0) || !std::isfinite(nm.speed) ||
            !std::isfinite(nm.log_mean) || !(nm.log_var >= 0) || !std::isfinite(nm.log_var) || !(nm.n >= 1) ||
            !std::isfinite(nm.n))
          return bad(where + ", " + std::string(sname) +
                     ": a normal needs site (text), speed (> 0), log_mean (finite), log_var (>= 0) and n (>= 1)");
        nm.site = std::string(site->get_string());
        nm.n = std::min(nm.n, kSeedWeight);  // what this run sees soon outweighs it
        fam.normals[static_cast<std::size_t>(rs)].push_back(std::move(nm));
        ++count;
      }
    }
    loaded.emplace(std::string(fname), std::move(fam));
  }
  for (auto& [name, fam] : loaded) impl_->families_[name] = std::move(fam);
  return count;
}

std::size_t PolicyEngine::import_normals_file(const std::filesystem::path& file) {
  const std::string text = read_file(file, std::size_t{64} << 20);  // its errors name the file
  try {
    return import_normals(text);
  } catch (const Error& e) {
    throw Error(file.string() + ": " + e.what());
  }
}

std::size_t PolicyEngine::tracked_tasks() const noexcept { return impl_->tasks_.size(); }
std::size_t PolicyEngine::policy_count() const noexcept { return impl_->policies_.size(); }

bool retry_cannot_fix(std::optional<int> exit_code) noexcept { return exit_code && (*exit_code == 126 || *exit_code == 127); }

std::vector<Diagnostic> check_policies(const WorkflowSpec& spec) {
  try {
    PolicyEngine engine(spec);
  } catch (const SpecError& e) {
    return e.diagnostics();
  }
  return {};
}

}  // namespace diaspora::resilience
