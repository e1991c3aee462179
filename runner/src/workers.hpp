// The processes behind the slots, local and remote, as one SlotControl: an attempt of a
// built-in kind goes to a local worker or a remote launch, a command or rehearsal job is
// spawned; the workers' messages (worker.hpp's protocol: ready, beat, checkpointed, done,
// failed) are read here for both, and the command progress pipes. The loop's poll() waits
// on all of them and on the wake pipe (signals, actions).
//
// Thread safety: the runner thread.
#pragma once

#include <boost/json/object.hpp>

#include <span>

#include "action_log.hpp"
#include "context.hpp"
#include "lifecycle.hpp"
#include "local_pools.hpp"
#include "rehearsal_jobs.hpp"
#include "remote_sites.hpp"
#include "slot_control.hpp"
#include "store.hpp"

namespace diaspora::runner {

class Workers final : public SlotControl {
 public:
  Workers(Context& ctx, InstanceStore& store, Sites& sites, Lifecycle& lifecycle, ActionLog& actions, RehearsalJobs& jobs);

  /// Starts every local site's workers and every remote site's launcher; logs the sites.
  /// Throws diaspora::Error.
  void start_sites(const boost::json::value& document);
  /// Waits up to `timeout_s` for every slot to be ready (the first tasks start at once).
  void wait_ready(double timeout_s, std::span<const int> wake_fds);

  bool start(int ii, int ai, Site& site, Slot& slot) override;
  void stop(Site& site, Slot& slot) override;
  void pause(Site& site, Slot& slot, bool paused) override;
  std::string kill_worker(Site& site, Slot& slot) override;
  void hang(Site& site, Slot& slot) override;
  bool request_checkpoint(Site& site, Slot& slot) override;

  /// Waits up to `timeout_s` (at most 0.1) for a message, a line, a connection or a byte on
  /// one of `wake_fds` (read off; a negative fd is left out), and serves what came; then
  /// reaps exited children.
  void poll(double timeout_s, std::span<const int> wake_fds);
  /// Respawns, command heartbeats, what the remote engines say.
  void tick();
  /// The end of the run: every process waited for (killed when it does not exit), every
  /// engine let go.
  void shutdown();

 private:
  /// The "run" message of a built-in kind's attempt (its resume step from its checkpoint).
  boost::json::object run_message(int ii, int ai) const;
  void read(Site& s, Slot& slot);
  void on_message(Site& s, Slot& slot, const boost::json::object& m);

  Context& ctx_;
  InstanceStore& store_;
  Sites& sites_;
  Lifecycle& lifecycle_;
  ActionLog& actions_;
  LocalPools local_;
  RemoteSites remote_;
};

}  // namespace diaspora::runner
