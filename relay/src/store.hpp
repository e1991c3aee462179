// The relay's storage backends behind one interface: the embedded topic log (LogStore,
// topic_log.hpp) and whatever else keeps the relay's topics. What the relay's sessions,
// HTTP endpoints, views and browsing need of a store, and nothing of how it keeps them.
//
// Internal to the relay (not installed). Thread model, for every backend:
//   * append() may be called from any thread; it only enqueues. Completions run in append
//     order on a thread of the store's own: keep them short (e.g. post to a strand). The
//     commit listener likewise.
//   * visit() / read() / committed_offset() / topics() may be called from any thread
//     concurrently with appends; they only see committed (acked) records.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "diaspora/error.hpp"

namespace diaspora::relay {

/// commit_group_offset for a new group when LogOptions::max_groups groups exist already.
class GroupLimitError : public Error {
 public:
  using Error::Error;
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

/// How long a topic keeps its records: the oldest go once it holds more than `bytes`, or
/// once they are older than `age` (0: no bound). Whole segments (the embedded log) or
/// messages (JetStream) at a time.
struct Retention {
  std::uint64_t bytes = 0;
  std::chrono::seconds age{0};
  bool bounded() const noexcept { return bytes > 0 || age.count() > 0; }
};

/// A retention for the topics a pattern matches (relay.yaml `log.retention_by_topic`): data
/// topics kept apart from the events' history, for instance.
struct TopicRetention {
  std::string pattern;  ///< a topic or a pattern with '*' (any run of characters)
  Retention retention;
};

/// The retention of `topic`: that of the first rule whose pattern matches it, else
/// `fallback`. Pure: any thread.
Retention retention_of(std::string_view topic, const std::vector<TopicRetention>& rules, Retention fallback) noexcept;
/// Whether any topic can have a bounded retention under these rules.
bool any_bounded(const std::vector<TopicRetention>& rules, Retention fallback) noexcept;

/// Names of topics: 1-200 characters of [A-Za-z0-9._-], not starting with '.'.
bool valid_topic_name(std::string_view name) noexcept;
/// One character of a topic name: [A-Za-z0-9._-].
bool valid_topic_char(char c) noexcept;

/// A store of topics: ordered, durable, offset-addressed logs of events.
class Store {
 public:
  using Completion = std::function<void(const AppendResult&)>;
  using CommitListener = std::function<void(const std::string& topic, std::uint64_t next_offset)>;

  virtual ~Store() = default;

  /// Enqueues a batch for `topic` from producer `producer_id` with sequence `seq`
  /// (empty producer_id = no batch dedupe). `done` runs once, on a thread of the store's,
  /// after the batch is durable (what durable means is the backend's: docs/relay.md), or
  /// on failure; the `done` of all batches run in the order they were appended. A batch
  /// whose (producer, seq) was already written completes with duplicate_batch = true and
  /// nothing written (except a resend of the producer's last batch after a restart, which
  /// may complete a batch a crash cut short: see docs/protocol.md). Records whose
  /// dedupe_key was already written to this topic are dropped and counted.
  virtual void append(std::string topic, std::string producer_id, std::uint64_t seq, std::vector<AppendRecord> records,
                      Completion done) = 0;

  /// One record seen by visit(): the payload views the reader's buffer, valid only
  /// during the callback.
  struct RecordRef {
    std::uint64_t offset = 0;
    std::int64_t time_us = 0;
    std::string_view payload;
  };
  /// Calls `fn` for each committed record of `topic` with offset >= from, in offset order,
  /// at most max_records and about max_bytes of payload (at least one record if any,
  /// unless max_records is 0), and returns how many it saw. Any thread; throws Error when
  /// the store cannot be read.
  virtual std::size_t visit(const std::string& topic, std::uint64_t from, std::size_t max_records, std::size_t max_bytes,
                            const std::function<void(const RecordRef&)>& fn) const = 0;
  /// The same selection as visit(), copied. Empty when none.
  std::vector<StoredRecord> read(const std::string& topic, std::uint64_t from, std::size_t max_records,
                                 std::size_t max_bytes) const;

  /// End of the committed log (next offset) of a topic; 0 for an unknown topic.
  virtual std::uint64_t committed_offset(const std::string& topic) const = 0;
  /// Oldest retained offset of a topic.
  virtual std::uint64_t first_offset(const std::string& topic) const = 0;
  /// The first retained offset whose record was appended at or after `time_us`
  /// (microseconds since the epoch); committed_offset() when none was. Any thread.
  virtual std::uint64_t offset_at_time(const std::string& topic, std::int64_t time_us) const = 0;

  /// Existing topics, sorted.
  virtual std::vector<std::string> topics() const = 0;
  /// A topic's offsets, size and retention; nullopt for an unknown topic.
  virtual std::optional<TopicInfo> info(const std::string& topic) const = 0;

  /// Called after records are committed, once per touched topic and batch of commits (also
  /// when a topic is created), on a thread of the store's, after the completions. Set
  /// before any append.
  virtual void set_commit_listener(CommitListener listener) = 0;

  /// Histogram source for /metrics: the durations of the backend's durability step
  /// (fsync for the embedded log), in seconds since start; empty when it has none.
  struct FsyncStats {
    std::vector<double> bucket_bounds;        ///< upper bounds (seconds)
    std::vector<std::uint64_t> bucket_counts; ///< cumulative counts per bound
    std::uint64_t count = 0;
    double sum = 0;
  };
  virtual FsyncStats fsync_stats() const { return {}; }

  /// Another domain whose topics the store holds too (sites federated, JetStreamStore):
  /// whether it answers, how many of its topics are taken, what JetStream has yet to copy.
  struct SourceStatus {
    std::string domain;
    bool asked = false;       ///< asked at least once
    bool up = false;          ///< its last listing answered
    std::string why;          ///< why not, when it did not
    std::uint64_t topics = 0;  ///< its topics this store holds
    std::uint64_t lag = 0;     ///< records JetStream reports not yet copied (as last asked)
  };
  /// For /metrics; empty for a store without sources. Any thread.
  virtual std::vector<SourceStatus> sources() const { return {}; }

  /// Why the store cannot take appends now (for /readyz: e.g. the connection to a cluster
  /// is down); nullopt when it can. Any thread.
  virtual std::optional<std::string> unready() const { return std::nullopt; }

  /// Consumer-group offsets. commit_group_offset returns once the offset is durable and
  /// throws GroupLimitError for a group that would be one more than the store's limit,
  /// Error for a group or topic name that is not a valid_topic_name() or when it cannot be
  /// kept. Any thread.
  virtual void commit_group_offset(const std::string& group, const std::string& topic, std::uint64_t offset) = 0;
  virtual std::optional<std::uint64_t> group_offset(const std::string& group, const std::string& topic) const = 0;
  /// (group, topic, committed offset) of every group (for lag metrics and the views).
  virtual std::vector<std::tuple<std::string, std::string, std::uint64_t>> group_offsets() const = 0;
};

}  // namespace diaspora::relay
