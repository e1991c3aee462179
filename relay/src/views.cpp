#include "views.hpp"

#include <sys/resource.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <boost/describe.hpp>
#include <boost/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "diaspora/files.hpp"
#include "diaspora/site_health.hpp"

namespace diaspora::relay {

namespace json = boost::json;
namespace fs = std::filesystem;

// ---- the state ------------------------------------------------------------------------------

namespace view {

struct Attempt {
  std::int64_t attempt = 0;
  std::string site, worker, outcome = "running", reason;
  std::int64_t start_us = 0, end_us = 0;
};
BOOST_DESCRIBE_STRUCT(Attempt, (), (attempt, site, worker, outcome, reason, start_us, end_us))

// One progress report of a task that reports metrics of its own (a training job's loss,
// buffer fill, ...): the Training page's series.
struct MetricPoint {
  std::int64_t t_us = 0, step = -1;
  double progress = 0;
  std::map<std::string, double> values;
};
BOOST_DESCRIBE_STRUCT(MetricPoint, (), (t_us, step, progress, values))

// An evaluation a task reported (metrics with eval_after_task: a rehearsal job's accuracy
// or error on each task seen, after training on task `after_task`).
struct EvalRow {
  std::int64_t t_us = 0, step = -1, after_task = 0;
  std::map<std::string, double> values;
};
BOOST_DESCRIBE_STRUCT(EvalRow, (), (t_us, step, after_task, values))

struct Task {
  std::string workflow, task_id, name, state = "pending", site, worker, reason;
  std::string engine;  ///< the engine id of its events' source /diaspora/<workflow>/<engine>
  std::int64_t attempt = 0, submitted_us = 0, started_us = 0, ended_us = 0, last_heartbeat_us = 0, updated_us = 0;
  double progress = 0;
  double step_time_s = -1;       ///< the last step_time_s metric, -1 when none
  double anomaly_score = -1;     ///< the last predicted anomaly score about it, -1 when none
  std::int64_t anomaly_us = 0;
  std::string anomaly_explanation;
  std::vector<Attempt> attempts;  ///< the last 16
  std::int64_t beat_applied_us = 0;  ///< the last heartbeat read in full (see fast_heartbeat)
  std::map<std::string, double> metrics;  ///< the last value of each metric it reported (32 names at most)
  std::vector<MetricPoint> series;        ///< its last 64 reports with metrics other than step_time_s
  std::vector<EvalRow> evals;             ///< its last 64 evaluations
  /// A restart or migration of it was reported and no attempt has started since: a
  /// retryable failure then leaves it "recovering", not "failed".
  bool recovery = false;
  bool failure_retryable = false;  ///< its last failure said retryable (the attempt was lost, not its own error)
};
BOOST_DESCRIBE_STRUCT(Task, (),
                      (workflow, task_id, name, state, site, worker, reason, engine, attempt, submitted_us, started_us, ended_us,
                       last_heartbeat_us, updated_us, progress, step_time_s, anomaly_score, anomaly_us,
                       anomaly_explanation, attempts, beat_applied_us, metrics, series, evals, recovery, failure_retryable))

struct ScorePoint {
  std::int64_t t_us = 0;
  double score = 0;
  std::string series, detector;
  double forecast_eta_s = -1, forecast_threshold = -1;
  double threshold = -1;  ///< the policy's threshold on the score's scale, -1 when it has none there
  std::string policy;
};
BOOST_DESCRIBE_STRUCT(ScorePoint, (), (t_us, score, series, detector, forecast_eta_s, forecast_threshold, threshold, policy))

struct HealthPoint {
  std::int64_t t_us = 0;
  double health = 1;
};
BOOST_DESCRIBE_STRUCT(HealthPoint, (), (t_us, health))

// A fault an engine reported on a site (a resource.status whose metrics name fault_*: what
// diaspora run's fault injection and such report), for the timeline.
struct FaultMark {
  std::int64_t t_us = 0;
  std::string fault, resource, state;  ///< fault: the metric's name without "fault_"
  double value = 0;                    ///< its value (a factor; 0 when the fault ended)
};
BOOST_DESCRIBE_STRUCT(FaultMark, (), (t_us, fault, resource, state, value))

struct Site {
  std::string workflow, site, state = "up";
  std::string engine;  ///< the engine of the last attempt started there (where a drain goes)
  bool drained = false;  ///< an operator's drain was carried out (and no undrain since)
  std::int64_t started = 0, completed = 0, failed = 0, running = 0, predicted = 0, updated_us = 0;
  double rate = 0;          ///< completions per second, exponentially weighted (60 s)
  std::int64_t rate_us = 0;
  double failure_rate = 0;  ///< share of recent ends that were failures (EW, 0.1)
  double failures = 0;      ///< failures and migrations off it, decayed (decay_failures) to failures_us
  std::int64_t failures_us = 0;
  double health = 1;        ///< diaspora::site_health() of what the views see (site_health.hpp)
  std::string explanation;  ///< of the last prediction
  std::vector<ScorePoint> scores;  ///< the last 256 predictions about it
  std::vector<HealthPoint> history;  ///< health over time: its last 256 changes (one a second at most),
                                     ///< and a point every 10 s while events about the site come
  std::vector<FaultMark> faults;     ///< the last 64 faults reported on it
};
BOOST_DESCRIBE_STRUCT(Site, (),
                      (workflow, site, state, engine, drained, started, completed, failed, running, predicted, updated_us,
                       rate, rate_us, failure_rate, failures, failures_us, health, explanation, scores, history, faults))

struct Resource {
  std::string workflow, resource_id, kind, state, site;
  std::map<std::string, double> metrics;
  std::int64_t updated_us = 0;
};
BOOST_DESCRIBE_STRUCT(Resource, (), (workflow, resource_id, kind, state, site, metrics, updated_us))

struct Action {
  std::string workflow, action_id, action, task_id, site, target_site, reason, policy, origin, status = "pending", message;
  std::int64_t requested_us = 0, done_us = 0, seq = 0;
  std::int64_t attempt = -1;  ///< the deciding policy's attempt for the task or site; -1: not said
  bool budget_spent = false;  ///< the policy's one alert that its budget is spent (an alert, attempt 0)
};
BOOST_DESCRIBE_STRUCT(Action, (),
                      (workflow, action_id, action, task_id, site, target_site, reason, policy, origin, status, message,
                       requested_us, done_us, seq, attempt, budget_spent))

struct Workflow {
  std::string workflow;
  std::int64_t first_us = 0, last_us = 0, events = 0, data_items = 0, data_bytes = 0, anomalies = 0;
  std::map<std::string, std::int64_t> states;  ///< task instances per state
  std::map<std::string, json::value> engines;  ///< the last plugin.stats of each engine
  /// When the run ended: the time of the closing plugin.stats that left every engine of the
  /// workflow closed; 0 while one is open (a later task event opens it again: a new run).
  std::int64_t ended_us = 0;
};
BOOST_DESCRIBE_STRUCT(Workflow, (),
                      (workflow, first_us, last_us, events, data_items, data_bytes, anomalies, states, engines, ended_us))

}  // namespace view

struct Views::State {
  std::map<std::string, view::Task> tasks;  ///< keys: workflow \x1f id
  std::map<std::string, view::Site> sites;
  std::map<std::string, view::Resource> resources;
  std::map<std::string, view::Action> actions;
  std::map<std::string, view::Workflow> workflows;
  std::map<std::string, std::uint64_t> offsets;  ///< topic -> next offset to read
  std::uint64_t version = 0;
  std::int64_t action_seq = 0;
  std::deque<Change> changes;
  std::string note;
  // Not saved: the heartbeat fast path's index (workflow \x1f task id -> its instance; node
  // pointers of `tasks` stay valid until erased, and evict() clears it) and a key buffer.
  std::unordered_map<std::string, view::Task*> task_index;
  std::string key_buf;

  void changed(const char* v, const std::string& wf, const std::string& id) {
    ++version;
    if (!changes.empty() && changes.back().id == id && changes.back().view == v && changes.back().workflow == wf) {
      changes.back().version = version;  // the same item again: one change
      return;
    }
    changes.push_back({version, v, wf, id});
    if (changes.size() > 65536) changes.pop_front();
  }
};

namespace {

constexpr std::size_t kMaxAttempts = 16, kMaxScores = 256;
constexpr int kSnapshotFormat = 6;  // 3: sites carry failures, failures_us; 4: tasks carry recovery; 5: sites carry faults;
                                    // 6: actions carry attempt, budget_spent; workflows ended_us

std::string key(const std::string& wf, const std::string& id) { return wf + '\x1f' + id; }

std::string str(const json::object& o, std::string_view k) {
  const json::value* v = o.if_contains(k);
  return v && v->is_string() ? std::string(v->get_string()) : std::string();
}
double num(const json::object& o, std::string_view k, double dflt) {
  const json::value* v = o.if_contains(k);
  return v && v->is_number() ? v->to_number<double>() : dflt;
}

void add_failure(view::Site& s, std::int64_t t_us) {
  s.failures = decay_failures(s.failures, static_cast<double>(t_us - s.failures_us) / 1e6) + 1;
  s.failures_us = std::max(s.failures_us, t_us);
}

// A point of a site's health at each change, and one every 10 s while events about the site
// keep coming (update_health, and the task events' keep-alive in apply_event): a longer
// interval between two points is a silence, which a chart can show as a gap.
constexpr std::int64_t kKeepaliveUs = 10'000'000;

// How a site's health follows from what the views saw of it (diaspora::site_health: the
// policies' and the runner's definition too). Every engine publishing on the site counts.
void update_health(view::Site& s, std::int64_t now_us) {
  SiteHealthInputs in;
  if (!s.scores.empty() && now_us - s.scores.back().t_us < 60'000'000) in.anomaly = s.scores.back().score;
  in.state = site_state_factor(s.state);
  in.failure_rate = s.failure_rate;
  in.failures = decay_failures(s.failures, static_cast<double>(now_us - s.failures_us) / 1e6);
  s.health = site_health(in);
  if (!s.history.empty() && std::abs(s.history.back().health - s.health) < 0.01 &&
      now_us - s.history.back().t_us < kKeepaliveUs)
    return;
  if (s.history.size() > 1 && now_us - s.history[s.history.size() - 2].t_us < 1'000'000) {
    s.history.back() = {now_us, s.health};  // one point a second at most: the last one stands
    return;
  }
  s.history.push_back({now_us, s.health});
  if (s.history.size() > kMaxScores) s.history.erase(s.history.begin());
}

void decay_rate(view::Site& s, std::int64_t t_us) {
  if (s.rate_us > 0 && t_us > s.rate_us) s.rate *= std::exp(-static_cast<double>(t_us - s.rate_us) / 60e6);
  s.rate_us = std::max(s.rate_us, t_us);
}

// Applies one stored event. Returns false when it is not an event the views understand
// (not JSON, no type, missing ids): counted as skipped, nothing changed.
bool apply_event(Views::State& st, const std::string& wf, bool control_topic, std::int64_t t, const json::object& ev) {
  const std::string type = str(ev, "type");
  if (!type.starts_with("org.diaspora.")) return false;
  const json::value* dv = ev.if_contains("data");
  if (!dv || !dv->is_object()) return false;
  const json::object& d = dv->get_object();
  view::Workflow& w = st.workflows[wf];
  if (w.workflow.empty()) {
    w.workflow = wf;
    w.first_us = t;
  }
  w.last_us = std::max(w.last_us, t);
  ++w.events;  // the workflow's change is recorded once per batch read (read_topic)

  auto site_of = [&](const std::string& name) -> view::Site& {
    view::Site& s = st.sites[key(wf, name)];
    if (s.site.empty()) s.workflow = wf, s.site = name;
    s.updated_us = t;
    st.changed("sites", wf, name);
    return s;
  };

  if (type.starts_with("org.diaspora.task.")) {
    const std::string id = str(d, "task_id");
    if (id.empty()) return false;
    if (w.ended_us != 0 && t > w.ended_us) w.ended_us = 0;  // a task event after the end: a new run
    view::Task& k = st.tasks[key(wf, id)];
    const bool fresh = k.task_id.empty();
    if (fresh) k.workflow = wf, k.task_id = id, k.submitted_us = t;
    const std::string old_state = fresh ? "" : k.state;
    const std::string ev_kind = type.substr(std::string_view("org.diaspora.task.").size());
    // An attempt's end counted against (or for) its site.
    auto count_end = [&](const std::string& site, bool ok) {
      view::Site& s = site_of(site);
      (ok ? s.completed : s.failed)++;
      decay_rate(s, t);
      if (ok) s.rate += 1.0 / 60.0;
      s.failure_rate = 0.9 * s.failure_rate + (ok ? 0.0 : 0.1);
      if (!ok) add_failure(s, t);
      update_health(s, t);
    };
    // A late event of an earlier attempt (at a federated centre each site's events come
    // through a source of their own: attempt 2 may be seen done at one site before attempt
    // 1's failure at the other): it starts or ends that attempt's record only; the task
    // keeps the state of its latest attempt.
    // (The latest attempt is the latest one started: a restart or migration names the
    // attempt to come, and the failure of the running one may follow it.)
    // (A first submission names no attempt: it is attempt 1's.)
    const auto ev_attempt = std::max<std::int64_t>(static_cast<std::int64_t>(num(d, "attempt", 0)), ev_kind == "submitted" ? 1 : 0);
    const auto later_started = [&](const view::Attempt& x) { return x.attempt > ev_attempt; };
    if (!fresh && ev_attempt > 0 && std::any_of(k.attempts.begin(), k.attempts.end(), later_started)) {
      const bool ends = ev_kind == "completed" || ev_kind == "failed" || ev_kind == "cancelled";
      if (ev_kind != "started" && !ends) return false;  // nothing of it is the task's now
      auto it = std::find_if(k.attempts.begin(), k.attempts.end(), [&](const view::Attempt& x) { return x.attempt == ev_attempt; });
      if (it == k.attempts.end()) {
        view::Attempt rec;
        rec.attempt = ev_attempt;
        rec.site = str(d, "site");
        rec.worker = str(d, "worker");
        auto at = std::find_if(k.attempts.begin(), k.attempts.end(), later_started);  // kept in attempt order
        it = k.attempts.insert(at, std::move(rec));
        if (ev_kind == "started" && !it->site.empty()) ++site_of(it->site).started, ++site_of(it->site).running;
      }
      if (ev_kind == "started" && it->start_us == 0) it->start_us = t;
      if (ends && it->end_us == 0) {
        if (it->start_us != 0 && !it->site.empty()) {
          view::Site& s = site_of(it->site);
          s.running = std::max<std::int64_t>(0, s.running - 1);
        }
        it->outcome = ev_kind;
        it->reason = str(d, "reason");
        it->end_us = t;
        if (ev_kind != "cancelled" && !it->site.empty()) count_end(it->site, ev_kind == "completed");
      }
      if (k.attempts.size() > kMaxAttempts) k.attempts.erase(k.attempts.begin());
      k.updated_us = std::max(k.updated_us, t);
      st.changed("tasks", wf, id);
      return true;
    }
    k.updated_us = t;
    if (const std::string src = str(ev, "source"); src.starts_with("/diaspora/") && src.rfind('/') > 10)
      k.engine = src.substr(src.rfind('/') + 1);
    if (const double a = num(d, "attempt", 0); a > 0) k.attempt = static_cast<std::int64_t>(a);
    if (std::string s = str(d, "site"); !s.empty()) k.site = std::move(s);
    if (std::string s = str(d, "worker"); !s.empty()) k.worker = std::move(s);
    if (!k.site.empty())  // any event of a task there keeps the site's health line going
      if (auto it = st.sites.find(key(wf, k.site));
          it == st.sites.end() || it->second.history.empty() || t - it->second.history.back().t_us >= kKeepaliveUs)
        update_health(site_of(k.site), t);
    auto last_attempt = [&]() -> view::Attempt* {
      return k.attempts.empty() || k.attempts.back().attempt != k.attempt ? nullptr : &k.attempts.back();
    };
    auto end_attempt = [&](const char* outcome, const std::string& reason) {
      if (view::Attempt* a = last_attempt(); a && a->end_us == 0) {
        a->outcome = outcome;
        a->reason = reason;
        a->end_us = t;
        if (!a->site.empty()) {
          view::Site& s = site_of(a->site);
          s.running = std::max<std::int64_t>(0, s.running - 1);
        }
      }
    };
    if (ev_kind == "submitted") {
      k.state = "pending";
      if (std::string n = str(d, "name"); !n.empty()) k.name = std::move(n);
    } else if (ev_kind == "started") {
      k.state = "running";
      k.recovery = false;
      k.started_us = t;
      k.last_heartbeat_us = t;
      k.ended_us = 0;
      k.progress = 0;
      view::Attempt a;
      a.attempt = k.attempt;
      a.site = k.site;
      a.worker = k.worker;
      a.start_us = t;
      k.attempts.push_back(std::move(a));
      if (k.attempts.size() > kMaxAttempts) k.attempts.erase(k.attempts.begin());
      if (!k.site.empty()) {
        view::Site& s = site_of(k.site);
        ++s.started;
        ++s.running;
        if (!k.engine.empty()) s.engine = k.engine;  // where a drain of the site goes
      }
    } else if (ev_kind == "heartbeat" || ev_kind == "progress") {
      k.last_heartbeat_us = t;
      if (ev_kind == "heartbeat") k.beat_applied_us = t;
      if (ev_kind == "progress") k.progress = std::clamp(num(d, "progress", k.progress), 0.0, 1.0);
      if (const json::value* m = d.if_contains("metrics"); m && m->is_object()) {
        k.step_time_s = num(m->get_object(), "step_time_s", k.step_time_s);
        view::MetricPoint p;
        const bool eval = m->get_object().contains("eval_after_task");
        for (const auto& [name, v] : m->get_object()) {
          if (!v.is_number()) continue;
          const std::string n(name);
          if (!eval && (k.metrics.size() < 32 || k.metrics.count(n))) k.metrics[n] = v.to_number<double>();
          if (n != "step_time_s" && n != "eval_after_task") p.values[n] = v.to_number<double>();
        }
        if (eval) {
          view::EvalRow e{t, static_cast<std::int64_t>(num(d, "step", -1)),
                          static_cast<std::int64_t>(num(m->get_object(), "eval_after_task", 0)), std::move(p.values)};
          k.evals.push_back(std::move(e));
          if (k.evals.size() > 64) k.evals.erase(k.evals.begin());
        } else if (!p.values.empty()) {
          p.t_us = t;
          p.step = static_cast<std::int64_t>(num(d, "step", -1));
          p.progress = k.progress;
          k.series.push_back(std::move(p));
          if (k.series.size() > 64) k.series.erase(k.series.begin());
        }
      }
    } else if (ev_kind == "completed" || ev_kind == "failed" || ev_kind == "cancelled") {
      // A retryable failure with a restart or migration under way is a recovery, not the end.
      const json::value* retry = d.if_contains("retryable");
      k.failure_retryable = ev_kind == "failed" && retry && retry->is_bool() && retry->get_bool();
      const bool recovering = k.failure_retryable && k.recovery;
      k.state = recovering ? "recovering" : ev_kind;
      if (!recovering) k.recovery = false;
      k.ended_us = t;
      k.reason = str(d, "reason");
      if (ev_kind == "completed") k.progress = 1;
      end_attempt(ev_kind.c_str(), k.reason);
      if (ev_kind != "cancelled" && !k.site.empty()) count_end(k.site, ev_kind == "completed");
    } else if (ev_kind == "restarted" || ev_kind == "migrated") {
      k.reason = str(d, "reason");
      k.recovery = true;
      if (k.state == "failed") k.state = "recovering";
      if (ev_kind == "migrated") {
        if (!k.site.empty()) {  // a move off a site counts against it, as for the policies
          view::Site& from = site_of(k.site);
          add_failure(from, t);
          update_health(from, t);
        }
        k.site = str(d, "to_site");
      }
    } else {
      // Not a kind the views know: no instance made for it (it would count in no state:
      // the totals would disagree with the items; found by tests/fuzz/fuzz_views.cpp).
      if (fresh) st.tasks.erase(key(wf, id));
      return false;
    }
    if (fresh || old_state != k.state) {  // w.states counts every instance once (queries' totals)
      if (!fresh && --w.states[old_state] <= 0) w.states.erase(old_state);
      ++w.states[k.state];
    }
    st.changed("tasks", wf, id);
    return true;
  }

  if (type == "org.diaspora.anomaly.predicted") {
    ++w.anomalies;
    view::ScorePoint p;
    p.t_us = t;
    p.score = num(d, "score", 0);
    p.series = str(d, "series");
    p.detector = str(d, "detector");
    p.threshold = num(d, "score_threshold", -1);
    p.policy = str(d, "policy");
    if (const json::value* f = d.if_contains("forecast"); f && f->is_object()) {
      p.forecast_eta_s = num(f->get_object(), "eta_s", -1);
      p.forecast_threshold = num(f->get_object(), "threshold", -1);
    }
    const std::string explanation = str(d, "explanation");
    const std::string task = str(d, "task_id");
    std::string site = str(d, "site");
    if (!task.empty()) {
      view::Task& k = st.tasks[key(wf, task)];
      if (k.task_id.empty()) {
        k.workflow = wf, k.task_id = task, k.submitted_us = t;
        ++w.states[k.state];
      }
      k.anomaly_score = p.score;
      k.anomaly_us = t;
      k.anomaly_explanation = explanation;
      if (site.empty()) site = k.site;
      st.changed("tasks", wf, task);
    }
    if (!site.empty()) {
      view::Site& s = site_of(site);
      ++s.predicted;
      s.explanation = explanation;
      s.scores.push_back(std::move(p));
      if (s.scores.size() > kMaxScores) s.scores.erase(s.scores.begin());
      update_health(s, t);
    }
    return true;
  }

  // A restart or migration (or a speculative copy) of a known task puts it in recovery: a
  // retryable failure of its attempt then shows it recovering, not failed, until the next
  // attempt starts; an action that failed ends the recovery.
  auto recovery = [&](const std::string& task, const std::string& action, bool on) {
    if (task.empty() || (action != "restart" && action != "migrate" && action != "speculate")) return;
    auto it = st.tasks.find(key(wf, task));
    if (it == st.tasks.end()) return;
    view::Task& k = it->second;
    const std::string old_state = k.state;
    k.recovery = on;
    if (on && k.state == "failed" && k.failure_retryable) k.state = "recovering";
    if (!on && k.state == "recovering") k.state = "failed";
    if (k.state != old_state) {
      if (--w.states[old_state] <= 0) w.states.erase(old_state);
      ++w.states[k.state];
      st.changed("tasks", wf, task);
    }
  };

  if (type == "org.diaspora.action.requested") {
    const std::string id = str(d, "action_id");
    if (id.empty()) return false;
    view::Action& a = st.actions[key(wf, id)];
    if (a.action_id.empty()) a.workflow = wf, a.action_id = id, a.requested_us = t, a.seq = ++st.action_seq;
    a.action = str(d, "action");
    a.reason = str(d, "reason");
    a.task_id = str(d, "task_id");
    a.site = str(d, "site");
    a.target_site = str(d, "target_site");
    a.policy = str(d, "policy");
    a.origin = control_topic ? "operator" : "policy";
    if (const auto* n = d.if_contains("attempt"); n && n->is_int64() && n->get_int64() >= 0) a.attempt = n->get_int64();
    // A policy's alert is published for people: no engine answers it, so it never waits.
    if (a.action == "alert" && a.status == "pending") a.status = "raised";
    a.budget_spent = a.action == "alert" && a.attempt == 0;
    recovery(a.task_id, a.action, true);
    st.changed("actions", wf, id);
    return true;
  }
  if (type == "org.diaspora.action.done") {
    const std::string id = str(d, "action_id");
    if (id.empty()) return false;
    view::Action& a = st.actions[key(wf, id)];
    if (a.action_id.empty()) {  // its request is older than the log, or another engine's
      a.workflow = wf, a.action_id = id, a.requested_us = t, a.seq = ++st.action_seq;
      a.action = str(d, "action");
      a.task_id = str(d, "task_id");
    }
    a.status = str(d, "status");
    a.message = str(d, "message");
    a.done_us = t;
    // Declined as not needed (a duplicate: another action already did it, the task has
    // finished): the engines say so with this prefix. Not a failure to an operator.
    if (a.status == "failed" && (a.message.starts_with("not needed") || a.message.starts_with("refused: not needed")))
      a.status = "skipped";
    if (a.status == "done" && (a.action == "drain" || a.action == "undrain") && !a.site.empty())
      site_of(a.site).drained = a.action == "drain";
    if (a.status == "failed") recovery(a.task_id, a.action, false);
    st.changed("actions", wf, id);
    return true;
  }
  if (type == "org.diaspora.resource.status") {
    const std::string id = str(d, "resource_id");
    if (id.empty()) return false;
    view::Resource& r = st.resources[key(wf, id)];
    r.workflow = wf;
    r.resource_id = id;
    r.kind = str(d, "kind");
    r.state = str(d, "state");
    r.site = str(d, "site");
    r.updated_us = t;
    const std::string on_site = r.kind == "site" ? id : r.site;
    if (const json::value* m = d.if_contains("metrics"); m && m->is_object())
      for (const auto& [name, v] : m->get_object()) {
        if (!v.is_number()) continue;
        r.metrics[std::string(name)] = v.to_number<double>();
        if (name.starts_with("fault_") && !on_site.empty()) {
          view::Site& s = site_of(on_site);
          s.faults.push_back({t, std::string(name.substr(6)), id, r.state, v.to_number<double>()});
          if (s.faults.size() > 64) s.faults.erase(s.faults.begin());
        }
      }
    st.changed("resources", wf, id);
    if (r.kind == "site") {
      view::Site& s = site_of(id);
      s.state = r.state;
      update_health(s, t);
    }
    return true;
  }
  if (type == "org.diaspora.data.arrived") {
    ++w.data_items;
    w.data_bytes += static_cast<std::int64_t>(num(d, "bytes", 0));
    return true;
  }
  if (type == "org.diaspora.plugin.stats") {
    const std::string engine = str(d, "engine");
    if (engine.empty()) return true;
    w.engines[engine] = d;
    auto closed = [](const json::value& s) {
      const json::value* c = s.is_object() ? s.get_object().if_contains("closing") : nullptr;
      return c && c->is_bool() && c->get_bool();
    };
    if (!closed(d)) w.ended_us = 0;
    else if (std::all_of(w.engines.begin(), w.engines.end(), [&](const auto& e) { return closed(e.second); }))
      w.ended_us = t;
    return true;
  }
  return true;  // a known family with nothing to keep (metric, warnings): counted in the workflow
}

// Keeps the instances under the limit: the oldest finished ones go first.
void evict(Views::State& st, std::size_t max_instances) {
  if (st.tasks.size() <= max_instances + max_instances / 10) return;
  std::vector<std::pair<std::int64_t, std::string>> finished;
  for (const auto& [k, t] : st.tasks)
    if (t.state == "completed" || t.state == "failed" || t.state == "cancelled") finished.emplace_back(t.ended_us, k);
  std::sort(finished.begin(), finished.end());
  const std::size_t excess = st.tasks.size() - max_instances;
  for (std::size_t i = 0; i < std::min(excess, finished.size()); ++i) {
    auto it = st.tasks.find(finished[i].second);
    view::Workflow& w = st.workflows[it->second.workflow];
    if (--w.states[it->second.state] <= 0) w.states.erase(it->second.state);
    st.tasks.erase(it);
  }
  st.task_index.clear();
}

// A needle the fast path looks for. glibc's memmem builds a shift table on every call and
// a Boyer-Moore table competes with the log window for the cache; this compares 16 positions
// at once for the needle's first byte and its last byte that is not a quote (JSON is full of
// quotes), and checks the whole needle only where both match.
class Needle {
 public:
  explicit Needle(std::string_view s) : s_(s), anchor_(s.size() > 1 && s.back() == '"' ? s.size() - 2 : s.size() - 1) {}
  std::size_t in(std::string_view text) const {
    const std::size_t k = s_.size();
    if (text.size() < k) return std::string_view::npos;
    const char* p = text.data();
    const std::size_t last = text.size() - k;  // the last place the needle can start
    std::size_t i = 0;
#if defined(__SSE2__)
    const __m128i first = _mm_set1_epi8(s_[0]), anchor = _mm_set1_epi8(s_[anchor_]);
    for (; i + 16 <= last + 1; i += 16) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i + anchor_));
      auto m = static_cast<unsigned>(_mm_movemask_epi8(_mm_and_si128(_mm_cmpeq_epi8(a, first), _mm_cmpeq_epi8(b, anchor))));
      for (; m != 0; m &= m - 1)
        if (const std::size_t at = i + static_cast<std::size_t>(__builtin_ctz(m)); std::memcmp(p + at, s_.data(), k) == 0)
          return at;
    }
#endif
    for (; i <= last; ++i)
      if (p[i] == s_[0] && std::memcmp(p + i, s_.data(), k) == 0) return i;
    return std::string_view::npos;
  }
  std::size_t size() const { return s_.size(); }

 private:
  std::string_view s_;
  std::size_t anchor_;
};


// Heartbeats are most of what engines publish (one per running task per second or more
// often). One that comes within 250 ms (log time) of the last one read in full for the
// same instance only moves its last_heartbeat_us (and counts in its workflow): it is found
// in the text, without parsing it. Deterministic (log times), so a replay agrees. Returns
// false to have the record read in full: another type, an escaped id, an unknown instance,
// the first heartbeat in 250 ms, or one carrying an evaluation (eval_after_task).
bool fast_heartbeat(Views::State& st, view::Workflow* w, const std::string& wf, std::int64_t t, std::string_view text) {
  static const Needle kType(R"("type":"org.diaspora.task.heartbeat")"), kId(R"("task_id":")"),
      kEval(R"("eval_after_task")");
  if (!w || kType.in(text) == std::string_view::npos) return false;
  const auto at = kId.in(text);
  if (at == std::string_view::npos) return false;
  const auto begin = at + kId.size(), end = text.find('"', begin);
  if (end == std::string_view::npos || text.substr(begin, end - begin).find('\\') != std::string_view::npos) return false;
  st.key_buf.assign(wf).push_back('\x1f');
  st.key_buf.append(text.substr(begin, end - begin));
  auto it = st.task_index.find(st.key_buf);
  if (it == st.task_index.end()) {
    auto t_it = st.tasks.find(st.key_buf);
    if (t_it == st.tasks.end()) return false;
    it = st.task_index.emplace(st.key_buf, &t_it->second).first;
  }
  view::Task& k = *it->second;
  if (t - k.beat_applied_us < 250'000 && t >= k.beat_applied_us && kEval.in(text) == std::string_view::npos) {
    k.last_heartbeat_us = t;
    ++w->events;
    w->last_us = std::max(w->last_us, t);
    return true;
  }
  return false;
}

void evict_actions(Views::State& st, std::size_t max_actions) {
  if (st.actions.size() <= max_actions + max_actions / 10) return;
  std::vector<std::pair<std::int64_t, std::string>> order;
  for (const auto& [k, a] : st.actions) order.emplace_back(a.seq, k);
  std::sort(order.begin(), order.end());
  for (std::size_t i = 0; i < st.actions.size() - max_actions && i < order.size(); ++i) st.actions.erase(order[i].second);
}

// ---- snapshot -------------------------------------------------------------------------------

template <class T>
json::array dump(const std::map<std::string, T>& m) {
  json::array a;
  a.reserve(m.size());
  for (const auto& [k, v] : m) a.push_back(json::value_from(v));
  return a;
}

template <class T>
void load(const json::object& root, std::string_view name, std::map<std::string, T>& into,
          std::string (*key_of)(const T&)) {
  for (const auto& v : root.at(name).as_array()) {
    T item = json::value_to<T>(v);
    into[key_of(item)] = std::move(item);
  }
}

std::string task_key(const view::Task& t) { return key(t.workflow, t.task_id); }
std::string site_key(const view::Site& s) { return key(s.workflow, s.site); }
std::string resource_key(const view::Resource& r) { return key(r.workflow, r.resource_id); }
std::string action_key(const view::Action& a) { return key(a.workflow, a.action_id); }
std::string workflow_key(const view::Workflow& w) { return w.workflow; }

}  // namespace

std::string view_workflow_of(std::string_view topic) {
  if (topic.size() > 7 && topic.ends_with(".events")) return std::string(topic.substr(0, topic.size() - 7));
  if (const auto c = topic.find(".control."); c != std::string_view::npos && c > 0 && c + 9 < topic.size())
    return std::string(topic.substr(0, c));
  return {};
}

// ---- Views ----------------------------------------------------------------------------------

Views::Views(const Store& store, Options options) : store_(store), opt_(std::move(options)), st_(std::make_unique<State>()) {
  fs::create_directories(opt_.dir);
  const fs::path file = opt_.dir / "snapshot.json";
  if (!fs::exists(file)) {
    st_->note = "no snapshot: built from the log";
    return;
  }
  auto set_aside = [&](const std::string& why) {
    std::error_code ec;
    fs::rename(file, opt_.dir / "snapshot.json.bad", ec);
    *st_ = State{};
    st_->note = "snapshot set aside (" + why + "): rebuilt from the log";
  };
  try {
    const json::object root = json::parse(read_file(file)).as_object();
    if (root.at("format").to_number<int>() != kSnapshotFormat) {
      set_aside("another format");
      return;
    }
    State s;
    for (const auto& [topic, off] : root.at("offsets").as_object()) {
      const std::uint64_t o = off.to_number<std::uint64_t>();
      if (o > store_.committed_offset(std::string(topic))) {
        set_aside("it is ahead of the log on " + std::string(topic));
        return;
      }
      s.offsets[std::string(topic)] = o;
    }
    load(root, "tasks", s.tasks, task_key);
    load(root, "sites", s.sites, site_key);
    load(root, "resources", s.resources, resource_key);
    load(root, "actions", s.actions, action_key);
    load(root, "workflows", s.workflows, workflow_key);
    // The per-state counts are what queries' totals come from: recounted from the instances
    // (a snapshot written before every instance was counted once may disagree).
    for (auto& [wf, w] : s.workflows) w.states.clear();
    for (const auto& [k, t] : s.tasks) {
      view::Workflow& w = s.workflows[t.workflow];
      if (w.workflow.empty()) w.workflow = t.workflow;
      ++w.states[t.state];
    }
    s.version = root.at("version").to_number<std::uint64_t>();
    s.action_seq = root.at("action_seq").to_number<std::int64_t>();
    s.note = "snapshot loaded (version " + std::to_string(s.version) + ")";
    *st_ = std::move(s);
    snapshot_version_ = st_->version;
  } catch (const std::exception& e) {
    set_aside(e.what());
  }
}

void Views::stop() {
  {
    std::lock_guard lk(wake_mu_);
    stop_ = true;
  }
  wake_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Views::~Views() {
  stop();
  try {
    write_snapshot();
  } catch (const std::exception&) {
  }
}

void Views::start() {
  thread_ = std::thread([this] { run(); });
}

void Views::notify(const std::string& topic) {
  // On the log's committing thread: no allocation, and a wake-up only when the reader
  // sleeps waiting for one (under load it is busy or pausing, and reads everything next).
  if (!topic.ends_with(".events") && topic.find(".control.") == std::string::npos) return;
  if (pending_.exchange(true, std::memory_order_acq_rel)) return;
  {
    std::lock_guard lk(wake_mu_);
    woken_ = true;
  }
  wake_cv_.notify_one();
}

std::size_t Views::read_topic(const std::string& topic, std::size_t max_records) {
  const std::string wf = view_workflow_of(topic);
  const bool control = topic.find(".control.") != std::string::npos;
  std::uint64_t from;
  {
    std::shared_lock lk(mu_);
    auto it = st_->offsets.find(topic);
    from = it == st_->offsets.end() ? 0 : it->second;
  }
  from = std::max(from, store_.first_offset(topic));  // retention may have dropped what was not read
  // This thread is the views' only writer: it reads the state without the lock and takes
  // it exclusively only to change it, a chunk of records at a time (queries wait a fraction
  // of a millisecond, not a whole round), and never while the log is read from disk.
  constexpr std::size_t kChunk = 1024;
  std::unique_lock lk(mu_, std::defer_lock);
  std::size_t in_chunk = 0;
  auto wit = st_->workflows.find(wf);
  view::Workflow* w = wit == st_->workflows.end() ? nullptr : &wit->second;
  std::uint64_t next = from;
  alignas(std::max_align_t) unsigned char arena[16384];
  auto apply_one = [&](const Store::RecordRef& r) {
    if (fast_heartbeat(*st_, w, wf, r.time_us, r.payload)) {
      ++applied_;
      return;
    }
    json::monotonic_resource mr(arena, sizeof arena);
    boost::system::error_code ec;
    json::value v = json::parse(r.payload, ec, &mr);
    if (!ec && v.is_object() && apply_event(*st_, wf, control, r.time_us, v.get_object())) ++applied_;
    else ++skipped_;
    if (!w) {
      wit = st_->workflows.find(wf);
      w = wit == st_->workflows.end() ? nullptr : &wit->second;
    }
  };
  const std::size_t n = store_.visit(topic, from, max_records, 4u << 20, [&](const Store::RecordRef& r) {
    if (!lk.owns_lock()) lk.lock();
    next = r.offset + 1;
    apply_one(r);
    if (++in_chunk == kChunk) {  // a chunk applied: queries get their turn
      in_chunk = 0;
      st_->offsets[topic] = next;
      lk.unlock();
    }
  });
  if (!lk.owns_lock()) lk.lock();
  if (n == 0) return 0;
  if (w) st_->changed("workflows", wf, wf);  // its counters moved: one change for the batch
  st_->offsets[topic] = next;
  evict(*st_, opt_.max_instances);
  evict_actions(*st_, opt_.max_actions);
  return n;
}

std::size_t Views::catch_up() {
  std::size_t n = 0;
  for (const auto& topic : store_.topics()) {
    if (view_workflow_of(topic).empty()) continue;
    while (std::size_t k = read_topic(topic, 16384)) n += k;  // with visit's 4 MiB: one window read, all used
  }
  return n;
}

bool Views::caught_up() const {
  for (const auto& topic : store_.topics()) {
    if (view_workflow_of(topic).empty()) continue;
    std::shared_lock lk(mu_);
    auto it = st_->offsets.find(topic);
    const std::uint64_t at = it == st_->offsets.end() ? 0 : it->second;
    if (std::max(at, store_.first_offset(topic)) < store_.committed_offset(topic)) return false;
  }
  return true;
}

void Views::run() {
  // Below the I/O threads: under a full publish load the views fall behind and catch up
  // when it eases, rather than taking CPU from acknowledging publishes (Linux: per thread).
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  for (;;) {
    {
      std::unique_lock lk(wake_mu_);
      wake_cv_.wait_for(lk, std::chrono::milliseconds(500), [&] { return woken_ || stop_; });
      if (stop_) return;
      woken_ = false;
    }
    pending_.store(false, std::memory_order_release);
    try {
      catch_up();
      // At most every snapshot_interval, and spending at most a tenth of the time on it
      // (100,000 instances take about a second to write).
      const auto every = std::max<std::chrono::steady_clock::duration>(opt_.snapshot_interval, 10 * snapshot_cost_);
      if (std::chrono::steady_clock::now() - last_snapshot_ >= every) write_snapshot();
    } catch (const std::exception&) {
      // A read or a snapshot write failed (disk full?): the next wake-up tries again.
    }
    // Read in rounds at most every 20 ms: under a heavy load, few large batches.
    std::unique_lock lk(wake_mu_);
    if (wake_cv_.wait_for(lk, std::chrono::milliseconds(20), [&] { return stop_; })) return;
  }
}

void Views::write_snapshot() {
  std::lock_guard one(snapshot_mu_);
  const auto t0 = std::chrono::steady_clock::now();
  std::string text;
  {
    std::shared_lock lk(mu_);
    if (st_->version == snapshot_version_ && fs::exists(opt_.dir / "snapshot.json")) return;
    json::object offsets;
    for (const auto& [t, o] : st_->offsets) offsets[t] = o;
    json::object root{{"format", kSnapshotFormat},
                      {"version", st_->version},
                      {"action_seq", st_->action_seq},
                      {"offsets", std::move(offsets)},
                      {"tasks", dump(st_->tasks)},
                      {"sites", dump(st_->sites)},
                      {"resources", dump(st_->resources)},
                      {"actions", dump(st_->actions)},
                      {"workflows", dump(st_->workflows)}};
    text = json::serialize(root);
    snapshot_version_ = st_->version;
  }
  write_file_atomic(opt_.dir / "snapshot.json", text + "\n", 0600, Durability::file);
  last_snapshot_ = std::chrono::steady_clock::now();
  snapshot_cost_ = last_snapshot_ - t0;
}

std::string Views::snapshot_note() const {
  std::shared_lock lk(mu_);
  return st_->note;
}

std::uint64_t Views::version() const {
  std::shared_lock lk(mu_);
  return st_->version;
}

std::vector<Views::Change> Views::changes_since(std::uint64_t version, std::size_t max, bool* lost) const {
  std::shared_lock lk(mu_);
  std::vector<Change> out;
  if (lost) *lost = !st_->changes.empty() && version + 1 < st_->changes.front().version;
  auto it = std::lower_bound(st_->changes.begin(), st_->changes.end(), version + 1,
                             [](const Change& c, std::uint64_t v) { return c.version < v; });
  for (; it != st_->changes.end() && out.size() < max; ++it) out.push_back(*it);
  return out;
}

// ---- queries --------------------------------------------------------------------------------

namespace {

struct Page {
  std::size_t limit = 100;
  std::string after, workflow;
};

Page parse_page(const std::map<std::string, std::string>& params, const std::vector<std::string>& filters,
                std::string_view view) {
  Page p;
  for (const auto& [k, v] : params) {
    if (k == "limit") {
      std::size_t n = 0;
      std::size_t used = 0;
      try {
        n = std::stoul(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != v.size() || n < 1 || n > 1000) throw ViewQueryError("limit must be a whole number from 1 to 1000, not '" + v + "'");
      p.limit = n;
    } else if (k == "after") {
      p.after = v;
    } else if (k == "workflow") {
      p.workflow = v;
    } else if (std::find(filters.begin(), filters.end(), k) == filters.end()) {
      std::string known = "workflow, limit, after";
      for (const auto& f : filters) known += ", " + f;
      throw ViewQueryError("unknown parameter '" + k + "' for the " + std::string(view) + " view (known: " + known + ")");
    }
  }
  return p;
}

// Pages through a keyed map in key order: the items that pass `keep`, `limit` of them after
// the cursor (the last key of the previous page), the total that pass, the next cursor. With
// `known_total` (counted as the views change: Workflow::states) the walk starts at the cursor
// and stops one item past the page instead of counting the whole range.
template <class T, class Keep>
json::object page_of(std::string_view view, const std::map<std::string, T>& m, const Page& p, Keep keep,
                     std::uint64_t version, std::optional<std::size_t> known_total = std::nullopt) {
  json::array items;
  std::size_t total = 0;
  std::string last;
  bool more = false;
  auto from = p.workflow.empty() ? m.begin() : m.lower_bound(p.workflow);
  if (known_total && !p.after.empty() && from != m.end()) {
    auto past = m.upper_bound(p.after);
    if (past == m.end() || past->first > from->first) from = past;
  }
  for (auto it = from; it != m.end(); ++it) {
    if (!p.workflow.empty() && !(it->first.starts_with(p.workflow) &&
                                 (it->first.size() == p.workflow.size() || it->first[p.workflow.size()] == '\x1f')))
      break;
    if (!keep(it->second)) continue;
    ++total;
    if (!p.after.empty() && it->first <= p.after) continue;
    if (items.size() < p.limit) {
      items.push_back(json::value_from(it->second));
      last = it->first;
    } else {
      more = true;
      if (known_total) break;
    }
  }
  if (known_total) total = *known_total;
  return json::object{{"view", view}, {"items", std::move(items)}, {"total", static_cast<std::int64_t>(total)},
                      {"next", more ? json::value(last) : json::value(nullptr)}, {"version", version}};
}

// How long an action may go unanswered (no action.done from an engine) before the actions
// view shows it expired.
constexpr std::int64_t kActionAnswerUs = 60'000'000;

// A filter parameter: the value asked for, or none (everything passes).
class Want {
 public:
  Want(const std::map<std::string, std::string>& q, const char* k) {
    if (auto it = q.find(k); it != q.end()) v_ = &it->second;
  }
  bool operator()(const std::string& x) const { return !v_ || *v_ == x; }

 private:
  const std::string* v_ = nullptr;
};

// may_read() asked once per run of items of one workflow (items come grouped by workflow).
class Access {
 public:
  explicit Access(const std::function<bool(const std::string&)>& f) : f_(f) {}
  bool operator()(const std::string& wf) {
    if (!last_ || *last_ != wf) last_ = &wf, ok_ = f_(wf);
    return ok_;
  }

 private:
  const std::function<bool(const std::string&)>& f_;
  const std::string* last_ = nullptr;
  bool ok_ = false;
};

// The tasks a query passes, from the workflows' per-state counts, where the only filter is
// the state (the console's list and its state tabs): no walk over every instance. Otherwise
// none (page_of counts as it walks).
std::optional<std::size_t> known_task_total(const Views::State& s, const Page& p,
                                            const std::map<std::string, std::string>& q,
                                            const std::function<bool(const std::string&)>& may_read) {
  for (const char* k : {"site", "name", "q"})
    if (q.contains(k)) return std::nullopt;
  const auto st = q.find("state");
  auto count = [&](const view::Workflow& w) -> std::size_t {
    if (!may_read(w.workflow)) return 0;
    if (st != q.end()) {
      auto it = w.states.find(st->second);
      return it == w.states.end() ? 0 : static_cast<std::size_t>(it->second);
    }
    std::size_t n = 0;
    for (const auto& [state, c] : w.states) n += static_cast<std::size_t>(c);
    return n;
  };
  if (!p.workflow.empty()) {
    auto it = s.workflows.find(p.workflow);
    return it == s.workflows.end() ? 0 : count(it->second);
  }
  std::size_t n = 0;
  for (const auto& [wf, w] : s.workflows) n += count(w);
  return n;
}

}  // namespace

std::string Views::engine_of(const std::string& workflow, const std::string& task_id) const {
  std::shared_lock lk(mu_);
  auto it = st_->tasks.find(key(workflow, task_id));
  return it == st_->tasks.end() ? std::string() : it->second.engine;
}

std::string Views::engine_of_site(const std::string& workflow, const std::string& site) const {
  std::shared_lock lk(mu_);
  auto it = st_->sites.find(key(workflow, site));
  return it == st_->sites.end() ? std::string() : it->second.engine;
}

json::object Views::query(std::string_view view, const std::map<std::string, std::string>& q,
                          const std::function<bool(const std::string&)>& may_read) const {
  std::shared_lock lk(mu_);
  const State& s = *st_;
  Access may(may_read);
  if (view == "workflows") {
    const Page p = parse_page(q, {}, view);
    return page_of(view, s.workflows, p, [&](const view::Workflow& w) { return may(w.workflow); }, s.version);
  }
  if (view == "tasks") {
    const Page p = parse_page(q, {"state", "site", "name", "q"}, view);
    const Want state(q, "state"), site(q, "site"), name(q, "name");
    const auto sub = q.find("q");
    return page_of(view, s.tasks, p, [&](const view::Task& t) {
      return may(t.workflow) && state(t.state) && site(t.site) && name(t.name) &&
             (sub == q.end() || t.task_id.find(sub->second) != std::string::npos);
    }, s.version, known_task_total(s, p, q, may_read));
  }
  if (view == "sites") {
    const Page p = parse_page(q, {"state"}, view);
    const Want state(q, "state");
    return page_of(view, s.sites, p, [&](const view::Site& x) { return may(x.workflow) && state(x.state); }, s.version);
  }
  if (view == "resources") {
    const Page p = parse_page(q, {"kind", "state", "site"}, view);
    const Want kind(q, "kind"), state(q, "state"), site(q, "site");
    return page_of(view, s.resources, p, [&](const view::Resource& r) {
      return may(r.workflow) && kind(r.kind) && state(r.state) && site(r.site);
    }, s.version);
  }
  if (view == "actions") {
    const Page p = parse_page(q, {"status", "action", "task_id", "origin", "budget_spent"}, view);
    const Want status(q, "status"), action(q, "action"), task(q, "task_id"), origin(q, "origin"),
        budget(q, "budget_spent");
    const std::int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::system_clock::now().time_since_epoch()).count();
    auto unanswered = [&](const view::Action& a) { return a.status == "pending" && now - a.requested_us > kActionAnswerUs; };
    json::object page = page_of(view, s.actions, p, [&](const view::Action& a) {
      return may(a.workflow) && status(unanswered(a) ? "expired" : a.status) && action(a.action) && task(a.task_id) &&
             origin(a.origin) && budget(a.budget_spent ? "true" : "false");
    }, s.version);
    // An action no engine answered in time is shown expired, with the likely reason (an
    // answer that comes later still turns it done or failed).
    for (auto& item : page["items"].as_array()) {
      json::object& o = item.as_object();
      if (o["status"] != "pending" || now - o["requested_us"].to_number<std::int64_t>() <= kActionAnswerUs) continue;
      o["status"] = "expired";
      o["message"] = "no engine answered it within " + std::to_string(kActionAnswerUs / 1'000'000) +
                     " s: none may be reading the workflow's control topic (has the run ended?)";
    }
    return page;
  }
  if (view == "consumers") {
    const Page p = parse_page(q, {"topic"}, view);
    const Want want_topic(q, "topic");
    std::map<std::string, json::object> groups;
    for (const auto& [g, topic, off] : store_.group_offsets()) {
      const std::string wf = view_workflow_of(topic);
      if (!want_topic(topic) || (!p.workflow.empty() && wf != p.workflow) || !may_read(wf.empty() ? topic : wf)) continue;
      const std::uint64_t end = store_.committed_offset(topic);
      groups[key(g, topic)] = json::object{{"group", g}, {"topic", topic}, {"offset", off}, {"end", end},
                                           {"lag", end > off ? end - off : 0}};
    }
    Page all = p;
    all.workflow.clear();
    return page_of(view, groups, all, [](const json::object&) { return true; }, s.version);
  }
  throw ViewQueryError("no view '" + std::string(view) + "' (views: workflows, tasks, sites, resources, actions, consumers)");
}

}  // namespace diaspora::relay
