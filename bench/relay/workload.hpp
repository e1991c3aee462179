// The relay benchmark's workload, shared by `diaspora bench relay` and its JetStream peer
// (bench_jetstream) so both move byte-identical events and compute percentiles alike.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace diaspora::bench {

/// Nanoseconds on the steady clock (producers and subscribers share one process).
inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// Writes back whatever the page cache holds dirty (sync(2)), so that a run's fsyncs do not
/// queue behind writeback left by earlier runs or other programs. Both benchmarks call it
/// once, with everything connected, just before the timed part starts.
inline void settle_disk() { ::sync(); }

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

/// The same, as what engines publish and the relay's views read: an
/// org.diaspora.task.heartbeat of one of 1,000 task ids, the send time in data.seq, the
/// padding in data.worker (at most 256 characters, so at most about 400 bytes in all).
inline std::string make_task_event(int producer, std::uint64_t i, std::size_t size, std::int64_t t_ns) {
  std::string e = R"({"specversion":"1.0","id":")" + std::to_string(i) + R"(","source":"/bench/p)" +
                  std::to_string(producer) + R"(","type":"org.diaspora.task.heartbeat","data":{"task_id":"t.)" +
                  std::to_string(i % 1000) + R"(","seq":)" + std::to_string(t_ns) + R"(,"worker":"w)";
  const std::size_t used = e.size() + 3;
  e.append(std::min<std::size_t>(255, size > used ? size - used : 0), 'x');
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

/// Parses one received message into an arena reused from call to call. Both benchmark
/// clients (ours and the JetStream peer's) parse every event they receive this way, so
/// neither pays a malloc per JSON value and the subscriber takes less of the shared CPU.
class ArenaParser {
 public:
  explicit ArenaParser(std::size_t bytes) : buf_(bytes) {}
  /// Calls use(const boost::json::value&) with the parsed text; false if it is not JSON.
  template <class Use>
  bool parse(std::string_view text, Use&& use) {
    boost::json::monotonic_resource arena(buf_.data(), buf_.size());
    boost::system::error_code ec;
    boost::json::value v = boost::json::parse(text, ec, &arena);
    if (ec) return false;
    use(static_cast<const boost::json::value&>(v));
    return true;
  }

 private:
  std::vector<unsigned char> buf_;
};

/// The disk's own durable-append latency: `samples` appends of 4 KiB to a scratch file in
/// `dir`, each followed by fdatasync, as the relay's group commit does. Returns the
/// latencies in microseconds. Throws std::runtime_error naming the file on failure.
inline std::vector<double> probe_fdatasync(const std::filesystem::path& dir, int samples) {
  const std::filesystem::path file = dir / "fdatasync-probe.tmp";
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("cannot create " + file.string() + ": " + std::strerror(errno));
  std::vector<double> out;
  std::string block(4096, 'p');
  for (int i = 0; i < samples; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (::write(fd, block.data(), block.size()) != static_cast<ssize_t>(block.size()) || ::fdatasync(fd) != 0) {
      const int err = errno;
      ::close(fd);
      std::filesystem::remove(file);
      throw std::runtime_error("cannot append to " + file.string() + ": " + std::strerror(err));
    }
    out.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  ::close(fd);
  std::filesystem::remove(file);
  return out;
}

}  // namespace diaspora::bench
