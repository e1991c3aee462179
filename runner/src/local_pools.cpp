#include "local_pools.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "diaspora/error.hpp"
#include "diaspora/files.hpp"
#include "signals.hpp"

namespace diaspora::runner {

namespace fs = std::filesystem;
namespace json = boost::json;

void LocalPools::spawn_worker(Site& s, Slot& slot) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) throw Error("socketpair: " + storage::errno_text(errno));
  SpawnSpec sp;
  sp.argv = {self_executable().string(), "__worker", s.name(), std::to_string(slot.index)};
  sp.fds = {{sv[1], 3}};
  sp.stderr_file = ctx_.opt.out_dir / "workers.log";
  sp.env_extra = {"DIASPORA_SITE=" + s.name(), "DIASPORA_WORKER=" + std::to_string(slot.index)};
  sp.parent_death_signal = SIGKILL;  // the runner killed: its workers stop computing
  try {
    slot.pid = spawn(sp);
  } catch (...) {
    ::close(sv[0]);
    ::close(sv[1]);
    throw;
  }
  ::close(sv[1]);
  track_group(slot.pid, true);
  slot.ch = LineChannel(sv[0]);
  slot.ready = false;
  slot.respawn_at = -1;
  if (s.stopped_phase) signal_group(slot.pid, SIGSTOP);
}

bool LocalPools::start_kind(int ii, int ai, Site& s, Slot& slot, const json::object& run) {
  lifecycle_.announce_start(ii, ai, s, slot, false);
  if (!slot.ch.send(run)) {
    slot.inst = slot.att = -1;
    lifecycle_.ended(ii, ai, false, "worker " + worker_name(s.name(), slot.index) + " did not take the task (its channel is closed)");
    return false;
  }
  lifecycle_.announce_start(ii, ai, s, slot, true);
  return true;
}

bool LocalPools::start_command(int ii, int ai, Site& s, Slot& slot) {
  const Instance& inst = store_.at(ii);
  const Attempt& a = store_.attempt(ii, ai);
  const TaskSpec& ts = ctx_.task(inst.task);
  int pfd[2];
  if (::pipe2(pfd, O_CLOEXEC) != 0) throw Error("pipe: " + storage::errno_text(errno));
  auto failed = [&](const std::string& why) {
    ::close(pfd[0]);
    ::close(pfd[1]);
    slot.inst = slot.att = -1;  // the slot is free again
    lifecycle_.ended(ii, ai, false, why);
    return false;
  };
  SpawnSpec sp;
  if (ctx_.is_job(inst.task)) {
    sp.parent_death_signal = SIGTERM;  // the runner killed: the job checkpoints and stops (--resume continues it)
    try {
      sp.argv = jobs_.argv(inst.task);
    } catch (const std::exception& e) {  // diaspora::Error, or the job folder cannot be made
      return failed(e.what());
    }
  } else {
    sp.argv = {"/bin/sh", "-c", *ts.command};
    sp.parent_death_signal = SIGKILL;  // the runner killed: its commands stop
  }
  sp.guard_group = true;  // ... and what they started: the whole process group
  lifecycle_.announce_start(ii, ai, s, slot, false);
  sp.fds = {{pfd[1], 3}};
  const std::string base = (ctx_.tasks_dir / (a.hook_id + "." + std::to_string(a.number))).string();
  sp.stdout_file = base + ".out";
  sp.stderr_file = base + ".err";
  sp.memory_limit = ts.resources.memory;
  sp.env_extra = {"DIASPORA_PROGRESS_FD=3", "DIASPORA_TASK_ID=" + a.hook_id, "DIASPORA_ATTEMPT=" + std::to_string(a.number),
                  "DIASPORA_SITE=" + s.name(), "DIASPORA_DATA_DIR=" + (ctx_.data_dir / ts.name).string()};
  try {
    fs::create_directories(ctx_.data_dir / ts.name);
    slot.cmd_pid = spawn(sp);
  } catch (const std::exception& e) {
    return failed(e.what());
  }
  ::close(pfd[1]);
  track_group(slot.cmd_pid, true);
  slot.progress = LineChannel(pfd[0]);
  slot.next_beat = ctx_.now() + ctx_.opt.heartbeat_s;
  slot.next_checkpoint = 0;
  if (s.stopped_phase) signal_group(slot.cmd_pid, SIGSTOP);
  lifecycle_.announce_start(ii, ai, s, slot, true);
  return true;
}

void LocalPools::stop(Site&, Slot& slot) {
  if (slot.cmd_pid > 0 && slot.inst >= 0 && ctx_.is_job(store_.at(slot.inst).task)) {
    // A rehearsal job checkpoints on SIGTERM (its ranks finish the step, write the
    // checkpoint, exit 3); its next attempt waits for that (Lifecycle::draining).
    signal_group(slot.cmd_pid, SIGTERM);
    signal_group(slot.cmd_pid, SIGCONT);
    slot.draining_inst = slot.inst;
    slot.drain_deadline = ctx_.now() + ctx_.opt.job_drain_s;
  } else if (slot.cmd_pid > 0) {
    signal_group(slot.cmd_pid, SIGKILL);
    signal_group(slot.cmd_pid, SIGCONT);
  } else if (slot.pid > 0) {
    signal_group(slot.pid, SIGKILL);
    signal_group(slot.pid, SIGCONT);
  }
}

void LocalPools::pause(Site&, Slot& slot, bool paused) {
  signal_group(slot.pid, paused ? SIGSTOP : SIGCONT);
  signal_group(slot.cmd_pid, paused ? SIGSTOP : SIGCONT);
}

std::string LocalPools::kill_worker(Site&, Slot& slot) {
  signal_group(slot.cmd_pid > 0 ? slot.cmd_pid : slot.pid, SIGKILL);
  return "";
}

void LocalPools::hang(Site&, Slot& slot) {
  if (slot.cmd_pid > 0) signal_group(slot.cmd_pid, SIGSTOP);
  else slot.ch.send({{"op", "hang"}});
}

bool LocalPools::request_checkpoint(Site&, Slot& slot) {
  if (slot.cmd_pid > 0) {
    signal_group(slot.cmd_pid, SIGUSR1);
    return true;
  }
  return slot.ch.send({{"op", "checkpoint"}});
}

void LocalPools::on_command_line(Slot& slot, const std::string& line) {
  const ProgressLine pl = parse_progress_line(line);
  if (pl.kind == ProgressLine::Kind::checkpoint) {  // also from a job that is stopping: its last checkpoint
    const int ii = slot.inst >= 0 ? slot.inst : slot.draining_inst;
    if (ii >= 0) jobs_.take_checkpoint_item(store_.at(ii), pl.uri);
    return;
  }
  if (pl.kind == ProgressLine::Kind::result) {  // a rehearsal job's summary, wherever its folder is
    if (slot.inst >= 0 && ctx_.is_job(store_.at(slot.inst).task)) store_.at(slot.inst).result = pl.result;
    return;
  }
  if (slot.inst < 0 || pl.kind == ProgressLine::Kind::none) return;
  Attempt& a = store_.attempt(slot.inst, slot.att);
  a.last_beat = ctx_.now();
  if (pl.kind == ProgressLine::Kind::progress) a.progress = pl.value;
  ctx_.hooks.task_progress_line(a, pl);
}

void LocalPools::on_exit(Site& s, Slot& slot, bool worker, int status) {
  const std::string what = describe_wait_status(status);
  if (worker) {
    track_group(slot.pid, false);
    slot.pid = -1;
    slot.ch.close();
    slot.ready = false;
    if (!slot.pending_checkpoint.empty())
      actions_.acknowledge(std::exchange(slot.pending_checkpoint, ""), false, "the worker died: " + what);
    if (slot.inst >= 0 && slot.cmd_pid < 0) {
      const int ii = slot.inst, ai = slot.att;
      slot.inst = slot.att = -1;
      lifecycle_.ended(ii, ai, false, "worker " + worker_name(s.name(), slot.index) + " died (" + what + ")", true);
    }
    slot.respawn_at = ctx_.stopping ? -1 : ctx_.now();
    return;
  }
  track_group(slot.cmd_pid, false);
  slot.cmd_pid = -1;
  // Read what the command reported before it exited (a stopping job's last checkpoint too).
  if (slot.progress.fd() >= 0) {
    slot.progress.fill();
    while (auto line = slot.progress.next_line()) on_command_line(slot, *line);
    slot.progress.close();
  }
  if (slot.draining_inst >= 0) {
    ctx_.say("rehearsal job " + store_.at(slot.draining_inst).id + " stopped on " + s.name() + " (" + what +
             (WIFEXITED(status) && WEXITSTATUS(status) == 3 ? ", checkpointed)" : ")"));
    slot.draining_inst = -1;
  }
  if (slot.inst < 0) return;
  const int ii = slot.inst, ai = slot.att;
  slot.inst = slot.att = -1;
  Instance& inst = store_.at(ii);
  const Attempt& a = store_.attempt(ii, ai);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    if (ctx_.is_job(inst.task)) jobs_.take_summary(inst);  // the trainer's summary is the job's result
    return lifecycle_.ended(ii, ai, true, "");
  }
  std::string reason = "command " + what;
  // The last line the command wrote to stderr says why, most of the time.
  std::ifstream f(ctx_.tasks_dir / (a.hook_id + "." + std::to_string(a.number) + ".err"));
  std::string line, last;
  while (std::getline(f, line))
    if (!line.empty()) last = line;
  if (!last.empty()) reason += ": " + last.substr(0, 500);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) reason += " (command not found?)";
  lifecycle_.ended(ii, ai, false, reason, WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                   WIFEXITED(status) ? std::optional<int>(WEXITSTATUS(status)) : std::nullopt);
}

void LocalPools::reap() {
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (auto& s : sites_.all())
      for (auto& slot : s.slots) {
        if (slot.pid == pid) on_exit(s, slot, true, status);
        else if (slot.cmd_pid == pid) on_exit(s, slot, false, status);
      }
  }
}

void LocalPools::tick() {
  const double t = ctx_.now();
  for (auto& s : sites_.all()) {
    if (s.remote()) continue;
    for (auto& slot : s.slots) {
      if (slot.pid < 0 && slot.respawn_at >= 0 && t >= slot.respawn_at) spawn_worker(s, slot);
      if (slot.cmd_pid <= 0 || slot.inst < 0 || t < slot.next_beat) continue;
      slot.next_beat = t + ctx_.opt.heartbeat_s;
      if (process_stopped(slot.cmd_pid)) continue;  // stopped (a hang): no heartbeat
      Attempt& a = store_.attempt(slot.inst, slot.att);
      a.last_beat = t;
      ctx_.hooks.task_heartbeat(a, {});
    }
  }
}

void LocalPools::shutdown() {
  for (auto& s : sites_.all())
    for (auto& slot : s.slots) {
      slot.ch.close();
      signal_group(slot.pid, SIGCONT);
    }
  double deadline = ctx_.now() + 2;
  for (const auto& s : sites_.all())
    for (const auto& slot : s.slots)
      if (slot.draining_inst >= 0) deadline = std::max(deadline, slot.drain_deadline);  // a job writing its checkpoint
  ctx_.stopping = true;
  for (;;) {
    bool any = false;
    for (auto& s : sites_.all())
      for (auto& slot : s.slots) any |= slot.pid > 0 || slot.cmd_pid > 0;
    if (!any) break;
    if (ctx_.now() > deadline)
      for (auto& s : sites_.all())
        for (auto& slot : s.slots) {
          signal_group(slot.pid, SIGKILL);
          signal_group(slot.cmd_pid, SIGKILL);
        }
    ::usleep(20000);
    reap();
  }
}

}  // namespace diaspora::runner
