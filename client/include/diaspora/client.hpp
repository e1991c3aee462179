// diaspora::client, the only way a component talks to a relay: a small blocking client for
// the diaspora.v1 (and cloudevents.json) WebSocket protocol, and the builders of the frames
// it sends (docs/protocol.md). Used by the engine plugin (whose publisher pipelines batches
// with poll_receive()), the `diaspora` CLI, the benchmarks and tests.
#pragma once

#include <boost/json/object.hpp>

#include <chrono>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "diaspora/error.hpp"

namespace diaspora {

struct RelayClientOptions {
  std::string url;                       ///< wss://host:port[/path]; path defaults to /v1
  std::filesystem::path ca_file;         ///< CA bundle that signed the relay's certificate
  std::string token;                     ///< bearer token (sent on the upgrade)
  std::optional<std::filesystem::path> client_cert, client_key;  ///< for mutual TLS
  std::string client_id = "diaspora-cli";
  std::string producer_id;               ///< stable id for idempotent publishing; empty = none
  /// Where the client is and the task it works for (hello's `site` and `task`; empty =
  /// not said): the relay names them in this connection's congestion events.
  std::string site, task;
  std::string subprotocol = "diaspora.v1";  ///< or "cloudevents.json" (then no hello)
  std::chrono::milliseconds timeout{30000};  ///< per connect / receive
};

/// Thrown for connection, TLS, protocol and timeout failures. For a WebSocket close,
/// close_code() is the code the relay sent (docs/protocol.md).
class RelayClientError : public Error {
 public:
  RelayClientError(const std::string& message, int close_code = 0,
                   std::source_location where = std::source_location::current())
      : Error(message, where), close_code_(close_code) {}
  int close_code() const noexcept { return close_code_; }

 private:
  int close_code_;
};

/// One connection. Not thread-safe: use from one thread.
class RelayClient {
 public:
  /// Connects (TCP, TLS with certificate and host name verification, WebSocket upgrade)
  /// and, for diaspora.v1, exchanges hello/welcome. Throws RelayClientError.
  explicit RelayClient(RelayClientOptions options);
  ~RelayClient();
  RelayClient(const RelayClient&) = delete;
  RelayClient& operator=(const RelayClient&) = delete;

  /// Sends one text frame. Throws RelayClientError.
  void send(std::string_view frame);
  /// Sends one text frame made of `parts` in order, without joining them first (a large
  /// publish: header, the batch's events, trailer). Throws RelayClientError.
  void send(std::initializer_list<std::string_view> parts);
  /// Sends one binary frame (a data item's chunk, docs/streaming.md). Throws RelayClientError.
  void send_binary(std::string_view frame);
  /// Receives one frame, waiting at most the timeout. Throws RelayClientError on
  /// timeout, close or error. A binary frame (a data chunk) is returned as its bytes:
  /// last_binary() tells which it was.
  std::string receive();
  /// Whether the frame receive() or poll_receive() returned last was a binary frame.
  bool last_binary() const noexcept;
  /// Waits at most `wait` (0 = only what is already there) for one text frame; nullopt
  /// when none arrived. A read left unfinished stays pending and is completed by the next
  /// poll_receive()/receive() (or while send() waits), so no frame is lost. Throws
  /// RelayClientError on close or error.
  std::optional<std::string> poll_receive(std::chrono::milliseconds wait);
  /// receive() parsed as a JSON object (see parse_frame); an {"op":"error"} frame is
  /// returned, not thrown.
  boost::json::object receive_json();

  /// Parses a frame the relay sent: JSON nested up to 64 levels (an `events` frame nests
  /// each event one level deeper than the publish that carried it, and the relay accepts
  /// publishes nested up to 32). Returns nullopt when the text is not a JSON object.
  /// Thread-safe (no state).
  static std::optional<boost::json::object> parse_frame(std::string_view text);
  /// The relay's welcome message (diaspora.v1).
  const boost::json::object& welcome() const noexcept;
  /// Sends a close frame and waits briefly for the reply. Never throws.
  void close() noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> self_;
};

/// Builders of the diaspora.v1 frames a client sends (docs/protocol.md). Pure functions:
/// any thread; they throw std::bad_alloc only.
namespace frames {

/// The start of a publish frame, up to its events:
/// `{"op":"publish","topic":<topic>,"seq":<seq>,"events":[`. Follow it with the events'
/// JSON texts separated by ',' and end it with kPublishTail; RelayClient::send(parts) sends
/// the pieces as one frame without joining them.
std::string publish_head(std::string_view topic, std::uint64_t seq);
/// The end of a publish frame.
inline constexpr std::string_view kPublishTail = "]}";
/// A whole publish frame of `events` (each a CloudEvent's JSON text).
std::string publish(std::string_view topic, std::uint64_t seq, const std::vector<std::string_view>& events);

/// Where a subscription starts: "earliest", "latest", or an offset.
struct From {
  From(const char* where) : position(where) {}  // NOLINT: "earliest" or "latest"
  From(std::string_view where) : position(where) {}  // NOLINT
  From(std::uint64_t at) : offset(at) {}  // NOLINT
  std::string_view position;  ///< empty when `offset` is used
  std::uint64_t offset = 0;
};
/// `{"op":"subscribe","id":...,"topic":...,"from":...[,"group":...]}`; no group when empty.
std::string subscribe(std::string_view id, std::string_view topic_pattern, From from, std::string_view group = {});
/// `{"op":"commit","group":...,"topic":...,"offset":...}`.
std::string commit(std::string_view group, std::string_view topic, std::uint64_t offset);

}  // namespace frames

}  // namespace diaspora
