// GlobalSampler: R representatives per rank per step, uniform over the union of all
// ranks' buffers, moved with one c10d alltoall_base a step (packed rows, headed by the
// sender's buffer size for the next step's draw; an allgather of sizes only when there is
// no previous exchange), prefetched one step ahead on a background thread (one for the
// sampler's life; a thread started per step made 2-rank DER++ steps 2-3 % slower).
#include <ATen/ops/empty.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#ifdef DIASPORA_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>
#include <utility>

#include "diaspora/rehearsal.hpp"
#include "diaspora/thread_name.hpp"
#include "random.hpp"

namespace diaspora::rehearsal {

namespace {

// A collective failed: the group's state is unknown, the sampler cannot go on.
class CollectiveFailure : public RehearsalError {
 public:
  using RehearsalError::RehearsalError;
};

// k distinct values of [0, n) (k <= n) in uniformly random order: Floyd's algorithm, then
// a shuffle (Floyd's insertion order is not uniform).
std::vector<std::int64_t> distinct(Rng& rng, std::int64_t n, std::int64_t k) {
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(k));
  std::unordered_set<std::int64_t> seen;
  seen.reserve(static_cast<std::size_t>(k) * 2);
  for (std::int64_t j = n - k; j < n; ++j) {
    const auto t = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(j) + 1));
    const std::int64_t pick = seen.insert(t).second ? t : j;
    if (pick == j) seen.insert(j);
    out.push_back(pick);
  }
  rng.shuffle(out);
  return out;
}

}  // namespace

struct GlobalSampler::Impl {
  RehearsalBuffer& buffer;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  SamplerConfig cfg;
  c10::Device device{c10::kCPU};
  int rank = 0;
  int world = 1;
  std::uint64_t next_step = 0;
  std::future<SampledBatch> pending;
  std::optional<SampledBatch> ready;  // taken out of `pending` by prefetched(), or given to seek()
  std::exception_ptr ready_error;     // pending's failure, taken out by prefetched()
  bool broken = false;
  std::string broken_reason;
  // (size, fingerprint, row bytes) per rank from the last step's exchange: the next draw's
  // sizes. Empty: the next step gathers them first. Used by one step at a time (the
  // worker's or take()'s), handed over through the future.
  std::vector<std::int64_t> known;

  // The prefetch thread: runs one draw at a time, handed over as a packaged task. Last
  // member, so it stops before the members its draws use are destroyed.
  struct Worker {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<std::packaged_task<SampledBatch()>> task;
    bool stop = false;
    std::thread thread;

    std::future<SampledBatch> submit(std::packaged_task<SampledBatch()> t) {
      auto fut = t.get_future();
      {
        std::lock_guard lk(mu);
        task = std::move(t);  // one at a time: the previous one's future was taken first
      }
      if (!thread.joinable())
        thread = std::thread([this] {
          name_this_thread("dsp-sampler");
          run();
        });
      cv.notify_one();
      return fut;
    }
    void run() {
      std::unique_lock lk(mu);
      for (;;) {
        cv.wait(lk, [&] { return stop || task.has_value(); });
        if (!task) return;  // stop, nothing left
        auto t = std::move(*task);
        task.reset();
        lk.unlock();
        t();  // the result or exception goes to the future
        lk.lock();
      }
    }
    ~Worker() {
      {
        std::lock_guard lk(mu);
        stop = true;
      }
      cv.notify_one();
      if (thread.joinable()) thread.join();
    }
  } worker;

  Impl(RehearsalBuffer& b, c10::intrusive_ptr<c10d::ProcessGroup> g, SamplerConfig c)
      : buffer(b), group(std::move(g)), cfg(std::move(c)) {}

  template <class F>
  auto collective(const char* what, std::uint64_t step, F&& f) {
    try {
      return f();
    } catch (const std::exception& e) {
      throw CollectiveFailure(std::string("rehearsal sampler, step ") + std::to_string(step) + ": " + what +
                              " failed: " + e.what());
    }
  }

  static constexpr std::int64_t kInfo = 3;  // size, fingerprint, row bytes
  static constexpr std::int64_t kHeader = kInfo * static_cast<std::int64_t>(sizeof(std::int64_t));

  // This rank's (size, fingerprint, row bytes) now.
  void local_info(std::int64_t* p) const {
    const auto layout = buffer.layout();
    const std::uint64_t fp = layout ? layout->fingerprint() : 0;
    p[0] = buffer.size();
    std::memcpy(&p[1], &fp, sizeof fp);
    p[2] = layout ? static_cast<std::int64_t>(layout->row_bytes()) : 0;
  }

  std::vector<std::int64_t> gather_info(std::uint64_t step) {
    at::Tensor info = at::empty({kInfo}, at::TensorOptions().dtype(at::kLong));
    local_info(info.data_ptr<std::int64_t>());
    std::vector<at::Tensor> inputs{info.to(device)};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < world; ++r) outputs[0].push_back(at::empty({kInfo}, at::TensorOptions().dtype(at::kLong).device(device)));
    collective("allgather of buffer sizes", step, [&] { return group->allgather(outputs, inputs)->wait(); });
    std::vector<std::int64_t> all;
    for (int r = 0; r < world; ++r) {
      at::Tensor t = outputs[0][static_cast<std::size_t>(r)].to(at::kCPU).contiguous();
      all.insert(all.end(), t.data_ptr<std::int64_t>(), t.data_ptr<std::int64_t>() + kInfo);
    }
    return all;
  }

  SampledBatch run_step(std::uint64_t step) {
    // One rank: nothing to exchange, the sizes of now. Several: the previous step's
    // exchange; a step that throws leaves none behind and the next one gathers afresh.
    std::vector<std::int64_t> info(static_cast<std::size_t>(kInfo));
    if (world == 1) local_info(info.data());
    else info = known.empty() ? gather_info(step) : std::move(known);
    known.clear();
    SampledBatch out;
    out.step = step;
    const auto layout = buffer.layout();

    std::vector<std::int64_t> sizes(static_cast<std::size_t>(world));
    std::vector<std::uint64_t> fps(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) {
      sizes[static_cast<std::size_t>(r)] = info[static_cast<std::size_t>(r * kInfo)];
      std::memcpy(&fps[static_cast<std::size_t>(r)], &info[static_cast<std::size_t>(r * kInfo + 1)], sizeof(std::uint64_t));
    }
    out.rank_sizes = sizes;

    // Every rank takes the same decisions from the same numbers.
    std::int64_t total = 0;
    for (auto n : sizes) total += n;
    const bool all_have_layout = std::all_of(fps.begin(), fps.end(), [](std::uint64_t f) { return f != 0; });
    const bool draw_now = total > 0 && all_have_layout;
    if (draw_now) {
      for (int r = 1; r < world; ++r)
        if (fps[static_cast<std::size_t>(r)] != fps[0])
          throw RehearsalError("rehearsal sampler, step " + std::to_string(step) + ": rank " + std::to_string(r) +
                               "'s buffer layout differs from rank 0's (fingerprints " +
                               std::to_string(fps[static_cast<std::size_t>(r)]) + " and " + std::to_string(fps[0]) +
                               "); this rank's is " + layout->to_string());
    }
    // (A layout, once fixed, never changes: equal fingerprints then mean equal layouts now.)
    const std::int64_t row = draw_now ? info[2] : 0;

    // 2. the draw, identical on all ranks (none when nothing can be drawn: headers only).
    const auto chunks = draw_now ? draw(cfg.seed, step, sizes, cfg.representatives)
                                 : std::vector<std::vector<std::int64_t>>(static_cast<std::size_t>(world));
    std::vector<std::int64_t> offsets(static_cast<std::size_t>(world) + 1, 0);
    for (int r = 0; r < world; ++r) offsets[static_cast<std::size_t>(r) + 1] = offsets[static_cast<std::size_t>(r)] + sizes[static_cast<std::size_t>(r)];
    auto owner = [&](std::int64_t g) {
      return static_cast<int>(std::upper_bound(offsets.begin(), offsets.end(), g) - offsets.begin()) - 1;
    };

    // 3. what this rank sends to each rank (its own samples in their chunks, chunk order)
    //    and what it receives from each (grouped by source rank, in chunk order), each
    //    chunk headed by the sender's (size, fingerprint, row bytes) now.
    std::vector<std::int64_t> send_slots;
    std::vector<std::int64_t> send_counts(static_cast<std::size_t>(world), 0);
    std::vector<std::int64_t> recv_counts(static_cast<std::size_t>(world), 0);
    for (int k = 0; k < world; ++k)
      for (auto g : chunks[static_cast<std::size_t>(k)])
        if (owner(g) == rank) {
          send_slots.push_back(g - offsets[static_cast<std::size_t>(rank)]);
          ++send_counts[static_cast<std::size_t>(k)];
        }
    const auto& mine = chunks[static_cast<std::size_t>(rank)];
    for (auto g : mine) ++recv_counts[static_cast<std::size_t>(owner(g))];

    std::int64_t header[kInfo];
    local_info(header);  // before packing: these slots will still hold samples when read
    const at::Tensor rows =
        draw_now ? buffer.pack(send_slots).contiguous() : at::empty({0}, at::TensorOptions().dtype(at::kByte));
    std::vector<std::int64_t> send_splits(static_cast<std::size_t>(world)), recv_splits(static_cast<std::size_t>(world));
    std::int64_t send_bytes = 0, recv_bytes = 0;
    for (int k = 0; k < world; ++k) {
      send_splits[static_cast<std::size_t>(k)] = kHeader + send_counts[static_cast<std::size_t>(k)] * row;
      recv_splits[static_cast<std::size_t>(k)] = kHeader + recv_counts[static_cast<std::size_t>(k)] * row;
      send_bytes += send_splits[static_cast<std::size_t>(k)];
      recv_bytes += recv_splits[static_cast<std::size_t>(k)];
    }
    at::Tensor send = at::empty({send_bytes}, at::TensorOptions().dtype(at::kByte));
    {
      auto* dst = send.data_ptr<std::uint8_t>();
      const auto* src = rows.numel() > 0 ? rows.data_ptr<std::uint8_t>() : nullptr;
      for (int k = 0; k < world; ++k) {  // rows are packed destination by destination
        std::memcpy(dst, header, kHeader);
        dst += kHeader;
        const auto n = static_cast<std::size_t>(send_counts[static_cast<std::size_t>(k)] * row);
        if (n > 0) std::memcpy(dst, src, n);
        dst += n;
        src += n;
      }
    }
    if (!device.is_cpu()) send = send.to(device);
    at::Tensor recv = at::empty({recv_bytes}, at::TensorOptions().dtype(at::kByte).device(device));
    // ProcessGroupGloo moves the split vectors into its work object: pass copies.
    std::vector<std::int64_t> rs = recv_splits, ss = send_splits;
    if (world == 1) recv = send;  // its own chunk
    else collective("alltoall of representatives", step, [&] { return group->alltoall_base(recv, send, rs, ss)->wait(); });
    recv = recv.to(at::kCPU).contiguous();

    // Headers for the next step; rows back to draw order.
    const auto* base = recv.data_ptr<std::uint8_t>();
    std::vector<std::size_t> from(static_cast<std::size_t>(world));  // byte offset of each source's rows
    std::vector<std::int64_t> next(static_cast<std::size_t>(world * kInfo));
    std::size_t off = 0;
    for (int r = 0; r < world; ++r) {
      std::memcpy(&next[static_cast<std::size_t>(r * kInfo)], base + off, kHeader);
      from[static_cast<std::size_t>(r)] = off + kHeader;
      off += static_cast<std::size_t>(recv_splits[static_cast<std::size_t>(r)]);
    }
    if (world > 1) out.next_info = next;
    if (draw_now) {
      at::Tensor ordered = at::empty({static_cast<std::int64_t>(mine.size()), row}, at::TensorOptions().dtype(at::kByte));
      auto* dst = ordered.data_ptr<std::uint8_t>();
      for (std::size_t p = 0; p < mine.size(); ++p) {
        std::size_t& f = from[static_cast<std::size_t>(owner(mine[p]))];
        std::memcpy(dst + p * static_cast<std::size_t>(row), base + f, static_cast<std::size_t>(row));
        f += static_cast<std::size_t>(row);
      }
      out.batch = RehearsalBuffer::unpack(*layout, ordered);
      out.global_indices = mine;
    } else if (layout) {
      // Nothing to draw, or a rank cannot decode rows yet (its buffer has seen no batch
      // and was built without a layout): this step has no representatives, on all ranks.
      out.batch = RehearsalBuffer::unpack(*layout, at::empty({0, static_cast<std::int64_t>(layout->row_bytes())},
                                                             at::TensorOptions().dtype(at::kByte)));
    }
    if (world > 1) known = std::move(next);
    return out;
  }
};

GlobalSampler::GlobalSampler(RehearsalBuffer& buffer, c10::intrusive_ptr<c10d::ProcessGroup> group,
                             SamplerConfig config)
    : self_(std::make_unique<Impl>(buffer, std::move(group), std::move(config))) {
  Impl& s = *self_;
  if (!s.group) throw RehearsalError("GlobalSampler needs a process group");
  if (s.cfg.representatives < 1) throw RehearsalError("sampling.representatives must be at least 1");
  try {
    s.device = c10::Device(s.cfg.comm_device);
  } catch (const std::exception& e) {
    throw RehearsalError("sampling.comm_device '" + s.cfg.comm_device + "' is not a device: " + e.what());
  }
#ifndef DIASPORA_WITH_CUDA
  if (!s.device.is_cpu())
    throw RehearsalError("sampling.comm_device '" + s.cfg.comm_device +
                         "': this build has no CUDA paths (configure with DIASPORA_WITH_CUDA=ON and a CUDA LibTorch)");
#endif
  s.rank = s.group->getRank();
  s.world = s.group->getSize();
#ifdef DIASPORA_WITH_CUDA
  // "cuda" without an index: one GPU per rank on a node (NCCL refuses two ranks on one
  // device), assuming ranks numbered node by node and the same GPU count on every node.
  // Untested: no GPU on the machines this is developed on.
  if (s.device.is_cuda() && !s.device.has_index() && at::cuda::device_count() > 0)
    s.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(s.rank % at::cuda::device_count()));
#endif
}

GlobalSampler::~GlobalSampler() {
  if (self_ && self_->pending.valid()) {
    try {
      self_->pending.get();
    } catch (...) {  // reported by next(), which will not be called any more
    }
  }
}

SampledBatch GlobalSampler::next() {
  SampledBatch out = take();
  prefetch();
  return out;
}

SampledBatch GlobalSampler::take() {
  Impl& s = *self_;
  if (s.broken) throw RehearsalError("rehearsal sampler is broken by an earlier failure: " + s.broken_reason);
  const std::uint64_t step = s.next_step;
  SampledBatch out;
  try {
    if (s.ready_error) {
      std::rethrow_exception(std::exchange(s.ready_error, nullptr));
    } else if (s.ready) {
      out = std::move(*s.ready);
      s.ready.reset();
    } else {
      out = s.pending.valid() ? s.pending.get() : s.run_step(step);
    }
  } catch (const CollectiveFailure& e) {
    s.broken = true;
    s.broken_reason = e.what();
    throw;
  } catch (const RehearsalError&) {
    s.next_step = step + 1;  // every rank failed this step alike; the next one runs afresh
    throw;
  } catch (const std::exception& e) {  // e.g. out of memory: this rank may be out of step
    s.broken = true;
    s.broken_reason = std::string("step ") + std::to_string(step) + ": " + e.what();
    throw RehearsalError("rehearsal sampler: " + s.broken_reason);
  }
  s.next_step = step + 1;
  return out;
}

void GlobalSampler::prefetch() {
  Impl& s = *self_;
  if (!s.cfg.prefetch || s.broken || s.pending.valid() || s.ready || s.ready_error) return;
  s.pending = s.worker.submit(std::packaged_task<SampledBatch()>([&s, n = s.next_step] { return s.run_step(n); }));
}

void GlobalSampler::settle() {
  if (self_->pending.valid()) self_->pending.wait();
}

std::optional<SampledBatch> GlobalSampler::prefetched() {
  Impl& s = *self_;
  if (s.pending.valid()) {
    try {
      s.ready = s.pending.get();
    } catch (...) {
      s.ready_error = std::current_exception();
    }
  }
  if (s.ready_error) return std::nullopt;
  return s.ready;
}

void GlobalSampler::seek(std::uint64_t step, std::optional<SampledBatch> batch) {
  if (self_->pending.valid())
    throw RehearsalError("GlobalSampler::seek: a prefetch is in flight; seek before the first next()");
  self_->next_step = step;
  // The step after the given batch draws from the sizes exchanged with it, as it would
  // have in the run that drew it; without them it gathers sizes afresh.
  self_->known = batch && batch->next_info.size() == static_cast<std::size_t>(self_->world * Impl::kInfo)
                     ? batch->next_info
                     : std::vector<std::int64_t>{};
  self_->ready = std::move(batch);
  self_->ready_error = nullptr;
}

std::uint64_t GlobalSampler::next_step() const noexcept { return self_->next_step; }

bool GlobalSampler::prefetch_pending() const noexcept { return self_->pending.valid() || self_->ready.has_value(); }

bool GlobalSampler::prefetch_ready() const {
  if (self_->ready || self_->ready_error) return true;
  return self_->pending.valid() && self_->pending.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

int GlobalSampler::rank() const noexcept { return self_->rank; }

int GlobalSampler::world_size() const noexcept { return self_->world; }

std::vector<std::vector<std::int64_t>> GlobalSampler::draw(std::uint64_t seed, std::uint64_t step,
                                                           const std::vector<std::int64_t>& rank_sizes,
                                                           std::int64_t representatives) {
  const auto world = static_cast<std::int64_t>(rank_sizes.size());
  std::vector<std::vector<std::int64_t>> chunks(rank_sizes.size());
  std::int64_t total = 0;
  for (auto n : rank_sizes) total += n;
  if (total <= 0 || representatives <= 0 || world == 0) return chunks;
  Rng rng(seed, step);
  if (total >= world * representatives) {
    // One draw without replacement, split: no sample goes to two ranks in one step.
    auto all = distinct(rng, total, world * representatives);
    for (std::int64_t k = 0; k < world; ++k)
      chunks[static_cast<std::size_t>(k)].assign(all.begin() + k * representatives, all.begin() + (k + 1) * representatives);
  } else {
    const std::int64_t m = std::min(representatives, total);
    for (auto& c : chunks) c = distinct(rng, total, m);
  }
  return chunks;
}

c10::intrusive_ptr<c10d::ProcessGroup> make_process_group(const std::string& backend,
                                                          const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                          int world, std::chrono::milliseconds timeout,
                                                          const std::string& host) {
  if (!store) throw RehearsalError("make_process_group: no store");
  if (world < 1 || rank < 0 || rank >= world)
    throw RehearsalError("make_process_group: rank " + std::to_string(rank) + " of world " + std::to_string(world));
  try {
    if (backend == "gloo") {
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      opts->devices.push_back(host.empty() ? c10d::ProcessGroupGloo::createDefaultDevice()
                                           : c10d::ProcessGroupGloo::createDeviceForHostname(host));
      return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, opts);
    }
    if (backend == "nccl") {
#ifdef DIASPORA_WITH_CUDA
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = timeout;
      return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, opts);
#else
      throw RehearsalError("make_process_group: backend nccl needs a build with DIASPORA_WITH_CUDA=ON");
#endif
    }
  } catch (const RehearsalError&) {
    throw;
  } catch (const std::exception& e) {
    throw RehearsalError("make_process_group(" + backend + ", rank " + std::to_string(rank) + " of " +
                         std::to_string(world) + "): " + e.what());
  }
  throw RehearsalError("make_process_group: unknown backend '" + backend + "' (gloo or nccl)");
}

}  // namespace diaspora::rehearsal
