// The topic log's event de-dupe window: the (source, id) keys of a topic's last events.
// Internal to the relay. Thread safety: none; the log's writer thread owns each window.
//
// Keys are remembered by a 128-bit fingerprint in flat open-addressing tables: the
// (source, id) window is on the writer's hot path, where std::unordered_set of strings
// cost a cache miss and an allocation per event. Two independent 64-bit hashes make a
// false "duplicate" (which would drop an event) about 1e-26 likely for a full window.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <new>
#include <string_view>
#include <vector>

namespace diaspora::relay {

struct Fingerprint {
  std::uint64_t a = 0, b = 0;
  bool empty() const noexcept { return a == 0 && b == 0; }
  bool operator==(const Fingerprint&) const = default;
};

inline std::uint64_t mix64(std::uint64_t x) noexcept {  // splitmix64 finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Marks a slot of a table being drained by FingerprintSet's incremental growth; no key's
// fingerprint takes this value.
inline constexpr Fingerprint kMoved{~0ULL, ~0ULL};

inline Fingerprint fingerprint(std::string_view key) noexcept {
  std::uint64_t fnv = 0xcbf29ce484222325ULL;  // FNV-1a, then mixed
  for (unsigned char c : key) fnv = (fnv ^ c) * 0x100000001b3ULL;
  Fingerprint f{std::hash<std::string_view>{}(key), mix64(fnv ^ key.size())};
  if (f.empty()) f.b = 1;
  if (f == kMoved) f.b = 0;
  return f;
}

/// A set of fingerprints: linear probing, backward-shift deletion, grows by doubling.
/// Growth is incremental: the old table is kept and drained a few slots per insert, so no
/// single insert rehashes the whole set (a full rehash of a 100,000-key window stalled the
/// writer for several milliseconds, which showed as end-to-end latency spikes). While
/// draining, lookups probe both tables; drained or erased old slots become kMoved, which
/// keeps the old table's probe chains intact.
class FingerprintSet {
 public:
  void prefetch(const Fingerprint& f) const noexcept {
    if (cap_ != 0) __builtin_prefetch(&slots_[f.a & mask_]);
    if (old_cap_ != 0) __builtin_prefetch(&old_[f.a & (old_cap_ - 1)]);
  }
  bool contains(const Fingerprint& f) const noexcept { return find(slots_.get(), cap_, f) || find_old(f) != kNone; }
  /// Inserts f; returns false when it was already there.
  bool insert(const Fingerprint& f) {
    if (contains(f)) return false;
    if ((count_ + old_count_ + 1) * 2 > cap_) grow();
    place(f);
    drain(kDrainPerInsert);
    return true;
  }
  bool erase(const Fingerprint& f) noexcept {
    if (erase_new(f)) return true;
    const std::size_t i = find_old(f);
    if (i == kNone) return false;
    old_[i] = kMoved;
    --old_count_;
    return true;
  }
  void clear() noexcept {
    if (count_ != 0) std::fill(slots_.get(), slots_.get() + cap_, Fingerprint{});
    count_ = 0;
    old_.reset();
    old_cap_ = old_pos_ = old_count_ = 0;
  }
  std::size_t size() const noexcept { return count_ + old_count_; }

 private:
  struct Free {
    void operator()(Fingerprint* p) const noexcept { std::free(p); }
  };
  using Table = std::unique_ptr<Fingerprint[], Free>;
  static constexpr std::size_t kNone = SIZE_MAX;
  // Enough that the old table is drained before the new one fills to its own threshold
  // (the new one takes old_cap/2 more inserts to get there; draining takes old_cap/4).
  static constexpr std::size_t kDrainPerInsert = 4;

  // Zeroed memory from calloc: large tables come straight from the kernel's zero pages,
  // without a memset of the whole table at once.
  static Table allocate(std::size_t n) {
    auto* p = static_cast<Fingerprint*>(std::calloc(n, sizeof(Fingerprint)));
    if (!p) throw std::bad_alloc();
    return Table(p);
  }
  static bool find(const Fingerprint* t, std::size_t cap, const Fingerprint& f) noexcept {
    if (cap == 0) return false;
    for (std::size_t i = f.a & (cap - 1);; i = (i + 1) & (cap - 1)) {
      if (t[i].empty()) return false;
      if (t[i] == f) return true;
    }
  }
  std::size_t find_old(const Fingerprint& f) const noexcept {
    if (old_count_ == 0) return kNone;
    for (std::size_t i = f.a & (old_cap_ - 1);; i = (i + 1) & (old_cap_ - 1)) {
      if (old_[i].empty()) return kNone;
      if (old_[i] == f) return i;
    }
  }
  void place(const Fingerprint& f) noexcept {  // f is not in the table, which has room
    std::size_t i = f.a & mask_;
    while (!slots_[i].empty()) i = (i + 1) & mask_;
    slots_[i] = f;
    ++count_;
  }
  bool erase_new(const Fingerprint& f) noexcept {
    if (cap_ == 0) return false;
    std::size_t i = f.a & mask_;
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].empty()) return false;
      if (slots_[i] == f) break;
    }
    // Backward shift: move later entries of the cluster into the hole when their home
    // slot does not lie cyclically in (hole, j].
    for (std::size_t j = (i + 1) & mask_; !slots_[j].empty(); j = (j + 1) & mask_) {
      std::size_t home = slots_[j].a & mask_;
      bool between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
      if (!between) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Fingerprint{};
    --count_;
    return true;
  }
  void drain(std::size_t slots) noexcept {
    if (old_cap_ == 0) return;
    for (const std::size_t end = std::min(old_cap_, old_pos_ + slots); old_pos_ < end; ++old_pos_) {
      Fingerprint& f = old_[old_pos_];
      if (f.empty() || f == kMoved) continue;
      place(f);
      f = kMoved;
      --old_count_;
    }
    if (old_pos_ == old_cap_ || old_count_ == 0) {
      old_.reset();
      old_cap_ = old_pos_ = old_count_ = 0;
    }
  }
  void grow() {
    drain(SIZE_MAX);  // a growth still draining finishes first (not reached with kDrainPerInsert)
    const std::size_t cap = std::max<std::size_t>(64, cap_ * 2);
    Table fresh = allocate(cap);
    old_ = std::move(slots_);
    old_cap_ = cap_;
    old_count_ = count_;
    old_pos_ = 0;
    slots_ = std::move(fresh);
    cap_ = cap;
    mask_ = cap - 1;
    count_ = 0;
    if (old_count_ == 0) {
      old_.reset();
      old_cap_ = 0;
    }
  }

  Table slots_;
  std::size_t cap_ = 0, mask_ = 0, count_ = 0;
  Table old_;  // the table being drained into slots_, or null
  std::size_t old_cap_ = 0, old_pos_ = 0, old_count_ = 0;
};

/// The last `window` keys of a topic, oldest evicted first.
class KeyWindow {
 public:
  bool contains(const Fingerprint& f) const noexcept { return set_.contains(f); }
  /// Prefetches what remembering `keys` will touch: their home slots and those of the
  /// keys they will push out of the window. Empty fingerprints are skipped.
  void prefetch(const std::vector<Fingerprint>& keys, std::size_t window) const noexcept {
    std::size_t n = 0;
    for (const auto& f : keys)
      if (!f.empty()) {
        set_.prefetch(f);
        ++n;
      }
    const std::size_t expiring = fifo_.size() + n > window ? std::min(fifo_.size(), fifo_.size() + n - window) : 0;
    for (std::size_t i = 0; i < expiring; ++i) set_.prefetch(fifo_[i]);
  }
  /// Remembers f; returns false when it was already remembered (a duplicate).
  bool remember(const Fingerprint& f, std::size_t window) {
    if (window == 0) return true;
    if (!set_.insert(f)) return false;
    fifo_.push_back(f);
    while (fifo_.size() > window) {
      set_.erase(fifo_.front());
      fifo_.pop_front();
    }
    return true;
  }
  /// Forgets f (a write that failed); its FIFO slot expires harmlessly later.
  void forget(const Fingerprint& f) noexcept { set_.erase(f); }

 private:
  FingerprintSet set_;
  std::deque<Fingerprint> fifo_;
};

}  // namespace diaspora::relay
