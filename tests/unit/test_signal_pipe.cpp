// Core's signal pipe (diaspora/signal_pipe.hpp), the one signal set-up of diaspora run,
// diaspora exec and diaspora-train: a raised signal reaches the hook with its count and the
// pipe with its number, errno survives the handler, a wake is a 0, and the pipe never blocks.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <thread>

#include "diaspora/signal_pipe.hpp"

namespace {

std::atomic<int> g_hook_sig{0}, g_hook_count{0};

void hook(int sig, int count) {
  g_hook_sig.store(sig);
  g_hook_count.store(count);
  errno = EIO;  // a hook that changes errno must not change the interrupted code's
}

bool readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

}  // namespace

TEST(SignalPipe, SignalsReachTheHookAndThePipeAndErrnoSurvives) {
  diaspora::install_signal_pipe({SIGUSR2, SIGWINCH}, hook);
  const int fd = diaspora::signal_pipe_fd();
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(diaspora::drain_signal_pipe().empty());  // nothing yet, and no block
  const int before = diaspora::signals_received();

  // (A ThreadSanitizer build may run the handler late, at the next call it intercepts: the
  // poll below, so the checks of what the handler did follow it.)
  errno = ENOENT;
  ASSERT_EQ(::raise(SIGUSR2), 0);
  EXPECT_EQ(errno, ENOENT);
  ASSERT_TRUE(readable(fd, 1000));
  EXPECT_EQ(g_hook_sig.load(), SIGUSR2);
  EXPECT_EQ(g_hook_count.load(), before + 1);
  ASSERT_EQ(::raise(SIGWINCH), 0);
  ASSERT_TRUE(readable(fd, 1000));
  EXPECT_EQ(diaspora::signals_received(), before + 2);
  EXPECT_EQ(diaspora::drain_signal_pipe(), (std::vector<int>{SIGUSR2, SIGWINCH}));
  EXPECT_FALSE(readable(fd, 0));

  // A wake from another thread is a 0 and counts as no signal.
  std::thread([] { diaspora::wake_signal_pipe(); }).join();
  ASSERT_TRUE(readable(fd, 1000));
  EXPECT_EQ(diaspora::drain_signal_pipe(), std::vector<int>{0});
  EXPECT_EQ(diaspora::signals_received(), before + 2);

  // Installed again: the same pipe, the new hook (none here); SIGPIPE ignored all along.
  diaspora::install_signal_pipe({SIGUSR2});
  EXPECT_EQ(diaspora::signal_pipe_fd(), fd);
  g_hook_sig.store(0);
  ASSERT_EQ(::raise(SIGUSR2), 0);
  ASSERT_TRUE(readable(fd, 1000));
  EXPECT_EQ(g_hook_sig.load(), 0);
  EXPECT_EQ(diaspora::drain_signal_pipe(), std::vector<int>{SIGUSR2});
  struct sigaction old {};
  ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &old), 0);
  EXPECT_EQ(old.sa_handler, SIG_IGN);
  signal(SIGUSR2, SIG_DFL);
  signal(SIGWINCH, SIG_DFL);
}
