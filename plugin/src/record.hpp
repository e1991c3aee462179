// What a hook call becomes inside the plugin: a fixed header plus a small arena of the
// strings it carried, written straight into a slot of a bounded lock-free queue (the fast
// path: no allocation, no lock, no system call). When the queue is full the call is
// packed into a record of the same layout off the queue and serialised to its event's
// JSON text, which goes into the spool (intake.hpp, plugin_impl.cpp).
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string_view>
#include <type_traits>

namespace diaspora::plugin {

enum class Kind : std::uint8_t {
  submitted = 1,
  started,
  heartbeat,
  progress,
  completed,
  failed,
  cancelled,
  metric,
  data,
  resource,
};

/// The string fields of a record; what each holds depends on the kind.
enum Field : std::uint8_t {
  f_key = 0,  ///< task id | metric id | stream | resource id
  f_site,
  f_worker,
  f_name,     ///< task name | metric name | resource kind
  f_text,     ///< failure / cancel reason | data URI
  f_extra,    ///< data checksum | resource state
  f_count
};

enum Flag : std::uint8_t {
  has_exit_code = 1,
  retryable = 2,
  has_step = 4,
  has_bytes = 8,
  has_deadline = 16,
  has_progress = 32,
  time_in_ticks = 64,  ///< time_us holds a TickClock::ticks() reading, converted when serialised
};

/// Fixed part of a record. Trivially copyable: queue slots and coalescer slots copy it.
struct RecordHead {
  Kind kind{};
  std::uint8_t scope = 0;  ///< metric: diaspora_scope
  std::uint8_t flags = 0;
  std::uint8_t metric_count = 0;
  std::int32_t attempt = 0;
  std::int32_t exit_code = 0;
  std::uint32_t arena_used = 0;
  std::int64_t time_us = 0;
  double number = 0;          ///< progress | metric value | deadline_s
  std::int64_t integer = 0;   ///< progress step | data seq | failed: a diaspora_failure_kind
  std::int64_t integer2 = 0;  ///< data bytes
  std::uint16_t off[f_count]{};
  std::uint16_t len[f_count]{};  ///< 0 = absent
  std::uint16_t metrics_off = 0;  ///< metrics: metric_count x (u8 name length, name, f64 value)
};

/// Read access to a record whose arena lives elsewhere (a queue slot or a spool record).
struct RecordView {
  const RecordHead* head = nullptr;
  const char* arena = nullptr;

  std::string_view str(Field f) const noexcept {
    return head->len[f] ? std::string_view(arena + head->off[f], head->len[f]) : std::string_view();
  }
  /// Calls fn(name, value) for each metric, in the order given.
  template <class Fn>
  void for_each_metric(Fn&& fn) const {
    const char* p = arena + head->metrics_off;
    for (unsigned i = 0; i < head->metric_count; ++i) {
      const auto n = static_cast<unsigned char>(*p++);
      std::string_view name(p, n);
      p += n;
      double v;
      std::memcpy(&v, p, sizeof v);
      p += sizeof v;
      fn(name, v);
    }
  }
};

/// Fills an arena: strings and metrics appended in turn. The caller sizes it first.
struct ArenaWriter {
  RecordHead& head;
  char* arena;

  void put(Field f, std::string_view s) noexcept {
    if (s.empty()) return;
    head.off[f] = static_cast<std::uint16_t>(head.arena_used);
    head.len[f] = static_cast<std::uint16_t>(s.size());
    std::memcpy(arena + head.arena_used, s.data(), s.size());
    head.arena_used += static_cast<std::uint32_t>(s.size());
  }
  void begin_metrics() noexcept { head.metrics_off = static_cast<std::uint16_t>(head.arena_used); }
  void metric(std::string_view name, double value) noexcept {
    arena[head.arena_used++] = static_cast<char>(name.size());
    std::memcpy(arena + head.arena_used, name.data(), name.size());
    head.arena_used += static_cast<std::uint32_t>(name.size());
    std::memcpy(arena + head.arena_used, &value, sizeof value);
    head.arena_used += sizeof value;
    ++head.metric_count;
  }
};

/// Bytes a metric takes in the arena.
constexpr std::size_t metric_arena_bytes(std::size_t name_len) noexcept { return 1 + name_len + sizeof(double); }

inline constexpr std::size_t kSlotBytes = 512;

struct alignas(64) Slot {
  std::atomic<std::uint64_t> seq;
  RecordHead head;
  char arena[kSlotBytes - sizeof(std::atomic<std::uint64_t>) - sizeof(RecordHead)];
};
static_assert(sizeof(Slot) == kSlotBytes);
inline constexpr std::size_t kSlotArenaBytes = sizeof(Slot::arena);

/// Bounded multi-producer multi-consumer queue of Slots (D. Vyukov's array queue): each
/// slot's sequence number says whether it is free for the producer at a position or
/// filled for the consumer. push/pop are lock-free and never allocate; the capacity is a
/// power of two fixed at construction.
class SlotQueue {
 public:
  /// Throws std::bad_alloc.
  explicit SlotQueue(std::size_t min_capacity) {
    std::size_t cap = 16;
    while (cap < min_capacity) cap <<= 1;
    mask_ = cap - 1;
    slots_.reset(allocate(cap));
    for (std::size_t i = 0; i < cap; ++i) slots_[i].seq.store(i, std::memory_order_relaxed);
  }

  std::size_t capacity() const noexcept { return mask_ + 1; }

  /// Reserves a slot, lets fill(slot, position) write it, publishes it. False when full.
  template <class Fill>
  bool try_push(Fill&& fill) noexcept {
    std::uint64_t pos = tail_.load(std::memory_order_relaxed);
    for (;;) {
      Slot& s = slots_[pos & mask_];
      const std::uint64_t seq = s.seq.load(std::memory_order_acquire);
      const auto dif = static_cast<std::int64_t>(seq - pos);
      if (dif == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          // The ring is larger than the caches: fetch the lines a push writes (sequence,
          // head, the start of the arena) of a slot eight pushes ahead now, so that later
          // pushes (on this or another engine thread) do not wait on memory. Measured:
          // two slots ahead and two lines, median 140 ns a heartbeat; eight and three, 90.
          const char* next = reinterpret_cast<const char*>(&slots_[(pos + 8) & mask_]);
          __builtin_prefetch(next, 1, 3);
          __builtin_prefetch(next + 64, 1, 3);
          __builtin_prefetch(next + 128, 1, 3);
          fill(s, pos);
          s.seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (dif < 0) {
        return false;
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
  }

  /// Takes the oldest filled slot, lets use(slot, position) read it, frees it. False
  /// when empty.
  template <class Use>
  bool try_pop(Use&& use) {
    std::uint64_t pos = head_.load(std::memory_order_relaxed);
    for (;;) {
      Slot& s = slots_[pos & mask_];
      const std::uint64_t seq = s.seq.load(std::memory_order_acquire);
      const auto dif = static_cast<std::int64_t>(seq - (pos + 1));
      if (dif == 0) {
        if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          struct Release {
            Slot& s;
            std::uint64_t next;
            ~Release() { s.seq.store(next, std::memory_order_release); }
          } release{s, pos + mask_ + 1};
          use(s, pos);
          return true;
        }
      } else if (dif < 0) {
        return false;
      } else {
        pos = head_.load(std::memory_order_relaxed);
      }
    }
  }

  /// Number of pushes so far (slots reserved; a push still copying into its slot counts).
  std::uint64_t pushed() const noexcept { return tail_.load(std::memory_order_acquire); }
  /// Number of pops so far.
  std::uint64_t popped() const noexcept { return head_.load(std::memory_order_acquire); }

  /// Approximate number of filled slots (exact when no push/pop runs concurrently).
  std::size_t size_approx() const noexcept {
    const auto t = tail_.load(std::memory_order_acquire), h = head_.load(std::memory_order_acquire);
    return t > h ? static_cast<std::size_t>(t - h) : 0;
  }

 private:
  // The ring (32 MiB at the default 65,536 slots) spans more 4 KiB pages than the TLB
  // holds: a push would walk the page tables about every eighth slot. It is allocated on
  // 2 MiB boundaries and offered to transparent huge pages (madvise; ignored where the
  // kernel has them off). Measured (session 11, THP "madvise" against "never", same
  // build): one engine thread's p99 358-394 -> 100-139 ns, Google Benchmark's wall time
  // per call 173-199 -> 123-140 ns; the median stays at 89-99 ns.
  static constexpr std::size_t kHugePage = 2u << 20;
  struct Free {
    void operator()(Slot* p) const noexcept { std::free(p); }
  };
  static Slot* allocate(std::size_t cap) {
    const std::size_t bytes = cap * sizeof(Slot);
    const bool huge = bytes >= kHugePage;
    const std::size_t align = huge ? kHugePage : alignof(Slot);
    void* p = std::aligned_alloc(align, (bytes + align - 1) / align * align);
    if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    if (huge) ::madvise(p, bytes, MADV_HUGEPAGE);
#endif
    Slot* slots = static_cast<Slot*>(p);
    for (std::size_t i = 0; i < cap; ++i) new (&slots[i]) Slot;  // Slot is trivially destructible
    return slots;
  }
  static_assert(std::is_trivially_destructible_v<Slot>);
  std::unique_ptr<Slot[], Free> slots_;
  std::size_t mask_ = 0;
  alignas(64) std::atomic<std::uint64_t> tail_{0};
  alignas(64) std::atomic<std::uint64_t> head_{0};
};

}  // namespace diaspora::plugin
