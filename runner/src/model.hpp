// The runner's model: a task instance and its attempts. Their states are enums; the
// instance store (store.hpp) owns every Instance, the other parts read and change them
// through it. Plain data: any thread that owns it.
#pragma once

#include <boost/json/object.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "adapters.hpp"

namespace diaspora::runner {

/// An instance's state. completed, failed and cancelled are final.
enum class InstanceState { pending, running, awaiting, completed, failed, cancelled };

/// An attempt's outcome: queued (waiting for a worker), running, or how it ended. `stopped`
/// is an attempt the runner stopped to restart or move it; `cancelled` one it withdrew.
enum class Outcome { queued, running, completed, failed, stopped, cancelled };

/// The names report.json uses ("pending", ..., "cancelled").
std::string_view to_string(InstanceState s);
std::string_view to_string(Outcome o);

/// completed, failed or cancelled.
constexpr bool is_final(InstanceState s) {
  return s == InstanceState::completed || s == InstanceState::failed || s == InstanceState::cancelled;
}

struct Attempt {
  int number = 1;            ///< 1-based, per hook id
  std::string hook_id;       ///< the instance id, or "<id>@copyN" for a speculative copy
  std::string cause = "first attempt";
  std::string pin_site;      ///< must run there (migrate, speculate target)
  std::string avoid_site;    ///< must not run there (speculate without a target)
  std::string action_id;     ///< acknowledged when this attempt starts
  bool speculative = false;
  std::string site;
  int slot = -1;
  double queued_t = 0, start_t = -1, end_t = -1, last_beat = -1;
  Outcome outcome = Outcome::queued;
  std::string reason;
  long step = 0;
  double progress = 0;
  bool lost = false;  ///< baseline: its worker died; noticed only by heartbeat silence
  std::optional<int> exit_code;  ///< a command's exit status, when it exited with one
  /// Why it failed: the task's own error (an exit status, an exception in a built-in kind)
  /// or lost (its worker or process died): diaspora_task_info.failure.
  bool own_error = false;
  bool live() const { return outcome == Outcome::running; }
  bool queued() const { return outcome == Outcome::queued; }
  /// The first attempt of its hook id (not a restart, a migration or a copy).
  bool first() const { return number == 1 && !speculative; }
};

struct Instance {
  std::string id;
  std::size_t task = 0;  ///< index into the run's tasks (the spec's, then its rehearsal jobs)
  long index = 0;
  double submitted_t = 0;
  InstanceState state = InstanceState::pending;
  std::vector<Attempt> attempts;
  double end_t = -1, awaiting_since = 0;
  std::string reason;
  boost::json::object result;
  int copies = 0;
  bool restored = false;  ///< completed in the run this one resumes
  bool final() const { return is_final(state); }
};

/// "site/worker-N", how logs, the report and the plugin name a worker.
std::string worker_name(const std::string& site, int slot);

}  // namespace diaspora::runner
