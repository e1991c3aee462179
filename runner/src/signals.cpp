#include "signals.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "diaspora/runner.hpp"

namespace diaspora::runner {

namespace {

std::atomic<int> g_signals{0};
std::atomic<int> g_wake_write{-1};
constexpr int kMaxGroups = 4096;
std::atomic<pid_t> g_groups[kMaxGroups];  // live process groups, for the second signal

void on_signal(int) {
  const int saved = errno;
  const int n = g_signals.fetch_add(1) + 1;
  if (n >= 2) {
    for (auto& g : g_groups) {
      const pid_t p = g.load();
      if (p > 0) ::kill(-p, SIGKILL);
    }
    ::_exit(130);
  }
  if (const int fd = g_wake_write.load(); fd >= 0) {
    const char c = 's';
    [[maybe_unused]] auto r = ::write(fd, &c, 1);
  }
  errno = saved;
}

}  // namespace

int signals_received() { return g_signals.load(); }

void set_signal_wake_fd(int fd) { g_wake_write.store(fd); }

void track_group(pid_t pgid, bool add) {
  if (pgid <= 0) return;
  for (auto& g : g_groups) {
    pid_t expect = add ? 0 : pgid;
    if (g.compare_exchange_strong(expect, add ? pgid : 0)) return;
  }
}

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

}  // namespace diaspora::runner
