#include "net_commands.hpp"

#include <boost/json.hpp>

#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>

#include "diaspora/event.hpp"
#include "diaspora/files.hpp"
#include "diaspora/client.hpp"
#include "diaspora/items.hpp"
#include "diaspora/token.hpp"

namespace diaspora::cli {

namespace json = boost::json;

namespace {

struct Connection {
  std::string url, ca, token, token_file, client_cert, client_key;

  void add(CLI::App* cmd) {
    cmd->add_option("--url", url,
                    "Relay URL, wss://HOST:PORT; several, comma-separated (relays on one JetStream cluster): the "
                    "first that answers")
        ->required();
    cmd->add_option("--ca", ca, "CA certificate that signed the relay's certificate (PEM)");
    cmd->add_option("--token", token, "Bearer token");
    cmd->add_option("--token-file", token_file, "File holding the bearer token");
    cmd->add_option("--client-cert", client_cert, "Client certificate for mutual TLS");
    cmd->add_option("--client-key", client_key, "Client key for mutual TLS");
  }
  /// A connection to the first relay of --url that answers; RelayClientError naming each
  /// relay and why when none does. `o`: options() with what the command adds.
  std::unique_ptr<RelayClient> connect(RelayClientOptions o) const {
    std::string why;
    std::size_t at = 0;
    for (;;) {
      const std::size_t comma = url.find(',', at);
      o.url = url.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
      try {
        return std::make_unique<RelayClient>(o);
      } catch (const RelayClientError& e) {
        if (comma == std::string::npos && why.empty()) throw;  // one relay: its own error
        why += "\n  " + o.url + ": " + e.what();
      }
      if (comma == std::string::npos) throw RelayClientError("no relay of --url answered:" + why);
      at = comma + 1;
    }
  }
  RelayClientOptions options() const {
    RelayClientOptions o;
    o.url = url;
    o.ca_file = ca;
    o.token = token;
    if (!token_file.empty()) o.token = load_token_file(token_file);
    if (!client_cert.empty()) o.client_cert = client_cert;
    if (!client_key.empty()) o.client_key = client_key;
    return o;
  }
};

// Input the user must fix (exit 2, docs/cli.md), as opposed to a failure while running.
class InvalidInput : public Error {
 public:
  using Error::Error;
};

struct PublishArgs {
  Connection conn;
  std::string topic, file, producer_id;
  std::size_t count = 0, size = 256, batch = 100, window = 16;
};

// Synthetic events of about `size` bytes each.
std::vector<std::string> synthetic_events(std::size_t count, std::size_t size, const std::string& producer) {
  std::vector<std::string> out;
  out.reserve(count);
  std::string run = make_uuid().substr(0, 8);
  for (std::size_t i = 0; i < count; ++i) {
    json::object e{{"specversion", "1.0"},
                   {"id", run + "-" + std::to_string(i)},
                   {"source", "/diaspora/cli/" + producer},
                   {"type", "org.example.synthetic"},
                   {"time", format_rfc3339(std::chrono::system_clock::now())},
                   {"data", ""}};
    std::size_t base = json::serialize(e).size();
    e["data"] = std::string(size > base ? size - base : 0, 'x');
    out.push_back(json::serialize(e));
  }
  return out;
}

std::vector<std::string> events_from_file(const std::string& file) {
  std::ifstream in(file);
  if (!in) throw Error(file + ": cannot open");
  std::vector<std::string> out;
  std::string line;
  std::size_t n = 0;
  std::string errors;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      decode_event(line, CodecOptions{});
      out.push_back(line);
    } catch (const EventError& e) {
      errors += file + ":" + std::to_string(n) + ": error: " + e.what() + "\n";
    }
  }
  if (!errors.empty()) throw InvalidInput("invalid events, nothing was published:\n" + errors);
  return out;
}

int run_publish(const PublishArgs& a) {
  std::vector<std::string> events;
  std::string producer = a.producer_id.empty() ? "cli-" + make_uuid().substr(0, 8) : a.producer_id;
  if (!a.file.empty()) {
    try {
      events = events_from_file(a.file);
    } catch (const InvalidInput& e) {
      std::cerr << "error: " << e.what();
      return 2;
    }
  }
  else events = synthetic_events(a.count, a.size, producer);
  if (events.empty()) {
    std::cerr << "error: nothing to publish\n";
    return 2;
  }
  RelayClientOptions o = a.conn.options();
  o.producer_id = producer;
  const auto connection = a.conn.connect(o);
  RelayClient& client = *connection;
  auto start = std::chrono::steady_clock::now();
  std::uint64_t acked = 0, duplicates = 0, seq = 0;
  std::size_t next = 0, inflight = 0;
  std::deque<std::size_t> sizes;
  while (next < events.size() || inflight > 0) {
    while (next < events.size() && inflight < a.window) {
      std::size_t n = std::min(a.batch, events.size() - next);
      std::vector<std::string_view> batch(events.begin() + static_cast<std::ptrdiff_t>(next),
                                          events.begin() + static_cast<std::ptrdiff_t>(next + n));
      client.send(frames::publish(a.topic, seq++, batch));
      next += n;
      ++inflight;
    }
    json::object reply = client.receive_json();
    std::string_view op = reply["op"].as_string();
    if (op == "ack") {
      --inflight;
      acked += reply["count"].to_number<std::uint64_t>();
      duplicates += reply["duplicates"].to_number<std::uint64_t>();
    } else if (op == "nack" || op == "error") {
      std::cerr << "error: the relay refused batch " << json::serialize(reply["seq"]) << ": "
                << json::serialize(reply) << "\n";
      std::cout << "acked " << acked << " of " << events.size() << " events\n";
      return 1;
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "acked " << acked << " of " << events.size() << " events";
  if (duplicates) std::cout << " (" << duplicates << " duplicates dropped)";
  std::cout << " in " << secs << " s (" << static_cast<std::uint64_t>(events.size() / std::max(secs, 1e-9))
            << " events/s)\n";
  return 0;
}

struct TailArgs {
  Connection conn;
  std::string topic, from = "latest", group;
  std::uint64_t count = 0;
  double idle_s = 0;  ///< > 0: stop after this long with no event (the end of the log, as far as a reader can tell)
  bool with_offsets = false;
};

int run_tail(const TailArgs& a) {
  const auto connection = a.conn.connect(a.conn.options());
  RelayClient& client = *connection;
  frames::From from{std::string_view(a.from)};
  if (a.from != "earliest" && a.from != "latest") {
    try {
      from = frames::From{static_cast<std::uint64_t>(std::stoull(a.from))};
    } catch (...) {
      std::cerr << "error: --from must be earliest, latest or an offset\n";
      return 2;
    }
  }
  client.send(frames::subscribe("tail", a.topic, from, a.group));
  std::uint64_t printed = 0;
  for (;;) {
    json::object m;
    if (a.idle_s > 0) {
      auto frame = client.poll_receive(std::chrono::milliseconds(static_cast<std::int64_t>(a.idle_s * 1000)));
      if (!frame) return 0;  // nothing new for --idle: the end of what is there
      auto parsed = RelayClient::parse_frame(*frame);
      if (!parsed) continue;
      m = std::move(*parsed);
    } else {
      const std::string frame = client.receive();
      if (client.last_binary()) continue;  // a data item's chunk (docs/streaming.md): tail prints events
      auto parsed = RelayClient::parse_frame(frame);
      if (!parsed) continue;
      m = std::move(*parsed);
    }
    std::string_view op = m["op"].as_string();
    if (op == "error") {
      std::cerr << "error: " << json::serialize(m) << "\n";
      return 1;
    }
    if (op != "events") continue;
    std::string topic(m["topic"].as_string());
    std::uint64_t commit_to = m["next_offset"].to_number<std::uint64_t>();
    for (const auto& item : m["events"].as_array()) {
      const json::object& it = item.as_object();
      if (a.with_offsets)
        std::cout << json::serialize(json::object{{"topic", topic}, {"offset", it.at("offset")}, {"event", it.at("event")}})
                  << "\n";
      else
        std::cout << json::serialize(it.at("event")) << "\n";
      if (a.count && ++printed >= a.count) {
        commit_to = it.at("offset").to_number<std::uint64_t>() + 1;  // exactly past the last printed event
        break;
      }
    }
    std::cout.flush();
    if (!a.group.empty()) {
      client.send(frames::commit(a.group, topic, commit_to));
      for (;;) {  // wait for the commit to be confirmed before moving on
        json::object c = client.receive_json();
        if (c["op"] == "committed") break;
        if (c["op"] == "error") {
          std::cerr << "error: " << json::serialize(c) << "\n";
          return 1;
        }
      }
    }
    if (a.count && printed >= a.count) return 0;
  }
}

struct PutArgs {
  Connection conn;
  std::string topic, file, id, source = "/diaspora/cli", type = "org.diaspora.data.item", deadline, producer_id;
  std::size_t chunk_bytes = data::kDefaultChunkBytes;
};

// `diaspora put`: a file as one data item (docs/streaming.md); prints where it is.
int run_put(const PutArgs& a) {
  std::string bytes;
  json::object event{{"specversion", "1.0"},
                     {"id", a.id.empty() ? make_uuid() : a.id},
                     {"source", a.source},
                     {"type", a.type},
                     {"time", format_rfc3339(std::chrono::system_clock::now())},
                     {"data", json::object{{"file", std::filesystem::path(a.file).filename().string()}}}};
  if (!a.deadline.empty() && !parse_rfc3339_us(a.deadline)) {
    std::cerr << "error: --deadline '" << a.deadline << "' is not an RFC 3339 timestamp (e.g. 2026-12-06T17:00:00Z)\n";
    return 2;
  }
  try {
    bytes = read_file(a.file, std::numeric_limits<std::size_t>::max());
  } catch (const Error& e) {  // the file names itself and the system's reason
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  RelayClientOptions o = a.conn.options();
  o.producer_id = a.producer_id.empty() ? "cli-put-" + make_uuid().substr(0, 8) : a.producer_id;
  const auto connection = a.conn.connect(o);
  items::PutOptions po;
  po.chunk_bytes = a.chunk_bytes;
  if (!a.deadline.empty()) po.deadline = a.deadline;
  // The seq is the time: each put of a --producer-id comes after the ones before. A put run
  // again with the same --id (after a lost ack) is not written twice: the relay holds its
  // event and chunks already (de-duplicated by source and id).
  const auto seq = static_cast<std::uint64_t>(now_us());
  try {
    const items::PutResult r = items::put(*connection, a.topic, seq, std::move(event), bytes, po);
    json::object out{{"topic", a.topic},   {"offset", r.offset},    {"size", bytes.size()},
                     {"chunks", r.chunks}, {"sha256", r.sha256},
                     {"uri", data::item_uri(a.topic, r.offset)}};
    if (r.duplicate) out["duplicate"] = true;
    if (r.late) out["late"] = true;
    std::cout << json::serialize(out) << "\n";
    return 0;
  } catch (const items::ItemError& e) {
    std::cerr << "error: " << e.what() << " (" << e.code() << ")\n";
    return e.code() == "item_too_large" ? 2 : 1;
  }
}

struct GetArgs {
  Connection conn;
  std::string topic, out, uri;
  std::uint64_t offset = 0;
};

// `diaspora get`: the item at an offset, its bytes to a file (checked), its event printed.
int run_get(GetArgs a) {
  if (!a.uri.empty()) {  // diaspora://TOPIC/OFFSET, as put prints it and data.arrived carries it
    const auto at = data::parse_item_uri(a.uri);
    if (!at) {
      std::cerr << "error: '" << a.uri << "' is not a data item's URI (diaspora://TOPIC/OFFSET)\n";
      return 2;
    }
    a.topic = at->topic;
    a.offset = at->offset;
  }
  if (a.topic.empty()) {
    std::cerr << "error: get needs an item: diaspora://TOPIC/OFFSET, or --topic and --offset\n";
    return 2;
  }
  const auto connection = a.conn.connect(a.conn.options());
  items::Item item;
  try {
    item = items::fetch(*connection, a.topic, a.offset);
  } catch (const items::ItemError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return e.code() == "no_item" ? 2 : 1;
  }
  try {
    write_file_atomic(a.out, item.bytes, 0644, Durability::process);  // whole or not at all
  } catch (const Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  std::cout << json::serialize(item.event) << "\n";
  return 0;
}

}  // namespace

std::function<int()> add_net_commands(CLI::App& app) {
  auto pa = std::make_shared<PublishArgs>();
  auto* pub = app.add_subcommand("publish", "Publish events to a relay topic; prints how many were acked");
  pa->conn.add(pub);
  pub->add_option("--topic", pa->topic, "Topic")->required();
  auto* count = pub->add_option("--count", pa->count, "Publish this many synthetic events");
  pub->add_option("--size", pa->size, "Approximate size of each synthetic event in bytes")->capture_default_str()->needs(count);
  auto* file = pub->add_option("--file", pa->file, "Publish the events of a JSON-lines file")->check(CLI::ExistingFile);
  count->excludes(file);
  pub->add_option("--batch", pa->batch, "Events per publish frame")->check(CLI::Range(1, 100000));
  pub->add_option("--window", pa->window, "Unacked batches in flight")->check(CLI::Range(1, 10000));
  pub->add_option("--producer-id", pa->producer_id, "Stable producer id (idempotent resends)");

  auto ta = std::make_shared<TailArgs>();
  auto* tail = app.add_subcommand("tail", "Print a topic's events as JSON lines");
  ta->conn.add(tail);
  tail->add_option("--topic", ta->topic, "Topic, or a pattern with '*'")->required();
  tail->add_option("--from", ta->from, "earliest | latest | OFFSET")->capture_default_str();
  tail->add_option("--count", ta->count, "Stop after this many events (default: run until interrupted)");
  tail->add_option("--idle", ta->idle_s,
                   "Stop once no event came for this many seconds: with --from earliest, the end of the log (e.g. 2)")
      ->check(CLI::PositiveNumber);
  tail->add_option("--group", ta->group, "Consumer group: resume where it committed, commit as events are printed");
  tail->add_flag("--offsets", ta->with_offsets, "Print {topic, offset, event} objects");

  auto ua = std::make_shared<PutArgs>();
  auto* putc = app.add_subcommand("put", "Put a file on a relay topic as one data item (docs/streaming.md); prints "
                                         "{topic, offset, size, chunks, sha256}");
  ua->conn.add(putc);
  putc->add_option("--topic", ua->topic, "Topic")->required();
  putc->add_option("file", ua->file, "The file")->required()->check(CLI::ExistingFile);
  putc->add_option("--id", ua->id, "The item's event id (default: a new UUID); a put retried with the same id is not written twice");
  putc->add_option("--source", ua->source, "The item's event source")->capture_default_str();
  putc->add_option("--type", ua->type, "The item's event type")->capture_default_str();
  putc->add_option("--deadline", ua->deadline, "RFC 3339: stored later, the relay says it was late");
  putc->add_option("--chunk-bytes", ua->chunk_bytes, "Bytes per chunk")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, data::kMaxChunkBytes));
  putc->add_option("--producer-id", ua->producer_id, "Stable producer id");

  auto ga = std::make_shared<GetArgs>();
  auto* getc = app.add_subcommand("get", "Fetch the data item at an offset of a topic into a file (its SHA-256 checked); "
                                         "prints its event");
  ga->conn.add(getc);
  auto* guri = getc->add_option("uri", ga->uri, "The item: diaspora://TOPIC/OFFSET (what put printed as uri)");
  auto* gtopic = getc->add_option("--topic", ga->topic, "Topic (instead of the URI)");
  getc->add_option("--offset", ga->offset, "The offset of the item's event (what put printed)")->needs(gtopic);
  guri->excludes(gtopic);
  getc->add_option("-o,--output", ga->out, "Where to write the bytes")->required();

  return [pub, tail, putc, getc, pa, ta, ua, ga, count, file]() -> int {
    if (putc->parsed()) return run_put(*ua);
    if (getc->parsed()) return run_get(*ga);
    if (pub->parsed()) {
      if (pa->count == 0 && pa->file.empty()) {
        std::cerr << "error: publish needs --count N or --file events.jsonl\n";
        return 2;
      }
      return run_publish(*pa);
    }
    if (tail->parsed()) return run_tail(*ta);
    return -1;
  };
}

}  // namespace diaspora::cli
