// The peer of `diaspora bench relay`: the same workload against NATS JetStream (file
// storage, the server's defaults) through the official C client (Debian's libnats).
// N producers (one connection each, asynchronous publish with acks, the same window of
// unacked events) and M subscribers (ordered push consumers) move the same JSON events;
// subscribers parse each event to read its send time, as ours do.
//
//   bench_jetstream --url nats://127.0.0.1:4222 --producers 4 --subscribers 1
//                   --events 400000 --size 256 --window 8000 [--rate 20000] [--replicas 3] [--json]
//                   [--msg-id] [--republish]
//
// --msg-id and --republish add what the relay on JetStream asks of the cluster for each
// event (relay/src/jetstream_store.cpp), to measure what each costs JetStream itself: a
// Nats-Msg-Id header on every message (dedupe by (source, id)), and the stream
// republishing each stored message's headers to a second subject that one more
// connection subscribes to (how every relay hears what any relay stored).
#include <nats/nats.h>

#include <boost/json.hpp>

#include "workload.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace json = boost::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string url = "nats://127.0.0.1:4222";
  int producers = 1, subscribers = 1;
  long long events = 200000;
  std::size_t size = 256, window = 8000;
  double rate = 0;
  int replicas = 1;  // copies of the stream (a cluster's servers)
  bool json_out = false;
  bool msg_id = false, republish = false;
};



void check(natsStatus s, const char* what) {
  if (s != NATS_OK) {
    std::fprintf(stderr, "bench_jetstream: %s: %s\n", what, natsStatus_GetText(s));
    std::exit(1);
  }
}

struct Subscriber {
  std::mutex mutex;
  std::vector<double> latencies_us;
  std::atomic<long long> received{0};
};

void on_message(natsConnection*, natsSubscription*, natsMsg* msg, void* closure) {
  auto* sub = static_cast<Subscriber*>(closure);
  std::int64_t t = diaspora::bench::now_ns();
  thread_local diaspora::bench::ArenaParser parser(64 << 10);
  parser.parse(std::string_view(natsMsg_GetData(msg), static_cast<std::size_t>(natsMsg_GetDataLength(msg))),
               [&](const json::value& v) {
                 double us = static_cast<double>(t - v.at("data").at("t").to_number<std::int64_t>()) / 1000.0;
                 std::lock_guard lock(sub->mutex);
                 sub->latencies_us.push_back(us);
               });
  sub->received++;
  natsMsg_Destroy(msg);
}

std::atomic<long long> g_acked{0};
std::atomic<long long> g_errors{0};

void on_ack(jsCtx*, natsMsg* msg, jsPubAck* pa, jsPubAckErr* pae, void*) {
  if (pa) g_acked++;
  else if (pae) g_errors++;
  natsMsg_Destroy(msg);
}


}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_jetstream: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--url") a.url = val();
    else if (k == "--producers") a.producers = std::stoi(val());
    else if (k == "--subscribers") a.subscribers = std::stoi(val());
    else if (k == "--events") a.events = std::stoll(val());
    else if (k == "--size") a.size = std::stoul(val());
    else if (k == "--window") a.window = std::stoul(val());
    else if (k == "--rate") a.rate = std::stod(val());
    else if (k == "--replicas") a.replicas = std::stoi(val());
    else if (k == "--json") a.json_out = true;
    else if (k == "--msg-id") a.msg_id = true;
    else if (k == "--republish") a.republish = true;
    else {
      std::fprintf(stderr, "usage: bench_jetstream [--url U] [--producers N] [--subscribers M] [--events E] [--size B] "
                           "[--window W] [--rate R] [--replicas N] [--json] [--msg-id] [--republish]\n");
      return 2;
    }
  }

  // The stream (file storage, everything else default).
  natsConnection* admin = nullptr;
  check(natsConnection_ConnectTo(&admin, a.url.c_str()), "connect");
  jsCtx* ajs = nullptr;
  check(natsConnection_JetStream(&ajs, admin, nullptr), "jetstream");
  std::string stream = "BENCH" + std::to_string(diaspora::bench::now_ns() % 1000000000);
  std::string subject = "bench." + stream;
  const char* subjects[] = {subject.c_str()};
  jsStreamConfig cfg;
  jsStreamConfig_Init(&cfg);
  cfg.Name = stream.c_str();
  cfg.Subjects = subjects;
  cfg.SubjectsLen = 1;
  cfg.Storage = js_FileStorage;
  cfg.Replicas = a.replicas;
  const std::string stored = subject + ".stored";
  jsRePublish rp{subject.c_str(), stored.c_str(), true};
  if (a.republish) cfg.RePublish = &rp;
  jsStreamInfo* si = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  check(js_AddStream(&si, ajs, &cfg, nullptr, &jerr), "add stream");
  jsStreamInfo_Destroy(si);

  const long long per_producer = a.events / a.producers;
  const long long total = per_producer * a.producers;

  std::vector<std::unique_ptr<Subscriber>> subs;
  std::vector<natsConnection*> sub_conns;
  std::vector<natsSubscription*> sub_handles;
  for (int s = 0; s < a.subscribers; ++s) {
    subs.push_back(std::make_unique<Subscriber>());
    subs.back()->latencies_us.reserve(static_cast<std::size_t>(total));
    natsConnection* nc = nullptr;
    check(natsConnection_ConnectTo(&nc, a.url.c_str()), "subscriber connect");
    jsCtx* js = nullptr;
    check(natsConnection_JetStream(&js, nc, nullptr), "subscriber jetstream");
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = stream.c_str();
    so.Ordered = true;  // ack-less, flow-controlled push consumer: the fastest reader
    natsSubscription* sh = nullptr;
    check(js_Subscribe(&sh, js, subject.c_str(), on_message, subs.back().get(), nullptr, &so, &jerr), "subscribe");
    natsSubscription_SetPendingLimits(sh, -1, -1);
    sub_conns.push_back(nc);
    sub_handles.push_back(sh);
  }

  // --republish: a connection hearing every stored message's headers, as each relay does.
  std::atomic<long long> heard{0};
  natsConnection* stored_conn = nullptr;
  natsSubscription* stored_sub = nullptr;
  if (a.republish) {
    check(natsConnection_ConnectTo(&stored_conn, a.url.c_str()), "republish listener connect");
    check(natsConnection_Subscribe(
              &stored_sub, stored_conn, stored.c_str(),
              [](natsConnection*, natsSubscription*, natsMsg* m, void* c) {
                ++*static_cast<std::atomic<long long>*>(c);
                natsMsg_Destroy(m);
              },
              &heard),
          "republish listener");
    natsSubscription_SetPendingLimits(stored_sub, -1, -1);
  }

  std::vector<std::thread> prods;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  for (int p = 0; p < a.producers; ++p) {
    prods.emplace_back([&, p] {
      natsConnection* nc = nullptr;
      check(natsConnection_ConnectTo(&nc, a.url.c_str()), "producer connect");
      jsOptions jo;
      jsOptions_Init(&jo);
      jo.PublishAsync.MaxPending = static_cast<int64_t>(a.window);
      jo.PublishAsync.AckHandler = on_ack;
      jsCtx* js = nullptr;
      check(natsConnection_JetStream(&js, nc, &jo), "producer jetstream");
      ready++;
      while (!go) std::this_thread::yield();
      double per_rate = a.rate / a.producers;
      auto t0 = Clock::now();
      for (long long i = 0; i < per_producer; ++i) {
        if (per_rate > 0) {
          auto due = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(i / per_rate));
          std::this_thread::sleep_until(due);
        }
        std::string e = diaspora::bench::make_event(p, static_cast<std::uint64_t>(i), a.size, diaspora::bench::now_ns());
        if (!a.msg_id) {
          check(js_PublishAsync(js, subject.c_str(), e.data(), static_cast<int>(e.size()), nullptr), "publish");
          continue;
        }
        natsMsg* m = nullptr;
        check(natsMsg_Create(&m, subject.c_str(), nullptr, e.data(), static_cast<int>(e.size())), "message");
        const std::string id = "p" + std::to_string(p) + "-" + std::to_string(i);
        check(natsMsgHeader_Set(m, "Nats-Msg-Id", id.c_str()), "message id");
        check(js_PublishMsgAsync(js, &m, nullptr), "publish");
        natsMsg_Destroy(m);
      }
      jsPubOptions po;
      jsPubOptions_Init(&po);
      po.MaxWait = 60000;
      check(js_PublishAsyncComplete(js, &po), "publish complete");
      jsCtx_Destroy(js);
      natsConnection_Destroy(nc);
    });
  }
  while (ready < a.producers) std::this_thread::yield();
  diaspora::bench::settle_disk();
  auto start = Clock::now();
  go = true;
  for (auto& t : prods) t.join();
  double publish_s = std::chrono::duration<double>(Clock::now() - start).count();
  auto deadline = Clock::now() + std::chrono::seconds(120);
  for (auto& s : subs)
    while (s->received < total && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  double total_s = std::chrono::duration<double>(Clock::now() - start).count();

  std::vector<double> lat;
  for (auto& s : subs) lat.insert(lat.end(), s->latencies_us.begin(), s->latencies_us.end());
  natsSubscription_Destroy(stored_sub);
  natsConnection_Destroy(stored_conn);
  if (a.republish && heard < g_acked) std::fprintf(stderr, "bench_jetstream: heard %lld of %lld republished\n", heard.load(), g_acked.load());
  for (auto* sh : sub_handles) natsSubscription_Destroy(sh);
  for (auto* nc : sub_conns) natsConnection_Destroy(nc);
  js_DeleteStream(ajs, stream.c_str(), nullptr, nullptr);
  jsCtx_Destroy(ajs);
  natsConnection_Destroy(admin);

  double eps = static_cast<double>(g_acked.load()) / publish_s;
  double p50 = diaspora::bench::percentile(lat, 0.5), p99 = diaspora::bench::percentile(lat, 0.99), p999 = diaspora::bench::percentile(lat, 0.999);
  if (g_errors || g_acked < total) std::fprintf(stderr, "bench_jetstream: %lld acked, %lld errors\n", g_acked.load(), g_errors.load());
  if (a.json_out) {
    std::printf("%s\n", json::serialize(json::object{{"system", "nats-jetstream"},
                                                    {"producers", a.producers},
                                                    {"subscribers", a.subscribers},
                                                    {"events", g_acked.load()},
                                                    {"size", a.size},
                                                    {"rate", a.rate},
                                                    {"events_per_s", eps},
                                                    {"mb_per_s", eps * static_cast<double>(a.size) / 1e6},
                                                    {"delivery_s", total_s},
                                                    {"p50_us", p50},
                                                    {"p99_us", p99},
                                                    {"p999_us", p999}})
                            .c_str());
  } else {
    std::printf("nats-jetstream: %d producers x %d subscribers, %lld events of %zu B\n", a.producers, a.subscribers,
                g_acked.load(), a.size);
    std::printf("  acked publish: %.0f events/s, %.1f MB/s; all delivered after %.2f s\n", eps,
                eps * static_cast<double>(a.size) / 1e6, total_s);
    std::printf("  end-to-end latency: p50 %.0f us, p99 %.0f us, p99.9 %.0f us\n", p50, p99, p999);
  }
  nats_Close();
  return g_errors ? 1 : 0;
}
