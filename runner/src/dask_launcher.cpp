// The Dask and Parsl sites' launcher: one bridge process per site (runner/python/
// dask_bridge.py, parsl_bridge.py), each attempt one Dask or HTEX task (remote.hpp).
#include "remote.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/json/serialize.hpp>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "diaspora/error.hpp"
#include "diaspora/files.hpp"

#ifndef DIASPORA_RUNNER_PYTHON_DIR
#define DIASPORA_RUNNER_PYTHON_DIR ""
#endif
#ifndef DIASPORA_VENV_PYTHON
#define DIASPORA_VENV_PYTHON ""
#endif

namespace diaspora::runner {

namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

// ---- the bridge process (runner/python/<engine>_bridge.py) -------------------------------

// A bridge script of the runner (dask_bridge.py, parsl_bridge.py): in the source tree this
// binary was built from, or the installed share/diaspora/runner. They import nothing of
// Diaspora's (the Dask task is pickled by value: Dask workers need diaspora-run, not a
// Python package).
std::string bridge_script(const std::string& file) {
  const fs::path c[] = {fs::path(DIASPORA_RUNNER_PYTHON_DIR) / file,
                        self_executable().parent_path().parent_path() / "share" / "diaspora" / "runner" / file};
  for (const auto& p : c)
    if (fs::exists(p)) return p.string();
  throw Error("diaspora-run's bridge " + file + " is neither in the source tree (" + c[0].string() +
              ") nor installed (" + c[1].string() + "): reinstall diaspora-run");
}

}  // namespace

std::string site_python(const std::string& site) {
  const char* py = std::getenv("DIASPORA_PYTHON");
  std::string python = py && *py ? py : DIASPORA_VENV_PYTHON;
  if (python.empty() || (!(py && *py) && ::access(python.c_str(), X_OK) != 0)) python = "/usr/bin/python3";
  if (::access(python.c_str(), X_OK) != 0)
    throw Error("site '" + site + "': no Python at " + python + " (scripts/install-deps.sh makes the project's "
                ".venv; DIASPORA_PYTHON names another Python with the engine's packages)");
  return python;
}

namespace {

// A Dask site (a LocalCluster or a running scheduler) or a Parsl site (an HTEX on a
// LocalProvider): the bridge speaks the same line protocol for both.
class BridgeLauncher final : public Launcher {
 public:
  BridgeLauncher(const SiteSpec& site, const LaunchContext& ctx) : site_(site.name), parsl_(site.engine == Engine::parsl) {
    engine_ = parsl_ ? "Parsl" : "Dask";
    endpoint_ = site.endpoint.value_or("local");
    const std::string python = site_python(site_);
    fs::create_directories(ctx.out_dir / "engines");
    log_ = ctx.out_dir / "engines" / (site_ + ".log");
    run_dir_ = ctx.out_dir / "engines" / (site_ + ".parsl");
    if (parsl_) {
      argv_ = {python, bridge_script("parsl_bridge.py"), "--site", site_, "--workers", std::to_string(site.workers),
               "--fd", "3"};
    } else {
      argv_ = {python, bridge_script("dask_bridge.py"), "--site", site_, "--endpoint", endpoint_,
               "--workers", std::to_string(site.workers), "--fd", "3"};
      if (auto it = site.attributes.find("dask_workers"); it != site.attributes.end() && it->second.is_string())
        argv_.insert(argv_.end(), {"--restrict", std::string(it->second.get_string())});
      if (auto it = site.attributes.find("connect_timeout"); it != site.attributes.end() && it->second.is_number())
        argv_.insert(argv_.end(), {"--connect-timeout", std::to_string(it->second.to_number<double>())});
    }
    spawn_bridge();
    // Wait for the bridge's "ready" (a LocalCluster or an HTEX takes a few seconds to start).
    for (const double until = monotonic_s() + 90;;) {
      pollfd p{ch_.fd(), POLLIN, 0};
      ::poll(&p, 1, 200);
      const bool open = ch_.fill();
      while (auto m = ch_.next()) {
        const json::value* op = m->if_contains("op");
        if (op && op->is_string() && op->get_string() == "ready") {
          if (const json::value* s = m->if_contains("scheduler"); s && s->is_string()) scheduler_ = s->get_string();
          return;
        }
        if (op && op->is_string() && op->get_string() == "error") {
          const json::value* r = m->if_contains("reason");
          fail(r && r->is_string() ? std::string(r->get_string()) : "the bridge failed");
        }
      }
      if (!open) fail("the " + engine_ + " bridge exited (" + last_line(log_) + ")");
      if (monotonic_s() > until) fail(parsl_ ? "the HTEX did not start within 90 s" : "the Dask scheduler did not answer within 90 s");
    }
  }

  ~BridgeLauncher() override { shutdown(10); }

  void launch(const std::string& key, const std::string& name, const std::vector<std::string>& argv,
              const std::vector<std::string>& env) override {
    json::array a, e;
    for (const auto& x : argv) a.emplace_back(x);
    for (const auto& x : env) e.emplace_back(x);
    if (!ch_.send({{"op", "launch"}, {"key", key}, {"name", name}, {"argv", a}, {"env", e}}))
      throw Error("the " + engine_ + " bridge of site '" + site_ + "' is gone (" + last_line(log_) + ")");
    out_.insert(key);
  }
  void connected(const std::string&) override {}
  void cancel(const std::string& key) noexcept override {
    if (out_.erase(key)) ch_.send({{"op", "cancel"}, {"key", key}});
  }
  std::vector<LaunchEnded> poll() override {
    std::vector<LaunchEnded> ended;
    if (ch_.fd() < 0) return ended;
    const bool open = ch_.fill();
    while (auto m = ch_.next()) {
      const json::value* op = m->if_contains("op");
      const json::value* k = m->if_contains("key");
      const json::value* r = m->if_contains("reason");
      if (op && op->is_string() && op->get_string() == "ended" && k && k->is_string()) {
        out_.erase(std::string(k->get_string()));
        ended.push_back({std::string(k->get_string()), r && r->is_string() ? std::string(r->get_string()) : "ended"});
      }
    }
    if (!open) {  // the bridge died (killed, out of memory) or gave its engine up
      ch_.close();
      reap();
      std::string why = "the " + engine_ + " bridge exited (" + last_line(log_) + ")";
      if (restarts_ < kMaxBridgeRestarts) {
        // A new bridge at once: launches sent while it starts wait in its socket.
        ++restarts_;
        try {
          spawn_bridge();
          why += "; a new bridge started (" + std::to_string(restarts_) + " of " + std::to_string(kMaxBridgeRestarts) + ")";
        } catch (const std::exception& e) {
          why += "; no new bridge: " + std::string(e.what());
        }
      }
      for (const auto& key : out_) ended.push_back({key, why});
      out_.clear();
    }
    return ended;
  }
  std::string describe() const override { return parsl_ ? scheduler_ : "Dask scheduler " + scheduler_; }
  void shutdown(double timeout_s) noexcept override {
    ch_.close();  // the bridge cancels what is out, closes its client (and cluster) and exits
    for (const double until = monotonic_s() + timeout_s; pid_ > 0 && monotonic_s() < until; ::usleep(20000)) reap();
    if (pid_ <= 0) return;
    signal_group(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
  }

 private:
  static constexpr int kMaxBridgeRestarts = 3;

  // Starts the bridge process on a new socket. A Parsl bridge after the first gets a run
  // directory of its own (SITE.parsl/bridge-N), where its HTEX's block names start again.
  void spawn_bridge() {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) throw Error("socketpair failed");
    SpawnSpec sp;
    sp.argv = argv_;
    if (parsl_)
      sp.argv.insert(sp.argv.end(),
                     {"--run-dir", (restarts_ ? run_dir_ / ("bridge-" + std::to_string(restarts_)) : run_dir_).string()});
    sp.env_extra = {"PYTHONUNBUFFERED=1"};
    sp.fds = {{sv[1], 3}};
    sp.stdout_file = log_;
    sp.stderr_file = log_;
    sp.parent_death_signal = SIGTERM;
    try {
      pid_ = spawn(sp);
    } catch (...) {
      ::close(sv[0]);
      ::close(sv[1]);
      throw;
    }
    ::close(sv[1]);
    ch_ = LineChannel(sv[0]);
  }

  // Collects the bridge process when it has exited. ECHILD: already collected (the local
  // pools collect every child that exits), so its pid is no longer ours to signal.
  void reap() noexcept {
    if (pid_ <= 0) return;
    int st = 0;
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) pid_ = -1;
  }

  [[noreturn]] void fail(const std::string& why) {
    shutdown(2);
    throw Error("site '" + site_ + "' (engine: " + (parsl_ ? "parsl" : "dask, endpoint " + endpoint_) + "): " + why +
                "; its log: " + log_.string());
  }

  std::string site_, engine_, endpoint_, scheduler_;
  bool parsl_;
  fs::path log_, run_dir_;
  std::vector<std::string> argv_;  ///< the bridge's command (a Parsl bridge's --run-dir added per start)
  int restarts_ = 0;
  pid_t pid_ = -1;
  LineChannel ch_;
  std::set<std::string> out_;  ///< launches the bridge holds
};

}  // namespace

std::unique_ptr<Launcher> make_bridge_launcher(const SiteSpec& site, const LaunchContext& ctx) {
  return std::make_unique<BridgeLauncher>(site, ctx);
}

}  // namespace diaspora::runner
