#include "plugin_link.hpp"

#include <algorithm>

#include "diaspora/event.hpp"      // now_us, format_rfc3339_us
#include "diaspora/rehearsal.hpp"  // RehearsalError

namespace diaspora::rehearsal::detail {

PluginLink::PluginLink(const TrainerConfig& cfg, bool resumed)
    : task_(cfg.plugin_task_id), site_(cfg.plugin_site), started_us_(now_us()) {
  if (cfg.plugin_spec.empty()) return;
  char err[1024] = {0};
  if (int rc = diaspora_open_file(cfg.plugin_spec.c_str(), &p_, err, sizeof err); rc != DIASPORA_OK)
    throw RehearsalError("plugin: cannot open with " + cfg.plugin_spec + ": " + err);
  diaspora_task_info i = info();
  i.name = "diaspora-train";
  i.attempt = resumed ? 2 : 1;
  diaspora_task_submitted(p_, &i);
  diaspora_task_started(p_, &i);
}

PluginLink::~PluginLink() {
  if (p_) diaspora_close(p_, 5000);
}

void PluginLink::progress(std::int64_t step, double fraction, const std::vector<diaspora_metric_value>& metrics) {
  if (!p_) return;
  diaspora_task_info i = info();
  i.step = step;
  i.progress = std::clamp(fraction, 0.0, 1.0);
  i.metrics = metrics.data();
  i.metric_count = metrics.size();
  diaspora_task_progress(p_, &i);
}

int PluginLink::poll() {
  if (!p_) return 0;
  diaspora_action a{};
  a.struct_size = sizeof a;
  while (diaspora_poll_action(p_, &a) == DIASPORA_OK) {
    if (a.task_id[0] != '\0' && task_ != a.task_id) {
      diaspora_action_failed(p_, a.id, "diaspora-train runs only its own task");
      continue;
    }
    if (a.requested_us != 0 && a.requested_us < started_us_) {
      const std::string why = "stale: requested at " + format_rfc3339_us(a.requested_us) +
                              ", before this run of the task started (" + format_rfc3339_us(started_us_) +
                              "): the run it was meant for has ended; request it again if it still holds";
      diaspora_action_failed(p_, a.id, why.c_str());
      continue;
    }
    int code = 0;
    switch (a.kind) {
      case DIASPORA_ACTION_CHECKPOINT: code = kTrainCheckpointed; break;
      case DIASPORA_ACTION_MIGRATE: code = kTrainMigrate; break;
      case DIASPORA_ACTION_CANCEL: code = kTrainCancelled; break;
      case DIASPORA_ACTION_RESTART: code = kTrainCheckpointed; break;  // checkpoint; the engine restarts with --resume
      default:
        diaspora_action_failed(p_, a.id, "diaspora-train handles checkpoint, migrate, restart and cancel");
        continue;
    }
    pending_.push_back(a.id);
    target_ = a.target_site;
    return code;
  }
  return 0;
}

void PluginLink::stopped(int code, const std::string& where) {
  if (!p_) return;
  std::string msg = "checkpointed at " + where + (code == kTrainMigrate ? "; resume on " + target_ + " with --resume" : "");
  for (const auto& id : pending_) diaspora_action_done(p_, id.c_str(), msg.c_str());
  diaspora_task_info i = info();
  i.reason = msg.c_str();
  diaspora_task_cancelled(p_, &i);
}

void PluginLink::finished(bool ok, const std::string& reason) {
  if (!p_) return;
  diaspora_task_info i = info();
  if (ok) {
    i.has_exit_code = 1;
    diaspora_task_completed(p_, &i);
  } else {
    i.reason = reason.c_str();
    diaspora_task_failed(p_, &i);
  }
}

diaspora_task_info PluginLink::info() const {
  diaspora_task_info i{};
  i.struct_size = sizeof i;
  i.task_id = task_.c_str();
  i.site = site_.empty() ? nullptr : site_.c_str();
  i.step = -1;
  return i;
}

}  // namespace diaspora::rehearsal::detail
