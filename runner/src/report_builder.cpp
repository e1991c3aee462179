#include "report_builder.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <span>

#include "diaspora/event.hpp"
#include "report_json.hpp"
#include "resume.hpp"

namespace diaspora::runner {

namespace json = boost::json;

namespace {

// A time in seconds to the millisecond, null when it did not happen (< 0).
json::value opt_t(double t) { return t >= 0 ? json::value(std::round(t * 1000) / 1000) : json::value(nullptr); }

json::object instance_object(const Context& ctx, const Instance& inst, long& misses, long& with_deadline, long& attempts) {
  const TaskSpec& ts = ctx.task(inst.task);
  json::object o{{"id", inst.id}, {"task", ts.name}, {"state", to_string(inst.state)},
                 {"submitted_s", opt_t(inst.submitted_t)}, {"end_s", opt_t(inst.end_t)}};
  if (!inst.reason.empty()) o["reason"] = inst.reason;
  if (inst.restored) o["restored"] = true;
  if (ctx.is_job(inst.task)) o["rehearsal"] = ctx.job_dir(inst.task).string();
  if (ts.deadline && !inst.restored) {
    ++with_deadline;
    const bool met = inst.state == InstanceState::completed && inst.end_t - inst.submitted_t <= ts.deadline->count();
    misses += !met;
    o["deadline_s"] = ts.deadline->count();
    o["deadline_met"] = met;
  }
  if (!inst.result.empty()) o["result"] = inst.result;
  json::array as;
  for (const auto& a : inst.attempts) {
    ++attempts;
    json::object x{{"number", a.number}, {"id", a.hook_id}, {"cause", a.cause}, {"outcome", to_string(a.outcome)},
                   {"site", a.site}, {"start_s", opt_t(a.start_t)}, {"end_s", opt_t(a.end_t)}};
    if (a.slot >= 0) x["worker"] = worker_name(a.site, a.slot);
    if (!a.reason.empty()) x["reason"] = a.reason;
    if (a.speculative) x["speculative"] = true;
    as.push_back(std::move(x));
  }
  o["attempts"] = std::move(as);
  return o;
}

// A fault with what it hit: for each instance, when its first attempt after the fault
// started running, and the reaction time from the fault's start to then.
json::object fault_object(const InstanceStore& store, const Fault& f, std::vector<double>& reactions) {
  json::object o{{"kind", to_string(f.spec->kind)}, {"at_s", f.spec->at.count()}, {"start_s", opt_t(f.start_t)},
                 {"end_s", opt_t(f.end_t)}};
  if (f.spec->site) o["site"] = *f.spec->site;
  if (f.spec->task) o["task"] = *f.spec->task;
  if (f.spec->kind == FaultKind::slow_site || f.spec->kind == FaultKind::slow_task) o["factor"] = f.spec->factor;
  if (!f.target.empty()) o["target"] = f.target;
  if (!f.note.empty()) o["note"] = f.note;
  json::array hits;
  for (const auto& [ii, n] : f.hit) {
    const Instance& inst = store.at(ii);
    json::object h{{"instance", inst.id}, {"state", to_string(inst.state)}};
    double recovered = -1;
    for (std::size_t k = n; k < inst.attempts.size(); ++k)
      if (inst.attempts[k].start_t >= 0 && (recovered < 0 || inst.attempts[k].start_t < recovered))
        recovered = inst.attempts[k].start_t;
    h["recovering_attempt_running_s"] = opt_t(recovered);
    h["reaction_s"] = recovered >= 0 ? opt_t(recovered - f.start_t) : json::value(nullptr);
    if (recovered >= 0) reactions.push_back(recovered - f.start_t);
    hits.push_back(std::move(h));
  }
  o["hit"] = std::move(hits);
  return o;
}

}  // namespace

json::array build_incidents(const json::object& r) {
  using report_json::arr, report_json::num, report_json::str;
  struct Incident {
    json::array faults, evidence, decisions;
    double first = 1e300, first_fault = -1, first_decision = -1;
    bool budget_spent = false;
  };
  std::map<std::string, Incident> by;
  for (const auto& f : arr(r, "faults")) {
    const auto& fo = f.as_object();
    const double start = num(fo, "start_s");
    for (const auto& h : fo.at("hit").as_array()) {
      Incident& in = by[str(h.as_object(), "instance")];
      in.faults.push_back(json::object{{"kind", fo.at("kind")}, {"start_s", opt_t(start)}, {"target", str(fo, "target")}});
      if (start >= 0 && (in.first_fault < 0 || start < in.first_fault)) in.first_fault = start;
      in.first = std::min(in.first, start);
    }
  }
  // A decision on an instance: an action the engine received, or an alert read back from
  // the topic (published for people only). The evidence is what its reason names before
  // what it decided ("...; migrate to ...").
  auto decided = [&](const std::string& task, double t, json::object d, const std::string& reason, bool spent) {
    Incident& in = by[instance_of(task)];
    d["at_s"] = opt_t(t);
    d["evidence"] = reason.substr(0, reason.find("; "));
    in.budget_spent |= spent;
    auto at = std::find_if(in.decisions.begin(), in.decisions.end(),
                           [&](const json::value& x) { return num(x.as_object(), "at_s", 1e300) > t; });
    in.decisions.insert(at, std::move(d));
    if (t >= 0 && (in.first_decision < 0 || t < in.first_decision)) in.first_decision = t;
    if (t >= 0) in.first = std::min(in.first, t);
  };
  for (const auto& a : arr(r, "actions")) {
    const auto& ao = a.as_object();
    const std::string task = str(ao, "task");
    if (task.empty()) continue;  // a site's action (throttle, drain): no instance's incident
    const std::string reason = str(ao, "reason");
    const auto colon = reason.find(": ");
    json::object d{{"kind", ao.at("kind")},
                   {"policy", colon == std::string::npos ? std::string() : reason.substr(0, colon)},
                   {"target_site", str(ao, "target_site")},
                   {"outcome", str(ao, "outcome")}};
    if (!str(ao, "message").empty()) d["message"] = str(ao, "message");
    decided(task, num(ao, "received_s"), std::move(d), reason, reason.find("budget spent") != std::string::npos);
  }
  for (const auto& a : arr(r, "alerts")) {
    const auto& ao = a.as_object();
    const std::string task = str(ao, "task");
    if (task.empty()) continue;  // about a site: no instance's incident
    decided(task, num(ao, "t_s"),
            json::object{{"kind", "alert"}, {"policy", str(ao, "policy")}, {"target_site", ""}, {"outcome", "raised"}},
            str(ao, "reason"), num(ao, "attempt", -1) == 0);
  }
  // The anomaly scores on each incident's instance (and its copies), in the report's order.
  std::map<std::string, std::vector<const json::object*>> anomalies_of;
  for (const auto& an : arr(r, "anomalies"))
    if (auto it = by.find(instance_of(str(an.as_object(), "task"))); it != by.end())
      anomalies_of[it->first].push_back(&an.as_object());
  json::array out;
  for (const auto& i : arr(r, "instances")) {
    const auto& io = i.as_object();
    const std::string id = str(io, "id");
    auto it = by.find(id);
    if (it == by.end()) continue;
    Incident& in = it->second;
    // Evidence: the attempts that failed or were stopped (why), then the policies' anomaly
    // scores on the instance (and its copies) from the fault (or the run's start) up to the
    // first decision, at most 5 of them.
    double start_at = in.first_fault >= 0 ? in.first_fault : 0;
    for (const auto& a : io.at("attempts").as_array()) {
      const auto& ao = a.as_object();
      const std::string outcome = str(ao, "outcome");
      if (outcome != "failed" && outcome != "stopped") continue;
      in.evidence.push_back(json::object{{"at_s", opt_t(num(ao, "end_s"))},
                                         {"what", str(ao, "id") + " attempt " + std::to_string(ao.at("number").to_number<std::int64_t>()) +
                                                      " on " + str(ao, "site") + " " + outcome +
                                                      (str(ao, "reason").empty() ? "" : ": " + str(ao, "reason"))}});
    }
    int shown = 0;
    for (const json::object* an : anomalies_of[id]) {
      const auto& o = *an;
      const double t = num(o, "t_s");
      if (t < start_at || (in.first_decision >= 0 && t > in.first_decision)) continue;
      if (shown++ >= 5) break;
      in.evidence.push_back(json::object{{"at_s", opt_t(t)},
                                         {"what", "anomaly " + std::to_string(num(o, "score", 0)).substr(0, 4) + " (" +
                                                      str(o, "detector") + ") " + str(o, "series") + ": " +
                                                      str(o, "explanation")}});
    }
    // Outcome: the instance's end, and the first attempt after the fault (or the decision).
    const double from = in.first_fault >= 0 ? in.first_fault : in.first_decision;
    double recovering = -1;
    std::string recovering_site;
    for (const auto& a : io.at("attempts").as_array()) {
      const auto& ao = a.as_object();
      const double st = num(ao, "start_s");
      if (st > from && (recovering < 0 || st < recovering) && ao.at("number").to_number<std::int64_t>() > 0 &&
          (in.first_fault >= 0 || st >= in.first_decision)) {
        recovering = st;
        recovering_site = str(ao, "site");
      }
    }
    json::object x{{"instance", id},
                   {"start_s", opt_t(in.first < 1e300 ? in.first : -1)},
                   {"faults", std::move(in.faults)},
                   {"evidence", std::move(in.evidence)},
                   {"decisions", std::move(in.decisions)},
                   {"state", io.at("state")},
                   {"recovering_attempt_running_s", opt_t(recovering)},
                   {"decision_s", in.first_fault >= 0 && in.first_decision >= 0 ? opt_t(in.first_decision - in.first_fault)
                                                                                : json::value(nullptr)},
                   {"reaction_s", in.first_fault >= 0 && recovering >= 0 ? opt_t(recovering - in.first_fault)
                                                                         : json::value(nullptr)}};
    if (!recovering_site.empty()) x["recovering_site"] = recovering_site;
    if (in.budget_spent) x["budget_spent"] = true;
    out.push_back(std::move(x));
  }
  std::stable_sort(out.begin(), out.end(), [](const json::value& a, const json::value& b) {
    return num(a.as_object(), "start_s", 1e300) < num(b.as_object(), "start_s", 1e300);
  });
  return out;
}

json::object build_report(const Context& ctx, const InstanceStore& store, const Sites& sites, const std::vector<Fault>& faults,
                          const ActionLog& actions, const RunSummary& run) {
  json::object r;
  r["workflow"] = ctx.spec.name;
  r["spec"] = ctx.spec.file;
  r["mode"] = ctx.baseline()                                 ? "baseline"
              : !ctx.spec.policies.empty()                  ? "policies"
              : ctx.spec.defaults != DefaultsMode::off ? "defaults"
                                                            : "no-policies";
  r["defaults"] = std::string(to_string(ctx.spec.defaults));
  if (ctx.baseline()) r["baseline_retry_after_s"] = *ctx.opt.baseline_retry_after_s;
  r["started_us"] = run.started_us;
  r["duration_s"] = opt_t(run.duration_s);
  r["exit_status"] = run.exit_status;
  if (!ctx.stop_reason.empty()) r["interrupted"] = ctx.stop_reason;
  r["relay"] = ctx.relay_url;
  r["plugin"] = run.plugin;
  json::array site_list;
  for (const auto& s : sites.all())
    site_list.push_back(json::object{{"name", s.name()},
                                     {"workers", static_cast<std::int64_t>(s.slots.size())},
                                     {"speed", s.spec->speed},
                                     {"completed", s.completed},
                                     {"failed", s.failed}});
  r["sites"] = std::move(site_list);
  r["anomalies"] = run.anomalies;
  r["alerts"] = run.alerts;
  json::array insts;
  long completed = 0, failed = 0, cancelled = 0, misses = 0, with_deadline = 0, attempts = 0;
  for (const auto& inst : store.all()) {
    insts.push_back(instance_object(ctx, inst, misses, with_deadline, attempts));
    completed += inst.state == InstanceState::completed;
    failed += inst.state == InstanceState::failed;
    cancelled += inst.state == InstanceState::cancelled;
  }
  r["instances"] = std::move(insts);
  json::array fault_list;
  std::vector<double> reactions;
  for (const auto& f : faults) fault_list.push_back(fault_object(store, f, reactions));
  r["faults"] = std::move(fault_list);
  json::array acts;
  for (const auto& a : actions.all()) {
    json::object o{{"id", a.id}, {"kind", a.kind}, {"task", a.task}, {"site", a.site}, {"target_site", a.target},
                   {"origin", a.origin}, {"reason", a.reason}, {"received_s", opt_t(a.received_t)},
                   {"done_s", opt_t(a.done_t)}, {"outcome", a.outcome}, {"message", a.message}};
    // How far ahead of the harm it came: its instance's deadline, when it has one.
    int ai = -1;
    const int ii = a.task.empty() ? -1 : store.find(a.task, &ai);
    if (ii >= 0 && a.received_t >= 0)
      if (const TaskSpec& ts = ctx.task(store.at(ii).task); ts.deadline)
        o["deadline_lead_s"] = std::round((store.at(ii).submitted_t + ts.deadline->count() - a.received_t) * 1e3) / 1e3;
    acts.push_back(std::move(o));
  }
  r["actions"] = std::move(acts);
  r["incidents"] = build_incidents(r);
  json::object rs{{"count", static_cast<std::int64_t>(reactions.size())}};
  if (!reactions.empty()) {
    rs["max_s"] = opt_t(*std::max_element(reactions.begin(), reactions.end()));
    double sum = 0;
    for (double x : reactions) sum += x;
    rs["mean_s"] = opt_t(sum / static_cast<double>(reactions.size()));
  }
  r["summary"] = json::object{{"instances", static_cast<std::int64_t>(store.all().size())},
                              {"completed", completed},
                              {"failed", failed},
                              {"cancelled", cancelled},
                              {"attempts", attempts},
                              {"with_deadline", with_deadline},
                              {"deadline_misses", misses},
                              {"actions", static_cast<std::int64_t>(actions.all().size())},
                              {"reactions", std::move(rs)}};
  return r;
}

PolicyRecord read_decisions(const Context& ctx, std::int64_t started_us) {
  PolicyRecord out;
  if ((ctx.spec.policies.empty() && ctx.spec.defaults == DefaultsMode::off) || ctx.baseline()) return out;
  constexpr std::size_t kMax = 5000;
  try {
    read_topic(ctx.relay_url, ctx.ca_file, ctx.token_file, ctx.events_topic(), 30, [&](const json::object& e) {
      const json::value* type = e.if_contains("type");
      const json::value* data = e.if_contains("data");
      const json::value* time = e.if_contains("time");
      if (!type || !type->is_string() || !data || !data->is_object() || !time || !time->is_string()) return;
      const json::object& d = data->get_object();
      const bool anomaly = type->get_string() == "org.diaspora.anomaly.predicted";
      const bool alert = type->get_string() == "org.diaspora.action.requested" && d.if_contains("action") &&
                         d.at("action") == "alert";
      json::array& to = anomaly ? out.anomalies : out.alerts;
      if ((!anomaly && !alert) || to.size() >= kMax) return;
      const auto us = parse_rfc3339_us(std::string(time->get_string()));
      if (!us || *us < started_us) return;  // an earlier run's (a relay log shared between runs)
      json::object a{{"t_s", std::round(static_cast<double>(*us - started_us) / 1e3) / 1e3}};
      static constexpr std::array<const char*, 5> kAnomaly{"score", "series", "detector", "explanation", "site"};
      static constexpr std::array<const char*, 4> kAlert{"site", "policy", "attempt", "reason"};
      for (const char* k : anomaly ? std::span<const char* const>(kAnomaly) : std::span<const char* const>(kAlert))
        if (const json::value* v = d.if_contains(k)) a[k] = *v;
      if (const json::value* v = d.if_contains("task_id")) a["task"] = *v;
      to.push_back(std::move(a));
    });
  } catch (const std::exception& e) {
    ctx.say(std::string("warning: the policies' scores and alerts were not read back for the report: ") + e.what());
  }
  return out;
}

}  // namespace diaspora::runner
