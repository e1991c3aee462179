// The engine plugin as the runner uses it: loaded with dlopen (adapters' plugin loader),
// opened on the run's spec, told each hook (Hooks), and the source of the actions its
// policies and the operators decide. The plugin calls the action callback on its own
// thread: the callback queues the action under a mutex and wakes the runner's loop through
// a pipe; the loop takes the queue with take_actions().
//
// Thread safety: the runner thread, except the callback (the plugin's thread).
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <deque>
#include <filesystem>
#include <mutex>
#include <string>

#include "hooks.hpp"

namespace diaspora::runner {

class PluginBridge final : public Hooks {
 public:
  /// `wake_fd`: written (one byte) when an action arrives.
  explicit PluginBridge(int wake_fd) : wake_fd_(wake_fd) {}
  /// Closes the plugin if close() was not called (a run that threw): before its relay and
  /// the callback's targets go away.
  ~PluginBridge() override;
  PluginBridge(const PluginBridge&) = delete;
  PluginBridge& operator=(const PluginBridge&) = delete;

  /// Loads the plugin (`library`, or the default candidates when empty) and opens it on
  /// the spec document; the action callback is installed. Throws diaspora::Error (cannot
  /// load, the plugin refused the spec: its message).
  void open(const std::filesystem::path& library, const boost::json::value& document);
  bool is_open() const { return plugin_ != nullptr; }
  const PluginLibrary& library() const { return *lib_; }

  /// The actions delivered since the last call, in order.
  std::deque<diaspora_action> take_actions();
  /// The plugin's counters.
  diaspora_stats stats() const;
  /// The plugin's last error (diaspora_last_error), empty when none or not open.
  std::string last_error() const;
  /// No more actions: the callback is removed.
  void stop_actions();
  /// Waits up to `timeout_s` until the plugin has delivered what it accepted (acked, lost
  /// or rejected) with an empty spool; returns the counters then.
  diaspora_stats drain(double timeout_s) const;
  /// Closes the plugin (waits up to timeout_ms for its last events); returns its status.
  int close(int timeout_ms);
  /// Puts `bytes` on `topic` as one data item (docs/streaming.md) whose event's data names
  /// `stream`, `seq` and `site`, through the plugin's item session (diaspora_item_put):
  /// blocks until the relay acknowledged it, resending across reconnects for up to
  /// `timeout_ms`. Any thread (the plugin's item calls are thread-safe); not while closing.
  /// Returns "diaspora://TOPIC/OFFSET". Throws diaspora::Error with the plugin's reason.
  std::string put_item(const std::string& topic, const std::string& stream, long seq, const std::string& site,
                       const std::string& bytes, std::int64_t timeout_ms) const;

  // Hooks
  void task_submitted(const Attempt& a, const std::string& task_name, double deadline_s) override;
  void task_started(const Attempt& a, const std::string& worker) override;
  void task_progress(const Attempt& a, double progress, long step, std::span<const diaspora_metric_value> metrics) override;
  void task_heartbeat(const Attempt& a, std::span<const diaspora_metric_value> metrics) override;
  void task_progress_line(const Attempt& a, const ProgressLine& line) override;
  void task_completed(const Attempt& a) override;
  void task_failed(const Attempt& a, bool retryable, const std::string& reason) override;
  void task_cancelled(const Attempt& a, const std::string& reason) override;
  void data_arrived(const std::string& stream, long seq, long bytes, const std::string& uri, const std::string& checksum,
                    const std::string& site) override;
  void resource(const std::string& id, const char* kind, const char* state, const std::string& site,
                const std::string& metric, double value) override;
  void action_result(const std::string& action_id, bool ok, const std::string& message) override;

 private:
  static void on_action(const diaspora_action* a, void* user);

  int wake_fd_;
  const PluginLibrary* lib_ = nullptr;
  diaspora_plugin* plugin_ = nullptr;
  mutable std::mutex mu_;
  std::deque<diaspora_action> incoming_;
};

}  // namespace diaspora::runner
