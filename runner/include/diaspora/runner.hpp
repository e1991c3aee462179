// `diaspora run`: the reference executor (docs/run.md). It starts the relay (embedded or
// remote), loads the engine plugin with dlopen from the spec, starts each `engine: local`
// site's worker pool and each Dask or Slurm site's launcher, submits the spec's task
// instances (counts and rate streams), injects the spec's faults, carries out the plugin's
// actions (restart, migrate, speculate, checkpoint, throttle, cancel, drain) and
// acknowledges each, and writes the run's report. `diaspora-run` is built from this
// library; nothing else links it (the CLI execs diaspora-run).
//
// Thread safety: load_run_spec() is thread-safe; run_workflow() runs on the calling
// thread (the runner thread) and owns everything it starts; the plugin's action callback
// only queues actions for it.
#pragma once

#include <boost/json/value.hpp>

#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "diaspora/spec.hpp"

namespace diaspora::runner {

/// The spec as `diaspora run` uses it: loaded and checked like `diaspora validate` (schema,
/// cross-references, the policies compiled), then `--set KEY=VALUE` overrides applied and
/// checked again, then what the runner itself needs checked (engines it can drive, the
/// built-in kinds' args, resources this host can give).
struct SpecInput {
  WorkflowSpec spec;               ///< with the overrides applied (policies cleared by --no-policies)
  boost::json::value document;     ///< the same as JSON; paths made absolute; given to the plugin
  std::filesystem::path base_dir;  ///< the spec file's folder (relative paths resolve here)
};

/// Loads `file`, applies `sets` ("a.b[0].c=VALUE" or "tasks.NAME.key=VALUE"; VALUE is a
/// YAML scalar or flow collection) and, with `no_policies`, drops the policies.
/// On success returns the input; on failure returns nullopt and appends one line per
/// problem to `errors` ("FILE:LINE:COL: error: ...", "--set KEY=VALUE: error: ...").
/// Every problem is found before anything starts. Thread-safe.
std::optional<SpecInput> load_run_spec(const std::filesystem::path& file, const std::vector<std::string>& sets,
                                       bool no_policies, std::vector<std::string>& errors);

/// Checks `file` (or `file`/normals.json when it is a folder: an earlier run's --out) as
/// what an earlier run of `spec`'s workflow learned (--learn-from; docs/anomaly.md,
/// "Normals across runs") and returns the file's absolute path.
/// @throws diaspora::Error saying which file and what is wrong (missing, not such a file,
///         another workflow's). Thread-safe.
std::filesystem::path check_learned_normals(const WorkflowSpec& spec, const std::filesystem::path& file);

/// The instances a task makes: `count`, or a stream's floor(rate x duration) (duration
/// default 60 s). Pure: any thread.
long instances_of(const TaskSpec& ts);

struct RunOptions {
  std::filesystem::path out_dir;                 ///< report, data, spool, the embedded relay's files
  std::optional<double> baseline_retry_after_s;  ///< --baseline retry-after=D: no policies, retry on silence
  double failure_grace_s = 10;  ///< a failed attempt waits this long for the policies' restart/migrate
  double heartbeat_s = 1.0;     ///< command tasks: the runner's heartbeat period
  bool live_view = false;       ///< redraw a status block (stdout is a terminal)
  bool resume = false;          ///< out_dir holds a run to resume: skip what its log says completed
  double job_drain_s = 60;      ///< a rehearsal job told to stop (SIGTERM) is killed after this
  /// --learn-from: an earlier run's normals.json (checked by the caller), copied to where
  /// this run's plugin reads them (plugin.normals; default out_dir/normals.json).
  std::filesystem::path learn_from;
};

/// Runs the workflow. Returns the exit status: 0 every instance succeeded, 1 some failed
/// for good (or the run was interrupted). Throws diaspora::Error when the run cannot start
/// (plugin, relay, out dir); nothing has run then. Writes log lines to `log`.
int run_workflow(const SpecInput& input, const RunOptions& options, std::ostream& log);

/// Installs the SIGINT/SIGTERM handlers: the first signal stops the run gracefully (no new
/// work, tasks stopped, report written), a second kills the workers and exits at once.
/// Main thread, before run_workflow().
void install_signal_handlers();

}  // namespace diaspora::runner
