// The run's sites and their worker slots: what each slot runs and what the runner knows
// of each site (its recent step times per task, a decayed count of failures and moves off
// it, its counters, an operator's drain). The processes behind a slot are the local pools'
// and the remote sites' business (local_pools.hpp, remote_sites.hpp).
//
// Thread safety: the runner thread.
#pragma once

#include <sys/types.h>

#include <boost/json/object.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "diaspora/spec.hpp"
#include "model.hpp"
#include "remote.hpp"

namespace diaspora::runner {

struct Slot {
  int index = 0;
  pid_t pid = -1;  ///< the worker process (its own process group)
  LineChannel ch;
  bool ready = false;
  int inst = -1, att = -1;  ///< the attempt it runs
  pid_t cmd_pid = -1;       ///< a command task's process group
  LineChannel progress;     ///< the command's progress pipe
  double next_beat = 0;
  double respawn_at = -1;
  std::string pending_checkpoint;  ///< action id waiting for "checkpointed"
  int draining_inst = -1;          ///< a rehearsal job told to checkpoint and stop, not exited yet
  double next_checkpoint = 0;      ///< a rehearsal job's next checkpoint_every signal
  double drain_deadline = 0;       ///< ... killed if it has not exited by then
  // A remote site's slot (remote_sites.hpp): one launch per attempt, no process of its own.
  std::string key;             ///< the launch out for the attempt it runs ("" when none)
  bool connected = false;      ///< its worker has said hello (ch is the connection)
  boost::json::object pending_run;  ///< the "run" message, sent when the worker is ready
  pid_t remote_pid = -1;       ///< the remote worker's pid ...
  pid_t engine_pid = -1;       ///< ... and its engine's process (a Dask worker) ...
  bool same_host = false;      ///< ... on this host: faults can signal them
  bool idle() const { return ready && inst < 0 && draining_inst < 0; }
  bool busy() const { return inst >= 0; }
};

struct Site {
  const SiteSpec* spec = nullptr;
  std::vector<Slot> slots;
  std::unique_ptr<Launcher> launcher;  ///< engine: dask or slurm (nullptr: a local pool)
  double slow_factor = 1, slow_until = 0, next_toggle = 0;  ///< the slow-site fault's duty cycle
  bool stopped_phase = false;
  double penalty = 0, penalty_t = 0;  ///< placement's decayed count of failures and moves off this site (60 s)
  double failures = 0, failures_t = 0;  ///< the same events for site_health() (its half-life)
  long completed = 0, failed = 0;
  bool drained = false;  ///< an operator's drain: nothing new starts here until an undrain
  /// Per task name: the step times seen on this site lately (fast EW mean), over a longer
  /// time (slow EW mean), and when last updated.
  struct StepTimes {
    double fast = 0, slow = 0, t = 0;
  };
  std::map<std::string, StepTimes> step_time;

  const std::string& name() const { return spec->name; }
  bool remote() const { return launcher != nullptr; }
  long busy() const;
  long idle() const;
};

class Sites {
 public:
  /// One site per spec site, each with its `workers` slots (no process started).
  explicit Sites(const std::vector<SiteSpec>& specs);

  std::vector<Site>& all() { return sites_; }
  const std::vector<Site>& all() const { return sites_; }
  Site* find(const std::string& name);
  const Site* find(const std::string& name) const;
  /// Slots free to take an attempt, over every site.
  long idle() const;

  /// A step of `task` took `step_time` seconds on `s` at time t (a worker's heartbeat).
  static void observe_step_time(Site& s, const std::string& task, double step_time, double t);
  /// A failure on s, or a move off it, at time t: counts `amount` in placement's penalty
  /// (decaying over 60 s) and in the site's health (diaspora::decay_failures).
  static void add_penalty(Site& s, double amount, double t);
  /// The decayed penalty at time t.
  static double penalty(const Site& s, double t);

  /// How fast `s` runs `task` lately compared with the fastest site that ran it (the
  /// engine's own measure, like a scheduler's duration estimates): in (0, 1], 1 without
  /// data from the last 30 s.
  double speed(const Site& s, const std::string& task, double t) const;
  /// The site's health as the console and the policies define it (diaspora::site_health):
  /// its slowest task's speed and its recent failures and moves off it.
  double health(const Site& s, double t) const;

 private:
  std::vector<Site> sites_;
};

}  // namespace diaspora::runner
