// The live terminal view (stdout a terminal): a status block under the log lines, redrawn
// twice a second: the run's counts and event rate, each site's workers and health
// (diaspora::site_health, the console's definition), the last three actions. A log line
// erases the block, is written, and the block is drawn again below it.
//
// Whether or not the block is drawn, the relay session is watched (a quarter of a second
// apart): a log line when the plugin loses it, one for each new reason it cannot get it
// back (a token refused as expired, a certificate that ran out, a relay that is down), and
// one when it is back.
//
// Thread safety: the runner thread.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <set>
#include <string>

#include "action_log.hpp"
#include "context.hpp"
#include "sites.hpp"
#include "store.hpp"

namespace diaspora::runner {

class LiveView {
 public:
  /// `events_acked` reads the plugin's acknowledged-event counter (0 before it is open)
  /// and whether it holds a relay session; `last_error` its last error (diaspora_last_error).
  LiveView(const Context& ctx, const InstanceStore& store, const Sites& sites, const ActionLog& actions, std::ostream& out,
           std::function<std::uint64_t(bool*)> events_acked, std::function<std::string()> last_error)
      : ctx_(ctx), store_(store), sites_(sites), actions_(actions), out_(out),
        events_acked_(std::move(events_acked)), last_error_(std::move(last_error)) {}

  /// Writes one log line: "[   12.3s] text" (the block kept below it when enabled).
  void say(const std::string& line);
  /// Redraws the block when it is due; says what became of the relay session.
  void tick();
  /// Removes the block (the run is over).
  void erase();

 private:
  void draw();
  void watch_relay(double t);

  const Context& ctx_;
  const InstanceStore& store_;
  const Sites& sites_;
  const ActionLog& actions_;
  std::ostream& out_;
  std::function<std::uint64_t(bool*)> events_acked_;
  std::function<std::string()> last_error_;
  double relay_next_ = 0, relay_down_since_ = -1;  // -1: the session is up (or never was yet)
  std::set<std::string> relay_said_;                // the reasons said while it is down
  int lines_ = 0;
  double next_ = 0, events_t_ = 0, rate_ = 0;
  std::uint64_t events_ = 0;
};

}  // namespace diaspora::runner
