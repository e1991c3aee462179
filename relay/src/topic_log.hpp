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

namespace diaspora::relay {

/// When a batch counts as durable.
struct FsyncPolicy {
  enum class Mode { always, interval, never };
  Mode mode = Mode::always;           ///< always: ack only after fdatasync (default)
  std::chrono::milliseconds interval{100};  ///< for Mode::interval
  /// Parses "always", "never" or "interval:<ms>". Throws Error on anything else.
  static FsyncPolicy parse(std::string_view text);
};

/// commit_group_offset for a new group when LogOptions::max_groups groups exist already.
class GroupLimitError : public Error {
 public:
  using Error::Error;
};

struct LogOptions {
  std::filesystem::path data_dir;           ///< topics live in data_dir/topics/<topic>/
  FsyncPolicy fsync;
  std::uint64_t segment_bytes = 64ull << 20;  ///< roll to a new segment past this size
  std::uint64_t retention_bytes = 0;          ///< per topic; 0 = unlimited
  std::chrono::seconds retention_age{0};      ///< 0 = unlimited
  std::uint32_t index_interval_bytes = 4096;  ///< one sparse index entry per this many bytes
  std::size_t dedupe_window = 1u << 18;       ///< remembered (source, id) keys per topic (32 B each); 0 = no event dedupe
  std::size_t max_groups = 10000;             ///< consumer groups kept; a commit that would add one more throws GroupLimitError
  std::size_t max_topics = 10000;             ///< topics kept; an append that would create one more fails (too_many_topics)
  /// Fault injection for tests: when set, called instead of ::fdatasync(fd) on a segment
  /// (returns 0 or -1 with errno set, like fdatasync). Called from the syncer threads.
  std::function<int(int fd)> segment_sync;
};

/// One event to append. `payload` is the event's JSON text (already validated).
struct AppendRecord {
  std::string dedupe_key;  ///< "<source>\x1f<id>"; empty = no event-level dedupe
  std::string payload;
};

/// Outcome of one append() batch.
struct AppendResult {
  bool ok = false;
  std::string error;                 ///< when !ok: why (I/O error text)
  const char* code = "storage_error";  ///< when !ok: the nack code (too_many_topics for a topic over LogOptions::max_topics); a literal
  std::uint64_t first_offset = 0;    ///< offset of the first newly written record
  std::uint32_t written = 0;         ///< records written
  std::uint32_t duplicates = 0;      ///< records dropped as duplicates by (source, id)
  bool duplicate_batch = false;      ///< the whole batch was a (producer, seq) duplicate
};

/// A record read back.
struct StoredRecord {
  std::uint64_t offset = 0;
  std::int64_t time_us = 0;  ///< append time, microseconds since the epoch
  std::string payload;
};

/// Statistics for /metrics and the admin API.
struct TopicInfo {
  std::string name;
  std::uint64_t first_offset = 0;  ///< oldest retained offset
  std::uint64_t next_offset = 0;   ///< offset the next record will get (= committed end)
  std::uint64_t bytes = 0;         ///< on disk
  std::size_t segments = 0;
  std::uint64_t retention_bytes = 0;  ///< the retention applied to it (0: unlimited)
  std::int64_t retention_age_s = 0;   ///< 0: unlimited
};

/// Names of topics: 1-200 characters of [A-Za-z0-9._-], not starting with '.'.
bool valid_topic_name(std::string_view name) noexcept;
/// One character of a topic name: [A-Za-z0-9._-].
bool valid_topic_char(char c) noexcept;

/// The store of all topics under one data directory.
class LogStore {
 public:
  using Completion = std::function<void(const AppendResult&)>;
  using CommitListener = std::function<void(const std::string& topic, std::uint64_t next_offset)>;

  /// Opens (creating if needed) data_dir, recovers every topic (verifying CRCs and
  /// truncating a torn tail) and starts the writer thread. Throws Error when the
  /// directory cannot be used.
  explicit LogStore(LogOptions options);
  /// Stops the writer after writing and syncing everything already appended.
  ~LogStore();
  LogStore(const LogStore&) = delete;
  LogStore& operator=(const LogStore&) = delete;

  /// Enqueues a batch for `topic` from producer `producer_id` with sequence `seq`
  /// (empty producer_id = no batch dedupe). `done` runs once, on the writer thread or a
  /// syncer thread, after the batch is durable per the fsync policy, or on failure; the
  /// `done` of all batches run in the order they were appended. A batch whose (producer,
  /// seq) was already written completes with duplicate_batch = true and nothing written
  /// (except a resend of the producer's last batch after a restart, which may complete a
  /// batch a crash cut short: see docs/protocol.md). Records whose dedupe_key was already
  /// written to this topic are dropped and counted. After an fdatasync of one of a topic's
  /// files failed, appends to that topic fail until the store is reopened.
  void append(std::string topic, std::string producer_id, std::uint64_t seq, std::vector<AppendRecord> records,
              Completion done);

  /// Reads committed records of `topic` with offset >= from, at most max_records and
  /// about max_bytes of payload (at least one record if any, unless max_records is 0).
  /// Empty when none. Offsets lost to a truncated corrupt segment are skipped.
  std::vector<StoredRecord> read(const std::string& topic, std::uint64_t from, std::size_t max_records,
                                 std::size_t max_bytes) const;

  /// One record seen by visit(): the payload views the reader's buffer, valid only
  /// during the callback.
  struct RecordRef {
    std::uint64_t offset = 0;
    std::int64_t time_us = 0;
    std::string_view payload;
  };
  /// Same selection as read(), without copying: calls `fn` for each record in offset
  /// order and returns how many it saw. Thread-safety and errors as read().
  std::size_t visit(const std::string& topic, std::uint64_t from, std::size_t max_records, std::size_t max_bytes,
                    const std::function<void(const RecordRef&)>& fn) const;

  /// End of the committed log (next offset) of a topic; 0 for an unknown topic.
  std::uint64_t committed_offset(const std::string& topic) const;
  /// Oldest retained offset of a topic.
  std::uint64_t first_offset(const std::string& topic) const;
  /// The first retained offset whose record was appended at or after `time_us`
  /// (microseconds since the epoch); committed_offset() when none was. A binary search on
  /// append times (a few reads of one record each), which assumes they do not go back (a
  /// clock stepped back gives an offset near the asked time, not the first one). Any thread.
  std::uint64_t offset_at_time(const std::string& topic, std::int64_t time_us) const;

  /// Existing topics, sorted.
  std::vector<std::string> topics() const;
  std::optional<TopicInfo> info(const std::string& topic) const;

  /// Called after each group commit, once per touched topic (also when a topic is
  /// created), on the thread that runs the completions, after them. Set before any append.
  void set_commit_listener(CommitListener listener);

  /// Histogram source for /metrics: fsync durations in seconds since start.
  struct FsyncStats {
    std::vector<double> bucket_bounds;        ///< upper bounds (seconds)
    std::vector<std::uint64_t> bucket_counts; ///< cumulative counts per bound
    std::uint64_t count = 0;
    double sum = 0;
  };
  FsyncStats fsync_stats() const;

  /// Applies retention now (also done by the writer after rolls and periodically).
  void enforce_retention();

  /// Consumer-group offsets, persisted atomically in data_dir/groups/<group>.json.
  /// commit_group_offset blocks for two fsyncs and throws GroupLimitError for a group that
  /// would be one more than LogOptions::max_groups, Error for a group or topic name
  /// that is not a valid_topic_name() or when the file cannot be written.
  void commit_group_offset(const std::string& group, const std::string& topic, std::uint64_t offset);
  std::optional<std::uint64_t> group_offset(const std::string& group, const std::string& topic) const;
  /// group -> topic -> committed offset (for lag metrics).
  std::vector<std::tuple<std::string, std::string, std::uint64_t>> group_offsets() const;

  /// Verifies every record of every topic (CRC and offsets) and returns the problems
  /// found (empty = clean). Used by tests and `diaspora-relay --verify`.
  std::vector<std::string> verify() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> self_;
};

}  // namespace diaspora::relay
