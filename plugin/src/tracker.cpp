#include "tracker.hpp"

namespace diaspora::plugin {

std::string_view to_string(TaskState s) noexcept {
  switch (s) {
    case TaskState::unknown: return "unknown";
    case TaskState::submitted: return "submitted";
    case TaskState::running: return "running";
    case TaskState::completed: return "completed";
    case TaskState::failed: return "failed";
    case TaskState::cancelled: return "cancelled";
  }
  return "?";
}

namespace {

std::string_view hook_name(Kind k) noexcept {
  switch (k) {
    case Kind::submitted: return "submitted";
    case Kind::started: return "started";
    case Kind::heartbeat: return "heartbeat";
    case Kind::progress: return "progress";
    case Kind::completed: return "completed";
    case Kind::failed: return "failed";
    case Kind::cancelled: return "cancelled";
    default: return "?";
  }
}

bool finished(TaskState s) noexcept {
  return s == TaskState::completed || s == TaskState::failed || s == TaskState::cancelled;
}

// The lifecycle: unknown -> submitted -> running -> completed | failed | cancelled, where
// a failed or cancelled task may be submitted (or started) again as a new attempt, and a
// task may fail or be cancelled before it starts.
bool allowed(TaskState from, Kind hook) noexcept {
  switch (hook) {
    case Kind::submitted:
      return from == TaskState::unknown || from == TaskState::failed || from == TaskState::cancelled;
    case Kind::started:
      return from == TaskState::submitted || from == TaskState::failed || from == TaskState::cancelled;
    case Kind::heartbeat:
    case Kind::progress:
    case Kind::completed:
      return from == TaskState::running;
    case Kind::failed:
    case Kind::cancelled:
      return from == TaskState::submitted || from == TaskState::running;
    default:
      return true;
  }
}

}  // namespace

TaskState TaskTracker::state(std::string_view task_id) const {
  auto it = tasks_.find(task_id);
  return it == tasks_.end() ? TaskState::unknown : it->second.state;
}

void TaskTracker::emit(std::string_view task, std::string_view site, std::string_view series, double v,
                       std::int64_t t) {
  if (sink) sink(Observation{task, site, series, v, t});
}

void TaskTracker::evict() {
  while (tasks_.size() > max_tasks_ && !finished_.empty()) {
    auto [id, gen] = std::move(finished_.front());
    finished_.pop_front();
    auto it = tasks_.find(id);
    if (it != tasks_.end() && it->second.generation == gen && finished(it->second.state)) tasks_.erase(it);
  }
  while (tasks_.size() > max_tasks_) tasks_.erase(tasks_.begin());  // all still running: drop any
  if (finished_.size() > 2 * max_tasks_ + 1024) {  // stale entries of tasks that ran again
    std::erase_if(finished_, [&](const auto& e) {
      auto it = tasks_.find(e.first);
      return it == tasks_.end() || it->second.generation != e.second;
    });
  }
}

TaskTracker::Result TaskTracker::observe(const RecordView& r) {
  Result res;
  const Kind kind = r.head->kind;
  if (kind < Kind::submitted || kind > Kind::cancelled) return res;
  const std::string_view id = r.str(f_key), site = r.str(f_site);
  const std::int64_t t = r.head->time_us;

  auto it = tasks_.find(id);
  if (it == tasks_.end()) it = tasks_.emplace(std::string(id), Task{}).first;
  Task& task = it->second;
  if (!allowed(task.state, kind)) {
    ++invalid_;
    res.warning = "task '" + std::string(id) + "': '" + std::string(hook_name(kind)) + "' while " +
                  std::string(to_string(task.state)) + " (expected lifecycle: submitted, started, heartbeat/progress, "
                  "then completed, failed or cancelled); the event is published as reported";
  }
  if (r.head->attempt > 0) task.attempt = r.head->attempt;

  switch (kind) {
    case Kind::submitted:
      task.state = TaskState::submitted;
      task.submitted_us = t;
      task.started_us = task.last_beat_us = task.last_progress_us = 0;
      task.last_progress = -1;
      task.beats = 0;
      task.deadline_s = (r.head->flags & has_deadline) ? r.head->number : 0;
      break;
    case Kind::started:
      // A new attempt that starts without being submitted again has no queue wait.
      if (task.state != TaskState::submitted) task.submitted_us = 0;
      task.state = TaskState::running;
      task.started_us = task.last_beat_us = t;
      if (task.deadline_s > 0) res.deadline_s = task.deadline_s;
      if (task.submitted_us > 0 && t >= task.submitted_us) {
        res.derived.queue_wait_s = static_cast<double>(t - task.submitted_us) / 1e6;
        emit(id, site, "task.queue_wait_s", *res.derived.queue_wait_s, t);
      }
      break;
    case Kind::heartbeat:
    case Kind::progress:
      if (task.state == TaskState::unknown || task.state == TaskState::submitted) task.state = TaskState::running;
      if (task.last_beat_us > 0 && t >= task.last_beat_us)
        emit(id, site, "task.heartbeat_gap_s", static_cast<double>(t - task.last_beat_us) / 1e6, t);
      task.last_beat_us = t;
      if (kind == Kind::heartbeat) {
        res.derived.heartbeat_seq = task.beats++;
      } else {
        const double p = r.head->number;
        if (task.last_progress >= 0 && t > task.last_progress_us)
          emit(id, site, "task.progress_rate", (p - task.last_progress) * 1e6 / static_cast<double>(t - task.last_progress_us), t);
        task.last_progress = p;
        task.last_progress_us = t;
      }
      break;
    case Kind::completed:
    case Kind::failed:
    case Kind::cancelled:
      if (kind != Kind::cancelled && task.started_us > 0 && t >= task.started_us) {
        res.derived.runtime_s = static_cast<double>(t - task.started_us) / 1e6;
        // A completed attempt's run time is the task's; a failed one's is when it broke.
        if (kind == Kind::completed) emit(id, site, "task.runtime_s", *res.derived.runtime_s, t);
      }
      task.state = kind == Kind::completed ? TaskState::completed
                   : kind == Kind::failed  ? TaskState::failed
                                           : TaskState::cancelled;
      task.generation = ++generation_;
      finished_.emplace_back(std::string(id), task.generation);
      break;
    default:
      break;
  }
  if (tasks_.size() > max_tasks_) evict();
  return res;
}

}  // namespace diaspora::plugin
