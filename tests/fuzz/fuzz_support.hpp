// What the fuzz targets share (tests/fuzz/, docs/reliability.md, "Fuzzing"): a scratch
// directory per process and a reader that splits one fuzz input into parts.
//
// Every target defines LLVMFuzzerTestOneInput. It is linked either with libFuzzer
// (`make fuzz`: clang, coverage-guided, ASan + UBSan) or with replay_main.cpp (every build:
// replays the seed corpus and the regressions, then runs seeded random mutations of them;
// the `fuzz.<target>` tests of `make test`). A target catches the errors its parser
// documents (diaspora::Error and the like: bad input is refused, that is the point); any
// other exception, a crash, a sanitizer report or a broken invariant (FUZZ_CHECK) is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace diaspora::fuzz {

/// A fresh directory under $TMPDIR for this process, removed at exit. Not thread-safe
/// (fuzz targets run single-threaded).
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/diaspora-fuzz-XXXXXX";
    if (!::mkdtemp(templ.data())) {
      std::perror("diaspora fuzz: mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return std::filesystem::path(templ);
  }();
  return dir;
}

/// Splits one input into parts: a byte to steer the target, then strings cut at a
/// separator, so that mutations of one part leave the others alone.
class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : rest_(reinterpret_cast<const char*>(data), size) {}
  /// The next byte (0 when none is left).
  std::uint8_t byte() {
    if (rest_.empty()) return 0;
    const auto b = static_cast<std::uint8_t>(rest_.front());
    rest_.remove_prefix(1);
    return b;
  }
  /// The text up to the next "\n--\n" (or the rest), consumed with the separator.
  std::string_view part() {
    static constexpr std::string_view sep = "\n--\n";
    const auto at = rest_.find(sep);
    std::string_view p = rest_.substr(0, at);
    rest_.remove_prefix(at == std::string_view::npos ? rest_.size() : at + sep.size());
    return p;
  }
  std::string_view rest() const { return rest_; }
  /// Every part left (an empty one between two separators included), consumed.
  std::vector<std::string_view> parts() {
    std::vector<std::string_view> out;
    for (std::string_view p = part(); !p.empty() || !rest_.empty(); p = part()) out.push_back(p);
    return out;
  }

 private:
  std::string_view rest_;
};

/// Damages `bytes` as a crash or a bad disk may: `cut`, the tail from `at` (modulo the
/// size) is lost; otherwise the byte at `at` is flipped by `flip` (made odd, so it changes).
inline void damage(std::string& bytes, bool cut, std::uint16_t at, std::uint8_t flip) {
  if (bytes.empty()) return;
  if (cut) bytes.resize(at % (bytes.size() + 1));
  else bytes[at % bytes.size()] ^= static_cast<char>(flip | 1);
}

}  // namespace diaspora::fuzz

/// A broken invariant: prints what and where, then aborts (a finding, like a crash).
#define FUZZ_CHECK(cond)                                                                       \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond);       \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)
