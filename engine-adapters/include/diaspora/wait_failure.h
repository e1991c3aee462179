/* What failed a process that ended with wait status `status` (waitpid's), for
 * diaspora_task_info.failure (ABI 1.2): a non-zero exit status, or a signal the program
 * raises on itself (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGSYS, SIGTRAP: its own bug),
 * is the task's own error, which a retry repeats; any other signal (SIGKILL from the
 * out-of-memory killer or a lost node, SIGTERM from a cancellation or a time limit, SIGHUP
 * from a lost session) lost the attempt. Shared by diaspora exec and the SPANK plugin
 * (C and C++). Pure; any thread. */
#ifndef DIASPORA_WAIT_FAILURE_H
#define DIASPORA_WAIT_FAILURE_H

#include <signal.h>
#include <sys/wait.h>

#include "diaspora/plugin.h"

static inline int diaspora_failure_of_wait_status(int status) {
  if (WIFSIGNALED(status)) {
    switch (WTERMSIG(status)) {
      case SIGSEGV:
      case SIGABRT:
      case SIGBUS:
      case SIGFPE:
      case SIGILL:
      case SIGSYS:
      case SIGTRAP: return DIASPORA_FAILURE_ERROR;
      default: return DIASPORA_FAILURE_LOST;
    }
  }
  return WIFEXITED(status) && WEXITSTATUS(status) != 0 ? DIASPORA_FAILURE_ERROR : DIASPORA_FAILURE_UNKNOWN;
}

#endif
