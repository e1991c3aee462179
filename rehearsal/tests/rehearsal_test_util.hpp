// Helpers of the rehearsal tests: a hang watchdog, temporary paths, statistics.
#pragma once

#include "test_helpers.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace diaspora::rehearsal::test {

/// Kills the test binary (exit 3, with a message) if it lives longer than `limit`: a hung
/// collective or a deadlocked queue fails fast instead of stalling CI until CTest's timeout.
class Watchdog {
 public:
  Watchdog(std::chrono::seconds limit, std::string what) : what_(std::move(what)) {
    thread_ = std::thread([this, limit] {
      std::unique_lock<std::mutex> lk(mu_);
      if (!cv_.wait_for(lk, limit, [this] { return done_; })) {
        std::fprintf(stderr, "WATCHDOG: %s did not finish within %lld s; aborting\n", what_.c_str(),
                     static_cast<long long>(limit.count()));
        std::fflush(stderr);
        std::_Exit(3);
      }
    });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> g(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::string what_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

/// A path under the temp dir that does not exist yet; removed (recursively) at the end.
/// A fresh temporary directory (tests/unit/test_helpers.hpp), removed at scope exit.
using diaspora::test::TempDir;

/// Pearson's chi-square statistic of observed counts against expected counts.
inline double chi_square(const std::vector<double>& observed, const std::vector<double>& expected) {
  double x = 0;
  for (std::size_t i = 0; i < observed.size(); ++i) x += (observed[i] - expected[i]) * (observed[i] - expected[i]) / expected[i];
  return x;
}

/// Upper critical value of chi-square with k degrees of freedom at standard-normal
/// quantile z (z = 3.719: p = 1e-4), by the Wilson-Hilferty approximation.
inline double chi_square_critical(double k, double z = 3.719) {
  const double a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

}  // namespace diaspora::rehearsal::test
