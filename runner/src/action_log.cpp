#include "action_log.hpp"

namespace diaspora::runner {

ActionRecord& ActionLog::add(ActionRecord r) {
  records_.push_back(std::move(r));
  return records_.back();
}

void ActionLog::acknowledge(const std::string& id, bool ok, const std::string& message) {
  if (id.empty()) return;
  ctx_.hooks.action_result(id, ok, message);
  for (auto& r : records_)
    if (r.id == id && r.outcome == "pending") {
      r.outcome = ok ? "done" : "failed";
      r.message = message;
      r.done_t = ctx_.now();
    }
}

}  // namespace diaspora::runner
