#include "embedded_relay.hpp"

#include <chrono>

#include "diaspora/certs.hpp"
#include "diaspora/error.hpp"
#include "diaspora/files.hpp"
#include "diaspora/relay.hpp"
#include "diaspora/token.hpp"

namespace diaspora::runner {

namespace fs = std::filesystem;

EmbeddedRelay::EmbeddedRelay(const fs::path& dir, const fs::path& data_dir, const std::string& topic_prefix,
                             std::vector<std::pair<std::string, std::string>> qos_classes, std::vector<std::string> drop_late,
                             std::chrono::seconds report_interval)
    : dir_(dir),
      data_dir_(data_dir),
      links_topic_(topic_prefix + ".links"),
      report_interval_(report_interval),
      qos_classes_(std::move(qos_classes)),
      drop_late_(std::move(drop_late)) {
  fs::create_directories(dir_);
  if (!fs::exists(ca_file())) {
    DevCertOptions o;
    o.overwrite = true;
    write_dev_certificates(dir_ / "certs", o);
  }
  const fs::path secret = dir_ / "auth-secret";
  if (!fs::exists(secret)) write_secret_file(secret);
  if (!fs::exists(token_file())) {
    TokenClaims c;
    c.subject = "diaspora-run";
    c.scopes = {"publish:" + topic_prefix + ".*", "subscribe:" + topic_prefix + ".*"};
    c.issued_at = std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now());
    c.expires_at = c.issued_at + std::chrono::hours(24 * 30);
    write_file_atomic(token_file(), issue_token(load_secret_file(secret), c) + "\n", 0600);
  }
  start();
}

EmbeddedRelay::~EmbeddedRelay() { stop(); }

std::string EmbeddedRelay::url() const { return "wss://127.0.0.1:" + std::to_string(port_); }

void EmbeddedRelay::start() {
  join_stop();
  if (relay_) return;
  RelayConfig c;
  c.listen = "127.0.0.1:" + std::to_string(port_);  // 0 the first time: a free port
  c.data_dir = data_dir_;
  c.tls_cert = dir_ / "certs" / "server.pem";
  c.tls_key = dir_ / "certs" / "server-key.pem";
  c.auth_secret_file = dir_ / "auth-secret";
  c.threads = 1;
  for (const auto& [topics, cls] : qos_classes_) c.qos.classes.push_back({topics, cls});
  c.qos.drop_late = drop_late_;
  c.qos.congestion_topic = links_topic_;  // the run reads it: its policies see congested consumers (task.link_wait)
  c.qos.report_interval = report_interval_;
  auto r = std::make_unique<Relay>(c);
  r->start();
  port_ = r->port();
  relay_ = std::move(r);
}

void EmbeddedRelay::stop() {
  join_stop();
  if (!relay_) return;
  relay_->stop();
  relay_.reset();
}

void EmbeddedRelay::stop_async() {
  if (!relay_ || stopping_) return;
  stopping_ = true;
  stopped_ = false;
  stopper_ = std::thread([this] {
    relay_->stop();
    stopped_ = true;
  });
}

void EmbeddedRelay::join_stop() {
  if (!stopping_) return;
  stopper_.join();
  stopping_ = false;
  relay_.reset();
}

bool EmbeddedRelay::try_start(std::string* why) {
  if (stopping_ && !stopped_) return false;  // still draining and syncing
  try {
    start();
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

}  // namespace diaspora::runner
