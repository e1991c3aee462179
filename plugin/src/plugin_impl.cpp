#include "plugin_impl.hpp"

#include "diaspora/files.hpp"
#include "diaspora/thread_name.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>

#include "diaspora/event.hpp"
#include "diaspora/payloads.hpp"
#include "diaspora/policy.hpp"
#include "diaspora/client.hpp"
#include "diaspora/spec.hpp"
#include "diaspora/token.hpp"

namespace diaspora::plugin {

namespace json = boost::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// ---- configuration -----------------------------------------------------------------------

namespace {

std::filesystem::path resolve(const std::filesystem::path& p, const std::filesystem::path& base) {
  return p.is_relative() && !base.empty() ? base / p : p;
}

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::optional<std::string>(v) : std::nullopt;
}

std::string read_token(const std::filesystem::path& file) {
  try {
    return load_token_file(file);
  } catch (const Error& e) {
    throw ConfigError(std::string(e.what()) + " (relay.token_file or DIASPORA_RELAY_TOKEN_FILE; make one with `diaspora token issue`)");
  }
}

// 16 hex digits naming one open of the plugin (the first random ones of a v4 UUID).
std::string instance_name() {
  std::string hex;
  for (char c : make_uuid())
    if (c != '-') hex += c;
  return hex.substr(0, 16);
}

// Every event id the plugin makes: "<instance>-<tag><n>", built on the stack (the
// publisher makes one per queued event). Tags: none = queue position, s = spilled by a
// hook, c = coalesced metric, p = the plugin's own event, a = a local action.
class EventId {
 public:
  EventId(std::string_view instance, std::string_view tag, std::uint64_t n) noexcept {
    std::memcpy(buf_, instance.data(), instance.size());
    std::size_t len = instance.size();
    buf_[len++] = '-';
    std::memcpy(buf_ + len, tag.data(), tag.size());
    len += tag.size();
    len_ = static_cast<std::size_t>(std::to_chars(buf_ + len, buf_ + sizeof buf_, n).ptr - buf_);
  }
  std::string_view view() const noexcept { return {buf_, len_}; }

 private:
  char buf_[48];
  std::size_t len_;
};

// "Equal jitter": between half and all of `backoff`.
std::chrono::milliseconds equal_jitter(std::chrono::milliseconds backoff, std::mt19937& rng) {
  const long half = static_cast<long>(backoff.count() / 2);
  return std::chrono::milliseconds(half + std::uniform_int_distribution<long>(0, std::max<long>(half, 1))(rng));
}

}  // namespace

Config Config::from_spec(const WorkflowSpec& spec, const std::filesystem::path& base_dir) {
  Config c;
  c.workflow = spec.name;
  c.engine_id = spec.plugin.engine_id;
  if (auto id = env("DIASPORA_ENGINE_ID")) {
    const bool valid = id->size() <= 64 && std::isalpha(static_cast<unsigned char>((*id)[0])) &&
                       std::all_of(id->begin(), id->end(), [](char ch) {
                         return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.' || ch == '-';
                       });
    if (!valid)
      throw ConfigError("DIASPORA_ENGINE_ID '" + *id + "' is not a name (a letter, then up to 63 letters, digits, "
                        "'_', '.', '-')");
    c.engine_id = *id;
  }
  c.url = env("DIASPORA_RELAY_URL").value_or(spec.relay.url);
  if (c.url == "embedded")
    throw ConfigError("relay.url is 'embedded': the plugin cannot start a relay itself (a runner that embeds one "
                      "passes its URL in DIASPORA_RELAY_URL); set relay.url to wss://HOST:PORT in the spec or "
                      "DIASPORA_RELAY_URL in the environment");
  if (!c.url.starts_with("wss://"))
    throw ConfigError("relay URL '" + c.url + "' must start with wss:// (the relay only speaks TLS)");
  c.failover = spec.relay.failover;
  if (auto ca = env("DIASPORA_RELAY_CA")) c.ca_file = *ca;
  else if (spec.relay.ca_file) c.ca_file = resolve(*spec.relay.ca_file, base_dir);
  if (auto tf = env("DIASPORA_RELAY_TOKEN_FILE")) c.token_file = *tf;
  else if (spec.relay.token_file) c.token_file = resolve(*spec.relay.token_file, base_dir);
  if (c.token_file.empty())
    throw ConfigError("no token: set relay.token_file in the spec or DIASPORA_RELAY_TOKEN_FILE (make one with "
                      "`diaspora token issue --scope publish:* --scope subscribe:*`)");
  (void)read_token(c.token_file);  // fail at open, not later in the background
  if (!c.ca_file.empty() && !std::filesystem::exists(c.ca_file))
    throw ConfigError("CA file '" + c.ca_file.string() + "' does not exist (relay.ca_file or DIASPORA_RELAY_CA)");
  const std::string prefix = spec.relay.topic_prefix.value_or(spec.name);
  c.events_topic = prefix + ".events";
  c.control_topic = prefix + ".control." + c.engine_id;
  c.spool_dir = resolve(spec.plugin.spool_dir, base_dir) / c.engine_id;
  if (spec.plugin.normals) c.normals_file = resolve(*spec.plugin.normals, base_dir);
  c.spool_limit = spec.plugin.spool_limit;
  c.queue_size = static_cast<std::size_t>(spec.plugin.queue_size);
  c.batch_events = static_cast<std::size_t>(spec.plugin.batch.max_events);
  c.batch_bytes = static_cast<std::size_t>(spec.plugin.batch.max_bytes);
  c.batch_delay = std::chrono::duration_cast<std::chrono::microseconds>(spec.plugin.batch.max_delay);
  c.max_inflight = static_cast<std::size_t>(spec.plugin.max_inflight);
  c.coalesce_when_congested = spec.plugin.coalesce == PluginSpec::Coalesce::congested;
  c.control = spec.plugin.control;
  c.reconnect_max = std::max(c.reconnect_min, std::chrono::duration_cast<std::chrono::milliseconds>(spec.plugin.reconnect_max));
  c.spec = std::make_shared<WorkflowSpec>(spec);
  return c;
}

// ---- construction ------------------------------------------------------------------------

struct Plugin::Batch {
  std::string body;                  ///< events joined by ','
  std::vector<std::uint32_t> ends;   ///< end offset of each event in body
  bool from_spool = false;
  bool resent = false;               ///< sent again after a reconnect: its ack commits nothing
  SpoolPosition end{};               ///< from_spool: spool position after the last event
  std::uint64_t seq = 0;
  Clock::time_point first{};

  std::size_t count() const noexcept { return ends.size(); }
  std::string_view event(std::size_t i) const noexcept {
    const std::size_t b = i == 0 ? 0 : ends[i - 1] + 1;
    return std::string_view(body).substr(b, ends[i] - b);
  }
  void add(std::string_view text) {
    if (!ends.empty()) body += ',';
    body += text;
    ends.push_back(static_cast<std::uint32_t>(body.size()));
  }
};

Plugin::Plugin(Config config)
    : cfg_(std::move(config)),
      instance_(instance_name()),
      queue_(cfg_.queue_size) {
  ctx_.workflow = cfg_.workflow;
  ctx_.engine = cfg_.engine_id;
  ctx_.source = "/diaspora/" + cfg_.workflow + "/" + cfg_.engine_id;
  producer_id_ = cfg_.engine_id + "-" + instance_;
  backoff_ = cfg_.reconnect_min;
  batch_events_ = cfg_.batch_events;
  batch_bytes_ = cfg_.batch_bytes;
  max_inflight_ = cfg_.max_inflight;
  if (TickClock::usable()) tick_clock_.emplace();  // before any hook can stamp a record with ticks
  SpoolOptions so;
  so.dir = cfg_.spool_dir;
  so.max_bytes = cfg_.spool_limit;
  so.log = [this](const std::string& line) { set_error("spool: " + line); };  // never the engine's stderr
  spool_ = std::make_unique<Spool>(so);
  spool_active_ = spool_->records() > 0;
  // The policies, and the default protection unless the spec turns it off (`defaults: off`).
  if (cfg_.spec && (!cfg_.spec->policies.empty() || cfg_.spec->defaults != DefaultsMode::off)) {
    try {
      policy_ = std::make_unique<PolicyBridge>(*cfg_.spec);
    } catch (const std::exception& e) {
      throw ConfigError(e.what());
    }
    // What an earlier run learned (plugin.normals). A file that cannot be used is reported
    // (diaspora_last_error) and the run starts without it: it is a cache, not an input.
    if (!cfg_.normals_file.empty() && std::filesystem::exists(cfg_.normals_file)) {
      try {
        policy_->import_normals_file(cfg_.normals_file);
      } catch (const std::exception& e) {
        set_error(std::string(e.what()) + "; starting without them");
      }
    }
    // The tracker's derived series ("task.queue_wait_s", ...) are the policies' signals
    // ("task.queue_wait", ...).
    tracker_.sink = [this](const Observation& o) {
      std::string_view series = o.series;
      if (series.ends_with("_s")) series.remove_suffix(2);
      policy_->observe(series, o.task_id, o.site, o.value, o.time_us);
    };
  }
  publisher_ = std::thread([this] {
    name_this_thread("dsp-publisher");
    publisher_main();
  });
  control_ = std::thread([this] {
    name_this_thread("dsp-control");
    control_main();
  });
}

Plugin::~Plugin() { (void)close(0ms); }

void Plugin::set_error(std::string message) noexcept {
  try {
    std::lock_guard lock(error_mu_);
    last_error_ = std::move(message);
  } catch (...) {
  }
}

std::string Plugin::last_error() const {
  std::lock_guard lock(error_mu_);
  return last_error_;
}

// ---- hooks (engine threads; the intake: intake.cpp) -------------------------------------------

int Plugin::enqueue(const HookArgs& a) noexcept {
  if (closing()) return DIASPORA_ERR_CLOSED;
  const std::size_t need = arena_bytes(a);
  // While the link is congested a sample takes its series' coalescing slot first (the
  // newest value wins): the task events behind it do not wait for a flood of samples.
  if (need <= kSlotArenaBytes && a.coalescible && congested_.load(std::memory_order_relaxed) &&
      coalesced_.merge(a)) {
    slow_accepted_.fetch_add(1, std::memory_order_relaxed);
    return DIASPORA_OK;
  }
  if (need <= kSlotArenaBytes &&
      queue_.try_push([&](Slot& s, std::uint64_t) { pack(a, s.head, s.arena); })) {
    return DIASPORA_OK;
  }
  if (need <= kSlotArenaBytes && a.coalescible && coalesced_.merge(a)) {
    slow_accepted_.fetch_add(1, std::memory_order_relaxed);
    return DIASPORA_OK;
  }
  return spill(a);
}

int Plugin::spill(const HookArgs& a) noexcept {
  try {
    RecordHead head;
    std::string arena(arena_bytes(a), '\0');
    pack(a, head, arena.data());
    const EventId id(instance_, "s", spill_counter_.fetch_add(1, std::memory_order_relaxed));
    std::lock_guard lock(feed_mu_);
    if (closing()) return DIASPORA_ERR_CLOSED;
    move_queue_to_spool_fed();  // older events first
    std::string text;
    append_record_event(text, RecordView{&head, arena.data()}, id.view(), 0);
    std::string_view v = text;
    std::lock_guard spool_lock(spool_mu_);
    spool_->append(std::span<const std::string_view>(&v, 1));
    spool_active_.store(true, std::memory_order_release);
    spilled_.fetch_add(1, std::memory_order_relaxed);
    slow_accepted_.fetch_add(1, std::memory_order_relaxed);
    return DIASPORA_OK;
  } catch (const std::exception& e) {
    lost_.fetch_add(1, std::memory_order_relaxed);
    set_error(std::string("the hook queue is full and the spool failed, the event is lost: ") + e.what());
    return DIASPORA_ERR_IO;
  }
}

// ---- publisher thread: serialisation -------------------------------------------------------

void Plugin::append_record_event(std::string& out, const RecordView& view, std::string_view id, std::uint64_t coalesced) {
  RecordHead settled;
  RecordView r = view;
  if (view.head->flags & time_in_ticks) {  // stamped by a hook with the counter: the call's wall-clock time
    settled = *view.head;
    settled.time_us = tick_clock_->to_us(static_cast<std::uint64_t>(settled.time_us));
    settled.flags = static_cast<std::uint8_t>(settled.flags & ~time_in_ticks);
    r.head = &settled;
  }
  TaskTracker::Result res = tracker_.observe(r);
  res.derived.coalesced = coalesced;
  if (!res.warning.empty()) invalid_.fetch_add(1, std::memory_order_relaxed);
  if (policy_) {
    policy_->feed(r, res);
    act_on_decisions();
  }
  append_event(out, r, id, ctx_, res.derived);
  if (!res.warning.empty()) {
    events::PluginWarning w;
    w.code = "invalid_transition";
    w.message = res.warning;
    w.task_id = std::string(r.str(f_key));
    w.engine = cfg_.engine_id;
    std::string text;
    append_event(text, next_side_id(), r.str(f_key), w, ctx_, now_us());
    add_side_event(std::move(text));
  }
}

std::string Plugin::next_side_id() {
  return std::string(EventId(instance_, "p", side_counter_.fetch_add(1, std::memory_order_relaxed)).view());
}

std::vector<std::string> Plugin::take_side_events() {
  std::vector<std::string> out;
  if (!side_pending_.load(std::memory_order_acquire)) return out;
  std::lock_guard lock(side_mu_);
  out.swap(side_);
  side_pending_.store(false, std::memory_order_relaxed);
  return out;
}

void Plugin::add_side_event(std::string text) {
  std::lock_guard lock(side_mu_);
  side_.push_back(std::move(text));
  side_pending_.store(true, std::memory_order_release);
}

void Plugin::take_coalesced(const std::function<void(std::string_view)>& sink) {
  std::string text;
  coalesced_.take([&](const RecordView& r, std::uint64_t merged) {
    text.clear();
    const EventId id(instance_, "c", spill_counter_.fetch_add(1, std::memory_order_relaxed));
    append_record_event(text, r, id.view(), merged);
    sink(text);
  });
}

void Plugin::move_queue_to_spool_fed() {
  // Whatever this takes from the queue (and the side and coalesced lists) ends in the spool
  // or, when something throws (the spool's disk, memory), in events_lost. Events are
  // serialised straight into the framed bytes the spool writes, under feed_mu_ only:
  // spool_mu_ is taken for each append, so the publisher goes on reading the spool (and
  // stats() answers) while a long queue is serialised here.
  SpoolRecords& recs = spool_records_;
  std::vector<std::string> droppable;
  bool popping = false;      // an event is out of its slot and not yet a whole record
  std::size_t unframed = 0;  // side events taken and not yet records
  recs.clear();
  auto add_side = [&](std::vector<std::string> texts) {
    unframed = texts.size();
    for (const auto& t : texts) {
      recs.begin().append(t);
      recs.end();
      --unframed;
    }
  };
  // Up to what was pushed (or reserved) by now: under a sustained load, events pushed
  // meanwhile are newer than this whole move and may wait in the queue, so the move ends.
  const std::uint64_t until = queue_.pushed();
  try {
    add_side(take_side_events());
    take_coalesced([&](std::string_view text) { droppable.emplace_back(text); });
    while (queue_.popped() < until) {  // only feed_mu_ holders pop
      popping = true;
      const bool got = queue_.try_pop([&](Slot& s, std::uint64_t pos) {
        append_record_event(recs.begin(), RecordView{&s.head, s.arena}, EventId(instance_, "", pos).view(), 0);
        recs.end();
      });
      popping = false;
      if (!got) {
        // The next slot is reserved by an engine thread still copying into it; later
        // slots may hold older events of other threads (and of the thread that is
        // spilling now): wait for the writer, which never blocks.
        std::this_thread::yield();
        continue;
      }
      if (recs.count() >= 4096) {
        std::lock_guard spool_lock(spool_mu_);
        spool_->append(recs);
        spool_active_.store(true, std::memory_order_release);
        recs.clear();
      }
    }
    // Warnings raised while serialising the queue land in side_: take them too.
    add_side(take_side_events());
    std::lock_guard spool_lock(spool_mu_);
    if (!recs.empty()) {
      spool_->append(recs);
      spool_active_.store(true, std::memory_order_release);  // before anything else can throw
      recs.clear();
    }
    if (!droppable.empty()) {
      std::vector<std::string_view> v(droppable.begin(), droppable.end());
      if (spool_->append(v, true) == 0) lost_.fetch_add(droppable.size(), std::memory_order_relaxed);
      droppable.clear();
    }
    spool_active_.store(spool_->records() > 0, std::memory_order_release);
  } catch (...) {
    lost_.fetch_add(recs.count() + unframed + droppable.size() + (popping ? 1 : 0), std::memory_order_relaxed);
    recs.clear();
    std::lock_guard spool_lock(spool_mu_);  // what did reach the spool goes first, whatever failed after
    spool_active_.store(spool_->records() > 0, std::memory_order_release);
    throw;
  }
}

// ---- the resilience engine (under feed_mu_, like the tracker) -------------------------------

// Each decision is published as org.diaspora.anomaly.predicted (what was seen) and, as an
// action, through the same path as an operator's (org.diaspora.action.requested, then
// the engine's callback or poll); an `alert` is published only.
void Plugin::act_on_decisions() {
  for (const resilience::Decision& d : policy_->take_decisions()) {
    std::string text;
    append_event(text, next_side_id(), d.task_id.empty() ? std::nullopt : std::optional<std::string_view>(d.task_id),
                 PolicyBridge::anomaly_of(d), ctx_, static_cast<std::int64_t>(d.time_s * 1e6));
    add_side_event(std::move(text));
    dispatch_local(PolicyBridge::action_of(
        d, std::string(EventId(instance_, "a", action_counter_.fetch_add(1, std::memory_order_relaxed)).view())));
  }
}

std::string Plugin::event_id(std::string_view text) {
  static constexpr std::string_view prefix = "{\"specversion\":\"1.0\",\"id\":\"";
  if (!text.starts_with(prefix)) return {};
  const std::size_t end = text.find('"', prefix.size());
  return end == std::string_view::npos ? std::string() : std::string(text.substr(prefix.size(), end - prefix.size()));
}

bool Plugin::rejected(std::string_view text) const {
  return !rejected_ids_.empty() && rejected_ids_.contains(event_id(text));
}

// ---- publisher thread: the loop ------------------------------------------------------------

void Plugin::publisher_main() {
  bool final_stats = false;
  while (true) {
    const bool stopping = stop_.load(std::memory_order_acquire);
    if (stopping && !final_stats) {  // the closing counters, flushed with the rest
      final_stats = true;
      maybe_publish_stats(true);
    }
    if (stopping && (all_flushed() || Clock::now() >= flush_deadline_)) break;
    if (policy_ && Clock::now() - last_tick_ >= 100ms) {  // heartbeat silence, deadline forecasts
      try {
        std::unique_lock lock(feed_mu_, std::try_to_lock);  // a spilling hook holds it: next round
        if (lock.owns_lock()) {
          last_tick_ = Clock::now();
          policy_->tick(now_us());
          act_on_decisions();
        }
      } catch (const std::exception& e) {
        set_error(std::string("resilience engine: ") + e.what());
      }
    }
    if (!client_ && Clock::now() >= next_connect_) try_connect();
    if (!client_) {
      try {
        std::lock_guard lock(feed_mu_);
        move_queue_to_spool_fed();
      } catch (const std::exception& e) {
        set_error(std::string("spool: ") + e.what());
      }
      auto wait = std::min<Clock::duration>(5ms, std::max<Clock::duration>(0ms, next_connect_ - Clock::now()));
      if (stopping) wait = std::min<Clock::duration>(wait, std::max<Clock::duration>(0ms, flush_deadline_ - Clock::now()));
      std::this_thread::sleep_for(std::max<Clock::duration>(wait, 200us));
      continue;
    }
    try {
      pump();
    } catch (const std::exception& e) {
      on_disconnect(e.what());
    }
    try {
      maybe_publish_stats(false);
    } catch (const std::exception& e) {
      set_error(std::string("statistics event: ") + e.what());
    }
  }
  finalize();
}

std::string Plugin::relay_url() const {
  const std::size_t at = relay_at_.load(std::memory_order_relaxed) % (1 + cfg_.failover.size());
  return at == 0 ? cfg_.url : cfg_.failover[at - 1];
}

void Plugin::next_relay() {
  if (!cfg_.failover.empty()) relay_at_.fetch_add(1, std::memory_order_relaxed);
}

ItemLink& Plugin::items() {
  std::lock_guard lock(items_mu_);
  if (!items_)
    items_ = std::make_unique<ItemLink>([this] { return client_options("diaspora-plugin/" + cfg_.engine_id + "/items"); },
                                        [this] { next_relay(); }, producer_id_ + "-items");
  return *items_;
}

RelayClientOptions Plugin::client_options(const std::string& client_id) const {
  RelayClientOptions o;
  o.url = relay_url();
  o.ca_file = cfg_.ca_file;
  o.client_id = client_id;
  o.timeout = 5000ms;
  o.token = read_token(cfg_.token_file);  // read at every connection: a rotated token is picked up
  return o;
}

void Plugin::try_connect() {
  try {
    RelayClientOptions o = client_options("diaspora-plugin/" + cfg_.engine_id);
    o.producer_id = producer_id_;
    client_ = std::make_unique<RelayClient>(o);
    // Never exceed what this relay accepts (its welcome announces the limits).
    const json::object& w = client_->welcome();
    auto limit = [&](const char* key, std::size_t mine) {
      const json::value* v = w.if_contains(key);
      return v && v->is_number() ? std::min(mine, v->to_number<std::size_t>()) : mine;
    };
    batch_events_ = std::max<std::size_t>(1, limit("max_batch_events", cfg_.batch_events));
    const std::size_t frame = limit("max_frame_bytes", cfg_.batch_bytes + 65536);
    batch_bytes_ = std::max<std::size_t>(1, std::min(cfg_.batch_bytes, frame > 65536 ? frame - 65536 : frame / 2));
    max_inflight_ = std::max<std::size_t>(1, limit("max_inflight_batches", cfg_.max_inflight));
    connected_.store(1);
    if (ever_connected_) reconnects_.fetch_add(1, std::memory_order_relaxed);
    ever_connected_ = true;
    backoff_ = cfg_.reconnect_min;
  } catch (const std::exception& e) {
    client_.reset();
    thread_local std::mt19937 rng{std::random_device{}()};
    const auto wait = equal_jitter(backoff_, rng);  // then the backoff doubles
    const std::string failed = relay_url();
    next_relay();  // with failover relays: the next one, in turn
    set_error("relay " + failed + ": " + e.what() + " (retrying " + (cfg_.failover.empty() ? "" : "with " + relay_url() + " ") +
              "in " + std::to_string(wait.count()) + " ms; events are kept in the spool meanwhile)");
    next_connect_ = Clock::now() + wait;
    backoff_ = std::clamp(backoff_ * 2, cfg_.reconnect_min, cfg_.reconnect_max);
  }
}

void Plugin::on_disconnect(const std::string& why) {
  client_.reset();
  next_relay();  // with failover relays: reconnect to the next one, in turn
  refused_end_.reset();  // the spool rewinds: those records are read (and skipped) again
  connected_.store(0);
  set_error("lost the relay session: " + why + " (unacked events went back to the spool; reconnecting)");
  std::vector<std::string_view> live;
  for (const Batch& b : inflight_)
    if (!b.from_spool && !b.resent)  // a resent batch's events went back at the first drop and are still there
      for (std::size_t i = 0; i < b.count(); ++i)
        if (!rejected(b.event(i))) live.push_back(b.event(i));
  if (pending_)
    for (std::size_t i = 0; i < pending_->count(); ++i) live.push_back(pending_->event(i));
  try {
    std::lock_guard lock(spool_mu_);
    spool_->rewind();
    if (!live.empty()) spool_->prepend(live);
    spool_active_.store(spool_->records() > 0, std::memory_order_release);
  } catch (const std::exception& e) {
    lost_.fetch_add(live.size(), std::memory_order_relaxed);
    set_error(std::string("could not put unacked events back into the spool, they are lost: ") + e.what());
  }
  // The unacked batches are also sent again first after reconnecting, whole and with
  // their producer sequence numbers, so the relay recognises those it already wrote by
  // (producer_id, seq). Their events are in the spool too (put back above, or still
  // after its cursor), so a crash meanwhile loses nothing; the spool copies that follow
  // are dropped by (source, id). A batch holding an event the relay refused is not resent.
  std::deque<Batch> again;
  for (Batch& b : inflight_) {
    bool refused = false;
    for (std::size_t i = 0; i < b.count() && !refused; ++i) refused = rejected(b.event(i));
    if (refused) continue;
    b.resent = true;
    again.push_back(std::move(b));
  }
  for (Batch& b : resend_) again.push_back(std::move(b));
  resend_ = std::move(again);
  inflight_.clear();
  pending_.reset();
  window_full_since_ = {};  // away, not congested: samples queue (and spool) as every event does
  congested_.store(false, std::memory_order_relaxed);
  thread_local std::mt19937 rng{std::random_device{}()};
  next_connect_ = Clock::now() + std::chrono::milliseconds(std::uniform_int_distribution<long>(0, backoff_.count())(rng));
  backoff_ = std::clamp(backoff_ * 2, cfg_.reconnect_min, cfg_.reconnect_max);
}

bool Plugin::all_flushed() {
  return queue_.size_approx() == 0 && !side_pending_.load() && !coalesced_.pending() &&
         (!pending_ || pending_->count() == 0) && inflight_.empty() && resend_.empty() && !spool_active_.load();
}

void Plugin::send_batch(Batch&& b) {
  b.seq = next_seq_++;
  send_frame(std::move(b));
}

void Plugin::send_frame(Batch&& b) {
  // Header, the batch's events and trailer go out as one frame without being joined (the
  // body is most of a megabyte: a copy of it per batch showed in the publisher's profile).
  const std::string head = frames::publish_head(cfg_.events_topic, b.seq);
  inflight_.push_back(std::move(b));
  client_->send({head, inflight_.back().body, frames::kPublishTail});
}

bool Plugin::build_live_batch(Batch& out, bool flush_now) {
  {
    // Spilling hooks append to the spool only under feed_mu_. While one holds it the
    // publisher does not wait: once the hook's first records are in, it reads them.
    std::unique_lock lock(feed_mu_, std::try_to_lock);
    if (!lock.owns_lock() || spool_active_.load(std::memory_order_acquire)) return false;
    if (!pending_) {
      pending_ = std::make_unique<Batch>();
      pending_->body.reserve(std::min<std::size_t>(batch_bytes_, batch_events_ * 400));
    }
    Batch& b = *pending_;
    auto full = [&] { return b.count() >= batch_events_ || b.body.size() >= batch_bytes_; };
    for (auto& t : take_side_events()) b.add(t);
    take_coalesced([&](std::string_view text) { b.add(text); });
    while (!full()) {
      const bool got = queue_.try_pop([&](Slot& s, std::uint64_t pos) {
        const std::size_t mark = b.body.size();
        try {
          if (!b.ends.empty()) b.body += ',';  // serialised in place, not through a copy
          append_record_event(b.body, RecordView{&s.head, s.arena}, EventId(instance_, "", pos).view(), 0);
          b.ends.push_back(static_cast<std::uint32_t>(b.body.size()));
        } catch (...) {  // out of memory: the batch keeps only whole events; this one is counted lost
          b.body.resize(mark);
          lost_.fetch_add(1, std::memory_order_relaxed);
          throw;
        }
      });
      if (!got) break;
    }
    if (b.count() == 0) return false;
    if (b.first == Clock::time_point{}) b.first = Clock::now();  // linger starts with the first event
    const bool ready = full() || flush_now || Clock::now() - b.first >= cfg_.batch_delay;
    if (!ready) return false;
  }
  out = std::move(*pending_);
  pending_.reset();
  return true;
}

bool Plugin::build_spool_batch(Batch& b) {
  for (;;) {
    // The queue's events are newer than the spool's and leave after them. Until the queue
    // is half full they wait there, so that the spool drains, its last batches are acked,
    // and the publisher returns to the live path (no write and read back: faster) instead
    // of feeding the spool for ever at a rate near its capacity.
    if (queue_.size_approx() >= queue_.capacity() / 2) {
      // A hook on the spill path may be moving the queue now: then read what is spooled
      // already rather than wait for it.
      std::unique_lock feed(feed_mu_, std::try_to_lock);
      if (feed.owns_lock()) move_queue_to_spool_fed();
    }
    std::lock_guard lock(spool_mu_);
    if (!spool_->has_unread()) return false;
    if (b.body.capacity() == 0) b.body.reserve(std::min<std::size_t>(batch_bytes_, batch_events_ * 400));
    // Copied from the spool's read buffer straight into the batch.
    const std::size_t read = spool_->read([&](std::string_view r) { if (!rejected(r)) b.add(r); },
                                          batch_events_, batch_bytes_, b.end);
    b.from_spool = true;
    if (b.count() > 0) return true;
    if (read == 0) return false;
    // Only refused events: done with them. Committing past them now would also commit the
    // unacked batches in flight before them (lost in a crash), so with any in flight the
    // commit waits for the last ack.
    if (inflight_.empty()) {
      spool_->commit(b.end);
      spool_active_.store(spool_->records() > 0, std::memory_order_release);
    } else {
      refused_end_ = b.end;
    }
  }
}

void Plugin::note_window() {
  // Congested: the window of unacked batches full for kCongestedAfter (the relay or the
  // link takes less than the engine makes); clear again once half of it is free.
  constexpr auto kCongestedAfter = std::chrono::milliseconds(50);
  if (!cfg_.coalesce_when_congested) return;
  const auto now = Clock::now();
  if (inflight_.size() >= max_inflight_) {
    if (window_full_since_ == Clock::time_point{}) window_full_since_ = now;
    if (now - window_full_since_ >= kCongestedAfter) congested_.store(true, std::memory_order_relaxed);
  } else if (inflight_.size() <= max_inflight_ / 2) {
    window_full_since_ = {};
    congested_.store(false, std::memory_order_relaxed);
  }
}

void Plugin::pump() {
  while (auto f = client_->poll_receive(0ms)) handle_frame(*f);
  while (client_ && !resend_.empty() && inflight_.size() < max_inflight_) {  // same batches, same seq
    Batch b = std::move(resend_.front());
    resend_.pop_front();
    send_frame(std::move(b));
  }
  const bool stopping = stop_.load(std::memory_order_acquire);
  while (client_ && resend_.empty() && inflight_.size() < max_inflight_) {  // new batches after the resent ones
    Batch b;
    if (spool_active_.load(std::memory_order_acquire)) {
      if (pending_ && pending_->count() > 0) {  // older than anything in the spool: send first
        b = std::move(*pending_);
        pending_.reset();
      } else if (!build_spool_batch(b)) {
        break;
      }
    } else if (!build_live_batch(b, stopping)) {
      break;
    }
    send_batch(std::move(b));
  }
  if (!client_) return;
  note_window();
  if (!inflight_.empty()) {
    const auto wait = inflight_.size() >= max_inflight_ ? 20ms : 1ms;
    if (auto f = client_->poll_receive(wait)) handle_frame(*f);
  } else {
    std::this_thread::sleep_for(stopping ? 200us : 1ms);
  }
}

void Plugin::handle_frame(const std::string& frame) {
  const auto parsed = RelayClient::parse_frame(frame);
  if (!parsed) throw RelayClientError("the relay sent a frame that is not a JSON object");
  const json::object& m = *parsed;
  const json::value* op = m.if_contains("op");
  if (!op || !op->is_string()) return;
  const std::string_view o = op->get_string();
  if (o == "ack" || o == "nack") {
    const json::value* seq = m.if_contains("seq");
    if (inflight_.empty() || !seq || !seq->is_number() || seq->to_number<std::uint64_t>() != inflight_.front().seq)
      throw RelayClientError("the relay acknowledged a batch out of order: " + frame.substr(0, 200));
    Batch b = std::move(inflight_.front());
    inflight_.pop_front();
    if (o == "nack") {
      const json::value* index = m.if_contains("index");
      const std::string message = json::serialize(m);
      if (!index || !index->is_number() || index->to_number<std::uint64_t>() >= b.count()) {
        inflight_.push_front(std::move(b));
        throw RelayClientError("the relay refused a batch: " + message);
      }
      // One event is refused (a bug or a relay limit). Remember its id and start the
      // session over: the unacked batches go back to the spool in order, and the event
      // is left out when they are sent again (so order holds and nothing else is lost).
      const std::string_view bad = b.event(index->to_number<std::size_t>());
      const std::string id = event_id(bad);
      if (rejected_ids_.size() > 1024) rejected_ids_.clear();
      rejected_ids_.insert(id);
      rejected_.fetch_add(1, std::memory_order_relaxed);
      events::PluginWarning w;
      w.code = "event_rejected";
      w.message = ("event " + id + " was refused by the relay and dropped: " + message).substr(0, 4000);
      w.engine = cfg_.engine_id;
      std::string text;
      append_event(text, next_side_id(), std::nullopt, w, ctx_, now_us());
      add_side_event(std::move(text));
      inflight_.push_front(std::move(b));
      backoff_ = std::chrono::milliseconds(0);  // reconnect at once
      throw RelayClientError("the relay refused event " + id + ", which is dropped: " + message);
    }
    if (!b.resent) acked_.fetch_add(b.count(), std::memory_order_relaxed);  // a resent one's are acked again from the spool
    const bool commit = b.from_spool && !b.resent;
    const bool refused_done = refused_end_ && inflight_.empty();
    if (commit || refused_done) {
      std::lock_guard lock(spool_mu_);
      if (commit) spool_->commit(b.end);
      if (refused_done) spool_->commit(*refused_end_);  // a position at or before the cursor is ignored
      spool_active_.store(spool_->records() > 0, std::memory_order_release);
    }
    if (refused_done) refused_end_.reset();
    return;
  }
  if (o == "error") throw RelayClientError("the relay reported an error: " + frame.substr(0, 400));
}

void Plugin::maybe_publish_stats(bool force) {
  const auto now = Clock::now();
  if (!force && now - last_stats_ < cfg_.stats_interval) return;
  last_stats_ = now;
  diaspora_stats s{};
  s.struct_size = sizeof s;
  stats(s);
  const std::uint64_t sig = s.events_spilled + s.metrics_coalesced * 3 + s.events_lost * 7 + s.reconnects * 11 +
                            s.invalid_transitions * 13 + s.actions_received * 17 + s.events_rejected * 19;
  if (!force && sig == last_stats_sig_) return;
  last_stats_sig_ = sig;
  auto n = [](std::uint64_t v) { return static_cast<std::int64_t>(std::min<std::uint64_t>(v, INT64_MAX)); };
  const events::PluginStats st{.engine = cfg_.engine_id,
                               .events_accepted = n(s.events_accepted),
                               .events_acked = n(s.events_acked),
                               .events_spilled = n(s.events_spilled),
                               .metrics_coalesced = n(s.metrics_coalesced),
                               .events_lost = n(s.events_lost),
                               .spool_records = n(s.spool_records),
                               .spool_bytes = n(s.spool_bytes),
                               .reconnects = n(s.reconnects),
                               .invalid_transitions = n(s.invalid_transitions),
                               .actions_received = n(s.actions_received),
                               .connected = s.connected != 0,
                               .closing = stop_.load(std::memory_order_acquire) ? std::optional<bool>(true) : std::nullopt};
  std::string text;
  append_event(text, next_side_id(), std::nullopt, st, ctx_, now_us());
  add_side_event(std::move(text));
}

void Plugin::finalize() {
  // Whatever is not acked now goes to the spool, synced, for the next open to replay.
  if (client_ && !all_flushed()) {
    try {
      on_disconnect("closing with unacked events");
    } catch (const std::exception& e) {  // out of memory putting them back: they are lost
      set_error(std::string("closing: ") + e.what());
      client_.reset();
    }
  }
  if (client_) {
    client_->close();
    client_.reset();
  }
  connected_.store(0);
  try {
    std::lock_guard lock(feed_mu_);
    do move_queue_to_spool_fed();  // hooks that passed their closing() check may still push
    while (queue_.size_approx() > 0);
    std::lock_guard spool_lock(spool_mu_);
    spool_->sync();
    close_status_ = spool_->records() > 0 ? DIASPORA_ERR_TIMEOUT : DIASPORA_OK;
  } catch (const std::exception& e) {
    set_error(std::string("closing: the spool failed: ") + e.what());
    close_status_ = DIASPORA_ERR_IO;
  }
}

// ---- close ---------------------------------------------------------------------------------

int Plugin::close(std::chrono::milliseconds timeout) noexcept {
  std::lock_guard lock(close_mu_);
  if (closed_) return close_status_;
  closed_ = true;
  // A caller's "wait for ever" (e.g. INT64_MAX ms) would overflow the clock: a year is
  // as good as for ever here.
  flush_deadline_ = Clock::now() + std::min<std::chrono::milliseconds>(timeout, std::chrono::hours(24 * 366));
  closing_.store(true);
  // The control thread first (after a running callback returns), so that outcomes it
  // publishes last are flushed by the publisher.
  control_stop_.store(true, std::memory_order_release);
  actions_.wake();
  if (control_.joinable()) control_.join();
  stop_.store(true, std::memory_order_release);
  if (publisher_.joinable()) publisher_.join();
  if (close_status_ == DIASPORA_OK && lost_.load() > 0) close_status_ = DIASPORA_ERR_IO;
  if (policy_ && !cfg_.normals_file.empty()) {  // what this run learned, for the next (plugin.normals)
    try {
      std::lock_guard feed(feed_mu_);
      write_file_atomic(cfg_.normals_file, policy_->export_normals(), 0644, Durability::file);
    } catch (const std::exception& e) {
      set_error(std::string("normals not kept: ") + e.what());
    }
  }
  return close_status_;
}

// ---- statistics ------------------------------------------------------------------------------

void Plugin::stats(diaspora_stats& s) const noexcept {
  s.events_accepted = queue_.pushed() + slow_accepted_.load(std::memory_order_relaxed);
  s.events_acked = acked_.load(std::memory_order_relaxed);
  s.events_spilled = spilled_.load(std::memory_order_relaxed);
  s.metrics_coalesced = coalesced_.merged_count();
  s.events_lost = lost_.load(std::memory_order_relaxed);
  {
    std::lock_guard lock(spool_mu_);
    s.spool_records = spool_->records();
    s.spool_bytes = spool_->bytes();
  }
  s.reconnects = reconnects_.load(std::memory_order_relaxed);
  s.invalid_transitions = invalid_.load(std::memory_order_relaxed);
  s.actions_received = actions_.received();
  s.events_rejected = rejected_.load(std::memory_order_relaxed);
  s.connected = connected_.load(std::memory_order_relaxed);
  s.control_connected = control_connected_.load(std::memory_order_relaxed);
}

// ---- actions (the desk holds them: action_desk.cpp) ------------------------------------------

std::string Plugin::action_done_event(const Action& a, bool ok, std::string_view message) {
  events::ActionDone done;
  done.action_id = a.id;
  done.status = ok ? "done" : "failed";
  done.action = a.kind_name;
  if (!message.empty()) done.message = std::string(message);
  if (!a.task_id.empty()) done.task_id = a.task_id;
  std::string text;
  append_event(text, next_side_id(), a.task_id.empty() ? std::nullopt : std::optional<std::string_view>(a.task_id),
               done, ctx_, now_us());
  return text;
}

int Plugin::set_callback(diaspora_action_callback cb, void* user) noexcept {
  if (on_control_thread()) return DIASPORA_ERR_CLOSED;
  return actions_.set_callback(cb, user);
}

int Plugin::poll_action(diaspora_action* out) noexcept {
  std::string error;
  const int rc = actions_.poll(out, error);
  if (!error.empty()) set_error(std::move(error));
  return rc;
}

int Plugin::ack_action(std::string_view id, bool ok, std::string_view message) noexcept {
  std::string error;
  const int rc = actions_.ack(id, ok, message, error);
  if (!error.empty()) set_error(std::move(error));
  return rc;
}

void Plugin::dispatch_local(Action a) {
  a.origin = "local";
  if (a.issued_us == 0) a.issued_us = now_us();
  if (a.requested_us == 0) a.requested_us = a.issued_us;  // decided here and now
  events::ActionRequested req;
  req.action_id = a.id;
  req.action = a.kind_name;
  req.reason = a.reason;
  if (!a.task_id.empty()) req.task_id = a.task_id;
  if (!a.site.empty()) req.site = a.site;
  if (!a.target_site.empty()) req.target_site = a.target_site;
  if (!a.policy.empty()) req.policy = a.policy;
  if (a.attempt >= 0) req.attempt = a.attempt;
  std::string text;
  append_event(text, next_side_id(), a.task_id.empty() ? std::nullopt : std::optional<std::string_view>(a.task_id), req,
               ctx_, a.issued_us);
  add_side_event(std::move(text));
  actions_.submit(std::move(a));  // an alert is published for people only, not delivered
}

void Plugin::handle_action_event(const json::value& ev) {
  const json::object* o = ev.if_object();
  if (!o) return;
  const json::value* type = o->if_contains("type");
  if (!type || !type->is_string() || type->get_string() != events::ActionRequested::type) return;
  const json::value* data = o->if_contains("data");
  events::ActionRequested req;
  try {
    if (!data) throw Error("data: missing");
    req = events::from_json<events::ActionRequested>(*data);
  } catch (const std::exception& e) {
    set_error(std::string("control topic: an invalid action.requested event was ignored: ") + e.what());
    return;
  }
  // The request's own time, which stays the same when a request an earlier engine of this
  // engine id did not handle is delivered again (the engine may judge it stale by it).
  const json::value* t = o->if_contains("time");
  const std::int64_t requested_us = t && t->is_string() ? parse_rfc3339_us(t->get_string()).value_or(0) : 0;
  if (std::string why = actions_.submit_request(req, requested_us); !why.empty()) set_error("control topic: " + why);
}

void Plugin::control_main() {
  std::unique_ptr<RelayClient> c;
  auto next = Clock::now();
  std::chrono::milliseconds backoff = cfg_.reconnect_min;
  std::mt19937 rng{std::random_device{}()};
  while (!control_stop_.load(std::memory_order_acquire)) {
    try {
      actions_.deliver();
    } catch (const std::exception& e) {  // out of memory: reported, never a terminate() in the engine
      set_error(std::string("delivering actions: ") + e.what());
    }
    if (cfg_.control && !c && Clock::now() >= next) {
      try {
        c = std::make_unique<RelayClient>(client_options("diaspora-plugin-control/" + cfg_.engine_id));
        c->send(frames::subscribe("control", cfg_.control_topic, "latest", cfg_.engine_id));
        backoff = cfg_.reconnect_min;
      } catch (const std::exception& e) {
        c.reset();
        set_error(std::string("control topic: ") + e.what());
        next = Clock::now() + equal_jitter(backoff, rng);
        backoff = std::clamp(backoff * 2, cfg_.reconnect_min, cfg_.reconnect_max);
      }
    }
    if (!c) {
      actions_.wait(20ms, control_stop_);
      continue;
    }
    try {
      auto frame = c->poll_receive(20ms);
      if (!frame) continue;
      const auto parsed = RelayClient::parse_frame(*frame);
      if (!parsed) continue;
      const json::object& m = *parsed;
      const json::value* op = m.if_contains("op");
      if (!op || !op->is_string()) continue;
      if (op->get_string() == "subscribed") {
        control_connected_.store(1);
      } else if (op->get_string() == "events") {
        if (const json::value* evs = m.if_contains("events"); evs && evs->is_array())
          for (const auto& item : evs->get_array())
            if (const json::object* io = item.if_object())
              if (const json::value* ev = io->if_contains("event")) handle_action_event(*ev);
        const json::value* next_offset = m.if_contains("next_offset");
        const json::value* topic = m.if_contains("topic");
        boost::system::error_code ec;
        const std::uint64_t offset = next_offset ? next_offset->to_number<std::uint64_t>(ec) : 0;
        if (next_offset && !ec && topic && topic->is_string())
          c->send(frames::commit(cfg_.engine_id, topic->get_string(), offset));
      } else if (op->get_string() == "error") {
        set_error("control topic: the relay reported " + *frame);
      }
    } catch (const std::exception& e) {
      c.reset();
      control_connected_.store(0);
      set_error(std::string("control topic: ") + e.what());
      next = Clock::now() + equal_jitter(backoff, rng);
      backoff = std::clamp(backoff * 2, cfg_.reconnect_min, cfg_.reconnect_max);
    }
  }
  actions_.deliver();
  control_connected_.store(0);
  if (c) c->close();
}

}  // namespace diaspora::plugin
