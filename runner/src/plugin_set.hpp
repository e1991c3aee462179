// The engine plugins of a run: one on the run's relay, and one more for each site with a
// relay of its own (sites[].relay: sites federated, docs/relay.md). Each attempt's hooks go
// to the plugin of the site it runs on, so a site's events reach its own relay and its
// policies act on them there while the link to the run's relay is down. A run without site
// relays has one plugin and every hook goes straight to it.
//
// An attempt is submitted before it has a site: while a run has site relays, its submission
// is held until the attempt is placed (its first hook with a site: started) or ends
// unplaced (cancelled: told to the run's plugin). An action delivered by two plugins (an
// operator's, sourced to both sites) is handed to the runner once; its result goes back to
// the plugin that delivered it first.
//
// Thread safety: as PluginBridge (the runner thread, except the plugins' callbacks).
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <boost/json/value.hpp>

#include "plugin_bridge.hpp"

namespace diaspora::runner {

class PluginSet final : public Hooks {
 public:
  /// `wake_fd`: written (one byte) when an action arrives at any of the plugins.
  explicit PluginSet(int wake_fd) : wake_fd_(wake_fd) {}

  /// Opens the run's plugin on `document`, then one for each of `sites` (site name, its
  /// plugin's document: the run's with that site's relay and a spool of its own). Throws
  /// diaspora::Error as PluginBridge::open, naming the site.
  void open(const std::filesystem::path& library, const boost::json::value& document,
            const std::vector<std::pair<std::string, boost::json::value>>& sites);
  /// The run's plugin's library (every plugin of the set loads the same one).
  const PluginLibrary& library() const { return bridges_.front()->library(); }
  /// How many plugins (1 + the sites with their own relay).
  std::size_t size() const { return bridges_.size(); }

  /// The actions every plugin delivered since the last call, each action id once.
  std::deque<diaspora_action> take_actions();
  /// The plugins' counters added up; connected and control_connected only when every
  /// plugin's is.
  diaspora_stats stats() const;
  /// The first plugin's last error that is not empty (site plugins' named by their site).
  std::string last_error() const;
  void stop_actions();
  /// PluginBridge::drain of each, within `timeout_s` in all; the counters added up.
  diaspora_stats drain(double timeout_s) const;
  /// Closes every plugin; the first status that is not DIASPORA_OK, else DIASPORA_OK.
  int close(int timeout_ms);
  /// PluginBridge::put_item through the plugin of `site` (the run's for a site without a
  /// relay of its own). Any thread, between open() and close().
  std::string put_item(const std::string& topic, const std::string& stream, long seq, const std::string& site,
                       const std::string& bytes, std::int64_t timeout_ms) const;

  // Hooks
  void task_submitted(const Attempt& a, const std::string& task_name, double deadline_s) override;
  void task_started(const Attempt& a, const std::string& worker) override;
  void task_progress(const Attempt& a, double progress, long step, std::span<const diaspora_metric_value> metrics) override;
  void task_heartbeat(const Attempt& a, std::span<const diaspora_metric_value> metrics) override;
  void task_progress_line(const Attempt& a, const ProgressLine& line) override;
  void task_completed(const Attempt& a) override;
  void task_failed(const Attempt& a, bool retryable, const std::string& reason) override;
  void task_cancelled(const Attempt& a, const std::string& reason) override;
  void data_arrived(const std::string& stream, long seq, long bytes, const std::string& uri, const std::string& checksum,
                    const std::string& site) override;
  void resource(const std::string& id, const char* kind, const char* state, const std::string& site,
                const std::string& metric, double value) override;
  void action_result(const std::string& action_id, bool ok, const std::string& message) override;

 private:
  // The plugin of `site` (the run's, index 0, for a site without a relay of its own).
  PluginBridge& of_site(const std::string& site);
  // The plugin the attempt's hooks go to; its held submission told first. `ends`: the
  // attempt's last hook (what is kept of it goes).
  PluginBridge& of_attempt(const Attempt& a, bool ends = false);

  int wake_fd_;
  std::vector<std::unique_ptr<PluginBridge>> bridges_;  // [0]: the run's relay
  std::vector<std::string> names_;                      // [0]: "", else the site
  std::map<std::string, std::size_t> site_plugin_;      // site -> index in bridges_
  struct Held {
    std::string task_name;
    double deadline_s = 0;
  };
  std::map<std::string, Held> held_;             // attempt key -> submission not told yet
  std::map<std::string, Held> submitted_;        // hook id -> its first submission (for the plugins told later)
  std::set<std::pair<std::size_t, std::string>> told_;  // (plugin, hook id) told of a submission
  std::map<std::string, std::size_t> placed_;    // attempt key -> the plugin told of it
  std::map<std::string, std::size_t> actions_;   // action id -> the plugin that delivered it
};

}  // namespace diaspora::runner
