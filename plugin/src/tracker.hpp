// The task tracker: one small state machine per task, fed with every task record on the
// publisher thread (never on an engine thread). It derives the series the resilience
// engine watches (queue wait, runtime, heartbeat gaps, progress rate), fills derived
// fields of the published events, and reports a hook that breaks the lifecycle order
// (e.g. `started` after `completed`) as a warning instead of failing: the engine's report
// is still published as it came.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "record.hpp"
#include "serialize.hpp"

namespace diaspora::plugin {

enum class TaskState : std::uint8_t { unknown, submitted, running, completed, failed, cancelled };
std::string_view to_string(TaskState s) noexcept;

/// One value of a derived series, e.g. {"t-17", "task.queue_wait_s", 2.5, ...}.
struct Observation {
  std::string_view task_id;
  std::string_view site;
  std::string_view series;  ///< task.queue_wait_s | task.runtime_s | task.heartbeat_gap_s | task.progress_rate
  double value = 0;
  std::int64_t time_us = 0;
};

/// Not thread-safe: used by the publisher thread only.
class TaskTracker {
 public:
  /// `max_tasks` bounds memory: beyond it, the tasks that finished longest ago are
  /// forgotten first; if every task is still active, an arbitrary one is.
  explicit TaskTracker(std::size_t max_tasks = 100000) : max_tasks_(max_tasks) {}

  /// Receives every derived observation (the resilience engine plugs in here).
  std::function<void(const Observation&)> sink;

  struct Result {
    Derived derived;
    std::optional<double> deadline_s;  ///< started: the deadline its submission declared
    std::string warning;  ///< non-empty: the transition was invalid; a readable sentence
  };

  /// Applies one task record (kinds submitted..cancelled; others are ignored).
  Result observe(const RecordView& record);

  std::size_t size() const noexcept { return tasks_.size(); }
  TaskState state(std::string_view task_id) const;
  std::uint64_t invalid_transitions() const noexcept { return invalid_; }

 private:
  struct Task {
    TaskState state = TaskState::unknown;
    std::int32_t attempt = 0;
    std::int64_t submitted_us = 0, started_us = 0, last_beat_us = 0, last_progress_us = 0;
    double last_progress = -1;
    double deadline_s = 0;  ///< from submitted; 0 = none
    std::int64_t beats = 0;
    std::uint64_t generation = 0;  ///< bumped when the task finishes; matches finished_
  };
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  void emit(std::string_view task, std::string_view site, std::string_view series, double v, std::int64_t t);
  void evict();

  std::size_t max_tasks_;
  std::unordered_map<std::string, Task, Hash, std::equal_to<>> tasks_;
  std::deque<std::pair<std::string, std::uint64_t>> finished_;  ///< (task, generation), oldest first
  std::uint64_t generation_ = 0;
  std::uint64_t invalid_ = 0;
};

}  // namespace diaspora::plugin
