// SIGINT/SIGTERM for `diaspora run`: the first signal wakes the loop (it stops the run
// gracefully), a second kills every process group the runner started and exits at once.
// The handler writes to a self-pipe and saves errno.
//
// Thread safety: install once from the main thread; track_group() from the runner thread
// (lock-free: the handler reads the table).
#pragma once

#include <sys/types.h>

namespace diaspora::runner {

/// How many SIGINT/SIGTERM have arrived.
int signals_received();
/// The write end of the pipe the handler wakes the loop through (-1: none).
void set_signal_wake_fd(int fd);
/// Records (add) or forgets a process group the second signal must kill.
void track_group(pid_t pgid, bool add);

}  // namespace diaspora::runner
