// Quality of service on a relay connection (relay/src/qos.cpp, docs/streaming.md): the
// topic classes and the order the send queues write frames in.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "qos.hpp"

using diaspora::relay::LagHistogram;
using diaspora::relay::QosClass;
using diaspora::relay::QosClassifier;
using diaspora::relay::SendQueues;

namespace {

SendQueues::Frame frame(QosClass c, std::size_t bytes, char tag = 'x') {
  SendQueues::Frame f;
  f.frame = std::make_shared<const std::string>(bytes, tag);
  f.cls = c;
  return f;
}

}  // namespace

TEST(Qos, DefaultClassesFollowTheTopicsTheWorkflowUses) {
  const QosClassifier q;
  EXPECT_EQ(q.classify("wf.control.engine-1"), QosClass::control);
  EXPECT_EQ(q.classify("wf.events"), QosClass::lifecycle);
  EXPECT_EQ(q.classify("wf.telemetry"), QosClass::telemetry);
  EXPECT_EQ(q.classify("wf.metrics.site-a"), QosClass::telemetry);
  EXPECT_EQ(q.classify("wf.data"), QosClass::bulk);
  EXPECT_EQ(q.classify("wf.data.scans"), QosClass::bulk);
  EXPECT_EQ(q.classify("data.frames"), QosClass::bulk);
  EXPECT_EQ(q.classify("anything.else"), QosClass::lifecycle);
}

TEST(Qos, ConfiguredRulesComeBeforeTheDefaults) {
  const QosClassifier q({{"wf.events", QosClass::telemetry}, {"beamline.*", QosClass::bulk}});
  EXPECT_EQ(q.classify("wf.events"), QosClass::telemetry);
  EXPECT_EQ(q.classify("beamline.frames"), QosClass::bulk);
  EXPECT_EQ(q.classify("other.events"), QosClass::lifecycle);  // the defaults still apply
  EXPECT_EQ(diaspora::relay::qos_from_name("bulk"), QosClass::bulk);
  EXPECT_FALSE(diaspora::relay::qos_from_name("urgent"));
}

TEST(Qos, ControlIsWrittenBeforeEverythingQueuedAheadOfIt) {
  SendQueues q(false, {8, 2, 1});
  for (int i = 0; i < 5; ++i) q.push(frame(QosClass::bulk, 1000));
  for (int i = 0; i < 5; ++i) q.push(frame(QosClass::telemetry, 1000));
  q.push(frame(QosClass::control, 10));
  EXPECT_EQ(q.front().cls, QosClass::control);
  q.pop();
  EXPECT_EQ(q.size(), 10u);
}

TEST(Qos, TheFrameBeingWrittenStaysTheFrontUntilPopped) {
  SendQueues q(false, {8, 2, 1});
  q.push(frame(QosClass::bulk, 1000, 'b'));
  EXPECT_EQ(q.front().cls, QosClass::bulk);  // chosen: being written
  q.push(frame(QosClass::control, 10, 'c'));
  EXPECT_EQ(q.front().cls, QosClass::bulk);  // a control frame waits for the write in progress only
  q.pop();
  EXPECT_EQ(q.front().cls, QosClass::control);
}

TEST(Qos, BusyClassesShareTheBytesByWeight) {
  SendQueues q(false, {8, 2, 1});
  for (int i = 0; i < 2000; ++i) {
    q.push(frame(QosClass::lifecycle, 1000));
    q.push(frame(QosClass::telemetry, 1000));
    q.push(frame(QosClass::bulk, 1000));
  }
  std::map<QosClass, std::size_t> bytes;
  for (int i = 0; i < 1100; ++i) {  // all three stay busy throughout
    bytes[q.front().cls] += q.front().frame->size();
    q.pop();
  }
  const double total = 1100 * 1000.0;
  EXPECT_NEAR(bytes[QosClass::lifecycle] / total, 8.0 / 11, 0.01);
  EXPECT_NEAR(bytes[QosClass::telemetry] / total, 2.0 / 11, 0.01);
  EXPECT_NEAR(bytes[QosClass::bulk] / total, 1.0 / 11, 0.01);
}

TEST(Qos, AClassBackFromIdleGetsNoCreditForItsSilence) {
  SendQueues q(false, {1, 1, 1});
  for (int i = 0; i < 100; ++i) q.push(frame(QosClass::bulk, 1000));
  for (int i = 0; i < 50; ++i) q.pop();  // bulk alone: it had the whole wire
  for (int i = 0; i < 10; ++i) q.push(frame(QosClass::lifecycle, 1000));
  int lifecycle_first = 0;
  for (int i = 0; i < 10; ++i) {
    if (q.front().cls == QosClass::lifecycle) ++lifecycle_first;
    q.pop();
  }
  // Equal weights: the two alternate, lifecycle does not take the next 50 frames.
  EXPECT_GE(lifecycle_first, 4);
  EXPECT_LE(lifecycle_first, 6);
}

TEST(Qos, FifoWritesInPushOrder) {
  SendQueues q(true, {8, 2, 1});
  q.push(frame(QosClass::bulk, 1000, 'a'));
  q.push(frame(QosClass::telemetry, 1000, 'b'));
  q.push(frame(QosClass::control, 10, 'c'));
  EXPECT_EQ(q.size(QosClass::control), 3u);  // one queue for all
  std::string order;
  while (!q.empty()) {
    order += (*q.front().frame)[0];
    q.pop();
  }
  EXPECT_EQ(order, "abc");
}

TEST(Qos, DropUnsentKeepsOnlyTheFrameBeingWritten) {
  SendQueues q(false, {8, 2, 1});
  auto reply = frame(QosClass::control, 10);
  reply.reply_bytes = 10;
  q.push(frame(QosClass::bulk, 1000));
  q.push(reply);
  q.push(frame(QosClass::telemetry, 1000));
  EXPECT_EQ(q.front().cls, QosClass::control);
  EXPECT_EQ(q.drop_unsent(true), 0u);  // the reply being written stays
  EXPECT_EQ(q.size(), 1u);
  q.pop();
  EXPECT_TRUE(q.empty());
  q.push(reply);
  EXPECT_EQ(q.drop_unsent(false), 10u);
  EXPECT_TRUE(q.empty());
}

TEST(Qos, LagHistogramIsCumulativePerClass) {
  LagHistogram h;
  h.observe(QosClass::control, 0.002);
  h.observe(QosClass::control, 3.0);
  h.observe(QosClass::bulk, 0.0005);
  const std::string text = h.render();
  EXPECT_NE(text.find(R"(diaspora_relay_delivery_lag_seconds_bucket{class="control",le="0.0025"} 1)"), std::string::npos);
  EXPECT_NE(text.find(R"(diaspora_relay_delivery_lag_seconds_bucket{class="control",le="10"} 2)"), std::string::npos);
  EXPECT_NE(text.find(R"(diaspora_relay_delivery_lag_seconds_count{class="control"} 2)"), std::string::npos);
  EXPECT_NE(text.find(R"(diaspora_relay_delivery_lag_seconds_bucket{class="bulk",le="0.001"} 1)"), std::string::npos);
  EXPECT_NE(text.find(R"(diaspora_relay_delivery_lag_seconds_count{class="lifecycle"} 0)"), std::string::npos);
}

TEST(Qos, PacedBulkWaitsItsTurnWhileOtherClassesGoAtOnce) {
  SendQueues q(false, {8, 2, 1});
  q.set_bulk_rate(1e6);  // 1 MB/s: a 64 KiB frame is 65.5 ms of it
  for (int i = 0; i < 3; ++i) q.push(frame(QosClass::bulk, 65536));
  const auto t0 = SendQueues::Clock::now();
  SendQueues::Clock::duration wait{};
  ASSERT_NE(q.ready(t0, wait), nullptr);  // the burst allowance lets the first go
  q.pop();
  EXPECT_EQ(q.ready(t0, wait), nullptr);  // the next waits for the pace
  const double ms = std::chrono::duration<double, std::milli>(wait).count();
  EXPECT_GT(ms, 40);
  EXPECT_LT(ms, 70);
  q.push(frame(QosClass::lifecycle, 100));
  const auto* f = q.ready(t0, wait);  // a lifecycle frame is not held behind paced bulk
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->cls, QosClass::lifecycle);
  q.pop();
  f = q.ready(t0 + std::chrono::milliseconds(70), wait);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->cls, QosClass::bulk);
  q.pop();
  // Over a second of frames, the average holds the rate.
  int sent = 0;
  for (int ms10 = 0; ms10 <= 100; ++ms10) {
    q.push(frame(QosClass::bulk, 65536));
    while (q.ready(t0 + std::chrono::milliseconds(70 + ms10 * 10), wait)) q.pop(), ++sent;
  }
  EXPECT_NEAR(sent * 65536.0, 1e6, 2 * 65536.0);
}

TEST(Qos, FifoIsNeverPaced) {
  SendQueues q(true, {8, 2, 1});
  q.set_bulk_rate(1000);
  q.push(frame(QosClass::bulk, 65536));
  q.push(frame(QosClass::bulk, 65536));
  SendQueues::Clock::duration wait{};
  const auto now = SendQueues::Clock::now();
  ASSERT_NE(q.ready(now, wait), nullptr);
  q.pop();
  EXPECT_NE(q.ready(now, wait), nullptr);
}
