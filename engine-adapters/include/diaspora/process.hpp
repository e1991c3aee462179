// Processes and the line channel between the runner and its workers.
//
// Thread safety: spawn() may be called from a multi-threaded process (it prepares every
// argument before fork and calls only async-signal-safe functions in the child).
// LineChannel is owned by one thread.
#pragma once

#include <sys/types.h>

#include <boost/json/object.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "diaspora/plugin.h"

namespace diaspora::adapters {

/// What spawn() starts.
struct SpawnSpec {
  std::vector<std::string> argv;                  ///< argv[0] is the program (execv: a path)
  std::vector<std::string> env_extra;             ///< "KEY=VALUE" added to (or replacing in) the environment
  std::vector<std::pair<int, int>> fds;           ///< (parent fd, child fd) dup2'ed in the child
  std::optional<std::filesystem::path> stdout_file, stderr_file;  ///< appended to; default: inherited
  bool new_process_group = true;                  ///< setpgid(0, 0): signals reach the whole group
  std::uint64_t memory_limit = 0;                 ///< RLIMIT_AS in bytes; 0 = none
  int parent_death_signal = 0;                    ///< sent to the child when the spawning thread dies (0: none)
  /// With a new process group and a parent-death signal: the group's leader is a guard (a
  /// fork of the caller, no exec) that runs the program as its child, sends the signal to
  /// the whole group when the spawning thread dies (a pipeline's or a job's grandchildren
  /// stop too; it ignores SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1/2 sent to the group,
  /// which are the program's), and exits as the program did (its status, or the signal
  /// that killed it). The pid returned is the guard's (the group's id).
  bool guard_group = false;
};

/// Forks and execs. Returns the child's pid. Throws diaspora::Error (fork failed, or a
/// file could not be opened). An exec failure shows as the child exiting with status 127.
pid_t spawn(const SpawnSpec& spec);

/// A readable account of a wait status: "exit status 3", "killed by signal 9 (SIGKILL)".
std::string describe_wait_status(int status);

/// The path of the running executable (/proc/self/exe), or argv0 when unavailable.
std::filesystem::path self_executable(const char* argv0 = nullptr);

/// diaspora-train next to this executable (build/bin, or the installed bin/), or an empty
/// path when it is not there (a build with DIASPORA_WITH_TORCH=OFF). DIASPORA_TRAIN, when
/// set, names the program instead (a wrapper that runs the trainer in a container or a
/// namespace of the site's); empty when it is not executable. Any thread.
std::filesystem::path trainer_executable();

/// Sends `sig` to the process group `pgid` (its leader's pid); ignores ESRCH.
void signal_group(pid_t pgid, int sig) noexcept;

/// True when the process is stopped (state T in /proc/PID/stat) or gone.
bool process_stopped(pid_t pid) noexcept;

/// One line of a command's progress channel (DIASPORA_PROGRESS_FD, docs/run.md):
/// "progress FRACTION [STEP]", "metric NAME VALUE [NAME VALUE]..." (up to 32 pairs, one
/// report), "heartbeat", "checkpoint diaspora://TOPIC/OFFSET" (a rehearsal job's newest
/// checkpoint, put as a data item: docs/rehearsal.md), "result {JSON object}" (its result,
/// up to 1 MiB: a rehearsal job's summary). Anything else, or a value out of range (a fraction outside [0, 1],
/// a name longer than 63 bytes or repeated, a non-finite number, a pair cut short), is kind
/// none: ignored by its readers. Pure: any thread.
struct ProgressLine {
  enum class Kind { none, progress, metric, heartbeat, checkpoint, result } kind = Kind::none;
  double value = 0;   ///< progress: the fraction
  long step = -1;     ///< progress: the step number, -1 when not given
  std::vector<std::pair<std::string, double>> metrics;  ///< metric: the names and values, in order
  std::string uri;    ///< checkpoint: the item's diaspora:// URI
  boost::json::object result;  ///< result: the object
  /// The metrics as the plugin ABI takes them (views into `metrics`: valid while it lives).
  std::vector<diaspora_metric_value> metric_values() const {
    std::vector<diaspora_metric_value> out;
    for (const auto& [n, v] : metrics) out.push_back({n.c_str(), v});
    return out;
  }
};
ProgressLine parse_progress_line(const std::string& line);

/// Which plugin hook a progress line is reported with.
enum class ProgressHook { none, progress, heartbeat };
/// How a progress line is told to the plugin, the same for every engine adapter: progress
/// -> task_progress with the fraction and the step; metric -> task_heartbeat with the
/// metrics; heartbeat -> task_heartbeat. Sets those fields of `info` (the metrics view into
/// `metrics`, whose names view into `pl`: both must outlive the call of the hook) and
/// returns the hook to call. Pure: any thread.
ProgressHook apply_progress_line(const ProgressLine& pl, diaspora_task_info& info, std::vector<diaspora_metric_value>& metrics);

/// Executable for a command word as execvp would find it: a word with a '/' as is, else
/// the first PATH entry holding an executable file of that name. nullopt when none.
std::optional<std::filesystem::path> find_program(const std::string& word);

/// Newline-delimited JSON objects over a stream socket or pipe (one object per line,
/// at most 1 MiB a line). Reads are non-blocking (the fd is set O_NONBLOCK); writes
/// block until the line is written.
class LineChannel {
 public:
  LineChannel() = default;
  explicit LineChannel(int fd);
  int fd() const noexcept { return fd_; }
  /// Reads what is available; returns false at end of file or on an error (the peer is gone).
  bool fill();
  /// The next complete line parsed as a JSON object; nullopt when none is buffered. A line
  /// that is not a JSON object is returned as {"op": "invalid", "line": ...}.
  std::optional<boost::json::object> next();
  /// The next complete line as text (without the newline); nullopt when none is buffered.
  std::optional<std::string> next_line();
  /// Writes one object as a line; false when the peer is gone (EPIPE) or on an error.
  bool send(const boost::json::object& msg);
  /// Closes the fd.
  void close() noexcept;

 private:
  int fd_ = -1;
  std::string buf_;
};

}  // namespace diaspora::adapters
