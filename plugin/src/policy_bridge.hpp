// Between the plugin's record stream and the resilience engine: each record's signals go
// to the PolicyEngine (resilience/), and each decision it makes becomes an
// org.diaspora.anomaly.predicted payload and an Action for the action desk.
//
// Internal to the plugin. Thread safety: none; the plugin calls it under its feed lock, in
// record order (the same lock as the task tracker).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "action_desk.hpp"
#include "diaspora/payloads.hpp"
#include "record.hpp"
#include "tracker.hpp"

namespace diaspora {
struct WorkflowSpec;
namespace resilience {
class PolicyEngine;
struct Decision;
}  // namespace resilience
}  // namespace diaspora

namespace diaspora::plugin {

class PolicyBridge {
 public:
  /// Builds the spec's policies. Throws diaspora::Error when they cannot be built.
  explicit PolicyBridge(const WorkflowSpec& spec);
  ~PolicyBridge();
  PolicyBridge(const PolicyBridge&) = delete;
  PolicyBridge& operator=(const PolicyBridge&) = delete;

  /// A record, after the tracker has seen it (`res` is what the tracker derived).
  void feed(const RecordView& r, const TaskTracker::Result& res);
  /// One value of a signal ("task.step_time", ...); non-finite values are ignored.
  void observe(std::string_view signal, std::string_view task, std::string_view site, double value,
               std::int64_t time_us);
  /// Time passes: heartbeat silence, deadline forecasts.
  void tick(std::int64_t now_us);
  /// The engine's normals as text, and seeding them from a file (resilience::PolicyEngine's
  /// export_normals / import_normals_file; the latter throws diaspora::Error naming the file).
  std::string export_normals() const;
  std::size_t import_normals_file(const std::filesystem::path& file);
  /// The decisions made since the last call.
  std::vector<resilience::Decision> take_decisions();

  /// What a decision publishes about what was seen.
  static events::AnomalyPredicted anomaly_of(const resilience::Decision& d);
  /// What a decision asks of the engine, with action id `id`.
  static Action action_of(const resilience::Decision& d, std::string id);

 private:
  std::unique_ptr<resilience::PolicyEngine> engine_;
  std::vector<resilience::Decision> decisions_;
};

}  // namespace diaspora::plugin
