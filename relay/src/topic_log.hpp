// The relay's durable topic log: per-topic append-only segment files of framed records
// (log_record.hpp), group commit by one writer thread, retention, a sparse offset index,
// crash recovery, and producer/event de-duplication that survives restarts.
//
// Internal to the relay (not installed). Thread model:
//   * append() may be called from any thread; it only enqueues. The writer thread
//     writes every pending batch; with fsync always the syncer threads then sync each
//     touched file once (group commit; three syncers, so one group's sync can start while
//     another's runs). Completions run in append order, on the writer thread or a syncer
//     thread: keep them short (e.g. post to a strand). The commit listener likewise.
//   * read() / committed_offset() / topics() may be called from any thread
//     concurrently with appends; they only see committed (acked) records.
//
// On-disk layout (data_dir):
//   topics/<topic>/<base offset, 20 digits zero-padded>.log   segments, oldest first
//   groups/<group>.json                                       consumer-group offsets (consumer_groups.hpp)
//   .lock                                                     flock()ed by the one LogStore using data_dir
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "diaspora/error.hpp"
#include "store.hpp"

namespace diaspora::relay {

/// When a batch counts as durable.
struct FsyncPolicy {
  enum class Mode { always, interval, never };
  Mode mode = Mode::always;           ///< always: ack only after fdatasync (default)
  std::chrono::milliseconds interval{100};  ///< for Mode::interval
  /// Parses "always", "never" or "interval:<ms>". Throws Error on anything else.
  static FsyncPolicy parse(std::string_view text);
};

struct LogOptions {
  std::filesystem::path data_dir;           ///< topics live in data_dir/topics/<topic>/
  FsyncPolicy fsync;
  std::uint64_t segment_bytes = 64ull << 20;  ///< roll to a new segment past this size
  std::uint64_t retention_bytes = 0;          ///< per topic; 0 = unlimited
  std::chrono::seconds retention_age{0};      ///< 0 = unlimited
  std::vector<TopicRetention> retention_by_topic;  ///< first match wins; the two above for the others
  std::uint32_t index_interval_bytes = 4096;  ///< one sparse index entry per this many bytes
  std::size_t dedupe_window = 1u << 18;       ///< remembered (source, id) keys per topic (32 B each); 0 = no event dedupe
  std::size_t max_groups = 10000;             ///< consumer groups kept; a commit that would add one more throws GroupLimitError
  std::size_t max_topics = 10000;             ///< topics kept; an append that would create one more fails (too_many_topics)
  /// Fault injection for tests: when set, called instead of ::fdatasync(fd) on a segment
  /// (returns 0 or -1 with errno set, like fdatasync). Called from the syncer threads.
  std::function<int(int fd)> segment_sync;
};

/// The store of all topics under one data directory (the embedded storage backend; the
/// contract of each method is Store's, store.hpp; what is particular to it is said here).
class LogStore final : public Store {
 public:

  /// Opens (creating if needed) data_dir, recovers every topic (verifying CRCs and
  /// truncating a torn tail) and starts the writer thread. Throws Error when the
  /// directory cannot be used.
  explicit LogStore(LogOptions options);
  /// Stops the writer after writing and syncing everything already appended.
  ~LogStore() override;
  LogStore(const LogStore&) = delete;
  LogStore& operator=(const LogStore&) = delete;

  /// The batch is durable per the fsync policy: with `always`, after fdatasync of each
  /// file it touched. After an fdatasync of one of a topic's files failed, appends to that
  /// topic fail until the store is reopened.
  void append(std::string topic, std::string producer_id, std::uint64_t seq, std::vector<AppendRecord> records,
              Completion done) override;
  /// Offsets lost to a truncated corrupt segment are skipped.
  std::size_t visit(const std::string& topic, std::uint64_t from, std::size_t max_records, std::size_t max_bytes,
                    const std::function<void(const RecordRef&)>& fn) const override;
  std::uint64_t committed_offset(const std::string& topic) const override;
  std::uint64_t first_offset(const std::string& topic) const override;
  std::uint64_t offset_at_time(const std::string& topic, std::int64_t time_us) const override;
  std::vector<std::string> topics() const override;
  std::optional<TopicInfo> info(const std::string& topic) const override;
  void set_commit_listener(CommitListener listener) override;

  /// fsync durations in seconds since start.
  FsyncStats fsync_stats() const override;

  /// Applies retention now (also done by the writer after rolls and periodically).
  void enforce_retention();

  /// Consumer-group offsets, persisted atomically in data_dir/groups/<group>.json;
  /// commit_group_offset blocks for two fsyncs.
  void commit_group_offset(const std::string& group, const std::string& topic, std::uint64_t offset) override;
  std::optional<std::uint64_t> group_offset(const std::string& group, const std::string& topic) const override;
  std::vector<std::tuple<std::string, std::string, std::uint64_t>> group_offsets() const override;

  /// Verifies every record of every topic (CRC and offsets) and returns the problems
  /// found (empty = clean). Used by tests and `diaspora-relay --verify`.
  std::vector<std::string> verify() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> self_;
};

}  // namespace diaspora::relay
