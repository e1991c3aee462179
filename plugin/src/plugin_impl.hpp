// The engine plugin behind the C ABI (abi.cpp): the publisher, and the glue between the
// plugin's parts, each of which owns its state:
//   engine threads --hooks--> intake (intake.hpp: the SlotQueue, the Coalescer)
//   publisher thread: records -> task tracker (tracker.hpp) -> policy bridge
//     (policy_bridge.hpp) -> events (serialize.hpp) -> batches over an acked diaspora.v1
//     session (diaspora::client); the Spool (spool.hpp) holds events while the relay is away
//     (and when the queue overflows) and is replayed first, in order;
//   control thread <--control topic-- relay: actions to the action desk (action_desk.hpp),
//     which hands them to the engine and reports their outcomes.
//
// Ordering invariant: events leave in the order they entered, per engine thread. The
// publisher sends "live" batches (straight from the queue) only while the spool holds no
// record; as soon as it does, batches are read from the spool, and queue contents (always
// newer than the spool's) join the spool's tail when a hook finds the queue full (or has a
// call too big for a slot), when the publisher, about to read a spool batch, finds the
// queue half full, or while the relay is away. So in-flight batches are always some live
// ones followed by some spool ones, and when a connection drops the live ones are put
// back at the head of the spool. Once the spool is empty and acked, the rest of the queue
// goes live again.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "action_desk.hpp"
#include "diaspora/error.hpp"
#include "diaspora/plugin.h"
#include "intake.hpp"
#include "item_link.hpp"
#include "policy_bridge.hpp"
#include "record.hpp"
#include "serialize.hpp"
#include "spool.hpp"
#include "tick_clock.hpp"
#include "tracker.hpp"

namespace diaspora {
class RelayClient;
struct RelayClientOptions;
struct WorkflowSpec;
}  // namespace diaspora

namespace diaspora::plugin {

/// A configuration problem found when opening (message is user-facing).
class ConfigError : public Error {
  using Error::Error;
};

/// Everything the plugin needs, resolved from the spec and the environment.
struct Config {
  std::string workflow, engine_id;
  std::string url;  ///< wss://...
  std::vector<std::string> failover;  ///< more relays on the same store, tried in turn after url
  std::filesystem::path ca_file, token_file;
  std::string events_topic, control_topic;
  std::filesystem::path spool_dir;
  std::filesystem::path normals_file;  ///< plugin.normals, resolved; empty: nothing kept
  std::uint64_t spool_limit = 256ull << 20;
  std::size_t queue_size = 65536;
  std::size_t batch_events = 512, batch_bytes = 1u << 20;
  std::chrono::microseconds batch_delay{20000};
  std::size_t max_inflight = 16;
  bool coalesce_when_congested = true;  ///< plugin.coalesce: congested
  bool control = true;
  std::chrono::milliseconds reconnect_min{100}, reconnect_max{5000};
  std::chrono::milliseconds stats_interval{10000};
  std::shared_ptr<const WorkflowSpec> spec;  ///< for the resilience policies (none: no engine)

  /// Resolves a loaded spec: relay URL/CA/token (environment variables
  /// DIASPORA_RELAY_URL, DIASPORA_RELAY_CA, DIASPORA_RELAY_TOKEN_FILE override the spec,
  /// and are required when relay.url is "embedded"), relative paths against `base_dir`.
  /// Throws ConfigError.
  static Config from_spec(const WorkflowSpec& spec, const std::filesystem::path& base_dir);
};

class Plugin {
 public:
  /// Opens the spool (taking its lock), starts the publisher and control threads.
  /// Throws ConfigError or SpoolError.
  explicit Plugin(Config config);
  /// Same as close(0) when close was not called. Never throws.
  ~Plugin();
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  /// Hook entry (any thread). Returns a diaspora_status.
  int enqueue(const HookArgs& args) noexcept;

  /// Flushes for at most `timeout` and stops the threads. Returns a diaspora_status.
  int close(std::chrono::milliseconds timeout) noexcept;

  int set_callback(diaspora_action_callback cb, void* user) noexcept;
  int poll_action(diaspora_action* out) noexcept;
  int ack_action(std::string_view id, bool ok, std::string_view message) noexcept;
  /// Queues an action decided inside the process (the resilience engine): published as
  /// org.diaspora.action.requested and delivered like an operator's.
  void dispatch_local(Action action);

  void stats(diaspora_stats& out) const noexcept;
  bool closing() const noexcept { return closing_.load(std::memory_order_relaxed); }
  /// Whether hooks without a timestamp stamp records with TickClock::ticks() (flag
  /// time_in_ticks) instead of reading the clock; fixed at open. Any thread.
  bool tick_time() const noexcept { return tick_clock_.has_value(); }
  bool on_control_thread() const noexcept { return std::this_thread::get_id() == control_.get_id(); }

  /// The connection for data items (diaspora_item_put/get): any thread; made at the first use.
  ItemLink& items();
  /// The workflow's default data topic, "<workflow>.data".
  std::string data_topic() const { return cfg_.workflow + ".data"; }
  /// The source of the events this plugin publishes, "/diaspora/<workflow>/<engine>".
  const std::string& source() const noexcept { return ctx_.source; }

  /// Per-handle last error (any thread).
  void set_error(std::string message) noexcept;
  std::string last_error() const;

 private:
  struct Batch;

  // publisher thread
  void publisher_main();
  void try_connect();
  void on_disconnect(const std::string& why);
  void pump();
  bool build_live_batch(Batch& out, bool flush_now);
  bool build_spool_batch(Batch& b);
  void send_batch(Batch&& b);
  void send_frame(Batch&& b);
  void handle_frame(const std::string& frame);
  /// Serialises what the queue holds (and the side and coalesced events) into the spool.
  /// feed_mu_ held by the caller; takes spool_mu_ for each append.
  void move_queue_to_spool_fed();
  /// Serialises the coalesced metric samples waiting, each handed to `sink`.
  void take_coalesced(const std::function<void(std::string_view)>& sink);
  std::vector<std::string> take_side_events();
  RelayClientOptions client_options(const std::string& client_id) const;
  /// The relay in use: url, or one of failover after losing it. Any thread.
  std::string relay_url() const;
  /// Moves to the next relay of url + failover (the one in use was lost). Any thread.
  void next_relay();
  /// Feeds a record to the tracker (and policies) and appends its event to `out`; a time
  /// in ticks becomes wall-clock time here. Under feed_mu_ (tracker, policies, tick_clock_).
  void append_record_event(std::string& out, const RecordView& r, std::string_view id, std::uint64_t coalesced);
  void add_side_event(std::string text);
  /// Publishes the policies' decisions and hands their actions to the desk (feed_mu_ held).
  void act_on_decisions();
  static std::string event_id(std::string_view text);
  bool rejected(std::string_view text) const;
  std::string next_side_id();
  void maybe_publish_stats(bool force);
  bool all_flushed();
  void finalize();

  // control thread
  void control_main();
  void handle_action_event(const boost::json::value& ev);
  std::string action_done_event(const Action& a, bool ok, std::string_view message);

  int spill(const HookArgs& args) noexcept;

  Config cfg_;
  EventContext ctx_;
  std::string instance_;     ///< random, per open: event ids are "<instance>-<n>"
  std::string producer_id_;  ///< <engine id>-<instance>

  SlotQueue queue_;
  std::atomic<std::uint64_t> spill_counter_{0};

  // Lock order: feed_mu_, then spool_mu_.
  // feed_mu_: taking events out of the queue and serialising them, in order (the tracker,
  // the policies and tick_clock_ see them under it): the publisher, and hooks on the spill path.
  std::mutex feed_mu_;
  // spool_mu_: the spool itself (publisher, stats(), and appends of the feed_mu_ holder).
  mutable std::mutex spool_mu_;
  std::unique_ptr<Spool> spool_;
  std::atomic<bool> spool_active_{false};  ///< the spool holds at least one record
  SpoolRecords spool_records_;  ///< move_queue_to_spool_fed's buffer (under feed_mu_), kept for its memory
  /// Made at open when TickClock::usable(), never changed after; to_us() under feed_mu_
  /// (records are serialised under it).
  std::optional<TickClock> tick_clock_;

  Coalescer coalesced_;  ///< metrics merged by hooks that found the queue full or the link congested -> publisher
  /// The window of unacked batches has been full for kCongestedAfter (publisher writes,
  /// hooks read): metric samples are then merged per series rather than queued.
  std::atomic<bool> congested_{false};
  std::chrono::steady_clock::time_point window_full_since_{};  ///< publisher only
  void note_window();  ///< publisher: sets or clears congested_ from the window of unacked batches

  // Events the plugin itself produces (any thread -> publisher).
  std::mutex side_mu_;
  std::vector<std::string> side_;
  std::atomic<bool> side_pending_{false};
  std::atomic<std::uint64_t> side_counter_{0};

  // Publisher thread state.
  std::unique_ptr<RelayClient> client_;
  std::unordered_set<std::string> rejected_ids_;  ///< events the relay refused: never sent again (publisher thread only)
  std::deque<Batch> inflight_;
  std::deque<Batch> resend_;  ///< unacked when the session dropped: sent first, same seq
  std::unique_ptr<Batch> pending_;  ///< live batch being filled (linger)
  /// The spool position after records read and all refused (rejected_ids_) while batches
  /// were in flight: committed with the last of their acks (publisher thread only).
  std::optional<SpoolPosition> refused_end_;
  std::uint64_t next_seq_ = 0;
  std::size_t batch_events_ = 512, batch_bytes_ = 1u << 20, max_inflight_ = 16;  ///< config, capped by the relay
  std::chrono::steady_clock::time_point next_connect_{};
  std::chrono::milliseconds backoff_{};
  bool ever_connected_ = false;
  TaskTracker tracker_;
  std::unique_ptr<PolicyBridge> policy_;  ///< guarded by feed_mu_, as the tracker
  std::chrono::steady_clock::time_point last_tick_{};
  std::atomic<std::uint64_t> action_counter_{0};
  std::chrono::steady_clock::time_point last_stats_{};
  std::uint64_t last_stats_sig_ = 0;

  // Actions: outcomes are published as action.done events.
  ActionDesk actions_{[this](const Action& a, bool ok, std::string_view message) {
    add_side_event(action_done_event(a, ok, message));
  }};

  // Counters. Events accepted on the fast path are counted by the queue itself (its tail
  // position): a shared counter bumped by every hook would bounce a cache line between
  // engine threads. The others are written off the fast path, on their own line.
  alignas(64) std::atomic<std::uint64_t> slow_accepted_{0};  ///< spilled or coalesced
  std::atomic<std::uint64_t> acked_{0}, spilled_{0}, lost_{0}, reconnects_{0},
      rejected_{0}, invalid_{0};
  std::atomic<int> connected_{0}, control_connected_{0};
  std::atomic<std::size_t> relay_at_{0};  ///< index in url + failover of the relay in use

  mutable std::mutex error_mu_;
  std::string last_error_;
  std::mutex items_mu_;
  std::unique_ptr<ItemLink> items_;  ///< guarded by items_mu_ (made once)

  alignas(64) std::atomic<bool> closing_{false};  ///< read by every hook: a line of its own
  alignas(64) std::atomic<bool> stop_{false};  ///< publisher: flush and stop
  std::atomic<bool> control_stop_{false};
  std::chrono::steady_clock::time_point flush_deadline_{};
  int close_status_ = DIASPORA_OK;
  std::thread publisher_, control_;
  std::mutex close_mu_;
  bool closed_ = false;
};

}  // namespace diaspora::plugin
