// --resume: the runner's state rebuilt from the relay's log. A run whose runner was killed
// left its events in the relay's log (and the rest in the plugin's spool, which the plugin
// replays when it opens); reading the workflow's events topic back tells which task
// instances completed and how many attempts each had, so that a resumed run does not rerun
// finished work.
//
// Thread safety: plain functions, runner thread.
#pragma once

#include <boost/json/object.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>

namespace diaspora::runner {

/// What an earlier run of the workflow did, per instance id ("burn.3").
struct PriorRun {
  std::set<std::string> completed;           ///< instances with a completed attempt
  std::map<std::string, int> attempts;       ///< highest attempt number seen (started)
  std::map<std::string, long> submitted;     ///< per task name: highest instance index submitted
  std::uint64_t events = 0;                  ///< events read
};

/// Calls `each` with every event of `topic` on the relay at `url`, in log order (subscribes
/// from the earliest offset and reads until the relay has nothing more for a second, at
/// most `limit_s`). Returns the number of events read.
/// Throws diaspora::Error (RelayClientError) when the relay cannot be read.
std::uint64_t read_topic(const std::string& url, const std::filesystem::path& ca_file, const std::filesystem::path& token_file,
                         const std::string& topic, double limit_s, const std::function<void(const boost::json::object&)>& each);

/// read_topic() folded into what the earlier run did.
PriorRun read_prior_run(const std::string& url, const std::filesystem::path& ca_file,
                        const std::filesystem::path& token_file, const std::string& topic, double limit_s = 120);

/// The instance id a task event's subject names: "burn.3@copy1" -> "burn.3".
std::string instance_of(const std::string& hook_id);

}  // namespace diaspora::runner
