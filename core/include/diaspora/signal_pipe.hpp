// Signals for Diaspora's programs (diaspora run, diaspora exec, diaspora-train): one
// handler that counts the signal, calls the program's async-signal-safe hook and writes the
// signal's number to a self-pipe the program polls, so that a signal never runs program
// logic inside the handler. The handler saves and restores errno.
//
// Thread safety: install_signal_pipe() once per process, from the main thread, before the
// program starts threads that could take the signal's mask. signals_received() and
// wake_signal_pipe() from any thread (and inside a hook); drain_signal_pipe() from the one
// thread that polls the pipe.
#pragma once

#include <initializer_list>
#include <vector>

namespace diaspora {

/// Runs inside the signal handler, before the pipe is written: async-signal-safe calls only
/// (kill, write, _exit, atomics). `count` is how many watched signals have arrived, this one
/// included.
using SignalHook = void (*)(int signal, int count);

/// Routes `signals` to the self-pipe (a non-blocking, close-on-exec pipe made here; the
/// handler is installed with SA_RESTART, so only calls like poll() see EINTR) and
/// ignores SIGPIPE (a write to a closed socket or pipe then fails with EPIPE instead of
/// killing the process). `hook` (may be null) runs first in the handler. Calling it again
/// adds signals and replaces the hook. Throws diaspora::Error when the pipe cannot be made.
void install_signal_pipe(std::initializer_list<int> signals, SignalHook hook = nullptr);

/// The pipe's read end, to poll for POLLIN; -1 before install_signal_pipe(). Any thread.
int signal_pipe_fd();

/// Writes byte 0 ("wake up", not a signal) to the pipe, so that a poll on it returns: for a
/// thread that hands the polling thread work. Any thread; async-signal-safe; nothing happens
/// before install_signal_pipe().
void wake_signal_pipe();

/// The signal numbers written since the last call, oldest first, 0 for each wake; never
/// blocks (empty when nothing is waiting). From the thread that polls the pipe.
std::vector<int> drain_signal_pipe();

/// How many watched signals have arrived since install_signal_pipe(). Any thread.
int signals_received();

}  // namespace diaspora
