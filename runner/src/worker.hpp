// A local site's worker process (`diaspora-run __worker`), like a Parsl HTEX worker:
// started once by the runner, it runs one built-in task instance at a time, sending a
// heartbeat with the step time after every step of real work.
//
// Protocol (newline-delimited JSON over the socket on fd 3; docs/run.md, "Workers"):
//   runner -> worker: {"op":"run", "id", "attempt", "kind", "args":{...}, "memory",
//                      "data_dir", "checkpoint", "resume_step"}
//                     {"op":"checkpoint"} {"op":"hang"} {"op":"cancel"}
//   worker -> runner: {"op":"ready"}  {"op":"beat", "step", "steps", "progress", "step_time"}
//                     {"op":"checkpointed", "step"} {"op":"done", "result":{...}}
//                     {"op":"failed", "reason"}
// "hang" is the hang-task fault: the worker stops working and heartbeating without
// exiting (until it is killed).
#pragma once

#include <boost/json/object.hpp>

#include <functional>
#include <string>

namespace diaspora::runner {

/// The worker's main loop on `fd`. Returns the process exit status (0 when the runner
/// closed the channel). Worker process, main thread.
int worker_main(int fd);

/// What a built-in kind sees of its worker.
class TaskContext {
 public:
  virtual ~TaskContext() = default;
  /// The step just finished: `step` of `steps`, `step_time` seconds of wall time. Sends
  /// the heartbeat, serves pending commands (checkpoint, hang, cancel). Returns false when
  /// the task must stop (cancelled).
  virtual bool step_done(long step, long steps, double step_time) = 0;
  /// The step to start from (a resumed attempt), 0 for a fresh one.
  virtual long resume_step() const = 0;
  /// The run's data folder (created).
  virtual const std::string& data_dir() const = 0;
  /// The instance id ("reconstruct.17").
  virtual const std::string& instance() const = 0;
};

/// A built-in kind: runs with `args` and returns its result object (or throws
/// diaspora::Error with the reason it failed). Worker thread.
using KindFunction = std::function<boost::json::object(const boost::json::object& args, TaskContext& ctx)>;

/// The kind named `name` ("sleep", "cpu-burn", "ptycho-reconstruct"), or nullptr.
const KindFunction* find_kind(const std::string& name);

/// `ptycho-reconstruct`: simulates one ptychographic scan (probe x object patch, Fourier
/// transform, squared magnitude, Poisson noise) and reconstructs the object with ePIE,
/// one iteration a step. Writes the object to data_dir; result: file, bytes, error.
boost::json::object ptycho_reconstruct(const boost::json::object& args, TaskContext& ctx);

}  // namespace diaspora::runner
