// The relay's network side: one TLS port serving HTTPS and WebSocket (subprotocols
// diaspora.v1 and cloudevents.json). All Beast code of the server lives in this one
// translation unit (Beast TLS WebSocket instantiations cost ~80 s of compile time each).
//
// Structure (Beast's chat-multi idiom): Relay::Impl accepts (do_accept); HttpSession does
// the TLS handshake and serves HTTP requests until one is a WebSocket upgrade, then hands
// the stream to WsSession. Every connection runs on its own strand. The log's syncers
// report commits to the Hub, which pokes the subscribed sessions (weak_ptrs copied under
// the lock, posts made outside it). Work that can wait runs off the I/O threads: group
// commits on `commits`, views queries on `queries`.
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
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include "diaspora/data_item.hpp"
#include "diaspora/event.hpp"
#include "diaspora/relay.hpp"
#include "diaspora/thread_name.hpp"
#include "diaspora/token.hpp"
#include "diaspora/version.hpp"
#include "config.hpp"
#include "event_text.hpp"
#include "http_api.hpp"
#include "items.hpp"
#include "metrics.hpp"
#include "qos.hpp"
#include "jetstream_store.hpp"
#include "topic_log.hpp"
#include "views.hpp"

namespace diaspora {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
namespace ssl = net::ssl;
namespace json = boost::json;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// WebSocket close codes (4000-4999 are application codes; docs/protocol.md lists them).
constexpr std::uint16_t kCloseUnauthorized = 4001;
constexpr std::uint16_t kCloseIdle = 4002;
constexpr std::uint16_t kCloseForbidden = 4003;
constexpr std::uint16_t kCloseSlowConsumer = 4008;

// Limits on what one connection may make the relay hold (docs/protocol.md, "Limits").
constexpr std::size_t kMaxQueuedReplyBytes = 1u << 20;  // replies queued unread: reading pauses above this
constexpr std::size_t kMaxIdBytes = 256;                // request ids echoed in replies
constexpr std::size_t kMaxSubscriptions = 256;          // per connection
constexpr std::size_t kMaxPatternBytes = 200;           // like a topic name
constexpr auto kHelloTimeout = std::chrono::seconds(10);  // a diaspora.v1 connection must say hello by then

std::string json_str(std::string_view s) { return json::serialize(json::string(s)); }

// A request id a reply may repeat: a number, or a string of at most kMaxIdBytes.
bool echoable_id(const json::value& v) {
  return v.is_number() || (v.is_string() && v.get_string().size() <= kMaxIdBytes);
}

// Client text quoted in a message, cut to a readable length.
std::string clip(std::string_view text, std::size_t max = 64) {
  if (text.size() <= max) return std::string(text);
  return std::string(text.substr(0, max)) + "...";
}

// `ref` repeats the request's id or seq when it is echoable (anything else is left out,
// so that no reply is larger than a few hundred bytes plus its message).
std::string error_frame(std::string_view code, std::string_view message, const json::value* ref = nullptr) {
  json::object o{{"op", "error"}, {"code", code}, {"message", message}};
  if (ref && echoable_id(*ref)) o["ref"] = *ref;
  return json::serialize(o);
}

// An offset in text: decimal digits only, within 64 bits.
std::optional<std::uint64_t> parse_offset(std::string_view text) {
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || text.front() == '-') return std::nullopt;
  return v;
}

// A WebSocket close reason is at most 123 bytes: cut at a UTF-8 character boundary.
std::string close_reason_text(std::string text, std::size_t max = 120) {
  if (text.size() <= max) return text;
  std::size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;  // text[n] continues a character
  text.resize(n);
  return text;
}

// A subscribe pattern: 1-200 characters of the topic alphabet and '*'.
bool valid_pattern(std::string_view p) {
  if (p.empty() || p.size() > kMaxPatternBytes) return false;
  return std::all_of(p.begin(), p.end(), [](char c) { return c == '*' || relay::valid_topic_char(c); });
}

// The admin console's built assets: the configured folder, else the build tree's (the
// relay was built beside them), else the installed share/diaspora/console; empty: none.
std::filesystem::path find_console_dir(const std::optional<std::filesystem::path>& configured) {
  if (configured) return *configured;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  for (const std::filesystem::path& p :
       {std::filesystem::path(DIASPORA_CONSOLE_BUILD_DIR), exe.parent_path().parent_path() / "share" / "diaspora" / "console"})
    if (!p.empty() && std::filesystem::exists(p / "index.html", ec)) return p;
  return {};
}

std::vector<relay::TopicRetention> retention_rules(const RelayConfig& cfg) {
  std::vector<relay::TopicRetention> out;
  for (const auto& r : cfg.retention_by_topic) out.push_back({r.topics, relay::Retention{r.bytes, r.age}});
  return out;
}

std::optional<std::string> bearer_of(const http::request<http::string_body>& req) {
  auto it = req.find(http::field::authorization);
  return relay::bearer_token(it == req.end() ? std::nullopt : std::optional<std::string_view>(it->value()));
}


}  // namespace

class WsSession;

// ---- shared state -----------------------------------------------------------------------

struct Relay::Impl : std::enable_shared_from_this<Relay::Impl> {
  RelayConfig cfg;
  std::unique_ptr<relay::Store> store;
  std::unique_ptr<relay::Views> views;  ///< reads `store`: made after it, reset before it
  std::filesystem::path console_dir;    ///< the console's assets (cfg.console_dir or found), or empty
  std::optional<TokenVerifier> verifier;
  // The TLS context new connections use. A reload (SIGHUP, Relay::reload_tls) makes a new
  // one; the old ones stay until the relay goes (their sessions may still use them, and a
  // reload is rare: a certificate renewed every few weeks).
  std::mutex tls_mutex;
  std::vector<std::unique_ptr<ssl::context>> tls_contexts;  // guarded by tls_mutex; back() is current
  ssl::context& current_tls() {
    std::lock_guard lock(tls_mutex);
    return *tls_contexts.back();
  }
  std::optional<net::io_context> ioc{std::in_place};
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  // Consumer-group commits (two fsyncs each) run here, one after another, off the I/O
  // threads: a commit must not stall every session of the thread that received it.
  std::optional<net::thread_pool> commits{std::in_place, 1};
  // Views queries (GET /api/v1/views/...) and topic reads (GET /api/v1/topics...: a browse
  // scans up to a million records) run here: a query scans a view under its lock,
  // which the views' reader holds while it applies a round of records, and a console
  // reload asks several at once. On the I/O threads that would delay publish acks.
  std::optional<net::thread_pool> queries{std::in_place, 1};
  std::atomic<std::uint16_t> bound_port{0};
  std::atomic<bool> stopping{false};
  std::mutex stop_mutex;
  std::condition_variable stopped_cv;
  bool stopped = false;
  bool started = false;
  relay::Metrics metrics;
  CodecOptions codec;
  std::unique_ptr<relay::ItemBudget> item_budget;  ///< items being received, all connections (max_item_bytes_total)
  relay::QosClassifier qos;                        ///< each topic's QoS class (cfg.qos.classes, then the defaults)
  std::array<bool, relay::kQosClasses> drop_late{};  ///< cfg.qos.drop_late, by class

  // Hub: live WebSocket sessions, for commit notifications and shutdown.
  std::mutex sessions_mutex;
  std::vector<std::weak_ptr<WsSession>> sessions;

  void add_session(const std::shared_ptr<WsSession>& s) {
    std::lock_guard lock(sessions_mutex);
    std::erase_if(sessions, [](const auto& w) { return w.expired(); });
    sessions.push_back(s);
  }
  std::vector<std::shared_ptr<WsSession>> live_sessions() {
    std::vector<std::shared_ptr<WsSession>> out;
    std::lock_guard lock(sessions_mutex);
    for (const auto& w : sessions)
      if (auto s = w.lock()) out.push_back(std::move(s));
    return out;
  }
  void on_commit(const std::string& topic);
  void do_accept();

  // Every qos.report_interval: each session reports its congestion (WsSession::report_congestion).
  std::optional<net::steady_timer> report_timer;
  void arm_report_timer();
};

// ---- WebSocket session -------------------------------------------------------------------

class WsSession : public std::enable_shared_from_this<WsSession> {
 public:
  enum class Mode { v1, cloudevents };

  WsSession(beast::ssl_stream<beast::tcp_stream>&& stream, std::shared_ptr<Relay::Impl> relay)
      : ws_(std::move(stream)),
        relay_(std::move(relay)),
        timer_(ws_.get_executor()),
        rate_timer_(ws_.get_executor()),
        pace_timer_(ws_.get_executor()),
        queues_(!relay_->cfg.qos.enabled,
                {relay_->cfg.qos.weight_lifecycle, relay_->cfg.qos.weight_telemetry, relay_->cfg.qos.weight_bulk}) {
    queues_.set_bulk_rate(static_cast<double>(relay_->cfg.qos.bulk_rate));
  }

  ~WsSession() {
    relay_->metrics.websockets--;
    for (const auto& [key, sub] : subs_) relay_->metrics.subscribed(sub.pattern, -1);
  }

  // Accepts the upgrade. `claims` set when the upgrade carried a valid bearer token.
  void run(http::request<http::string_body> req, Mode mode, std::string subprotocol, std::optional<TokenClaims> claims,
           std::string ce_topic, std::string ce_from) {
    mode_ = mode;
    accepted_at_ = Clock::now();
    items_.emplace(relay::ItemLimits{relay_->cfg.max_item_bytes, relay_->cfg.max_pending_item_bytes, relay_->cfg.max_event_bytes},
                   relay_->item_budget.get());
    claims_ = std::move(claims);
    if (claims_) set_token_deadline();
    ce_topic_ = std::move(ce_topic);
    relay_->metrics.websockets++;
    // The HTTP phase armed the TCP stream's own deadline; from here the WebSocket's
    // timeouts govern (Beast: never use both on one stream).
    beast::get_lowest_layer(ws_).expires_never();
    // Idle connections: arm_timer() pings a peer silent for a third of limits.idle_timeout and
    // closes with 4002 once nothing at all (data, a partial frame, a pong) came for all of
    // it; time while this side does not read (flow control) does not count. Beast's own
    // idle timeout, which would drop the socket without a close frame, is only a backstop.
    last_heard_ = Clock::now();
    auto timeouts = websocket::stream_base::timeout::suggested(beast::role_type::server);
    timeouts.idle_timeout = relay_->cfg.idle_timeout + std::chrono::seconds(15);
    timeouts.keep_alive_pings = false;  // arm_timer() pings
    // Also bounds the closing handshake and the TLS teardown: a peer that does not answer
    // close_notify does not keep the connection (or a graceful shutdown) waiting.
    timeouts.handshake_timeout = std::chrono::seconds(2);
    ws_.set_option(timeouts);
    ws_.control_callback([this](websocket::frame_type, beast::string_view) { last_heard_ = Clock::now(); });
    ws_.set_option(websocket::stream_base::decorator([subprotocol](websocket::response_type& res) {
      res.set(http::field::server, std::string("diaspora-relay/") + version_string);
      if (!subprotocol.empty()) res.set(http::field::sec_websocket_protocol, subprotocol);
    }));
    ws_.read_message_max(relay_->cfg.max_frame_bytes);
    // One WebSocket frame per message, written in large pieces: Beast's default 4 KiB
    // fragments cost a TLS record, a sendmsg and an epoll wakeup each.
    ws_.auto_fragment(false);
    ws_.write_buffer_bytes(64 * 1024);
    ws_.async_accept(req, beast::bind_front_handler(&WsSession::on_accept, shared_from_this(), std::move(ce_from)));
  }

  // From any thread: new records were committed to `topic`. Sessions that never
  // subscribed (publishers) are skipped: the writer calls this after every group commit.
  void notify(const std::string& topic) {
    if (!subscribed_.load(std::memory_order_acquire)) return;
    net::post(ws_.get_executor(), [self = shared_from_this(), topic] { self->on_notify(topic); });
  }
  // From any thread: graceful close for shutdown.
  void shutdown() {
    net::post(ws_.get_executor(), [self = shared_from_this()] {
      self->close(websocket::close_code::going_away, "relay shutting down");
    });
  }

  // Congestion as a signal (docs/streaming.md#congestion-as-events): every
  // qos.report_interval, on this session's strand. While frames of a class other than bulk
  // waited longer than qos.congested_wait_ms in its queue, or delivery is paused (a class's
  // queue full), the connection is congested: an org.diaspora.resource.status (kind link,
  // degraded) with its queues, waits and rates goes to qos.congestion_topic each interval,
  // and one saying up when it clears.
  void report_congestion(double interval_s) {
    net::post(ws_.get_executor(), [self = shared_from_this(), interval_s] { self->congestion_round(interval_s); });
  }

 private:
  struct Cursor {
    std::uint64_t next = 0;
    relay::QosClass cls = relay::QosClass::lifecycle;  // its topic's class: the send queue its frames go to
  };
  Cursor cursor_at(const std::string& topic, std::uint64_t next) const { return Cursor{next, relay_->qos.classify(topic)}; }
  struct Subscription {
    json::value id;
    std::string pattern;
    std::optional<std::string> group;
    bool latest_only = false;  // each delivery: the newest record only (dashboards)
    bool stamps = false;       // each delivered event carries its append time (appended_us)
    relay::TokenBucket rate;   // max_rate: records/s delivered at most, a bucket of one second's worth (rate 0: no bound)
    std::map<std::string, Cursor> cursors;  // topic -> next offset
  };

  void on_accept(std::string ce_from, beast::error_code ec) {
    if (ec) return;
    relay_->add_session(shared_from_this());
    if (mode_ == Mode::cloudevents) {
      hello_done_ = true;
      if (scopes_allow(claims_->scopes, "subscribe", ce_topic_)) {
        Subscription sub;
        sub.id = "ce";
        sub.pattern = ce_topic_;
        // ce_from was checked at the upgrade: earliest, latest or an offset.
        std::uint64_t start = ce_from == "earliest" ? relay_->store->first_offset(ce_topic_)
                                                    : relay_->store->committed_offset(ce_topic_);
        if (auto offset = parse_offset(ce_from)) start = *offset;
        sub.cursors[ce_topic_] = cursor_at(ce_topic_, start);
        relay_->metrics.subscribed(ce_topic_, +1);
        subs_.emplace("ce", std::move(sub));
        subscribed_.store(true, std::memory_order_release);
      }
      pump();
    }
    arm_timer();
    do_read();
  }

  void do_read() {
    if (closing_) return;
    if (inflight_ >= relay_->cfg.max_inflight_batches || reply_bytes_ > kMaxQueuedReplyBytes) {
      // Flow control: resumes when an ack frees a slot (on_appended), or when the client
      // has read its replies (on_write). A client that sends without reading is no longer
      // read: TCP backpressure instead of a reply queue that grows without bound.
      read_paused_ = true;
      return;
    }
    read_paused_ = false;
    ws_.async_read(buffer_, beast::bind_front_handler(&WsSession::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, std::size_t) {
    if (ec) {
      // Includes message_too_big: Beast has already sent close 1009 to the client.
      closing_ = true;
      timer_.cancel();
      rate_timer_.cancel();
      pace_timer_.cancel();
      return;
    }
    last_heard_ = Clock::now();
    if (!ws_.got_text()) {
      if (mode_ == Mode::cloudevents) {  // the binding has no error message: close, as for an invalid event
        buffer_.consume(buffer_.size());
        return close(websocket::close_code::unknown_data, "binary frames are not accepted; send one JSON CloudEvent per text frame");
      }
      if (!close_after_drain_)
        handle_chunk(std::string_view(static_cast<const char*>(buffer_.data().data()), buffer_.size()));
      buffer_.consume(buffer_.size());
      return do_read();
    }
    if (!close_after_drain_) {  // shutting down: nothing new is accepted
      // A flat_buffer is contiguous: parse the frame in place, no copy.
      std::string_view text(static_cast<const char*>(buffer_.data().data()), buffer_.size());
      if (mode_ == Mode::cloudevents) handle_ce_frame(text);
      else handle_frame(text);
    }
    buffer_.consume(buffer_.size());
    do_read();
  }

  // ---- diaspora.v1 ----
  void handle_frame(std::string_view text) {
    boost::system::error_code ec;
    // One arena per frame: a publish of thousands of events parses without a malloc per
    // value. Nothing parsed here outlives the frame (records copy what they keep).
    json::monotonic_resource arena(text.size() * 2 + 1024);
    json::value msg = json::parse(text, ec, &arena);
    if (ec || !msg.is_object()) return send_error("bad_json", "frame is not a JSON object: " + ec.message(), nullptr);
    const json::object& o = msg.get_object();
    const json::value* opv = o.if_contains("op");
    if (!opv || !opv->is_string()) return send_error("bad_request", "missing string field 'op'", nullptr);
    std::string_view op = opv->get_string();
    const json::value* ref = nullptr;
    if (op == "publish" || op == "put") ref = o.if_contains("seq");
    else if (op == "subscribe" || op == "unsubscribe") ref = o.if_contains("id");
    if (!hello_done_ && op != "hello" && op != "ping")
      return send_error("hello_required", "send 'hello' first", ref);
    if (hello_done_ && claims_ && Clock::now() > token_deadline_) return end_expired();
    if (op == "hello") return on_hello(o);
    if (op == "publish") return on_publish(o, text);
    if (op == "put") return on_put(o);
    if (op == "subscribe") return on_subscribe(o);
    if (op == "unsubscribe") return on_unsubscribe(o);
    if (op == "commit") return on_commit_offset(o);
    if (op == "ping") {
      json::object pong{{"op", "pong"}};
      if (const auto* id = o.if_contains("id")) {
        if (!echoable_id(*id))
          return send_error("bad_request", "'id' must be a number or a string of at most 256 bytes", nullptr);
        pong["id"] = *id;
      }
      return send(json::serialize(pong));
    }
    send_error("unknown_op", "unknown op '" + clip(op) + "'", nullptr);
  }

  void on_hello(const json::object& o) {
    if (hello_done_) return send_error("bad_request", "'hello' was already sent on this connection", nullptr);
    auto str = [&](std::string_view k) -> std::string {
      const json::value* v = o.if_contains(k);
      return v && v->is_string() ? std::string(v->get_string()) : std::string();
    };
    std::string token = str("token");
    if (!token.empty()) {
      try {
        claims_ = relay_->verifier->verify(token);
      } catch (const TokenError& e) {
        relay_->metrics.refused_auth++;
        send_error(token_error_code(e.code()), e.what(), nullptr);
        return close(static_cast<websocket::close_code>(kCloseUnauthorized), "unauthorized");
      }
    }
    if (!claims_) {
      relay_->metrics.refused_auth++;
      send_error("unauthorized", "no token: send it in 'hello' or as 'Authorization: Bearer' on the upgrade", nullptr);
      return close(static_cast<websocket::close_code>(kCloseUnauthorized), "unauthorized");
    }
    set_token_deadline();
    client_id_ = str("client_id");
    producer_id_ = str("producer_id");
    if (producer_id_.size() > 256) return send_error("bad_request", "producer_id longer than 256 bytes", nullptr);
    site_ = str("site");  // where the client is and which task it works for: named in its congestion events
    task_ = str("task");
    if (site_.size() > 256 || task_.size() > 256)
      return send_error("bad_request", "site and task must be at most 256 bytes", nullptr);
    if (const json::value* rate = o.if_contains("bulk_rate")) {  // this client's link: bulk paced to it
      boost::system::error_code ec;
      const double r = rate->to_number<double>(ec);
      if (ec || !(r >= 0 && r <= 1e12))
        return send_error("bad_request", "bulk_rate must be bytes/s, 0 (not paced) to 1e12", nullptr);
      queues_.set_bulk_rate(r);
    }
    hello_done_ = true;
    json::object w{{"op", "welcome"},
                   {"server", std::string("diaspora-relay/") + version_string},
                   {"protocol", "diaspora.v1"},
                   {"subject", claims_->subject},
                   {"max_frame_bytes", relay_->cfg.max_frame_bytes},
                   {"max_event_bytes", relay_->cfg.max_event_bytes},
                   {"max_batch_events", relay_->cfg.max_batch_events},
                   {"max_inflight_batches", relay_->cfg.max_inflight_batches}};
    send(json::serialize(w));
  }

  // The session ends when its token expires (plus the verifier's 30 s leeway).
  void set_token_deadline() {
    auto remaining = claims_->expires_at - std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now());
    token_deadline_ = Clock::now() + remaining + std::chrono::seconds(30);
  }

  // Ends the session whose token expired: a token_expired error (diaspora.v1), then a close.
  void end_expired() {
    relay_->metrics.token_expiries++;
    if (mode_ == Mode::v1) send_error("token_expired", "the session's token has expired; reconnect with a new token", nullptr);
    close(static_cast<websocket::close_code>(kCloseUnauthorized), "token expired");
  }

  static std::string token_error_code(TokenErrc c) {
    switch (c) {
      case TokenErrc::expired: return "token_expired";
      case TokenErrc::insufficient_scope: return "forbidden";
      default: return "unauthorized";
    }
  }

  bool allowed(std::string_view action, const std::string& topic, const json::value* ref) {
    if (scopes_allow(claims_->scopes, action, topic)) return true;
    send_error("forbidden", "token of '" + claims_->subject + "' does not grant " + std::string(action) + " on '" + topic + "'",
               ref);
    return false;
  }

  void nack(const json::value* seq, std::string_view code, const std::string& message,
            std::optional<std::size_t> index = std::nullopt) {
    json::object n{{"op", "nack"}, {"code", code}, {"message", message}};
    n["seq"] = seq && echoable_id(*seq) ? *seq : json::value(nullptr);  // null when missing or not echoable
    if (index) n["index"] = *index;
    send(json::serialize(n));
  }

  void nack_refusal(const json::value* seq, const relay::PublishRefusal& r) { nack(seq, r.code, r.message, r.index); }

  // A publish's or put's seq and topic, checked, and the token's right to publish there;
  // nullopt once the nack is sent.
  std::optional<std::pair<std::uint64_t, std::string>> publish_target(const json::object& o) {
    const json::value* seqv = o.if_contains("seq");
    relay::PublishRefusal refusal;
    auto head = relay::publish_head(o, refusal);
    if (!head) {
      nack_refusal(seqv, refusal);
      return std::nullopt;
    }
    if (!scopes_allow(claims_->scopes, "publish", head->second)) {
      nack(seqv, "forbidden", "token of '" + claims_->subject + "' does not grant publish on '" + head->second + "'");
      return std::nullopt;
    }
    return head;
  }

  void on_publish(const json::object& o, std::string_view frame_text) {
    const json::value* seqv = o.if_contains("seq");
    auto head = publish_target(o);
    if (!head) return;
    auto& [seq, topic] = *head;
    std::vector<relay::AppendRecord> records;
    std::uint64_t bytes = 0;
    const relay::PublishLimits limits{relay_->cfg.max_batch_events, relay_->cfg.max_event_bytes};
    if (auto err = relay::publish_records(o, frame_text, limits, relay_->codec, records, bytes))
      return nack_refusal(seqv, *err);
    submit(std::move(topic), seq, std::move(records), bytes, json::value(seq));
  }

  // A data item announced (docs/streaming.md): its chunks follow in binary frames.
  void on_put(const json::object& o) {
    const json::value* seqv = o.if_contains("seq");
    auto head = publish_target(o);
    if (!head) return;
    auto& [seq, topic] = *head;
    std::optional<relay::ReadyItem> ready;
    if (auto err = items_->begin(o, seq, topic, relay_->codec, ready)) return nack_refusal(seqv, *err);
    if (ready) submit_item(std::move(*ready));
  }

  // A binary frame: a chunk of an item announced on this connection.
  void handle_chunk(std::string_view bytes) {
    if (!hello_done_) return send_error("hello_required", "send 'hello' first", nullptr);
    if (claims_ && Clock::now() > token_deadline_) return end_expired();
    relay::ChunkOutcome out = items_->chunk(bytes);
    if (out.refusal) {
      if (!out.seq) return send_error(out.refusal->code, out.refusal->message, nullptr);
      const json::value seq(*out.seq);
      return nack_refusal(&seq, *out.refusal);
    }
    if (out.ready) submit_item(std::move(*out.ready));
  }

  void submit_item(relay::ReadyItem item) {
    if (item.deadline_us && now_us() > *item.deadline_us &&
        relay_->drop_late[static_cast<std::size_t>(relay_->qos.classify(item.topic))]) {
      // Past its deadline, and its topic's class drops late items (qos.drop_late): nothing stored.
      items_->settled(item.size);
      relay_->metrics.items_dropped_late++;
      const json::value seq(item.seq);
      return nack(&seq, "late",
                  "the item came after its itemdeadline and the class of '" + item.topic +
                      "' drops late items (qos.drop_late): nothing was stored");
    }
    submit(std::move(item.topic), item.seq, std::move(item.records), item.bytes, json::value(item.seq),
           Settle{item.size, item.deadline_us});
  }

  // What an item's ack settles: its bytes in the assembler's count, and whether it was late.
  struct Settle {
    std::uint64_t item_bytes = 0;
    std::optional<std::int64_t> deadline_us;
  };

  void submit(std::string topic, std::uint64_t seq, std::vector<relay::AppendRecord> records, std::uint64_t bytes,
              json::value seq_json, std::optional<Settle> item = std::nullopt) {
    ++inflight_;
    auto self = shared_from_this();
    relay_->store->append(
        topic, mode_ == Mode::v1 ? producer_id_ : std::string(), seq, std::move(records),
        [self, topic, bytes, seq_json, item](const relay::AppendResult& r) {
          net::post(self->ws_.get_executor(),
                    [self, topic, bytes, seq_json, item, r] { self->on_appended(topic, bytes, seq_json, r, item); });
        });
  }

  void on_appended(const std::string& topic, std::uint64_t bytes, const json::value& seq, const relay::AppendResult& r,
                   const std::optional<Settle>& item) {
    --inflight_;
    if (r.ok) relay_->metrics.in(topic, r.written, r.written ? bytes : 0, r.duplicates);
    if (item) items_->settled(item->item_bytes);
    if (item && r.ok && r.written) relay_->metrics.items_in++;
    if (mode_ == Mode::v1) {
      if (r.ok) {
        json::object a{{"op", "ack"},          {"seq", seq},
                       {"topic", topic},       {"first_offset", r.first_offset},
                       {"count", r.written},   {"duplicates", r.duplicates}};
        if (r.duplicate_batch) a["duplicate_batch"] = true;
        if (item && item->deadline_us && now_us() > *item->deadline_us) {  // stored after its deadline: said, kept
          a["late"] = true;
          relay_->metrics.items_late++;
        }
        send(json::serialize(a));
      } else {
        nack(&seq, r.code, r.error);
      }
    } else if (!r.ok) {  // cloudevents.json has no nack: say it in the close
      close(websocket::close_code::internal_error, close_reason_text(std::string(r.code) + ": " + r.error));
    }
    after_reply();
  }

  // A request in flight got its reply: reading may resume (do_read checks the limits
  // again), and a graceful close may have been waiting for it.
  void after_reply() {
    if (read_paused_ && !closing_ && !close_after_drain_) do_read();
    maybe_close();
  }

  void on_subscribe(const json::object& o) {
    const json::value* idv = o.if_contains("id");
    if (!idv || !echoable_id(*idv))
      return send_error("bad_request",
                        "'id' (a number or a string of at most 256 bytes) names the subscription in 'events' frames",
                        nullptr);
    std::string key = json::serialize(*idv);
    if (subs_.count(key)) return send_error("bad_request", "subscription id " + key + " is already in use", idv);
    if (subs_.size() >= kMaxSubscriptions)
      return send_error("bad_request",
                        "at most " + std::to_string(kMaxSubscriptions) +
                            " subscriptions per connection: unsubscribe one, or use a pattern",
                        idv);
    const json::value* tv = o.if_contains("topic");
    if (!tv || !tv->is_string() || tv->get_string().empty())
      return send_error("bad_request", "'topic' must be a topic name or a pattern with '*'", idv);
    std::string pattern(tv->get_string());
    bool is_pattern = pattern.find('*') != std::string::npos;
    if (is_pattern ? !valid_pattern(pattern) : !relay::valid_topic_name(pattern))
      return send_error("bad_topic",
                        "'" + clip(pattern) + "' is not a valid topic name" +
                            (is_pattern ? " or pattern (1-200 characters of A-Z a-z 0-9 . _ - *)" : ""),
                        idv);
    if (!allowed("subscribe", pattern, idv)) return;
    Subscription sub;
    sub.id = *idv;
    sub.pattern = pattern;
    if (const json::value* g = o.if_contains("group")) {
      if (!g->is_string() || !relay::valid_topic_name(g->get_string()))
        return send_error("bad_request", "'group' must be 1-200 characters of A-Z a-z 0-9 . _ -", idv);
      sub.group = std::string(g->get_string());
    }
    if (const json::value* mr = o.if_contains("max_rate")) {
      if (!mr->is_number() || mr->to_number<double>() < 0.01 || mr->to_number<double>() > 1e6)
        return send_error("bad_request", "'max_rate' must be a number of records per second from 0.01 to 1000000", idv);
      const double max_rate = mr->to_number<double>();
      sub.rate = relay::TokenBucket::holding(max_rate, std::max(1.0, max_rate), std::max(1.0, max_rate / 10));  // a first delivery at once
    }
    if (const json::value* st = o.if_contains("stamps")) {
      if (!st->is_bool()) return send_error("bad_request", "'stamps' must be true or false", idv);
      sub.stamps = st->get_bool();
    }
    if (const json::value* lo = o.if_contains("latest_only")) {
      if (!lo->is_bool()) return send_error("bad_request", "'latest_only' must be true or false", idv);
      sub.latest_only = lo->get_bool();
    }
    // from: "earliest" | "latest" (default) | offset | {"time": RFC 3339}
    std::string from = "latest";
    std::uint64_t from_offset = 0;
    std::int64_t from_time_us = 0;
    if (const json::value* f = o.if_contains("from")) {
      const json::value* ftime = f->is_object() ? f->get_object().if_contains("time") : nullptr;
      if (f->is_string() && (f->get_string() == "earliest" || f->get_string() == "latest")) from = f->get_string();
      else if (f->is_uint64() || (f->is_int64() && f->get_int64() >= 0)) {
        from = "offset";
        from_offset = f->to_number<std::uint64_t>();
      } else if (ftime && f->get_object().size() == 1) {
        const auto at = ftime->is_string() ? parse_rfc3339_us(ftime->get_string()) : std::nullopt;
        if (!at) return send_error("bad_request", "'from.time' must be an RFC 3339 timestamp (e.g. 2026-12-02T17:00:00Z)", idv);
        from = "time";
        from_time_us = *at;
      } else {
        return send_error("bad_request",
                          "'from' must be \"earliest\", \"latest\", a non-negative offset or {\"time\": RFC 3339}", idv);
      }
    }
    json::array topics;
    for (const auto& t : relay_->store->topics()) {
      if (!(is_pattern ? topic_matches(pattern, t) : t == pattern)) continue;
      if (!scopes_allow(claims_->scopes, "subscribe", t)) continue;
      sub.cursors[t] = cursor_at(t, start_offset(t, sub.group, from, from_offset, from_time_us));
      topics.emplace_back(t);
    }
    if (!is_pattern && !sub.cursors.count(pattern)) {
      sub.cursors[pattern] = cursor_at(pattern, from == "offset" ? from_offset : 0);  // topic created later: all of it
      topics.emplace_back(pattern);
    }
    json::object reply{{"op", "subscribed"}, {"id", *idv}, {"topics", topics}};
    json::object offs;
    for (const auto& [t, c] : sub.cursors) offs[t] = c.next;
    reply["offsets"] = std::move(offs);
    relay_->metrics.subscribed(sub.pattern, +1);
    subs_.emplace(key, std::move(sub));
    subscribed_.store(true, std::memory_order_release);
    send(json::serialize(reply));
    pump();
  }

  std::uint64_t start_offset(const std::string& topic, const std::optional<std::string>& group, const std::string& from,
                             std::uint64_t from_offset, std::int64_t from_time_us = 0) {
    if (group)
      if (auto committed = relay_->store->group_offset(*group, topic)) return *committed;
    if (from == "earliest") return relay_->store->first_offset(topic);
    if (from == "offset") return from_offset;
    if (from == "time") return relay_->store->offset_at_time(topic, from_time_us);
    return relay_->store->committed_offset(topic);
  }

  void on_unsubscribe(const json::object& o) {
    const json::value* idv = o.if_contains("id");
    auto it = idv ? subs_.find(json::serialize(*idv)) : subs_.end();
    if (it == subs_.end()) return send_error("not_found", "no subscription with that id", idv);
    relay_->metrics.subscribed(it->second.pattern, -1);
    subs_.erase(it);
    send(json::serialize(json::object{{"op", "unsubscribed"}, {"id", *idv}}));
  }

  void on_commit_offset(const json::object& o) {
    const json::value* g = o.if_contains("group");
    const json::value* t = o.if_contains("topic");
    const json::value* off = o.if_contains("offset");
    if (!g || !g->is_string() || !relay::valid_topic_name(g->get_string()) || !t || !t->is_string() ||
        !relay::valid_topic_name(t->get_string()) || !off || !(off->is_uint64() || (off->is_int64() && off->get_int64() >= 0)))
      return send_error("bad_request", "commit needs 'group', 'topic' and a non-negative 'offset' (the next offset to read)",
                        nullptr);
    std::string topic(t->get_string());
    if (!allowed("subscribe", topic, nullptr)) return;
    // Synced on the relay's commit thread (in arrival order); the reply comes back here.
    // Counted in flight so that a graceful close waits for it.
    ++inflight_;
    std::string reply =
        json::serialize(json::object{{"op", "committed"}, {"group", *g}, {"topic", *t}, {"offset", *off}});
    net::post(*relay_->commits, [self = shared_from_this(), group = std::string(g->get_string()), topic,
                                 offset = off->to_number<std::uint64_t>(), reply = std::move(reply)]() mutable {
      std::string error, code = "storage_error";
      try {
        self->relay_->store->commit_group_offset(group, topic, offset);
      } catch (const relay::GroupLimitError& e) {
        error = e.what();
        code = "too_many_groups";
      } catch (const std::exception& e) {
        error = e.what();
      }
      net::post(self->ws_.get_executor(), [self, error = std::move(error), code = std::move(code), group, topic,
                                           reply = std::move(reply)]() mutable {
        --self->inflight_;
        if (error.empty()) {
          self->send(std::move(reply));
        } else {  // commits may be answered out of order: say which one failed
          self->send(json::serialize(json::object{
              {"op", "error"}, {"code", code}, {"message", error}, {"group", group}, {"topic", topic}}));
        }
        self->after_reply();
      });
    });
  }

  // ---- cloudevents.json ----
  void handle_ce_frame(std::string_view text) {
    if (!scopes_allow(claims_->scopes, "publish", ce_topic_)) {
      relay_->metrics.refused_auth++;
      return close(static_cast<websocket::close_code>(kCloseForbidden), "forbidden: no publish scope for this topic");
    }
    boost::system::error_code ec;
    json::value ev = json::parse(text, ec);
    if (ec) return close(websocket::close_code::bad_payload, "not a JSON event");
    std::vector<relay::AppendRecord> records(1);
    if (auto err = relay::event_record(ev, text, relay_->cfg.max_event_bytes, relay_->codec, records[0]))
      return close(websocket::close_code::bad_payload, close_reason_text(err->code + ": " + err->message));
    std::uint64_t bytes = records[0].payload.size();
    submit(ce_topic_, 0, std::move(records), bytes, json::value(nullptr));
  }

  // ---- delivery ----
  void on_notify(const std::string& topic) {
    for (auto& [key, sub] : subs_) {
      if (sub.cursors.count(topic)) continue;
      if (sub.pattern.find('*') != std::string::npos && topic_matches(sub.pattern, topic) &&
          scopes_allow(claims_->scopes, "subscribe", topic))
        sub.cursors[topic] = cursor_at(topic, start_offset(topic, sub.group, "earliest", 0));  // a new topic: all of it
    }
    pump();
  }

  // Fills the send queue from the log while there is room; a full queue pauses delivery. A
  // store that cannot be read now (a cluster out of reach) stops this round: the next
  // commit, or the next frame sent, tries again.
  void pump() {
    try {
      pump_once();
    } catch (const Error& e) {
      if (!store_error_said_) std::fprintf(stderr, "diaspora-relay: delivery paused: %s\n", e.what());
      store_error_said_ = true;
      return;
    }
    store_error_said_ = false;
  }

  void pump_once() {
    if (closing_) return;
    const auto& cfg = relay_->cfg;
    // Every subscription's cursors, each round from the one after where the last round began:
    // a subscription with a standing backlog does not take every free slot of a queue from
    // the others on the connection.
    auto& all = pump_order_;  // kept between calls: no allocation per frame written
    all.clear();
    for (auto& [key, sub] : subs_)
      for (auto& entry : sub.cursors) all.emplace_back(&sub, &entry);
    const std::size_t n = all.size();
    const std::size_t first = n ? pump_round_++ % n : 0;
    bool progressed = true;
    while (progressed) {
      progressed = false;
      for (std::size_t k = 0; k < n; ++k) {
        Subscription& sub = *all[(first + k) % n].first;
        auto& entry = *all[(first + k) % n].second;  // not a structured binding: a lambda below uses cursor (clang 15)
        const std::string& topic = entry.first;
        Cursor& cursor = entry.second;
        if (queues_.size(cursor.cls) >= cfg.subscriber_queue_frames) continue;  // this class's queue is full
        if (relay_->store->committed_offset(topic) <= cursor.next) continue;
        std::size_t max_records = cfg.delivery_batch_events;
        if (sub.rate.rate > 0) {
          sub.rate.refill(Clock::now());
          if (sub.rate.tokens < 1) {  // pump again once it has room
            wake_after(rate_timer_, rate_wait_,
                       std::chrono::microseconds(static_cast<std::int64_t>(sub.rate.seconds_until(1) * 1e6) + 1000),
                       &WsSession::pump);
            continue;
          }
          max_records = std::min<std::size_t>(max_records, static_cast<std::size_t>(sub.rate.tokens));
        }
        std::uint64_t bytes = 0;
        std::size_t count = 0;
        if (mode_ == Mode::cloudevents) {
          auto recs = relay_->store->read(topic, cursor.next, max_records, cfg.delivery_batch_bytes);
          if (recs.empty()) continue;
          cursor.next = recs.back().offset + 1;
          count = recs.size();
          for (auto& r : recs) {
            if (data::is_chunk_record(r.payload)) continue;  // the binding carries events only (docs/streaming.md)
            bytes += r.payload.size();
            deliver(std::move(r.payload), cursor.cls, r.time_us);
          }
        } else {
          // Framed straight from the reader's buffer: no copy of each stored event. A data
          // chunk (docs/streaming.md) ends the events frame before it and goes as a binary
          // frame of its own, so the order of offsets holds across both.
          std::uint64_t skipped = 0;  // latest-only: the records passed over, said in the frame
          if (sub.latest_only) {
            const std::uint64_t end = relay_->store->committed_offset(topic);
            if (end > cursor.next + 1) skipped = end - 1 - cursor.next, cursor.next = end - 1;
          }
          std::string frame;
          std::uint64_t next = cursor.next;
          bool open = false;
          std::int64_t frame_us = 0;  // the frame's first record's append time
          const std::string sub_id = json::serialize(sub.id);
          auto finish = [&] {
            if (!open) return;
            if (skipped) {
              frame += R"(],"skipped":)";
              frame += std::to_string(skipped);
              frame += R"(,"next_offset":)";
              skipped = 0;
            } else {
              frame += R"(],"next_offset":)";
            }
            frame += std::to_string(next);
            frame += '}';
            deliver(std::move(frame), cursor.cls, frame_us);
            frame.clear();
            open = false;
          };
          count = relay_->store->visit(topic, cursor.next, max_records, cfg.delivery_batch_bytes,
                                       [&](const relay::Store::RecordRef& r) {
                                         bytes += r.payload.size();
                                         if (data::is_chunk_record(r.payload)) {
                                           finish();
                                           next = r.offset + 1;
                                           const data::Decoded d = data::decode(r.payload);
                                           if (d.chunk)  // else damaged: passed over, as a damaged event is
                                             deliver(data::encode_delivered(sub_id, topic, r.offset, d.chunk->index,
                                                                            d.chunk->count, d.chunk->payload),
                                                     cursor.cls, r.time_us, true);
                                           return;
                                         }
                                         if (!open) {
                                           frame_us = r.time_us;
                                           frame += R"({"op":"events","id":)";
                                           frame += sub_id;
                                           frame += R"(,"topic":)";
                                           frame += json_str(topic);
                                           frame += R"(,"events":[)";
                                           frame.reserve(frame.size() + std::min<std::size_t>(2 * r.payload.size() * cfg.delivery_batch_events, cfg.delivery_batch_bytes + 65536));
                                           open = true;
                                         } else {
                                           frame += ',';
                                         }
                                         frame += R"({"offset":)";
                                         frame += std::to_string(r.offset);
                                         if (sub.stamps) {
                                           frame += R"(,"appended_us":)";
                                           frame += std::to_string(r.time_us);
                                         }
                                         frame += R"(,"event":)";
                                         frame += r.payload;
                                         frame += '}';
                                         next = r.offset + 1;
                                       });
          if (count == 0) continue;
          cursor.next = next;
          finish();
        }
        relay_->metrics.out(topic, count, bytes);
        if (sub.rate.rate > 0) sub.rate.tokens -= static_cast<double>(count);
        progressed = true;
      }
    }
    if (queues_full() && has_backlog()) {
      if (!full_since_) full_since_ = Clock::now();
    } else {
      full_since_.reset();
    }
  }

  void congestion_round(double interval_s) {
    if (closing_) return;
    const auto& q = relay_->cfg.qos;
    const auto now = Clock::now();
    json::object metrics;
    double worst = 0;
    for (std::size_t c = 0; c < relay::kQosClasses; ++c) {
      const auto cls = static_cast<relay::QosClass>(c);
      auto& w = window_[c];
      if (const auto oldest = queues_.oldest(cls); oldest != Clock::time_point::max())  // still waiting
        w.max_wait = std::max(w.max_wait, std::chrono::duration<double>(now - oldest).count());
      if (cls != relay::QosClass::bulk) worst = std::max(worst, w.max_wait);
      const std::string name(relay::qos_name(cls));
      metrics["queue_frames_" + name] = queues_.size(cls);
      metrics["wait_max_s_" + name] = std::round(w.max_wait * 1e4) / 1e4;
      metrics["bytes_per_s_" + name] = std::round(static_cast<double>(w.bytes) / interval_s);
      w = {};
    }
    metrics["paused"] = full_since_ ? 1 : 0;
    if (queues_.bulk_rate() > 0) metrics["bulk_rate"] = queues_.bulk_rate();
    const bool congested = full_since_.has_value() || worst * 1000 > static_cast<double>(q.congested_wait_ms);
    if (!congested && !congested_) return;
    congested_ = congested;
    relay_->metrics.congestion_reports++;
    boost::system::error_code ec;
    const auto peer = beast::get_lowest_layer(ws_).socket().remote_endpoint(ec);
    std::string id = "connection/" + (client_id_.empty() ? std::string("anonymous") : client_id_.substr(0, 128));
    if (!ec) id += "@" + peer.address().to_string() + ":" + std::to_string(peer.port());
    json::object data{{"resource_id", std::move(id)},
                      {"kind", "link"},
                      {"state", congested ? "degraded" : "up"},
                      {"metrics", std::move(metrics)}};
    if (!site_.empty()) data["site"] = site_;
    if (!task_.empty()) data["task_id"] = task_;
    json::object ev{{"specversion", "1.0"},
                    {"id", make_uuid()},
                    {"source", "/diaspora-relay/" + relay_->cfg.listen},
                    {"type", "org.diaspora.resource.status"},
                    {"time", format_rfc3339_us(now_us())},
                    {"datacontenttype", "application/json"},
                    {"data", std::move(data)}};
    std::vector<relay::AppendRecord> recs{{"", json::serialize(ev)}};
    relay_->store->append(q.congestion_topic, "", 0, std::move(recs), [](const relay::AppendResult&) {});
  }

  // Calls `then` on this session after `delay` unless it closes first; one wait at a time
  // on `timer` (`waiting` says one is armed): a rate-bounded subscription or paced bulk
  // frames waiting for their bucket.
  void wake_after(net::steady_timer& timer, bool& waiting, Clock::duration delay, void (WsSession::*then)()) {
    if (waiting) return;
    waiting = true;
    timer.expires_after(delay);
    timer.async_wait([self = shared_from_this(), &waiting, then](beast::error_code ec) {
      waiting = false;
      if (!ec && !self->closing_) ((*self).*then)();
    });
  }

  bool has_backlog() const {
    for (const auto& [key, sub] : subs_)
      for (const auto& [topic, cursor] : sub.cursors)
        if (relay_->store->committed_offset(topic) > cursor.next) return true;
    return false;
  }

  // Once a second (more often for an idle timeout under 6 s): token expiry, the hello
  // deadline, idle peers (pinged after a third of the idle timeout, closed after all of
  // it), subscribers paused too long.
  void arm_timer() {
    timer_.expires_after(std::min<Clock::duration>(std::chrono::seconds(1), relay_->cfg.idle_timeout / 6));
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->closing_) return;
      if (self->claims_ && Clock::now() > self->token_deadline_) return self->end_expired();  // also idle sessions
      if (self->mode_ == Mode::v1 && !self->hello_done_ && Clock::now() - self->accepted_at_ > kHelloTimeout) {
        self->relay_->metrics.refused_auth++;
        self->send_error("hello_required", "no 'hello' within 10 s of the upgrade", nullptr);
        self->close(static_cast<websocket::close_code>(kCloseUnauthorized), "no hello");
        return;
      }
      const auto now = Clock::now();
      // Bytes of a frame still arriving, or a pause of our own reading, are not silence.
      if (self->read_paused_ || self->buffer_.size() != self->heard_bytes_) {
        self->heard_bytes_ = self->buffer_.size();
        self->last_heard_ = now;
      }
      const auto idle = self->relay_->cfg.idle_timeout;
      if (now - self->last_heard_ > idle) {
        self->close(static_cast<websocket::close_code>(kCloseIdle), "idle: nothing received (not even a pong)");
        return;
      }
      if (now - self->last_heard_ > idle / 3 && !self->pinging_ && !self->close_after_drain_) {
        self->pinging_ = true;  // one ping at a time; the pong (or any frame) resets last_heard_
        self->ws_.async_ping({}, [s = self](beast::error_code) { s->pinging_ = false; });
      }
      if (self->full_since_ && Clock::now() - *self->full_since_ > self->relay_->cfg.slow_subscriber_timeout) {
        self->relay_->metrics.slow_disconnects++;
        // What it has not read would only delay the close: drop every queued frame but the
        // one being written, so the close frame follows it.
        self->drop_unsent();
        self->close(static_cast<websocket::close_code>(kCloseSlowConsumer),
                    "slow_consumer: send queue full for longer than the slow-subscriber timeout");
        return;
      }
      self->arm_timer();
    });
  }

  // ---- writing ----
  void send_error(std::string_view code, const std::string& message, const json::value* ref) {
    send(error_frame(code, message, ref));
  }

  // Queues a reply (an ack, error, pong...): control class, counted against
  // kMaxQueuedReplyBytes.
  void send(std::string frame) {
    if (closing_) return;
    const std::size_t reply = frame.size();
    queues_.push({std::make_shared<const std::string>(std::move(frame)), reply, false, 0, relay::QosClass::control});
    reply_bytes_ += reply;
    if (!writing_) do_write();
  }

  // Queues a delivery (pump) in its topic's class; bounded by subscriber_queue_frames per
  // class. `appended_us`: its first record's append time, for the delivery-lag histogram.
  void deliver(std::string frame, relay::QosClass cls, std::int64_t appended_us, bool binary = false) {
    if (closing_) return;
    queues_.push({std::make_shared<const std::string>(std::move(frame)), 0, binary, appended_us, cls});
    if (!writing_) do_write();
  }

  bool queues_full() const {
    for (std::size_t c = 0; c < relay::kQosClasses; ++c)
      if (queues_.size(static_cast<relay::QosClass>(c)) >= relay_->cfg.subscriber_queue_frames) return true;
    return false;
  }

  void drop_unsent() { reply_bytes_ -= queues_.drop_unsent(writing_); }

  void do_write() {
    // Control first, then the other classes by weight; bulk no faster than its pace.
    Clock::duration wait{};
    const auto* f = queues_.ready(Clock::now(), wait);
    if (!f) return wake_after(pace_timer_, pace_wait_, wait, &WsSession::write_if_idle);  // only paced bulk frames wait
    writing_ = true;
    ws_.text(!f->binary);
    ws_.async_write(net::buffer(*f->frame), beast::bind_front_handler(&WsSession::on_write, shared_from_this()));
  }

  // Paced bulk frames waited: write again (a frame of another class queued meanwhile went
  // at once: send() and deliver() write when nothing is being written).
  void write_if_idle() {
    if (!writing_ && !queues_.empty()) do_write();
  }

  void on_write(beast::error_code ec, std::size_t) {
    writing_ = false;
    if (ec) {
      closing_ = true;
      queues_.clear();
      reply_bytes_ = 0;
      timer_.cancel();
      rate_timer_.cancel();
      pace_timer_.cancel();
      return;
    }
    {
      const auto& f = queues_.front();
      reply_bytes_ -= f.reply_bytes;
      relay_->metrics.lag.written(f.cls, f.frame->size());
      auto& w = window_[static_cast<std::size_t>(f.cls)];
      w.bytes += f.frame->size();
      w.max_wait = std::max(w.max_wait, std::chrono::duration<double>(Clock::now() - f.queued).count());
      if (f.appended_us > 0)
        relay_->metrics.lag.observe(f.cls, static_cast<double>(now_us() - f.appended_us) / 1e6);
      queues_.pop();
    }
    // A frame went out: the peer is reading (a dead one stops taking bytes once the socket's
    // buffers are full). Its pong may wait behind a long backlog we are sending it: a
    // subscriber busy reading one is not idle.
    last_heard_ = Clock::now();
    if (close_after_drain_ && queues_.empty()) return maybe_close();
    if (!queues_.empty()) do_write();
    if (close_after_drain_) return;
    if (read_paused_ && reply_bytes_ <= kMaxQueuedReplyBytes) do_read();  // the client read its replies
    pump();
  }

  // Sends what is queued (errors explaining the close), then the close frame.
  void close(websocket::close_code code, std::string reason) {
    if (close_after_drain_ || closing_) return;
    close_code_ = code;
    close_reason_ = std::move(reason);
    close_after_drain_ = true;
    maybe_close();
  }

  // Closes once every queued frame is written and every accepted publish is acked.
  void maybe_close() {
    if (close_after_drain_ && !closing_ && !writing_ && queues_.empty() && inflight_ == 0) do_close();
  }

  void do_close() {
    closing_ = true;
    timer_.cancel();
    rate_timer_.cancel();
    pace_timer_.cancel();
    ws_.async_close(websocket::close_reason(close_code_, close_reason_), [self = shared_from_this()](beast::error_code) {});
  }

  websocket::stream<beast::ssl_stream<beast::tcp_stream>> ws_;
  std::shared_ptr<Relay::Impl> relay_;
  net::steady_timer timer_;
  net::steady_timer rate_timer_;  // wakes pump() when a rate-bounded subscription has room again
  bool rate_wait_ = false;
  net::steady_timer pace_timer_;  // wakes do_write() when paced bulk frames may go again
  bool pace_wait_ = false;
  struct ClassWindow {  // frames written since the last congestion round, per class
    double max_wait = 0;  // seconds a frame waited in its queue, the longest
    std::uint64_t bytes = 0;
  };
  std::array<ClassWindow, relay::kQosClasses> window_{};
  bool congested_ = false;  // the last congestion round said degraded
  std::size_t pump_round_ = 0;  // where pump_once() begins among the cursors (round robin)
  std::vector<std::pair<Subscription*, std::pair<const std::string, Cursor>*>> pump_order_;  // pump_once()'s
  beast::flat_buffer buffer_;
  relay::SendQueues queues_;      // outgoing frames by QoS class (docs/streaming.md)
  std::size_t reply_bytes_ = 0;  // the reply_bytes of the frames in queues_
  Clock::time_point accepted_at_{};
  Clock::time_point last_heard_{};  // last frame of any kind (data, ping, pong) from the peer
  std::size_t heard_bytes_ = 0;     // buffer_.size() at the last timer tick: a frame in progress
  bool pinging_ = false;            // an idle ping is being sent
  bool writing_ = false;
  bool closing_ = false;
  bool store_error_said_ = false;  // pump() logged that the store cannot be read; once per outage
  bool close_after_drain_ = false;
  websocket::close_code close_code_ = websocket::close_code::normal;
  std::string close_reason_;
  Mode mode_ = Mode::v1;
  bool hello_done_ = false;
  std::optional<TokenClaims> claims_;
  Clock::time_point token_deadline_ = Clock::time_point::max();
  std::string client_id_, producer_id_, ce_topic_;
  std::string site_, task_;  ///< hello's site and task (may be empty), named in congestion events
  std::size_t inflight_ = 0;
  bool read_paused_ = false;
  std::map<std::string, Subscription> subs_;
  std::optional<relay::ItemAssembler> items_;  // data items arriving (v1), made at the upgrade
  std::atomic<bool> subscribed_{false};  // set once the session has subscribed; read by notify()
  std::optional<Clock::time_point> full_since_;
};

void Relay::Impl::on_commit(const std::string& topic) {
  for (auto& s : live_sessions()) s->notify(topic);
}

// ---- HTTP session -------------------------------------------------------------------------

class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(tcp::socket&& socket, std::shared_ptr<Relay::Impl> relay)
      : stream_(std::move(socket), relay->current_tls()), relay_(std::move(relay)) {
    relay_->metrics.connections++;
  }
  ~HttpSession() { relay_->metrics.connections--; }

  void run() {
    net::dispatch(stream_.get_executor(), beast::bind_front_handler(&HttpSession::on_run, shared_from_this()));
  }

 private:
  void on_run() {
    beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(10));
    stream_.async_handshake(ssl::stream_base::server,
                            beast::bind_front_handler(&HttpSession::on_handshake, shared_from_this()));
  }

  void on_handshake(beast::error_code ec) {
    if (ec) return;  // e.g. a client without a trusted certificate: TLS alert, connection closed
    do_read();
  }

  void do_read() {
    parser_.emplace();
    parser_->body_limit(64 * 1024);
    parser_->header_limit(16 * 1024);
    beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(30));
    http::async_read(stream_, buffer_, *parser_, beast::bind_front_handler(&HttpSession::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, std::size_t) {
    if (ec) return shutdown();
    auto req = parser_->release();
    if (websocket::is_upgrade(req)) return upgrade(std::move(req));
    const std::string path = relay::parse_target(req.target()).path;
    const bool get = req.method() == http::verb::get, post = req.method() == http::verb::post;
    if (get && path == "/api/v1/views/stream") return stream_views(std::move(req));
    if (post && path == "/api/v1/actions") return post_action(std::move(req));
    if (post && path.starts_with("/api/v1/groups/") && path.ends_with("/reset") &&
        path.size() > std::string_view("/api/v1/groups//reset").size())
      return post_group_reset(std::move(req), path);
    if (post && path.starts_with("/api/v1/topics/") && path.ends_with("/republish")) return post_republish(std::move(req), path);
    handle(std::move(req));
  }

  // GET /api/v1/views/stream: the views' changes as server-sent events (docs/console.md,
  // "Live changes"), for the workflows the token may subscribe to; until the client goes,
  // the token expires or the relay stops.
  void stream_views(http::request<http::string_body> req) {
    relay::Target target = relay::parse_target(req.target());
    std::optional<std::string> token = bearer_of(req);
    if (!token && target.query.count("access_token")) token = target.query["access_token"];
    if (!token || token->empty()) {
      relay_->metrics.refused_auth++;
      return respond(req, http::status::unauthorized, "text/plain", "a bearer token is required\n", true);
    }
    try {
      stream_claims_ = relay_->verifier->verify(*token);
    } catch (const TokenError& e) {
      relay_->metrics.refused_auth++;
      return respond(req, http::status::unauthorized, "text/plain", std::string(e.what()) + "\n", true);
    }
    if (!relay_->views)
      return respond(req, http::status::not_found, "text/plain", "this relay runs without views (views: false)\n");
    std::string since = target.query.count("since") ? target.query["since"] : std::string(req["Last-Event-ID"]);
    if (since.empty()) {
      stream_version_ = relay_->views->version();
    } else if (auto v = parse_offset(since)) {
      stream_version_ = *v;
    } else {
      return respond(req, http::status::bad_request, "text/plain", "?since= must be a version (decimal digits)\n");
    }
    beast::get_lowest_layer(stream_).expires_never();
    stream_timer_.emplace(stream_.get_executor());
    stream_out_ = "HTTP/1.1 200 OK\r\nServer: diaspora-relay/" + std::string(version_string) +
                  "\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
                  "retry: 1000\n\n";
    stream_write();
  }

  void stream_write() {
    net::async_write(stream_, net::buffer(stream_out_), [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return;  // the client went: the session ends with its last handler
      self->stream_out_.clear();
      self->stream_timer_->expires_after(std::chrono::milliseconds(100));
      self->stream_timer_->async_wait([self](beast::error_code e) {
        if (!e) self->stream_tick();
      });
    });
  }

  void stream_tick() {
    const auto now = std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now());
    if (relay_->stopping || !relay_->views) return;
    if (now >= stream_claims_.expires_at) {
      stream_out_ = "event: expired\ndata: {}\n\n";
      return net::async_write(stream_, net::buffer(stream_out_), [self = shared_from_this()](beast::error_code, std::size_t) {});
    }
    bool lost = false;
    for (const auto& c : relay_->views->changes_since(stream_version_, 2000, &lost)) {
      stream_version_ = c.version;
      if (!scopes_allow(stream_claims_.scopes, "subscribe", c.workflow + ".events")) continue;
      stream_out_ += "id: " + std::to_string(c.version) + "\nevent: change\ndata: " +
                     json::serialize(json::object{{"version", c.version}, {"view", c.view}, {"workflow", c.workflow},
                                                  {"id", c.id}}) +
                     "\n\n";
    }
    if (lost) stream_out_ = "event: reset\ndata: {\"version\":" + std::to_string(stream_version_) + "}\n\n" + stream_out_;
    if (stream_out_.empty() && ++stream_idle_ticks_ >= 150) stream_out_ = ": keep-alive\n\n";  // every 15 s
    if (!stream_out_.empty()) stream_idle_ticks_ = 0;
    if (stream_out_.empty()) {
      stream_timer_->expires_after(std::chrono::milliseconds(100));
      return stream_timer_->async_wait([self = shared_from_this()](beast::error_code e) {
        if (!e) self->stream_tick();
      });
    }
    stream_write();
  }

  void upgrade(http::request<http::string_body> req) {
    relay::Target target = relay::parse_target(req.target());
    std::string offered(req[http::field::sec_websocket_protocol]);
    auto offers = [&](std::string_view p) {
      std::string_view rest = offered;
      while (!rest.empty()) {
        auto comma = rest.find(',');
        std::string_view item = rest.substr(0, comma);
        while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
        while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
        if (item == p) return true;
        rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
      }
      return false;
    };
    std::optional<std::string> token = bearer_of(req);
    if (!token && target.query.count("access_token")) token = target.query["access_token"];
    std::optional<TokenClaims> claims;
    if (token) {
      try {
        claims = relay_->verifier->verify(*token);
      } catch (const TokenError& e) {
        relay_->metrics.refused_auth++;
        return respond(req, http::status::unauthorized, "text/plain", std::string(e.what()) + "\n", true);
      }
    }
    if (target.path.starts_with("/ce/")) {
      std::string topic = target.path.substr(4);
      if (!relay::valid_topic_name(topic))
        return respond(req, http::status::not_found, "text/plain", "not a valid topic name: " + topic + "\n");
      if (!offered.empty() && !offers("cloudevents.json"))
        return respond(req, http::status::bad_request, "text/plain", "/ce/ speaks the 'cloudevents.json' subprotocol\n");
      if (!claims) {
        relay_->metrics.refused_auth++;
        return respond(req, http::status::unauthorized, "text/plain",
                       "a bearer token is required (Authorization header or ?access_token=)\n", true);
      }
      if (!scopes_allow(claims->scopes, "publish", topic) && !scopes_allow(claims->scopes, "subscribe", topic)) {
        relay_->metrics.refused_auth++;
        return respond(req, http::status::forbidden, "text/plain",
                       "token of '" + claims->subject + "' grants neither publish nor subscribe on '" + topic + "'\n");
      }
      std::string from = target.query.count("from") ? target.query["from"] : "latest";
      if (from != "earliest" && from != "latest" && !parse_offset(from))
        return respond(req, http::status::bad_request, "text/plain",
                       "?from= must be earliest, latest or an offset (decimal digits), not '" + clip(from) + "'\n");
      auto ws = std::make_shared<WsSession>(std::move(stream_), relay_);
      return ws->run(std::move(req), WsSession::Mode::cloudevents, offered.empty() ? "" : "cloudevents.json",
                     std::move(claims), topic, from);
    }
    if (target.path != "/" && target.path != "/v1")
      return respond(req, http::status::not_found, "text/plain", "WebSocket endpoints: /v1 (diaspora.v1), /ce/<topic>\n");
    if (!offers("diaspora.v1"))
      return respond(req, http::status::bad_request, "text/plain",
                     "offer the 'diaspora.v1' subprotocol (Sec-WebSocket-Protocol)\n");
    auto ws = std::make_shared<WsSession>(std::move(stream_), relay_);
    ws->run(std::move(req), WsSession::Mode::v1, "diaspora.v1", std::move(claims), "", "");
  }

  // The plain HTTPS endpoints (http_api.cpp).
  relay::ApiContext api_context() const {
    return relay::ApiContext{*relay_->store, *relay_->verifier, relay_->metrics, relay_->cfg.public_metrics,
                             relay_->stopping.load(), relay_->views.get(), relay_->console_dir};
  }

  void handle(http::request<http::string_body> req) {
    const bool get = req.method() == http::verb::get || req.method() == http::verb::head;
    const std::string_view tgt(req.target());
    if (get && (tgt.starts_with("/api/v1/views/") || tgt.starts_with("/api/v1/topics"))) {  // off the I/O thread
      auto keep = std::make_shared<http::request<http::string_body>>(std::move(req));
      net::post(*relay_->queries, [self = shared_from_this(), keep] {
        auto r = std::make_shared<relay::HttpReply>(relay::handle_http(true, keep->target(), bearer_of(*keep), self->api_context()));
        net::post(self->stream_.get_executor(), [self, keep, r] {
          self->respond(*keep, static_cast<http::status>(r->status), r->content_type, std::move(r->body), r->challenge, r->headers);
        });
      });
      return;
    }
    relay::HttpReply r = relay::handle_http(get, req.target(), bearer_of(req), api_context());
    respond(req, static_cast<http::status>(r.status), r.content_type, std::move(r.body), r.challenge, r.headers);
  }

  // POST /api/v1/actions: an operator's action, appended to the engine's control topic (the
  // durable record of who asked what); answered 202 once it is durable.
  void post_action(http::request<http::string_body> req) {
    auto prepared = relay::prepare_operator_action(req.body(), bearer_of(req), api_context());
    // Who reads the control topic now (its engine; a console's tail of it counts too): an
    // action to a run that ended, or whose engine is away, waits there for nobody, and the
    // operator should know, before sending (dry_run) and after.
    auto readers = [](Relay::Impl& impl, const relay::OperatorAction& a) {
      const std::int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::system_clock::now().time_since_epoch()).count();
      const std::int64_t n = impl.metrics.subscribers(a.topic), last = impl.metrics.last_subscribed_us(a.topic, now);
      json::object answer{{"topic", a.topic}, {"subscribers", n}, {"last_subscribed_us", last}};
      if (n == 0)
        answer["warning"] = "no engine is subscribed to " + a.topic + " now (" +
                            (last > 0 ? "the last subscription ended at " + format_rfc3339(std::chrono::system_clock::time_point(
                                                                                  std::chrono::microseconds(last)))
                                      : std::string("none since the relay started")) +
                            "): nothing will carry the action out unless one subscribes (has the run ended?)";
      return answer;
    };
    if (auto* a = std::get_if<relay::OperatorAction>(&prepared); a && a->dry_run) {
      json::object answer = readers(*relay_, *a);
      answer["dry_run"] = true;
      return respond(req, http::status::ok, "application/json", json::serialize(answer) + "\n");
    }
    append_and_answer(std::move(req), std::move(prepared), [readers](Relay::Impl& impl, const relay::OperatorAction& a, std::uint64_t offset) {
      json::object answer = readers(impl, a);
      answer["action_id"] = a.action_id;
      answer["offset"] = offset;
      return answer;
    });
  }

  // POST /api/v1/topics/{topic}/republish: a stored event again, under a new id (http_api.cpp).
  void post_republish(http::request<http::string_body> req, const std::string& path) {
    auto prepared = relay::prepare_republish(path, req.body(), bearer_of(req), api_context());
    append_and_answer(std::move(req), std::move(prepared), [](Relay::Impl&, const relay::OperatorAction& a, std::uint64_t offset) {
      return json::object{{"id", a.action_id}, {"topic", a.topic}, {"offset", offset}};
    });
  }

  // Appends what an endpoint prepared (or answers its refusal), then answers 202 with
  // answer(relay, what, offset) once it is durable, or 503 with the log's error.
  template <class Answer>
  void append_and_answer(http::request<http::string_body> req, std::variant<relay::HttpReply, relay::OperatorAction> prepared,
                         Answer answer) {
    if (auto* refusal = std::get_if<relay::HttpReply>(&prepared))
      return respond(req, static_cast<http::status>(refusal->status), refusal->content_type, std::move(refusal->body),
                     refusal->challenge);
    auto a = std::make_shared<relay::OperatorAction>(std::get<relay::OperatorAction>(std::move(prepared)));
    auto keep = std::make_shared<http::request<http::string_body>>(std::move(req));
    std::vector<relay::AppendRecord> recs{{a->dedupe_key, a->payload}};
    relay_->store->append(a->topic, "", 0, std::move(recs), [self = shared_from_this(), a, keep, answer](const relay::AppendResult& r) {
      net::post(self->stream_.get_executor(), [self, a, keep, r, answer] {
        if (!r.ok)
          return self->respond(*keep, http::status::service_unavailable, "application/json",
                               json::serialize(json::object{{"error", r.code}, {"message", r.error}}) + "\n");
        self->respond(*keep, http::status::accepted, "application/json",
                      json::serialize(answer(*self->relay_, *a, r.first_offset)) + "\n");
      });
    });
  }

  // POST /api/v1/groups/{group}/reset: an admin sets a group's committed offset; committed
  // (two fsyncs) on the commits thread like a member's commit, answered once durable.
  void post_group_reset(http::request<http::string_body> req, const std::string& path) {
    auto prepared = relay::prepare_group_reset(path, req.body(), bearer_of(req), api_context());
    if (auto* refusal = std::get_if<relay::HttpReply>(&prepared))
      return respond(req, static_cast<http::status>(refusal->status), refusal->content_type, std::move(refusal->body),
                     refusal->challenge);
    auto g = std::make_shared<relay::GroupReset>(std::get<relay::GroupReset>(std::move(prepared)));
    auto keep = std::make_shared<http::request<http::string_body>>(std::move(req));
    net::post(*relay_->commits, [self = shared_from_this(), g, keep] {
      std::string error, code = "storage_error";
      try {
        self->relay_->store->commit_group_offset(g->group, g->topic, g->offset);
      } catch (const relay::GroupLimitError& e) {
        error = e.what();
        code = "too_many_groups";
      } catch (const std::exception& e) {
        error = e.what();
      }
      net::post(self->stream_.get_executor(), [self, g, keep, error = std::move(error), code = std::move(code)] {
        if (!error.empty())
          return self->respond(*keep, code == "too_many_groups" ? http::status::conflict : http::status::service_unavailable,
                               "application/json", json::serialize(json::object{{"error", code}, {"message", error}}) + "\n");
        json::object answer{{"group", g->group}, {"topic", g->topic}, {"offset", g->offset}};
        answer["previous"] = g->previous ? json::value(*g->previous) : json::value(nullptr);
        self->respond(*keep, http::status::ok, "application/json", json::serialize(answer) + "\n");
      });
    });
  }

  void respond(const http::request<http::string_body>& req, http::status status, std::string_view type, std::string body,
               bool challenge = false, const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    auto res = std::make_shared<http::response<http::string_body>>(status, req.version());
    res->set(http::field::server, std::string("diaspora-relay/") + version_string);
    res->set(http::field::content_type, type);
    for (const auto& [k, v] : headers) res->set(k, v);
    if (challenge) res->set(http::field::www_authenticate, "Bearer");
    res->keep_alive(req.keep_alive() && !websocket::is_upgrade(req));
    if (req.method() != http::verb::head) res->body() = std::move(body);
    res->prepare_payload();
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, std::size_t) {
      if (ec || !res->keep_alive()) return self->shutdown();
      self->do_read();
    });
  }

  void shutdown() {
    beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(5));
    stream_.async_shutdown([self = shared_from_this()](beast::error_code) {});
  }

  beast::ssl_stream<beast::tcp_stream> stream_;
  std::shared_ptr<Relay::Impl> relay_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  // GET /api/v1/views/stream
  TokenClaims stream_claims_;
  std::uint64_t stream_version_ = 0;
  std::optional<net::steady_timer> stream_timer_;
  std::string stream_out_;
  int stream_idle_ticks_ = 0;
};

// ---- Relay ----------------------------------------------------------------------------------

void Relay::Impl::arm_report_timer() {
  report_timer->expires_after(cfg.qos.report_interval);
  report_timer->async_wait([self = shared_from_this()](beast::error_code ec) {
    if (ec || self->stopping) return;
    const double interval_s = static_cast<double>(self->cfg.qos.report_interval.count());
    for (auto& ws : self->live_sessions()) ws->report_congestion(interval_s);
    self->arm_report_timer();
  });
}

void Relay::Impl::do_accept() {
  acceptor->async_accept(net::make_strand(*ioc), [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
    if (self->stopping) return;
    if (!ec) {
      // Small frames (acks, single events) must not wait for Nagle's algorithm.
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      // A bounded socket send queue: a write completes once the kernel holds at most this
      // many unsent bytes, so the frame chosen next by class (control first) is not queued
      // behind megabytes already handed to the socket (docs/streaming.md).
      if (const int lowat = static_cast<int>(self->cfg.qos.notsent_lowat); lowat > 0 && self->cfg.qos.enabled)
        ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof lowat);
      std::make_shared<HttpSession>(std::move(socket), self)->run();
    }
    self->do_accept();
  });
}

namespace {

// The server's TLS context from the certificate chain, key and client CA files of `cfg`;
// sets the certificate's expiry in `metrics`. Throws RelayConfigError naming the files.
std::unique_ptr<ssl::context> make_tls_context(const RelayConfig& cfg, relay::Metrics& metrics) {
  auto tls = std::make_unique<ssl::context>(ssl::context::tls_server);
  tls->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                   ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 | ssl::context::single_dh_use);
  SSL_CTX_set_min_proto_version(tls->native_handle(), TLS1_2_VERSION);
  try {
    tls->use_certificate_chain_file(cfg.tls_cert.string());
    tls->use_private_key_file(cfg.tls_key.string(), ssl::context::pem);
    if (cfg.client_ca) {
      tls->load_verify_file(cfg.client_ca->string());
      tls->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
    }
  } catch (const boost::system::system_error& e) {
    throw RelayConfigError(std::string("TLS setup: ") + e.what() + " (check --tls-cert, --tls-key and --client-ca)");
  }
  if (SSL_CTX_check_private_key(tls->native_handle()) != 1)
    throw RelayConfigError("TLS setup: the private key " + cfg.tls_key.string() + " does not match the certificate " +
                           cfg.tls_cert.string());
  std::tm not_after{};
  if (X509* cert = SSL_CTX_get0_certificate(tls->native_handle());
      cert && ASN1_TIME_to_tm(X509_get0_notAfter(cert), &not_after) == 1)
    metrics.tls_not_after = static_cast<std::int64_t>(timegm(&not_after));
  return tls;
}

}  // namespace

Relay::Relay(RelayConfig config) : self_(std::make_shared<Impl>()) {
  validate_relay_config(config);
  self_->cfg = std::move(config);
  self_->item_budget = std::make_unique<relay::ItemBudget>(self_->cfg.max_item_bytes_total);
  {
    std::vector<relay::QosClassifier::Rule> rules;
    for (const auto& r : self_->cfg.qos.classes) rules.push_back({r.topics, *relay::qos_from_name(r.cls)});
    self_->qos = relay::QosClassifier(std::move(rules));
    for (const auto& cls : self_->cfg.qos.drop_late) self_->drop_late[static_cast<std::size_t>(*relay::qos_from_name(cls))] = true;
  }
  const auto& cfg = self_->cfg;
  try {
    self_->verifier.emplace(load_secret_file(cfg.auth_secret_file));
  } catch (const TokenError& e) {
    throw RelayConfigError(std::string("--auth-secret-file: ") + e.what());
  }
  self_->codec.max_event_bytes = cfg.max_event_bytes;
  self_->codec.validate_payloads = cfg.validate_payloads;

  self_->tls_contexts.push_back(make_tls_context(cfg, self_->metrics));

  if (cfg.storage == "jetstream") {  // the topics in a NATS JetStream cluster
    relay::JetStreamOptions jo;
    jo.urls = cfg.jetstream.urls;
    jo.creds_file = cfg.jetstream.credentials_file.string();
    jo.ca_file = cfg.jetstream.tls_ca.string();
    jo.cert_file = cfg.jetstream.tls_cert.string();
    jo.key_file = cfg.jetstream.tls_key.string();
    jo.replicas = cfg.jetstream.replicas;
    jo.retention_bytes = cfg.retention_bytes;
    jo.retention_age = cfg.retention_age;
    jo.retention_by_topic = retention_rules(cfg);
    jo.duplicate_window = cfg.jetstream.duplicate_window;
    jo.max_topics = cfg.max_topics;
    jo.max_groups = cfg.max_consumer_groups;
    jo.prefix = cfg.jetstream.prefix;
    jo.subject_root = cfg.jetstream.subject_root;
    jo.timeout = cfg.jetstream.timeout;
    for (const auto& src : cfg.jetstream.sources)
      jo.sources.push_back(relay::JetStreamSource{src.domain, src.prefix, src.subject_root, src.topics});
    std::filesystem::create_directories(cfg.data_dir);  // the views' snapshot, this relay's own cache
    self_->store = std::make_unique<relay::JetStreamStore>(jo);
  } else {
    relay::LogOptions lo;
    lo.data_dir = cfg.data_dir;
    lo.fsync = relay::FsyncPolicy::parse(cfg.fsync);
    lo.segment_bytes = cfg.segment_bytes;
    lo.retention_bytes = cfg.retention_bytes;
    lo.retention_age = cfg.retention_age;
    lo.retention_by_topic = retention_rules(cfg);
    lo.max_groups = cfg.max_consumer_groups;
    lo.max_topics = cfg.max_topics;
    self_->store = std::make_unique<relay::LogStore>(lo);
  }
  if (cfg.views) self_->views = std::make_unique<relay::Views>(*self_->store, relay::Views::Options{cfg.data_dir / "views"});
  self_->console_dir = find_console_dir(cfg.console_dir);
  std::weak_ptr<Impl> weak = self_;
  self_->store->set_commit_listener([weak](const std::string& topic, std::uint64_t) {
    if (auto s = weak.lock()) {
      s->on_commit(topic);
      if (s->views) s->views->notify(topic);
    }
  });
}

Relay::~Relay() {
  try {
    stop();
  } catch (...) {
  }
}

void Relay::start() {
  auto& s = *self_;
  if (s.started) throw Error("relay already started");
  const relay::ListenAddress listen = relay::parse_listen(s.cfg.listen);
  const tcp::endpoint ep{net::ip::make_address(listen.host), listen.port};
  boost::system::error_code ec;
  s.acceptor.emplace(*s.ioc);
  s.acceptor->open(ep.protocol(), ec);
  if (!ec) s.acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor->bind(ep, ec);
  if (!ec) s.acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec) throw Error("cannot listen on " + s.cfg.listen + ": " + ec.message());
  s.bound_port = s.acceptor->local_endpoint().port();
  s.work.emplace(s.ioc->get_executor());
  net::post(*s.commits, [] { name_this_thread("relay-commit"); });
  net::post(*s.queries, [] { name_this_thread("relay-query"); });
  s.do_accept();
  for (int i = 0; i < s.cfg.threads; ++i) s.threads.emplace_back([&s] {
    name_this_thread("relay-io");
    s.ioc->run();
  });
  if (s.views) s.views->start();
  if (s.cfg.qos.report_interval.count() > 0) {
    s.report_timer.emplace(*s.ioc);
    s.arm_report_timer();
  }
  s.started = true;
  if (s.cfg.port_file) {
    auto tmp = *s.cfg.port_file;
    tmp += ".tmp";
    {
      std::ofstream out(tmp);
      out << s.bound_port.load() << "\n";
      if (!out) throw Error("cannot write --port-file " + s.cfg.port_file->string());
    }
    std::filesystem::rename(tmp, *s.cfg.port_file);
  }
}

std::uint16_t Relay::port() const noexcept { return self_->bound_port; }

void Relay::reload_tls() {
  auto& s = *self_;
  auto fresh = make_tls_context(s.cfg, s.metrics);  // throws: the current one stays
  std::lock_guard lock(s.tls_mutex);
  s.tls_contexts.push_back(std::move(fresh));
  s.metrics.tls_reloads++;
}

std::uint64_t Relay::views_read() const noexcept {
  const auto& v = self_->views;
  return v ? v->applied() + v->skipped() : 0;
}

void Relay::stop() {
  auto& s = *self_;
  {
    std::lock_guard lock(s.stop_mutex);
    if (s.stopped || !s.started) {
      s.stopped = true;
      s.stopped_cv.notify_all();
      return;
    }
  }
  s.stopping = true;
  net::post(*s.ioc, [&s] {
    boost::system::error_code ec;
    s.acceptor->close(ec);
    if (s.report_timer) s.report_timer->cancel();
  });
  for (auto& ws : s.live_sessions()) ws->shutdown();
  s.work.reset();
  // Give sessions a moment to send their last acks and close frames, then stop hard.
  auto deadline = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < deadline && !s.ioc->stopped()) {
    bool any = false;
    {
      std::lock_guard lock(s.sessions_mutex);
      for (const auto& w : s.sessions) any |= !w.expired();
    }
    if (!any) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  s.ioc->stop();
  for (auto& t : s.threads)
    if (t.joinable()) t.join();
  s.threads.clear();
  s.commits->join();  // commits already queued finish (the store is still open)
  s.queries->join();  // so do queries (the views are still there); their replies die with the io_context
  // The writer finishes and syncs what was appended; its completions are posted to the
  // (stopped) io_context and destroyed with it below, which also breaks the
  // session -> Impl -> io_context -> handler -> session ownership cycle.
  if (s.views) s.views->stop();  // no more reads of the store; notify() stays harmless
  s.store.reset();
  s.views.reset();  // writes the last snapshot
  s.acceptor.reset();
  s.report_timer.reset();  // before the io_context it belongs to
  s.commits.reset();  // the replies it posted died with the stopped io_context's queue, below
  s.queries.reset();
  s.ioc.reset();
  std::lock_guard lock(s.stop_mutex);
  s.stopped = true;
  s.stopped_cv.notify_all();
}

void Relay::wait() {
  std::unique_lock lock(self_->stop_mutex);
  self_->stopped_cv.wait(lock, [&] { return self_->stopped; });
}

}  // namespace diaspora
