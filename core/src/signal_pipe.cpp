#include "diaspora/signal_pipe.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "diaspora/error.hpp"

namespace diaspora {

namespace {

std::atomic<int> g_read{-1}, g_write{-1}, g_count{0};
std::atomic<SignalHook> g_hook{nullptr};

void write_byte(unsigned char b) {
  if (const int fd = g_write.load(); fd >= 0) {
    [[maybe_unused]] auto r = ::write(fd, &b, 1);
  }
}

extern "C" void on_signal(int sig) {
  const int saved = errno;
  const int n = g_count.fetch_add(1) + 1;
  if (SignalHook h = g_hook.load()) h(sig, n);
  write_byte(static_cast<unsigned char>(sig));
  errno = saved;
}

}  // namespace

void install_signal_pipe(std::initializer_list<int> signals, SignalHook hook) {
  if (g_read.load() < 0) {
    int fd[2];
    if (::pipe2(fd, O_CLOEXEC | O_NONBLOCK) != 0)
      throw Error(std::string("cannot make the signal pipe: ") + std::strerror(errno));
    g_read.store(fd[0]);
    g_write.store(fd[1]);
  }
  g_hook.store(hook);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;  // blocking calls go on; poll() still returns (EINTR)
  sigemptyset(&sa.sa_mask);
  for (int s : signals) ::sigaction(s, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

int signal_pipe_fd() { return g_read.load(); }

void wake_signal_pipe() { write_byte(0); }

std::vector<int> drain_signal_pipe() {
  std::vector<int> out;
  const int fd = g_read.load();
  if (fd < 0) return out;
  unsigned char buf[64];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
  return out;
}

int signals_received() { return g_count.load(); }

}  // namespace diaspora
