// The relay a run starts in its own process (`relay.url: embedded`): diaspora::Relay on
// 127.0.0.1 with development certificates, an HS256 secret and a token made on first use
// under DIR (kept, so that --resume finds the same log, CA and token). TLS stays on. The
// stop-relay fault stops it on a thread of its own (RelayControl), so the runner's loop
// keeps serving its workers while the relay drains and syncs.
//
// Thread safety: owned by the runner thread (the stopping thread only runs Relay::stop).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "relay_control.hpp"

namespace diaspora {
class Relay;
}

namespace diaspora::runner {

class EmbeddedRelay final : public RelayControl {
 public:
  /// Makes DIR/certs, DIR/auth-secret and DIR/token when missing (the token allows
  /// publish and subscribe on `topic_prefix`.* for 30 days) and starts the relay on a free
  /// port, its log in `data_dir`, its classes of service from the spec's relay.qos
  /// ((topic pattern, class) rules, the classes whose late items are dropped, how often
  /// congested connections are looked for), its congestion events on links_topic(). Throws
  /// diaspora::Error when it cannot.
  EmbeddedRelay(const std::filesystem::path& dir, const std::filesystem::path& data_dir, const std::string& topic_prefix,
                std::vector<std::pair<std::string, std::string>> qos_classes = {}, std::vector<std::string> drop_late = {},
                std::chrono::seconds report_interval = std::chrono::seconds(5));
  /// Stops the relay (waits for a stop in progress).
  ~EmbeddedRelay() override;
  EmbeddedRelay(const EmbeddedRelay&) = delete;
  EmbeddedRelay& operator=(const EmbeddedRelay&) = delete;

  std::string url() const;  ///< wss://127.0.0.1:PORT
  std::filesystem::path ca_file() const { return dir_ / "certs" / "ca.pem"; }
  std::filesystem::path token_file() const { return dir_ / "token"; }
  std::uint16_t port() const noexcept { return port_; }

  /// Stops the relay and waits (graceful: pending acks sent, log synced).
  void stop();
  /// Starts it again on the same port. Throws diaspora::Error when the port cannot be bound.
  void start();

  // RelayControl
  void stop_async() override;
  bool running() const override { return relay_ != nullptr && !stopping_; }
  bool try_start(std::string* why) override;

 private:
  void join_stop();

  std::filesystem::path dir_, data_dir_;
  std::string links_topic_;
  std::chrono::seconds report_interval_;
  std::uint16_t port_ = 0;
  std::vector<std::pair<std::string, std::string>> qos_classes_;
  std::vector<std::string> drop_late_;
  std::unique_ptr<Relay> relay_;
  std::thread stopper_;
  bool stopping_ = false;            ///< a stop_async() not joined yet
  std::atomic<bool> stopped_{false};  ///< ... which has finished
};

}  // namespace diaspora::runner
