// ptycho-stream's source (docs/rehearsal.md, "ptycho-stream"): the scans a workflow
// announces with org.diaspora.data.arrived events on a relay, read back from the topic's
// durable log. Scan t is the file of the event of stream `dataset.stream` with seq t, so the
// order does not depend on when the scans arrived (a resumed or migrated job sees the same
// scans in the same order). Internal to the trainer; one thread (the rank's training loop).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "diaspora/client.hpp"
#include "diaspora/data_item.hpp"
#include "diaspora/trainer.hpp"

namespace diaspora {
class TopicReader;
}

namespace diaspora::rehearsal::detail {

class ScanFeed {
 public:
  /// Keeps the dataset settings; connects on the first wait_for().
  explicit ScanFeed(DatasetConfig d);
  ~ScanFeed();
  ScanFeed(const ScanFeed&) = delete;
  ScanFeed& operator=(const ScanFeed&) = delete;

  /// The local path of scan `seq`, waiting for its event: a file:// URI's path, or for a
  /// diaspora://TOPIC/OFFSET URI (a data item, docs/streaming.md) the item fetched from the
  /// relay, checked, into dataset.cache_dir. A relay that is down is retried every second
  /// meanwhile. nullopt when `stop` became non-zero first.
  /// @throws RehearsalError after dataset.wait seconds without it (naming the scans seen),
  ///         for an event whose URI is neither, or for an item the relay no longer holds
  ///         whole (its reason).
  std::optional<std::filesystem::path> wait_for(std::int64_t seq, const std::atomic<int>* stop);

 private:
  void take(const std::string& uri, std::int64_t seq, std::int64_t time_us);
  // Fetches the item announced for `seq` into the cache; false when the relay is away.
  bool fetch(std::int64_t seq);
  DatasetConfig d_;
  std::unique_ptr<TopicReader> reader_;
  std::map<std::int64_t, std::string> paths_;  ///< seq -> local path
  std::map<std::int64_t, data::ItemLocation> items_;  ///< seq -> where its item is, not fetched yet
  std::unique_ptr<RelayClient> fetcher_;  ///< the connection items are fetched over (a new one after an error)
  std::string last_error_;
};

}  // namespace diaspora::rehearsal::detail
