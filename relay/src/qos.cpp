#include "qos.hpp"

#include <algorithm>
#include <cstdio>

#include "diaspora/token.hpp"  // topic_matches

namespace diaspora::relay {

std::string_view qos_name(QosClass c) noexcept {
  switch (c) {
    case QosClass::control: return "control";
    case QosClass::lifecycle: return "lifecycle";
    case QosClass::telemetry: return "telemetry";
    case QosClass::bulk: return "bulk";
  }
  return "lifecycle";
}

std::optional<QosClass> qos_from_name(std::string_view name) noexcept {
  for (std::size_t i = 0; i < kQosClasses; ++i)
    if (qos_name(static_cast<QosClass>(i)) == name) return static_cast<QosClass>(i);
  return std::nullopt;
}

const std::vector<QosClassifier::Rule>& QosClassifier::defaults() {
  static const std::vector<Rule> rules{
      {"*.control.*", QosClass::control}, {"*.control", QosClass::control},   {"*.events", QosClass::lifecycle},
      {"*.telemetry*", QosClass::telemetry}, {"*.metrics*", QosClass::telemetry}, {"*.data", QosClass::bulk},
      {"*.data.*", QosClass::bulk},       {"data.*", QosClass::bulk},
  };
  return rules;
}

QosClassifier::QosClassifier(std::vector<Rule> rules) : rules_(std::move(rules)) {
  rules_.insert(rules_.end(), defaults().begin(), defaults().end());
}

QosClass QosClassifier::classify(std::string_view topic) const noexcept {
  for (const auto& r : rules_)
    if (topic_matches(r.topics, topic)) return r.cls;
  return QosClass::lifecycle;
}

SendQueues::SendQueues(bool fifo, std::array<std::uint32_t, 3> weights) : fifo_(fifo) {
  for (std::size_t i = 0; i < 3; ++i) weight_[i + 1] = std::max<std::uint32_t>(1, weights[i]);
}

void SendQueues::push(Frame f) {
  const std::size_t i = index(f.cls);
  if (q_[i].empty() && i != 0 && chosen_ != i)  // back from idle: no credit for the time it sent nothing
    vtime_[i] = std::max(vtime_[i], vnow_);
  f.queued = Clock::now();
  q_[i].push_back(std::move(f));
  ++size_;
}

SendQueues::Clock::time_point SendQueues::oldest(QosClass c) const noexcept {
  const auto& q = q_[index(c)];
  return q.empty() ? Clock::time_point::max() : q.front().queued;
}

std::size_t SendQueues::size(QosClass c) const noexcept { return fifo_ ? size_ : q_[index(c)].size(); }

void SendQueues::set_bulk_rate(double bytes_per_s) noexcept {
  const double rate = fifo_ ? 0 : std::max(0.0, bytes_per_s);
  const double burst = std::max(16.0 * 1024, rate * 0.010);
  bulk_ = TokenBucket::holding(rate, burst, burst);
}

const SendQueues::Frame* SendQueues::ready(Clock::time_point now, Clock::duration& wait) {
  if (chosen_ || bulk_.rate <= 0) return &front();
  bulk_.refill(now);
  const bool bulk_may_go = bulk_.tokens >= 0;
  if (bulk_may_go || q_[static_cast<std::size_t>(QosClass::bulk)].size() != size_) return &choose(bulk_may_go);
  wait = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(bulk_.seconds_until(0))) +
         std::chrono::microseconds(100);
  return nullptr;
}

const SendQueues::Frame& SendQueues::front() { return choose(true); }

const SendQueues::Frame& SendQueues::choose(bool bulk_may_go) {
  if (!chosen_) {
    if (!q_[0].empty()) {
      chosen_ = 0;
    } else {
      for (std::size_t i = 1; i < kQosClasses; ++i)
        if (!q_[i].empty() && (bulk_may_go || i != static_cast<std::size_t>(QosClass::bulk)) &&
            (!chosen_ || vtime_[i] < vtime_[*chosen_]))
          chosen_ = i;
    }
  }
  return q_[*chosen_].front();
}

void SendQueues::pop() {
  if (!chosen_) front();
  const std::size_t i = *chosen_;
  if (i != 0) {
    vnow_ = vtime_[i];
    vtime_[i] += static_cast<double>(q_[i].front().frame->size()) / weight_[i];
  }
  if (i == static_cast<std::size_t>(QosClass::bulk) && bulk_.rate > 0)
    bulk_.tokens -= static_cast<double>(q_[i].front().frame->size());
  q_[i].pop_front();
  --size_;
  chosen_.reset();
}

std::size_t SendQueues::drop_unsent(bool writing) {
  std::size_t replies = 0;
  for (std::size_t i = 0; i < kQosClasses; ++i) {
    auto& q = q_[i];
    const std::size_t keep = writing && chosen_ == i ? 1 : 0;
    while (q.size() > keep) {
      replies += q.back().reply_bytes;
      q.pop_back();
      --size_;
    }
  }
  if (!writing) chosen_.reset();
  return replies;
}

void SendQueues::clear() noexcept {
  for (auto& q : q_) q.clear();
  size_ = 0;
  chosen_.reset();
}

void LagHistogram::observe(QosClass c, double seconds) noexcept {
  PerClass& p = classes[static_cast<std::size_t>(c)];
  const auto it = std::lower_bound(kBounds.begin(), kBounds.end(), seconds);
  if (it != kBounds.end()) p.buckets[static_cast<std::size_t>(it - kBounds.begin())].fetch_add(1, std::memory_order_relaxed);
  p.count.fetch_add(1, std::memory_order_relaxed);
  p.sum_us.fetch_add(static_cast<std::uint64_t>(std::max(0.0, seconds) * 1e6), std::memory_order_relaxed);
}

void LagHistogram::written(QosClass c, std::size_t bytes) noexcept {
  PerClass& p = classes[static_cast<std::size_t>(c)];
  p.frames.fetch_add(1, std::memory_order_relaxed);
  p.bytes.fetch_add(bytes, std::memory_order_relaxed);
}

std::string LagHistogram::render() const {
  std::string out;
  auto line = [&](const std::string& s) { out += s, out += '\n'; };
  line("# HELP diaspora_relay_delivery_lag_seconds From a record's append to its frame handed to a subscriber's socket, by QoS class.");
  line("# TYPE diaspora_relay_delivery_lag_seconds histogram");
  for (std::size_t c = 0; c < kQosClasses; ++c) {
    const PerClass& p = classes[c];
    const std::string cls = "class=\"" + std::string(qos_name(static_cast<QosClass>(c))) + "\"";
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < kBounds.size(); ++i) {
      cumulative += p.buckets[i].load(std::memory_order_relaxed);
      char le[32];
      std::snprintf(le, sizeof le, "%g", kBounds[i]);
      line("diaspora_relay_delivery_lag_seconds_bucket{" + cls + ",le=\"" + le + "\"} " + std::to_string(cumulative));
    }
    const std::uint64_t count = p.count.load(std::memory_order_relaxed);
    line("diaspora_relay_delivery_lag_seconds_bucket{" + cls + ",le=\"+Inf\"} " + std::to_string(count));
    char sum[32];
    std::snprintf(sum, sizeof sum, "%.6f", static_cast<double>(p.sum_us.load(std::memory_order_relaxed)) / 1e6);
    line("diaspora_relay_delivery_lag_seconds_sum{" + cls + "} " + sum);
    line("diaspora_relay_delivery_lag_seconds_count{" + cls + "} " + std::to_string(count));
  }
  line("# HELP diaspora_relay_class_frames_total Frames written to WebSocket peers, by QoS class (replies are control).");
  line("# TYPE diaspora_relay_class_frames_total counter");
  for (std::size_t c = 0; c < kQosClasses; ++c)
    line("diaspora_relay_class_frames_total{class=\"" + std::string(qos_name(static_cast<QosClass>(c))) + "\"} " +
         std::to_string(classes[c].frames.load(std::memory_order_relaxed)));
  line("# HELP diaspora_relay_class_bytes_total Bytes of the frames written to WebSocket peers, by QoS class.");
  line("# TYPE diaspora_relay_class_bytes_total counter");
  for (std::size_t c = 0; c < kQosClasses; ++c)
    line("diaspora_relay_class_bytes_total{class=\"" + std::string(qos_name(static_cast<QosClass>(c))) + "\"} " +
         std::to_string(classes[c].bytes.load(std::memory_order_relaxed)));
  return out;
}

}  // namespace diaspora::relay
