// Consumer-group offsets of the topic log: one JSON file per group,
//   groups/<group>.json   {"group": ..., "offsets": {topic: next offset}}
// replaced atomically (tmp + fsync + rename + fsync of the directory) on each commit.
//
// Internal to the relay. Thread safety: every member may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "topic_log.hpp"  // GroupLimitError

namespace diaspora::relay {

class ConsumerGroups {
 public:
  /// Loads every group file of `dir` (which must exist). A file that does not parse is
  /// ignored and reported through `log`; a leftover .json.tmp (an interrupted commit) is
  /// deleted. Throws std::filesystem::filesystem_error when `dir` cannot be read.
  ConsumerGroups(std::filesystem::path dir, std::size_t max_groups, std::function<void(const std::string&)> log);

  /// Stores `offset` as `group`'s next offset in `topic`, durably (two fsyncs). Throws
  /// GroupLimitError for a group that would be one more than max_groups, Error for a group
  /// or topic name that is not a valid_topic_name() or when the file cannot be written.
  void commit(const std::string& group, const std::string& topic, std::uint64_t offset);
  /// The offset `group` committed for `topic`, if any.
  std::optional<std::uint64_t> offset(const std::string& group, const std::string& topic) const;
  /// (group, topic, offset) for every committed offset.
  std::vector<std::tuple<std::string, std::string, std::uint64_t>> all() const;

 private:
  void load();

  std::filesystem::path dir_;
  std::size_t max_groups_;
  std::function<void(const std::string&)> log_;
  mutable std::mutex mu_;
  std::map<std::string, std::map<std::string, std::uint64_t>> groups_;  // guarded by mu_
  std::mutex write_mu_;  // serializes group file writes (and their read-modify-write)
};

}  // namespace diaspora::relay
