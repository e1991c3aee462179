// report.json's object, built from the run's state (docs/run.md, "The report";
// schemas/run-report.schema.json): every instance and attempt, each fault with what it hit
// and the reaction time (from the fault to the first recovering attempt running), every
// action and its outcome, the summary counts. report_files.hpp writes it with the page.
//
// Thread safety: the runner thread (reads the state it is given).
#pragma once

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "action_log.hpp"
#include "context.hpp"
#include "faults.hpp"
#include "sites.hpp"
#include "store.hpp"

namespace diaspora::runner {

/// What the report says of the run beyond the parts' state.
struct RunSummary {
  int exit_status = 0;
  std::int64_t started_us = 0;  ///< wall time of the run's t = 0
  double duration_s = 0;
  boost::json::object plugin;    ///< library, version, stats
  boost::json::array anomalies;  ///< the policies' scores read back (read_decisions)
  boost::json::array alerts;     ///< the policies' alerts read back (read_decisions)
};

boost::json::object build_report(const Context& ctx, const InstanceStore& store, const Sites& sites,
                                 const std::vector<Fault>& faults, const ActionLog& actions, const RunSummary& run);

/// The report's incidents, derived from its `faults`, `actions`, `alerts`, `anomalies` and
/// `instances`: one per instance that a fault hit or an action named (a copy's actions are
/// its original's), earliest first, each with the faults that hit it, the evidence (its
/// failed or stopped attempts' reasons, then up to 5 anomaly scores on it from the fault,
/// or the run's start, to the first decision), every decision (time, kind, policy, target,
/// outcome, the evidence its reason names), and the outcome (the instance's state, its first
/// attempt started after the fault or decision, the decision and reaction times from the
/// fault, whether a budget was spent). Pure: callable from any thread.
boost::json::array build_incidents(const boost::json::object& report);

/// What the policies published since `started_us`, read back from the events topic once
/// the run is over (the engine never receives an alert, so only the topic has them).
struct PolicyRecord {
  /// org.diaspora.anomaly.predicted, for the report's timeline: time since the start,
  /// score, series, detector, explanation, site, task; at most 5,000.
  boost::json::array anomalies;
  /// org.diaspora.action.requested of action `alert` (published for people only): time
  /// since the start, task, site, policy, attempt (0: the budget is spent; absent when it
  /// is no attempt of a budget), reason; at most 5,000.
  boost::json::array alerts;
};

/// Reads the PolicyRecord of this run. Empty without policies or in the baseline. A relay
/// that cannot be read is logged as a warning (what was read is kept). Called by the
/// runner's thread after the run.
PolicyRecord read_decisions(const Context& ctx, std::int64_t started_us);

}  // namespace diaspora::runner
