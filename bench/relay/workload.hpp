// The relay benchmark's workload, shared by `diaspora bench relay` and its JetStream peer
// (bench_jetstream) so both move byte-identical events and compute percentiles alike.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace diaspora::bench {

/// Nanoseconds on the steady clock (producers and subscribers share one process).
inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// A CloudEvent of about `size` bytes whose data carries the send time `t_ns`.
inline std::string make_event(int producer, std::uint64_t i, std::size_t size, std::int64_t t_ns) {
  std::string e = R"({"specversion":"1.0","id":")" + std::to_string(i) + R"(","source":"/bench/p)" +
                  std::to_string(producer) + R"(","type":"org.example.bench","data":{"t":)" + std::to_string(t_ns) +
                  R"(,"pad":")";
  std::size_t used = e.size() + 3;
  e.append(size > used ? size - used : 0, 'x');
  e += "\"}}";
  return e;
}

/// The p-quantile (0..1) of v (reorders v); 0 for an empty vector.
inline double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::size_t k = std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

}  // namespace diaspora::bench
