// The remote sites (`engine: dask`, `engine: slurm`; remote.hpp): each attempt of a
// built-in kind there is one launch through the site's engine of a one-shot worker that
// connects back to the runner's listener and then speaks the local workers' protocol. A
// slot holds the launch out for its attempt; the connection closing before "done", or the
// engine ending the launch before the worker connected, fails the attempt.
//
// Thread safety: the runner thread.
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <functional>
#include <memory>
#include <string>

#include "action_log.hpp"
#include "context.hpp"
#include "lifecycle.hpp"
#include "remote.hpp"
#include "sites.hpp"
#include "store.hpp"

namespace diaspora::runner {

class RemoteSites {
 public:
  RemoteSites(Context& ctx, InstanceStore& store, Sites& sites, Lifecycle& lifecycle, ActionLog& actions)
      : ctx_(ctx), store_(store), sites_(sites), lifecycle_(lifecycle), actions_(actions) {}

  /// Starts each remote site's launcher (a Dask bridge, Slurm's sbatch) and the listener
  /// its workers connect to. `document` is the run's spec (the SPANK plugin's copy is
  /// written from it). Throws diaspora::Error with what to fix.
  void start(const boost::json::value& document);
  /// "HOST:PORT" remote workers connect to ("" when no site is remote).
  std::string address() const { return listener_ ? listener_->address() : std::string(); }
  /// The listener's fds, to poll.
  std::vector<int> fds() const;

  /// Launches a worker for attempt (ii, ai) with its "run" message (sent when the worker
  /// is ready: on_ready()).
  bool launch(int ii, int ai, Site& s, Slot& slot, boost::json::object run);
  /// The slot's worker said "ready": its attempt begins (the run message is sent).
  void on_ready(Site& s, Slot& slot);
  /// Accepts connections and hands each hello to its slot.
  void service();
  /// A one-shot worker finished its attempt (done or failed): its launch is released.
  void release(Site& s, Slot& slot);
  /// The slot's worker is gone without finishing: its attempt is lost.
  void lost(Site& s, Slot& slot, const std::string& why);
  /// What the engines say: a launch that ended before its worker connected failed.
  void tick();
  void stop(Site& s, Slot& slot);
  void pause(Site& s, Slot& slot, bool paused);
  std::string kill_worker(Site& s, Slot& slot);
  /// Withdraws every launch still out and lets go of each engine (up to 15 s).
  void shutdown();
  /// Called when a slot's worker has connected, to read the lines that came with its hello.
  std::function<void(Site&, Slot&)> on_connect;

 private:
  std::filesystem::path write_spank_spec(const boost::json::value& document, const std::string& site);
  void on_hello(Hello h);
  static void signal(const Slot& slot, int sig);

  Context& ctx_;
  InstanceStore& store_;
  Sites& sites_;
  Lifecycle& lifecycle_;
  ActionLog& actions_;
  std::unique_ptr<WorkerListener> listener_;
};

}  // namespace diaspora::runner
