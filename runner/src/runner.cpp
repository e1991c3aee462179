// The run: the parts built on one Context, started in order (relay, plugin, sites, the
// resumed run's state, the instances), the loop that ties them, and the end (faults ended,
// workers stopped, the plugin drained and closed, the report written).
#include <fcntl.h>
#include <unistd.h>

#include <boost/json/serialize.hpp>

#include <array>
#include <cstdlib>
#include <ostream>

#include "actions.hpp"
#include "baseline.hpp"
#include "diaspora/event.hpp"
#include "diaspora/files.hpp"
#include "diaspora/runner.hpp"
#include "diaspora/signal_pipe.hpp"
#include "embedded_relay.hpp"
#include "faults.hpp"
#include "lifecycle.hpp"
#include "live_view.hpp"
#include "placement.hpp"
#include "plugin_set.hpp"
#include "rehearsal_jobs.hpp"
#include "report_builder.hpp"
#include "report_files.hpp"
#include "resume.hpp"
#include "signals.hpp"
#include "link_watch.hpp"
#include "streams.hpp"
#include "workers.hpp"

namespace diaspora::runner {

namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

// The loop's wake-up pipe: signals and the plugin's action callback write a byte to it.
struct WakePipe {
  int fd[2] = {-1, -1};
  WakePipe() {
    if (::pipe2(fd, O_CLOEXEC | O_NONBLOCK) != 0) throw Error("pipe: " + storage::errno_text(errno));
  }
  ~WakePipe() {
    ::close(fd[0]);
    ::close(fd[1]);
  }
};

class Runner {
 public:
  Runner(const SpecInput& in, const RunOptions& opt, std::ostream& log)
      : in_(in), spec_(RehearsalJobs::with_job_tasks(in.spec)), opt_(opt), plugin_(wake_.fd[1]),
        ctx_{spec_, in.spec.tasks.size(), opt_, clock_, plugin_, [this](const std::string& line) { view_.say(line); }},
        sites_(spec_.sites), lifecycle_(ctx_, store_, sites_, actions_), placement_(ctx_, sites_, store_),
        streams_(ctx_, lifecycle_), jobs_(ctx_, store_, sites_, lifecycle_, streams_, in.base_dir),
        workers_(ctx_, store_, sites_, lifecycle_, actions_, jobs_),
        executor_(ctx_, store_, sites_, lifecycle_, actions_, workers_, streams_), baseline_(ctx_, store_, lifecycle_),
        view_(ctx_, store_, sites_, actions_, log, [this](bool* connected) {
          const diaspora_stats st = plugin_.stats();
          *connected = st.connected != 0;
          return st.events_acked;
        }, [this] { return plugin_.last_error(); }) {
    lifecycle_.set_control(workers_);
    ctx_.host = host_name();
  }

  /// A run that threw (a site that could not start, ...) still closes the plugin before
  /// its relay goes away; run() leaves nothing open otherwise.
  ~Runner() {
    items_.reset();  // its put in progress ends (acked, or its timeout) before the plugin goes
    plugin_.close(2000);
  }

  int run();

 private:
  void start_relay_and_plugin();
  void read_prior();
  void loop();
  bool finished() const { return !streams_.open() && store_.open() == 0; }
  int finish();
  void dispatch() { lifecycle_.dispatch(placement_); }
  /// Announces the outputs put as data items since the last call (data.arrived with their
  /// diaspora:// URI; a file:// URI, said, for one that could not be put).
  void announce_items();
  /// What wakes the loop's poll: an action (the plugins' pipe) or a signal.
  std::array<int, 2> wake_fds() const { return {wake_.fd[0], signal_pipe_fd()}; }

  WakePipe wake_;
  const SpecInput& in_;
  WorkflowSpec spec_;  ///< the spec, its rehearsal jobs appended to tasks
  RunOptions opt_;
  SteadyClock clock_;
  std::int64_t start_us_ = now_us();
  std::unique_ptr<EmbeddedRelay> relay_;
  PluginSet plugin_;
  Context ctx_;
  InstanceStore store_;
  LinkWatch links_{ctx_, store_};
  Sites sites_;
  ActionLog actions_{ctx_};
  Lifecycle lifecycle_;
  Placement placement_;
  Streams streams_;
  RehearsalJobs jobs_;
  Workers workers_;
  ActionExecutor executor_;
  Baseline baseline_;
  std::unique_ptr<FaultInjector> faults_;
  LiveView view_;
  std::unique_ptr<ItemOutbox> items_;  // last: it stops (its thread joined) before the plugins close
};

void Runner::announce_items() {
  if (!items_) return;
  for (ItemDone& d : items_->take()) {
    std::string uri = d.uri;
    if (!d.error.empty()) {
      ctx_.say("output " + d.job.stream + "[" + std::to_string(d.job.seq) + "] was not put on " + d.job.topic + ": " +
               d.error + "; announced as its file instead");
      uri = "file://" + d.job.file.string();
    }
    plugin_.data_arrived(d.job.stream, d.job.seq, d.bytes, uri, d.job.checksum, d.job.site);
  }
}

void Runner::start_relay_and_plugin() {
  json::value doc = in_.document;
  json::object& root = doc.get_object();
  const std::string prefix = spec_.relay.topic_prefix.value_or(spec_.name);
  json::object& plugin = root["plugin"].is_object() ? root["plugin"].get_object() : (root["plugin"] = json::object{}).get_object();
  plugin["spool_dir"] = (opt_.out_dir / "spool").string();
  // What the policies learn is kept for the next run (plugin.normals; by default in the
  // output folder), and --learn-from seeds it from an earlier run's.
  if (!plugin.contains("normals") || !plugin["normals"].is_string())
    plugin["normals"] = (opt_.out_dir / "normals.json").string();
  const fs::path normals(plugin["normals"].get_string().c_str());
  if (!opt_.learn_from.empty()) {
    std::error_code ec;
    if (!fs::equivalent(opt_.learn_from, normals, ec)) write_file_atomic(normals, read_file(opt_.learn_from), 0644, Durability::file);
    ctx_.say("normals: the policies start from what " + opt_.learn_from.string() + " kept; this run's go to " + normals.string());
  }
  if (spec_.relay.embedded()) {
    const fs::path data = spec_.relay.data_dir ? fs::path(root["relay"].get_object()["data_dir"].get_string().c_str())
                                               : opt_.out_dir / "relay" / "data";
    relay_ = std::make_unique<EmbeddedRelay>(
        opt_.out_dir / "relay", data, prefix, spec_.relay.qos_classes, spec_.relay.qos_drop_late,
        std::chrono::seconds(std::max<long>(1, std::lround(spec_.relay.qos_report_interval.count()))));
    ctx_.relay_url = relay_->url();
    ctx_.ca_file = relay_->ca_file();
    ctx_.token_file = relay_->token_file();
    // The run's plugin is told in its document; the processes the run starts, in the
    // environment (set after the plugins open: it would override a site plugin's relay).
    json::object& r = root["relay"].is_object() ? root["relay"].get_object() : (root["relay"] = json::object{}).get_object();
    r.erase("data_dir");
    r.erase("qos");  // the embedded relay's, handed to it above (the plugin refuses qos for a wss:// relay)
    r["url"] = ctx_.relay_url;
    r["ca_file"] = ctx_.ca_file.string();
    r["token_file"] = ctx_.token_file.string();
    ctx_.say("relay: embedded at " + ctx_.relay_url + ", log in " + data.string());
    ctx_.say("console: https://127.0.0.1:" + std::to_string(relay_->port()) + "/console/ (token " +
             ctx_.token_file.string() + ", CA " + ctx_.ca_file.string() + "); after the run: diaspora run --serve " +
             opt_.out_dir.string());
  } else {
    ctx_.relay_url = spec_.relay.url;
    if (spec_.relay.ca_file) ctx_.ca_file = in_.base_dir / *spec_.relay.ca_file;
    if (spec_.relay.token_file) ctx_.token_file = in_.base_dir / *spec_.relay.token_file;
    ctx_.say("relay: " + ctx_.relay_url);
  }
  // Sites with a relay of their own (sites federated): a plugin each, on the run's document
  // with that relay (its files found from the spec's folder) and a spool of its own.
  std::vector<std::pair<std::string, json::value>> site_docs;
  const json::array* site_list = root.contains("sites") && root["sites"].is_array() ? &root["sites"].get_array() : nullptr;
  for (std::size_t i = 0; site_list && i < site_list->size(); ++i) {
    const SiteSpec& ss = spec_.sites[i];
    if (!ss.relay) continue;
    json::value sd = doc;
    json::object& sr = sd.get_object();
    json::object relay = (*site_list)[i].get_object().at("relay").get_object();
    for (const char* f : {"ca_file", "token_file"})
      if (const json::value* v = relay.if_contains(f); v && v->is_string())
        relay[f] = fs::absolute(in_.base_dir / std::string(v->get_string())).string();  // the SPANK plugin's too
    if (root.contains("relay") && root["relay"].is_object())
      if (const json::value* tp = root["relay"].get_object().if_contains("topic_prefix")) relay["topic_prefix"] = *tp;
    ctx_.site_relays[ss.name] = relay;
    sr["relay"] = std::move(relay);
    json::object& sp = sr["plugin"].get_object();
    sp["spool_dir"] = ctx_.site_spool_dir(ss.name).string();
    sp["normals"] = (opt_.out_dir / ("normals-" + ss.name + ".json")).string();
    site_docs.emplace_back(ss.name, std::move(sd));
    ctx_.say("site " + ss.name + ": its events go to its own relay, " + ss.relay->url);
  }
  plugin_.open(spec_.plugin.library ? fs::path(root["plugin"].get_object()["library"].get_string().c_str()) : fs::path(), doc,
               site_docs);
  if (std::any_of(spec_.tasks.begin(), spec_.tasks.end(), [](const TaskSpec& t) { return t.output == TaskSpec::Output::item; })) {
    items_ = std::make_unique<ItemOutbox>(
        [this](const ItemJob& j, const std::string& bytes) {
          return plugin_.put_item(j.topic, j.stream, j.seq, j.site, bytes, 60000);
        },
        wake_.fd[1]);
    ctx_.items = items_.get();
  }
  if (relay_) {
    ::setenv("DIASPORA_RELAY_URL", ctx_.relay_url.c_str(), 1);
    ::setenv("DIASPORA_RELAY_CA", ctx_.ca_file.c_str(), 1);
    ::setenv("DIASPORA_RELAY_TOKEN_FILE", ctx_.token_file.c_str(), 1);
  }
  ctx_.say("plugin: " + plugin_.library().path.string() + " (" + plugin_.library().library_version() + ")" +
           (plugin_.size() > 1 ? ", " + std::to_string(plugin_.size()) + " instances (the run's relay and each site's)" : ""));
}

// --resume: first the plugin delivers what the killed runner left in its spool, then the
// workflow's events are read back from the relay.
void Runner::read_prior() {
  for (const double until = ctx_.now() + 30; ctx_.now() < until; ::usleep(50000)) {
    const diaspora_stats st = plugin_.stats();
    if (st.connected && st.spool_records == 0) break;
  }
  const std::string topic = ctx_.events_topic();
  store_.set_prior(read_prior_run(ctx_.relay_url, ctx_.ca_file, ctx_.token_file, topic));
  ctx_.say("resume: read " + std::to_string(store_.prior().events) + " events of " + topic + "; " +
           std::to_string(store_.prior().completed.size()) + " instances completed before, not run again");
}

void Runner::loop() {
  int last_signals = 0;
  while (!finished()) {
    if (signals_received() != last_signals) {
      last_signals = signals_received();
      if (!ctx_.stopping) {
        ctx_.stopping = true;
        ctx_.stop_reason = "interrupted by a signal";
        ctx_.say("signal: stopping (no new work; a second signal stops at once)");
        lifecycle_.stop_everything("the run was interrupted");
      }
    }
    faults_->tick();
    faults_->duty_cycle();
    streams_.tick();
    for (const diaspora_action& a : plugin_.take_actions()) executor_.handle(a, [this] { dispatch(); });
    announce_items();
    links_.tick();
    workers_.tick();
    dispatch();
    baseline_.checks();
    lifecycle_.awaiting_checks();
    jobs_.tick();
    workers_.poll(faults_->next_toggle(streams_.next_due(0.1)), wake_fds());
    view_.tick();
  }
  view_.erase();
}

int Runner::run() {
  fs::create_directories(opt_.out_dir);
  ctx_.data_dir = opt_.out_dir / "data";
  ctx_.tasks_dir = opt_.out_dir / "tasks";
  ctx_.ckpt_dir = opt_.out_dir / "checkpoints";
  for (const auto& d : {ctx_.data_dir, ctx_.tasks_dir, ctx_.ckpt_dir}) fs::create_directories(d);
  ctx_.say("workflow " + spec_.name + " from " + spec_.file + ", output in " + opt_.out_dir.string() +
           (ctx_.baseline() ? " (baseline: retry after " + std::to_string(static_cast<int>(*opt_.baseline_retry_after_s)) +
                                  " s of silence, no policies)"
            : " (" + (spec_.policies.empty() ? std::string("no") : std::to_string(spec_.policies.size())) + " policies, " +
                  (spec_.defaults == DefaultsMode::off ? std::string("no default protection")
                                                       : "default protection " + std::string(to_string(spec_.defaults))) +
                  ")"));
  start_relay_and_plugin();
  workers_.start_sites(in_.document);
  faults_ = std::make_unique<FaultInjector>(ctx_, store_, sites_, workers_, relay_.get());
  workers_.wait_ready(5, wake_fds());  // so that the first tasks start at once
  if (opt_.resume) read_prior();
  clock_.reset();
  ctx_.started = true;
  start_us_ = now_us();
  ctx_.started_us = start_us_;
  streams_.start(store_);
  loop();
  return finish();
}

int Runner::finish() {
  // Faults still in force end with the run (a stopped relay starts again, so the spool drains).
  faults_->end_all();
  for (int i = 0; relay_ && !relay_->running() && i < 100; ++i)
    if (!faults_->restart_relay()) ::usleep(100000);
  int failed = 0, completed = 0;
  for (const auto& inst : store_.all()) {
    failed += inst.state != InstanceState::completed;
    completed += inst.state == InstanceState::completed;
  }
  const int status = failed == 0 && !ctx_.stopping ? 0 : 1;
  ctx_.say("finished: " + std::to_string(completed) + " completed, " + std::to_string(failed) + " not completed");
  if (items_) {  // outputs still being put: announced before the plugin drains
    if (!items_->drain(60)) ctx_.say("outputs still being put after 60 s: " + std::to_string(items_->pending()) + " not announced");
    announce_items();
    items_.reset();
  }
  workers_.shutdown();
  plugin_.stop_actions();
  // Let the plugin deliver what it holds (a relay that was stopped has its spool to take)
  // before the counters go into the report; close() then has nothing left to wait for.
  const diaspora_stats st = plugin_.drain(15);
  const PluginLibrary& lib = plugin_.library();
  const int rc = plugin_.close(15000);
  ctx_.say("plugin closed: " + std::to_string(st.events_accepted) + " events, " + lib.library_version() +
           (rc == DIASPORA_OK ? ", all acked by the relay" : std::string(", close: ") + lib.status_name(rc)));
  RunSummary run;
  run.exit_status = status;
  run.started_us = start_us_;
  run.duration_s = ctx_.now();
  run.plugin = {{"library", lib.path.string()},
                {"version", lib.library_version()},
                {"stats", json::object{{"events_accepted", st.events_accepted},
                                       {"events_acked", st.events_acked},
                                       {"events_spilled", st.events_spilled},
                                       {"events_lost", st.events_lost},
                                       {"events_rejected", st.events_rejected},
                                       {"reconnects", st.reconnects},
                                       {"actions_received", st.actions_received},
                                       {"close_status", lib.status_name(rc)}}}};
  PolicyRecord said = read_decisions(ctx_, start_us_);
  run.anomalies = std::move(said.anomalies);
  run.alerts = std::move(said.alerts);
  write_report_files(opt_.out_dir, build_report(ctx_, store_, sites_, faults_->all(), actions_, run));
  if (relay_) relay_->stop();
  ctx_.say("report: " + (opt_.out_dir / "report.json").string() + ", " + (opt_.out_dir / "report.html").string());
  return status;
}

}  // namespace

int run_workflow(const SpecInput& input, const RunOptions& options, std::ostream& log) {
  Runner r(input, options, log);
  return r.run();
}

}  // namespace diaspora::runner
