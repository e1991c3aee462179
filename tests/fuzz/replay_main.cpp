// The driver of a fuzz target without libFuzzer (tests/fuzz/fuzz_support.hpp): what every
// build links the targets with, and what the `fuzz.<target>` tests run.
//
//   fuzz_<target> [--mutate N] [--seconds S] [--seed X] [--max-len B] [--timeout T] PATH...
//
// Runs the target on every file named (a directory: every file in it, sorted), then on N
// inputs made from them by seeded random mutations (bit flips, bytes set, inserted, erased
// or copied, splices of two inputs, JSON and number tokens), stopping after S seconds.
// The same seed gives the same inputs (the default seed is 1; DIASPORA_FUZZ_SEED overrides
// it). This is not coverage-guided (that is `make fuzz`, with libFuzzer): it replays the
// corpus and the regressions and looks a little way around them, within the test budget.
//
// An input that runs longer than T seconds (default 10) is a finding (a hang), as in libFuzzer.
// On a crash, abort, hang or sanitizer report, the input being run is written to
// crash-<target>-<N> in $DIASPORA_FUZZ_CRASH_DIR (default: the working directory) first;
// add it to tests/fuzz/regressions/<target>/ with the fix.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
extern "C" void __sanitizer_set_death_callback(void (*callback)()) __attribute__((weak));

namespace {

namespace fs = std::filesystem;

// The input being run and where it would be saved: set before each run, read by the crash
// handlers (which only call async-signal-safe functions).
const std::string* g_current = nullptr;
char g_crash_path[4096];

void save_current() {
  if (!g_current) return;
  const int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  std::size_t off = 0;
  while (off < g_current->size()) {
    const ssize_t n = ::write(fd, g_current->data() + off, g_current->size() - off);
    if (n <= 0) break;
    off += static_cast<std::size_t>(n);
  }
  ::close(fd);
  static const char msg[] = "fuzz: the input that failed is in ";
  (void)!::write(2, msg, sizeof msg - 1);
  (void)!::write(2, g_crash_path, std::strlen(g_crash_path));
  (void)!::write(2, "\n", 1);
}

void on_alarm(int) {
  static const char msg[] = "fuzz: an input ran past --timeout (a hang)\n";
  (void)!::write(2, msg, sizeof msg - 1);
  save_current();
  ::signal(SIGABRT, SIG_DFL);
  ::abort();
}

void on_fatal_signal(int sig) {
  save_current();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

struct Rng {
  std::uint64_t s;
  std::uint64_t next() {  // splitmix64
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t n) { return n ? static_cast<std::size_t>(next() % n) : 0; }
};

const char* const kTokens[] = {"null", "true", "false", "0", "-1", "1e999", "-0", "18446744073709551616",
                               "9223372036854775808", "1.5", "\"\"", "{}", "[]", "\\u0000", "\\ud800", "\\\\",
                               "\"id\"", "\"type\"", "\"data\"", "\"events\"", "\n--\n", ": ", "- ", "*", "%00",
                               "..", "\xff\xfe", "\r\n"};
const char kBytes[] = {0, '\xff', '"', '\\', '{', '}', '[', ']', ',', ':', '\n', '0', '-', '.', ' ', '%', '&', '='};

void mutate(std::string& s, const std::vector<std::string>& pool, Rng& r, std::size_t max_len) {
  const int rounds = 1 + static_cast<int>(r.below(4));
  for (int i = 0; i < rounds; ++i) {
    const std::size_t at = r.below(s.size() + 1);
    switch (r.below(9)) {
      case 0:
        if (!s.empty()) s[r.below(s.size())] ^= static_cast<char>(1u << r.below(8));
        break;
      case 1:
        if (!s.empty()) s[r.below(s.size())] = kBytes[r.below(sizeof kBytes)];
        break;
      case 2: {
        std::string ins(1 + r.below(8), '\0');
        for (char& c : ins) c = static_cast<char>(r.next());
        s.insert(at, ins);
        break;
      }
      case 3:
        if (at < s.size()) s.erase(at, 1 + r.below(std::min<std::size_t>(s.size() - at, 64)));
        break;
      case 4:
        if (!s.empty()) {
          const std::size_t from = r.below(s.size());
          const std::size_t n = 1 + r.below(std::min<std::size_t>(s.size() - from, 256));
          s.insert(at, s.substr(from, n));
        }
        break;
      case 5:
        if (!pool.empty()) {
          const std::string& other = pool[r.below(pool.size())];
          s = s.substr(0, at) + other.substr(r.below(other.size() + 1));
        }
        break;
      case 6:
        s.resize(r.below(s.size() + 1));
        break;
      case 7:
        s.insert(at, kTokens[r.below(std::size(kTokens))]);
        break;
      default: {  // replace a run of digits by a number token
        const auto d = s.find_first_of("0123456789", at);
        if (d == std::string::npos) break;
        const auto e = s.find_first_not_of("0123456789", d);
        s.replace(d, (e == std::string::npos ? s.size() : e) - d, kTokens[3 + r.below(7)]);
        break;
      }
    }
  }
  if (s.size() > max_len) s.resize(max_len);
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int usage(const char* prog) {
  std::fprintf(stderr, "usage: %s [--mutate N] [--seconds S] [--seed X] [--max-len B] [--timeout T] PATH...\n", prog);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t mutations = 0, seed = 1;
  double seconds = 0;
  std::size_t max_len = 1 << 16;
  unsigned timeout = 10;
  std::vector<fs::path> files;
  if (const char* s = std::getenv("DIASPORA_FUZZ_SEED")) seed = std::strtoull(s, nullptr, 10);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (a == "--mutate" || a == "--seconds" || a == "--seed" || a == "--max-len" || a == "--timeout") {
      const char* v = value();
      if (!v) return usage(argv[0]);
      if (a == "--mutate") mutations = std::strtoull(v, nullptr, 10);
      else if (a == "--seconds") seconds = std::strtod(v, nullptr);
      else if (a == "--seed") seed = std::strtoull(v, nullptr, 10);
      else if (a == "--timeout") timeout = static_cast<unsigned>(std::strtoul(v, nullptr, 10));
      else max_len = std::strtoull(v, nullptr, 10);
    } else if (a.starts_with("--")) {
      return usage(argv[0]);
    } else if (fs::is_directory(a)) {
      std::vector<fs::path> in;
      for (const auto& e : fs::directory_iterator(a))
        if (e.is_regular_file()) in.push_back(e.path());
      std::sort(in.begin(), in.end());
      files.insert(files.end(), in.begin(), in.end());
    } else if (fs::is_regular_file(a)) {
      files.emplace_back(a);
    } else {
      std::fprintf(stderr, "%s: %s: no such file or directory\n", argv[0], a.c_str());
      return 2;
    }
  }
  const char* dir = std::getenv("DIASPORA_FUZZ_CRASH_DIR");
  const std::string name = fs::path(argv[0]).filename().string();
  std::snprintf(g_crash_path, sizeof g_crash_path, "%s/crash-%s-%llu", dir && *dir ? dir : ".", name.c_str(),
                static_cast<unsigned long long>(seed));
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) ::signal(sig, on_fatal_signal);
  if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(save_current);
  ::signal(SIGALRM, on_alarm);
  auto run = [&](const std::string& input) {
    g_current = &input;
    ::alarm(timeout);
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(input.data()), input.size());
    ::alarm(0);
    g_current = nullptr;
  };

  std::vector<std::string> pool;
  for (const auto& f : files) {
    pool.push_back(read_all(f));
    run(pool.back());
  }
  const auto start = std::chrono::steady_clock::now();
  Rng rng{seed};
  std::uint64_t ran = 0;
  std::string input;
  for (; ran < mutations; ++ran) {
    if (seconds > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds) break;
    input = pool.empty() ? std::string() : pool[rng.below(pool.size())];
    mutate(input, pool, rng, max_len);
    run(input);
  }
  std::printf("%s: %zu inputs replayed, %llu mutated inputs run (seed %llu) in %.1f s, no finding\n", name.c_str(),
              files.size(), static_cast<unsigned long long>(ran), static_cast<unsigned long long>(seed),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}
