// The relay's counters and gauges, and their Prometheus text (/metrics).
// Internal to the relay. Thread safety: every member may be used from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "qos.hpp"
#include "store.hpp"

namespace diaspora::relay {

/// Per-topic counters and connection gauges.
struct Metrics {
  struct TopicCounters {
    std::uint64_t events_in = 0, bytes_in = 0, events_out = 0, bytes_out = 0, duplicates = 0;
  };
  std::mutex mutex;
  std::map<std::string, TopicCounters> topics;  // guarded by mutex
  std::atomic<std::int64_t> connections{0};
  std::atomic<std::int64_t> websockets{0};
  std::atomic<std::uint64_t> refused_auth{0};
  std::atomic<std::uint64_t> slow_disconnects{0};
  std::atomic<std::uint64_t> token_expiries{0};   ///< sessions closed because their token expired
  std::atomic<std::uint64_t> tls_reloads{0};      ///< certificates loaded again (SIGHUP)
  std::atomic<std::uint64_t> items_in{0};         ///< data items written (whole, their checksum matching)
  std::atomic<std::uint64_t> items_late{0};       ///< data items stored after their itemdeadline
  std::atomic<std::uint64_t> items_dropped_late{0};  ///< data items past their deadline not stored (qos.drop_late)
  std::atomic<std::int64_t> tls_not_after{0};     ///< the served certificate's notAfter, Unix seconds
  std::atomic<std::uint64_t> congestion_reports{0};  ///< resource.status events about congested connections
  LagHistogram lag;                               ///< delivery lag and frames written, per QoS class

  /// Events appended to `topic` (and duplicates dropped).
  void in(const std::string& topic, std::uint64_t events, std::uint64_t bytes, std::uint64_t dups);
  /// Events delivered to a subscriber of `topic`.
  void out(const std::string& topic, std::uint64_t events, std::uint64_t bytes);
  /// A subscription to `pattern` (a topic or a pattern, as subscribed) opened (+1) or
  /// closed (-1: unsubscribed, or its connection ended).
  void subscribed(const std::string& pattern, int delta);

  /// Open subscriptions whose topic or pattern covers `topic` now.
  std::int64_t subscribers(const std::string& topic);
  /// When a subscription covering `topic` was last open, µs since the Unix epoch: `now_us`
  /// while one is, the time the last one closed otherwise, 0 when none was since the relay
  /// started (or its pattern was forgotten: the last kMaxClosed closed patterns are kept).
  std::int64_t last_subscribed_us(const std::string& topic, std::int64_t now_us);

  static constexpr std::size_t kMaxClosed = 4096;
  std::map<std::string, std::int64_t> subscriptions;  // pattern -> open subscriptions; guarded by mutex
  std::map<std::string, std::int64_t> closed_us;      // pattern -> when its last subscription closed; guarded by mutex
};

/// The Prometheus text exposition (version 0.0.4) of `m` and of the log's fsync histogram
/// and consumer lag.
std::string render_metrics(Metrics& m, const Store& store);

}  // namespace diaspora::relay
