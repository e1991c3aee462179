// Blocking relay client: asynchronous Beast operations driven by io_context::run_for, so
// every step has a timeout (synchronous Asio calls cannot time out).
#include <array>
#include <span>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <boost/json.hpp>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "diaspora/client.hpp"
#include "diaspora/version.hpp"

namespace diaspora {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
namespace ssl = net::ssl;
namespace json = boost::json;
using tcp = net::ip::tcp;

struct RelayClient::Impl {
  RelayClientOptions opt;
  net::io_context ioc;
  ssl::context tls{ssl::context::tls_client};
  std::optional<websocket::stream<beast::ssl_stream<beast::tcp_stream>>> ws;
  beast::flat_buffer buffer;
  json::object welcome;
  std::string host, port, path;

  // Runs the io_context until `done` or the timeout; on timeout closes the socket.
  // Runs handlers until `done` is set or the wait is over (a read left pending by
  // poll_receive() keeps the io_context busy, so run_for alone would not return early).
  void run_until(const bool& done, std::chrono::milliseconds wait) {
    ioc.restart();
    const auto deadline = std::chrono::steady_clock::now() + wait;
    while (!done) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) break;
      if (ioc.run_one_for(deadline - now) == 0 && ioc.stopped()) break;
    }
  }

  void run(bool& done, const char* what) {
    run_until(done, opt.timeout);
    if (!done) {
      beast::get_lowest_layer(*ws).close();
      ioc.restart();
      ioc.poll();  // let the cancelled handler run
      throw RelayClientError(std::string("timed out after ") + std::to_string(opt.timeout.count()) + " ms " + what);
    }
  }

  [[noreturn]] void fail(const beast::error_code& ec, const std::string& what) {
    int code = 0;
    std::string msg = what + ": " + ec.message();
    if (ec == websocket::error::closed && ws) {
      code = ws->reason().code;
      msg = what + ": the relay closed the connection (code " + std::to_string(code) + ": " +
            std::string(ws->reason().reason.c_str()) + ")";
    }
    throw RelayClientError(msg, code);
  }

  void parse_url() {
    std::string_view u = opt.url;
    if (!u.starts_with("wss://"))
      throw RelayClientError("--url '" + opt.url + "': must start with wss:// (the relay only speaks TLS)");
    u.remove_prefix(6);
    auto slash = u.find('/');
    std::string_view hostport = u.substr(0, slash);
    path = slash == std::string_view::npos ? "/v1" : std::string(u.substr(slash));
    std::size_t colon;
    if (!hostport.empty() && hostport.front() == '[') {
      auto close = hostport.find(']');
      if (close == std::string_view::npos) throw RelayClientError("--url '" + opt.url + "': unclosed '['");
      host = std::string(hostport.substr(1, close - 1));
      colon = hostport.find(':', close);
    } else {
      colon = hostport.rfind(':');
      host = std::string(hostport.substr(0, colon));
    }
    port = colon == std::string_view::npos ? "443" : std::string(hostport.substr(colon + 1));
    if (host.empty()) throw RelayClientError("--url '" + opt.url + "': no host");
  }

  void connect() {
    parse_url();
    tls.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                    ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
    SSL_CTX_set_min_proto_version(tls.native_handle(), TLS1_2_VERSION);
    try {
      if (opt.ca_file.empty()) tls.set_default_verify_paths();
      else tls.load_verify_file(opt.ca_file.string());
      if (opt.client_cert) tls.use_certificate_chain_file(opt.client_cert->string());
      if (opt.client_key) tls.use_private_key_file(opt.client_key->string(), ssl::context::pem);
    } catch (const boost::system::system_error& e) {
      throw RelayClientError(std::string("TLS setup: ") + e.what() + " (check --ca and the client certificate)");
    }
    tls.set_verify_mode(ssl::verify_peer);
    ws.emplace(ioc, tls);

    bool done = false;
    beast::error_code ec;
    tcp::resolver resolver(ioc);
    tcp::resolver::results_type endpoints;
    resolver.async_resolve(host, port, [&](beast::error_code e, tcp::resolver::results_type r) {
      ec = e;
      endpoints = std::move(r);
      done = true;
    });
    run(done, "resolving the relay's address");
    if (ec) fail(ec, "resolving " + host);

    done = false;
    beast::get_lowest_layer(*ws).async_connect(endpoints, [&](beast::error_code e, const tcp::endpoint&) {
      ec = e;
      done = true;
    });
    run(done, "connecting");
    if (ec) fail(ec, "connecting to " + host + ":" + port);
    beast::get_lowest_layer(*ws).socket().set_option(tcp::no_delay(true), ec);

    auto& stream = ws->next_layer();
    SSL_set_tlsext_host_name(stream.native_handle(), host.c_str());
    stream.set_verify_callback(ssl::host_name_verification(host));
    done = false;
    stream.async_handshake(ssl::stream_base::client, [&](beast::error_code e) {
      ec = e;
      done = true;
    });
    run(done, "in the TLS handshake");
    if (ec) {
      // OpenSSL's error says only "certificate verify failed": name why (expired, not yet
      // valid, another CA, another host), which is what the operator must fix.
      const long why = SSL_get_verify_result(stream.native_handle());
      if (why != X509_V_OK)
        throw RelayClientError("TLS handshake with " + host + ": " + ec.message() + ": the relay's certificate: " +
                               X509_verify_cert_error_string(why) + " (check it with `diaspora certs check`; --ca " +
                               (opt.ca_file.empty() ? std::string("(the system's)") : opt.ca_file.string()) + ")");
      fail(ec, "TLS handshake with " + host);
    }

    ws->set_option(websocket::stream_base::decorator([this](websocket::request_type& req) {
      req.set(http::field::user_agent, std::string("diaspora/") + version_string);
      req.set(http::field::sec_websocket_protocol, opt.subprotocol);
      if (!opt.token.empty()) req.set(http::field::authorization, "Bearer " + opt.token);
    }));
    ws->read_message_max(64u << 20);
    ws->auto_fragment(false);         // one frame per message (see server.cpp)
    ws->write_buffer_bytes(64 * 1024);  // masking buffer: large pieces, fewer TLS records
    websocket::response_type res;
    done = false;
    ws->async_handshake(res, host + ":" + port, path, [&](beast::error_code e) {
      ec = e;
      done = true;
    });
    run(done, "in the WebSocket upgrade");
    if (ec) {
      std::string body = res.body();
      while (!body.empty() && body.back() == '\n') body.pop_back();
      throw RelayClientError("WebSocket upgrade refused: HTTP " + std::to_string(res.result_int()) +
                             (body.empty() ? "" : " (" + body + ")"));
    }
    ws->text(true);
    if (opt.subprotocol == "diaspora.v1") {
      json::object hello{{"op", "hello"}, {"client_id", opt.client_id}};
      if (!opt.producer_id.empty()) hello["producer_id"] = opt.producer_id;
      if (!opt.site.empty()) hello["site"] = opt.site;
      if (!opt.task.empty()) hello["task"] = opt.task;
      send(json::serialize(hello));
      welcome = receive_json();
      if (welcome["op"] != "welcome")
        throw RelayClientError("the relay refused hello: " + json::serialize(welcome));
    }
  }

  void send(std::string_view frame) { send_parts({frame}); }

  void send_parts(std::initializer_list<std::string_view> parts) {
    std::array<net::const_buffer, 4> bufs;
    if (parts.size() > bufs.size()) throw RelayClientError("internal: a frame of more than 4 parts");
    std::size_t n = 0;
    for (std::string_view p : parts) bufs[n++] = net::const_buffer(p.data(), p.size());
    bool done = false;
    beast::error_code ec;
    ws->async_write(std::span<const net::const_buffer>(bufs.data(), n), [&](beast::error_code e, std::size_t) {
      ec = e;
      done = true;
    });
    run(done, "sending");
    if (ec) fail(ec, "sending");
  }

  // One read may stay pending across poll_receive() calls; its completion is recorded
  // here, so a send() that runs the io_context can finish it too.
  bool read_pending = false, read_done = false;
  beast::error_code read_ec;

  void start_read() {
    if (read_pending) return;
    read_pending = true;
    read_done = false;
    ws->async_read(buffer, [this](beast::error_code e, std::size_t) {
      read_ec = e;
      read_done = true;
    });
  }

  bool last_binary = false;

  void send_binary(std::string_view frame) {
    ws->binary(true);
    try {
      send_parts({frame});
    } catch (...) {
      ws->text(true);
      throw;
    }
    ws->text(true);
  }

  std::string take_frame() {
    read_pending = false;
    if (read_ec) fail(read_ec, "receiving");
    last_binary = ws->got_binary();
    std::string out = beast::buffers_to_string(buffer.data());
    buffer.consume(buffer.size());
    return out;
  }

  std::string receive() {
    start_read();
    if (!read_done) run(read_done, "waiting for the relay");
    return take_frame();
  }

  std::optional<std::string> poll_receive(std::chrono::milliseconds wait) {
    start_read();
    if (!read_done) {
      if (wait.count() > 0) {
        run_until(read_done, wait);
      } else {
        ioc.restart();
        ioc.poll();
      }
    }
    if (!read_done) return std::nullopt;
    return take_frame();
  }

  json::object receive_json() {
    std::string text = receive();
    auto o = RelayClient::parse_frame(text);
    if (!o) throw RelayClientError("the relay sent a frame that is not a JSON object: " + text.substr(0, 200));
    return std::move(*o);
  }
};

std::optional<json::object> RelayClient::parse_frame(std::string_view text) {
  json::parse_options opt;
  opt.max_depth = 64;
  boost::system::error_code ec;
  json::value v = json::parse(text, ec, {}, opt);
  if (ec || !v.is_object()) return std::nullopt;
  return std::move(v.get_object());
}

RelayClient::RelayClient(RelayClientOptions options) : self_(std::make_unique<Impl>()) {
  self_->opt = std::move(options);
  self_->connect();
}

RelayClient::~RelayClient() { close(); }

void RelayClient::send(std::string_view frame) { self_->send(frame); }
void RelayClient::send(std::initializer_list<std::string_view> parts) { self_->send_parts(parts); }
void RelayClient::send_binary(std::string_view frame) { self_->send_binary(frame); }
std::string RelayClient::receive() { return self_->receive(); }
bool RelayClient::last_binary() const noexcept { return self_->last_binary; }
std::optional<std::string> RelayClient::poll_receive(std::chrono::milliseconds wait) {
  return self_->poll_receive(wait);
}
json::object RelayClient::receive_json() { return self_->receive_json(); }
const json::object& RelayClient::welcome() const noexcept { return self_->welcome; }

void RelayClient::close() noexcept {
  if (!self_ || !self_->ws || !self_->ws->is_open()) return;
  try {
    bool done = false;
    self_->ws->async_close(websocket::close_code::normal, [&](beast::error_code) { done = true; });
    auto saved = self_->opt.timeout;
    self_->opt.timeout = std::chrono::milliseconds(2000);
    try {
      self_->run(done, "closing");
    } catch (...) {
    }
    self_->opt.timeout = saved;
  } catch (...) {
  }
}

}  // namespace diaspora
