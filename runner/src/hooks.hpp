// What the runner tells the engine plugin: the task lifecycle hooks, resource reports and
// the outcome of each action, in the runner's terms. PluginBridge (plugin_bridge.hpp) passes
// them to the real plugin through its C ABI; unit tests record them.
//
// Thread safety: the runner thread calls every function.
#pragma once

#include <span>
#include <string>

#include "diaspora/plugin.h"
#include "model.hpp"

namespace diaspora::runner {

class Hooks {
 public:
  virtual ~Hooks() = default;
  /// A new hook id is submitted (a first attempt, or a speculative copy). deadline_s 0: none.
  virtual void task_submitted(const Attempt& a, const std::string& task_name, double deadline_s) = 0;
  /// The attempt runs on `worker` ("site/worker-N").
  virtual void task_started(const Attempt& a, const std::string& worker) = 0;
  /// Progress (fraction, step or -1) with optional metrics.
  virtual void task_progress(const Attempt& a, double progress, long step, std::span<const diaspora_metric_value> metrics) = 0;
  /// A heartbeat, with optional metrics.
  virtual void task_heartbeat(const Attempt& a, std::span<const diaspora_metric_value> metrics) = 0;
  /// What a command wrote on its progress channel, told as every adapter tells it
  /// (adapters::apply_progress_line: progress, or a heartbeat with its metrics).
  virtual void task_progress_line(const Attempt& a, const ProgressLine& line) = 0;
  virtual void task_completed(const Attempt& a) = 0;
  /// The attempt failed (or was stopped to recover it). `retryable` is the ABI's: the runner
  /// itself queues the next attempt (an action's stop, the baseline's retry), so no policy
  /// retries this failure too; false leaves the retry to the policies. a.exit_code, when
  /// set, is reported with it.
  virtual void task_failed(const Attempt& a, bool retryable, const std::string& reason) = 0;
  virtual void task_cancelled(const Attempt& a, const std::string& reason) = 0;
  /// An output file of `stream` (its instance index `seq`) is there; bytes -1: unknown.
  virtual void data_arrived(const std::string& stream, long seq, long bytes, const std::string& uri,
                            const std::string& checksum, const std::string& site) = 0;
  /// org.diaspora.resource.status for `id` (a site, a worker, the relay), one metric or none.
  virtual void resource(const std::string& id, const char* kind, const char* state, const std::string& site,
                        const std::string& metric, double value) = 0;
  /// The action `action_id` was carried out (ok) or refused, and why.
  virtual void action_result(const std::string& action_id, bool ok, const std::string& message) = 0;
};

}  // namespace diaspora::runner
