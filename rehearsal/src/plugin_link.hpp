// diaspora-train's link to the fabric: the job reported as one task through the plugin's
// public C ABI (rank 0 only), and the plugin's actions turned into stop codes.
// Internal to the trainer. Thread safety: one thread (rank 0's training loop).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "diaspora/plugin.h"
#include "diaspora/trainer.hpp"

namespace diaspora::rehearsal::detail {

class PluginLink {
 public:
  /// Opens the plugin with cfg.plugin_spec (none: every call is a no-op) and reports the
  /// task submitted and started (attempt 2 when resumed). Throws RehearsalError.
  PluginLink(const TrainerConfig& cfg, bool resumed);
  /// Closes the plugin, flushing for at most 5 s.
  ~PluginLink();
  PluginLink(const PluginLink&) = delete;
  PluginLink& operator=(const PluginLink&) = delete;

  bool active() const { return p_ != nullptr; }
  /// Reports progress (a fraction of the stream) with metrics.
  void progress(std::int64_t step, double fraction, const std::vector<diaspora_metric_value>& metrics);
  /// Polls waiting actions: returns the stop code of the first one for this task
  /// (kTrainCheckpointed, kTrainMigrate, kTrainCancelled) or 0; others are refused, and so
  /// is one requested before this job started (its requested_us, by the requester's
  /// clock): it was meant for an earlier run of the task, which has ended (a request that
  /// run never took is delivered again to the next job of the same engine id).
  int poll();
  /// The job stopped after a checkpoint: acknowledges the actions and reports the task.
  void stopped(int code, const std::string& where);
  /// The job ended: completed, or failed with `reason`.
  void finished(bool ok, const std::string& reason);

 private:
  diaspora_task_info info() const;
  diaspora_plugin* p_ = nullptr;
  std::string task_, site_, target_;
  std::vector<std::string> pending_;
  std::int64_t started_us_ = 0;  ///< when this job started, µs since the Unix epoch
};

}  // namespace diaspora::rehearsal::detail
