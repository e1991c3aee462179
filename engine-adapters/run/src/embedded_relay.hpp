// The relay a run starts in its own process (`relay.url: embedded`): diaspora::Relay on
// 127.0.0.1 with development certificates, an HS256 secret and a token made on first use
// under DIR (kept, so that --resume finds the same log, CA and token). TLS stays on.
//
// Thread safety: owned by the runner thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace diaspora {
class Relay;
}

namespace diaspora::run {

class EmbeddedRelay {
 public:
  /// Makes DIR/certs, DIR/auth-secret and DIR/token when missing (the token allows
  /// publish and subscribe on `topic_prefix`.* for 30 days) and starts the relay on a free
  /// port, its log in `data_dir`. Throws diaspora::Error when it cannot.
  EmbeddedRelay(const std::filesystem::path& dir, const std::filesystem::path& data_dir, const std::string& topic_prefix);
  ~EmbeddedRelay();
  EmbeddedRelay(const EmbeddedRelay&) = delete;
  EmbeddedRelay& operator=(const EmbeddedRelay&) = delete;

  std::string url() const;  ///< wss://127.0.0.1:PORT
  std::filesystem::path ca_file() const { return dir_ / "certs" / "ca.pem"; }
  std::filesystem::path token_file() const { return dir_ / "token"; }
  std::uint16_t port() const noexcept { return port_; }
  bool running() const noexcept { return relay_ != nullptr; }

  /// Stops the relay (graceful: pending acks sent, log synced). The stop-relay fault.
  void stop();
  /// Starts it again on the same port. Throws diaspora::Error when the port cannot be bound.
  void start();

 private:
  std::filesystem::path dir_, data_dir_;
  std::uint16_t port_ = 0;
  std::unique_ptr<Relay> relay_;
};

}  // namespace diaspora::run
