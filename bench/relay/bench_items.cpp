// Data items (docs/streaming.md): bulk throughput through the relay on loopback against the
// same items through NATS JetStream directly, in one run (bench/relay/items.sh).
//
// Rows:
//   relay (embedded log, fsync always): items::put, one item at a time, each acked once
//     its event and chunks are fsynced; then every item fetched back (SHA-256 checked);
//   relay on JetStream (--nats): the same, the relay storing in a stream of that server;
//   JetStream directly (--nats): each item's chunks published asynchronously to a file
//     stream, the item done once every chunk's publish ack came (js_PublishAsyncComplete).
//     JetStream acks once a message is written, syncing on its own schedule (not fsynced
//     per ack), which the table says.
// MB/s are of item bytes (MiB = 2^20 bytes).
//
//   bench_items [--items N] [--size MIB] [--chunk KIB] [--nats nats://127.0.0.1:4222] [--json]
#include <nats/nats.h>

#include <boost/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "diaspora/certs.hpp"
#include "diaspora/client.hpp"
#include "diaspora/event.hpp"
#include "diaspora/items.hpp"
#include "diaspora/relay.hpp"
#include "diaspora/token.hpp"

namespace json = boost::json;
using namespace diaspora;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  int items = 32;
  std::size_t size_mib = 16, chunk_kib = 256;
  std::string nats;
  bool json_out = false;
};

struct Row {
  std::string label;
  double put_mbs = 0, get_mbs = -1;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Puts every item through a relay (embedded, or on JetStream), then fetches each back.
Row through_relay(const Args& a, const std::vector<std::string>& blobs, const std::string& label, const std::string& nats) {
  const auto tmp = std::filesystem::temp_directory_path() / ("diaspora-bench-items-" + make_uuid().substr(0, 8));
  write_dev_certificates(tmp / "certs");
  write_secret_file(tmp / "secret");
  RelayConfig cfg;
  cfg.listen = "127.0.0.1:0";
  cfg.data_dir = tmp / "data";
  cfg.tls_cert = tmp / "certs/server.pem";
  cfg.tls_key = tmp / "certs/server-key.pem";
  cfg.auth_secret_file = tmp / "secret";
  cfg.fsync = std::getenv("BENCH_ITEMS_FSYNC") ? std::getenv("BENCH_ITEMS_FSYNC") : "always";
  cfg.views = false;
  if (!nats.empty()) {
    cfg.storage = "jetstream";
    cfg.jetstream.urls = {nats};
    cfg.jetstream.replicas = 1;
    cfg.jetstream.prefix = "BI" + make_uuid().substr(0, 6);
    cfg.jetstream.subject_root = "bi" + make_uuid().substr(0, 6);
  }
  Row row{label};
  {
    Relay relay(cfg);
    relay.start();
    TokenClaims c;
    c.subject = "bench";
    c.scopes = {"admin"};
    c.issued_at = std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now());
    c.expires_at = c.issued_at + std::chrono::hours(2);
    RelayClientOptions o;
    o.url = "wss://127.0.0.1:" + std::to_string(relay.port());
    o.ca_file = tmp / "certs/ca.pem";
    o.token = issue_token(load_secret_file(tmp / "secret"), c);
    o.producer_id = "bench-items";
    RelayClient client(o);
    items::PutOptions po;
    po.chunk_bytes = a.chunk_kib * 1024;
    std::vector<std::uint64_t> offsets;
    const auto t0 = Clock::now();
    for (std::size_t i = 0; i < blobs.size(); ++i) {
      json::object ev{{"specversion", "1.0"}, {"id", "item-" + std::to_string(i)}, {"source", "/bench"}, {"type", "org.diaspora.data.item"}, {"data", json::object{{"seq", i}}}};
      offsets.push_back(items::put(client, "bench.data", i + 1, std::move(ev), blobs[i], po).offset);
    }
    const double put_s = seconds_since(t0);
    const auto t1 = Clock::now();
    std::size_t back = 0;
    for (std::size_t i = 0; i < blobs.size(); ++i) {
      const items::Item it = items::fetch(client, "bench.data", offsets[i]);
      if (it.bytes != blobs[i]) throw Error("item " + std::to_string(i) + " came back different");
      back += it.bytes.size();
    }
    const double get_s = seconds_since(t1);
    const double mib = static_cast<double>(blobs.size() * blobs.front().size()) / (1 << 20);
    row.put_mbs = mib / put_s;
    row.get_mbs = static_cast<double>(back) / (1 << 20) / get_s;
    client.close();
    relay.stop();
  }
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  return row;
}

void check(natsStatus s, const char* what) {
  if (s != NATS_OK) throw Error(std::string("JetStream: ") + what + ": " + natsStatus_GetText(s));
}

// The same items' chunks straight into a JetStream file stream.
Row jetstream_directly(const Args& a, const std::vector<std::string>& blobs) {
  natsConnection* nc = nullptr;
  check(natsConnection_ConnectTo(&nc, a.nats.c_str()), "connect");
  jsOptions jo;
  jsOptions_Init(&jo);
  jo.PublishAsync.MaxPending = 1024;
  jsCtx* js = nullptr;
  check(natsConnection_JetStream(&js, nc, &jo), "context");
  const std::string stream = "BENCHITEMS" + make_uuid().substr(0, 6), subject = "benchitems." + make_uuid().substr(0, 6);
  jsStreamConfig sc;
  jsStreamConfig_Init(&sc);
  sc.Name = stream.c_str();
  const char* subjects[1] = {subject.c_str()};
  sc.Subjects = subjects;
  sc.SubjectsLen = 1;
  sc.Storage = js_FileStorage;
  jsStreamInfo* si = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  check(js_AddStream(&si, js, &sc, nullptr, &jerr), "add stream");
  jsStreamInfo_Destroy(si);
  const std::size_t chunk = a.chunk_kib * 1024;
  const auto t0 = Clock::now();
  for (const std::string& b : blobs) {
    for (std::size_t at = 0; at < b.size(); at += chunk) {
      const std::size_t n = std::min(chunk, b.size() - at);
      check(js_PublishAsync(js, subject.c_str(), b.data() + at, static_cast<int>(n), nullptr), "publish");
    }
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = 60000;
    check(js_PublishAsyncComplete(js, &po), "publish complete");  // the item is in
  }
  const double put_s = seconds_since(t0);
  js_DeleteStream(js, stream.c_str(), nullptr, nullptr);
  jsCtx_Destroy(js);
  natsConnection_Destroy(nc);
  return Row{"JetStream directly (chunks, async publish; its own sync schedule)",
             static_cast<double>(blobs.size() * blobs.front().size()) / (1 << 20) / put_s, -1};
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_items: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--items") a.items = std::stoi(next());
    else if (k == "--size") a.size_mib = std::stoul(next());
    else if (k == "--chunk") a.chunk_kib = std::stoul(next());
    else if (k == "--nats") a.nats = next();
    else if (k == "--json") a.json_out = true;
    else {
      std::fprintf(stderr, "usage: bench_items [--items N] [--size MIB] [--chunk KIB] [--nats URL] [--json]\n");
      return 2;
    }
  }
  if (a.items < 1 || a.size_mib < 1 || a.chunk_kib < 1 || a.chunk_kib * 1024 > data::kMaxChunkBytes) {
    std::fprintf(stderr, "bench_items: --items, --size >= 1; --chunk 1 to %zu KiB\n", data::kMaxChunkBytes / 1024);
    return 2;
  }
  try {
    std::mt19937_64 rng(42);
    std::vector<std::string> blobs(static_cast<std::size_t>(a.items), std::string(a.size_mib << 20, '\0'));
    for (auto& b : blobs)
      for (std::size_t i = 0; i + 8 <= b.size(); i += 8) {
        const std::uint64_t v = rng();
        std::memcpy(b.data() + i, &v, 8);
      }
    std::vector<Row> rows{through_relay(a, blobs, "relay (embedded log, fsync before each ack)", "")};
    if (!a.nats.empty()) {
      rows.push_back(through_relay(a, blobs, "relay on JetStream (1 replica)", a.nats));
      rows.push_back(jetstream_directly(a, blobs));
    }
    if (a.json_out) {
      json::array out;
      for (const Row& r : rows) out.push_back(json::object{{"label", r.label}, {"put_mib_s", r.put_mbs}, {"get_mib_s", r.get_mbs}});
      std::printf("%s\n", json::serialize(out).c_str());
      return 0;
    }
    std::printf("%d items of %zu MiB in chunks of %zu KiB, one producer, loopback\n", a.items, a.size_mib, a.chunk_kib);
    std::printf("| path | put MiB/s (acked) | get MiB/s (checked) |\n|---|---:|---:|\n");
    for (const Row& r : rows)
      std::printf("| %s | %.0f | %s |\n", r.label.c_str(), r.put_mbs, r.get_mbs < 0 ? "-" : std::to_string(static_cast<int>(r.get_mbs)).c_str());
    if (rows.size() == 3)
      std::printf("relay / JetStream directly (put): %.2fx (the relay: TLS, fsync before each ack, SHA-256 checked; "
                  "JetStream directly: plain TCP, its own sync schedule)\n",
                  rows[0].put_mbs / rows[2].put_mbs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_items: %s\n", e.what());
    return 1;
  }
  return 0;
}
