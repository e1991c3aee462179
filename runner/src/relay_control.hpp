// The relay as the stop-relay fault sees it: stopped without holding the runner's loop
// (the stop drains acks and syncs the log on a thread of its own), started again on the
// same port when that is done. EmbeddedRelay (embedded_relay.hpp) is the real one.
//
// Thread safety: the runner thread.
#pragma once

#include <string>

namespace diaspora::runner {

class RelayControl {
 public:
  virtual ~RelayControl() = default;
  /// Starts stopping the relay and returns at once.
  virtual void stop_async() = 0;
  /// Is it serving (not stopped, not stopping)?
  virtual bool running() const = 0;
  /// Starts it again; false, with the reason in *why, while it cannot yet (its stop has
  /// not finished, or the port cannot be bound).
  virtual bool try_start(std::string* why) = 0;
};

}  // namespace diaspora::runner
