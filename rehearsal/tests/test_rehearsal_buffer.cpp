// RehearsalBuffer (insertion rule, balance, unbiasedness, memory bound, errors) and
// AsyncInserter (bounded queue, drops, never blocking the caller).
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <set>

#include "diaspora/rehearsal.hpp"
#include "rehearsal_test_util.hpp"

namespace dr = diaspora::rehearsal;
using dr::Batch;
using dr::BufferConfig;
using dr::RehearsalBuffer;
using dr::RehearsalError;
using diaspora::rehearsal::test::chi_square;
using diaspora::rehearsal::test::chi_square_critical;
using diaspora::rehearsal::test::Watchdog;
using namespace std::chrono_literals;

namespace {

at::Tensor long_tensor(const std::vector<std::int64_t>& v) {
  at::Tensor t = at::empty({static_cast<std::int64_t>(v.size())}, at::TensorOptions().dtype(at::kLong));
  std::copy(v.begin(), v.end(), t.data_ptr<std::int64_t>());
  return t;
}

// Samples (feature float[3] = id * 0.5, label int64, id int64); label is tensor 1.
Batch cls_batch(std::int64_t first_id, std::int64_t n, std::int64_t label) {
  at::Tensor ids = at::arange(first_id, first_id + n, at::TensorOptions().dtype(at::kLong));
  Batch b;
  b.tensors.push_back(ids.to(at::kFloat).mul(0.5).unsqueeze(1).expand({n, 3}).contiguous());
  b.tensors.push_back(at::full({n}, label, at::TensorOptions().dtype(at::kLong)));
  b.tensors.push_back(ids);
  return b;
}

// Labels given per sample.
Batch cls_batch(std::int64_t first_id, const std::vector<std::int64_t>& labels) {
  const auto n = static_cast<std::int64_t>(labels.size());
  Batch b = cls_batch(first_id, n, 0);
  auto* p = b.tensors[1].data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) p[i] = labels[static_cast<std::size_t>(i)];
  return b;
}

std::vector<std::int64_t> stored_ids(const RehearsalBuffer& buf) {
  std::vector<std::int64_t> slots(static_cast<std::size_t>(buf.size()));
  std::iota(slots.begin(), slots.end(), 0);
  Batch b = buf.gather(slots);
  const auto* p = b.tensors[2].data_ptr<std::int64_t>();
  return std::vector<std::int64_t>(p, p + b.size());
}

BufferConfig slots(std::uint64_t n, std::uint64_t seed = 1) {
  BufferConfig c;
  c.memory_bytes = 64ull << 20;
  c.max_samples = n;
  c.seed = seed;
  return c;
}

// Bins stored ids of [lo, hi) into `bins` equal bins and returns the chi-square against
// uniform, given the number of ids observed.
double uniformity(const std::vector<std::int64_t>& ids, std::int64_t lo, std::int64_t hi, int bins) {
  std::vector<double> obs(static_cast<std::size_t>(bins), 0.0);
  for (auto id : ids) {
    EXPECT_GE(id, lo);
    EXPECT_LT(id, hi);
    obs[static_cast<std::size_t>((id - lo) * bins / (hi - lo))] += 1;
  }
  std::vector<double> exp(static_cast<std::size_t>(bins), static_cast<double>(ids.size()) / bins);
  return chi_square(obs, exp);
}

}  // namespace

TEST(RehearsalBuffer, StoresGathersPacksAndUnpacks) {
  RehearsalBuffer buf(slots(50));
  EXPECT_EQ(buf.capacity(), 0);  // no layout yet
  EXPECT_EQ(buf.insert(cls_batch(0, 20, 3)), 20);
  EXPECT_EQ(buf.size(), 20);
  EXPECT_EQ(buf.capacity(), 50);
  EXPECT_EQ(buf.seen(), 20u);
  EXPECT_EQ(buf.class_counts(), (std::map<std::int64_t, std::int64_t>{{3, 20}}));
  ASSERT_TRUE(buf.layout());
  EXPECT_EQ(buf.layout()->to_string(), "[Float(3), Long(), Long()]");
  EXPECT_NE(buf.layout_fingerprint(), 0u);

  Batch g = buf.gather({0, 5, 19, 5});
  ASSERT_EQ(g.size(), 4);
  EXPECT_EQ(g.tensors[2][1].item<std::int64_t>(), 5);
  EXPECT_EQ(g.tensors[2][2].item<std::int64_t>(), 19);
  EXPECT_FLOAT_EQ(g.tensors[0][2][1].item<float>(), 9.5f);
  EXPECT_EQ(g.tensors[1][3].item<std::int64_t>(), 3);

  at::Tensor rows = buf.pack({19, 0});
  EXPECT_EQ(rows.size(1), static_cast<std::int64_t>(buf.layout()->row_bytes()));
  Batch u = RehearsalBuffer::unpack(*buf.layout(), rows);
  EXPECT_TRUE(u.tensors[0].equal(buf.gather({19, 0}).tensors[0]));
  EXPECT_THROW(RehearsalBuffer::unpack(*buf.layout(), rows.narrow(1, 0, 4)), RehearsalError);
  EXPECT_THROW(buf.gather({20}), RehearsalError);
  EXPECT_THROW(buf.gather({-1}), RehearsalError);
}

TEST(RehearsalBuffer, StoresOutputsForDer) {
  RehearsalBuffer buf(slots(10));
  Batch b = cls_batch(0, 4, 1);
  b.outputs = at::arange(40, at::TensorOptions().dtype(at::kFloat)).reshape({4, 10});
  EXPECT_EQ(buf.insert(b), 4);
  EXPECT_EQ(buf.layout()->to_string(), "[Float(3), Long(), Long()] + outputs Float(10)");
  Batch g = buf.gather({2});
  ASSERT_TRUE(g.outputs.defined());
  EXPECT_TRUE(g.outputs.equal(b.outputs.narrow(0, 2, 1)));
  Batch no_outputs = cls_batch(4, 2, 1);
  EXPECT_THROW(buf.insert(no_outputs), RehearsalError);  // layout mismatch
}

TEST(RehearsalBuffer, ClassIncrementalStreamStaysBalanced) {
  RehearsalBuffer buf(slots(100));
  std::int64_t id = 0;
  for (std::int64_t c = 0; c < 10; ++c) {
    for (int k = 0; k < 10; ++k, id += 100) buf.insert(cls_batch(id, 100, c));
    auto counts = buf.class_counts();
    auto quotas = buf.class_quotas();
    ASSERT_EQ(counts.size(), static_cast<std::size_t>(c + 1));
    std::int64_t total = 0;
    for (const auto& [cls, n] : counts) {
      EXPECT_EQ(n, quotas[cls]) << "class " << cls << " after class " << c;
      total += n;
    }
    EXPECT_EQ(total, 100);
    const std::int64_t k = c + 1;  // quota: 100 / K, the remainder to the earliest classes
    for (std::int64_t j = 0; j < k; ++j) EXPECT_EQ(quotas[j], 100 / k + (j < 100 % k ? 1 : 0));
  }
  // Every stored sample carries its own class (ids of class c are c*1000 .. c*1000+999).
  auto ids = stored_ids(buf);
  auto classes = buf.slot_classes();
  for (std::size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i] / 1000, classes[i]);
}

TEST(RehearsalBuffer, SkewedInterleavedStreamReachesQuotas) {
  RehearsalBuffer buf(slots(100, 7));
  std::mt19937_64 rng(11);
  std::int64_t id = 0;
  for (int b = 0; b < 100; ++b) {
    std::vector<std::int64_t> labels;
    for (int i = 0; i < 100; ++i) labels.push_back(rng() % 2 ? 0 : static_cast<std::int64_t>(1 + rng() % 9));
    buf.insert(cls_batch(id, labels));
    id += 100;
  }
  auto counts = buf.class_counts();
  ASSERT_EQ(counts.size(), 10u);
  for (const auto& [cls, n] : counts) EXPECT_EQ(n, 10) << "class " << cls;  // 100 slots / 10 classes
}

TEST(RehearsalBuffer, ClassSizesDependOnlyOnTheLabelSequence) {
  RehearsalBuffer a(slots(64, 1)), b(slots(64, 2));
  std::mt19937_64 rng(5);
  std::int64_t id = 0;
  for (int k = 0; k < 60; ++k) {
    std::vector<std::int64_t> labels;
    const std::int64_t classes = 1 + k / 6;  // new classes keep arriving
    for (int i = 0; i < 50; ++i) labels.push_back(static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(classes)));
    a.insert(cls_batch(id, labels));
    b.insert(cls_batch(id, labels));
    id += 50;
    ASSERT_EQ(a.class_counts(), b.class_counts()) << "after batch " << k;
  }
  EXPECT_NE(stored_ids(a), stored_ids(b));  // the contents are random, the sizes are not
}

// The brief's test: 100k items of one class into 100 slots; each item must be kept with
// probability 100/100k whatever its position in the stream.
TEST(RehearsalBuffer, ReservoirIsUnbiasedOverTheStream) {
  Watchdog dog(120s, "ReservoirIsUnbiasedOverTheStream");
  constexpr std::int64_t kItems = 100000, kSlots = 100, kTrials = 100, kBatch = 2000;
  std::vector<Batch> stream;
  for (std::int64_t id = 0; id < kItems; id += kBatch) stream.push_back(cls_batch(id, kBatch, 4));
  std::vector<std::int64_t> all;
  for (std::int64_t t = 0; t < kTrials; ++t) {
    RehearsalBuffer buf(slots(kSlots, 1000 + static_cast<std::uint64_t>(t)));
    for (const auto& b : stream) buf.insert(b);
    ASSERT_EQ(buf.size(), kSlots);
    auto ids = stored_ids(buf);
    ASSERT_EQ(std::set<std::int64_t>(ids.begin(), ids.end()).size(), static_cast<std::size_t>(kSlots));
    all.insert(all.end(), ids.begin(), ids.end());
  }
  // 10,000 kept items in 20 position bins of 5,000 items: 500 expected in each.
  const double x = uniformity(all, 0, kItems, 20);
  RecordProperty("chi_square", std::to_string(x));
  EXPECT_LT(x, chi_square_critical(19)) << "chi-square " << x;
  // Early vs late: the first and the last 1,000 items each expect 100 kept (binomial,
  // sd ~ 9.95); allow 4.5 sd.
  const auto early = std::count_if(all.begin(), all.end(), [](auto id) { return id < 1000; });
  const auto late = std::count_if(all.begin(), all.end(), [](auto id) { return id >= kItems - 1000; });
  RecordProperty("early_late", std::to_string(early) + " " + std::to_string(late));
  EXPECT_NEAR(static_cast<double>(early), 100.0, 45.0);
  EXPECT_NEAR(static_cast<double>(late), 100.0, 45.0);
}

// When a new class appears, the old class's slots shrink by uniform eviction: what stays
// is still a uniform sample of everything that class streamed.
TEST(RehearsalBuffer, RebalancingKeepsEachClassUnbiased) {
  Watchdog dog(120s, "RebalancingKeepsEachClassUnbiased");
  constexpr std::int64_t kPerClass = 20000, kTrials = 100;
  std::vector<Batch> a, b;
  for (std::int64_t id = 0; id < kPerClass; id += 1000) a.push_back(cls_batch(id, 1000, 0));
  for (std::int64_t id = 0; id < kPerClass; id += 1000) b.push_back(cls_batch(kPerClass + id, 1000, 1));
  std::vector<std::int64_t> kept_a, kept_b;
  for (std::int64_t t = 0; t < kTrials; ++t) {
    RehearsalBuffer buf(slots(100, 77 + static_cast<std::uint64_t>(t)));
    for (const auto& x : a) buf.insert(x);
    for (const auto& x : b) buf.insert(x);
    ASSERT_EQ(buf.class_counts(), (std::map<std::int64_t, std::int64_t>{{0, 50}, {1, 50}}));
    for (auto id : stored_ids(buf)) (id < kPerClass ? kept_a : kept_b).push_back(id);
  }
  const double xa = uniformity(kept_a, 0, kPerClass, 10);
  const double xb = uniformity(kept_b, kPerClass, 2 * kPerClass, 10);
  RecordProperty("chi_square", std::to_string(xa) + " " + std::to_string(xb));
  EXPECT_LT(xa, chi_square_critical(9)) << "class 0 chi-square " << xa;
  EXPECT_LT(xb, chi_square_critical(9)) << "class 1 chi-square " << xb;
}

// Regression / generative samples: several tensors, no class, one reservoir.
TEST(RehearsalBuffer, SingleReservoirForSamplesWithoutClass) {
  BufferConfig cfg = slots(50);
  cfg.class_balanced = false;
  constexpr std::int64_t kItems = 5000, kTrials = 200;
  std::vector<Batch> stream;
  for (std::int64_t id = 0; id < kItems; id += 500) {
    Batch b;
    at::Tensor ids = at::arange(id, id + 500, at::TensorOptions().dtype(at::kFloat));
    b.tensors.push_back(ids.reshape({500, 1, 1}).expand({500, 8, 8}).contiguous());  // diffraction
    b.tensors.push_back(at::zeros({500, 4, 4}));                                       // amplitude
    b.tensors.push_back(at::zeros({500, 4, 4}));                                       // phase
    stream.push_back(std::move(b));
  }
  std::vector<std::int64_t> all;
  for (std::int64_t t = 0; t < kTrials; ++t) {
    cfg.seed = 500 + static_cast<std::uint64_t>(t);
    RehearsalBuffer buf(cfg);
    for (const auto& b : stream) buf.insert(b);
    ASSERT_EQ(buf.class_counts(), (std::map<std::int64_t, std::int64_t>{{dr::kNoClass, 50}}));
    std::vector<std::int64_t> s(50);
    std::iota(s.begin(), s.end(), 0);
    Batch g = buf.gather(s);
    for (std::int64_t i = 0; i < 50; ++i) all.push_back(static_cast<std::int64_t>(g.tensors[0][i][3][5].item<float>()));
  }
  const double x = uniformity(all, 0, kItems, 10);
  RecordProperty("chi_square", std::to_string(x));
  EXPECT_LT(x, chi_square_critical(9)) << "chi-square " << x;
}

TEST(RehearsalBuffer, MemoryBoundIsHard) {
  // A sample: float[10] + int64 label = 48 bytes, + 16 bytes of bookkeeping = 64 a slot.
  for (std::uint64_t bound : {64ull, 1000ull, 4096ull, 10007ull, 1ull << 20}) {
    SCOPED_TRACE(bound);
    BufferConfig cfg;
    cfg.memory_bytes = bound;
    RehearsalBuffer buf(cfg);
    std::mt19937_64 rng(bound);
    for (int k = 0; k < 40; ++k) {
      std::vector<std::int64_t> labels;
      for (int i = 0; i < 500; ++i) labels.push_back(static_cast<std::int64_t>(rng() % 37));
      Batch b;
      b.tensors.push_back(at::zeros({500, 10}));
      b.tensors.push_back(long_tensor(labels));
      buf.insert(b);
      ASSERT_LE(buf.bytes_reserved(), bound);
      ASSERT_LE(buf.size(), buf.capacity());
    }
    EXPECT_EQ(buf.capacity(), static_cast<std::int64_t>(bound / 64));
    EXPECT_EQ(buf.bytes_reserved(), bound / 64 * 64);
    EXPECT_EQ(buf.size(), buf.capacity());
    std::int64_t total = 0;
    for (const auto& [cls, n] : buf.class_counts()) total += n;
    EXPECT_EQ(total, buf.size());
  }
  // Not even one sample fits: refused up front, nothing allocated.
  BufferConfig tiny;
  tiny.memory_bytes = 63;
  RehearsalBuffer buf(tiny);
  Batch b;
  b.tensors.push_back(at::zeros({2, 10}));
  b.tensors.push_back(at::zeros({2}, at::TensorOptions().dtype(at::kLong)));
  EXPECT_THROW(buf.insert(b), RehearsalError);
  EXPECT_EQ(buf.bytes_reserved(), 0u);
  EXPECT_EQ(buf.size(), 0);
}

TEST(RehearsalBuffer, MoreClassesThanSlots) {
  RehearsalBuffer buf(slots(8));
  std::vector<std::int64_t> labels(200);
  std::iota(labels.begin(), labels.end(), 0);
  for (int rep = 0; rep < 5; ++rep) buf.insert(cls_batch(rep * 200, labels));
  auto counts = buf.class_counts();
  EXPECT_EQ(counts.size(), 200u);
  std::int64_t total = 0;
  for (const auto& [cls, n] : counts) {
    EXPECT_LE(n, cls < 8 ? 1 : 0) << "class " << cls;  // quota 1 for the first 8 classes, 0 after
    total += n;
  }
  EXPECT_EQ(total, 8);
}

TEST(RehearsalBuffer, RejectsBadBatchesAndLayouts) {
  {
    RehearsalBuffer buf(slots(10));
    Batch b = cls_batch(0, 3, 1);
    b.tensors[1] = b.tensors[1].to(at::kFloat);  // a float label
    EXPECT_THROW(buf.validate(b), RehearsalError);
    EXPECT_EQ(buf.capacity(), 0);
  }
  {
    BufferConfig cfg = slots(10);
    cfg.label_tensor = 5;
    RehearsalBuffer buf(cfg);
    EXPECT_THROW(buf.insert(cls_batch(0, 3, 1)), RehearsalError);
  }
  {
    RehearsalBuffer buf(slots(10));
    Batch b = cls_batch(0, 3, 1);
    b.tensors[0] = b.tensors[0].narrow(0, 0, 2);  // 2 samples vs 3
    EXPECT_THROW(buf.insert(b), RehearsalError);
    b.tensors[0] = at::Tensor();
    EXPECT_THROW(buf.insert(b), RehearsalError);
    EXPECT_EQ(buf.insert(Batch{}), 0);  // an empty batch is a no-op
    buf.insert(cls_batch(0, 3, 1));
    Batch other = cls_batch(0, 3, 1);
    other.tensors[0] = at::zeros({3, 4});  // float[4] instead of float[3]
    EXPECT_THROW(buf.validate(other), RehearsalError);
    EXPECT_EQ(buf.size(), 3);
  }
  {
    dr::SampleLayout bad;
    bad.tensors.push_back({at::kFloat, {3}});
    bad.tensors.push_back({at::kLong, {2}});  // two labels per sample
    EXPECT_THROW({ RehearsalBuffer b(slots(10), bad); }, RehearsalError);
  }
}

// ---- asynchronous insertion ------------------------------------------------------------

TEST(AsyncInserter, FullQueueDropsNewestWithoutBlocking) {
  Watchdog dog(60s, "FullQueueDropsNewestWithoutBlocking");
  RehearsalBuffer buf(slots(1000));
  dr::AsyncInserter ins(buf, {4});
  ins.pause();  // the worker takes nothing: the queue fills
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(ins.try_submit(cls_batch(i * 10, 10, 0)));
  std::vector<Batch> more;
  for (int i = 0; i < 1000; ++i) more.push_back(cls_batch(100 + i * 10, 10, 0));
  std::vector<std::chrono::nanoseconds> lat;
  for (auto& b : more) {
    auto t0 = std::chrono::steady_clock::now();
    const bool ok = ins.try_submit(std::move(b));
    lat.push_back(std::chrono::steady_clock::now() - t0);
    EXPECT_FALSE(ok);
  }
  std::sort(lat.begin(), lat.end());
  // A drop is a lock and a compare; percentiles, not the maximum, so that one preemption
  // of this thread on a loaded machine does not fail the test.
  EXPECT_LT(lat[500], 200us);
  EXPECT_LT(lat[990], 5ms);
  auto s = ins.stats();
  EXPECT_EQ(s.batches_submitted, 1004u);
  EXPECT_EQ(s.batches_dropped, 1000u);
  EXPECT_EQ(s.samples_dropped, 10000u);
  EXPECT_EQ(s.queue_depth, 4u);
  EXPECT_EQ(buf.size(), 0);
  ins.resume();
  ASSERT_TRUE(ins.flush(30s));
  s = ins.stats();
  EXPECT_EQ(s.queue_depth, 0u);
  EXPECT_EQ(s.samples_offered, 40u);
  EXPECT_EQ(s.samples_stored, 40u);
  EXPECT_EQ(s.samples_offered + s.samples_dropped, s.samples_submitted);
  EXPECT_EQ(buf.size(), 40);
}

// A flood of expensive batches (each insertion copies 4 MiB: the tensor is a transposed,
// non-contiguous view) against a small queue: the caller's calls stay microseconds while
// the worker falls behind, and everything is accounted for.
TEST(AsyncInserter, FloodNeverWaitsOnInsertion) {
  Watchdog dog(120s, "FloodNeverWaitsOnInsertion");
  BufferConfig cfg;
  cfg.memory_bytes = 32ull << 20;
  RehearsalBuffer buf(cfg);
  dr::AsyncInserter ins(buf, {8});
  constexpr std::int64_t kBatch = 256, kDim = 4096;
  Batch b;
  b.tensors.push_back(at::zeros({kDim, kBatch}).t());  // [256, 4096], not contiguous
  b.tensors.push_back(at::zeros({kBatch}, at::TensorOptions().dtype(at::kLong)));

  // The cost of one insertion, measured synchronously on a scratch buffer.
  RehearsalBuffer scratch(cfg);
  scratch.insert(b);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) scratch.insert(b);
  const auto per_insert = (std::chrono::steady_clock::now() - t0) / 5;

  constexpr int kCalls = 3000;
  std::vector<std::chrono::nanoseconds> lat;
  lat.reserve(kCalls);
  auto f0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) {
    auto c0 = std::chrono::steady_clock::now();
    ins.try_submit(b);
    lat.push_back(std::chrono::steady_clock::now() - c0);
  }
  const auto flood = std::chrono::steady_clock::now() - f0;
  std::sort(lat.begin(), lat.end());
  const auto s = ins.stats();
  RecordProperty("per_insert_us", static_cast<int>(std::chrono::duration_cast<std::chrono::microseconds>(per_insert).count()));
  RecordProperty("median_submit_ns", static_cast<int>(lat[kCalls / 2].count()));
  RecordProperty("p99_submit_ns", static_cast<int>(lat[kCalls * 99 / 100].count()));
  RecordProperty("max_submit_us", static_cast<int>(std::chrono::duration_cast<std::chrono::microseconds>(lat.back()).count()));
  RecordProperty("batches_dropped", static_cast<int>(s.batches_dropped));
  EXPECT_GT(s.batches_dropped, 0u);
  EXPECT_LT(lat[kCalls / 2], 200us);
  EXPECT_LT(lat[kCalls * 99 / 100], 5ms);
  // Inserting what was submitted would take kCalls * per_insert; the flood took a small
  // fraction of that: the caller did not pay for insertion.
  EXPECT_LT(flood, kCalls * per_insert / 10);
  ASSERT_TRUE(ins.flush(60s));
  const auto d = ins.stats();
  EXPECT_EQ(d.samples_offered + d.samples_dropped, d.samples_submitted);
  EXPECT_EQ(d.samples_submitted, static_cast<std::uint64_t>(kCalls * kBatch));
  EXPECT_EQ(d.insert_errors, 0u);
  EXPECT_EQ(buf.seen(), d.samples_offered);
}

TEST(AsyncInserter, ReportsBadBatchesToTheCaller) {
  RehearsalBuffer buf(slots(10));
  dr::AsyncInserter ins(buf);
  EXPECT_TRUE(ins.try_submit(Batch{}));  // empty: nothing to do
  EXPECT_TRUE(ins.try_submit(cls_batch(0, 3, 1)));
  Batch other = cls_batch(3, 3, 1);
  other.tensors.pop_back();
  EXPECT_THROW(ins.try_submit(other), RehearsalError);
  ASSERT_TRUE(ins.flush(10s));
  EXPECT_EQ(buf.size(), 3);
  EXPECT_THROW({ dr::AsyncInserter bad(buf, {0}); }, RehearsalError);
}

TEST(AsyncInserter, DestroysWithQueuedBatches) {
  Watchdog dog(30s, "DestroysWithQueuedBatches");
  RehearsalBuffer buf(slots(10));
  {
    dr::AsyncInserter ins(buf, {3});
    ins.pause();
    for (int i = 0; i < 3; ++i) ins.try_submit(cls_batch(i, 1, 0));
  }  // queued batches are discarded, the worker stops
  EXPECT_EQ(buf.size(), 0);
}
