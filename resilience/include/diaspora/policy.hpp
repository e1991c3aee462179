// Diaspora's resilience engine, decision part: the spec's `policies` compiled into rules
// over the detectors of diaspora/resilience.hpp (anomaly scores, phi-accrual suspicion,
// completion and threshold forecasts), with hysteresis (`for:`), cooldowns, attempt
// budgets (`max_attempts`) and target-site choice by a health score. The output is a list
// of Decisions (restart, migrate, speculate, checkpoint, throttle, alert), each with a
// reason a person can read. docs/anomaly.md, section "Policies", describes the rules.
//
// Beside the spec's policies runs a default protection set unless the spec says
// `defaults: off` (docs/anomaly.md, "Default protection"): default-retry (a lost attempt,
// not the task's own error, is restarted, off a suspect site, 3 times), default-revive
// (phi-accrual on heartbeats, restart) and, with two sites or more, default-slow (an
// attempt whose step time is worse than its task's normal for 2 steps is migrated) and
// default-deadline (a task forecast to miss its deadline gets a speculative copy). A spec
// policy on the same signal takes a default's place for the targets it names (for every
// task when it names none). `defaults: observe` turns the default set's decisions into
// alerts. A task's normal is learned per task family (its spec task: every instance and
// attempt) and per site, from the first value on, and compared across sites by their
// declared speeds: detector `relative`, and the ensemble while it warms up.
//
// Pure computation: no I/O, no threads, no clocks. Every call carries the time `now` (or
// Observation::time_s) in seconds, any epoch, non-decreasing across calls; a call with an
// earlier time is evaluated at that time but never moves the engine's clock back. Given
// the same spec and the same calls, the decisions are the same.
//
// Cost: observe() is O(policies on that signal + log tasks); it allocates when it first
// sees a task (its state) or a (task, policy) pair (that policy's detector, once), and
// when it emits a Decision (the strings); otherwise not. tick() is O(tasks x time-driven
// policies + sites). Memory: per live task a map entry (its id, a PhiAccrual, a
// CompletionForecaster, one small slot per policy) plus, per (task, policy) that has seen
// an observation, one heap-allocated detector sized by the largest kind (an Ensemble,
// 3,936 B with its context table and resonance categories, both unused here:
// PolicyOptions::ensemble.context_weight 0, resonance_weight 0); per spec site a fixed amount. Sizes were not measured beyond sizeof(Ensemble). Finished tasks are forgotten (task_finished()), and so are
// tasks silent for PolicyOptions::task_ttl_s.
//
// @par Thread Safety
// Not thread-safe: one PolicyEngine is driven by one thread (the engine plugin's publisher
// thread), or callers serialise. const member functions may run concurrently with each
// other when no thread mutates the engine.
//
// Errors: the constructor throws diaspora::SpecError (a diaspora::Error) listing every
// policy it cannot compile, each as "FILE:LINE:COL: error: policies[I].KEY: message" at
// the policy's position in the spec file. Nothing else throws except std::bad_alloc:
// unknown signals, tasks or sites in observations are ignored, non-finite values too.
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "diaspora/resilience.hpp"
#include "diaspora/spec.hpp"

namespace diaspora::resilience {

/// One value of one series. `signal` is one of the spec's signals: task.step_time,
/// task.runtime, task.queue_wait, task.heartbeat_gap (seconds since the last heartbeat as
/// of time_s; 0 when one just arrived), task.progress_rate, task.deadline_slack,
/// task.failures (failures since the last observation), site.throughput,
/// site.queue_length, site.failure_rate (in [0, 1]), site.heartbeat_gap, resource.cpu,
/// resource.memory, resource.gpu. task.* need task_id; site.* need site (a spec site);
/// resource.* are per task when task_id is set, else per site.
/// The views only need to live for the call.
struct Observation {
  std::string_view task_id, site, signal;
  double value = 0;
  double time_s = 0;
};

/// One action the engine asks for (org.diaspora.action.requested), with what fired it
/// (org.diaspora.anomaly.predicted).
struct Decision {
  std::string action;       ///< restart | migrate | speculate | checkpoint | throttle | alert
  std::string task_id;      ///< empty for a site-scoped decision
  std::string site;         ///< where the task runs / the site concerned
  std::string target_site;  ///< migrate / speculate: the chosen site; restart: the same site
  std::string policy;       ///< the policy's name
  std::string reason;       ///< one readable line (docs/anomaly.md, "Reason format")
  int attempt = 0;          ///< 1-based number of this policy's action for this task (or
                            ///< site); 0 for the one alert saying the budget is spent; -1 for
                            ///< an alert outside the budget (a failure no retry can fix)
  double score = 0;         ///< [0, 1]: ensemble score; 1 - 10^-phi; surprise/23 nats for
                            ///< z and CUSUM detectors; 1 for threshold and forecast rules
  std::string signal;       ///< e.g. "task.step_time"
  std::string detector;     ///< the policy's detector
  std::string explanation;  ///< the detector's own account (explain(Score) for ensemble)
  double value = 0;         ///< the value compared with the threshold (score, z, phi, ...)
  double threshold = 0;     ///< the threshold it was compared with
  /// The same threshold on the score's scale (where `score` would reach it); NaN for
  /// threshold and forecast rules, whose score is always 1.
  double score_threshold = std::numeric_limits<double>::quiet_NaN();
  double time_s = 0;        ///< when it was decided
  std::optional<double> eta_s;  ///< forecast detectors: predicted completion / crossing time
};

/// Tunables that the spec does not carry. Defaults are the documented behaviour.
struct PolicyOptions {
  /// Ensemble used by `detector: ensemble` (re-alert suppression off: cooldown and
  /// `for:` do that job here).
  Ensemble::Config ensemble = [] {
    Ensemble::Config c;
    c.suppress = 0;
    c.alert_score = 0;  // the policy's own threshold compares the ensemble's score as it is
    c.context_weight = 0;  // not yet measured against the workflow corpus (bench/run): off for policies
    // Workflow signals (docs/anomaly.md, "Workflow traces"): a plain level for the
    // level-only model (a stalled heartbeat no longer biases it) and the likelihood
    // tail-calibrated (late heartbeats that recur stop alerting).
    c.forecaster.plain_level = true;
    c.calibrate_likelihood = true;
    // An anomaly must last 3 s (the last three values of a 1 Hz signal): a heartbeat gap
    // that a late beat lifts for a moment no longer alerts; a signal sampled every 3 s or
    // less often is judged on each value as before. And what alerts that long is not learned
    // as normal, so a first stall does not hide the second (docs/anomaly.md, "An anomaly
    // must last").
    c.sustain_s = 3;
    c.learn_sustained = false;
    return c;
  }();
  /// Phi-accrual for heartbeat policies: as PhiAccrual's, plus an acceptable pause of 1 s
  /// (Akka's acceptable-heartbeat-pause): heartbeats 40 ms apart would otherwise be
  /// suspected after a 60 ms scheduling hiccup (the std floor is 10 % of the mean gap).
  PhiAccrual::Config phi = [] {
    PhiAccrual::Config c;
    c.acceptable_pause = 1.0;
    return c;
  }();
  /// An `ensemble` policy with no `threshold:` written compares the score with 0.5, or with
  /// quiet_threshold on a **quiet series**: one at least quiet_min_hours old whose score has
  /// reached quiet_threshold at most quiet_rate_per_hour times an hour on average since its
  /// first value (each run of values at or over it counts once, whether it decided or not).
  /// A per-value threshold made for a 1 Hz signal is 60 times stricter an hour on a signal
  /// sampled once a minute (a site's throughput), and there it misses most lost nodes; a
  /// series that has proved quiet at the lower level may use it, so the lower level can
  /// never cost more than quiet_rate_per_hour alerts an hour over the series' life
  /// (docs/anomaly.md, "A quiet series may alert lower"). quiet_threshold 0, or >= 0.5: off.
  double quiet_threshold = 0.3;
  double quiet_rate_per_hour = 0.1;
  double quiet_min_hours = 2.0;
  int min_heartbeats = 3;           ///< heartbeats before phi is evaluated
  int min_observations = 10;        ///< ewma / holt-winters / cusum / forecast warm-up
  double forecast_horizon_s = 300;  ///< `forecast` fires when the crossing is this close
  double health_alpha = 0.1;        ///< EW weight of one evaluation in a site's anomaly level
  double failure_half_life_s = 600; ///< decay of a site's failure count (kSiteFailureHalfLifeS)
  double min_target_health = 0.1;   ///< migrate/speculate never pick a site below this
  double task_ttl_s = 6 * 3600.0;   ///< tasks silent this long are forgotten (by tick())
};

/// The parts of a site's health score (diaspora::site_health() of them, site_health.hpp).
struct SiteHealth {
  double health = 0;        ///< [0, 1]
  double speed = 0;         ///< declared speed / fastest declared speed
  double queue = 0;         ///< site.queue_length, else running tasks beyond `workers`
  std::int64_t workers = 1;
  double failures = 0;      ///< decayed count (task.failures, restarts and migrations off it)
  double failure_rate = 0;  ///< last site.failure_rate, clamped to [0, 1]
  double anomaly = 0;       ///< EW mean of the site's evaluations (score or over-threshold)
};

/// Compiles a WorkflowSpec's policies and evaluates them. See the file comment for the
/// cost, thread-safety and error contract.
class PolicyEngine {
 public:
  /// Throws diaspora::SpecError (located at the offending policy) if a policy cannot be
  /// compiled: unknown signal/detector/site/target, phi-accrual on a non-heartbeat signal,
  /// `threshold`/`forecast` without `threshold:`, an ensemble threshold outside (0, 1], a
  /// task action (restart, migrate, speculate, checkpoint) on a site.* signal, a site.*
  /// signal whose targets name no site, migrate/speculate with fewer than two sites.
  explicit PolicyEngine(const WorkflowSpec& spec, PolicyOptions options = {});
  ~PolicyEngine();
  PolicyEngine(PolicyEngine&&) noexcept;
  PolicyEngine& operator=(PolicyEngine&&) noexcept;
  PolicyEngine(const PolicyEngine&) = delete;
  PolicyEngine& operator=(const PolicyEngine&) = delete;

  /// A (new attempt of a) task started on `site`. Resets the task's detectors, heartbeat
  /// history and progress forecast (a new attempt is a new series); keeps its cooldowns,
  /// attempt counts and deadline. deadline_s is relative to `now` (as the spec's
  /// `deadline:`); nullopt: the spec task's deadline, if any. The first deadline a task
  /// gets is kept across attempts.
  void task_started(std::string_view task, std::string_view site, double now,
                    std::optional<double> deadline_s);
  /// Progress fraction in [0, 1]; feeds the task's completion forecast, from which
  /// tick() derives task.deadline_slack (deadline - expected completion, seconds) and
  /// task.progress_rate (fraction per second), unless the task's caller observes those
  /// signals itself (then only the observed values are used).
  void task_progress(std::string_view task, double fraction, double now);
  /// A heartbeat of the task (phi-accrual input; evaluated by tick()).
  void heartbeat(std::string_view task, std::string_view site, double now);
  /// How an attempt failed, as far as the engine knows.
  struct Failure {
    /// error: the task's own (an exception, a non-zero exit status); lost: its worker,
    /// node or process died. unknown: an exit_code set and not 0 is an error, else lost.
    enum class Kind { unknown, error, lost };
    Kind kind = Kind::unknown;
    std::optional<int> exit_code;  ///< a command's exit status; 126 and 127 are never retried
    bool engine_retries = false;   ///< the engine retries it itself: no policy retries it too
  };
  /// An attempt of the task failed. The failure of an attempt that a restart or migrate
  /// decision stopped is the consequence of that decision and is ignored. default-retry
  /// acts on lost attempts only (f.kind; not on the task's own errors, which the spec's
  /// task.failures policies may still retry). A failure a
  /// retry cannot fix (exit 126 or 127) gives one `alert` (policy default-retry) instead
  /// of any retry, and does not count against the site. Otherwise it is one
  /// task.failures observation (value 1), whose restart/migrate/speculate policies are
  /// skipped when f.engine_retries. Keeps the task's budgets (a next attempt may come).
  void task_failed(std::string_view task, std::string_view site, double now, const Failure& f,
                   std::vector<Decision>& out);
  /// The task will not run again (completed, or failed for good): forget it. Do not call
  /// between attempts, or its attempt budgets are forgotten too.
  void task_finished(std::string_view task, double now);

  /// Evaluates the policies on o.signal that watch this task/site; appends decisions.
  void observe(const Observation& o, std::vector<Decision>& out);
  /// Time-driven checks: phi-accrual on heartbeat silence (tasks and sites), deadline
  /// slack and progress rate from the completion forecast; forgets silent tasks. Call it regularly (e.g. every second); each
  /// call is one observation for `for:` of those policies.
  void tick(double now, std::vector<Decision>& out);

  /// Health in [0, 1] of a spec site (0 for an unknown one), at the engine's clock.
  double site_health(std::string_view site) const;
  /// The same with its parts; nullopt for an unknown site.
  std::optional<SiteHealth> site_health_detail(std::string_view site) const;

  /// What the engine learned that a later run of the same workflow can start from (docs/
  /// anomaly.md, "Normals across runs"): each task family's normal per site and relative
  /// series, as JSON text: {"version": 1, "workflow": NAME, "families": {FAMILY: {SERIES:
  /// [{"site", "speed", "log_mean", "log_var", "n"}]}}}. Normals of fewer than 3 values are
  /// left out. Same thread as the other calls.
  std::string export_normals() const;
  /// Seeds the task normals from export_normals() text of an earlier run of the same
  /// workflow; each counts as at most 10 values, so what this run sees soon outweighs it.
  /// Call before the first observation. Returns how many site normals were loaded.
  /// @throws diaspora::Error ("normals: " and what is wrong, where) for text that is not
  ///         such an export (not JSON, another version, another workflow's, a field out of
  ///         range); nothing is loaded then.
  std::size_t import_normals(std::string_view text);
  /// import_normals() of the file at `file` (at most 64 MiB).
  /// @throws diaspora::Error naming the file: it cannot be read, or "FILE: normals: ..." as
  ///         import_normals() says.
  std::size_t import_normals_file(const std::filesystem::path& file);

  /// Tasks currently tracked (for tests and memory accounting).
  std::size_t tracked_tasks() const noexcept;
  /// Number of compiled policies, the default set's included.
  std::size_t policy_count() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// How many times default-retry restarts a task's lost attempts (Ray's default for system
/// failures); an engine that waits for those retries (diaspora run) counts the same.
inline constexpr int kDefaultRetries = 3;

/// Whether a command's exit status is one a retry cannot fix (126 not executable, 127 not
/// found): no policy retries it. Thread-safe.
bool retry_cannot_fix(std::optional<int> exit_code) noexcept;

/// The problems the policy engine finds compiling `spec`'s policies: the checks only it can
/// make (a detector on a signal it cannot read, phi-accrual on what is not a heartbeat),
/// each at its place in the spec file. Empty when every policy compiles. Thread-safe.
std::vector<Diagnostic> check_policies(const WorkflowSpec& spec);

}  // namespace diaspora::resilience
