// What the runner does to the processes behind a slot: start an attempt there, stop it,
// pause and resume it (the slow-site fault's duty cycle), kill its worker or hang it (the
// faults), ask it for a checkpoint. Workers (workers.hpp) does it to real processes, local
// and remote; unit tests of the decisions above it record the calls instead.
//
// Thread safety: the runner thread.
#pragma once

#include <string>

#include "sites.hpp"

namespace diaspora::runner {

class SlotControl {
 public:
  virtual ~SlotControl() = default;
  /// Starts attempt (ii, ai), already marked running on `slot` (Lifecycle::begin): sends
  /// a built-in kind to the worker, spawns a command or a rehearsal job, or launches a
  /// remote worker through the site's engine. False when it could not; the slot is free
  /// again and the attempt has ended as failed then.
  virtual bool start(int ii, int ai, Site& site, Slot& slot) = 0;
  /// Stops what runs the slot's attempt: killed (the worker is replaced when its exit is
  /// reaped), a remote launch withdrawn; a rehearsal job is told to checkpoint and stop,
  /// and the slot is draining until it exits.
  virtual void stop(Site& site, Slot& slot) = 0;
  /// SIGSTOP (paused) or SIGCONT every process behind the slot on this host.
  virtual void pause(Site& site, Slot& slot, bool paused) = 0;
  /// The kill-worker fault: kills the process running the slot's attempt. Returns "" when
  /// it was killed, else why it was out of reach.
  virtual std::string kill_worker(Site& site, Slot& slot) = 0;
  /// The hang-task fault: the attempt stops working and heartbeating without exiting.
  virtual void hang(Site& site, Slot& slot) = 0;
  /// Asks the slot's attempt for a checkpoint: a command gets SIGUSR1 (true at once); a
  /// worker is sent "checkpoint" and answers "checkpointed" later (false: it is gone).
  virtual bool request_checkpoint(Site& site, Slot& slot) = 0;
};

}  // namespace diaspora::runner
