// The Diaspora relay: a TLS WebSocket + HTTPS server in front of a durable topic log.
// `diaspora-relay` is a thin main() around this class; tests and benchmarks embed it.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "diaspora/error.hpp"

namespace diaspora {

/// Everything the relay needs; every field has a documented default except the TLS and
/// auth files. `schemas/relay.schema.json` is the YAML form (load_relay_config).
struct RelayConfig {
  std::string listen = "127.0.0.1:7443";      ///< HOST:PORT; port 0 picks a free port
  std::filesystem::path data_dir = ".diaspora/relay";
  std::filesystem::path tls_cert;             ///< server certificate chain (PEM), required
  std::filesystem::path tls_key;              ///< its private key (PEM), required
  std::optional<std::filesystem::path> client_ca;  ///< set = mutual TLS: clients need a cert from this CA
  std::filesystem::path auth_secret_file;     ///< HS256 token secret, required
  std::optional<std::filesystem::path> port_file;  ///< written with the bound port once listening
  std::string fsync = "always";               ///< always | never | interval:<ms>
  std::uint64_t segment_bytes = 64ull << 20;
  std::uint64_t retention_bytes = 0;          ///< per topic; 0 = keep everything
  std::chrono::seconds retention_age{0};      ///< 0 = keep forever
  /// Retention for the topics a pattern matches (log.retention_by_topic), first match
  /// first; retention_bytes / retention_age for the others.
  struct TopicRetention {
    std::string topics;          ///< a topic or a pattern with '*'
    std::uint64_t bytes = 0;     ///< 0 = unlimited
    std::chrono::seconds age{0};  ///< 0 = unlimited
  };
  std::vector<TopicRetention> retention_by_topic;
  std::size_t max_frame_bytes = 16u << 20;    ///< largest WebSocket message accepted
  std::size_t max_event_bytes = 1u << 20;     ///< largest single event
  std::size_t max_batch_events = 10000;       ///< events per publish
  std::uint64_t max_item_bytes = 128ull << 20;          ///< largest data item (docs/streaming.md)
  std::uint64_t max_pending_item_bytes = 256ull << 20;  ///< items announced and not yet acked, per connection
  std::uint64_t max_item_bytes_total = 1ull << 30;      ///< the same, all connections together (the relay's memory for items)
  std::size_t max_inflight_batches = 64;      ///< unacked publishes per connection before reads pause
  std::size_t subscriber_queue_frames = 32;   ///< queued outgoing frames before a subscriber is paused
  std::chrono::seconds slow_subscriber_timeout{30};  ///< paused this long => disconnected (slow_consumer)
  std::chrono::seconds idle_timeout{60};      ///< nothing heard (not even a pong) this long => closed with 4002
  std::size_t delivery_batch_events = 1000;   ///< events per `events` frame
  std::size_t delivery_batch_bytes = 1u << 20;
  std::size_t max_consumer_groups = 10000;    ///< groups with committed offsets; one more is refused (too_many_groups)
  std::size_t max_topics = 10000;             ///< topics in the log; a publish creating one more is nacked (too_many_topics)
  bool validate_payloads = true;              ///< check org.diaspora.* data against its schema
  bool public_metrics = true;                 ///< /metrics without a token (false: admin scope needed)
  std::optional<std::filesystem::path> console_dir;  ///< the console's built assets (default: found beside the build or install)
  bool views = true;                          ///< materialise the views (/api/v1/views/, the console) from the events topics
  int threads = 2;                            ///< I/O threads
  /// Quality of service on each connection (qos in relay.yaml; docs/streaming.md).
  struct Qos {
    bool enabled = true;                      ///< false: one FIFO per connection, as before QoS
    std::size_t notsent_lowat = 64u << 10;    ///< TCP_NOTSENT_LOWAT of each connection; 0 = the kernel's (unbounded)
    std::uint32_t weight_lifecycle = 8, weight_telemetry = 2, weight_bulk = 1;  ///< shares of the wire
    std::uint64_t bulk_rate = 0;              ///< bytes/s each connection's bulk frames are paced to; 0 = not paced
    std::chrono::seconds report_interval{5};  ///< congestion rounds (resource.status events); 0 = none
    std::uint64_t congested_wait_ms = 1000;   ///< a frame (not bulk) queued this long: the connection is congested
    std::string congestion_topic = "relay.events";  ///< where the congestion events go
    /// Classes (control | lifecycle | telemetry | bulk) whose items stored after their
    /// itemdeadline are dropped (nacked "late") instead of stored and said late.
    std::vector<std::string> drop_late;
    /// A class for the topics a pattern matches, first match first; then the defaults.
    struct Rule {
      std::string topics;  ///< a topic or a pattern with '*'
      std::string cls;     ///< control | lifecycle | telemetry | bulk
    };
    std::vector<Rule> classes;
  } qos;
  std::string storage = "embedded";           ///< embedded (the log under data_dir) | jetstream
  /// A NATS JetStream cluster as the store (storage: jetstream; docs/relay.md).
  struct JetStream {
    std::vector<std::string> urls;            ///< nats:// or tls:// URLs of the cluster's servers
    int replicas = 3;                         ///< each topic's stream and the relays' buckets
    std::filesystem::path credentials_file;   ///< NATS user credentials; empty: none
    std::filesystem::path tls_ca, tls_cert, tls_key;  ///< TLS to the servers; empty: none
    std::string prefix = "DIASPORA";          ///< stream and bucket names
    std::string subject_root = "diaspora";    ///< the streams' subjects
    std::chrono::seconds duplicate_window{120};  ///< JetStream's Nats-Msg-Id window
    std::chrono::seconds timeout{5};          ///< each request to the cluster, an append's acknowledgements
    /// Sites federated: another JetStream domain's relay whose topics this relay's hold too.
    struct Source {
      std::string domain, prefix, subject_root;  ///< its domain, its relay's prefix and subject root
      std::vector<std::string> topics{"*"};      ///< which of its topics (patterns with '*')
    };
    std::vector<Source> sources;
  } jetstream;
};

/// The configuration cannot be used: a bad value, a missing file, or a certificate, key or
/// secret file that does not parse or is too weak. diaspora-relay exits 2 for it (a runtime
/// failure such as an address in use exits 1).
class RelayConfigError : public Error {
 public:
  using Error::Error;
};

/// Loads a relay.yaml (schemas/relay.schema.json) over the defaults. Throws SpecError with
/// FILE:LINE:COL diagnostics.
RelayConfig load_relay_config(const std::filesystem::path& file);

/// Checks that the files exist and the values are sane; throws RelayConfigError naming the field.
void validate_relay_config(const RelayConfig& config);

/// A running relay.
///
/// @par Thread Safety
/// start(), stop() and port() may be called from any thread; the relay runs on its own
/// I/O threads and a log-writer thread.
class Relay {
 public:
  /// Opens the log (recovering it) and the TLS context. Throws RelayConfigError for a bad
  /// config, certificates, key or secret that cannot be used; Error for a data directory
  /// that cannot be used (e.g. locked by another relay).
  explicit Relay(RelayConfig config);
  /// Stops if running (drains connections, flushes the log).
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  /// Binds and starts serving on the I/O threads; writes the port file. Throws Error
  /// when the address cannot be bound.
  void start();
  /// Loads the certificate chain, key and client CA again from the files the config names
  /// (a renewed certificate, without a restart): connections accepted from then on use
  /// them; open sessions keep theirs. Any thread, any time after construction. Throws
  /// RelayConfigError when the files cannot be used (unreadable, not PEM, a key that does
  /// not match the certificate); the relay then keeps serving the previous ones.
  void reload_tls();
  /// The bound port (after start()).
  std::uint16_t port() const noexcept;
  /// Records of the events and control topics the views have read so far (applied or
  /// skipped as bad); 0 when the views are off. Any thread; for benchmarks and tests that
  /// measure whether the views keep up with the log.
  std::uint64_t views_read() const noexcept;
  /// Graceful shutdown: stop accepting, close WebSockets with "going away" after
  /// pending acks are sent, flush and sync the log, join the threads. Idempotent.
  void stop();
  /// Blocks until stop() has completed (called from another thread).
  void wait();

  struct Impl;  ///< implementation detail (opaque; public so the server's classes can name it)

 private:
  std::shared_ptr<Impl> self_;
};

}  // namespace diaspora
