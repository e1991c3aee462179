// RehearsalBuffer (per-class reservoir sampling under a memory bound) and AsyncInserter
// (bounded drop-newest queue + one worker thread).
#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "diaspora/rehearsal.hpp"
#include "diaspora/thread_name.hpp"
#include "random.hpp"

namespace diaspora::rehearsal {

// ---- layout -----------------------------------------------------------------------------

std::size_t TensorSpec::nbytes() const {
  std::size_t n = c10::elementSize(dtype);
  for (auto s : sizes) n *= static_cast<std::size_t>(s);
  return n;
}

std::size_t SampleLayout::row_bytes() const {
  std::size_t n = 0;
  for (const auto& t : tensors) n += t.nbytes();
  if (outputs) n += outputs->nbytes();
  return n;
}

std::uint64_t SampleLayout::fingerprint() const {
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the layout's numbers
  auto mix = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  auto spec = [&mix](const TensorSpec& t) {
    mix(static_cast<std::uint64_t>(t.dtype));
    mix(t.sizes.size());
    for (auto s : t.sizes) mix(static_cast<std::uint64_t>(s));
  };
  mix(tensors.size());
  for (const auto& t : tensors) spec(t);
  mix(outputs ? 1 : 0);
  if (outputs) spec(*outputs);
  return h == 0 ? 1 : h;  // 0 means "no layout" on the wire
}

std::string SampleLayout::to_string() const {
  auto spec = [](std::ostringstream& os, const TensorSpec& t) {
    os << c10::toString(t.dtype) << '(';
    for (std::size_t i = 0; i < t.sizes.size(); ++i) os << (i ? "," : "") << t.sizes[i];
    os << ')';
  };
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (i) os << ", ";
    spec(os, tensors[i]);
  }
  os << ']';
  if (outputs) {
    os << " + outputs ";
    spec(os, *outputs);
  }
  return os.str();
}

std::int64_t Batch::size() const {
  if (tensors.empty() || !tensors[0].defined() || tensors[0].dim() == 0) return 0;
  return tensors[0].size(0);
}

SampleLayout Batch::layout() const {
  if (tensors.empty()) throw RehearsalError("batch has no tensors");
  const std::int64_t n = size();
  auto spec = [n](const at::Tensor& t, const std::string& what) {
    if (!t.defined()) throw RehearsalError(what + " is undefined");
    if (t.dim() == 0) throw RehearsalError(what + " has no batch dimension (a 0-d tensor)");
    if (t.size(0) != n)
      throw RehearsalError(what + " has " + std::to_string(t.size(0)) + " samples, tensor 0 has " + std::to_string(n));
    TensorSpec s;
    s.dtype = t.scalar_type();
    s.sizes.assign(t.sizes().begin() + 1, t.sizes().end());
    return s;
  };
  SampleLayout l;
  for (std::size_t k = 0; k < tensors.size(); ++k) l.tensors.push_back(spec(tensors[k], "tensor " + std::to_string(k)));
  if (outputs.defined()) l.outputs = spec(outputs, "outputs");
  return l;
}

// ---- the buffer --------------------------------------------------------------------------

namespace {

struct ClassState {
  std::int64_t label = 0;
  std::uint64_t seen = 0;
  std::vector<std::uint32_t> slots;  // the slots this class holds, any order
};

}  // namespace

struct RehearsalBuffer::Impl {
  BufferConfig cfg;

  // The layout and the storage are set once, under layout_mu, then published through
  // has_layout (release); after that they are immutable, so validate() reads them
  // without a lock and never waits for an insertion in progress.
  std::mutex layout_mu;
  std::atomic<bool> has_layout{false};
  SampleLayout layout;
  std::uint64_t fingerprint = 0;
  std::size_t row = 0;
  std::vector<std::size_t> offsets;  // byte offset of each tensor in a row; outputs last
  std::int64_t capacity = 0;
  at::Tensor storage;                // uint8 [capacity, row]
  std::uint8_t* base = nullptr;

  // Everything below is guarded by mu.
  mutable std::mutex mu;
  std::int64_t used = 0;
  std::uint64_t seen = 0;
  std::vector<std::uint32_t> slot_class;  // dense class index of each occupied slot
  std::vector<std::uint32_t> slot_pos;    // position of the slot in its class's `slots`
  std::vector<ClassState> classes;        // dense, in order of first appearance
  std::unordered_map<std::int64_t, std::uint32_t> class_index;
  Rng rng;

  explicit Impl(BufferConfig c) : cfg(c), rng(c.seed) {}

  bool ready() const { return has_layout.load(std::memory_order_acquire); }

  void fix_layout(const SampleLayout& l) {  // caller holds layout_mu, !ready()
    if (l.tensors.empty()) throw RehearsalError("a sample needs at least one tensor");
    if (cfg.class_balanced) {
      if (cfg.label_tensor < 0 || static_cast<std::size_t>(cfg.label_tensor) >= l.tensors.size())
        throw RehearsalError("label_tensor " + std::to_string(cfg.label_tensor) + " is out of range: a sample has " +
                             std::to_string(l.tensors.size()) + " tensors");
      const TensorSpec& lt = l.tensors[static_cast<std::size_t>(cfg.label_tensor)];
      const bool scalar = lt.sizes.empty() || (lt.sizes.size() == 1 && lt.sizes[0] == 1);
      if (!c10::isIntegralType(lt.dtype, /*includeBool=*/false) || !scalar)
        throw RehearsalError("the label tensor (tensor " + std::to_string(cfg.label_tensor) +
                             ") must hold one integer per sample, not " + l.to_string());
    }
    const std::size_t r = l.row_bytes();
    if (r == 0) throw RehearsalError("a sample of layout " + l.to_string() + " has no bytes");
    std::uint64_t cap = cfg.memory_bytes / (r + kSlotOverheadBytes);
    if (cfg.max_samples > 0) cap = std::min<std::uint64_t>(cap, cfg.max_samples);
    cap = std::min<std::uint64_t>(cap, std::numeric_limits<std::uint32_t>::max());
    if (cap == 0)
      throw RehearsalError("a sample of layout " + l.to_string() + " needs " + std::to_string(r + kSlotOverheadBytes) +
                           " bytes with its bookkeeping; the buffer's memory bound is " +
                           std::to_string(cfg.memory_bytes) + " bytes");
    layout = l;
    fingerprint = l.fingerprint();
    row = r;
    offsets.clear();
    std::size_t off = 0;
    for (const auto& t : l.tensors) {
      offsets.push_back(off);
      off += t.nbytes();
    }
    offsets.push_back(off);  // outputs
    capacity = static_cast<std::int64_t>(cap);
    // at::empty does not touch the pages: resident memory grows as slots fill.
    storage = at::empty({capacity, static_cast<std::int64_t>(row)}, at::TensorOptions().dtype(at::kByte));
    base = storage.data_ptr<std::uint8_t>();
    {
      std::lock_guard<std::mutex> g(mu);
      slot_class.reserve(static_cast<std::size_t>(capacity));
      slot_pos.reserve(static_cast<std::size_t>(capacity));
    }
    has_layout.store(true, std::memory_order_release);
  }

  // ---- quotas and class bookkeeping (caller holds mu) ----
  std::int64_t quota(std::size_t ci) const {
    const auto k = static_cast<std::int64_t>(classes.size());
    return capacity / k + (static_cast<std::int64_t>(ci) < capacity % k ? 1 : 0);
  }
  std::int64_t count(std::size_t ci) const { return static_cast<std::int64_t>(classes[ci].slots.size()); }

  std::uint32_t class_of(std::int64_t label) {
    auto [it, fresh] = class_index.try_emplace(label, static_cast<std::uint32_t>(classes.size()));
    if (fresh) {
      classes.emplace_back();
      classes.back().label = label;
    }
    return it->second;
  }

  void give(std::uint32_t slot, std::uint32_t ci) {
    auto& v = classes[ci].slots;
    slot_class[slot] = ci;
    slot_pos[slot] = static_cast<std::uint32_t>(v.size());
    v.push_back(slot);
  }

  // Removes a uniformly random slot from class ci and returns it.
  std::uint32_t take_random(std::uint32_t ci) {
    auto& v = classes[ci].slots;
    const auto j = static_cast<std::size_t>(rng.below(v.size()));
    const std::uint32_t slot = v[j];
    v[j] = v.back();
    slot_pos[v[j]] = static_cast<std::uint32_t>(j);
    v.pop_back();
    // Keep capacity <= 2 * size + 8 so the bookkeeping stays within kSlotOverheadBytes.
    if (v.capacity() > 2 * v.size() + 8) v.shrink_to_fit();
    return slot;
  }

  // One sample of class `label`: returns the slot to write it to, or -1 to discard it.
  std::int64_t place(std::int64_t label) {
    const std::uint32_t ci = class_of(label);
    ClassState& cs = classes[ci];
    ++cs.seen;
    ++seen;
    if (used < capacity) {  // 1. never been full: store
      const auto slot = static_cast<std::uint32_t>(used++);
      slot_class.push_back(0);
      slot_pos.push_back(0);
      give(slot, ci);
      return slot;
    }
    if (count(ci) < quota(ci)) {  // 2. below quota: take a slot from the largest excess
      std::size_t victim = classes.size();
      std::int64_t excess = 0;
      for (std::size_t k = 0; k < classes.size(); ++k) {
        const std::int64_t e = count(k) - quota(k);
        if (e > excess || (e == excess && e > 0 && classes[k].label < classes[victim].label)) {
          excess = e;
          victim = k;
        }
      }
      // sum(count) == capacity == sum(quota) and count(ci) < quota(ci): some class is over.
      if (victim == classes.size()) throw RehearsalError("internal error: no class above its quota");
      const std::uint32_t slot = take_random(static_cast<std::uint32_t>(victim));
      give(slot, ci);
      return slot;
    }
    // 3. reservoir (Algorithm R): keep with probability m / seen, replacing a uniformly
    //    random stored sample of the class (u < m is that event; u is then uniform in [0, m)).
    const auto m = static_cast<std::uint64_t>(count(ci));
    if (m == 0) return -1;  // more classes than slots: this class has no quota
    const std::uint64_t u = rng.below(cs.seen);
    if (u < m) return cs.slots[static_cast<std::size_t>(u)];
    return -1;
  }

  void check_slots(const std::vector<std::int64_t>& slots) const {  // caller holds mu
    for (auto s : slots)
      if (s < 0 || s >= used)
        throw RehearsalError("slot " + std::to_string(s) + " is out of range: the buffer holds " +
                             std::to_string(used) + " samples");
  }
};

RehearsalBuffer::RehearsalBuffer(BufferConfig config, std::optional<SampleLayout> layout)
    : self_(std::make_unique<Impl>(config)) {
  if (layout) {
    std::lock_guard<std::mutex> g(self_->layout_mu);
    self_->fix_layout(*layout);
  }
}

RehearsalBuffer::~RehearsalBuffer() = default;

void RehearsalBuffer::validate(const Batch& batch) {
  SampleLayout l = batch.layout();
  if (!self_->ready()) {
    std::lock_guard<std::mutex> g(self_->layout_mu);
    if (!self_->ready()) {
      self_->fix_layout(l);
      return;
    }
  }
  if (!(l == self_->layout))
    throw RehearsalError("batch layout " + l.to_string() + " does not match the buffer's " +
                         self_->layout.to_string());
}

std::int64_t RehearsalBuffer::insert(const Batch& batch) {
  if (batch.tensors.empty()) return 0;
  validate(batch);
  if (batch.size() == 0) return 0;
  Impl& s = *self_;
  const std::int64_t n = batch.size();
  // Contiguous CPU copies of the inputs (a no-op for contiguous CPU tensors).
  std::vector<at::Tensor> src;
  src.reserve(batch.tensors.size() + 1);
  for (const auto& t : batch.tensors) src.push_back(t.detach().to(at::kCPU).contiguous());
  if (batch.outputs.defined()) src.push_back(batch.outputs.detach().to(at::kCPU).contiguous());
  at::Tensor labels;
  const std::int64_t* label_ptr = nullptr;
  if (s.cfg.class_balanced) {
    labels = src[static_cast<std::size_t>(s.cfg.label_tensor)].reshape({n}).to(at::kLong).contiguous();
    label_ptr = labels.data_ptr<std::int64_t>();
  }
  std::vector<std::size_t> nbytes;
  std::vector<const std::uint8_t*> ptrs;
  for (std::size_t k = 0; k < src.size(); ++k) {
    nbytes.push_back(k < s.layout.tensors.size() ? s.layout.tensors[k].nbytes() : s.layout.outputs->nbytes());
    ptrs.push_back(static_cast<const std::uint8_t*>(src[k].data_ptr()));
  }

  std::int64_t stored = 0;
  std::lock_guard<std::mutex> g(s.mu);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t slot = s.place(label_ptr ? label_ptr[i] : kNoClass);
    if (slot < 0) continue;
    std::uint8_t* dst = s.base + static_cast<std::size_t>(slot) * s.row;
    for (std::size_t k = 0; k < src.size(); ++k)
      std::memcpy(dst + s.offsets[k], ptrs[k] + static_cast<std::size_t>(i) * nbytes[k], nbytes[k]);
    ++stored;
  }
  return stored;
}

std::int64_t RehearsalBuffer::size() const {
  std::lock_guard<std::mutex> g(self_->mu);
  return self_->used;
}

std::int64_t RehearsalBuffer::capacity() const { return self_->ready() ? self_->capacity : 0; }

std::uint64_t RehearsalBuffer::seen() const {
  std::lock_guard<std::mutex> g(self_->mu);
  return self_->seen;
}

std::optional<SampleLayout> RehearsalBuffer::layout() const {
  if (!self_->ready()) return std::nullopt;
  return self_->layout;
}

std::uint64_t RehearsalBuffer::layout_fingerprint() const { return self_->ready() ? self_->fingerprint : 0; }

std::uint64_t RehearsalBuffer::bytes_reserved() const {
  if (!self_->ready()) return 0;
  return static_cast<std::uint64_t>(self_->capacity) * (self_->row + kSlotOverheadBytes);
}

const BufferConfig& RehearsalBuffer::config() const noexcept { return self_->cfg; }

std::map<std::int64_t, std::int64_t> RehearsalBuffer::class_counts() const {
  std::lock_guard<std::mutex> g(self_->mu);
  std::map<std::int64_t, std::int64_t> out;
  for (std::size_t k = 0; k < self_->classes.size(); ++k) out[self_->classes[k].label] = self_->count(k);
  return out;
}

std::map<std::int64_t, std::uint64_t> RehearsalBuffer::class_seen() const {
  std::lock_guard<std::mutex> g(self_->mu);
  std::map<std::int64_t, std::uint64_t> out;
  for (const auto& c : self_->classes) out[c.label] = c.seen;
  return out;
}

std::map<std::int64_t, std::int64_t> RehearsalBuffer::class_quotas() const {
  std::lock_guard<std::mutex> g(self_->mu);
  std::map<std::int64_t, std::int64_t> out;
  for (std::size_t k = 0; k < self_->classes.size(); ++k) out[self_->classes[k].label] = self_->quota(k);
  return out;
}

std::vector<std::int64_t> RehearsalBuffer::slot_classes() const {
  std::lock_guard<std::mutex> g(self_->mu);
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(self_->used));
  for (std::int64_t i = 0; i < self_->used; ++i)
    out.push_back(self_->classes[self_->slot_class[static_cast<std::size_t>(i)]].label);
  return out;
}

at::Tensor RehearsalBuffer::pack(const std::vector<std::int64_t>& slots) const {
  const Impl& s = *self_;
  if (!s.ready()) {
    if (slots.empty()) return at::empty({0, 0}, at::TensorOptions().dtype(at::kByte));
    throw RehearsalError("the buffer has no layout yet");
  }
  at::Tensor rows =
      at::empty({static_cast<std::int64_t>(slots.size()), static_cast<std::int64_t>(s.row)}, at::TensorOptions().dtype(at::kByte));
  std::uint8_t* out = rows.data_ptr<std::uint8_t>();
  std::lock_guard<std::mutex> g(s.mu);
  s.check_slots(slots);
  for (std::size_t i = 0; i < slots.size(); ++i)
    std::memcpy(out + i * s.row, s.base + static_cast<std::size_t>(slots[i]) * s.row, s.row);
  return rows;
}

Batch RehearsalBuffer::gather(const std::vector<std::int64_t>& slots) const {
  if (!self_->ready()) throw RehearsalError("the buffer has no layout yet");
  return unpack(self_->layout, pack(slots));
}

Batch RehearsalBuffer::unpack(const SampleLayout& layout, const at::Tensor& rows_in) {
  const std::size_t row = layout.row_bytes();
  if (!rows_in.defined() || rows_in.dim() != 2 || rows_in.scalar_type() != at::kByte ||
      static_cast<std::size_t>(rows_in.size(1)) != row)
    throw RehearsalError("unpack: expected uint8 rows of " + std::to_string(row) + " bytes for layout " +
                         layout.to_string());
  at::Tensor rows = rows_in.to(at::kCPU).contiguous();
  const std::int64_t n = rows.size(0);
  const std::uint8_t* in = rows.data_ptr<std::uint8_t>();
  Batch b;
  std::size_t off = 0;
  auto one = [&](const TensorSpec& t) {
    std::vector<std::int64_t> shape{n};
    shape.insert(shape.end(), t.sizes.begin(), t.sizes.end());
    at::Tensor out = at::empty(shape, at::TensorOptions().dtype(t.dtype));
    const std::size_t nb = t.nbytes();
    auto* dst = static_cast<std::uint8_t*>(out.data_ptr());
    for (std::int64_t i = 0; i < n; ++i)
      std::memcpy(dst + static_cast<std::size_t>(i) * nb, in + static_cast<std::size_t>(i) * row + off, nb);
    off += nb;
    return out;
  };
  for (const auto& t : layout.tensors) b.tensors.push_back(one(t));
  if (layout.outputs) b.outputs = one(*layout.outputs);
  return b;
}

// ---- snapshots -------------------------------------------------------------------------------

std::int64_t BufferSnapshot::size() const { return rows.defined() && rows.dim() == 2 ? rows.size(0) : 0; }

BufferSnapshot RehearsalBuffer::snapshot() const {
  const Impl& s = *self_;
  BufferSnapshot snap;
  if (!s.ready()) return snap;
  snap.layout = s.layout;
  snap.capacity = s.capacity;
  std::lock_guard<std::mutex> g(s.mu);
  snap.seen = s.seen;
  snap.rows = s.storage.narrow(0, 0, s.used).clone();
  for (const auto& c : s.classes) {
    snap.class_labels.push_back(c.label);
    snap.class_seen.push_back(c.seen);
    snap.class_slots.emplace_back(c.slots.begin(), c.slots.end());
  }
  snap.rng_state = s.rng.state();
  return snap;
}

void RehearsalBuffer::restore(const BufferSnapshot& snap) {
  Impl& s = *self_;
  if (snap.layout) {
    std::lock_guard<std::mutex> g(s.layout_mu);
    if (!s.ready()) s.fix_layout(*snap.layout);
    else if (!(s.layout == *snap.layout))
      throw RehearsalError("snapshot layout " + snap.layout->to_string() + " does not match the buffer's " +
                           s.layout.to_string());
  }
  const std::int64_t n = snap.size();
  const std::size_t k = snap.class_labels.size();
  auto bad = [](const std::string& what) { throw RehearsalError("inconsistent buffer snapshot: " + what); };
  if (!snap.layout && (n > 0 || k > 0)) bad("samples without a layout");
  if (snap.layout) {
    if (!snap.rows.defined() || snap.rows.dim() != 2 || snap.rows.scalar_type() != at::kByte ||
        static_cast<std::size_t>(snap.rows.size(1)) != s.row)
      bad("rows must be uint8 [n, " + std::to_string(s.row) + "]");
    if (n > s.capacity)
      throw RehearsalError("buffer snapshot holds " + std::to_string(n) + " samples; this buffer has " +
                           std::to_string(s.capacity) + " slots (raise buffer.memory, or repartition())");
  }
  if (snap.class_seen.size() != k || snap.class_slots.size() != k) bad("class lists of different lengths");
  if (!s.cfg.class_balanced && k > 1) bad("an unlabelled buffer has one class");
  if (!snap.rng_state.empty() &&
      (snap.rng_state.size() != 4 || (snap.rng_state[0] | snap.rng_state[1] | snap.rng_state[2] | snap.rng_state[3]) == 0))
    bad("generator state must be 4 words, not all zero");

  std::vector<std::uint32_t> slot_class(static_cast<std::size_t>(n), std::numeric_limits<std::uint32_t>::max()), slot_pos(static_cast<std::size_t>(n));
  std::vector<ClassState> classes(k);
  std::unordered_map<std::int64_t, std::uint32_t> index;
  at::Tensor rows = n > 0 ? snap.rows.to(at::kCPU).contiguous() : at::Tensor();
  const std::uint8_t* rp = n > 0 ? rows.data_ptr<std::uint8_t>() : nullptr;
  // Each slot's stored label, decoded like a gathered batch's (checked against its class).
  at::Tensor labels;
  if (s.cfg.class_balanced && n > 0)
    labels = unpack(s.layout, rows).tensors[static_cast<std::size_t>(s.cfg.label_tensor)].reshape({n}).to(at::kLong).contiguous();
  const std::int64_t* stored_label = labels.defined() ? labels.data_ptr<std::int64_t>() : nullptr;
  std::uint64_t seen_sum = 0;
  for (std::size_t c = 0; c < k; ++c) {
    const std::int64_t label = snap.class_labels[c];
    if (!index.emplace(label, static_cast<std::uint32_t>(c)).second) bad("class " + std::to_string(label) + " twice");
    classes[c].label = label;
    classes[c].seen = snap.class_seen[c];
    if (snap.class_seen[c] < snap.class_slots[c].size())
      bad("class " + std::to_string(label) + " stores more samples than it has seen");
    seen_sum += snap.class_seen[c];
    for (auto slot : snap.class_slots[c]) {
      if (slot < 0 || slot >= n) bad("slot " + std::to_string(slot) + " out of range");
      auto& owner = slot_class[static_cast<std::size_t>(slot)];
      if (owner != std::numeric_limits<std::uint32_t>::max()) bad("slot " + std::to_string(slot) + " in two classes");
      owner = static_cast<std::uint32_t>(c);
      slot_pos[static_cast<std::size_t>(slot)] = static_cast<std::uint32_t>(classes[c].slots.size());
      classes[c].slots.push_back(static_cast<std::uint32_t>(slot));
      if (stored_label) {
        const std::int64_t stored = stored_label[slot];
        if (stored != label)
          bad("slot " + std::to_string(slot) + " holds label " + std::to_string(stored) + ", listed under class " +
              std::to_string(label));
      }
    }
  }
  for (std::int64_t i = 0; i < n; ++i)
    if (slot_class[static_cast<std::size_t>(i)] == std::numeric_limits<std::uint32_t>::max()) bad("slot " + std::to_string(i) + " in no class");
  if (snap.seen < seen_sum) bad("seen is below the sum of the classes' seen");

  std::lock_guard<std::mutex> g(s.mu);
  if (n > 0) std::memcpy(s.base, rp, static_cast<std::size_t>(n) * s.row);
  s.used = n;
  s.seen = snap.seen;
  s.slot_class = std::move(slot_class);
  s.slot_pos = std::move(slot_pos);
  s.classes = std::move(classes);
  s.class_index = std::move(index);
  if (!snap.rng_state.empty()) s.rng.set_state(snap.rng_state);
}

BufferSnapshot repartition(const std::vector<BufferSnapshot>& old_ranks, int rank, int world, std::int64_t capacity,
                           std::uint64_t seed) {
  if (world < 1 || rank < 0 || rank >= world)
    throw RehearsalError("repartition: rank " + std::to_string(rank) + " of world " + std::to_string(world));
  if (capacity < 1) throw RehearsalError("repartition: capacity must be at least 1");
  BufferSnapshot out;
  out.capacity = capacity;
  for (std::size_t r = 0; r < old_ranks.size(); ++r) {
    const auto& o = old_ranks[r];
    if (!o.layout) continue;
    if (out.layout && !(*out.layout == *o.layout))
      throw RehearsalError("repartition: rank " + std::to_string(r) + "'s layout " + o.layout->to_string() +
                           " differs from " + out.layout->to_string());
    out.layout = o.layout;
  }
  if (!out.layout) return out;

  // Classes in order of first appearance, rank by rank; each class's samples as (rank, slot).
  std::vector<std::int64_t> labels;
  std::unordered_map<std::int64_t, std::size_t> idx;
  std::vector<std::uint64_t> seen_total;
  std::vector<std::vector<std::pair<std::size_t, std::int64_t>>> samples;
  for (std::size_t r = 0; r < old_ranks.size(); ++r) {
    const auto& o = old_ranks[r];
    for (std::size_t c = 0; c < o.class_labels.size(); ++c) {
      auto [it, fresh] = idx.try_emplace(o.class_labels[c], labels.size());
      if (fresh) {
        labels.push_back(o.class_labels[c]);
        seen_total.push_back(0);
        samples.emplace_back();
      }
      seen_total[it->second] += o.class_seen[c];
      for (auto slot : o.class_slots[c]) samples[it->second].emplace_back(r, slot);
    }
  }
  const std::size_t k = labels.size();
  // This rank's share: every world-th sample of each class.
  std::vector<std::vector<std::pair<std::size_t, std::int64_t>>> mine(k);
  for (std::size_t c = 0; c < k; ++c)
    for (std::size_t j = static_cast<std::size_t>(rank); j < samples[c].size(); j += static_cast<std::size_t>(world))
      mine[c].push_back(samples[c][j]);
  // Seen counts in proportion to the samples handed out (all of them when none are stored).
  std::vector<std::uint64_t> seen(k);
  for (std::size_t c = 0; c < k; ++c) {
    const auto total = static_cast<std::uint64_t>(samples[c].size());
    if (total == 0) {
      seen[c] = seen_total[c] / static_cast<std::uint64_t>(world) +
                (static_cast<std::uint64_t>(rank) < seen_total[c] % static_cast<std::uint64_t>(world) ? 1 : 0);
    } else {
      const auto m = static_cast<std::uint64_t>(mine[c].size());
      seen[c] = std::max<std::uint64_t>(m, static_cast<std::uint64_t>(
                                               static_cast<long double>(seen_total[c]) * m / total + 0.5L));
    }
  }
  // Over capacity: keep each class's quota, hand the slack round-robin to the classes with more.
  std::int64_t held = 0;
  for (const auto& m : mine) held += static_cast<std::int64_t>(m.size());
  std::vector<std::int64_t> keep(k);
  for (std::size_t c = 0; c < k; ++c) keep[c] = static_cast<std::int64_t>(mine[c].size());
  if (held > capacity) {
    const auto kk = static_cast<std::int64_t>(k);
    std::int64_t slack = capacity;
    for (std::size_t c = 0; c < k; ++c) {
      const std::int64_t quota = capacity / kk + (static_cast<std::int64_t>(c) < capacity % kk ? 1 : 0);
      keep[c] = std::min(keep[c], quota);
      slack -= keep[c];
    }
    for (bool more = true; slack > 0 && more;) {
      more = false;
      for (std::size_t c = 0; c < k && slack > 0; ++c)
        if (keep[c] < static_cast<std::int64_t>(mine[c].size())) {
          ++keep[c];
          --slack;
          more = true;
        }
    }
    Rng rng(seed, static_cast<std::uint64_t>(rank));
    for (std::size_t c = 0; c < k; ++c) {
      rng.shuffle(mine[c]);  // drop uniformly at random
      mine[c].resize(static_cast<std::size_t>(keep[c]));
    }
  }
  std::int64_t n = 0;
  for (std::size_t c = 0; c < k; ++c) n += keep[c];
  const std::size_t row = out.layout->row_bytes();
  out.rows = at::empty({n, static_cast<std::int64_t>(row)}, at::TensorOptions().dtype(at::kByte));
  std::uint8_t* dst = out.rows.data_ptr<std::uint8_t>();
  std::vector<at::Tensor> src(old_ranks.size());
  std::int64_t slot = 0;
  for (std::size_t c = 0; c < k; ++c) {
    out.class_labels.push_back(labels[c]);
    out.class_seen.push_back(seen[c]);
    out.seen += seen[c];
    out.class_slots.emplace_back();
    for (auto [r, old_slot] : mine[c]) {
      if (!src[r].defined()) src[r] = old_ranks[r].rows.to(at::kCPU).contiguous();
      if (old_slot < 0 || old_slot >= src[r].size(0))
        throw RehearsalError("repartition: rank " + std::to_string(r) + "'s snapshot lists slot " +
                             std::to_string(old_slot) + " out of range");
      std::memcpy(dst + static_cast<std::size_t>(slot) * row,
                  src[r].data_ptr<std::uint8_t>() + static_cast<std::size_t>(old_slot) * row, row);
      out.class_slots.back().push_back(slot++);
    }
  }
  return out;
}

// ---- asynchronous insertion ----------------------------------------------------------------

struct AsyncInserter::Impl {
  RehearsalBuffer& buffer;
  InsertionConfig cfg;
  mutable std::mutex mu;
  std::condition_variable wake;  // worker: work or stop
  std::condition_variable idle;  // flush()/pause(): the worker finished a batch
  std::deque<Batch> queue;
  bool stop = false;
  bool paused = false;
  bool busy = false;
  InserterStats stats;
  std::thread worker;

  Impl(RehearsalBuffer& b, InsertionConfig c) : buffer(b), cfg(c) {}

  void run() {
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      wake.wait(lk, [&] { return stop || (!paused && !queue.empty()); });
      if (stop) return;
      Batch b = std::move(queue.front());
      queue.pop_front();
      busy = true;
      lk.unlock();
      std::int64_t stored = 0;
      bool failed = false;
      try {
        stored = buffer.insert(b);
      } catch (const std::exception&) {
        failed = true;  // validated at submit, so only an allocation failure gets here
      }
      const auto n = static_cast<std::uint64_t>(b.size());
      b = Batch{};  // release the tensors outside the lock
      lk.lock();
      busy = false;
      stats.samples_offered += failed ? 0 : n;
      stats.samples_stored += static_cast<std::uint64_t>(stored);
      stats.insert_errors += failed ? 1 : 0;
      idle.notify_all();
    }
  }
};

AsyncInserter::AsyncInserter(RehearsalBuffer& buffer, InsertionConfig config)
    : self_(std::make_unique<Impl>(buffer, config)) {
  if (config.queue_batches == 0) throw RehearsalError("insertion.queue_batches must be at least 1");
  self_->worker = std::thread([this] {
    name_this_thread("dsp-inserter");
    self_->run();
  });
}

AsyncInserter::~AsyncInserter() {
  {
    std::lock_guard<std::mutex> g(self_->mu);
    self_->stop = true;
  }
  self_->wake.notify_all();
  if (self_->worker.joinable()) self_->worker.join();
}

bool AsyncInserter::try_submit(Batch batch) {
  if (batch.tensors.empty()) return true;
  self_->buffer.validate(batch);  // lock-free once the layout is fixed
  const std::int64_t n = batch.size();
  if (n == 0) return true;
  // Drop autograd history now (O(1), no copy): queued DER outputs must not keep the
  // step's graph and activations alive until the worker gets to them.
  for (auto& t : batch.tensors) t = t.detach();
  if (batch.outputs.defined()) batch.outputs = batch.outputs.detach();
  std::lock_guard<std::mutex> g(self_->mu);
  self_->stats.batches_submitted += 1;
  self_->stats.samples_submitted += static_cast<std::uint64_t>(n);
  if (self_->queue.size() >= self_->cfg.queue_batches) {
    self_->stats.batches_dropped += 1;
    self_->stats.samples_dropped += static_cast<std::uint64_t>(n);
    return false;
  }
  self_->queue.push_back(std::move(batch));
  self_->wake.notify_one();
  return true;
}

bool AsyncInserter::flush(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(self_->mu);
  return self_->idle.wait_for(lk, timeout,
                              [&] { return !self_->busy && (self_->queue.empty() || self_->paused); });
}

void AsyncInserter::pause() {
  std::unique_lock<std::mutex> lk(self_->mu);
  self_->paused = true;
  self_->idle.wait(lk, [&] { return !self_->busy; });
}

void AsyncInserter::resume() {
  {
    std::lock_guard<std::mutex> g(self_->mu);
    self_->paused = false;
  }
  self_->wake.notify_all();
}

InserterStats AsyncInserter::stats() const {
  std::lock_guard<std::mutex> g(self_->mu);
  InserterStats s = self_->stats;
  s.queue_depth = self_->queue.size();
  return s;
}

}  // namespace diaspora::rehearsal
