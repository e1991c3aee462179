#include "diaspora/process.hpp"

#include "diaspora/data_item.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <fstream>
#include <map>
#include <system_error>

#include "diaspora/error.hpp"
#include "diaspora/files.hpp"
#include "diaspora/json_exact.hpp"

extern char** environ;

namespace diaspora::adapters {

namespace json = boost::json;

namespace {

// Closes every descriptor from `first` up. Async-signal-safe.
void close_from(int first) {
  if (::close_range(static_cast<unsigned>(first), ~0U, 0) != 0)
    for (int fd = first; fd < 65536; ++fd) ::close(fd);
}

// The guard's signal for its whole group when its parent dies (set before the handler).
volatile sig_atomic_t g_guard_signal = SIGKILL;

void guard_parent_died(int) { ::kill(0, g_guard_signal); }

// SpawnSpec::guard_group, in the forked child (the group's leader): forks the program's
// process and returns in it; the guard itself waits for the program and exits as it did.
// When the spawning thread dies the guard sends `sig` to the whole group, so grandchildren
// (a pipeline's commands, a job's ranks) stop with it. Async-signal-safe calls only.
void guard_group(int sig, pid_t parent) {
  // What the runner sends the group is for the program: the guard ignores it.
  constexpr int kForProgram[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE};
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  for (int s : kForProgram) ::sigaction(s, &ignore, nullptr);
  g_guard_signal = sig;
  const int death = SIGRTMAX;
  struct sigaction on_death {};
  on_death.sa_handler = guard_parent_died;
  ::sigaction(death, &on_death, nullptr);
  ::prctl(PR_SET_PDEATHSIG, death);
  if (::getppid() != parent) ::_exit(127);  // the parent died before the call
  const pid_t program = ::fork();
  if (program < 0) ::_exit(127);
  if (program == 0) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int s : kForProgram) ::sigaction(s, &dfl, nullptr);
    ::sigaction(death, &dfl, nullptr);
    ::prctl(PR_SET_PDEATHSIG, 0);
    return;
  }
  close_from(3);  // the parent's sockets and pipes stay with the program only
  int status = 0;
  while (::waitpid(program, &status, 0) < 0)
    if (errno != EINTR) ::_exit(127);
  if (WIFEXITED(status)) ::_exit(WEXITSTATUS(status));
  const int killed = WTERMSIG(status);  // die of the same signal, as the program did
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(killed, &dfl, nullptr);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, killed);
  ::sigprocmask(SIG_UNBLOCK, &one, nullptr);
  ::kill(::getpid(), killed);
  ::_exit(128 + killed);
}

}  // namespace

pid_t spawn(const SpawnSpec& spec) {
  // Everything the child needs is built here: after fork only async-signal-safe calls.
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string_view kv(*e);
    const auto eq = kv.find('=');
    env[std::string(kv.substr(0, eq))] = std::string(*e);
  }
  for (const auto& kv : spec.env_extra) env[kv.substr(0, kv.find('='))] = kv;
  std::vector<std::string> env_store;
  for (auto& [k, v] : env) env_store.push_back(v);
  std::vector<char*> envp;
  for (auto& s : env_store) envp.push_back(s.data());
  envp.push_back(nullptr);
  auto open_out = [](const std::optional<std::filesystem::path>& p) {
    if (!p) return -1;
    int fd = ::open(p->c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) throw Error("cannot open " + p->string() + ": " + storage::errno_text(errno));
    return fd;
  };
  const int out_fd = open_out(spec.stdout_file);
  const int err_fd = open_out(spec.stderr_file);
  rlimit mem{};
  if (spec.memory_limit) mem.rlim_cur = mem.rlim_max = spec.memory_limit;

  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    if (out_fd >= 0) ::close(out_fd);
    if (err_fd >= 0) ::close(err_fd);
    throw Error("fork failed: " + storage::errno_text(e));
  }
  if (pid == 0) {
    if (spec.new_process_group) ::setpgid(0, 0);
    ::signal(SIGPIPE, SIG_DFL);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (spec.guard_group && spec.new_process_group && spec.parent_death_signal != 0) guard_group(spec.parent_death_signal, parent);
    // After the defaults: a parent-death signal must not reach the parent's handlers.
    else if (spec.parent_death_signal != 0) {
      ::prctl(PR_SET_PDEATHSIG, spec.parent_death_signal);
      if (::getppid() != parent) ::_exit(127);  // the parent died before the call
    }
    if (out_fd >= 0) ::dup2(out_fd, 1);
    if (err_fd >= 0) ::dup2(err_fd, 2);
    // dup2 onto targets: first move sources above every target so that no source is overwritten.
    int moved[16];
    const std::size_t n = std::min<std::size_t>(spec.fds.size(), 16);
    for (std::size_t i = 0; i < n; ++i) moved[i] = ::fcntl(spec.fds[i].first, F_DUPFD, 64);
    for (std::size_t i = 0; i < n; ++i) {
      ::dup2(moved[i], spec.fds[i].second);
      ::close(moved[i]);
    }
    // Nothing else of the parent's crosses exec: libraries (Asio's acceptor, for one) do not
    // all open their descriptors close-on-exec, and a child holding the relay's listening
    // socket keeps its port from being bound again.
    int highest = 2;
    for (std::size_t i = 0; i < n; ++i) highest = std::max(highest, spec.fds[i].second);
    close_from(highest + 1);
    if (spec.memory_limit) ::setrlimit(RLIMIT_AS, &mem);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  if (spec.new_process_group) ::setpgid(pid, pid);  // both sides, so no signal races the child's own call
  if (out_fd >= 0) ::close(out_fd);
  if (err_fd >= 0) ::close(err_fd);
  return pid;
}

ProgressHook apply_progress_line(const ProgressLine& pl, diaspora_task_info& info, std::vector<diaspora_metric_value>& metrics) {
  switch (pl.kind) {
    case ProgressLine::Kind::none: return ProgressHook::none;
    case ProgressLine::Kind::progress:
      info.progress = pl.value;
      info.step = pl.step;
      return ProgressHook::progress;
    case ProgressLine::Kind::metric:
      metrics = pl.metric_values();
      info.metrics = metrics.data();
      info.metric_count = metrics.size();
      return ProgressHook::heartbeat;
    case ProgressLine::Kind::heartbeat: return ProgressHook::heartbeat;
    case ProgressLine::Kind::checkpoint:
    case ProgressLine::Kind::result: return ProgressHook::none;  // the runner's (rehearsal jobs)
  }
  return ProgressHook::none;
}

ProgressLine parse_progress_line(const std::string& line) {
  ProgressLine out;
  if (line.starts_with("result ")) {  // the rest of the line is one JSON object
    if (line.size() > (1u << 20)) return out;
    json::error_code ec;  // numbers exact: the result goes into the report as the trainer wrote it
    json::value v = parse_json_exact(std::string_view(line).substr(7), ec);
    if (ec || !v.is_object()) return out;
    out.kind = ProgressLine::Kind::result;
    out.result = std::move(v.get_object());
    return out;
  }
  std::istringstream in(line);
  std::string word;
  in >> word;
  if (word == "progress") {
    double p = -1;
    if (!(in >> p) || !(p >= 0 && p <= 1)) return out;  // a failed read leaves 0: not a progress
    long step = -1;
    if (!(in >> step) || step < 0) step = -1;
    out.kind = ProgressLine::Kind::progress;
    out.value = p;
    out.step = step;
  } else if (word == "metric") {
    std::string name;
    while (in >> name) {
      double v = 0;
      if (!(in >> v) || name.size() > 63 || !std::isfinite(v) || out.metrics.size() == 32) return {};
      for (const auto& m : out.metrics)
        if (m.first == name) return {};
      out.metrics.emplace_back(std::move(name), v);
    }
    if (out.metrics.empty()) return {};
    out.kind = ProgressLine::Kind::metric;
  } else if (word == "heartbeat") {
    out.kind = ProgressLine::Kind::heartbeat;
  } else if (word == "checkpoint") {
    std::string uri, more;
    if (!(in >> uri) || (in >> more) || !data::parse_item_uri(uri)) return out;
    out.kind = ProgressLine::Kind::checkpoint;
    out.uri = std::move(uri);
  }
  return out;
}

std::optional<std::filesystem::path> find_program(const std::string& word) {
  if (word.empty()) return std::nullopt;
  if (word.find('/') != std::string::npos) return std::filesystem::path(word);
  const char* path = std::getenv("PATH");
  std::string_view dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const auto colon = dirs.find(':');
    const std::string dir(dirs.substr(0, colon));
    const std::filesystem::path cand = std::filesystem::path(dir.empty() ? "." : dir) / word;
    std::error_code ec;
    if (std::filesystem::is_regular_file(cand, ec) && ::access(cand.c_str(), X_OK) == 0) return cand;
    if (colon == std::string_view::npos) return std::nullopt;
    dirs.remove_prefix(colon + 1);
  }
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int s = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(s);
    return "killed by signal " + std::to_string(s) + (abbrev ? std::string(" (SIG") + abbrev + ")" : "");
  }
  return "wait status " + std::to_string(status);
}

std::filesystem::path self_executable(const char* argv0) {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) return p;
  return argv0 ? std::filesystem::absolute(argv0) : std::filesystem::path();
}

std::filesystem::path trainer_executable() {
  if (const char* given = std::getenv("DIASPORA_TRAIN"); given && *given)  // a wrapper: a container, a namespace, srun
    return ::access(given, X_OK) == 0 ? std::filesystem::path(given) : std::filesystem::path();
  const auto p = self_executable().parent_path() / "diaspora-train";
  return ::access(p.c_str(), X_OK) == 0 ? p : std::filesystem::path();
}

void signal_group(pid_t pgid, int sig) noexcept {
  if (pgid > 0) ::kill(-pgid, sig);
}

bool process_stopped(pid_t pid) noexcept {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return true;
  buf[n] = 0;
  const char* close_paren = std::strrchr(buf, ')');  // the command name may hold spaces and ')'
  if (!close_paren || close_paren[1] == 0) return true;
  const char state = close_paren[2];
  return state == 'T' || state == 't' || state == 'Z' || state == 'X';
}

LineChannel::LineChannel(int fd) : fd_(fd) {
  const int fl = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

bool LineChannel::fill() {
  if (fd_ < 0) return false;
  char tmp[65536];
  for (;;) {
    const ssize_t n = ::read(fd_, tmp, sizeof tmp);
    if (n > 0) {
      buf_.append(tmp, static_cast<std::size_t>(n));
      if (buf_.size() > (1u << 20) && buf_.find('\n') == std::string::npos) return false;  // a runaway line
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

std::optional<std::string> LineChannel::next_line() {
  const auto nl = buf_.find('\n');
  if (nl == std::string::npos) return std::nullopt;
  std::string line = buf_.substr(0, nl);
  buf_.erase(0, nl + 1);
  return line;
}

std::optional<json::object> LineChannel::next() {
  auto text = next_line();
  if (!text) return std::nullopt;
  const std::string& line = *text;
  std::error_code ec;
  json::value v = json::parse(line, ec);
  if (ec || !v.is_object()) return json::object{{"op", "invalid"}, {"line", line.substr(0, 200)}};
  return std::move(v.get_object());
}

bool LineChannel::send(const json::object& msg) {
  if (fd_ < 0) return false;
  std::string line = json::serialize(msg);
  line += '\n';
  std::size_t off = 0;
  while (off < line.size()) {
    const ssize_t n = ::send(fd_, line.data() + off, line.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      if (::poll(&p, 1, 1000) <= 0) return false;  // a peer that reads nothing for a second is gone
      continue;
    }
    return false;
  }
  return true;
}

void LineChannel::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  buf_.clear();
}

}  // namespace diaspora::adapters
