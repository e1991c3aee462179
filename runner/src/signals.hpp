// SIGINT/SIGTERM for `diaspora run` (core's signal pipe, diaspora/signal_pipe.hpp): the
// first signal wakes the loop through the pipe (it stops the run gracefully; the loop
// compares signals_received()), a second kills every process group the runner started and
// exits at once, from the handler.
//
// Thread safety: install_signal_handlers() once from the main thread; track_group() from
// the runner thread (lock-free: the handler reads the table).
#pragma once

#include <sys/types.h>

namespace diaspora::runner {

/// Records (add) or forgets a process group the second signal must kill.
void track_group(pid_t pgid, bool add);

}  // namespace diaspora::runner
