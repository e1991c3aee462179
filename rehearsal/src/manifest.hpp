// A diaspora-train checkpoint's manifest.json read into its fields (no LibTorch): what
// --resume reads first, from a file on disk, before it trusts any rank file. Kept apart from
// the job so that it is unit tested and fuzzed (tests/fuzz/fuzz_train_config.cpp).
//
// Internal to the rehearsal library (not installed). Pure functions: any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

namespace diaspora::rehearsal::detail {

struct Manifest {
  std::string strategy, dataset;
  int tasks = 0;
  std::optional<std::string> metric;        ///< absent before the field existed
  double ema = 0;                           ///< 0 when absent
  std::optional<boost::json::object> stream;  ///< the stream's identity; absent in older ones
  std::optional<boost::json::value> seed;     ///< older checkpoints: the seed alone
  std::int64_t step = 0, batch = 0;
  int task = 0, epoch = 0, world_size = 0;
  double elapsed_s = 0, cpu_s = 0;          ///< cpu_s: 0 when absent
  std::vector<std::vector<double>> matrix;  ///< one row per finished task; NaN where null
};

/// Parses manifest.json's text (`where` names it in messages; numbers read exactly). Throws
/// RehearsalError when it is not JSON, a field is missing or of the wrong type, a number is
/// not whole where it must be, or the position is impossible (a world size below 1, a
/// negative step, task, epoch or batch). `identity_check`, when given, sees the fields that
/// say what was trained (strategy to seed) before the rest is read, so that a checkpoint of
/// another job is refused as such first; what it throws passes through.
Manifest parse_manifest(std::string_view text, const std::string& where,
                        const std::function<void(const Manifest&)>& identity_check = {});

}  // namespace diaspora::rehearsal::detail
