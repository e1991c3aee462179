// The record of every action the run received (the report's `actions`): when it came,
// what it asked, and how it ended. acknowledge() tells the plugin the outcome (which
// publishes org.diaspora.action.done) and closes the record.
//
// Thread safety: the runner thread.
#pragma once

#include <string>
#include <vector>

#include "context.hpp"

namespace diaspora::runner {

struct ActionRecord {
  std::string id, kind, task, site, target, reason, origin;
  double received_t = 0, done_t = -1;
  std::string outcome = "pending";  ///< pending, done, failed
  std::string message;
};

class ActionLog {
 public:
  explicit ActionLog(Context& ctx) : ctx_(ctx) {}
  /// Records a received action; returns the record.
  ActionRecord& add(ActionRecord r);
  /// The action `id` was carried out (ok) or refused: the plugin is told, the record
  /// closed. An empty id (an attempt no action asked for) does nothing.
  void acknowledge(const std::string& id, bool ok, const std::string& message);
  const std::vector<ActionRecord>& all() const { return records_; }

 private:
  Context& ctx_;
  std::vector<ActionRecord> records_;
};

}  // namespace diaspora::runner
