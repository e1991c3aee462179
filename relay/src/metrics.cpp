#include "metrics.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "diaspora/token.hpp"

namespace diaspora::relay {

void Metrics::in(const std::string& topic, std::uint64_t events, std::uint64_t bytes, std::uint64_t dups) {
  std::lock_guard lock(mutex);
  auto& t = topics[topic];
  t.events_in += events;
  t.bytes_in += bytes;
  t.duplicates += dups;
}

void Metrics::out(const std::string& topic, std::uint64_t events, std::uint64_t bytes) {
  std::lock_guard lock(mutex);
  auto& t = topics[topic];
  t.events_out += events;
  t.bytes_out += bytes;
}

void Metrics::subscribed(const std::string& pattern, int delta) {
  std::lock_guard lock(mutex);
  auto it = subscriptions.try_emplace(pattern, 0).first;
  it->second += delta;
  if (it->second > 0) return;
  subscriptions.erase(it);
  closed_us[pattern] = std::chrono::duration_cast<std::chrono::microseconds>(
                           std::chrono::system_clock::now().time_since_epoch()).count();
  if (closed_us.size() > kMaxClosed)  // forget the pattern closed longest ago
    closed_us.erase(std::min_element(closed_us.begin(), closed_us.end(),
                                     [](const auto& a, const auto& b) { return a.second < b.second; }));
}

std::int64_t Metrics::last_subscribed_us(const std::string& topic, std::int64_t now_us) {
  std::lock_guard lock(mutex);
  for (const auto& [pattern, count] : subscriptions)
    if (topic_matches(pattern, topic)) return now_us;
  std::int64_t last = 0;
  for (const auto& [pattern, t] : closed_us)
    if (topic_matches(pattern, topic)) last = std::max(last, t);
  return last;
}

std::int64_t Metrics::subscribers(const std::string& topic) {
  std::lock_guard lock(mutex);
  std::int64_t n = 0;
  for (const auto& [pattern, count] : subscriptions)
    if (topic_matches(pattern, topic)) n += count;
  return n;
}

std::string render_metrics(Metrics& metrics, const Store& store) {
  std::string out;
  auto line = [&](const std::string& s) { out += s + "\n"; };
  auto esc = [](const std::string& s) {
    std::string r;
    for (char c : s) r += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    return r;
  };
  std::map<std::string, Metrics::TopicCounters> snapshot;
  std::map<std::string, std::int64_t> subscriptions;
  {
    std::lock_guard lock(metrics.mutex);
    snapshot = metrics.topics;
    subscriptions = metrics.subscriptions;
  }
  auto per_topic = [&](const char* name, const char* help, std::uint64_t Metrics::TopicCounters::*field) {
    line(std::string("# HELP ") + name + " " + help);
    line(std::string("# TYPE ") + name + " counter");
    for (const auto& [t, c] : snapshot) line(std::string(name) + "{topic=\"" + esc(t) + "\"} " + std::to_string(c.*field));
  };
  per_topic("diaspora_relay_events_in_total", "Events appended per topic.", &Metrics::TopicCounters::events_in);
  per_topic("diaspora_relay_bytes_in_total", "Event bytes appended per topic.", &Metrics::TopicCounters::bytes_in);
  per_topic("diaspora_relay_duplicates_total", "Events dropped as duplicates per topic.",
            &Metrics::TopicCounters::duplicates);
  per_topic("diaspora_relay_events_out_total", "Events delivered to subscribers per topic.",
            &Metrics::TopicCounters::events_out);
  per_topic("diaspora_relay_bytes_out_total", "Event bytes delivered per topic.", &Metrics::TopicCounters::bytes_out);
  auto single = [&](const char* name, const char* type, const char* help, std::int64_t value) {
    line(std::string("# HELP ") + name + " " + help);
    line(std::string("# TYPE ") + name + " " + type);
    line(std::string(name) + " " + std::to_string(value));
  };
  single("diaspora_relay_connections", "gauge", "Open TLS connections.", metrics.connections.load());
  single("diaspora_relay_websockets", "gauge", "Open WebSocket sessions.", metrics.websockets.load());
  single("diaspora_relay_auth_refusals_total", "counter",
         "Requests refused for missing, invalid or insufficient tokens.",
         static_cast<std::int64_t>(metrics.refused_auth.load()));
  single("diaspora_relay_slow_consumer_disconnects_total", "counter", "Subscribers disconnected as too slow.",
         static_cast<std::int64_t>(metrics.slow_disconnects.load()));
  single("diaspora_relay_token_expiries_total", "counter", "Sessions closed because their token expired.",
         static_cast<std::int64_t>(metrics.token_expiries.load()));
  single("diaspora_relay_tls_reloads_total", "counter", "Certificates and keys loaded again (SIGHUP).",
         static_cast<std::int64_t>(metrics.tls_reloads.load()));
  single("diaspora_relay_items_total", "counter", "Data items written: received whole, their checksum matching (docs/streaming.md).",
         static_cast<std::int64_t>(metrics.items_in.load()));
  single("diaspora_relay_items_late_total", "counter", "Data items stored after their itemdeadline.",
         static_cast<std::int64_t>(metrics.items_late.load()));
  single("diaspora_relay_items_dropped_late_total", "counter",
         "Data items past their itemdeadline not stored: their topic's class drops late items (qos.drop_late).",
         static_cast<std::int64_t>(metrics.items_dropped_late.load()));
  single("diaspora_relay_congestion_events_total", "counter",
         "resource.status events about congested connections (qos.congestion_topic), degraded and cleared.",
         static_cast<std::int64_t>(metrics.congestion_reports.load()));
  single("diaspora_relay_tls_certificate_expiry_seconds", "gauge",
         "When the served certificate expires (its notAfter), Unix time.", metrics.tls_not_after.load());
  line("# HELP diaspora_relay_subscriptions Open subscriptions per topic or pattern, as subscribed.");
  line("# TYPE diaspora_relay_subscriptions gauge");
  for (const auto& [p, n] : subscriptions) line("diaspora_relay_subscriptions{topic=\"" + esc(p) + "\"} " + std::to_string(n));
  auto fs = store.fsync_stats();
  line("# HELP diaspora_relay_fsync_seconds Duration of log syncs (group commits).");
  line("# TYPE diaspora_relay_fsync_seconds histogram");
  for (std::size_t i = 0; i < fs.bucket_bounds.size(); ++i) {
    char le[32];
    std::snprintf(le, sizeof le, "%g", fs.bucket_bounds[i]);
    line(std::string("diaspora_relay_fsync_seconds_bucket{le=\"") + le + "\"} " + std::to_string(fs.bucket_counts[i]));
  }
  line("diaspora_relay_fsync_seconds_bucket{le=\"+Inf\"} " + std::to_string(fs.count));
  line("diaspora_relay_fsync_seconds_sum " + std::to_string(fs.sum));
  line("diaspora_relay_fsync_seconds_count " + std::to_string(fs.count));
  out += metrics.lag.render();
  if (const auto srcs = store.sources(); !srcs.empty()) {
    line("# HELP diaspora_relay_jetstream_source_up 1 while the source domain answers (jetstream.sources), else 0.");
    line("# TYPE diaspora_relay_jetstream_source_up gauge");
    for (const auto& x : srcs) line("diaspora_relay_jetstream_source_up{domain=\"" + esc(x.domain) + "\"} " + (x.up ? "1" : "0"));
    line("# HELP diaspora_relay_jetstream_source_topics The source domain's topics this relay holds too.");
    line("# TYPE diaspora_relay_jetstream_source_topics gauge");
    for (const auto& x : srcs)
      line("diaspora_relay_jetstream_source_topics{domain=\"" + esc(x.domain) + "\"} " + std::to_string(x.topics));
    line("# HELP diaspora_relay_jetstream_source_lag Records of the source domain JetStream reports not yet copied here.");
    line("# TYPE diaspora_relay_jetstream_source_lag gauge");
    for (const auto& x : srcs)
      line("diaspora_relay_jetstream_source_lag{domain=\"" + esc(x.domain) + "\"} " + std::to_string(x.lag));
  }
  line("# HELP diaspora_relay_consumer_lag Events between a group's committed offset and the end of the topic.");
  line("# TYPE diaspora_relay_consumer_lag gauge");
  for (const auto& [g, t, off] : store.group_offsets()) {
    std::uint64_t end = store.committed_offset(t);
    line("diaspora_relay_consumer_lag{group=\"" + esc(g) + "\",topic=\"" + esc(t) + "\"} " +
         std::to_string(end > off ? end - off : 0));
  }
  return out;
}

}  // namespace diaspora::relay
