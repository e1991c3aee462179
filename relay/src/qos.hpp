// Quality of service on a relay connection (docs/streaming.md#quality-of-service): the
// class of each topic, the per-connection send queues that write control first and share
// the wire among the other classes by weight, and the delivery-lag histogram per class.
// Internal to the relay.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace diaspora::relay {

/// The four classes, most urgent first.
enum class QosClass : std::uint8_t { control = 0, lifecycle = 1, telemetry = 2, bulk = 3 };
inline constexpr std::size_t kQosClasses = 4;

/// "control", "lifecycle", "telemetry", "bulk".
std::string_view qos_name(QosClass c) noexcept;
/// The class a name gives, or nullopt for another word.
std::optional<QosClass> qos_from_name(std::string_view name) noexcept;

/// Maps topics to classes: the configured rules first (first match), then the defaults
/// (`*.control.*`, `*.control`: control; `*.events`: lifecycle; `*.telemetry*`,
/// `*.metrics*`: telemetry; `*.data`, `*.data.*`, `data.*`: bulk), lifecycle for the rest.
///
/// @par Thread Safety
/// Immutable after construction: classify() from any thread.
class QosClassifier {
 public:
  struct Rule {
    std::string topics;  ///< a topic or a pattern with '*'
    QosClass cls = QosClass::lifecycle;
  };
  QosClassifier() : QosClassifier(std::vector<Rule>{}) {}
  /// `rules` are the relay.yaml's qos.classes, tried before the defaults.
  explicit QosClassifier(std::vector<Rule> rules);
  QosClass classify(std::string_view topic) const noexcept;
  /// The default rules, in the order they are tried (for the docs and tests).
  static const std::vector<Rule>& defaults();

 private:
  std::vector<Rule> rules_;
};

/// `rate` tokens a second, at most `capacity` kept: a subscription's max_rate (records) and
/// the bulk class's pace (bytes). Spending may take `tokens` below zero (a frame larger than
/// what was left); the bucket then owes it. Not thread-safe.
struct TokenBucket {
  double rate = 0;  ///< tokens a second; 0: no bucket
  double capacity = 0;
  double tokens = 0;
  std::chrono::steady_clock::time_point refilled{};

  /// An empty bucket of `rate` and `capacity` holding `tokens` now.
  static TokenBucket holding(double rate, double capacity, double tokens) {
    return {rate, capacity, tokens, std::chrono::steady_clock::now()};
  }
  /// Adds what `rate` gave since the last refill, up to `capacity`.
  void refill(std::chrono::steady_clock::time_point now) noexcept {
    tokens = std::min(capacity, tokens + rate * std::chrono::duration<double>(now - refilled).count());
    refilled = now;
  }
  /// Seconds until the bucket holds `level` tokens (0 when it does).
  double seconds_until(double level) const noexcept { return tokens >= level ? 0 : (level - tokens) / rate; }
};

/// One connection's outgoing frames, a queue per class. The frame to write next: the oldest
/// control frame while there is one (strict priority), else the head of the lifecycle,
/// telemetry or bulk queue whose weighted bytes sent are the least (start-time fair
/// queueing on bytes: with all three busy, each gets its weight's share of the wire; an
/// idle class's share goes to the busy ones). With `fifo` every frame shares one queue:
/// the order they were pushed (the relay before QoS, for comparison).
///
/// Bulk may be paced (set_bulk_rate): its frames leave at that many bytes/s on average, so
/// they do not fill the queue of a slower link downstream, where the other classes'
/// packets would wait behind them; the others are never paced.
///
/// @par Thread Safety
/// Not thread-safe: one connection's strand.
class SendQueues {
 public:
  struct Frame {
    std::shared_ptr<const std::string> frame;
    std::size_t reply_bytes = 0;    ///< the frame's size when it is a reply, 0 for a delivery
    bool binary = false;            ///< a data chunk, else a JSON text frame
    std::int64_t appended_us = 0;   ///< a delivery: its first record's append time (0: a reply)
    QosClass cls = QosClass::control;
    std::chrono::steady_clock::time_point queued{};  ///< set by push()
  };
  using Clock = std::chrono::steady_clock;
  /// `weights`: lifecycle, telemetry, bulk (each >= 1).
  SendQueues(bool fifo, std::array<std::uint32_t, 3> weights);

  /// Paces the bulk class to `bytes_per_s` (0: not paced; ignored in fifo mode), in bursts
  /// of at most 10 ms' worth (16 KiB at least).
  void set_bulk_rate(double bytes_per_s) noexcept;
  double bulk_rate() const noexcept { return bulk_.rate; }

  void push(Frame f);
  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }
  /// Frames waiting in `c`'s queue (in fifo mode: all of them).
  std::size_t size(QosClass c) const noexcept;
  /// When the oldest frame waiting in `c`'s queue was pushed; time_point::max() for none.
  Clock::time_point oldest(QosClass c) const noexcept;
  /// Chooses the next frame and returns it; it stays the front until pop(). Not empty().
  /// Ignores pacing (see ready()).
  const Frame& front();
  /// Chooses the next frame that pacing lets go at `now` (front() after it is that frame),
  /// or returns nullptr with `wait` set when only paced bulk frames wait. Not empty().
  const Frame* ready(Clock::time_point now, Clock::duration& wait);
  /// Removes the frame front() chose.
  void pop();
  /// Drops every frame but the one being written (`writing`: front() was called and not
  /// popped). Returns the reply bytes dropped.
  std::size_t drop_unsent(bool writing);
  void clear() noexcept;

 private:
  std::size_t index(QosClass c) const noexcept { return fifo_ ? 0 : static_cast<std::size_t>(c); }
  // Chooses (if none is chosen yet) and returns the next frame; bulk only if `bulk_may_go`.
  const Frame& choose(bool bulk_may_go);
  bool fifo_;
  std::array<double, kQosClasses> weight_{1, 1, 1, 1};
  std::array<std::deque<Frame>, kQosClasses> q_;
  std::array<double, kQosClasses> vtime_{};  // weighted bytes sent, per class
  double vnow_ = 0;                          // vtime of the class served last
  std::optional<std::size_t> chosen_;
  std::size_t size_ = 0;
  TokenBucket bulk_;  // the bulk class's pace, bytes; rate 0: not paced
};

/// How long records waited from their append to being handed to a subscriber's socket, per
/// class: a Prometheus histogram (diaspora_relay_delivery_lag_seconds). Any thread.
struct LagHistogram {
  static constexpr std::array<double, 12> kBounds{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};
  struct PerClass {
    std::array<std::atomic<std::uint64_t>, kBounds.size()> buckets{};  // not cumulative
    std::atomic<std::uint64_t> count{0};
    std::atomic<std::uint64_t> sum_us{0};
    std::atomic<std::uint64_t> frames{0}, bytes{0};  // every frame written, replies included
  };
  std::array<PerClass, kQosClasses> classes;
  void observe(QosClass c, double seconds) noexcept;
  void written(QosClass c, std::size_t bytes) noexcept;
  /// The exposition lines (# TYPE and samples) of the histogram and the frame counters.
  std::string render() const;
};

}  // namespace diaspora::relay
