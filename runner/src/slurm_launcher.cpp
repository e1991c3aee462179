// The Slurm site's launcher: each attempt one batch job (sbatch, squeue, scancel;
// remote.hpp).
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

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "diaspora/error.hpp"
#include "diaspora/files.hpp"

namespace diaspora::runner {

namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

// Runs argv to completion (bounded by `timeout_s`, then SIGKILL); returns (wait status,
// stdout, stderr). Runner thread: waits for this pid only.
struct Captured {
  int status = -1;
  std::string out, err;
};
Captured run_captured(const std::vector<std::string>& argv, const fs::path& scratch, double timeout_s) {
  SpawnSpec sp;
  sp.argv = argv;
  const fs::path out = scratch.string() + ".out", err = scratch.string() + ".err";
  fs::remove(out);
  fs::remove(err);
  sp.stdout_file = out;
  sp.stderr_file = err;
  Captured c;
  const pid_t pid = spawn(sp);
  for (const double until = monotonic_s() + timeout_s;;) {
    const pid_t r = ::waitpid(pid, &c.status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) break;
    if (monotonic_s() > until) {
      signal_group(pid, SIGKILL);
      ::waitpid(pid, &c.status, 0);
      break;
    }
    ::usleep(5000);
  }
  auto slurp = [](const fs::path& p) {
    try {
      return read_file(p);
    } catch (const Error&) {
      return std::string();  // the command wrote nothing there
    }
  };
  c.out = slurp(out);
  c.err = slurp(err);
  fs::remove(out);
  fs::remove(err);
  return c;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// ---- Slurm: sbatch / squeue / scancel -------------------------------------------------------

class SlurmLauncher final : public Launcher {
 public:
  SlurmLauncher(const SiteSpec& site, const LaunchContext& ctx) : site_(site.name), spank_spec_(ctx.spank_spec) {
    if (site.endpoint) partition_ = *site.endpoint;
    dir_ = ctx.out_dir / "engines" / site_;
    fs::create_directories(dir_);
    for (const char* tool : {"sbatch", "squeue", "scancel"})
      if (!find_program(tool))
        throw Error("site '" + site_ + "' (engine: slurm): `" + tool + "` is not on PATH (Debian: slurm-client, "
                    "which scripts/install-deps.sh installs)");
    const Captured c = run_captured({find_program("squeue")->string(), "-h", "-o", "%i"}, dir_ / "probe", 20);
    if (!WIFEXITED(c.status) || WEXITSTATUS(c.status) != 0)
      throw Error("site '" + site_ + "' (engine: slurm): Slurm does not answer (squeue: " +
                  trim(c.err.empty() ? describe_wait_status(c.status) : c.err) + "); is slurmctld running, SLURM_CONF right?");
  }
  ~SlurmLauncher() override { shutdown(5); }

  void launch(const std::string& key, const std::string& name, const std::vector<std::string>& argv,
              const std::vector<std::string>& env) override {
    std::string wrap = "exec";
    for (const auto& a : argv) wrap += " '" + a + "'";  // our own paths and hex keys: no quote inside
    std::string exports = "--export=ALL";
    for (const auto& e : env) exports += "," + e;
    std::vector<std::string> cmd = {find_program("sbatch")->string(), "--parsable", "--job-name=diaspora-" + name,
                                    "--output=" + (dir_ / (name + ".%j.out")).string(), "--ntasks=1", exports};
    if (!partition_.empty()) cmd.push_back("--partition=" + partition_);
    if (!spank_spec_.empty()) cmd.push_back("--diaspora=" + spank_spec_.string());
    cmd.insert(cmd.end(), {"--wrap", wrap});
    const Captured c = run_captured(cmd, dir_ / "sbatch", 60);
    const std::string out = trim(c.out);
    if (!WIFEXITED(c.status) || WEXITSTATUS(c.status) != 0 || out.empty()) {
      std::string why = trim(c.err.empty() ? describe_wait_status(c.status) : c.err);
      if (why.find("diaspora") != std::string::npos && why.find("unrecognized") != std::string::npos)
        why += " (spank_diaspora.so is not in this Slurm's plugstack.conf: add it (docs/adapters.md) or set the "
               "site's attributes.spank: false)";
      throw Error("sbatch refused the job: " + why);
    }
    jobs_[key] = out.substr(0, out.find(';'));
  }
  void connected(const std::string& key) override { connected_.insert(key); }
  void cancel(const std::string& key) noexcept override {
    auto it = jobs_.find(key);
    if (it == jobs_.end()) return;
    try {
      SpawnSpec sp;
      sp.argv = {find_program("scancel")->string(), it->second};
      sp.stdout_file = sp.stderr_file = dir_ / "scancel.log";
      spawn(sp);  // reaped by the runner's reap loop
    } catch (const std::exception&) {
    }
    connected_.erase(key);
    jobs_.erase(it);
  }
  std::vector<LaunchEnded> poll() override {
    std::vector<LaunchEnded> ended;
    if (monotonic_s() < next_poll_) return ended;
    next_poll_ = monotonic_s() + 2;
    std::map<std::string, std::string> waiting;  // job id -> key, not connected yet
    for (const auto& [key, job] : jobs_)
      if (!connected_.count(key)) waiting[job] = key;
    if (waiting.empty()) return ended;
    std::string ids;
    for (const auto& [job, key] : waiting) ids += (ids.empty() ? "" : ",") + job;
    const Captured c = run_captured({find_program("squeue")->string(), "-h", "-o", "%i %T %r", "-j", ids}, dir_ / "squeue", 20);
    if (!WIFEXITED(c.status)) return ended;  // Slurm busy: ask again later
    std::map<std::string, std::string> state;
    std::istringstream lines(c.out);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream w(line);
      std::string id, st, reason;
      w >> id >> st;
      std::getline(w, reason);
      state[id] = st + (trim(reason).empty() || trim(reason) == " None" ? "" : " (" + trim(reason).substr(1) + ")");
    }
    static const std::set<std::string> alive = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"};
    for (const auto& [job, key] : waiting) {
      auto it = state.find(job);
      const std::string st = it == state.end() ? "gone" : it->second;
      if (alive.count(st.substr(0, st.find(' ')))) continue;
      std::string why = "Slurm job " + job + " ended (" + st + ") before its worker connected";
      for (const auto& e : fs::directory_iterator(dir_))
        if (e.path().filename().string().ends_with("." + job + ".out"))
          if (const std::string l = last_line(e.path()); !l.empty()) why += ": " + l;
      ended.push_back({key, why});
      jobs_.erase(key);
    }
    return ended;
  }
  std::string describe() const override { return "Slurm" + (partition_.empty() ? std::string() : " partition " + partition_); }
  void shutdown(double) noexcept override {
    for (auto it = jobs_.begin(); it != jobs_.end();) cancel((it++)->first);
  }

 private:
  std::string site_, partition_;
  fs::path spank_spec_, dir_;
  std::map<std::string, std::string> jobs_;  ///< key -> Slurm job id
  std::set<std::string> connected_;
  double next_poll_ = 0;
};

}  // namespace

std::unique_ptr<Launcher> make_slurm_launcher(const SiteSpec& site, const LaunchContext& ctx) {
  return std::make_unique<SlurmLauncher>(site, ctx);
}

}  // namespace diaspora::runner
