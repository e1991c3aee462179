// Remote sites of `diaspora run` (engine: dask, engine: slurm; docs/run.md, "Dask and Slurm
// sites"). Each attempt of a built-in kind on such a site runs in a one-shot worker,
// `diaspora-run __worker --connect HOST:PORT --key KEY`, that the site's engine starts (a
// Dask task, a Slurm batch job) and that connects back to the runner over TCP. After its
// hello line it speaks the local workers' protocol (worker.hpp) on that connection, so the
// runner drives a remote attempt exactly as a local one; the connection closing before the
// attempt's "done" is the worker dying.
//
// Thread safety: everything here belongs to the runner thread.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "diaspora/spec.hpp"
#include "adapters.hpp"

namespace diaspora::runner {

/// A remote worker's first line: {"op":"hello","key","pid","host","engine_pid"}.
struct Hello {
  std::string key;      ///< the launch it belongs to (random, one per attempt)
  LineChannel ch;       ///< the connection (lines after the hello may be buffered in it)
  pid_t pid = -1;       ///< the worker process, on `host`
  pid_t engine_pid = -1;  ///< the engine's process that started it (a Dask worker), or -1
  std::string host;     ///< its host name
};

/// This host's name (gethostname). Any thread.
std::string host_name();

/// The runner's TCP listener for remote workers.
class WorkerListener {
 public:
  /// Listens on `bind_host` (a numeric IPv4 address) on a free port. Throws diaspora::Error.
  explicit WorkerListener(const std::string& bind_host);
  ~WorkerListener();
  WorkerListener(const WorkerListener&) = delete;
  WorkerListener& operator=(const WorkerListener&) = delete;

  /// "HOST:PORT", what a worker is told to connect to.
  const std::string& address() const noexcept { return address_; }
  /// The fds to poll: the listening socket and the connections that have not said hello.
  std::vector<int> fds() const;
  /// Accepts new connections and reads the pending ones (non-blocking). Returns the hellos
  /// completed; a connection that closes, sends anything but a hello, or stays silent for
  /// 10 s is dropped.
  std::vector<Hello> service();

 private:
  struct Pending {
    LineChannel ch;
    double since = 0;
  };
  int fd_ = -1;
  std::string address_;
  std::vector<Pending> pending_;
};

/// The address of this host that a peer at `host` reaches it on (the source address the
/// kernel picks towards it): "127.0.0.1" for a loopback or unresolvable host.
std::string local_address_towards(const std::string& host);

/// A launch that ended as the engine tells it (before or after its worker connected).
struct LaunchEnded {
  std::string key, reason;
};

/// How a remote site starts one-shot workers.
class Launcher {
 public:
  virtual ~Launcher() = default;
  /// Starts `argv` (with `env` added, "KEY=VALUE") for the launch `key`; `name` names the
  /// attempt for the engine ("reconstruct.3.2"). Throws diaspora::Error when the engine
  /// refuses it (the message says why and what to fix).
  virtual void launch(const std::string& key, const std::string& name, const std::vector<std::string>& argv,
                      const std::vector<std::string>& env) = 0;
  /// The launch's worker has connected: the engine's own account of it is no longer needed.
  virtual void connected(const std::string& key) = 0;
  /// Withdraws the launch (queued or running) from the engine. Best effort; never throws.
  virtual void cancel(const std::string& key) noexcept = 0;
  /// Launches that ended in the engine since the last call (a Slurm job that failed before
  /// its worker connected, a Dask task that raised). Non-blocking apart from an engine
  /// query every few seconds.
  virtual std::vector<LaunchEnded> poll() = 0;
  /// "Dask scheduler tcp://...", "Slurm partition debug".
  virtual std::string describe() const = 0;
  /// Withdraws every launch still out and lets go of the engine (a LocalCluster stops).
  /// Waits up to `timeout_s`. Never throws.
  virtual void shutdown(double timeout_s) noexcept = 0;
};

/// What a launcher needs from the run.
struct LaunchContext {
  std::filesystem::path out_dir;    ///< logs: OUT/engines/<site>.log, Slurm job outputs
  std::filesystem::path spank_spec;  ///< the spec given to `sbatch --diaspora=` (empty: not used)
};

/// The launcher for an `engine: dask`, `parsl` or `slurm` site. A Dask site starts its
/// bridge (runner/python/dask_bridge.py) and waits until the scheduler (or the
/// LocalCluster it starts) answers, up to 90 s; a Parsl site starts parsl_bridge.py, which
/// starts an HTEX on a LocalProvider, and waits for it the same way. Throws diaspora::Error
/// (no Python, no `distributed` or `parsl`, scheduler unreachable, no `sbatch`) with what to
/// do about it.
std::unique_ptr<Launcher> make_launcher(const SiteSpec& site, const LaunchContext& ctx);

/// The launchers behind make_launcher() (dask_launcher.cpp: Dask and Parsl sites, through
/// their bridge scripts; slurm_launcher.cpp).
std::unique_ptr<Launcher> make_bridge_launcher(const SiteSpec& site, const LaunchContext& ctx);
std::unique_ptr<Launcher> make_slurm_launcher(const SiteSpec& site, const LaunchContext& ctx);

/// The Python a site's bridge runs under: $DIASPORA_PYTHON, else the virtual environment of
/// the source tree this binary was built from (.venv, made by scripts/install-deps.sh), else
/// /usr/bin/python3. Throws diaspora::Error naming `site` when that file is not executable.
/// Any thread.
std::string site_python(const std::string& site);

/// Seconds of the steady clock (for the remote parts' timeouts). Any thread.
double monotonic_s();
/// The last non-empty line of a file (a log's last word on why something ended; at most
/// 400 bytes), or "" when there is none.
std::string last_line(const std::filesystem::path& file);
/// "HOST:PORT" split at the last ':'. Throws diaspora::Error when the port is missing.
std::pair<std::string, std::string> split_host_port(const std::string& address);

/// The one-shot remote worker: connects to `address`, says hello with `key`, then runs
/// worker_main() on the connection. Returns its exit status (2: could not connect).
int remote_worker_main(const std::string& address, const std::string& key);

}  // namespace diaspora::runner
