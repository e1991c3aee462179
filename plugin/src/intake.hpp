// The plugin's intake, on the engine's threads: a hook call (HookArgs, checked by abi.cpp)
// is packed into a slot of the SlotQueue (record.hpp). When the queue is full, a free-form
// metric sample is merged into its series' slot of the Coalescer instead (the newest value
// wins, the count of merged samples travels with it); anything else takes the plugin's spill
// path to the spool (plugin_impl.cpp).
//
// Internal to the plugin. Thread safety: pack() and Coalescer::merge() from any engine
// thread; Coalescer::take() from one thread (the publisher, or a spilling hook under the
// plugin's feed lock).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "diaspora/plugin.h"
#include "record.hpp"

namespace diaspora::plugin {

/// A hook call, validated by the ABI layer, ready to be packed into a record.
struct HookArgs {
  RecordHead head;
  std::string_view strings[f_count];
  const diaspora_metric_value* metrics = nullptr;
  std::size_t metric_count = 0;
  std::uint8_t metric_len[DIASPORA_MAX_METRICS];  ///< name lengths, measured once (left uninitialised)
  bool coalescible = false;  ///< free-form metric: may be merged when the queue is full
};

/// Arena bytes the call's strings and metrics take once packed.
std::size_t arena_bytes(const HookArgs& a) noexcept;
/// Packs the call into `head` and `arena` (arena_bytes(a) long).
void pack(const HookArgs& a, RecordHead& head, char* arena) noexcept;

/// Metric samples merged by series while the queue is full.
class Coalescer {
 public:
  static constexpr std::size_t kSlots = 256;
  Coalescer();
  ~Coalescer();
  Coalescer(const Coalescer&) = delete;
  Coalescer& operator=(const Coalescer&) = delete;

  /// Stores `a` (a metric whose strings fit a slot) in its series' slot, or merges it into
  /// the sample there. False when another series holds the slot (then take the spill path).
  bool merge(const HookArgs& a) noexcept;
  /// Whether merge() stored a sample since the last take() (a peek; any thread).
  bool pending() const noexcept { return pending_.load(std::memory_order_acquire); }
  /// Empties every slot, calling `fn` with its record and the number of samples merged
  /// into it, outside the slots' locks. Throws std::bad_alloc before touching a slot, or
  /// what `fn` throws (the samples not handed over yet are lost then).
  void take(const std::function<void(const RecordView&, std::uint64_t merged)>& fn);
  /// Samples merged into another so far.
  std::uint64_t merged_count() const noexcept { return merged_.load(std::memory_order_relaxed); }

 private:
  struct Slot;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<bool> pending_{false};
  std::atomic<std::uint64_t> merged_{0};
};

}  // namespace diaspora::plugin
