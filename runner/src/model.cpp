#include "model.hpp"

namespace diaspora::runner {

std::string_view to_string(InstanceState s) {
  switch (s) {
    case InstanceState::pending: return "pending";
    case InstanceState::running: return "running";
    case InstanceState::awaiting: return "awaiting";
    case InstanceState::completed: return "completed";
    case InstanceState::failed: return "failed";
    case InstanceState::cancelled: return "cancelled";
  }
  return "?";
}

std::string_view to_string(Outcome o) {
  switch (o) {
    case Outcome::queued: return "queued";
    case Outcome::running: return "running";
    case Outcome::completed: return "completed";
    case Outcome::failed: return "failed";
    case Outcome::stopped: return "stopped";
    case Outcome::cancelled: return "cancelled";
  }
  return "?";
}

std::string worker_name(const std::string& site, int slot) { return site + "/worker-" + std::to_string(slot); }

}  // namespace diaspora::runner
