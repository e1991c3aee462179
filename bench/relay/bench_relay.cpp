// diaspora-bench (run as `diaspora bench relay ...`: the CLI hands `bench` to this program
// next to it): acked-publish throughput and end-to-end latency of a relay, for
// N producers x M subscribers. Without --url it starts an embedded relay (fsync always,
// fresh temporary data directory, development certificates) so the figure includes
// durable group commit. Output: one human line and, with --json, one JSON object (the
// comparison script bench/relay/compare.sh reads it).
#include <CLI/CLI.hpp>

#include "workload.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <iostream>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "diaspora/certs.hpp"
#include "diaspora/event.hpp"
#include "diaspora/relay.hpp"
#include "diaspora/client.hpp"
#include "diaspora/token.hpp"

namespace diaspora::bench {

namespace json = boost::json;
using Clock = std::chrono::steady_clock;

namespace {

struct BenchArgs {
  std::string url, ca, token, fsync = "always", data_dir;
  int producers = 1, subscribers = 1;
  std::uint64_t events = 200000;
  std::size_t size = 256, batch = 500, window = 16;
  double rate = 0;  // events/s over all producers; 0 = as fast as acks allow
  bool json_out = false;
  int threads = 2;  // embedded relay's I/O threads
  int disk_probe = 0;  // fdatasync samples taken in the data directory after the run
  bool task_events = false;  // publish task heartbeats on <x>.events (what the views read)
  bool views = true;         // embedded relay: materialise the views
  std::vector<std::string> jetstream;  // embedded relays: storage on this NATS JetStream cluster
  int replicas = 3;                    // with --jetstream: copies of each topic's stream
  int relays = 1;                      // embedded relays (more than one: with --jetstream)
};




int run_bench(BenchArgs a) {
  std::vector<std::unique_ptr<Relay>> relays;  // embedded: producers and subscribers spread over them
  std::vector<std::string> urls;
  std::filesystem::path tmp;
  if (a.url.empty()) {
    if (a.relays > 1 && a.jetstream.empty())
      throw Error("--relays " + std::to_string(a.relays) + " needs --jetstream: embedded logs are not shared");
    tmp = std::filesystem::temp_directory_path() / ("diaspora-bench-" + make_uuid().substr(0, 8));
    write_dev_certificates(tmp / "certs");
    write_secret_file(tmp / "secret");
    for (int r = 0; r < a.relays; ++r) {
      RelayConfig cfg;
      cfg.listen = "127.0.0.1:0";
      cfg.data_dir = a.data_dir.empty() ? tmp / ("data-" + std::to_string(r))
                                        : std::filesystem::path(a.data_dir) / std::to_string(r);
      cfg.tls_cert = tmp / "certs/server.pem";
      cfg.tls_key = tmp / "certs/server-key.pem";
      cfg.auth_secret_file = tmp / "secret";
      cfg.fsync = a.fsync;
      cfg.validate_payloads = true;
      cfg.threads = a.threads;
      cfg.views = a.views;
      if (!a.jetstream.empty()) {
        cfg.storage = "jetstream";
        cfg.jetstream.urls = a.jetstream;
        cfg.jetstream.replicas = a.replicas;
      }
      relays.push_back(std::make_unique<Relay>(cfg));
      relays.back()->start();
      urls.push_back("wss://127.0.0.1:" + std::to_string(relays.back()->port()));
    }
    a.ca = (tmp / "certs/ca.pem").string();
    TokenClaims c;
    c.subject = "bench";
    c.scopes = {"admin"};
    c.issued_at = std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now());
    c.expires_at = c.issued_at + std::chrono::hours(2);
    a.token = issue_token(load_secret_file(tmp / "secret"), c);
  } else {
    urls.push_back(a.url);
  }
  Relay* embedded = relays.empty() ? nullptr : relays.front().get();
  std::string topic = a.task_events ? "bench-" + make_uuid().substr(0, 8) + ".events" : "bench." + make_uuid().substr(0, 8);
  RelayClientOptions base;
  base.ca_file = a.ca;
  base.token = a.token;

  const std::uint64_t per_producer = a.events / static_cast<std::uint64_t>(a.producers);
  const std::uint64_t total = per_producer * static_cast<std::uint64_t>(a.producers);
  std::mutex lat_mutex;
  std::vector<double> latencies_us;
  latencies_us.reserve(static_cast<std::size_t>(total) * static_cast<std::size_t>(a.subscribers));
  std::atomic<int> subscribed{0};
  std::atomic<bool> failed{false};
  std::string failure;
  auto fail = [&](const std::string& why) {
    std::lock_guard lock(lat_mutex);
    if (!failed.exchange(true)) failure = why;
  };

  std::vector<std::thread> subs;
  for (int s = 0; s < a.subscribers; ++s) {
    subs.emplace_back([&, s] {
      try {
        RelayClientOptions o = base;
        o.url = urls[static_cast<std::size_t>(s) % urls.size()];
        o.client_id = "bench-sub-" + std::to_string(s);
        RelayClient client(o);
        client.send(frames::subscribe(std::to_string(s), topic, "earliest"));
        client.receive_json();  // subscribed
        subscribed++;
        std::vector<double> mine;
        mine.reserve(static_cast<std::size_t>(total));
        std::uint64_t got = 0;
        ArenaParser parser(4u << 20);
        while (got < total && !failed) {
          const std::string frame = client.receive();
          std::int64_t t = now_ns();
          const bool ok = parser.parse(frame, [&](const json::value& v) {
            const json::object& m = v.as_object();
            if (m.at("op") != "events") return;
            for (const auto& e : m.at("events").as_array()) {
              const json::value& data = e.as_object().at("event").as_object().at("data");
              const json::value* sent = data.as_object().if_contains("t");
              if (!sent) sent = &data.as_object().at("seq");  // --task-events
              mine.push_back(static_cast<double>(t - sent->to_number<std::int64_t>()) / 1000.0);
              ++got;
            }
          });
          if (!ok) throw Error("the relay sent a frame that is not JSON");
        }
        std::lock_guard lock(lat_mutex);
        latencies_us.insert(latencies_us.end(), mine.begin(), mine.end());
      } catch (const std::exception& e) {
        fail(std::string("subscriber: ") + e.what());
      }
    });
  }
  auto wait_deadline = Clock::now() + std::chrono::seconds(30);
  while (subscribed < a.subscribers && !failed && Clock::now() < wait_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));

  std::atomic<std::uint64_t> acked{0};
  std::vector<double> ack_us;  // each publish: sent -> its ack received (µs), every producer
  std::mutex ack_mutex;
  // Two phases: every producer connected, then (after the main thread's sync) go.
  std::barrier start_line(a.producers + 1);
  std::vector<std::thread> prods;
  for (int p = 0; p < a.producers; ++p) {
    prods.emplace_back([&, p] {
      try {
        RelayClientOptions o = base;
        o.url = urls[static_cast<std::size_t>(p) % urls.size()];
        o.client_id = "bench-pub-" + std::to_string(p);
        o.producer_id = "bench-" + topic + "-" + std::to_string(p);
        RelayClient client(o);
        start_line.arrive_and_wait();  // connected
        start_line.arrive_and_wait();  // go
        const double per_producer_rate = a.rate / a.producers;
        auto t0 = Clock::now();
        std::uint64_t next = 0, seq = 0;
        std::size_t inflight = 0;
        std::unordered_map<std::uint64_t, std::int64_t> sent_ns;  // seq -> when it was sent
        std::vector<double> mine;
        while ((next < per_producer || inflight > 0) && !failed) {
          while (next < per_producer && inflight < a.window) {
            if (per_producer_rate > 0) {  // open-loop pacing for latency runs
              auto due = t0 + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(static_cast<double>(next) / per_producer_rate));
              if (due > Clock::now()) {
                if (inflight > 0) break;  // collect acks meanwhile
                std::this_thread::sleep_until(due);
              }
            }
            std::uint64_t n = std::min<std::uint64_t>(a.batch, per_producer - next);
            if (per_producer_rate > 0) {
              // Do not batch ahead of the schedule: send what is due now.
              auto elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
              std::uint64_t due_count = static_cast<std::uint64_t>(elapsed * per_producer_rate) + 1;
              n = std::max<std::uint64_t>(1, std::min(n, due_count > next ? due_count - next : 1));
            }
            std::string frame = frames::publish_head(topic, seq++);
            std::int64_t t = now_ns();
            for (std::uint64_t i = 0; i < n; ++i) {
              if (i) frame += ',';
              frame += a.task_events ? make_task_event(p, next + i, a.size, t) : make_event(p, next + i, a.size, t);
            }
            frame += frames::kPublishTail;
            client.send(frame);
            sent_ns[seq - 1] = now_ns();
            next += n;
            ++inflight;
          }
          if (inflight == 0) continue;
          json::object m = client.receive_json();
          if (m["op"] != "ack") throw Error("publish refused: " + json::serialize(m));
          acked += m["count"].to_number<std::uint64_t>();
          if (auto it = sent_ns.find(m["seq"].to_number<std::uint64_t>()); it != sent_ns.end()) {
            mine.push_back(static_cast<double>(now_ns() - it->second) / 1000.0);
            sent_ns.erase(it);
          }
          --inflight;
        }
        std::lock_guard lk(ack_mutex);
        ack_us.insert(ack_us.end(), mine.begin(), mine.end());
      } catch (const std::exception& e) {
        fail(std::string("producer: ") + e.what());
        start_line.arrive_and_drop();
      }
    });
  }
  start_line.arrive_and_wait();  // every producer connected (or failed)
  settle_disk();
  start_line.arrive_and_wait();
  auto t_start = Clock::now();
  for (auto& t : prods) t.join();
  double publish_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  for (auto& t : subs) t.join();
  double total_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  // The views keep up when they have read (nearly) everything by the end of the run: the
  // backlog then, and how long they took to read it.
  std::int64_t views_backlog = -1;
  double views_catch_up_s = 0;
  if (embedded && a.views && a.task_events) {
    views_backlog = static_cast<std::int64_t>(acked.load()) - static_cast<std::int64_t>(embedded->views_read());
    const auto t_end = Clock::now();
    while (embedded->views_read() < acked.load() && Clock::now() - t_end < std::chrono::seconds(60))
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    views_catch_up_s = std::chrono::duration<double>(Clock::now() - t_end).count();
  }
  for (auto& r : relays) r->stop();
  std::vector<double> disk_us;
  if (a.disk_probe > 0 && !failed) {
    try {
      const std::filesystem::path where = !a.data_dir.empty() ? std::filesystem::path(a.data_dir)
                                          : !tmp.empty()        ? tmp
                                                                : std::filesystem::temp_directory_path();
      disk_us = probe_fdatasync(where, a.disk_probe);
    } catch (const std::exception& e) {
      fail(std::string("disk probe: ") + e.what());
    }
  }
  if (!tmp.empty()) std::filesystem::remove_all(tmp);
  if (failed) {
    std::cerr << "error: " << failure << "\n";
    return 1;
  }
  const double disk_p50 = percentile(disk_us, 0.50), disk_p99 = percentile(disk_us, 0.99);
  double eps = static_cast<double>(acked) / publish_s;
  double mbps = eps * static_cast<double>(a.size) / 1e6;
  double p50 = percentile(latencies_us, 0.50), p99 = percentile(latencies_us, 0.99),
         p999 = percentile(latencies_us, 0.999);
  if (a.json_out) {
    std::cout << json::serialize(json::object{{"system", "diaspora-relay"},
                                              {"storage", a.jetstream.empty() ? "embedded" : "jetstream"},
                                              {"relays", static_cast<int>(urls.size())},
                                              {"producers", a.producers},
                                              {"subscribers", a.subscribers},
                                              {"events", acked.load()},
                                              {"size", a.size},
                                              {"batch", a.batch},
                                              {"rate", a.rate},
                                              {"fsync", a.fsync},
                                              {"events_per_s", eps},
                                              {"mb_per_s", mbps},
                                              {"delivery_s", total_s},
                                              {"p50_us", p50},
                                              {"p99_us", p99},
                                              {"p999_us", p999},
                                              {"ack_p50_us", percentile(ack_us, 0.50)},
                                              {"ack_p99_us", percentile(ack_us, 0.99)},
                                              {"disk_fdatasync_samples", disk_us.size()},
                                              {"disk_fdatasync_p50_us", disk_p50},
                                              {"disk_fdatasync_p99_us", disk_p99},
                                              {"views_backlog", views_backlog},
                                              {"views_catch_up_s", views_catch_up_s}})
              << "\n";
  } else {
    std::printf("diaspora-relay: %d producers x %d subscribers, %llu events of %zu B, batch %zu, fsync %s%s\n",
                a.producers, a.subscribers, static_cast<unsigned long long>(acked.load()), a.size, a.batch,
                a.fsync.c_str(), a.rate > 0 ? (", rate " + std::to_string(static_cast<long>(a.rate)) + "/s").c_str() : "");
    std::printf("  acked publish: %.0f events/s, %.1f MB/s; all delivered after %.2f s\n", eps, mbps, total_s);
    std::printf("  end-to-end latency: p50 %.0f us, p99 %.0f us, p99.9 %.0f us\n", p50, p99, p999);
    std::printf("  publish ack latency: p50 %.0f us, p99 %.0f us\n", percentile(ack_us, 0.50), percentile(ack_us, 0.99));
    if (!disk_us.empty())
      std::printf("  disk: 4 KiB append + fdatasync p50 %.0f us, p99 %.0f us (%zu samples)\n", disk_p50, disk_p99,
                  disk_us.size());
  }
  return 0;
}

}  // namespace

int bench_main(int argc, char** argv) {
  CLI::App app{"diaspora bench: benchmarks of a relay (run as `diaspora bench ...`)", "diaspora bench"};
  app.require_subcommand(1);
  auto* bench = &app;
  auto a = std::make_shared<BenchArgs>();
  auto* relay = bench->add_subcommand(
      "relay", "Acked-publish throughput and end-to-end latency; without --url, against an embedded relay");
  relay->add_option("--url", a->url, "Relay URL (default: start an embedded relay in a temporary directory)");
  relay->add_option("--ca", a->ca, "CA certificate (with --url)");
  relay->add_option("--token", a->token, "Token with publish and subscribe scope (with --url)");
  relay->add_option("--fsync", a->fsync, "Embedded relay: always | never | interval:<ms>")->capture_default_str();
  relay->add_option("--data-dir", a->data_dir, "Embedded relay: log directory (default: a temporary one)");
  relay->add_option("--producers", a->producers, "Producer connections")->check(CLI::Range(1, 256))->capture_default_str();
  relay->add_option("--subscribers", a->subscribers, "Subscriber connections")->check(CLI::Range(0, 256))->capture_default_str();
  relay->add_option("--events", a->events, "Events in total")->check(CLI::Range(1ull, 1ull << 34))->capture_default_str();
  relay->add_option("--size", a->size, "Event size in bytes")->check(CLI::Range(128, 1 << 20))->capture_default_str();
  relay->add_option("--batch", a->batch, "Events per publish")->check(CLI::Range(1, 100000))->capture_default_str();
  relay->add_option("--window", a->window, "Unacked publishes per producer")->check(CLI::Range(1, 10000))->capture_default_str();
  relay->add_option("--rate", a->rate, "Target events/s over all producers (0 = as fast as possible)")->capture_default_str();
  relay->add_option("--threads", a->threads, "Embedded relay: I/O threads")->check(CLI::Range(1, 64))->capture_default_str();
  relay->add_option("--disk-probe", a->disk_probe,
                    "After the run, time this many 4 KiB appends + fdatasync in the data directory (the disk's own floor)")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  relay->add_flag("--json", a->json_out, "Print one JSON object");
  relay->add_flag("--task-events", a->task_events,
                  "Publish org.diaspora.task.heartbeat events on <x>.events (what the relay's views read) instead of "
                  "org.example.bench on bench.<x>");
  relay->add_option("--views", a->views, "Embedded relay: materialise the views (true/false)")->capture_default_str();
  relay->add_option("--jetstream", a->jetstream,
                    "Embedded relays: store on this NATS JetStream cluster (its URLs) instead of the embedded log")
      ->delimiter(',');
  relay->add_option("--replicas", a->replicas, "With --jetstream: copies of each topic's stream")
      ->check(CLI::Range(1, 5))
      ->capture_default_str();
  relay->add_option("--relays", a->relays,
                    "Embedded relays (with --jetstream), producers and subscribers spread over them in turn")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    return run_bench(*a);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace diaspora::bench

int main(int argc, char** argv) { return diaspora::bench::bench_main(argc, argv); }
