// relay.yaml -> RelayConfig, through the same located YAML validation as workflow specs.
#include <boost/json.hpp>

#include <fstream>
#include <iterator>
#include <set>

#include <arpa/inet.h>

#include "config.hpp"
#include "diaspora/relay.hpp"
#include "diaspora/spec.hpp"
#include "jetstream_store.hpp"  // invalid_source
#include "qos.hpp"
#include "topic_log.hpp"  // FsyncPolicy

namespace diaspora {

namespace json = boost::json;

namespace {

// Durations in relay.yaml are whole numbers with s, m, h or d (the schema's patterns).
std::chrono::seconds seconds_of(const std::string& text) {
  return std::chrono::duration_cast<std::chrono::seconds>(parse_duration(text).value_or(Duration{0}));
}

}  // namespace

RelayConfig load_relay_config(const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec))
    throw SpecError({Diagnostic{file.string(), 0, 0, "", "no such file"}});
  YamlDocument doc = parse_yaml(read_yaml_file(file, 1 << 20, "relay configuration"), file.string());
  auto diags = validate_yaml(doc, "relay.schema.json", file.string());
  if (!diags.empty()) throw SpecError(std::move(diags));

  RelayConfig c;
  const json::object& r = doc.root.get_object();
  auto str = [](const json::object& o, std::string_view k) -> std::optional<std::string> {
    const json::value* v = o.if_contains(k);
    return v && v->is_string() ? std::optional<std::string>(v->get_string()) : std::nullopt;
  };
  auto num = [](const json::object& o, std::string_view k) -> std::optional<std::uint64_t> {
    const json::value* v = o.if_contains(k);
    return v && v->is_number() ? std::optional<std::uint64_t>(v->to_number<std::uint64_t>()) : std::nullopt;
  };
  auto sub = [](const json::object& o, std::string_view k) -> const json::object& {
    static const json::object empty;
    const json::value* v = o.if_contains(k);
    return v && v->is_object() ? v->get_object() : empty;
  };
  if (auto v = str(r, "listen")) c.listen = *v;
  if (auto v = str(r, "data_dir")) c.data_dir = *v;
  if (auto v = str(r, "console_dir")) c.console_dir = std::filesystem::path(*v);
  const auto& tls = sub(r, "tls");
  if (auto v = str(tls, "cert")) c.tls_cert = *v;
  if (auto v = str(tls, "key")) c.tls_key = *v;
  if (auto v = str(tls, "client_ca")) c.client_ca = *v;
  if (auto v = str(sub(r, "auth"), "secret_file")) c.auth_secret_file = *v;
  const auto& log = sub(r, "log");
  if (auto v = str(log, "fsync")) c.fsync = *v;
  if (const auto* v = log.if_contains("segment_bytes")) c.segment_bytes = parse_size(*v).value_or(c.segment_bytes);
  if (const auto* v = log.if_contains("retention_bytes")) c.retention_bytes = parse_size(*v).value_or(0);
  if (auto v = str(log, "retention_age")) c.retention_age = seconds_of(*v);
  if (const auto* rules = log.if_contains("retention_by_topic"); rules && rules->is_array())
    for (const auto& v : rules->get_array()) {
      const json::object& o = v.get_object();
      RelayConfig::TopicRetention rule;
      rule.topics = str(o, "topics").value_or("");
      if (const auto* b = o.if_contains("retention_bytes")) rule.bytes = parse_size(*b).value_or(0);
      if (auto a = str(o, "retention_age")) rule.age = seconds_of(*a);
      c.retention_by_topic.push_back(std::move(rule));
    }
  const auto& lim = sub(r, "limits");
  if (auto v = num(lim, "max_frame_bytes")) c.max_frame_bytes = *v;
  if (auto v = num(lim, "max_event_bytes")) c.max_event_bytes = *v;
  if (auto v = num(lim, "max_batch_events")) c.max_batch_events = *v;
  if (auto v = num(lim, "max_item_bytes")) c.max_item_bytes = *v;
  if (auto v = num(lim, "max_pending_item_bytes")) c.max_pending_item_bytes = *v;
  if (auto v = num(lim, "max_item_bytes_total")) c.max_item_bytes_total = *v;
  if (auto v = num(lim, "max_inflight_batches")) c.max_inflight_batches = *v;
  if (auto v = num(lim, "subscriber_queue_frames")) c.subscriber_queue_frames = *v;
  if (auto v = str(lim, "slow_subscriber_timeout")) c.slow_subscriber_timeout = seconds_of(*v);
  if (auto v = str(lim, "idle_timeout")) c.idle_timeout = seconds_of(*v);
  if (auto v = num(lim, "delivery_batch_events")) c.delivery_batch_events = *v;
  if (auto v = num(lim, "delivery_batch_bytes")) c.delivery_batch_bytes = *v;
  if (auto v = num(lim, "max_consumer_groups")) c.max_consumer_groups = *v;
  if (auto v = num(lim, "max_topics")) c.max_topics = *v;
  if (const auto* v = r.if_contains("validate_payloads")) c.validate_payloads = v->as_bool();
  if (const auto* v = r.if_contains("public_metrics")) c.public_metrics = v->as_bool();
  if (const auto* v = r.if_contains("views")) c.views = v->as_bool();
  if (auto v = num(r, "threads")) c.threads = static_cast<int>(*v);
  if (auto v = str(r, "storage")) c.storage = *v;
  const auto& qos = sub(r, "qos");
  if (const auto* v = qos.if_contains("enabled")) c.qos.enabled = v->as_bool();
  if (const auto* v = qos.if_contains("notsent_lowat")) c.qos.notsent_lowat = parse_size(*v).value_or(c.qos.notsent_lowat);
  if (const auto* v = qos.if_contains("bulk_rate")) c.qos.bulk_rate = parse_size(*v).value_or(0);
  if (auto v = str(qos, "report_interval")) c.qos.report_interval = seconds_of(*v);
  if (auto v = num(qos, "congested_wait_ms")) c.qos.congested_wait_ms = *v;
  if (auto v = str(qos, "congestion_topic")) c.qos.congestion_topic = *v;
  if (const auto* v = qos.if_contains("drop_late"); v && v->is_array())
    for (const auto& name : v->get_array())
      c.qos.drop_late.emplace_back(name.get_string());
  const auto& weights = sub(qos, "weights");
  if (auto v = num(weights, "lifecycle")) c.qos.weight_lifecycle = static_cast<std::uint32_t>(*v);
  if (auto v = num(weights, "telemetry")) c.qos.weight_telemetry = static_cast<std::uint32_t>(*v);
  if (auto v = num(weights, "bulk")) c.qos.weight_bulk = static_cast<std::uint32_t>(*v);
  if (const auto* rules = qos.if_contains("classes"); rules && rules->is_array())
    for (const auto& v : rules->get_array())
      c.qos.classes.push_back({str(v.get_object(), "topics").value_or(""), str(v.get_object(), "class").value_or("")});
  const auto& js = sub(r, "jetstream");
  if (const auto* urls = js.if_contains("urls"); urls && urls->is_array())
    for (const auto& u : urls->get_array()) c.jetstream.urls.emplace_back(u.get_string());
  if (auto v = num(js, "replicas")) c.jetstream.replicas = static_cast<int>(*v);
  if (auto v = str(js, "credentials_file")) c.jetstream.credentials_file = *v;
  const auto& jtls = sub(js, "tls");
  if (auto v = str(jtls, "ca")) c.jetstream.tls_ca = *v;
  if (auto v = str(jtls, "cert")) c.jetstream.tls_cert = *v;
  if (auto v = str(jtls, "key")) c.jetstream.tls_key = *v;
  if (auto v = str(js, "prefix")) c.jetstream.prefix = *v;
  if (auto v = str(js, "subject_root")) c.jetstream.subject_root = *v;
  if (auto v = str(js, "duplicate_window")) c.jetstream.duplicate_window = seconds_of(*v);
  if (auto v = str(js, "timeout")) c.jetstream.timeout = seconds_of(*v);
  if (const auto* srcs = js.if_contains("sources"); srcs && srcs->is_array())
    for (const auto& v : srcs->get_array()) {
      const json::object& o = v.get_object();
      RelayConfig::JetStream::Source src{str(o, "domain").value_or(""), str(o, "prefix").value_or(""),
                                         str(o, "subject_root").value_or("")};
      if (const auto* t = o.if_contains("topics"); t && t->is_array()) {
        src.topics.clear();
        for (const auto& p : t->get_array()) src.topics.emplace_back(p.get_string());
      }
      c.jetstream.sources.push_back(std::move(src));
    }
  return c;
}

void validate_relay_config(const RelayConfig& c) {
  auto need_file = [](const std::filesystem::path& p, const char* what) {
    if (p.empty()) throw RelayConfigError(std::string(what) + " is required");
    if (!std::filesystem::is_regular_file(p)) throw RelayConfigError(std::string(what) + " '" + p.string() + "': no such file");
  };
  need_file(c.tls_cert, "--tls-cert");
  if (c.console_dir && !std::filesystem::is_regular_file(*c.console_dir / "index.html"))
    throw RelayConfigError("console_dir '" + c.console_dir->string() + "': no index.html in it (the console's built "
                           "assets: build/console after make build)");
  need_file(c.tls_key, "--tls-key");
  need_file(c.auth_secret_file, "--auth-secret-file");
  if (c.client_ca) need_file(*c.client_ca, "--client-ca");
  relay::parse_listen(c.listen);
  try {
    relay::FsyncPolicy::parse(c.fsync);
  } catch (const Error& e) {  // the log's own parser
    throw RelayConfigError(e.what());
  }
  if (c.idle_timeout < std::chrono::seconds(2)) throw RelayConfigError("limits.idle_timeout must be at least 2s");
  if (c.threads < 1 || c.threads > 64) throw RelayConfigError("threads must be 1 to 64");
  if (c.max_event_bytes > c.max_frame_bytes) throw RelayConfigError("max_event_bytes must not exceed max_frame_bytes");
  // A log record holds at most 16 MiB with its headers, producer id and (source, id) key.
  if (c.max_event_bytes > (15u << 20)) throw RelayConfigError("max_event_bytes must be at most 15MiB (the log's record limit is 16MiB)");
  if (c.max_pending_item_bytes < c.max_item_bytes)
    throw RelayConfigError("limits.max_pending_item_bytes must be at least limits.max_item_bytes (one item of the largest size)");
  if (c.max_item_bytes_total < c.max_item_bytes)
    throw RelayConfigError("limits.max_item_bytes_total must be at least limits.max_item_bytes (one item of the largest size)");
  if (c.storage != "embedded" && c.storage != "jetstream") throw RelayConfigError("storage must be embedded or jetstream");
  if (c.storage == "jetstream") {
    if (c.jetstream.urls.empty()) throw RelayConfigError("storage: jetstream needs jetstream.urls (nats://HOST:PORT, ...)");
    if (c.jetstream.replicas < 1 || c.jetstream.replicas > 5) throw RelayConfigError("jetstream.replicas must be 1 to 5");
    if (c.jetstream.timeout < std::chrono::seconds(1)) throw RelayConfigError("jetstream.timeout must be at least 1s");
    if (!c.jetstream.credentials_file.empty()) need_file(c.jetstream.credentials_file, "jetstream.credentials_file");
    if (!c.jetstream.tls_ca.empty()) need_file(c.jetstream.tls_ca, "jetstream.tls.ca");
    if (c.jetstream.tls_cert.empty() != c.jetstream.tls_key.empty())
      throw RelayConfigError("jetstream.tls.cert and jetstream.tls.key go together");
    if (!c.jetstream.tls_cert.empty()) need_file(c.jetstream.tls_cert, "jetstream.tls.cert"), need_file(c.jetstream.tls_key, "jetstream.tls.key");
    relay::JetStreamOptions own;  // what invalid_source compares a source with
    own.subject_root = c.jetstream.subject_root;
    std::set<std::string> domains;
    for (const auto& src : c.jetstream.sources) {
      if (auto why = relay::invalid_source({src.domain, src.prefix, src.subject_root, src.topics}, own))
        throw RelayConfigError(*why);
      if (!domains.insert(src.domain).second)
        throw RelayConfigError("jetstream.sources: domain " + src.domain + " is listed twice");
    }
  }
  for (const auto& rule : c.qos.classes)
    if (!relay::qos_from_name(rule.cls))
      throw RelayConfigError("qos.classes: '" + rule.cls + "' for '" + rule.topics + "' is not a class (control, lifecycle, telemetry or bulk)");
  for (const auto& cls : c.qos.drop_late)
    if (!relay::qos_from_name(cls))
      throw RelayConfigError("qos.drop_late: '" + cls + "' is not a class (control, lifecycle, telemetry or bulk)");
  if (c.qos.notsent_lowat > (64u << 20)) throw RelayConfigError("qos.notsent_lowat must be at most 64MiB");
  for (auto w : {c.qos.weight_lifecycle, c.qos.weight_telemetry, c.qos.weight_bulk})
    if (w < 1 || w > 1000) throw RelayConfigError("qos.weights must be 1 to 1000");
  if (c.max_inflight_batches < 1 || c.subscriber_queue_frames < 1 || c.max_batch_events < 1 || c.delivery_batch_events < 1 ||
      c.max_consumer_groups < 1 || c.max_topics < 1)
    throw RelayConfigError("limits must be at least 1");
}

}  // namespace diaspora

namespace diaspora::relay {

ListenAddress parse_listen(const std::string& text) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos) throw RelayConfigError("--listen '" + text + "': expected HOST:PORT, e.g. 127.0.0.1:7443");
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "localhost") host = "127.0.0.1";
  unsigned long port = 0;
  try {
    port = std::stoul(text.substr(colon + 1));
  } catch (...) {
    throw RelayConfigError("--listen '" + text + "': the port is not a number");
  }
  if (port > 65535) throw RelayConfigError("--listen '" + text + "': port out of range");
  unsigned char addr[16];
  const std::string unscoped = host.substr(0, host.find('%'));  // fe80::1%eth0: a scoped IPv6 address
  if (::inet_pton(AF_INET, host.c_str(), addr) != 1 && ::inet_pton(AF_INET6, unscoped.c_str(), addr) != 1)
    throw RelayConfigError("--listen '" + text + "': '" + host + "' is not an IP address");
  return {host, static_cast<std::uint16_t>(port)};
}

}  // namespace diaspora::relay
