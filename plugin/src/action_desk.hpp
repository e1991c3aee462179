// The plugin's action desk: actions (from the control topic, or decided by the local
// policies) wait here for the engine, which takes them through its callback (called on the
// control thread) or with diaspora_poll_action, and acknowledges each one; every outcome,
// including an action that expired unacknowledged, is reported through `Outcome` (the plugin
// publishes it as org.diaspora.action.done).
//
// Internal to the plugin. Thread safety: every member may be called from any thread except
// deliver() and wait(), which belong to the control thread; the desk's own mutex guards its
// queues, and Outcome is called without it held.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "diaspora/payloads.hpp"
#include "diaspora/plugin.h"

namespace diaspora::plugin {

/// An action as the engine sees it (the C struct's content).
struct Action {
  std::string id, kind_name, task_id, site, target_site, reason, origin;
  std::string policy;  ///< the policy that decided it (local decisions only)
  int attempt = -1;    ///< that policy's attempt for the task or site; 0: its "budget spent" alert; -1: none
  int kind = 0;
  std::int64_t issued_us = 0;     ///< when this plugin received it
  std::int64_t requested_us = 0;  ///< the request's own time (requester's clock); 0: unknown
};

/// DIASPORA_ACTION_* of an action name; 0 for `alert` (and anything else not for the engine).
int action_kind(std::string_view name) noexcept;

class ActionDesk {
 public:
  /// Reports an action's outcome (ok, or failed with `message`).
  using Outcome = std::function<void(const Action&, bool ok, std::string_view message)>;
  static constexpr std::size_t kMaxPollQueue = 4096;  ///< polled actions waiting; older ones expire
  static constexpr std::size_t kMaxUnacked = 65536;   ///< delivered, unacknowledged; older ones expire

  explicit ActionDesk(Outcome outcome) : outcome_(std::move(outcome)) {}

  /// Installs (or, with nullptr, removes) the engine's callback. Without one, actions go
  /// to polling, including those waiting for a callback. Returns DIASPORA_OK, or
  /// DIASPORA_ERR_INTERNAL when out of memory (the rest stay for the callback).
  int set_callback(diaspora_action_callback cb, void* user) noexcept;
  /// The oldest action waiting to be polled: DIASPORA_OK, DIASPORA_ERR_EMPTY, or
  /// DIASPORA_ERR_INTERNAL with `error` set.
  int poll(diaspora_action* out, std::string& error) noexcept;
  /// The engine's acknowledgement: DIASPORA_OK, DIASPORA_ERR_NOT_FOUND (unknown or already
  /// acknowledged), DIASPORA_ERR_INTERNAL; `error` says why when not OK.
  int ack(std::string_view id, bool ok, std::string_view message, std::string& error) noexcept;
  /// Queues an action for the engine (kind != 0) and wakes the control thread.
  void submit(Action a);
  /// An action requested on the control topic at `requested_us` (the event's `time`, 0
  /// when it has none): queued, or refused (reported through Outcome) when a field is too
  /// long for the C struct; returns why it was refused or ignored, empty when queued.
  /// `alert` is ignored (for people, not the engine).
  std::string submit_request(const events::ActionRequested& req, std::int64_t requested_us);
  /// Control thread: hands waiting actions to the callback (or to polling), expires the
  /// oldest beyond the bounds.
  void deliver();
  /// Control thread: waits at most `timeout` for an action to deliver to a callback, or
  /// for `stop`.
  void wait(std::chrono::milliseconds timeout, const std::atomic<bool>& stop);
  /// Wakes wait().
  void wake();
  /// Actions queued so far.
  std::uint64_t received() const noexcept { return received_.load(std::memory_order_relaxed); }

 private:
  void hand_to_polling_locked();

  Outcome outcome_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  diaspora_action_callback callback_ = nullptr;
  void* callback_user_ = nullptr;
  std::deque<Action> to_deliver_;  ///< waiting for the callback (control thread)
  std::deque<Action> poll_queue_;  ///< waiting for diaspora_poll_action
  std::unordered_map<std::string, Action> unacked_;  ///< delivered, waiting for done/failed
  std::deque<std::string> unacked_order_;
  std::atomic<std::uint64_t> received_{0};
};

}  // namespace diaspora::plugin
