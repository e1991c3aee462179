#include "signals.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>

#include "diaspora/runner.hpp"
#include "diaspora/signal_pipe.hpp"

namespace diaspora::runner {

namespace {

constexpr int kMaxGroups = 4096;
std::atomic<pid_t> g_groups[kMaxGroups];  // live process groups, for the second signal

// In the handler: a second signal kills every group at once (async-signal-safe calls only).
void on_signal(int, int count) {
  if (count < 2) return;
  for (auto& g : g_groups) {
    const pid_t p = g.load();
    if (p > 0) ::kill(-p, SIGKILL);
  }
  ::_exit(130);
}

}  // namespace

void track_group(pid_t pgid, bool add) {
  if (pgid <= 0) return;
  for (auto& g : g_groups) {
    pid_t expect = add ? 0 : pgid;
    if (g.compare_exchange_strong(expect, add ? pgid : 0)) return;
  }
}

void install_signal_handlers() { install_signal_pipe({SIGINT, SIGTERM}, on_signal); }

}  // namespace diaspora::runner
