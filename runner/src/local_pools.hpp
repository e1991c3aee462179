// The local sites' worker pools (`engine: local`): one `diaspora-run __worker` process per
// slot (worker.hpp), respawned when it dies; commands and rehearsal jobs run as processes
// of their own on the slot (a process group each, a progress pipe on fd 3). Every process
// started here gets SIGKILL (a rehearsal job SIGTERM: it checkpoints) when the runner
// dies, so a killed runner leaves nothing computing behind it.
//
// Thread safety: the runner thread.
#pragma once

#include <boost/json/object.hpp>

#include <string>

#include "action_log.hpp"
#include "context.hpp"
#include "lifecycle.hpp"
#include "rehearsal_jobs.hpp"
#include "sites.hpp"
#include "store.hpp"

namespace diaspora::runner {

class LocalPools {
 public:
  LocalPools(Context& ctx, InstanceStore& store, Sites& sites, Lifecycle& lifecycle, ActionLog& actions, RehearsalJobs& jobs)
      : ctx_(ctx), store_(store), sites_(sites), lifecycle_(lifecycle), actions_(actions), jobs_(jobs) {}

  /// Starts the slot's worker process (its channel on fd 3). Throws diaspora::Error.
  void spawn_worker(Site& s, Slot& slot);
  /// Sends the "run" message of a built-in kind's attempt to the slot's worker.
  bool start_kind(int ii, int ai, Site& s, Slot& slot, const boost::json::object& run);
  /// Spawns a command or rehearsal job attempt on the slot.
  bool start_command(int ii, int ai, Site& s, Slot& slot);
  void stop(Site& s, Slot& slot);
  void pause(Site& s, Slot& slot, bool paused);
  std::string kill_worker(Site& s, Slot& slot);
  void hang(Site& s, Slot& slot);
  bool request_checkpoint(Site& s, Slot& slot);

  /// Lines of a command's progress pipe (docs/run.md, "Commands").
  void on_command_line(Slot& slot, const std::string& line);
  /// Every exited child: a worker (its attempt lost, the worker respawned) or a command
  /// (its attempt done or failed, with the last line of its stderr as the reason).
  void reap();
  /// Workers whose respawn time has come are started again; commands get the runner's
  /// heartbeat while they are not stopped.
  void tick();
  /// At the end of the run: channels closed (workers exit), every process waited for,
  /// killed after 2 s (a rehearsal job writing its checkpoint: after its drain deadline).
  void shutdown();

 private:
  void on_exit(Site& s, Slot& slot, bool worker, int status);

  Context& ctx_;
  InstanceStore& store_;
  Sites& sites_;
  Lifecycle& lifecycle_;
  ActionLog& actions_;
  RehearsalJobs& jobs_;
};

}  // namespace diaspora::runner
