#include "jetstream_store.hpp"

#include <boost/json.hpp>
#include <nats/nats.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <iostream>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "diaspora/data_item.hpp"
#include "diaspora/event.hpp"
#include "diaspora/thread_name.hpp"
#include "diaspora/token.hpp"

namespace diaspora::relay {

namespace {

constexpr char kHex[] = "0123456789ABCDEF";

// A character jetstream_name keeps as it is.
constexpr bool kept(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

// The text of a failed NATS call: the status, the library's detail and JetStream's code.
std::string nats_error(natsStatus s, jsErrCode jerr = static_cast<jsErrCode>(0)) {
  std::string out = natsStatus_GetText(s);
  natsStatus last = NATS_OK;
  if (const char* detail = nats_GetLastError(&last); detail && *detail && std::string_view(detail) != out)
    out += std::string(" (") + detail + ")";
  if (jerr != 0) out += " [JetStream error " + std::to_string(static_cast<int>(jerr)) + "]";
  return out;
}

// Owns a natsMsg / jsStreamInfo / kvEntry for the scope.
struct MsgGuard {
  natsMsg* m = nullptr;
  ~MsgGuard() { natsMsg_Destroy(m); }
};
struct InfoGuard {
  jsStreamInfo* si = nullptr;
  ~InfoGuard() { jsStreamInfo_Destroy(si); }
};
struct EntryGuard {
  kvEntry* e = nullptr;
  ~EntryGuard() { kvEntry_Destroy(e); }
};

}  // namespace

std::string jetstream_name(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (kept(c)) {
      out += static_cast<char>(c);
    } else {
      out += '_';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::optional<std::string> jetstream_unname(std::string_view name) {
  std::string out;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name[i] != '_') {
      if (!kept(static_cast<unsigned char>(name[i]))) return std::nullopt;
      out += name[i];
      continue;
    }
    if (i + 2 >= name.size()) return std::nullopt;  // '_' needs two hex digits after it
    const int hi = hex(name[i + 1]), lo = hex(name[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    const auto c = static_cast<unsigned char>(hi * 16 + lo);
    if (kept(c)) return std::nullopt;  // jetstream_name keeps it as it is: not one of its names
    out += static_cast<char>(c);
    i += 2;
  }
  return out;
}

std::optional<std::uint64_t> parse_stored_number(std::string_view s) {
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

bool stored_event_text(std::string_view payload) {
  if (data::is_chunk_record(payload)) return true;  // a data item's chunk (docs/streaming.md)
  boost::system::error_code ec;
  const boost::json::value v = boost::json::parse(payload, ec);
  return !ec && v.is_object();
}

std::optional<std::string> topic_of_stream_name(std::string_view stream, std::string_view prefix) {
  if (stream.size() <= prefix.size() || !stream.starts_with(prefix) || stream[prefix.size()] != '-') return std::nullopt;
  auto topic = jetstream_unname(stream.substr(prefix.size() + 1));
  if (!topic || !valid_topic_name(*topic)) return std::nullopt;
  return topic;
}

std::optional<MessageGet> parse_message_get(std::string_view answer, std::uint64_t seq) {
  boost::system::error_code ec;
  const boost::json::value v = boost::json::parse(answer, ec);
  const auto* o = !ec ? v.if_object() : nullptr;
  if (!o) return std::nullopt;
  if (const auto* err = o->if_contains("error")) {
    const auto* e = err->if_object();
    const auto* code = e ? e->if_contains("code") : nullptr;
    if (code && code->is_int64() && code->as_int64() == 404 && !o->contains("message")) return MessageGet{true, {}, 0};
    return std::nullopt;
  }
  const auto* m = o->if_contains("message") ? o->at("message").if_object() : nullptr;
  if (!m) return std::nullopt;
  const auto* sq = m->if_contains("seq");
  const auto* data = m->if_contains("data");
  const auto* when = m->if_contains("time");
  if (!sq || (!sq->is_uint64() && !(sq->is_int64() && sq->as_int64() >= 0))) return std::nullopt;
  const std::uint64_t got = sq->is_uint64() ? sq->as_uint64() : static_cast<std::uint64_t>(sq->as_int64());
  if (got != seq || !when || !when->is_string() || (data && !data->is_string())) return std::nullopt;
  auto bytes = data ? base64_decode(std::string_view(data->as_string())) : std::optional<std::string>(std::string());
  const auto time_us = parse_rfc3339_us(std::string_view(when->as_string()));
  if (!bytes || !time_us) return std::nullopt;
  return MessageGet{false, std::move(*bytes), *time_us};
}

std::optional<std::pair<std::string, std::string>> parse_group_key(std::string_view key) {
  const auto dot = key.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  auto group = jetstream_unname(key.substr(0, dot)), topic = jetstream_unname(key.substr(dot + 1));
  if (!group || !topic || !valid_topic_name(*group) || !valid_topic_name(*topic)) return std::nullopt;
  return std::pair{std::move(*group), std::move(*topic)};
}

std::optional<std::string> invalid_source(const JetStreamSource& source, const JetStreamOptions& own) {
  // 1 to `most` characters of [A-Za-z0-9-], and '_' where `underscore` (relay.schema.json's rules)
  auto name = [](const std::string& t, std::size_t most, bool underscore) {
    return !t.empty() && t.size() <= most && std::all_of(t.begin(), t.end(), [&](unsigned char c) {
      return std::isalnum(c) || c == '-' || (underscore && c == '_');
    });
  };
  if (!name(source.domain, 64, true))
    return "jetstream.sources: domain '" + source.domain + "' must be 1 to 64 of [A-Za-z0-9_-] (the jetstream.domain of its nats-server)";
  if (!name(source.prefix, 32, false))
    return "jetstream.sources: prefix '" + source.prefix + "' must be 1 to 32 of [A-Za-z0-9-] (its relay's jetstream.prefix)";
  if (!name(source.subject_root, 32, true))
    return "jetstream.sources: subject_root '" + source.subject_root + "' must be 1 to 32 of [A-Za-z0-9_-] (its relay's jetstream.subject_root)";
  if (source.subject_root == own.subject_root)
    return "jetstream.sources: domain " + source.domain + " has this relay's own subject_root '" + own.subject_root +
           "': give each domain's relays their own (else the streams of one capture the other's events over the leaf connection)";
  if (source.topics.empty()) return "jetstream.sources: domain " + source.domain + " lists no topics (omit topics for all)";
  for (const auto& t : source.topics) {
    const bool ok = !t.empty() && t.size() <= 200 && std::all_of(t.begin(), t.end(), [](unsigned char c) {
                      return std::isalnum(c) || c == '.' || c == '-' || c == '_' || c == '*';
                    });
    if (!ok) return "jetstream.sources: domain " + source.domain + ": topic pattern '" + t + "' is not a topic name or a pattern with '*'";
  }
  return std::nullopt;
}

struct JetStreamStore::Impl {
  JetStreamOptions opt;
  natsOptions* nopts = nullptr;
  natsConnection* nc = nullptr;
  jsCtx* js = nullptr;
  kvStore* producers = nullptr;
  kvStore* groups = nullptr;
  natsSubscription* stored_sub = nullptr;
  CommitListener listener;

  // Reads (visit): the stream leaders' answers to message gets, on one subscription for the
  // store's life, routed to the visit that asked by the reply subject
  // `<read_root><visit>.<seq>` (one subscription a visit raced libnats 3.4's reader thread
  // when it was destroyed with replies in flight).
  using Mailbox = ReadMailbox<natsMsg>;
  natsSubscription* read_sub = nullptr;
  std::string read_root;
  std::mutex reads_mu;
  std::map<std::uint64_t, std::shared_ptr<Mailbox>> reads;  // by visit
  std::uint64_t next_visit = 1;
  static void on_read_reply(natsConnection*, natsSubscription*, natsMsg* msg, void* closure) {
    auto* self = static_cast<Impl*>(closure);
    const std::string_view subj = natsMsg_GetSubject(msg);
    std::uint64_t visit = 0, seq = 0;
    const auto tail = subj.substr(std::min(subj.size(), self->read_root.size()));
    const auto dot = tail.find('.');
    std::shared_ptr<Mailbox> box;
    if (dot != tail.npos && std::from_chars(tail.data(), tail.data() + dot, visit).ec == std::errc{} &&
        std::from_chars(tail.data() + dot + 1, tail.data() + tail.size(), seq).ec == std::errc{}) {
      std::lock_guard lk(self->reads_mu);
      if (auto it = self->reads.find(visit); it != self->reads.end()) box = it->second;
    }
    if (!box) {  // a visit that has finished (or not a reply at all)
      natsMsg_Destroy(msg);
      return;
    }
    box->file(seq, msg);
  }

  // The batch being published (the writer's), which the ack handler fills.
  struct Acks {
    std::map<std::string, std::size_t> index;  // Nats-Msg-Id -> record
    std::vector<std::uint64_t> seq;            // 0: none yet
    std::vector<char> dup;
    std::vector<int> code, status;  // a refused record's JetStream error code and client status
    std::size_t answered = 0;
    std::string error;
  };
  std::mutex ack_mu;
  std::condition_variable ack_cv;
  Acks acks;

  struct Pending {
    std::string topic, producer_id;
    std::uint64_t seq = 0;
    std::vector<AppendRecord> records;
    Completion done;
  };
  std::mutex q_mu;
  std::condition_variable q_cv;
  std::deque<Pending> queue;
  bool stopping = false;
  std::thread writer;

  // JetStream's own health, asked once a second (a connected server whose cluster lost its
  // quorum answers the connection but not JetStream): what /readyz says.
  std::thread health;
  std::condition_variable health_cv;  // with q_mu: wakes the health thread to stop
  mutable std::mutex health_mu;
  std::string unhealthy;  // why JetStream does not answer now; empty: it does

  void health_main() {
    name_this_thread("js-health");
    std::unique_lock lk(q_mu);
    while (!stopping) {
      lk.unlock();
      jsAccountInfo* ai = nullptr;
      jsErrCode jerr = static_cast<jsErrCode>(0);
      jsOptions o;
      jsOptions_Init(&o);
      o.Wait = 1000;
      const natsStatus s = js_GetAccountInfo(&ai, js, &o, &jerr);
      jsAccountInfo_Destroy(ai);
      {
        std::lock_guard hk(health_mu);
        unhealthy = s == NATS_OK ? std::string() : "JetStream does not answer (" + nats_error(s, jerr) +
                                                      "): has the cluster lost its quorum?";
      }
      lk.lock();
      health_cv.wait_for(lk, std::chrono::seconds(1), [&] { return stopping; });
    }
  }

  // Each topic's ends as last known: from its stream's state (asked again when a second
  // old), raised by every record stored (ours, or any relay's through the republished
  // headers). committed_offset() answers from it without a request.
  struct Ends {
    std::uint64_t first = 0, next = 0;
    std::chrono::steady_clock::time_point asked{};
  };
  mutable std::mutex ends_mu;
  mutable std::map<std::string, Ends> ends;
  mutable std::vector<std::string> last_topics;  // the last list of topics the cluster gave

  void note_stored(const std::string& topic, std::uint64_t next) const {
    std::lock_guard lk(ends_mu);
    Ends& e = ends[topic];
    e.next = std::max(e.next, next);
  }

  // The topic's ends: cached under a second old, else asked; nullopt for a topic with no
  // stream. Throws Error when the cluster cannot be asked and nothing is known.
  std::optional<Ends> ends_of(const std::string& topic) const {
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard lk(ends_mu);
      if (auto it = ends.find(topic); it != ends.end() && now - it->second.asked < std::chrono::seconds(1)) return it->second;
    }
    try {
      const auto st = state(topic);
      std::lock_guard lk(ends_mu);
      if (!st) {
        ends.erase(topic);
        return std::nullopt;
      }
      Ends& e = ends[topic];
      e.next = std::max(e.next, st->LastSeq);
      e.first = st->Msgs == 0 ? st->LastSeq : st->FirstSeq - 1;
      e.asked = now;
      return e;
    } catch (const Error&) {
      std::lock_guard lk(ends_mu);
      if (auto it = ends.find(topic); it != ends.end()) return it->second;  // the last known, until the cluster answers
      throw;
    }
  }

  mutable std::mutex known_mu;
  std::set<std::string> known_streams;  // created or seen by this relay
  std::set<std::string> known_groups;   // group names committed through this relay, or listed
  bool groups_listed = false;
  std::atomic<std::uint64_t> msg_counter{0};
  std::string instance = std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());

  std::string stream_of(const std::string& topic) const { return opt.prefix + "-" + jetstream_name(topic); }
  std::string subject_of(const std::string& topic) const { return opt.subject_root + ".t." + jetstream_name(topic); }
  std::string stored_subject_of(const std::string& topic) const {
    return opt.subject_root + ".stored." + jetstream_name(topic);
  }
  std::optional<std::string> topic_of_stream(std::string_view stream) const {
    return topic_of_stream_name(stream, opt.prefix);
  }

  jsOptions request_options() const {
    jsOptions o;
    jsOptions_Init(&o);
    o.Wait = opt.timeout.count();
    return o;
  }

  // The stream's state; nullopt for a topic with no stream. Throws Error on a failed request.
  std::optional<jsStreamState> state(const std::string& topic, TopicInfo* info = nullptr) const {
    InfoGuard g;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    jsOptions o = request_options();
    const natsStatus s = js_GetStreamInfo(&g.si, js, stream_of(topic).c_str(), &o, &jerr);
    if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr) return std::nullopt;
    if (s != NATS_OK) throw Error("JetStream: the stream of topic '" + topic + "': " + nats_error(s, jerr));
    if (info) {
      info->name = topic;
      info->next_offset = g.si->State.LastSeq;
      info->first_offset = g.si->State.Msgs == 0 ? g.si->State.LastSeq : g.si->State.FirstSeq - 1;
      info->bytes = g.si->State.Bytes;
      info->segments = 0;
      info->retention_bytes = g.si->Config && g.si->Config->MaxBytes > 0 ? static_cast<std::uint64_t>(g.si->Config->MaxBytes) : 0;
      info->retention_age_s = g.si->Config ? g.si->Config->MaxAge / 1'000'000'000 : 0;
    }
    jsStreamState st = g.si->State;
    st.Subjects = nullptr, st.Deleted = nullptr, st.Lost = nullptr;  // owned by the info destroyed here
    return st;
  }

  std::vector<std::string> list_topics() const {
    jsStreamNamesList* list = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    jsOptions o = request_options();
    const natsStatus s = js_StreamNames(&list, js, &o, &jerr);
    if (s == NATS_NOT_FOUND) return {};
    if (s != NATS_OK) throw Error("JetStream: the list of streams: " + nats_error(s, jerr));
    std::vector<std::string> out;
    for (int i = 0; i < list->Count; ++i)
      if (auto t = topic_of_stream(list->List[i])) out.push_back(std::move(*t));
    jsStreamNamesList_Destroy(list);
    std::sort(out.begin(), out.end());
    std::lock_guard lk(ends_mu);
    last_topics = out;
    return out;
  }

  // A stream of another domain this relay's stream of a topic holds: JetStream sources it
  // through the domain's API, only what that domain's relays published (its subject).
  struct SourceRef {
    std::string stream, filter, api;
    auto key() const { return std::tie(stream, api); }
    bool operator<(const SourceRef& o) const { return key() < o.key(); }
  };
  mutable std::mutex fed_mu;
  std::map<std::string, std::set<SourceRef>> sourced;  // topic -> what it holds of other domains

  // A topic's stream configuration and the strings it points into (not movable: build it
  // in place with build()).
  struct StreamSpec {
    std::string name, subject, stored;
    std::vector<SourceRef> refs;
    std::vector<jsExternalStream> ext;
    std::vector<jsStreamSource> src;
    std::vector<jsStreamSource*> src_ptrs;
    const char* subjects[1] = {nullptr};
    jsRePublish rp{};
    jsStreamConfig sc{};
    StreamSpec() = default;
    StreamSpec(const StreamSpec&) = delete;
    StreamSpec& operator=(const StreamSpec&) = delete;
  };
  void build(StreamSpec& sp, const std::string& topic, const std::set<SourceRef>& refs) const {
    sp.name = stream_of(topic), sp.subject = subject_of(topic), sp.stored = stored_subject_of(topic);
    sp.refs.assign(refs.begin(), refs.end());
    sp.ext.resize(sp.refs.size());
    sp.src.resize(sp.refs.size());
    sp.src_ptrs.clear();
    for (std::size_t i = 0; i < sp.refs.size(); ++i) {
      jsExternalStream_Init(&sp.ext[i]);
      sp.ext[i].APIPrefix = sp.refs[i].api.c_str();
      sp.ext[i].DeliverPrefix = "";  // libnats 3.4 writes it whether set or not
      jsStreamSource_Init(&sp.src[i]);
      sp.src[i].Name = sp.refs[i].stream.c_str();
      sp.src[i].FilterSubject = sp.refs[i].filter.c_str();
      sp.src[i].External = &sp.ext[i];
      sp.src_ptrs.push_back(&sp.src[i]);
    }
    jsStreamConfig_Init(&sp.sc);
    sp.subjects[0] = sp.subject.c_str();
    sp.sc.Name = sp.name.c_str();
    sp.sc.Subjects = sp.subjects;
    sp.sc.SubjectsLen = 1;
    sp.sc.Storage = js_FileStorage;
    sp.sc.Replicas = opt.replicas;
    const Retention keep = retention_of(topic, opt.retention_by_topic, Retention{opt.retention_bytes, opt.retention_age});
    sp.sc.MaxBytes = keep.bytes > 0 ? static_cast<std::int64_t>(keep.bytes) : -1;
    sp.sc.MaxAge = static_cast<std::int64_t>(keep.age.count()) * 1'000'000'000;
    sp.sc.Duplicates = static_cast<std::int64_t>(opt.duplicate_window.count()) * 1'000'000'000;
    sp.sc.Discard = js_DiscardOld;
    sp.sc.AllowDirect = true;
    sp.rp = jsRePublish{sp.subject.c_str(), sp.stored.c_str(), true};
    sp.sc.RePublish = &sp.rp;
    sp.sc.Sources = sp.src_ptrs.empty() ? nullptr : sp.src_ptrs.data();
    sp.sc.SourcesLen = static_cast<int>(sp.src_ptrs.size());
  }

  // Makes the topic's stream unless it exists; false with the reason and the nack code.
  bool ensure_stream(const std::string& topic, std::string& error, const char*& code) {
    const std::string name = stream_of(topic);
    {
      std::lock_guard lk(known_mu);
      if (known_streams.contains(name)) return true;
    }
    if (name.size() > 240) {
      error = "topic '" + topic + "' is too long for a JetStream stream name (" + std::to_string(name.size()) +
              " characters encoded, at most 240)";
      code = "bad_request";
      return false;
    }
    try {
      if (!state(topic)) {
        if (list_topics().size() >= opt.max_topics) {
          error = "the relay keeps at most " + std::to_string(opt.max_topics) + " topics (jetstream.max_topics)";
          code = "too_many_topics";
          return false;
        }
        std::set<SourceRef> refs;
        {
          std::lock_guard lk(fed_mu);
          if (auto it = sourced.find(topic); it != sourced.end()) refs = it->second;
        }
        const natsStatus s = put_stream(topic, refs, false, error);
        if (s != NATS_OK) return false;
      }
    } catch (const Error& e) {
      error = e.what();
      return false;
    }
    std::lock_guard lk(known_mu);
    known_streams.insert(name);
    return true;
  }

  // Makes the topic's stream with `refs` as its sources (`update`: changes the existing
  // stream's configuration to them). Another relay's stream made meanwhile is fine; any other
  // failure is said in `error`.
  natsStatus put_stream(const std::string& topic, const std::set<SourceRef>& refs, bool update, std::string& error) {
    StreamSpec sp;
    build(sp, topic, refs);
    InfoGuard g;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    jsOptions o = request_options();
    // No peers to place it on yet (a cluster forming, a node lost): asked again within the timeout.
    natsStatus s = patiently(
        [&] {
          jerr = static_cast<jsErrCode>(0);
          jsStreamInfo_Destroy(g.si);
          g.si = nullptr;
          return update ? js_UpdateStream(&g.si, js, &sp.sc, &o, &jerr) : js_AddStream(&g.si, js, &sp.sc, &o, &jerr);
        },
        [&](natsStatus) { return jerr == JSClusterNoPeersErr; });
    if (s != NATS_OK && !update && jerr == JSStreamNameExistErr) s = NATS_OK;  // another relay's, made meanwhile
    if (s != NATS_OK)
      error = std::string("JetStream: ") + (update ? "changing" : "creating") + " the stream of topic '" + topic + "': " +
              nats_error(s, jerr);
    return s;
  }

  // A record no relay wrote (not one JSON object), skipped: said once a topic on stderr.
  mutable std::mutex foreign_mu;
  mutable std::set<std::string> foreign_said;
  void foreign_record(const std::string& topic, std::uint64_t offset) const {
    std::lock_guard lk(foreign_mu);
    if (!foreign_said.insert(topic).second) return;
    std::cerr << "diaspora-relay: topic '" << topic << "' offset " << offset
              << " in JetStream is not an event a relay stored (another writer to the cluster?): skipped, as every such record of the topic\n";
  }

  // ---- sites federated (opt.sources) ----
  std::vector<jsCtx*> source_js;  // one per opt.sources: its domain's JetStream API
  std::vector<std::string> source_api;  // one per opt.sources: that API's prefix, $JS.<domain>.API
  mutable std::mutex seen_mu;
  std::vector<SourceStatus> seen;  // per opt.sources: what the federation thread last saw
  std::thread federation;
  std::map<std::string, std::uint64_t> followed;  // (federation thread) sourced topic -> the next offset told

  void federation_main() {
    name_this_thread("js-federation");
    std::unique_lock lk(q_mu);
    for (unsigned tick = 0; !stopping; ++tick) {
      lk.unlock();
      if (tick % 4 == 0)
        for (std::size_t i = 0; i < opt.sources.size(); ++i) sync_source(i);
      follow_sourced();
      lk.lock();
      health_cv.wait_for(lk, opt.federation_interval / 4, [&] { return stopping; });
    }
  }

  // Says (on stderr, once a change) whether source i can be asked.
  void source_state(std::size_t i, std::string why) {
    std::lock_guard lk(seen_mu);
    SourceStatus& st = seen[i];
    if (why == st.why && st.asked) return;
    const JetStreamSource& src = opt.sources[i];
    if (why.empty() && !st.why.empty())
      std::cerr << "diaspora-relay: jetstream.sources: domain " << src.domain << " answers again\n";
    else if (!why.empty())
      std::cerr << "diaspora-relay: jetstream.sources: domain " << src.domain << ": " << why
                << " (JetStream catches its topics up once it answers)\n";
    st.asked = true;
    st.up = why.empty();
    st.why = std::move(why);
  }

  // Lists source i's topics and gives each one it takes a stream here sourcing it.
  void sync_source(std::size_t i) {
    const JetStreamSource& src = opt.sources[i];
    jsStreamNamesList* list = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    jsOptions o = request_options();
    const natsStatus s = js_StreamNames(&list, source_js[i], &o, &jerr);
    if (s == NATS_NOT_FOUND) return source_state(i, "");  // no stream there yet
    if (s != NATS_OK) return source_state(i, "cannot be asked for its streams: " + nats_error(s, jerr));
    source_state(i, "");
    std::vector<std::pair<std::string, std::string>> found;  // (its stream, topic)
    for (int k = 0; k < list->Count; ++k)
      if (auto t = topic_of_stream_name(list->List[k], src.prefix))
        if (std::any_of(src.topics.begin(), src.topics.end(), [&](const std::string& p) { return topic_matches(p, *t); }))
          found.emplace_back(list->List[k], std::move(*t));
    jsStreamNamesList_Destroy(list);
    {
      std::lock_guard lk(seen_mu);
      seen[i].topics = found.size();
    }
    for (auto& [stream, topic] : found) {
      SourceRef ref{stream, src.subject_root + ".t." + jetstream_name(topic), source_api[i]};
      {
        std::lock_guard lk(fed_mu);
        if (auto it = sourced.find(topic); it != sourced.end() && it->second.contains(ref)) continue;
      }
      std::string error;
      if (!add_source(topic, ref, error)) source_state(i, error);
    }
  }

  // The topic's stream here, made or changed to source `ref` as well as what it sources
  // already (another relay of this domain may have added other domains'). False with the reason.
  bool add_source(const std::string& topic, const SourceRef& ref, std::string& error) {
    std::set<SourceRef> refs{ref};
    bool exists = false;
    {
      InfoGuard g;
      jsErrCode jerr = static_cast<jsErrCode>(0);
      jsOptions o = request_options();
      const natsStatus s = js_GetStreamInfo(&g.si, js, stream_of(topic).c_str(), &o, &jerr);
      if (s == NATS_OK && g.si->Config) {
        exists = true;
        bool has = false;
        for (int k = 0; k < g.si->Config->SourcesLen; ++k) {
          const jsStreamSource* x = g.si->Config->Sources[k];
          SourceRef r{x->Name ? x->Name : "", x->FilterSubject ? x->FilterSubject : "",
                      x->External && x->External->APIPrefix ? x->External->APIPrefix : ""};
          has = has || r.key() == ref.key();
          refs.insert(std::move(r));
        }
        if (has) {
          std::lock_guard lk(fed_mu);
          sourced[topic] = refs;
          return true;
        }
      } else if (s != NATS_NOT_FOUND && jerr != JSStreamNotFoundErr) {
        error = "the stream of topic '" + topic + "': " + nats_error(s, jerr);
        return false;
      }
    }
    if (!exists && list_topics().size() >= opt.max_topics) {
      error = "topic '" + topic + "' not taken: the relay keeps at most " + std::to_string(opt.max_topics) +
              " topics (jetstream.max_topics)";
      return false;
    }
    if (put_stream(topic, refs, exists, error) != NATS_OK) return false;
    std::lock_guard lk(fed_mu);
    sourced[topic] = std::move(refs);
    std::lock_guard kl(known_mu);
    known_streams.insert(stream_of(topic));
    return true;
  }

  // Tells the listener how far each sourced stream has come (JetStream republishes only
  // what this domain's producers published there, not what it sourced).
  void follow_sourced() {
    std::vector<std::string> topics;
    CommitListener tell;
    {
      std::lock_guard lk(fed_mu);
      for (const auto& [t, refs] : sourced) topics.push_back(t);
      tell = listener;
    }
    std::vector<std::uint64_t> lag(opt.sources.size(), 0);  // per source: what JetStream has yet to copy
    for (const auto& t : topics) {
      InfoGuard g;
      jsErrCode jerr = static_cast<jsErrCode>(0);
      jsOptions o = request_options();
      if (js_GetStreamInfo(&g.si, js, stream_of(t).c_str(), &o, &jerr) != NATS_OK) continue;  // asked again next turn
      for (int k = 0; k < g.si->SourcesLen; ++k) {
        const jsStreamSourceInfo* si = g.si->Sources[k];
        const std::string api = si && si->External && si->External->APIPrefix ? si->External->APIPrefix : "";
        for (std::size_t i = 0; i < source_api.size(); ++i)
          if (api == source_api[i]) lag[i] += si->Lag;
      }
      std::uint64_t& told = followed[t];
      if (g.si->State.LastSeq <= told) continue;
      told = g.si->State.LastSeq;
      note_stored(t, told);
      if (tell) tell(t, told);
    }
    std::lock_guard lk(seen_mu);
    for (std::size_t i = 0; i < seen.size(); ++i) seen[i].lag = lag[i];
  }

  // Runs a request again, up to the timeout, while `again(status)` says the cluster could not
  // take it yet; by default while it has no one to answer it (a stream's leader being
  // elected after a node was lost: a few seconds; the connection reconnecting).
  template <class F, class Again>
  natsStatus patiently(F&& f, Again&& again) const {
    const auto until = std::chrono::steady_clock::now() + opt.timeout;
    for (;;) {
      const natsStatus s = f();
      if (s == NATS_OK || !again(s) || std::chrono::steady_clock::now() >= until) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  template <class F>
  natsStatus patiently(F&& f) const {
    return patiently(std::forward<F>(f), [](natsStatus s) {
      return s == NATS_NO_RESPONDERS || s == NATS_TIMEOUT || s == NATS_INSUFFICIENT_BUFFER;
    });
  }

  // The key of a producer's high-water mark on a topic.
  static std::string producer_key(const std::string& producer, const std::string& topic) {
    return jetstream_name(producer) + "." + jetstream_name(topic);
  }

  // The producer's high-water mark on the topic, kept in the cluster; nullopt when it has
  // none. Throws Error.
  std::optional<std::uint64_t> high_water(const std::string& producer, const std::string& topic) const {
    EntryGuard g;
    const std::string key = producer_key(producer, topic);
    const natsStatus s = patiently([&] {
      kvEntry_Destroy(g.e);
      g.e = nullptr;
      return kvStore_Get(&g.e, producers, key.c_str());
    });
    if (s == NATS_NOT_FOUND) return std::nullopt;
    if (s != NATS_OK) throw Error("JetStream: producer " + producer + "'s last batch: " + nats_error(s));
    return parse_stored_number(std::string_view(static_cast<const char*>(kvEntry_Value(g.e)),
                                      static_cast<std::size_t>(kvEntry_ValueLen(g.e))));
  }

  static void on_ack(jsCtx*, natsMsg* msg, jsPubAck* pa, jsPubAckErr* pae, void* closure) {
    auto* self = static_cast<Impl*>(closure);
    const char* id = nullptr;
    natsMsgHeader_Get(msg, "Nats-Msg-Id", &id);
    std::lock_guard lk(self->ack_mu);
    Acks& a = self->acks;
    if (auto it = id ? a.index.find(id) : a.index.end(); it != a.index.end()) {
      const std::size_t i = it->second;
      if (pa) {
        a.seq[i] = pa->Sequence;
        a.dup[i] = pa->Duplicate;
      } else {
        if (pae) {
          a.code[i] = static_cast<int>(pae->ErrCode);
          a.status[i] = static_cast<int>(pae->Err);
        }
        if (a.error.empty())
          a.error = pae ? nats_error(pae->Err, pae->ErrCode) + (pae->ErrText ? std::string(": ") + pae->ErrText : "")
                        : std::string("no acknowledgement");
      }
      ++a.answered;
    }
    natsMsg_Destroy(msg);
    self->ack_cv.notify_all();
  }

  // Per (producer, topic): the seq of a batch that was not stored (the writer's alone). A
  // failed batch may leave some of its records unstored; were the producer's later batches,
  // already on their way, stored before the batch is sent again, its records would follow
  // them: so they are refused until the producer sends that batch again (the plugin does, in
  // order, on a new session) or the cluster records it as stored (through another relay).
  std::map<std::string, std::uint64_t> blocked;

  AppendResult publish(Pending& p) {
    AppendResult r = publish_in_order(p);
    if (!r.ok && !p.producer_id.empty()) {
      const std::string key = producer_key(p.producer_id, p.topic);
      auto [it, fresh] = blocked.try_emplace(key, p.seq);
      if (!fresh) it->second = std::min(it->second, p.seq);
    }
    return r;
  }

  AppendResult publish_in_order(Pending& p) {
    AppendResult r;
    if (!ensure_stream(p.topic, r.error, r.code)) return r;
    std::optional<std::uint64_t> hw;
    if (!p.producer_id.empty()) {
      try {
        hw = high_water(p.producer_id, p.topic);
        if (auto b = blocked.find(producer_key(p.producer_id, p.topic)); b != blocked.end()) {
          if (p.seq > b->second && !(hw && *hw >= b->second)) {
            r.error = "JetStream: batch " + std::to_string(b->second) + " of producer " + p.producer_id + " on " +
                      p.topic + " was not stored: send it again before batch " + std::to_string(p.seq);
            return r;
          }
          blocked.erase(b);
        }
        // Written before, through this relay or another: acknowledged at the topic's end. (A
        // batch a crash cut short has no mark yet: its resend is written again, and what
        // was stored of it is dropped by (source, id) within the duplicate window.)
        if (hw && p.seq <= *hw) {
          const auto st = state(p.topic);
          r.ok = true;
          r.duplicate_batch = true;
          r.first_offset = st ? st->LastSeq : 0;
          return r;
        }
      } catch (const Error& e) {
        r.error = e.what();
        return r;
      }
    }
    const std::string subject = subject_of(p.topic);
    {
      std::lock_guard lk(ack_mu);
      acks = Acks{};
      acks.seq.assign(p.records.size(), 0);
      acks.dup.assign(p.records.size(), 0);
      acks.code.assign(p.records.size(), 0);
      acks.status.assign(p.records.size(), 0);
    }
    std::vector<std::string> ids(p.records.size());
    for (std::size_t i = 0; i < p.records.size(); ++i) {
      // (source, id) as the message id, so JetStream drops a resend in its window; a record
      // without one gets an id of its own (no dedupe, as in the embedded log).
      const std::string& k = p.records[i].dedupe_key;
      ids[i] = k.empty() ? "r-" + instance + "-" + std::to_string(msg_counter.fetch_add(1))
                         : "e-" + std::to_string(k.find('\x1f')) + "-" + jetstream_name(k);
      std::lock_guard lk(ack_mu);
      acks.index.emplace(ids[i], i);
    }
    // The records go out together (one round trip for the batch), each after the first of a
    // round expecting the one before it to be the stream's last message
    // (Nats-Expected-Last-Msg-Id): so what is stored of a batch is always a prefix of it, in
    // order, even when a record is lost with a node or a connection and a later one is not.
    // A record refused only because another writer's message came between it and the one
    // before it (another relay on the same topic) starts the next round.
    const auto deadline = std::chrono::steady_clock::now() + opt.timeout;
    for (std::size_t from = 0; from < p.records.size();) {
      std::size_t sent = from;
      for (std::size_t i = from; i < p.records.size(); ++i) {
        natsMsg* m = nullptr;
        natsStatus s = natsMsg_Create(&m, subject.c_str(), nullptr, p.records[i].payload.data(),
                                      static_cast<int>(p.records[i].payload.size()));
        if (s == NATS_OK) s = natsMsgHeader_Set(m, "Nats-Msg-Id", ids[i].c_str());
        jsPubOptions po;
        jsPubOptions_Init(&po);
        po.MaxWait = opt.timeout.count();
        // The order chain (each record expects the one before it), except in a federation:
        // JetStream 2.9 checks the header again on each copy it sources, where other
        // streams' records come between (the copies were refused and the source stalled).
        if (i > from && opt.sources.empty()) po.ExpectLastMsgId = ids[i - 1].c_str();
        if (s == NATS_OK) s = js_PublishMsgAsync(js, &m, &po);
        natsMsg_Destroy(m);  // a no-op once the library owns it
        if (s != NATS_OK) {
          std::lock_guard lk(ack_mu);
          if (acks.error.empty()) acks.error = "publishing to JetStream: " + nats_error(s);
          break;
        }
        ++sent;
      }
      std::unique_lock lk(ack_mu);
      ack_cv.wait_for(lk, opt.timeout + std::chrono::seconds(1), [&] { return acks.answered >= sent - from; });
      std::size_t first_unstored = from;
      while (first_unstored < sent && acks.seq[first_unstored] != 0) ++first_unstored;
      if (first_unstored == p.records.size()) break;  // all stored
      const bool answered = acks.answered >= sent - from && first_unstored < sent;
      const bool interleaved = answered && first_unstored > from && acks.code[first_unstored] == JSStreamWrongLastMsgIDErr;
      // No leader to answer yet (the stream of a topic another relay has just made, a node
      // lost): the same records again shortly, within the timeout.
      const bool no_leader = answered && acks.status[first_unstored] == NATS_NO_RESPONDERS &&
                             std::chrono::steady_clock::now() < deadline;
      if (!interleaved && !no_leader) {
        if (acks.answered < sent - from && acks.error.empty()) acks.error = "JetStream did not acknowledge every record in time";
        r.error = "JetStream: " + (acks.error.empty() ? std::string("a record was not stored") : acks.error);
        acks.index.clear();  // late answers find nothing
        return r;
      }
      for (std::size_t i = first_unstored; i < p.records.size(); ++i) {
        acks.seq[i] = 0;
        acks.dup[i] = 0;
        acks.code[i] = acks.status[i] = 0;
      }
      acks.answered = 0;
      acks.error.clear();
      from = first_unstored;
      if (!interleaved) {
        lk.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    {
      std::lock_guard lk(ack_mu);
      std::uint64_t first = 0;
      for (std::size_t i = 0; i < p.records.size(); ++i) {
        if (acks.dup[i]) {
          ++r.duplicates;
        } else {
          ++r.written;
          if (first == 0) first = acks.seq[i];
        }
      }
      r.first_offset = first > 0 ? first - 1 : (acks.seq.empty() ? 0 : acks.seq.back());
      acks.index.clear();
      if (!acks.seq.empty()) note_stored(p.topic, *std::max_element(acks.seq.begin(), acks.seq.end()));
    }
    if (!p.producer_id.empty()) {
      const std::string v = std::to_string(p.seq);
      uint64_t rev = 0;
      const std::string key = producer_key(p.producer_id, p.topic);
      if (const natsStatus s = patiently([&] { return kvStore_PutString(&rev, producers, key.c_str(), v.c_str()); });
          s != NATS_OK) {
        r.error = "JetStream: recording producer " + p.producer_id + "'s batch: " + nats_error(s);
        return r;  // stored; the resend it causes is dropped by (source, id)
      }
    }
    r.ok = true;
    return r;
  }

  void writer_main() {
    name_this_thread("js-writer");
    for (;;) {
      Pending p;
      {
        std::unique_lock lk(q_mu);
        q_cv.wait(lk, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;
        p = std::move(queue.front());
        queue.pop_front();
      }
      AppendResult r = publish(p);
      if (p.done) p.done(r);
    }
  }

  static void on_stored(natsConnection*, natsSubscription*, natsMsg* msg, void* closure) {
    auto* self = static_cast<Impl*>(closure);
    const char* stream = nullptr;
    const char* seq = nullptr;
    if (natsMsgHeader_Get(msg, "Nats-Stream", &stream) == NATS_OK && natsMsgHeader_Get(msg, "Nats-Sequence", &seq) == NATS_OK)
      if (auto topic = self->topic_of_stream(stream))
        if (auto n = parse_stored_number(seq)) {  // offset n - 1 stored: next is n
          self->note_stored(*topic, *n);
          if (self->listener) self->listener(*topic, *n);
        }
    natsMsg_Destroy(msg);
  }

  kvStore* bucket(const std::string& name) {
    kvStore* kv = nullptr;
    kvConfig kc;
    kvConfig_Init(&kc);
    kc.Bucket = name.c_str();
    kc.History = 1;
    kc.Replicas = opt.replicas;
    kc.StorageType = js_FileStorage;
    // A relay started with its cluster may ask before the cluster knows enough peers to
    // place the bucket on ("no suitable peers for placement"): it asks again within the timeout.
    const natsStatus s = patiently(
        [&] {
          if (js_KeyValue(&kv, js, name.c_str()) == NATS_OK) return NATS_OK;  // made before, by any relay
          return js_CreateKeyValue(&kv, js, &kc);
        },
        [](natsStatus) { return true; });
    if (s != NATS_OK) throw Error("JetStream: the key-value bucket " + name + ": " + nats_error(s));
    return kv;
  }
};

JetStreamStore::JetStreamStore(JetStreamOptions options) : self_(std::make_unique<Impl>()) {
  Impl& s = *self_;
  s.opt = std::move(options);
  if (s.opt.urls.empty()) throw Error("jetstream: no server URL (jetstream.urls)");
  auto check = [&](natsStatus st, const std::string& what) {
    if (st != NATS_OK) throw Error("jetstream: " + what + ": " + nats_error(st));
  };
  std::vector<const char*> urls;
  for (const auto& u : s.opt.urls) urls.push_back(u.c_str());
  std::string joined;
  for (const auto& u : s.opt.urls) joined += (joined.empty() ? "" : ", ") + u;
  try {
    check(natsOptions_Create(&s.nopts), "options");
    check(natsOptions_SetServers(s.nopts, urls.data(), static_cast<int>(urls.size())), "servers");
    check(natsOptions_SetTimeout(s.nopts, s.opt.timeout.count()), "timeout");
    check(natsOptions_SetMaxReconnect(s.nopts, -1), "reconnects");
    check(natsOptions_SetReconnectWait(s.nopts, 250), "reconnect wait");
    // (Almost) no buffer while reconnecting (0 is the 8 MiB default): a publish then fails at
    // once instead of reaching the cluster later, after its batch was answered (and after
    // the records of a batch lost with the connection).
    check(natsOptions_SetReconnectBufSize(s.nopts, 1), "reconnect buffer");
    check(natsOptions_SetRetryOnFailedConnect(s.nopts, false, nullptr, nullptr), "connect retry");
    if (!s.opt.ca_file.empty()) {
      check(natsOptions_SetSecure(s.nopts, true), "TLS");
      check(natsOptions_LoadCATrustedCertificates(s.nopts, s.opt.ca_file.c_str()), "CA file " + s.opt.ca_file);
    }
    if (!s.opt.cert_file.empty())
      check(natsOptions_LoadCertificatesChain(s.nopts, s.opt.cert_file.c_str(), s.opt.key_file.c_str()),
            "client certificate " + s.opt.cert_file);
    if (!s.opt.creds_file.empty())
      check(natsOptions_SetUserCredentialsFromFiles(s.nopts, s.opt.creds_file.c_str(), nullptr),
            "credentials " + s.opt.creds_file);
    if (const natsStatus st = natsConnection_Connect(&s.nc, s.nopts); st != NATS_OK)
      throw Error("jetstream: cannot reach any of " + joined + ": " + nats_error(st));
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = s.opt.timeout.count();
    jo.PublishAsync.AckHandler = &Impl::on_ack;
    jo.PublishAsync.AckHandlerClosure = &s;
    jo.PublishAsync.MaxPending = 65536;
    check(natsConnection_JetStream(&s.js, s.nc, &jo), "JetStream context");
    jsAccountInfo* ai = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    if (const natsStatus st = js_GetAccountInfo(&ai, s.js, nullptr, &jerr); st != NATS_OK)
      throw Error("jetstream: " + joined + " answers, but not as JetStream (is it enabled? nats-server -js): " +
                  nats_error(st, jerr));
    jsAccountInfo_Destroy(ai);
    s.producers = s.bucket(s.opt.prefix + "_PRODUCERS");
    s.groups = s.bucket(s.opt.prefix + "_GROUPS");
    for (const auto& src : s.opt.sources) {
      if (auto why = invalid_source(src, s.opt)) throw Error(*why);
      jsOptions so;
      jsOptions_Init(&so);
      so.Wait = s.opt.timeout.count();
      so.Domain = src.domain.c_str();
      jsCtx* ctx = nullptr;
      check(natsConnection_JetStream(&ctx, s.nc, &so), "JetStream context of domain " + src.domain);
      s.source_js.push_back(ctx);
      s.source_api.push_back("$JS." + src.domain + ".API");
      s.seen.emplace_back().domain = src.domain;
    }
    natsInbox* inbox = nullptr;
    check(natsInbox_Create(&inbox), "an inbox for the answers of reads");
    s.read_root = std::string(inbox) + ".";
    natsInbox_Destroy(inbox);
    check(natsConnection_Subscribe(&s.read_sub, s.nc, (s.read_root + ">").c_str(), &Impl::on_read_reply, &s),
          "subscribing to the answers of reads");
  } catch (...) {
    for (jsCtx* ctx : s.source_js) jsCtx_Destroy(ctx);
    kvStore_Destroy(s.producers);
    kvStore_Destroy(s.groups);
    jsCtx_Destroy(s.js);
    natsConnection_Destroy(s.nc);
    natsOptions_Destroy(s.nopts);
    throw;
  }
  s.writer = std::thread([&s] { s.writer_main(); });
  s.health = std::thread([&s] { s.health_main(); });
  if (!s.opt.sources.empty()) s.federation = std::thread([&s] { s.federation_main(); });
}

JetStreamStore::~JetStreamStore() {
  Impl& s = *self_;
  {
    std::lock_guard lk(s.q_mu);
    s.stopping = true;
  }
  s.q_cv.notify_all();
  s.health_cv.notify_all();
  if (s.writer.joinable()) s.writer.join();
  if (s.health.joinable()) s.health.join();
  if (s.federation.joinable()) s.federation.join();
  for (jsCtx* ctx : s.source_js) jsCtx_Destroy(ctx);
  if (s.stored_sub) natsSubscription_Unsubscribe(s.stored_sub);
  natsSubscription_Destroy(s.stored_sub);
  if (s.read_sub) natsSubscription_Unsubscribe(s.read_sub);
  natsSubscription_Destroy(s.read_sub);
  kvStore_Destroy(s.producers);
  kvStore_Destroy(s.groups);
  jsCtx_Destroy(s.js);
  natsConnection_Close(s.nc);
  natsConnection_Destroy(s.nc);
  natsOptions_Destroy(s.nopts);
}

void JetStreamStore::append(std::string topic, std::string producer_id, std::uint64_t seq,
                            std::vector<AppendRecord> records, Completion done) {
  {
    std::lock_guard lk(self_->q_mu);
    self_->queue.push_back(Impl::Pending{std::move(topic), std::move(producer_id), seq, std::move(records), std::move(done)});
  }
  self_->q_cv.notify_one();
}

namespace {

// Message gets one visit keeps outstanding: one round trip a window of events instead of one
// an event (JetStream 2.9 has no batched get).
constexpr std::uint64_t kReadsInFlight = 64;
// How long a visit waits for an answer before it asks again, one request of its own.
constexpr std::chrono::milliseconds kAnswerWait{1000};

}  // namespace

std::size_t JetStreamStore::visit(const std::string& topic, std::uint64_t from, std::size_t max_records,
                                  std::size_t max_bytes, const std::function<void(const RecordRef&)>& fn) const {
  if (max_records == 0) return 0;
  const auto ends = self_->ends_of(topic);
  if (!ends || from >= ends->next) return 0;
  const std::string stream = self_->stream_of(topic);
  const auto fail = [&](std::uint64_t seq, const std::string& why) {
    return Error("JetStream: reading topic '" + topic + "' at offset " + std::to_string(seq - 1) + ": " + why);
  };
  // The stream leader's message gets, pipelined: the requests carry this visit's reply
  // subject, the answers come in any order, the records are handed on in offset order. (Not
  // direct gets: any replica answers those, and a follower that was down may still hold a
  // record its log has not yet given up, a copy of another offset's event.)
  Impl& self = *self_;
  auto box = std::make_shared<Impl::Mailbox>(&natsMsg_Destroy);
  std::uint64_t visit_id = 0;
  {
    std::lock_guard lk(self.reads_mu);
    visit_id = self.next_visit++;
    self.reads.emplace(visit_id, box);
  }
  struct Leave {  // unregisters the visit and closes its mailbox (freeing the answers it did not take)
    Impl& self;
    std::uint64_t id;
    std::shared_ptr<Impl::Mailbox> box;
    ~Leave() {
      {
        std::lock_guard lk(self.reads_mu);
        self.reads.erase(id);
      }
      box->close();
    }
  } leave{self, visit_id, box};
  const std::string reply_root = self.read_root + std::to_string(visit_id) + ".";
  const std::string subject = "$JS.API.STREAM.MSG.GET." + stream;
  const std::uint64_t last = ends->next;
  std::uint64_t next_out = std::max(from, ends->first) + 1, next_req = next_out;
  const auto ask = [&](std::uint64_t seq) {
    const std::string body = "{\"seq\":" + std::to_string(seq) + "}", reply = reply_root + std::to_string(seq);
    return natsConnection_PublishRequest(self.nc, subject.c_str(), reply.c_str(), body.data(), static_cast<int>(body.size()));
  };
  std::size_t n = 0, bytes = 0;
  while (next_out <= last && n < max_records && (n == 0 || bytes < max_bytes)) {
    const std::uint64_t window = std::min<std::uint64_t>(kReadsInFlight, max_records - n);
    for (; next_req <= last && next_req - next_out < window; ++next_req)
      if (const natsStatus st = ask(next_req); st != NATS_OK) throw fail(next_req, nats_error(st));
    MsgGuard g;
    g.m = box->take(next_out, std::min<std::chrono::milliseconds>(self.opt.timeout, kAnswerWait));
    const bool answered = g.m != nullptr;
    const std::uint64_t seq = next_out++;
    if (!answered)  // a request sent as the stream's leader changed is lost: ask again
      for (std::uint64_t q = next_out; q < next_req; ++q) ask(q);
    std::string decoded;
    std::optional<std::int64_t> time_us;
    bool removed = false;
    if (answered) {
      auto got = parse_message_get(std::string_view(natsMsg_GetData(g.m) ? natsMsg_GetData(g.m) : "",
                                                    static_cast<std::size_t>(natsMsg_GetDataLength(g.m))),
                                   seq);
      if (!got) throw fail(seq, "the cluster's answer is not the stored message");
      removed = got->removed;
      decoded = std::move(got->data);
      time_us = got->time_us;
    } else {  // no answer in time: one request of its own, as the stream's leader answers it
      jsErrCode jerr = static_cast<jsErrCode>(0);
      jsOptions o = self.request_options();
      const natsStatus st = js_GetMsg(&g.m, self.js, stream.c_str(), seq, &o, &jerr);
      if (st == NATS_NOT_FOUND) removed = true;
      else if (st != NATS_OK) throw fail(seq, nats_error(st, jerr));
      else {
        decoded.assign(natsMsg_GetData(g.m) ? natsMsg_GetData(g.m) : "", static_cast<std::size_t>(natsMsg_GetDataLength(g.m)));
        time_us = natsMsg_GetTime(g.m) / 1000;
      }
    }
    if (removed) continue;  // removed by retention meanwhile
    const std::string_view payload = decoded;
    const std::size_t len = payload.size();
    if (!stored_event_text(payload)) {  // another writer's: a gap in the offsets, as retention leaves
      self_->foreign_record(topic, seq - 1);
      continue;
    }
    fn(RecordRef{seq - 1, *time_us, payload});
    ++n;
    bytes += len;
  }
  return n;
}

std::uint64_t JetStreamStore::committed_offset(const std::string& topic) const {
  try {
    const auto e = self_->ends_of(topic);
    return e ? e->next : 0;
  } catch (const Error&) {
    return 0;  // never known, and the cluster cannot be asked now
  }
}

std::uint64_t JetStreamStore::first_offset(const std::string& topic) const {
  try {
    const auto e = self_->ends_of(topic);
    return e ? e->first : 0;
  } catch (const Error&) {
    return 0;
  }
}

std::uint64_t JetStreamStore::offset_at_time(const std::string& topic, std::int64_t time_us) const {
  std::uint64_t lo = first_offset(topic), hi = committed_offset(topic);
  // The first offset in [lo, hi) stored at or after time_us (store times do not go back).
  while (lo < hi) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    std::int64_t t = 0;
    if (visit(topic, mid, 1, 1, [&](const RecordRef& r) { t = r.time_us; }) == 0) return hi;
    if (t >= time_us) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

std::vector<std::string> JetStreamStore::topics() const {
  try {
    return self_->list_topics();
  } catch (const Error&) {
    std::lock_guard lk(self_->ends_mu);
    return self_->last_topics;  // the last list, until the cluster answers
  }
}

std::optional<TopicInfo> JetStreamStore::info(const std::string& topic) const {
  TopicInfo i;
  if (!self_->state(topic, &i)) return std::nullopt;
  return i;
}

void JetStreamStore::set_commit_listener(CommitListener listener) {
  Impl& s = *self_;
  {
    std::lock_guard lk(s.fed_mu);  // the federation thread reads it
    s.listener = std::move(listener);
  }
  const std::string subject = s.opt.subject_root + ".stored.*";
  if (const natsStatus st = natsConnection_Subscribe(&s.stored_sub, s.nc, subject.c_str(), &Impl::on_stored, &s); st != NATS_OK)
    throw Error("jetstream: subscribing to " + subject + ": " + nats_error(st));
}

void JetStreamStore::commit_group_offset(const std::string& group, const std::string& topic, std::uint64_t offset) {
  if (!valid_topic_name(group) || !valid_topic_name(topic))
    throw Error("consumer group '" + group + "' or topic '" + topic + "' is not a valid name");
  Impl& s = *self_;
  {
    std::lock_guard lk(s.known_mu);
    if (!s.known_groups.contains(group)) {
      if (!s.groups_listed) {
        for (const auto& [g, t, o] : group_offsets()) s.known_groups.insert(g);
        s.groups_listed = true;
      }
      if (!s.known_groups.contains(group) && s.known_groups.size() >= s.opt.max_groups)
        throw GroupLimitError("the relay keeps at most " + std::to_string(s.opt.max_groups) + " consumer groups");
      s.known_groups.insert(group);
    }
  }
  const std::string key = jetstream_name(group) + "." + jetstream_name(topic), v = std::to_string(offset);
  uint64_t rev = 0;
  if (const natsStatus st = s.patiently([&] { return kvStore_PutString(&rev, s.groups, key.c_str(), v.c_str()); });
      st != NATS_OK)
    throw Error("JetStream: committing group " + group + " on " + topic + ": " + nats_error(st));
}

std::optional<std::uint64_t> JetStreamStore::group_offset(const std::string& group, const std::string& topic) const {
  EntryGuard g;
  const std::string key = jetstream_name(group) + "." + jetstream_name(topic);
  const natsStatus s = kvStore_Get(&g.e, self_->groups, key.c_str());
  if (s == NATS_NOT_FOUND) return std::nullopt;
  if (s != NATS_OK) throw Error("JetStream: group " + group + " on " + topic + ": " + nats_error(s));
  return parse_stored_number(std::string_view(static_cast<const char*>(kvEntry_Value(g.e)), static_cast<std::size_t>(kvEntry_ValueLen(g.e))));
}

std::vector<std::tuple<std::string, std::string, std::uint64_t>> JetStreamStore::group_offsets() const {
  std::vector<std::tuple<std::string, std::string, std::uint64_t>> out;
  kvKeysList keys{};
  const natsStatus s = kvStore_Keys(&keys, self_->groups, nullptr);
  if (s == NATS_NOT_FOUND) return out;
  if (s != NATS_OK) throw Error("JetStream: the consumer groups: " + nats_error(s));
  struct KeysGuard {
    kvKeysList* k;
    ~KeysGuard() { kvKeysList_Destroy(k); }
  } guard{&keys};
  for (int i = 0; i < keys.Count; ++i)
    if (auto gt = parse_group_key(keys.Keys[i]))
      if (auto off = group_offset(gt->first, gt->second)) out.emplace_back(std::move(gt->first), std::move(gt->second), *off);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<Store::SourceStatus> JetStreamStore::sources() const {
  std::lock_guard lk(self_->seen_mu);
  return self_->seen;
}

std::optional<std::string> JetStreamStore::unready() const {
  if (natsConnection_Status(self_->nc) != NATS_CONN_STATUS_CONNECTED)
    return std::string("no connection to the JetStream cluster (reconnecting)");
  std::lock_guard lk(self_->health_mu);
  if (!self_->unhealthy.empty()) return self_->unhealthy;
  return std::nullopt;
}

}  // namespace diaspora::relay
