// Configuration of the rehearsal library (buffer, asynchronous insertion, global
// sampling), free of LibTorch headers so that spec loaders can include it cheaply.
// The file form is YAML (or JSON) checked against schemas/rehearsal.schema.json;
// docs/rehearsal.md explains each key.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "diaspora/spec.hpp"  // Diagnostic, SpecError, parse_yaml / validate_yaml

namespace diaspora::rehearsal {

/// The per-rank buffer (`buffer:`).
struct BufferConfig {
  /// Hard bound on this rank's buffer memory in bytes (`memory`): sample storage plus
  /// the per-slot bookkeeping (RehearsalBuffer::kSlotOverheadBytes a slot). The slot
  /// count is derived from it once the sample layout is known.
  std::uint64_t memory_bytes = 64ull << 20;
  /// Optional cap on the number of slots (0: as many as fit in memory_bytes).
  std::uint64_t max_samples = 0;
  /// true: one reservoir per class, capacity split evenly among the classes seen so far.
  /// false: one reservoir for everything (regression / generative samples).
  bool class_balanced = true;
  /// Index of the tensor of a sample that holds its class label (an integer scalar per
  /// sample); used only when class_balanced. Default 1: samples are (input, label).
  int label_tensor = 1;
  /// Seed of the buffer's random choices (reservoir acceptance, eviction victims).
  /// Give each rank a different one.
  std::uint64_t seed = 0;
};

/// The background insertion queue (`insertion:`).
struct InsertionConfig {
  /// Batches of candidates the queue holds; when it is full a new batch is dropped.
  std::size_t queue_batches = 16;
};

/// Global sampling (`sampling:`).
struct SamplerConfig {
  /// R: representatives each rank receives per step (fewer only while the union of all
  /// buffers holds fewer than R samples).
  std::int64_t representatives = 32;
  /// Seed of the global draws; must be the same on every rank.
  std::uint64_t seed = 0;
  /// Fetch step i+1's representatives in the background while step i trains.
  bool prefetch = true;
  /// Device of the communication buffers: "cpu" for Gloo, "cuda" / "cuda:N" for NCCL
  /// ("cuda": GPU rank mod the GPUs visible, one per rank on a node).
  std::string comm_device = "cpu";
  /// c10d backend make_process_group() creates: "gloo" or "nccl" (CUDA builds only).
  std::string backend = "gloo";
  /// Collective timeout for make_process_group() (`timeout`, a duration such as "60s").
  std::chrono::milliseconds timeout{60000};
};

/// A rehearsal config file: the three sections above.
struct RehearsalConfig {
  BufferConfig buffer;
  InsertionConfig insertion;
  SamplerConfig sampling;
};

/// Loads a rehearsal config from YAML (JSON is YAML) text, validated against the
/// built-in schema `rehearsal.schema.json`, then checked for consistency (backend
/// "nccl" needs a "cuda" comm_device and the reverse). Absent keys keep the defaults
/// above; memory is bytes or a string such as "64MiB".
/// @param name names the document in diagnostics ("FILE:LINE:COL: error: PATH: MESSAGE").
/// @throws diaspora::SpecError carrying every diagnostic, in file order.
/// @par Thread Safety
/// Reentrant.
RehearsalConfig load_config_string(std::string_view yaml, std::string_view name = "<string>");

/// As load_config_string(), reading `file`. @throws diaspora::SpecError (an unreadable
/// file is a diagnostic with line 0).
RehearsalConfig load_config_file(const std::filesystem::path& file);

}  // namespace diaspora::rehearsal
