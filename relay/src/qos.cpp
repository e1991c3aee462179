#include "qos.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>

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
  bulk_rate_ = fifo_ ? 0 : std::max(0.0, bytes_per_s);
  bulk_burst_ = std::max(16.0 * 1024, bulk_rate_ * 0.010);
  bulk_tokens_ = bulk_burst_;
  refilled_ = Clock::now();
}

const SendQueues::Frame* SendQueues::ready(Clock::time_point now, Clock::duration& wait) {
  if (chosen_ || bulk_rate_ <= 0) return &front();
  bulk_tokens_ = std::min(bulk_burst_, bulk_tokens_ + bulk_rate_ * std::chrono::duration<double>(now - refilled_).count());
  refilled_ = now;
  const std::size_t bulk = static_cast<std::size_t>(QosClass::bulk);
  if (bulk_tokens_ >= 0 || q_[bulk].size() != size_) {
    if (bulk_tokens_ < 0) {  // bulk waits: the busiest of the others goes
      const double saved = vtime_[bulk];
      vtime_[bulk] = std::numeric_limits<double>::infinity();
      const Frame& f = front();
      vtime_[bulk] = saved;
      return &f;
    }
    return &front();
  }
  wait = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(-bulk_tokens_ / bulk_rate_)) +
         std::chrono::microseconds(100);
  return nullptr;
}

const SendQueues::Frame& SendQueues::front() {
  if (!chosen_) {
    if (!q_[0].empty()) {
      chosen_ = 0;
    } else {
      for (std::size_t i = 1; i < kQosClasses; ++i)
        if (!q_[i].empty() && (!chosen_ || vtime_[i] < vtime_[*chosen_])) chosen_ = i;
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
  if (i == static_cast<std::size_t>(QosClass::bulk) && bulk_rate_ > 0)
    bulk_tokens_ -= static_cast<double>(q_[i].front().frame->size());
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
