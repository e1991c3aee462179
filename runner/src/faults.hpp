// The fault injector: the spec's faults, each at its time (docs/run.md, "Faults").
// slow-site runs a site's processes on a duty cycle (SIGSTOP/SIGCONT every 100 ms, so it
// runs 1/factor of the time) for `lasts`; kill-worker kills the worker (or command)
// running the oldest live attempt there; hang-task stops one from working and
// heartbeating; slow-task runs one attempt's worker on the duty cycle (a straggler) until
// that attempt ends or for `lasts` (these three wait, armed, for the first attempt to run
// there when none does at their time); stop-relay stops the embedded relay for `lasts`. Each fault records what
// it hit, for the report's reaction times.
//
// Thread safety: the runner thread.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "context.hpp"
#include "relay_control.hpp"
#include "sites.hpp"
#include "slot_control.hpp"
#include "store.hpp"

namespace diaspora::runner {

struct Fault {
  const FaultSpec* spec = nullptr;
  double start_t = -1, end_t = -1;
  bool done = false;
  bool armed = false;  ///< kill-worker / hang-task / slow-task due, waiting for an attempt to run there
  InstanceStore::Ref slowed{-1, -1};  ///< slow-task: the attempt it slows
  double next_toggle = 0;             ///< slow-task: the duty cycle's next switch
  bool stopped_phase = false;
  std::string target;                            ///< worker, instance or site it hit
  std::vector<std::pair<int, std::size_t>> hit;  ///< (instance, attempts it had then)
  std::string note;
};

class FaultInjector {
 public:
  /// `relay` is nullptr when the relay is not embedded (stop-relay has no effect then).
  FaultInjector(Context& ctx, InstanceStore& store, Sites& sites, SlotControl& control, RelayControl* relay);

  /// Starts the faults due by now and ends those whose time is over.
  void tick();
  /// The slow-site and slow-task duty cycles: pauses or resumes the slowed processes.
  void duty_cycle();
  /// Ends every fault still in force (the run is over): slowed sites run again; a fault
  /// still armed (nothing ran where it aims) is done with a note saying it had no effect.
  void end_all();
  /// Starts a stopped relay again (the spool must drain into it): true when it runs.
  bool restart_relay();
  /// Seconds until the next duty-cycle toggle (at most `cap`).
  double next_toggle(double cap) const;
  const std::vector<Fault>& all() const { return faults_; }

 private:
  void begin(Fault& f, double t);
  /// Ends a slow-task: its worker runs at full speed again.
  void end_slow_task(Fault& f, const std::string& why);
  InstanceStore::Ref oldest_running(const std::string& site, const std::optional<std::string>& task) const;

  Context& ctx_;
  InstanceStore& store_;
  Sites& sites_;
  SlotControl& control_;
  RelayControl* relay_;
  std::vector<Fault> faults_;
  bool relay_retry_said_ = false;
};

}  // namespace diaspora::runner
