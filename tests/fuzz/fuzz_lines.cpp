// Fuzz target: what the runner reads from its workers and commands: the line channel of
// newline-delimited JSON objects (LineChannel, over a real socket pair) and a command's
// progress lines (parse_progress_line, apply_progress_line: "progress F [STEP]",
// "metric NAME VALUE...", "heartbeat"). Invariants: every line comes back as an object (one
// that is not a JSON object as {"op":"invalid"}), and every whole line comes back; a progress line that is accepted holds what the
// docs promise (a fraction in [0, 1]; at most 32 metrics, names of 1-63 bytes without
// repeats, finite values) and maps to its hook.
#include <boost/json.hpp>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "diaspora/data_item.hpp"
#include "diaspora/process.hpp"
#include "fuzz_support.hpp"

using namespace diaspora::adapters;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  int sv[2];
  FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  int buf = 1 << 20;
  ::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  for (std::size_t off = 0; off < size;) {
    const ssize_t n = ::write(sv[0], data + off, size - off);
    FUZZ_CHECK(n > 0);
    off += static_cast<std::size_t>(n);
  }
  ::close(sv[0]);
  LineChannel ch(sv[1]);
  while (ch.fill()) {
  }
  std::size_t lines = 0;
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  std::size_t at = 0;
  while (auto m = ch.next()) {
    const std::size_t nl = all.find('\n', at);
    FUZZ_CHECK(nl != std::string_view::npos);
    const std::string_view line = all.substr(at, nl - at);
    at = nl + 1;
    ++lines;
    boost::system::error_code ec;
    const boost::json::value v = boost::json::parse(line, ec);
    if (ec || !v.is_object()) FUZZ_CHECK(m->at("op") == "invalid");
  }
  ch.close();
  FUZZ_CHECK(lines == static_cast<std::size_t>(std::count(all.begin(), all.end(), '\n')));

  const std::string text(reinterpret_cast<const char*>(data), size);
  for (std::size_t pos = 0; pos <= text.size();) {
    const auto nl = text.find('\n', pos);
    const std::string line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? text.size() + 1 : nl + 1;
    const ProgressLine pl = parse_progress_line(line);
    diaspora_task_info info{};
    std::vector<diaspora_metric_value> metrics;
    const ProgressHook hook = apply_progress_line(pl, info, metrics);
    switch (pl.kind) {
      case ProgressLine::Kind::none: FUZZ_CHECK(hook == ProgressHook::none); break;
      case ProgressLine::Kind::progress:
        FUZZ_CHECK(hook == ProgressHook::progress && pl.value >= 0 && pl.value <= 1);
        break;
      case ProgressLine::Kind::heartbeat: FUZZ_CHECK(hook == ProgressHook::heartbeat); break;
      case ProgressLine::Kind::checkpoint:
        FUZZ_CHECK(hook == ProgressHook::none && diaspora::data::parse_item_uri(pl.uri).has_value());
        break;
      case ProgressLine::Kind::result: FUZZ_CHECK(hook == ProgressHook::none && line.starts_with("result ")); break;
      case ProgressLine::Kind::metric: {
        FUZZ_CHECK(hook == ProgressHook::heartbeat && !pl.metrics.empty() && pl.metrics.size() <= 32);
        std::set<std::string> names;
        for (const auto& [name, value] : pl.metrics) {
          FUZZ_CHECK(!name.empty() && name.size() <= 63 && std::isfinite(value));
          FUZZ_CHECK(names.insert(name).second);
        }
        break;
      }
    }
  }
  return 0;
}
