// `diaspora run`: the reference executor. It starts the relay (embedded or remote), loads
// the engine plugin with dlopen from the spec, starts each `engine: local` site's worker
// pool and each Dask or Slurm site's launcher (remote.hpp), submits the spec's task instances (counts and rate streams), injects the spec's
// faults, carries out the plugin's actions (restart, migrate, speculate, checkpoint,
// throttle, cancel) and acknowledges each, and writes the run's report.
//
// Thread safety: run_workflow() runs on the calling thread (the runner thread) and owns
// everything; the plugin's action callback only queues actions for it.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "spec_input.hpp"

namespace diaspora::run {

struct RunOptions {
  std::filesystem::path out_dir;                  ///< report, data, spool, the embedded relay's files
  std::optional<double> baseline_retry_after_s;   ///< --baseline retry-after=D: no policies, retry on silence
  double failure_grace_s = 10;   ///< a failed attempt waits this long for the policies' restart/migrate
  double heartbeat_s = 1.0;      ///< command tasks: the runner's heartbeat period
  bool live_view = false;        ///< redraw a status block (stdout is a terminal)
  bool resume = false;           ///< out_dir holds a run to resume: skip what its log says completed
  double job_drain_s = 60;       ///< a rehearsal job told to stop (SIGTERM) is killed after this
};

/// Runs the workflow. Returns the exit status: 0 every instance succeeded, 1 some failed
/// for good (or the run was interrupted). Throws diaspora::Error when the run cannot start
/// (plugin, relay, out dir); nothing has run then. Writes log lines to `log`.
int run_workflow(const SpecInput& input, const RunOptions& options, std::ostream& log);

/// Installs the SIGINT/SIGTERM handlers: the first signal stops the run gracefully (no new
/// work, tasks stopped, report written), a second kills the workers and exits at once.
void install_signal_handlers();

}  // namespace diaspora::run
