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
#include "worker.hpp"

#ifndef DIASPORA_RUNNER_PYTHON_DIR
#define DIASPORA_RUNNER_PYTHON_DIR ""
#endif

namespace diaspora::runner {

namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

double mono_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// "HOST:PORT" split at the last ':'; throws on a missing port.
std::pair<std::string, std::string> split_host_port(const std::string& a) {
  const auto c = a.rfind(':');
  if (c == std::string::npos || c == 0 || c + 1 == a.size()) throw Error("'" + a + "' is not HOST:PORT");
  return {a.substr(0, c), a.substr(c + 1)};
}

// The last non-empty line of a file (a log's last word on why something ended), or "".
std::string last_line(const fs::path& file) {
  std::ifstream f(file);
  std::string line, last;
  while (std::getline(f, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last.substr(0, 400);
}

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
  for (const double until = mono_s() + timeout_s;;) {
    const pid_t r = ::waitpid(pid, &c.status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) break;
    if (mono_s() > until) {
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

// ---- Dask: the bridge process (runner/python/dask_bridge.py) -----------------------------

// The runner's Dask bridge script: in the source tree this binary was built from, or the
// installed share/diaspora/runner. It imports nothing of Diaspora's (run as a script, its
// Dask task is pickled by value: Dask workers need diaspora-run, not a Python package).
std::string bridge_script() {
  const fs::path c[] = {fs::path(DIASPORA_RUNNER_PYTHON_DIR) / "dask_bridge.py",
                        self_executable().parent_path().parent_path() / "share" / "diaspora" / "runner" / "dask_bridge.py"};
  for (const auto& p : c)
    if (fs::exists(p)) return p.string();
  throw Error("diaspora-run's Dask bridge (dask_bridge.py) is neither in the source tree (" + c[0].string() +
              ") nor installed (" + c[1].string() + "): reinstall diaspora-run");
}

class DaskLauncher final : public Launcher {
 public:
  DaskLauncher(const SiteSpec& site, const LaunchContext& ctx) : site_(site.name) {
    endpoint_ = site.endpoint.value_or("local");
    const char* py = std::getenv("DIASPORA_PYTHON");
    const std::string python = py && *py ? py : "/usr/bin/python3";
    if (::access(python.c_str(), X_OK) != 0)
      throw Error("site '" + site_ + "': no Python at " + python + " (scripts/install-deps.sh installs Debian's; "
                  "DIASPORA_PYTHON names another)");
    fs::create_directories(ctx.out_dir / "engines");
    log_ = ctx.out_dir / "engines" / (site_ + ".log");
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) throw Error("socketpair failed");
    SpawnSpec sp;
    sp.argv = {python, bridge_script(), "--site", site_, "--endpoint", endpoint_,
               "--workers", std::to_string(site.workers), "--fd", "3"};
    if (auto it = site.attributes.find("dask_workers"); it != site.attributes.end() && it->second.is_string())
      sp.argv.insert(sp.argv.end(), {"--restrict", std::string(it->second.get_string())});
    if (auto it = site.attributes.find("connect_timeout"); it != site.attributes.end() && it->second.is_number())
      sp.argv.insert(sp.argv.end(), {"--connect-timeout", std::to_string(it->second.to_number<double>())});
    sp.env_extra = {"PYTHONUNBUFFERED=1"};
    sp.fds = {{sv[1], 3}};
    sp.stdout_file = log_;
    sp.stderr_file = log_;
    sp.parent_death_signal = SIGTERM;
    pid_ = spawn(sp);
    ::close(sv[1]);
    ch_ = LineChannel(sv[0]);
    // Wait for the bridge's "ready" (a LocalCluster takes a few seconds to start).
    for (const double until = mono_s() + 90;;) {
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
      if (!open) fail("the Dask bridge exited (" + last_line(log_) + ")");
      if (mono_s() > until) fail("the Dask scheduler did not answer within 90 s");
    }
  }

  ~DaskLauncher() override { shutdown(10); }

  void launch(const std::string& key, const std::string& name, const std::vector<std::string>& argv,
              const std::vector<std::string>& env) override {
    json::array a, e;
    for (const auto& x : argv) a.emplace_back(x);
    for (const auto& x : env) e.emplace_back(x);
    if (!ch_.send({{"op", "launch"}, {"key", key}, {"name", name}, {"argv", a}, {"env", e}}))
      throw Error("the Dask bridge of site '" + site_ + "' is gone (" + last_line(log_) + ")");
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
    if (!open) {
      ch_.close();
      for (const auto& key : out_) ended.push_back({key, "the Dask bridge exited (" + last_line(log_) + ")"});
      out_.clear();
    }
    return ended;
  }
  std::string describe() const override { return "Dask scheduler " + scheduler_; }
  void shutdown(double timeout_s) noexcept override {
    ch_.close();  // the bridge cancels what is out, closes its client (and cluster) and exits
    if (pid_ <= 0) return;
    int st = 0;
    for (const double until = mono_s() + timeout_s; mono_s() < until; ::usleep(20000))
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
    signal_group(pid_, SIGKILL);
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
  }

 private:
  [[noreturn]] void fail(const std::string& why) {
    shutdown(2);
    throw Error("site '" + site_ + "' (engine: dask, endpoint " + endpoint_ + "): " + why + "; its log: " + log_.string());
  }

  std::string site_, endpoint_, scheduler_;
  fs::path log_;
  pid_t pid_ = -1;
  LineChannel ch_;
  std::set<std::string> out_;  ///< launches the bridge holds
};

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
    if (mono_s() < next_poll_) return ended;
    next_poll_ = mono_s() + 2;
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

std::string host_name() {
  char h[256] = {0};
  ::gethostname(h, sizeof h - 1);
  return h;
}

// ---- listener --------------------------------------------------------------------------------

WorkerListener::WorkerListener(const std::string& bind_host) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ < 0) throw Error("socket: " + storage::errno_text(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (::inet_pton(AF_INET, bind_host.c_str(), &a.sin_addr) != 1) throw Error("not an IPv4 address: " + bind_host);
  socklen_t len = sizeof a;
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 64) != 0 ||
      ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const std::string e = storage::errno_text(errno);
    ::close(fd_);
    throw Error("cannot listen for remote workers on " + bind_host + ": " + e);
  }
  address_ = bind_host + ":" + std::to_string(ntohs(a.sin_port));
}

WorkerListener::~WorkerListener() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<int> WorkerListener::fds() const {
  std::vector<int> v{fd_};
  for (const auto& p : pending_) v.push_back(p.ch.fd());
  return v;
}

std::vector<Hello> WorkerListener::service() {
  for (;;) {
    const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) break;
    const int one = 1;
    ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pending_.push_back({LineChannel(c), mono_s()});
  }
  std::vector<Hello> out;
  for (auto it = pending_.begin(); it != pending_.end();) {
    const bool open = it->ch.fill();
    std::optional<json::object> m = it->ch.next();
    if (m) {
      Hello h;
      auto str = [&](const char* k) {
        const json::value* v = m->if_contains(k);
        return v && v->is_string() ? std::string(v->get_string()) : std::string();
      };
      auto num = [&](const char* k) -> pid_t {
        const json::value* v = m->if_contains(k);
        return v && v->is_int64() ? static_cast<pid_t>(v->get_int64()) : -1;
      };
      if (str("op") == "hello" && !str("key").empty()) {
        h.key = str("key");
        h.host = str("host");
        h.pid = num("pid");
        h.engine_pid = num("engine_pid");
        h.ch = std::move(it->ch);
        out.push_back(std::move(h));
      } else {
        it->ch.close();  // not one of ours
      }
      it = pending_.erase(it);
    } else if (!open || mono_s() - it->since > 10) {
      it->ch.close();
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::string local_address_towards(const std::string& host) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (host.empty() || ::getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res) return "127.0.0.1";
  std::string out = "127.0.0.1";
  const int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in me{};
  socklen_t len = sizeof me;
  if (s >= 0 && ::connect(s, res->ai_addr, res->ai_addrlen) == 0 && ::getsockname(s, reinterpret_cast<sockaddr*>(&me), &len) == 0) {
    char b[INET_ADDRSTRLEN];
    if (::inet_ntop(AF_INET, &me.sin_addr, b, sizeof b)) out = b;
  }
  if (s >= 0) ::close(s);
  ::freeaddrinfo(res);
  return out;
}

std::unique_ptr<Launcher> make_launcher(const SiteSpec& site, const LaunchContext& ctx) {
  if (site.engine == Engine::dask) return std::make_unique<DaskLauncher>(site, ctx);
  if (site.engine == Engine::slurm) return std::make_unique<SlurmLauncher>(site, ctx);
  throw Error("site '" + site.name + "': `diaspora run` drives local, dask and slurm sites, not " + std::string(to_string(site.engine)));
}

int remote_worker_main(const std::string& address, const std::string& key) {
  std::pair<std::string, std::string> hp;
  try {
    hp = split_host_port(address);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "diaspora-run __worker: %s\n", e.what());
    return 2;
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (::getaddrinfo(hp.first.c_str(), hp.second.c_str(), &hints, &res) != 0 || !res) {
    std::fprintf(stderr, "diaspora-run __worker: cannot resolve %s\n", address.c_str());
    return 2;
  }
  int fd = -1;
  for (addrinfo* r = res; r && fd < 0; r = r->ai_next) {
    fd = ::socket(r->ai_family, r->ai_socktype | SOCK_CLOEXEC, r->ai_protocol);
    if (fd >= 0 && ::connect(fd, r->ai_addr, r->ai_addrlen) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    std::fprintf(stderr, "diaspora-run __worker: cannot connect to the runner at %s: %s\n", address.c_str(),
                 storage::errno_text(errno).c_str());
    return 2;
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const char* ep = std::getenv("DIASPORA_ENGINE_WORKER_PID");
  json::object hello{{"op", "hello"}, {"key", key}, {"pid", static_cast<std::int64_t>(::getpid())}, {"host", host_name()},
                     {"engine_pid", ep ? std::atoll(ep) : -1}};
  const std::string line = json::serialize(hello) + "\n";
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 2;
  return worker_main(fd);
}

}  // namespace diaspora::runner
