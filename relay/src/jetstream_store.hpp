// The relay's topics kept in a NATS JetStream cluster (relay.yaml `storage: jetstream`):
// any number of relays in front of one replicated log, holding no state of their own.
//
// How the store's contract maps onto JetStream (docs/relay.md, "Storage on JetStream"):
//   * a topic is a stream of its own, `<prefix>-<topic>` (characters other than
//     [A-Za-z0-9-] written _XX), with one subject, `<subject root>.t.<encoded topic>`;
//     offset N is stream sequence N + 1, so offsets stay dense and per topic;
//   * an append is acknowledged once JetStream acknowledged every record of the batch
//     (stored by a quorum of the stream's replicas); each record carries Nats-Msg-Id =
//     its (source, id), so JetStream drops a resent event inside its duplicate window;
//   * the (producer, seq) high-water marks live in the KV bucket `<prefix>_PRODUCERS`, so a
//     batch resent to another relay, or after any outage, is still a duplicate;
//   * consumer-group offsets live in the KV bucket `<prefix>_GROUPS`;
//   * the commit listener hears every record stored by any relay: each stream republishes
//     the headers of what it stored to `<subject root>.stored.<encoded topic>`;
//   * sites federated (options.sources): a topic of another domain's relay is sourced into
//     this relay's stream of the topic (filtered on that relay's subject); a federation
//     thread lists the sources' topics and follows how far each sourced stream has come.
//
// Thread model: as Store's. One writer thread publishes the batches in order; reads are
// JetStream requests made on the caller's thread; with sources, one federation thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "store.hpp"

namespace diaspora::relay {

/// Another relay's topics, in another JetStream domain (a site's leaf node, or the centre),
/// that this relay's topics also hold (relay.yaml `jetstream.sources`, docs/relay.md,
/// "Sites federated"): JetStream sources each of its streams into this relay's stream of
/// the same topic, only what that relay's producers published there (its subject), so two
/// relays sourcing each other's topics never send an event back where it came from.
struct JetStreamSource {
  std::string domain;        ///< its JetStream domain (its server's jetstream.domain): a NATS token
  std::string prefix;        ///< its relay's jetstream.prefix
  std::string subject_root;  ///< its relay's jetstream.subject_root
  std::vector<std::string> topics{"*"};  ///< which of its topics (patterns with '*')
};

/// Where the cluster is and how its streams are made.
struct JetStreamOptions {
  std::vector<std::string> urls;  ///< nats://host:port or tls://host:port, tried in turn
  std::string creds_file;         ///< a NATS user credentials file; empty: none
  std::string ca_file;            ///< trusted CAs for the servers' certificates (TLS); empty: no TLS unless tls://
  std::string cert_file, key_file;  ///< the relay's client certificate (mutual TLS); empty: none
  int replicas = 3;                 ///< each stream's and bucket's replicas (1 to 5)
  std::uint64_t retention_bytes = 0;     ///< per topic; 0 = unlimited
  std::chrono::seconds retention_age{0};  ///< 0 = unlimited
  std::vector<TopicRetention> retention_by_topic;  ///< first match wins; the two above for the others
  std::chrono::seconds duplicate_window{120};  ///< JetStream's Nats-Msg-Id window
  std::size_t max_topics = 10000;   ///< streams of this prefix; an append creating one more fails (too_many_topics)
  std::size_t max_groups = 10000;   ///< consumer groups; a commit adding one more throws GroupLimitError
  std::string prefix = "DIASPORA";  ///< stream and bucket names: [A-Za-z0-9-_]
  std::string subject_root = "diaspora";  ///< subjects of the streams: a NATS token
  std::chrono::milliseconds timeout{5000};  ///< each JetStream request, and an append's acknowledgements
  /// Other domains' topics held here too; empty: none. A relay with sources is in a
  /// federation: its own records carry no order chain (Nats-Expected-Last-Msg-Id), which
  /// JetStream 2.9 would check again on the copies other domains source.
  std::vector<JetStreamSource> sources;
  /// How often the sources' topics are listed (a new topic there gets its stream here), and
  /// four times as often how far each sourced stream has come (what subscribers are told).
  std::chrono::milliseconds federation_interval{1000};
};

/// The reason `source` cannot be used (empty or invalid names, a bad pattern, its domain or
/// its prefix and subject root this relay's own); nullopt when it can. Any thread.
std::optional<std::string> invalid_source(const JetStreamSource& source, const JetStreamOptions& own);

/// A stream or bucket name of `text`: [A-Za-z0-9-] kept, anything else as _XX (hex).
std::string jetstream_name(std::string_view text);
/// The inverse of jetstream_name; nullopt when `name` is not one (jetstream_name of the
/// result gives `name` back: `_2D` for `-` or lowercase hex are not names it makes).
std::optional<std::string> jetstream_unname(std::string_view name);

// What the relay reads back from the cluster (stream names, bucket keys and values,
// republished headers): anyone who can write to the cluster can put anything there, so
// each is parsed strictly (tests/fuzz/fuzz_jetstream.cpp). Pure functions, any thread.

/// A number the relay wrote as decimal text (a batch seq, a group's offset, a stream
/// sequence in a `Nats-Sequence` header); nullopt for anything else (signs, spaces, overflow).
std::optional<std::uint64_t> parse_stored_number(std::string_view text);
/// True when `payload`, a record read back from a stream, is what a relay stores: one JSON
/// object (an event) or a data item's chunk (data_item.hpp). Anything else was put there by another writer to the cluster: the
/// relay skips it rather than pass it to its subscribers.
bool stored_event_text(std::string_view payload);
/// The topic of the stream `stream` when it is one of this prefix ("<prefix>-<encoded
/// topic>") and the topic a valid name; else nullopt.
std::optional<std::string> topic_of_stream_name(std::string_view stream, std::string_view prefix);
/// (group, topic) of a key of the groups bucket ("<encoded group>.<encoded topic>", both
/// valid names); nullopt for any other key.
std::optional<std::pair<std::string, std::string>> parse_group_key(std::string_view key);
/// The stream leader's answer to a message get ($JS.API.STREAM.MSG.GET, `{"seq": N}`):
/// the message's bytes and its store time when it is the message at `seq`; `removed` when the
/// answer is JetStream's 404 (retention removed it); nullopt for anything else (another
/// error, another sequence, bad base64 or time, not JSON).
struct MessageGet {
  bool removed = false;
  std::string data;          ///< the stored bytes (empty when removed)
  std::int64_t time_us = 0;  ///< the store time, µs since the epoch
};
std::optional<MessageGet> parse_message_get(std::string_view answer, std::uint64_t seq);

/// The answers to one read's message gets (JetStreamStore::visit), which the connection's
/// reader thread files by sequence while the read takes them in offset order. `Msg` is
/// libnats's natsMsg in the store (a type of the test's in its unit test); the mailbox owns
/// every answer filed until it is taken, and frees it with `free` otherwise.
///
/// The reader thread may find the mailbox just before the read ends and file an answer
/// after it: the read closes the mailbox, which frees the answers not taken then and each
/// answer filed later at once, so nothing is left behind either way.
template <class Msg>
class ReadMailbox {
 public:
  using Free = void (*)(Msg*);
  explicit ReadMailbox(Free free) : free_(free) {}
  ReadMailbox(const ReadMailbox&) = delete;
  ReadMailbox& operator=(const ReadMailbox&) = delete;
  ~ReadMailbox() { close(); }

  /// Files the answer for `seq` and wakes the read; frees it and returns false when the
  /// mailbox is closed or already holds an answer for `seq`. Any thread (the reader's).
  bool file(std::uint64_t seq, Msg* msg) {
    bool kept = false;
    {
      std::lock_guard lk(mu_);
      kept = !closed_ && answers_.emplace(seq, msg).second;
    }
    if (!kept) {
      free_(msg);
      return false;
    }
    cv_.notify_one();
    return true;
  }

  /// The answer for `seq`, waiting up to `wait` for it; the caller owns it (and frees it).
  /// nullptr when none came in time or the mailbox is closed. The read's thread.
  Msg* take(std::uint64_t seq, std::chrono::milliseconds wait) {
    std::unique_lock lk(mu_);
    if (!cv_.wait_for(lk, wait, [&] { return closed_ || answers_.contains(seq); }) || closed_) return nullptr;
    auto node = answers_.extract(seq);
    return node.mapped();
  }

  /// Frees the answers not taken; from now on each answer filed is freed as it comes.
  /// Idempotent. Any thread (the read's, as it ends).
  void close() {
    std::map<std::uint64_t, Msg*> left;
    {
      std::lock_guard lk(mu_);
      closed_ = true;
      left.swap(answers_);
    }
    for (auto& [seq, msg] : left) free_(msg);
    cv_.notify_all();
  }

 private:
  Free free_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint64_t, Msg*> answers_;  // by sequence
  bool closed_ = false;
};

/// The topics of a JetStream cluster.
class JetStreamStore final : public Store {
 public:
  /// Connects (the servers in turn, reconnecting for ever once connected), creates the KV
  /// buckets when missing and starts the writer and notification threads. Throws Error
  /// naming the servers and the reason when none can be reached or JetStream is off.
  explicit JetStreamStore(JetStreamOptions options);
  /// Finishes the batches already appended (or fails them past the timeout), then closes.
  ~JetStreamStore() override;
  JetStreamStore(const JetStreamStore&) = delete;
  JetStreamStore& operator=(const JetStreamStore&) = delete;

  /// Durable = acknowledged by JetStream (stored by a quorum of the stream's replicas);
  /// fails with storage_error (the server's reason) when the cluster does not acknowledge
  /// within the timeout, e.g. without a quorum.
  void append(std::string topic, std::string producer_id, std::uint64_t seq, std::vector<AppendRecord> records,
              Completion done) override;
  /// Message gets by sequence to each stream's leader, up to 64 in flight, the records handed
  /// on in offset order (an unanswered get is asked again on its own). Throws Error when the
  /// cluster cannot be asked or answers with something that is not the stored message.
  std::size_t visit(const std::string& topic, std::uint64_t from, std::size_t max_records, std::size_t max_bytes,
                    const std::function<void(const RecordRef&)>& fn) const override;
  /// From what this relay knows (the stream's state asked at most once a second, raised by
  /// every record any relay stored): no request on the common path. While the cluster
  /// cannot be asked, the last known value (0 for a topic never seen). Never throws.
  std::uint64_t committed_offset(const std::string& topic) const override;
  std::uint64_t first_offset(const std::string& topic) const override;
  std::uint64_t offset_at_time(const std::string& topic, std::int64_t time_us) const override;
  /// The streams of this prefix; while the cluster cannot be asked, the last list it gave.
  std::vector<std::string> topics() const override;
  std::optional<TopicInfo> info(const std::string& topic) const override;
  void set_commit_listener(CommitListener listener) override;
  void commit_group_offset(const std::string& group, const std::string& topic, std::uint64_t offset) override;
  std::optional<std::uint64_t> group_offset(const std::string& group, const std::string& topic) const override;
  std::vector<std::tuple<std::string, std::string, std::uint64_t>> group_offsets() const override;

  /// Each of options.sources as the federation thread last saw it. Any thread.
  std::vector<SourceStatus> sources() const override;
  /// Why appends cannot be taken now: no connection to the cluster, or JetStream not
  /// answering (asked once a second: a cluster that lost its quorum); nullopt when they can.
  std::optional<std::string> unready() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> self_;
};

}  // namespace diaspora::relay
