// Reading a topic of the relay back from its start: the events of a durable log, in log
// order. Used by `diaspora run --resume` (the runner's view rebuilt from its events) and by
// diaspora-train's ptycho-stream dataset (the scans announced with data.arrived).
#pragma once

#include <boost/json/object.hpp>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "diaspora/client.hpp"

namespace diaspora {

/// Connection settings from files: `url` (wss://...), the CA bundle that signed the relay's
/// certificate and a file whose first line is the bearer token.
/// @throws RelayClientError if the token file cannot be read or its first line is empty.
RelayClientOptions relay_options_from_files(const std::string& url, const std::filesystem::path& ca_file,
                                            const std::filesystem::path& token_file, const std::string& client_id);

/// Subscribes to `topic` from its earliest event and hands out the events (the CloudEvents
/// objects, in log order) as they arrive, the old ones first, then new ones live.
/// Not thread-safe: one thread.
class TopicReader {
 public:
  /// Connects and subscribes. @throws RelayClientError (unreachable relay, refused token, TLS).
  TopicReader(const RelayClientOptions& options, const std::string& topic);
  ~TopicReader();
  TopicReader(const TopicReader&) = delete;
  TopicReader& operator=(const TopicReader&) = delete;

  /// The events that arrived: waits up to `wait` for the first one, then takes the ones
  /// already received. Empty when none came within `wait` (at the log's end, nothing new
  /// yet). Frames that are not event deliveries are skipped.
  /// @throws RelayClientError if the relay refuses the subscription or the connection drops.
  std::vector<boost::json::object> poll(std::chrono::milliseconds wait);

  /// Events handed out so far (the position of the next one in the topic's log).
  std::uint64_t delivered() const noexcept { return delivered_; }

 private:
  std::unique_ptr<RelayClient> client_;
  std::string topic_;
  std::uint64_t delivered_ = 0;
};

}  // namespace diaspora
