// Diaspora's distributed rehearsal buffer (LibTorch): one class-balanced reservoir buffer
// per rank with a hard memory bound, asynchronous insertion through a bounded queue, and
// global sampling of R representatives per step, uniform over the union of all ranks'
// buffers, fetched with c10d collectives and prefetched one step ahead.
//
// Lifecycle of one rank (see docs/rehearsal.md):
//
//   RehearsalBuffer buffer(cfg.buffer);                 // per rank
//   AsyncInserter inserter(buffer, cfg.insertion);      // background insertion thread
//   GlobalSampler sampler(buffer, rehearsal_group, cfg.sampling);
//   for each step:
//     SampledBatch reps = sampler.next();               // step i; starts fetching i+1
//     ... train on minibatch + reps.batch ...
//     inserter.try_submit(candidates_of_minibatch);     // never blocks
//
// Errors: every function throws RehearsalError (a diaspora::Error) for bad arguments or a
// broken state; LibTorch's c10::Error from a failed collective (e.g. a timeout) is
// rethrown as RehearsalError carrying its message.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "diaspora/error.hpp"
#include "diaspora/rehearsal_config.hpp"

namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace diaspora::rehearsal {

/// Base of the errors this library throws (config files throw diaspora::SpecError).
class RehearsalError : public Error {
 public:
  using Error::Error;
};

/// The class every sample of an unlabelled buffer (class_balanced = false) belongs to.
inline constexpr std::int64_t kNoClass = -1;

/// dtype and per-sample shape of one tensor of a sample.
struct TensorSpec {
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<std::int64_t> sizes;  ///< shape of one sample (the batch's dim 0 removed)

  /// Bytes of one sample of this tensor.
  std::size_t nbytes() const;
  bool operator==(const TensorSpec&) const = default;
};

/// What one sample is made of. All samples of a buffer, and of all ranks' buffers that
/// sample together, share one layout.
struct SampleLayout {
  std::vector<TensorSpec> tensors;     ///< e.g. {image, label} or {diffraction, amplitude, phase}
  std::optional<TensorSpec> outputs;   ///< stored logits / outputs (DER, DER++), if any

  /// Bytes of one packed sample: all tensors then the outputs, back to back.
  std::size_t row_bytes() const;
  /// A hash of the layout, equal on ranks with equal layouts (compared across ranks).
  std::uint64_t fingerprint() const;
  /// e.g. "[Float(1,28,28), Long()] + outputs Float(10)".
  std::string to_string() const;
  bool operator==(const SampleLayout&) const = default;
};

/// A batch of samples: tensors[k] has shape [n, sizes of tensor k...], the optional
/// outputs [n, ...]. Tensors may live on any device and need not be contiguous.
struct Batch {
  std::vector<at::Tensor> tensors;
  at::Tensor outputs;  ///< undefined when the layout has no outputs

  /// n, the size of dim 0 (0 for an empty batch or one without tensors).
  std::int64_t size() const;
  /// The per-sample layout of this batch. @throws RehearsalError if the tensors disagree
  /// on n, a tensor is undefined or has no batch dimension.
  SampleLayout layout() const;
};

/// A batch of representatives drawn by GlobalSampler for one step.
struct SampledBatch {
  Batch batch;                             ///< on the CPU, in draw order
  std::uint64_t step = 0;                  ///< the step this batch was drawn for
  std::vector<std::int64_t> global_indices;  ///< index of each row in the union (rank offset + slot)
  std::vector<std::int64_t> rank_sizes;    ///< each rank's buffer size this step drew from
  /// What every rank reported in this step's exchange, for the next step's draw: per rank
  /// (buffer size, layout fingerprint, row bytes), 3 x world values. Empty when this step
  /// exchanged nothing (it failed, or the batch was built by hand).
  std::vector<std::int64_t> next_info;
};

/// A self-contained copy of a buffer's state, for checkpoints: restoring it into a buffer
/// with the same config reproduces every later insertion and draw exactly.
struct BufferSnapshot {
  std::optional<SampleLayout> layout;  ///< none: the buffer had no layout (nothing else is set)
  std::int64_t capacity = 0;           ///< slots of the buffer the snapshot was taken from
  std::uint64_t seen = 0;              ///< samples offered, all classes
  at::Tensor rows;                     ///< uint8 [size, row_bytes]: slot i is row i
  std::vector<std::int64_t> class_labels;          ///< classes in order of first appearance
  std::vector<std::uint64_t> class_seen;           ///< samples offered per class (same order)
  std::vector<std::vector<std::int64_t>> class_slots;  ///< each class's slots, in the buffer's internal order
  std::vector<std::uint64_t> rng_state;            ///< the buffer's generator (4 words)

  /// Occupied slots.
  std::int64_t size() const;
};

/// One rank's rehearsal buffer: a fixed number of slots, a hard memory bound, and an
/// insertion rule that keeps each class's stored samples an unbiased sample of what
/// that class has streamed.
///
/// Insertion rule (class_balanced; an unlabelled buffer is the same with one class):
/// the C slots are split evenly among the K classes seen so far: quota(c) = C / K, plus
/// one for the first C mod K classes in order of first appearance. Quotas never grow.
/// For each incoming sample x of class c (seen_c counts it):
///  1. a free slot exists (the buffer has never been full): store x;
///  2. else if count_c < quota(c): evict one sample, chosen uniformly at random, of the
///     class with the largest count - quota (ties: smallest class id), store x there;
///  3. else (reservoir): with probability count_c / seen_c replace one of c's samples,
///     chosen uniformly at random, with x; otherwise discard x.
/// Each class's stored set is therefore, at all times, a uniformly random subset of the
/// samples of that class seen so far (docs/rehearsal.md has the argument); its size
/// depends only on the sequence of labels, and it is min(seen_c, quota(c)) for every
/// class once the buffer is full and each class has claimed its quota.
///
/// Slots 0..size()-1 are occupied; size() never decreases (a slot freed by an eviction
/// is refilled by the same insertion), which global sampling relies on.
///
/// Memory: capacity() = min(max_samples, memory_bytes / (row_bytes + kSlotOverheadBytes))
/// slots, allocated once when the layout is fixed (virtual memory: pages are touched as
/// slots fill); bytes_reserved() <= memory_bytes always. Per-class bookkeeping (one small
/// record per class) is outside the bound.
///
/// @par Thread Safety
/// All member functions are thread-safe (one internal mutex; insertions and reads are
/// serialised). The buffer must outlive the AsyncInserter and GlobalSampler using it.
class RehearsalBuffer {
 public:
  /// Bookkeeping bytes per slot counted against memory_bytes.
  static constexpr std::size_t kSlotOverheadBytes = 16;

  /// @param layout fixes the sample layout now; otherwise the first batch given to
  ///        insert() or validate() fixes it.
  /// @throws RehearsalError if label_tensor is out of range for `layout`, the label
  ///         tensor is not an integer scalar per sample, or not even one sample fits in
  ///         memory_bytes.
  explicit RehearsalBuffer(BufferConfig config, std::optional<SampleLayout> layout = std::nullopt);
  ~RehearsalBuffer();
  RehearsalBuffer(const RehearsalBuffer&) = delete;
  RehearsalBuffer& operator=(const RehearsalBuffer&) = delete;

  /// Checks that `batch` matches the layout (fixing the layout from it if none is fixed
  /// yet, which allocates the slots). Cheap: compares dtypes and shapes only.
  /// @throws RehearsalError on a mismatch, a bad label tensor, or a sample too big for
  ///         the memory bound.
  void validate(const Batch& batch);

  /// Offers every sample of `batch` to the buffer, in order, with the insertion rule
  /// above; copies what it stores (tensors on other devices are copied to the CPU).
  /// Blocks other buffer operations for the duration. Returns how many samples were
  /// stored (into a free slot or replacing another). A batch without tensors stores 0.
  /// @throws RehearsalError as validate(); nothing is stored then.
  std::int64_t insert(const Batch& batch);

  /// Occupied slots (0..size()-1).
  std::int64_t size() const;
  /// Total slots C; 0 until the layout is fixed.
  std::int64_t capacity() const;
  /// Samples offered so far (all classes).
  std::uint64_t seen() const;
  /// The layout, once fixed.
  std::optional<SampleLayout> layout() const;
  /// SampleLayout::fingerprint() of the layout, 0 while none is fixed.
  std::uint64_t layout_fingerprint() const;
  /// Bytes this buffer holds for samples and slot bookkeeping: capacity() *
  /// (row_bytes + kSlotOverheadBytes). Never above config().memory_bytes.
  std::uint64_t bytes_reserved() const;
  const BufferConfig& config() const noexcept;

  /// Stored samples per class (kNoClass for an unlabelled buffer).
  std::map<std::int64_t, std::int64_t> class_counts() const;
  /// Samples offered per class.
  std::map<std::int64_t, std::uint64_t> class_seen() const;
  /// Current quota per class (C / K, remainder to the earliest classes).
  std::map<std::int64_t, std::int64_t> class_quotas() const;
  /// Class of each occupied slot, slot order.
  std::vector<std::int64_t> slot_classes() const;

  /// Copies the samples in `slots` (each in 0..size()-1, repeats allowed) into a new
  /// CPU batch in that order. @throws RehearsalError for a slot out of range or no layout.
  Batch gather(const std::vector<std::int64_t>& slots) const;
  /// The same samples packed as rows of a uint8 tensor [n, row_bytes] (the wire format
  /// of global sampling). @throws as gather().
  at::Tensor pack(const std::vector<std::int64_t>& slots) const;
  /// A copy of the whole state (layout, slots, class bookkeeping, generator). Consistent:
  /// taken under the buffer's lock (pause the AsyncInserter first to also capture what
  /// its queue holds: queued batches are not part of the buffer).
  BufferSnapshot snapshot() const;
  /// Replaces the state by `snap` (exactly, generator included, when it has one).
  /// The buffer may have no layout yet (the snapshot's fixes it) or the same layout.
  /// @throws RehearsalError, leaving the buffer's samples unchanged, if the layout
  ///         differs, the snapshot holds more samples than capacity(), or it is
  ///         inconsistent (a slot out of range or in two classes, sizes that disagree, a
  ///         label tensor that does not match its class). A buffer that had no layout
  ///         keeps the snapshot's even then (as validate() would fix it).
  void restore(const BufferSnapshot& snap);

  /// Inverse of pack(): rows [n, row_bytes] (uint8, CPU) into a batch of `layout`.
  /// @throws RehearsalError when the row width does not match.
  static Batch unpack(const SampleLayout& layout, const at::Tensor& rows);

 private:
  struct Impl;
  std::unique_ptr<Impl> self_;
};

/// Re-partitions the snapshots of the W ranks of a checkpointed job for rank `rank` of
/// a job of `world` ranks whose buffers have `capacity` slots each: every stored sample
/// goes to exactly one new rank (class by class, the k-th stored sample of a class, in
/// old-rank order, to new rank k mod world), keeping per new rank at most its quota of
/// each class under the buffer's rule (the rest are dropped, uniformly at random, seeded
/// by `seed`); each class's `seen` is split in proportion to the samples it hands out, so
/// later reservoir decisions keep their probabilities. The result has no generator state
/// (the buffer keeps its own seed). It always redistributes, also for world == W: a rank
/// cannot tell alone whether every other rank kept its capacity, so the decision to
/// restore each rank's own snapshot instead belongs to the caller, taken by all ranks
/// together (diaspora-train does so).
/// @throws RehearsalError if the snapshots' layouts differ, rank is out of range or
///         capacity < 1.
BufferSnapshot repartition(const std::vector<BufferSnapshot>& old_ranks, int rank, int world, std::int64_t capacity,
                           std::uint64_t seed);

/// Counters of an AsyncInserter. Once flush() has drained the queue,
/// samples_submitted = samples_offered + samples_dropped (+ the samples of batches
/// counted in insert_errors).
struct InserterStats {
  std::uint64_t batches_submitted = 0;  ///< try_submit() calls with a non-empty batch
  std::uint64_t batches_dropped = 0;    ///< of those, dropped because the queue was full
  std::uint64_t samples_submitted = 0;
  std::uint64_t samples_dropped = 0;
  std::uint64_t samples_offered = 0;    ///< offered to the buffer by the worker so far
  std::uint64_t samples_stored = 0;     ///< of those, stored by the buffer
  std::uint64_t insert_errors = 0;      ///< batches the buffer refused in the worker
  std::size_t queue_depth = 0;          ///< batches waiting now
};

/// Inserts candidates into a RehearsalBuffer on a background thread, so the training
/// step never waits on insertion. Candidates go through a queue of at most
/// `queue_batches` batches; when it is full the NEW batch is dropped and counted
/// (drop-newest), the caller never blocks. Drops do not depend on the samples' content,
/// so the buffer stays an unbiased sample of the candidates actually offered to it.
///
/// The queue holds references to the submitted tensors (detached from autograd, so
/// queued outputs do not keep the step's graph alive), not copies: do not modify them in
/// place after submitting (pass clones if the training loop reuses its buffers).
///
/// @par Thread Safety
/// try_submit(), stats() and flush() may be called from any thread; pause()/resume()
/// from one controlling thread. The worker holds the queue lock only to pop a batch.
class AsyncInserter {
 public:
  /// Starts the worker thread. @throws RehearsalError if queue_batches is 0.
  AsyncInserter(RehearsalBuffer& buffer, InsertionConfig config = {});
  /// Stops the worker after the batch it is inserting; queued batches are discarded
  /// (call flush() first to insert them).
  ~AsyncInserter();
  AsyncInserter(const AsyncInserter&) = delete;
  AsyncInserter& operator=(const AsyncInserter&) = delete;

  /// Queues `batch` for insertion; returns false (and counts the drop) when the queue is
  /// full. Never waits for the worker. A batch without tensors, or with zero samples
  /// (after its layout is checked), returns true and does nothing.
  /// @throws RehearsalError when `batch` does not match the buffer's layout (checked
  ///         here, in the caller's thread, so a bad batch is reported to its producer).
  bool try_submit(Batch batch);

  /// Waits until the queue is empty and the worker idle, or `timeout` passes (while
  /// paused, waits only for the batch in progress). Returns whether it drained.
  bool flush(std::chrono::milliseconds timeout = std::chrono::minutes(1));
  /// Stops taking batches from the queue after the current one (for a consistent buffer
  /// snapshot, e.g. a checkpoint); try_submit() keeps queueing, then dropping.
  void pause();
  /// Undoes pause().
  void resume();

  InserterStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> self_;
};

/// Draws, every step, R representatives for each rank uniformly over the union of all
/// ranks' buffers, and moves them to the ranks that train on them.
///
/// Protocol of step s (every rank runs it, same order; docs/rehearsal.md):
///  1. the (size, layout fingerprint, row bytes) of each rank's buffer as exchanged in
///     step s-1's alltoall (step 3), or, for the first step and after a failed step or a
///     seek() without a batch, gathered now with an allgather: sizes n_0..n_{W-1}, N =
///     sum. Slots 0..n_r-1 of rank r stay valid afterwards because a buffer never
///     shrinks. N = 0, or a rank without a layout: no draw this step.
///  2. every rank runs the same generator, seeded from (seed, s): if N >= W*R it draws
///     W*R distinct indices of [0, N) in random order, else W independent draws of
///     min(R, N) distinct indices; chunk k goes to rank k. Each chunk is thus a uniform
///     sample without replacement from the union; identical inputs give identical draws
///     on all ranks, so nothing is broadcast.
///  3. index g belongs to rank r with offset_r <= g < offset_r + n_r, slot g - offset_r;
///     each rank packs the samples it owns for each destination and one alltoall_base
///     delivers exactly the rows each rank needs (W*R rows in all), each chunk headed by
///     the sender's current (size, fingerprint, row bytes) for step s+1: one collective
///     a step in the steady state.
/// A slot's content is read when its owner packs it, so an insertion since the sizes
/// were taken can replace it by a newer sample of the same buffer; samples inserted
/// since then are drawable from the next step on.
///
/// Every rank must call next() the same number of times. The sampler issues collectives
/// from a background thread while the training step may issue its own: give it a
/// process group of its own (not the one the gradients are all-reduced on), otherwise
/// the two streams of collectives can interleave differently on different ranks.
///
/// @par Thread Safety
/// Not thread-safe: one thread calls next(). The buffer may be written concurrently.
class GlobalSampler {
 public:
  /// @param group a c10d process group used only by this sampler (Gloo on CPU; NCCL with
  ///        comm_device "cuda" in a CUDA build).
  /// @throws RehearsalError if representatives < 1, group is null, or comm_device is
  ///         not a device name.
  GlobalSampler(RehearsalBuffer& buffer, c10::intrusive_ptr<c10d::ProcessGroup> group, SamplerConfig config);
  /// Waits for an in-flight prefetch (bounded by the group's timeout).
  ~GlobalSampler();
  GlobalSampler(const GlobalSampler&) = delete;
  GlobalSampler& operator=(const GlobalSampler&) = delete;

  /// Returns the representatives of the next step (step 0 on the first call): the
  /// prefetched batch when one is in flight (waiting for it if needed), otherwise it
  /// runs the step now; then, with prefetch on, starts step+1 in the background.
  /// A collective: every rank must call it. The batch is empty (zero rows) while all
  /// buffers are empty or while some rank's buffer has no layout yet (it has seen no
  /// batch and was built without one: give buffers their layout up front to avoid it).
  /// @throws RehearsalError when ranks' layouts differ (all ranks throw alike for that
  ///         step and the sampler stays usable) or a collective fails, e.g. a peer died
  ///         or timed out (the sampler is then broken and every later call throws).
  SampledBatch next();

  /// next() in two halves: take() returns the next step's representatives (waiting for a
  /// prefetch in flight, or drawing now) without starting another; prefetch() starts the
  /// following step's draw in the background (no-op without `prefetch`, or when one is in
  /// flight or ready). A trainer may do work between them, e.g. let an insertion finish
  /// so that the draw it then starts sees it (docs/rehearsal.md, "Deterministic mode").
  /// Both are collectives in the sense of next(): every rank calls them in the same order.
  /// Errors as next(): take() throws what next() would; prefetch() throws nothing (a
  /// failure is reported by the take() that collects it).
  SampledBatch take();
  void prefetch();

  /// Waits until the prefetch in flight, if any, has finished reading the buffers (its
  /// result stays for the next next()). After it returns, writes to the buffer cannot
  /// change what the next next() returns: a trainer that wants bit-reproducible runs
  /// calls settle() before inserting (docs/rehearsal.md, "Deterministic mode"). Not a
  /// collective. @throws nothing; a failed prefetch is reported by next().
  void settle();

  /// The batch the next next() will return, when a prefetch has been started (waits for
  /// it like settle()); nullopt when none is in flight or it failed (next() then throws).
  /// A checkpoint stores it so that a resumed job gets the very same representatives.
  std::optional<SampledBatch> prefetched();

  /// Makes the next call to next() return step `step`: `batch` when given (a checkpoint's
  /// prefetched()), else drawn afresh. A resumed job continues the draw sequence where it
  /// stopped. @throws RehearsalError while a prefetch is in flight.
  void seek(std::uint64_t step, std::optional<SampledBatch> batch = std::nullopt);

  /// The step the next call to next() returns.
  std::uint64_t next_step() const noexcept;
  /// Whether a prefetched batch is in flight or ready.
  bool prefetch_pending() const noexcept;
  /// Whether the prefetched batch is ready (next() would not wait).
  bool prefetch_ready() const;
  int rank() const noexcept;
  int world_size() const noexcept;

  /// The draw of step 2 above for world size `world`, sizes `rank_sizes`: the global
  /// indices each rank receives. Pure; exposed for tests and tools.
  static std::vector<std::vector<std::int64_t>> draw(std::uint64_t seed, std::uint64_t step,
                                                     const std::vector<std::int64_t>& rank_sizes,
                                                     std::int64_t representatives);

 private:
  struct Impl;
  std::unique_ptr<Impl> self_;
};

/// Creates a process group on `store` for rank `rank` of `world`: backend "gloo" (its
/// device bound to `host`, e.g. "127.0.0.1"; empty: Gloo's default, the address this
/// machine's host name resolves to, else loopback) or "nccl" (only in a build with
/// DIASPORA_WITH_CUDA; `host` unused). A collective constructor: all ranks must call it.
/// Use a c10d::PrefixStore to make several groups on one store.
/// @throws RehearsalError for an unknown or unavailable backend, or when the rendezvous
///         fails or times out.
c10::intrusive_ptr<c10d::ProcessGroup> make_process_group(const std::string& backend,
                                                          const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                          int world, std::chrono::milliseconds timeout,
                                                          const std::string& host = "");

}  // namespace diaspora::rehearsal
