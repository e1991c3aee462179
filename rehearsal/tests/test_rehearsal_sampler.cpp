// GlobalSampler: the draw, and two ranks (two threads, each with its own
// ProcessGroupGloo on 127.0.0.1 over a FileStore) sampling uniformly over the union of
// unequal buffers, prefetching step i+1, empty and layout-less ranks, mismatched
// layouts, insertion running during sampling, and a peer that goes away.
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <functional>
#include <set>

#include "diaspora/rehearsal.hpp"
#include "rehearsal_test_util.hpp"

namespace dr = diaspora::rehearsal;
using dr::Batch;
using dr::GlobalSampler;
using dr::RehearsalBuffer;
using dr::RehearsalError;
using dr::SampledBatch;
using diaspora::rehearsal::test::chi_square;
using diaspora::rehearsal::test::chi_square_critical;
using diaspora::rehearsal::test::TempDir;
using diaspora::rehearsal::test::Watchdog;
using namespace std::chrono_literals;

namespace {

// (feature float[dim] = id * 0.5, label = id % 5, id).
Batch items(std::int64_t first_id, std::int64_t n, std::int64_t dim = 3) {
  at::Tensor ids = at::arange(first_id, first_id + n, at::TensorOptions().dtype(at::kLong));
  Batch b;
  b.tensors.push_back(ids.to(at::kFloat).mul(0.5).unsqueeze(1).expand({n, dim}).contiguous());
  b.tensors.push_back(ids.remainder(5));
  b.tensors.push_back(ids);
  return b;
}

dr::BufferConfig exactly(std::uint64_t n, std::uint64_t seed) {
  dr::BufferConfig c;
  c.max_samples = n;
  c.seed = seed;
  return c;
}

dr::SamplerConfig sampling(std::int64_t r, std::uint64_t seed, bool prefetch) {
  dr::SamplerConfig c;
  c.representatives = r;
  c.seed = seed;
  c.prefetch = prefetch;
  return c;
}

// Runs fn(rank, group) on `world` threads, each with its own Gloo group on one FileStore.
void run_ranks(int world, const std::function<void(int, c10::intrusive_ptr<c10d::ProcessGroup>)>& fn,
               std::chrono::milliseconds timeout = 20s) {
  TempDir store_dir;
  const std::string store_file = (store_dir.path() / "store").string();
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        auto store = c10::make_intrusive<c10d::FileStore>(store_file, world);
        auto group = dr::make_process_group("gloo", store, r, world, timeout, "127.0.0.1");
        fn(r, group);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
}

// Checks every row against the item its global index names (rank 0 holds ids
// 0..n0-1 in slots 0..n0-1, rank 1 ids 1000.. in its slots) and returns the ids.
std::vector<std::int64_t> check_rows(const SampledBatch& s, std::int64_t n0) {
  std::vector<std::int64_t> ids;
  const Batch& b = s.batch;
  EXPECT_EQ(b.size(), static_cast<std::int64_t>(s.global_indices.size()));
  for (std::int64_t i = 0; i < b.size(); ++i) {
    const std::int64_t id = b.tensors[2][i].item<std::int64_t>();
    const std::int64_t g = s.global_indices[static_cast<std::size_t>(i)];
    EXPECT_EQ(id, g < n0 ? g : 1000 + (g - n0)) << "row " << i << " of step " << s.step;
    EXPECT_EQ(b.tensors[1][i].item<std::int64_t>(), id % 5);
    EXPECT_FLOAT_EQ(b.tensors[0][i][0].item<float>(), static_cast<float>(id) * 0.5f);
    ids.push_back(id);
  }
  return ids;
}

}  // namespace

// ---- the draw alone ------------------------------------------------------------------------

TEST(GlobalSamplerDraw, ChunksAreDistinctDeterministicAndInRange) {
  auto d = GlobalSampler::draw(42, 7, {300, 100}, 10);
  ASSERT_EQ(d.size(), 2u);
  std::set<std::int64_t> all;
  for (const auto& c : d) {
    EXPECT_EQ(c.size(), 10u);
    for (auto g : c) {
      EXPECT_GE(g, 0);
      EXPECT_LT(g, 400);
      all.insert(g);
    }
  }
  EXPECT_EQ(all.size(), 20u);  // N >= W*R: no sample twice in one step
  EXPECT_EQ(d, GlobalSampler::draw(42, 7, {300, 100}, 10));
  EXPECT_NE(d, GlobalSampler::draw(42, 8, {300, 100}, 10));
  EXPECT_NE(d, GlobalSampler::draw(43, 7, {300, 100}, 10));

  auto small = GlobalSampler::draw(1, 0, {3, 2}, 4);  // N = 5 < W*R = 8: independent chunks
  for (const auto& c : small) {
    EXPECT_EQ(c.size(), 4u);
    EXPECT_EQ(std::set<std::int64_t>(c.begin(), c.end()).size(), 4u);
  }
  auto tiny = GlobalSampler::draw(1, 0, {2, 0}, 5);  // N < R: everything, once
  for (const auto& c : tiny) EXPECT_EQ(std::set<std::int64_t>(c.begin(), c.end()), (std::set<std::int64_t>{0, 1}));
  for (const auto& c : GlobalSampler::draw(1, 0, {0, 0}, 5)) EXPECT_TRUE(c.empty());
}

TEST(GlobalSamplerDraw, UniformOverTheUnion) {
  std::vector<double> counts(400, 0.0);
  for (std::uint64_t step = 0; step < 20000; ++step)
    for (const auto& c : GlobalSampler::draw(9, step, {300, 100}, 10))
      for (auto g : c) counts[static_cast<std::size_t>(g)] += 1;
  const double x = chi_square(counts, std::vector<double>(400, 20000.0 * 20 / 400));
  RecordProperty("chi_square", std::to_string(x));
  EXPECT_LT(x, chi_square_critical(399)) << "chi-square " << x;
}

// ---- two ranks over Gloo -------------------------------------------------------------------

// The brief's test: buffers of 300 and 100 items; every draw must be uniform over the 400
// (rank 0's items three times as often as rank 1's in total, each item equally often).
TEST(GlobalSampler, TwoRanksSampleUniformlyOverTheUnion) {
  Watchdog dog(170s, "TwoRanksSampleUniformlyOverTheUnion");
  constexpr int kSteps = 1000;
  constexpr std::int64_t kR = 10;
  std::vector<std::vector<std::int64_t>> ids(2);
  std::vector<std::vector<std::vector<std::int64_t>>> indices(2);
  run_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    const std::int64_t n = rank == 0 ? 300 : 100;
    RehearsalBuffer buf(exactly(static_cast<std::uint64_t>(n), 1 + static_cast<std::uint64_t>(rank)));
    ASSERT_EQ(buf.insert(items(rank * 1000, n)), n);
    GlobalSampler sampler(buf, group, sampling(kR, 2024, true));
    EXPECT_EQ(sampler.rank(), rank);
    EXPECT_EQ(sampler.world_size(), 2);
    for (int step = 0; step < kSteps; ++step) {
      SampledBatch s = sampler.next();
      ASSERT_EQ(s.step, static_cast<std::uint64_t>(step));
      ASSERT_EQ(s.batch.size(), kR);
      ASSERT_EQ(s.rank_sizes, (std::vector<std::int64_t>{300, 100}));
      auto got = check_rows(s, 300);
      ids[static_cast<std::size_t>(rank)].insert(ids[static_cast<std::size_t>(rank)].end(), got.begin(), got.end());
      indices[static_cast<std::size_t>(rank)].push_back(s.global_indices);
    }
  });
  ASSERT_EQ(ids[0].size(), static_cast<std::size_t>(kSteps * kR));
  ASSERT_EQ(ids[1].size(), static_cast<std::size_t>(kSteps * kR));
  std::vector<double> counts(400, 0.0);
  double from_rank0 = 0;
  for (const auto& v : ids)
    for (auto id : v) {
      counts[static_cast<std::size_t>(id < 1000 ? id : 300 + (id - 1000))] += 1;
      from_rank0 += id < 1000 ? 1 : 0;
    }
  // 20,000 draws over 400 items: 50 each; chi-square with 399 degrees of freedom.
  const double x = chi_square(counts, std::vector<double>(400, 2.0 * kSteps * kR / 400));
  RecordProperty("chi_square", std::to_string(x));
  EXPECT_LT(x, chi_square_critical(399)) << "chi-square " << x;
  // Binomial(20000, 0.75) for rank 0's share: sd 61; allow 5 sd.
  RecordProperty("from_rank0", std::to_string(from_rank0));
  EXPECT_NEAR(from_rank0, 15000.0, 5 * 61.3);
  // Per step, the two ranks' representatives are disjoint.
  for (int step = 0; step < kSteps; ++step) {
    std::set<std::int64_t> u(indices[0][static_cast<std::size_t>(step)].begin(), indices[0][static_cast<std::size_t>(step)].end());
    u.insert(indices[1][static_cast<std::size_t>(step)].begin(), indices[1][static_cast<std::size_t>(step)].end());
    EXPECT_EQ(u.size(), static_cast<std::size_t>(2 * kR)) << "step " << step;
  }
}

// next() returns step i and leaves step i+1 in flight; the prefetched batch is exactly
// the draw of step i+1 and is ready while the caller "trains".
TEST(GlobalSampler, PrefetchReturnsTheBatchOfTheNextStep) {
  Watchdog dog(120s, "PrefetchReturnsTheBatchOfTheNextStep");
  run_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    const std::int64_t n = rank == 0 ? 300 : 100;
    RehearsalBuffer buf(exactly(static_cast<std::uint64_t>(n), 3));
    buf.insert(items(rank * 1000, n));
    GlobalSampler sampler(buf, group, sampling(7, 5, true));
    EXPECT_FALSE(sampler.prefetch_pending());
    EXPECT_EQ(sampler.next_step(), 0u);
    for (std::uint64_t i = 0; i < 20; ++i) {
      SampledBatch s = sampler.next();
      EXPECT_EQ(s.step, i);
      EXPECT_EQ(s.global_indices, GlobalSampler::draw(5, i, {300, 100}, 7)[static_cast<std::size_t>(rank)]);
      check_rows(s, 300);
      EXPECT_EQ(sampler.next_step(), i + 1);
      EXPECT_TRUE(sampler.prefetch_pending());  // step i+1 is being fetched
      // "Training" step i: the prefetch completes meanwhile.
      auto deadline = std::chrono::steady_clock::now() + 10s;
      while (!sampler.prefetch_ready() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
      EXPECT_TRUE(sampler.prefetch_ready()) << "step " << i + 1 << " not fetched after 10 s";
    }
  });
}

TEST(GlobalSampler, WithoutPrefetchRunsEachStepInNext) {
  Watchdog dog(60s, "WithoutPrefetchRunsEachStepInNext");
  run_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    const std::int64_t n = rank == 0 ? 300 : 100;
    RehearsalBuffer buf(exactly(static_cast<std::uint64_t>(n), 3));
    buf.insert(items(rank * 1000, n));
    GlobalSampler sampler(buf, group, sampling(7, 5, false));
    for (std::uint64_t i = 0; i < 5; ++i) {
      SampledBatch s = sampler.next();
      EXPECT_EQ(s.global_indices, GlobalSampler::draw(5, i, {300, 100}, 7)[static_cast<std::size_t>(rank)]);
      EXPECT_FALSE(sampler.prefetch_pending());
    }
  });
}

// A rank with an empty buffer (layout given up front) serves nothing and receives its
// share from the other rank: the alltoall has zero-row splits.
TEST(GlobalSampler, EmptyRankReceivesFromTheOther) {
  Watchdog dog(60s, "EmptyRankReceivesFromTheOther");
  run_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    RehearsalBuffer buf(exactly(300, 4), items(0, 1).layout());
    if (rank == 0) buf.insert(items(0, 300));
    GlobalSampler sampler(buf, group, sampling(16, 8, true));
    for (int i = 0; i < 50; ++i) {
      SampledBatch s = sampler.next();
      ASSERT_EQ(s.batch.size(), 16);
      for (auto g : s.global_indices) EXPECT_LT(g, 300);
      check_rows(s, 300);
    }
  });
}

// No data anywhere, or a rank that cannot decode rows yet: empty batches on all ranks,
// then representatives once every rank has a layout. A step draws from the sizes the
// previous step exchanged, so what is inserted becomes drawable one step later; a seek()
// without a batch gathers sizes afresh.
TEST(GlobalSampler, EmptyBatchesUntilEveryRankHasALayout) {
  Watchdog dog(60s, "EmptyBatchesUntilEveryRankHasALayout");
  run_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    RehearsalBuffer buf(exactly(300, 5));  // no layout until the first insert
    GlobalSampler sampler(buf, group, sampling(4, 1, false));
    SampledBatch s = sampler.next();
    EXPECT_EQ(s.batch.size(), 0);  // nothing anywhere
    EXPECT_EQ(s.next_info.size(), 6u);
    if (rank == 0) buf.insert(items(0, 300));
    s = sampler.next();
    EXPECT_EQ(s.batch.size(), 0);  // drawn from step 0's sizes: nothing anywhere
    EXPECT_EQ(s.rank_sizes, (std::vector<std::int64_t>{0, 0}));
    s = sampler.next();
    EXPECT_EQ(s.batch.size(), 0);  // rank 1 has no layout yet
    EXPECT_EQ(s.rank_sizes, (std::vector<std::int64_t>{300, 0}));
    if (rank == 1) buf.insert(items(1000, 100));
    EXPECT_EQ(sampler.next().batch.size(), 0);  // step 3 draws from step 2's exchange
    s = sampler.next();
    EXPECT_EQ(s.step, 4u);
    EXPECT_EQ(s.rank_sizes, (std::vector<std::int64_t>{300, 100}));
    EXPECT_EQ(s.batch.size(), 4);
    check_rows(s, 300);
    // seek() without a batch: the next step gathers the sizes of now.
    if (rank == 1) buf.insert(items(1100, 50));
    sampler.seek(5);
    s = sampler.next();
    EXPECT_EQ(s.rank_sizes, (std::vector<std::int64_t>{300, 150}));
    EXPECT_EQ(s.batch.size(), 4);
    check_rows(s, 300);
  });
}

TEST(GlobalSampler, MismatchedLayoutsThrowOnEveryRank) {
  Watchdog dog(60s, "MismatchedLayoutsThrowOnEveryRank");
  std::vector<int> threw(2, 0);
  run_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    RehearsalBuffer buf(exactly(10, 1));
    buf.insert(items(rank * 1000, 10, rank == 0 ? 3 : 4));  // float[3] vs float[4]
    GlobalSampler sampler(buf, group, sampling(2, 1, true));
    for (int i = 0; i < 2; ++i) {
      try {
        sampler.next();
      } catch (const RehearsalError& e) {
        EXPECT_NE(std::string(e.what()).find("layout differs"), std::string::npos) << e.what();
        ++threw[static_cast<std::size_t>(rank)];
      }
    }
    EXPECT_EQ(sampler.next_step(), 2u);
  });
  EXPECT_EQ(threw, (std::vector<int>{2, 2}));
}

// Asynchronous insertion keeps writing both buffers while the sampler prefetches:
// rows are never torn, sizes only grow, every rank sees the same sizes.
TEST(GlobalSampler, SamplesWhileInsertionRuns) {
  Watchdog dog(120s, "SamplesWhileInsertionRuns");
  run_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    RehearsalBuffer buf(exactly(rank == 0 ? 256 : 64, 10 + static_cast<std::uint64_t>(rank)));
    dr::AsyncInserter ins(buf, {4});
    GlobalSampler sampler(buf, group, sampling(8, 3, true));
    std::int64_t next_id = rank * 100000;
    std::int64_t last_total = 0;
    for (int step = 0; step < 200; ++step) {
      SampledBatch s = sampler.next();
      std::int64_t total = 0;
      for (auto n : s.rank_sizes) total += n;
      EXPECT_GE(total, last_total);
      last_total = total;
      for (std::int64_t i = 0; i < s.batch.size(); ++i) {
        const std::int64_t id = s.batch.tensors[2][i].item<std::int64_t>();
        EXPECT_EQ(s.batch.tensors[1][i].item<std::int64_t>(), id % 5);
        EXPECT_FLOAT_EQ(s.batch.tensors[0][i][2].item<float>(), static_cast<float>(id) * 0.5f);
      }
      ins.try_submit(items(next_id, 32));
      next_id += 32;
    }
    EXPECT_TRUE(ins.flush(30s));
  });
}

// A peer that leaves: the collective fails within the group's timeout, the sampler
// reports it and stays broken.
TEST(GlobalSampler, PeerGoneBreaksTheSampler) {
  Watchdog dog(90s, "PeerGoneBreaksTheSampler");
  std::string first, second;
  run_ranks(
      2,
      [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
        RehearsalBuffer buf(exactly(10, 1));
        buf.insert(items(rank * 1000, 10));
        if (rank == 1) {
          group->barrier()->wait();
          return;  // leaves: its group is destroyed
        }
        GlobalSampler sampler(buf, group, sampling(2, 1, false));
        group->barrier()->wait();
        std::this_thread::sleep_for(200ms);
        try {
          sampler.next();
        } catch (const RehearsalError& e) {
          first = e.what();
        }
        try {
          sampler.next();
        } catch (const RehearsalError& e) {
          second = e.what();
        }
      },
      3s);
  EXPECT_NE(first.find("failed"), std::string::npos) << first;
  EXPECT_NE(second.find("broken"), std::string::npos) << second;
}

TEST(GlobalSampler, RejectsBadArguments) {
  RehearsalBuffer buf(exactly(10, 1));
  EXPECT_THROW({ GlobalSampler s(buf, {}, sampling(1, 1, true)); }, RehearsalError);
  TempDir dir;
  auto store = c10::make_intrusive<c10d::FileStore>((dir.path() / "store").string(), 1);
  EXPECT_THROW(dr::make_process_group("mpi", store, 0, 1, 1s), RehearsalError);
  EXPECT_THROW(dr::make_process_group("gloo", store, 1, 1, 1s), RehearsalError);  // rank out of range
  EXPECT_THROW(dr::make_process_group("gloo", {}, 0, 1, 1s), RehearsalError);
#ifndef DIASPORA_WITH_CUDA
  EXPECT_THROW(dr::make_process_group("nccl", store, 0, 1, 1s), RehearsalError);
  auto group = dr::make_process_group("gloo", store, 0, 1, 5s, "127.0.0.1");
  dr::SamplerConfig cuda = sampling(1, 1, true);
  cuda.comm_device = "cuda";
  EXPECT_THROW({ GlobalSampler s(buf, group, cuda); }, RehearsalError);
  cuda.comm_device = "not-a-device";
  EXPECT_THROW({ GlobalSampler s(buf, group, cuda); }, RehearsalError);
  EXPECT_THROW({ GlobalSampler s(buf, group, sampling(0, 1, true)); }, RehearsalError);
  // A world of one: the union is the local buffer.
  buf.insert(items(0, 10));
  GlobalSampler solo(buf, group, sampling(4, 1, true));
  for (int i = 0; i < 3; ++i) check_rows(solo.next(), 10);
#endif
}
