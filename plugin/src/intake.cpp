#include "intake.hpp"

#include <cstring>
#include <vector>

namespace diaspora::plugin {

std::size_t arena_bytes(const HookArgs& a) noexcept {
  std::size_t n = 0;
  for (const auto& s : a.strings) n += s.size();
  for (std::size_t i = 0; i < a.metric_count; ++i) n += metric_arena_bytes(a.metric_len[i]);
  return n;
}

void pack(const HookArgs& a, RecordHead& head, char* arena) noexcept {
  head = a.head;
  head.arena_used = 0;
  head.metric_count = 0;
  ArenaWriter w{head, arena};
  for (int f = 0; f < f_count; ++f) w.put(static_cast<Field>(f), a.strings[f]);
  w.begin_metrics();
  for (std::size_t i = 0; i < a.metric_count; ++i)
    w.metric(std::string_view(a.metrics[i].name, a.metric_len[i]), a.metrics[i].value);
}

namespace {

std::uint64_t key_hash(const HookArgs& a) noexcept {
  std::uint64_t h = 1469598103934665603ull ^ a.head.scope;  // FNV-1a over scope, id, name
  for (std::string_view s : {a.strings[f_key], std::string_view("\0", 1), a.strings[f_name]})
    for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

}  // namespace

struct Coalescer::Slot {
  std::atomic_flag lock = ATOMIC_FLAG_INIT;
  /// Written under `lock`; atomic because take() peeks at it without the lock (relaxed: the
  /// lock orders everything else).
  std::atomic<bool> used{false};
  std::uint64_t hash = 0;
  std::uint64_t merged = 0;
  RecordHead head;
  char arena[DIASPORA_MAX_ID + DIASPORA_MAX_METRIC_NAME + 8];
};

Coalescer::Coalescer() : slots_(new Slot[kSlots]) {}

Coalescer::~Coalescer() = default;

bool Coalescer::merge(const HookArgs& a) noexcept {
  const std::uint64_t h = key_hash(a);
  Slot& c = slots_[h % kSlots];
  while (c.lock.test_and_set(std::memory_order_acquire)) {
  }
  bool ok = true;
  if (!c.used.load(std::memory_order_relaxed)) {
    pack(a, c.head, c.arena);
    c.used.store(true, std::memory_order_relaxed);
    c.hash = h;
    c.merged = 0;
  } else if (c.hash == h && RecordView{&c.head, c.arena}.str(f_key) == a.strings[f_key] &&
             RecordView{&c.head, c.arena}.str(f_name) == a.strings[f_name] && c.head.scope == a.head.scope) {
    c.head.number = a.head.number;
    c.head.time_us = a.head.time_us;
    c.head.flags = static_cast<std::uint8_t>((c.head.flags & ~time_in_ticks) | (a.head.flags & time_in_ticks));
    ++c.merged;
    merged_.fetch_add(1, std::memory_order_relaxed);
  } else {
    ok = false;  // another series holds the slot: take the spool path
  }
  c.lock.clear(std::memory_order_release);
  if (ok) pending_.store(true, std::memory_order_release);
  return ok;
}

void Coalescer::take(const std::function<void(const RecordView&, std::uint64_t merged)>& fn) {
  if (!pending_.exchange(false, std::memory_order_acq_rel)) return;
  // Copied out under each slot's spin lock, handed over unlocked. Nothing under a lock may
  // throw (a lock left set would make every hook of that slot spin for ever): the vector
  // is sized for every slot before the first lock.
  struct Copy {
    RecordHead head;
    std::uint64_t merged;
    char arena[sizeof(Slot::arena)];
  };
  std::vector<Copy> copies;
  copies.reserve(kSlots);
  for (std::size_t i = 0; i < kSlots; ++i) {
    Slot& c = slots_[i];
    if (!c.used.load(std::memory_order_relaxed)) continue;  // a peek; confirmed under the lock
    while (c.lock.test_and_set(std::memory_order_acquire)) {
    }
    if (c.used.load(std::memory_order_relaxed)) {
      Copy& m = copies.emplace_back();  // within the reserved capacity: no allocation
      m.head = c.head;
      m.merged = c.merged;
      std::memcpy(m.arena, c.arena, c.head.arena_used);
      c.used.store(false, std::memory_order_relaxed);
    }
    c.lock.clear(std::memory_order_release);
  }
  for (const Copy& m : copies) fn(RecordView{&m.head, m.arena}, m.merged);
}

}  // namespace diaspora::plugin
