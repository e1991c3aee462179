// diaspora-exec: `diaspora exec --spec S --task NAME [--site S] -- CMD ARGS...` (the CLI
// execs this program). Runs CMD as a child process group of its own and reports its
// lifecycle through the engine plugin (loaded with dlopen, public C ABI only): submitted,
// started, heartbeats with the group's CPU use and memory (from /proc), progress and
// metrics from the child's DIASPORA_PROGRESS_FD, completed / failed with the exit status or
// the signal. Forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 to the child's
// group. Actions: checkpoint = SIGUSR1, cancel = SIGTERM (SIGKILL after --grace), restart =
// the same, then CMD again as the next attempt. docs/adapters.md, "Commands".
//
// Exit status: CMD's own; 128 + N when it was killed by signal N; 125 when diaspora exec
// itself cannot run (bad usage, a bad spec, the plugin cannot be loaded or opened and the
// spec does not say plugin.required: false, nor --optional was given); 126 when CMD is not
// executable; 127 when it is not found.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "diaspora/error.hpp"
#include "diaspora/signal_pipe.hpp"
#include "diaspora/wait_failure.h"
#include "diaspora/spec.hpp"
#include "diaspora/version.hpp"
#include "diaspora/plugin_loader.hpp"
#include "diaspora/process.hpp"

namespace fs = std::filesystem;
using diaspora::adapters::PluginLibrary;

namespace {

constexpr int kExecFailed = 125, kNotExecutable = 126, kNotFound = 127;

double mono() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Options {
  std::string spec, task, site, worker;
  int attempt = 1;
  double heartbeat_s = 1, hang_after_s = 60, grace_s = 10, close_timeout_s = 10;
  int max_restarts = 3;
  bool optional = false;
  std::vector<std::string> cmd;
};

// The engine id of one `diaspora exec` (DIASPORA_ENGINE_ID): its own spool directory and
// control topic, so that several run at once from one spec ("exec-" + the task id, made a
// valid name).
std::string engine_id_for(const std::string& task) {
  std::string id = "exec-";
  for (char c : task) id += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-') ? c : '-';
  return id.substr(0, 64);
}

// CPU seconds and resident bytes of every process in group `pgid` (from /proc/PID/stat).
std::pair<double, double> group_usage(pid_t pgid) {
  static const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  static const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
  double cpu = 0, rss = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::ifstream f(e.path() / "stat");
    std::string line;
    if (!std::getline(f, line)) continue;
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream in(line.substr(close + 2));
    std::vector<std::string> fld;  // fields from 3 (state) on
    std::string w;
    while (in >> w && fld.size() < 22) fld.push_back(w);
    if (fld.size() < 22 || std::stol(fld[2]) != pgid) continue;  // field 5: pgrp
    cpu += (std::stod(fld[11]) + std::stod(fld[12])) / tick;     // fields 14, 15: utime, stime
    rss += std::stod(fld[21]) * page;                             // field 24: rss (pages)
  }
  return {cpu, rss};
}

// The plugin seen from here: absent (running without it) or a handle, every call checked.
class Reporter {
 public:
  Reporter(const Options& o) : o_(o) {}

  // Loads the library and opens the spec; throws diaspora::Error (or SpecError) on failure.
  void open() {
    diaspora::SpecLoadResult r = diaspora::load_spec_file(o_.spec);
    if (!r.ok()) {
      std::string all;
      for (const auto& d : r.diagnostics) all += d.str() + "\n";
      throw diaspora::Error(all + "the spec has errors");
    }
    required_ = r.spec->plugin.required;
    // The plugin reads the spec file itself (relative paths resolve against its folder);
    // only the engine id is this process's own.
    ::setenv("DIASPORA_ENGINE_ID", engine_id_for(o_.task).c_str(), 1);
    fs::path library;
    if (r.spec->plugin.library)
      library = r.spec->plugin.library->is_absolute() ? *r.spec->plugin.library
                                                     : fs::absolute(o_.spec).parent_path() / *r.spec->plugin.library;
    lib_ = &diaspora::adapters::load_plugin(library);
    char err[8192] = {0};
    if (lib_->open_file(o_.spec.c_str(), &h_, err, sizeof err) != DIASPORA_OK)
      throw diaspora::Error(std::string("the plugin refused the spec: ") + err);
    lib_->set_action_callback(h_, &Reporter::on_action, this);
  }

  bool required() const { return required_; }
  bool active() const { return h_ != nullptr; }

  diaspora_task_info info(int attempt) const {
    diaspora_task_info i{};
    i.struct_size = sizeof i;
    i.task_id = o_.task.c_str();
    i.site = o_.site.empty() ? nullptr : o_.site.c_str();
    i.worker = o_.worker.c_str();
    i.attempt = attempt;
    i.step = -1;
    return i;
  }
  using Hook = decltype(&::diaspora_task_started);
  /// Calls one task hook of the plugin (nothing when running without it); a refusal is a
  /// warning on stderr, never a reason to stop the command.
  void call(Hook PluginLibrary::*hook, const diaspora_task_info& i, const char* what) {
    if (!h_) return;
    if (const int rc = (lib_->*hook)(h_, &i); rc != DIASPORA_OK) warn(what, rc);
  }
  void warn(const char* what, int rc) {
    char buf[1024] = {0};
    lib_->last_error(h_, buf, sizeof buf);
    std::cerr << "diaspora exec: " << what << " not reported (" << lib_->status_name(rc) << "): " << buf << "\n";
  }
  void ack(const std::string& id, bool ok, const std::string& msg) {
    if (!h_) return;
    if (ok) lib_->action_done(h_, id.c_str(), msg.c_str());
    else lib_->action_failed(h_, id.c_str(), msg.c_str());
  }

  std::deque<diaspora_action> take_actions() {
    std::lock_guard<std::mutex> lk(mu_);
    std::deque<diaspora_action> out;
    out.swap(actions_);
    return out;
  }

  int close() {
    if (!h_) return DIASPORA_OK;
    lib_->set_action_callback(h_, nullptr, nullptr);
    const int rc = lib_->close(h_, static_cast<std::int64_t>(o_.close_timeout_s * 1000));
    h_ = nullptr;
    return rc;
  }

 private:
  // The plugin's control thread: queue the action and wake the main loop.
  static void on_action(const diaspora_action* a, void* self) {
    auto* r = static_cast<Reporter*>(self);
    {
      std::lock_guard<std::mutex> lk(r->mu_);
      r->actions_.push_back(*a);
    }
    diaspora::wake_signal_pipe();  // byte 0 = "an action is waiting"
  }

  const Options& o_;
  const PluginLibrary* lib_ = nullptr;
  diaspora_plugin* h_ = nullptr;
  bool required_ = true;
  std::mutex mu_;
  std::deque<diaspora_action> actions_;
};

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return kExecFailed;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Run a command and report its lifecycle (started, heartbeats with CPU and memory, progress, the exit "
               "status or signal) through the Diaspora engine plugin; forward signals; carry out checkpoint, cancel "
               "and restart actions. Docs: docs/adapters.md, \"Commands\".",
               "diaspora exec"};
  app.set_version_flag("--version", std::string("diaspora-exec ") + diaspora::version_string);
  Options o;
  std::string heartbeat = "1s", hang_after = "60s", grace = "10s", close_timeout = "10s";
  int attempt = 0;
  app.add_option("--spec", o.spec, "Workflow spec (YAML): relay, plugin, policies")->required();
  app.add_option("--task", o.task, "Task id reported for the command (1..255 bytes)")->required();
  app.add_option("--site", o.site, "Site the command runs on (default: $DIASPORA_SITE, else none)");
  app.add_option("--worker", o.worker, "Worker reported (default: HOST:PID of diaspora exec)");
  app.add_option("--attempt", attempt, "Attempt number (default: $SLURM_RESTART_COUNT + 1, else 1)");
  app.add_option("--heartbeat", heartbeat, "Heartbeat period")->capture_default_str();
  app.add_option("--hang-after", hang_after, "A command with no CPU time and no report for this long is hung: its "
                                             "heartbeats stop (0: never)")->capture_default_str();
  app.add_option("--grace", grace, "Between SIGTERM and SIGKILL on cancel and restart")->capture_default_str();
  app.add_option("--max-restarts", o.max_restarts, "Restart actions carried out at most")->capture_default_str();
  app.add_option("--close-timeout", close_timeout, "How long to wait for the relay to ack the last events (the rest "
                                                   "stays in the spool)")->capture_default_str();
  app.add_flag("--optional", o.optional, "Run the command even when the plugin cannot be loaded or opened "
                                         "(like plugin.required: false)");
  app.add_option("command", o.cmd, "The command and its arguments (after --)")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExecFailed;
  }
  auto dur = [](const std::string& s, const char* name, double& out, bool zero_ok) {
    auto d = s == "0" ? std::optional<diaspora::Duration>(diaspora::Duration(0)) : diaspora::parse_duration(s);
    if (!d || d->count() < 0 || (!zero_ok && d->count() == 0)) {
      std::cerr << "diaspora exec: error: " << name << " '" << s << "': expected a duration such as 1s or 250ms"
                << (zero_ok ? " (or 0)" : "") << "\n";
      return false;
    }
    out = d->count();
    return true;
  };
  if (!dur(heartbeat, "--heartbeat", o.heartbeat_s, false) || !dur(hang_after, "--hang-after", o.hang_after_s, true) ||
      !dur(grace, "--grace", o.grace_s, true) || !dur(close_timeout, "--close-timeout", o.close_timeout_s, true))
    return kExecFailed;
  if (o.task.empty() || o.task.size() > DIASPORA_MAX_ID) {
    std::cerr << "diaspora exec: error: --task must be 1.." << DIASPORA_MAX_ID << " bytes\n";
    return kExecFailed;
  }
  if (o.site.empty())
    if (const char* s = std::getenv("DIASPORA_SITE")) o.site = s;
  if (attempt <= 0) {
    attempt = 1;
    if (const char* r = std::getenv("SLURM_RESTART_COUNT")) attempt = 1 + std::max(0, std::atoi(r));
  }
  if (o.worker.empty()) {
    char host[256] = {0};
    ::gethostname(host, sizeof host - 1);
    o.worker = std::string(host) + ":" + std::to_string(::getpid());
  }

  // Signals first: nothing may be lost between the child's start and the loop.
  try {
    // Forwarded to the child's group: TERM, INT, HUP, QUIT, USR1, USR2; CHLD only wakes the loop.
    diaspora::install_signal_pipe({SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD});
  } catch (const std::exception& e) {
    std::cerr << "diaspora exec: " << e.what() << "\n";
    return kExecFailed;
  }

  Reporter rep(o);
  try {
    rep.open();
  } catch (const std::exception& e) {
    const bool lax = o.optional || !rep.required();
    const std::string what = e.what();
    const bool located = what.find(": error: ") != std::string::npos;  // FILE:LINE:COL: error: ... says it already
    std::cerr << "diaspora exec: " << (lax ? "warning: running without the plugin: " : located ? "" : "error: ") << what
              << "\n";
    if (!lax) return kExecFailed;
  }

  const auto program = diaspora::adapters::find_program(o.cmd[0]);
  int exit_code = 0;
  int restarts = 0;
  {
    auto i = rep.info(attempt);
    i.name = o.task.c_str();
    rep.call(&PluginLibrary::task_submitted, i, "submitted");
  }
  while (true) {
    const auto info = rep.info(attempt);
    if (!program || ::access(program->c_str(), X_OK) != 0) {
      const bool missing = !program || !fs::exists(*program);
      const std::string why = o.cmd[0] + (missing ? ": command not found" : ": permission denied (not executable)");
      std::cerr << "diaspora exec: " << why << "\n";
      auto f = info;
      f.reason = why.c_str();
      f.exit_code = missing ? kNotFound : kNotExecutable;
      f.has_exit_code = 1;
      rep.call(&PluginLibrary::task_failed, f, "failed");
      exit_code = f.exit_code;
      break;
    }
    int pfd[2];
    if (::pipe2(pfd, O_CLOEXEC) != 0) {
      std::perror("diaspora exec: pipe");
      exit_code = kExecFailed;
      break;
    }
    diaspora::adapters::SpawnSpec sp;
    sp.argv = o.cmd;
    sp.argv[0] = program->string();
    sp.fds = {{pfd[1], 3}};
    sp.env_extra = {"DIASPORA_PROGRESS_FD=3", "DIASPORA_TASK_ID=" + o.task, "DIASPORA_ATTEMPT=" + std::to_string(attempt)};
    if (!o.site.empty()) sp.env_extra.push_back("DIASPORA_SITE=" + o.site);
    sp.parent_death_signal = SIGTERM;  // nobody would report it any more
    pid_t child = -1;
    try {
      child = diaspora::adapters::spawn(sp);
    } catch (const std::exception& e) {
      std::cerr << "diaspora exec: " << e.what() << "\n";
      ::close(pfd[0]);
      ::close(pfd[1]);
      exit_code = kExecFailed;
      break;
    }
    ::close(pfd[1]);
    diaspora::adapters::LineChannel progress(pfd[0]);  // non-blocking reads, one report a line
    rep.call(&PluginLibrary::task_started, info, "started");

    double last_cpu = 0, last_sample = mono(), last_activity = mono(), next_beat = mono() + o.heartbeat_s;
    double kill_at = -1;  // SIGKILL the group then (after SIGTERM for cancel / restart)
    bool hung = false, cancelled = false, restarting = false;
    std::string stop_action, stop_reason;
    // What the command wrote on its progress channel. Also called once after it exited
    // (lines written just before the exit).
    auto read_progress = [&] {
      const bool open = progress.fill();
      while (auto line = progress.next_line()) {
        auto i = info;
        std::vector<diaspora_metric_value> mv;  // views into pl: both live until the hook is called
        const auto pl = diaspora::adapters::parse_progress_line(*line);
        const auto hook = diaspora::adapters::apply_progress_line(pl, i, mv);
        if (hook == diaspora::adapters::ProgressHook::none) continue;
        last_activity = mono();
        if (hook == diaspora::adapters::ProgressHook::progress) rep.call(&PluginLibrary::task_progress, i, "progress");
        else if (!hung) rep.call(&PluginLibrary::task_heartbeat, i, "heartbeat");
      }
      if (!open) progress.close();
    };
    int status = 0;
    rusage ru{};
    while (true) {
      const pid_t w = ::wait4(child, &status, WNOHANG, &ru);
      if (w == child) {
        if (progress.fd() >= 0) read_progress();
        break;
      }
      const double now = mono();
      if (kill_at > 0 && now >= kill_at) {
        diaspora::adapters::signal_group(child, SIGKILL);
        kill_at = -1;
      }
      double wait_s = std::max(0.0, next_beat - now);
      if (kill_at > 0) wait_s = std::min(wait_s, std::max(0.0, kill_at - now));
      pollfd fds[2] = {{diaspora::signal_pipe_fd(), POLLIN, 0}, {progress.fd(), POLLIN, 0}};
      ::poll(fds, progress.fd() >= 0 ? 2 : 1, static_cast<int>(std::ceil(std::min(wait_s, 1.0) * 1000)));
      for (int sig : diaspora::drain_signal_pipe())
        if (sig != 0 && sig != SIGCHLD) diaspora::adapters::signal_group(child, sig);
      if (progress.fd() >= 0 && (fds[1].revents & (POLLIN | POLLHUP))) read_progress();
      for (const auto& a : rep.take_actions()) {
        const std::string id = a.id;
        if (std::string(a.task_id) != o.task) {
          rep.ack(id, false, "diaspora exec runs task " + o.task + " only");
        } else if (a.kind == DIASPORA_ACTION_CHECKPOINT) {
          diaspora::adapters::signal_group(child, SIGUSR1);
          rep.ack(id, true, "SIGUSR1 sent to the command");
        } else if ((a.kind == DIASPORA_ACTION_CANCEL || a.kind == DIASPORA_ACTION_RESTART) && !stop_action.empty()) {
          rep.ack(id, false, "not needed: the command is already being stopped (action " + stop_action + ")");
        } else if (a.kind == DIASPORA_ACTION_CANCEL) {
          cancelled = true;
          stop_action = id;
          stop_reason = std::string("cancelled (action ") + id + "): " + a.reason;
          diaspora::adapters::signal_group(child, SIGTERM);
          kill_at = mono() + o.grace_s;
          rep.ack(id, true, "SIGTERM sent to the command");
        } else if (a.kind == DIASPORA_ACTION_RESTART) {
          if (restarts >= o.max_restarts) {
            rep.ack(id, false, "the command was restarted " + std::to_string(restarts) + " times (--max-restarts)");
            continue;
          }
          restarting = true;
          stop_action = id;
          stop_reason = "stopped for restart (action " + id + ")";
          diaspora::adapters::signal_group(child, SIGTERM);
          kill_at = mono() + o.grace_s;
        } else {
          rep.ack(id, false, std::string("diaspora exec cannot ") + a.kind_name +
                                 ": it runs one command on this host (use the batch system's own means)");
        }
      }
      if (mono() >= next_beat) {
        const auto [cpu, rss] = group_usage(child);
        const double t = mono();
        const double cores = t > last_sample ? (cpu - last_cpu) / (t - last_sample) : 0;
        if (cpu - last_cpu > 0.005) last_activity = t;
        last_cpu = cpu;
        last_sample = t;
        const bool now_hung = o.hang_after_s > 0 && t - last_activity >= o.hang_after_s && !diaspora::adapters::process_stopped(child);
        if (now_hung && !hung)
          std::cerr << "diaspora exec: " << o.task << " looks hung: no CPU time and no report for "
                    << static_cast<int>(t - last_activity) << " s; heartbeats withheld\n";
        else if (!now_hung && hung)
          std::cerr << "diaspora exec: " << o.task << " is active again; heartbeats resume\n";
        hung = now_hung;
        if (!hung && !diaspora::adapters::process_stopped(child)) {
          auto i = info;
          const diaspora_metric_value m[2] = {{"cpu_cores", std::max(0.0, cores)}, {"rss_mib", rss / 1048576.0}};
          i.metrics = m;
          i.metric_count = 2;
          rep.call(&PluginLibrary::task_heartbeat, i, "heartbeat");
        }
        next_beat = t + o.heartbeat_s;
      }
    }
    progress.close();
    diaspora::adapters::signal_group(child, SIGKILL);  // what the command left behind in its group
    {
      auto i = info;
      const diaspora_metric_value m[2] = {
          {"cpu_s", static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                        static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6},
          {"max_rss_mib", static_cast<double>(ru.ru_maxrss) / 1024.0}};
      i.metrics = m;
      i.metric_count = 2;
      rep.call(&PluginLibrary::task_heartbeat, i, "heartbeat");
    }
    const std::string words = diaspora::adapters::describe_wait_status(status);
    auto end = info;
    end.exit_code = exit_code_of(status);
    end.has_exit_code = 1;
    if (restarting) {
      const std::string why = stop_reason + "; the command ended with " + words;
      end.reason = why.c_str();
      end.retryable = 1;
      rep.call(&PluginLibrary::task_failed, end, "failed");
      ++restarts;
      ++attempt;
      auto s = rep.info(attempt);
      rep.call(&PluginLibrary::task_submitted, s, "submitted");
      rep.ack(stop_action, true, "attempt " + std::to_string(attempt) + " of " + o.task + " submitted");
      continue;
    }
    exit_code = exit_code_of(status);
    if (cancelled) {
      const std::string why = stop_reason + "; the command ended with " + words;
      end.reason = why.c_str();
      rep.call(&PluginLibrary::task_cancelled, end, "cancelled");
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      rep.call(&PluginLibrary::task_completed, end, "completed");
    } else {
      end.reason = words.c_str();
      end.failure = diaspora_failure_of_wait_status(status);  // killed from outside: lost; its own exit or crash: error
      rep.call(&PluginLibrary::task_failed, end, "failed");
    }
    break;
  }
  const int rc = rep.close();
  if (rc == DIASPORA_ERR_TIMEOUT)
    std::cerr << "diaspora exec: the relay did not ack every event in time; the rest is in the spool\n";
  else if (rc != DIASPORA_OK)
    std::cerr << "diaspora exec: closing the plugin failed (status " << rc << "); see the spool\n";
  return exit_code;
}
