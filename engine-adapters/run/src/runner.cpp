#include "runner.hpp"
#include "remote.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/json/serialize.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>

#include <boost/json/parse.hpp>

#include "diaspora/event.hpp"
#include "diaspora/files.hpp"
#include "embedded_relay.hpp"
#include "plugin_api.hpp"
#include "process.hpp"
#include "report.hpp"
#include "resume.hpp"

namespace diaspora::run {

namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

// ---- signals -------------------------------------------------------------------------------

std::atomic<int> g_signals{0};
int g_wake_write = -1;
constexpr int kMaxGroups = 4096;
std::atomic<pid_t> g_groups[kMaxGroups];  // live process groups, for the second signal

void on_signal(int) {
  const int n = g_signals.fetch_add(1) + 1;
  if (n >= 2) {
    for (auto& g : g_groups) {
      const pid_t p = g.load();
      if (p > 0) ::kill(-p, SIGKILL);
    }
    ::_exit(130);
  }
  if (g_wake_write >= 0) {
    const char c = 's';
    [[maybe_unused]] auto r = ::write(g_wake_write, &c, 1);
  }
}

void track_group(pid_t pgid, bool add) {
  for (auto& g : g_groups) {
    pid_t expect = add ? 0 : pgid;
    if (g.compare_exchange_strong(expect, add ? pgid : 0)) return;
  }
}

// ---- the runner's model ----------------------------------------------------------------------

enum class InstState { pending, running, awaiting, completed, failed, cancelled };

std::string_view to_string(InstState s) {
  switch (s) {
    case InstState::pending: return "pending";
    case InstState::running: return "running";
    case InstState::awaiting: return "awaiting";
    case InstState::completed: return "completed";
    case InstState::failed: return "failed";
    case InstState::cancelled: return "cancelled";
  }
  return "?";
}

struct Attempt {
  int number = 1;            ///< 1-based, per hook id
  std::string hook_id;       ///< the instance id, or "<id>@copyN" for a speculative copy
  std::string cause = "first attempt";
  std::string pin_site;      ///< must run there (migrate, speculate target)
  std::string avoid_site;    ///< must not run there (speculate without a target)
  std::string action_id;     ///< acknowledged when this attempt starts
  bool speculative = false;
  std::string site;
  int slot = -1;
  double queued_t = 0, start_t = -1, end_t = -1, last_beat = -1;
  std::string outcome = "queued";  ///< queued, running, completed, failed, stopped, cancelled
  std::string reason;
  long step = 0;
  double progress = 0;
  bool lost = false;  ///< baseline: its worker died; noticed only by heartbeat silence
  bool live() const { return outcome == "running"; }
};

struct Instance {
  std::string id;
  std::size_t task = 0;
  long index = 0;
  double submitted_t = 0;
  InstState state = InstState::pending;
  std::vector<Attempt> attempts;
  double end_t = -1, awaiting_since = 0;
  std::string reason;
  json::object result;
  int copies = 0;
  bool restored = false;  ///< completed in the run this one resumes
};

struct Slot {
  int index = 0;
  pid_t pid = -1;  ///< the worker process (its own process group)
  LineChannel ch;
  bool ready = false;
  int inst = -1, att = -1;     ///< the attempt it runs
  pid_t cmd_pid = -1;          ///< a command task's process group
  LineChannel progress;        ///< the command's progress pipe
  double next_beat = 0;
  double respawn_at = -1;
  std::string pending_checkpoint;  ///< action id waiting for "checkpointed"
  int draining_inst = -1;          ///< a rehearsal job told to checkpoint and stop, not exited yet
  double next_checkpoint = 0;      ///< a rehearsal job's next checkpoint_every signal
  double drain_deadline = 0;       ///< ... killed if it has not exited by then
  // A remote site's slot (remote.hpp): one launch per attempt, no process of its own.
  std::string key;                 ///< the launch out for the attempt it runs ("" when none)
  bool connected = false;          ///< its worker has said hello (ch is the connection)
  json::object pending_run;        ///< the "run" message, sent when the worker is ready
  pid_t remote_pid = -1;           ///< the remote worker's pid ...
  pid_t engine_pid = -1;           ///< ... and its engine's process (a Dask worker) ...
  bool same_host = false;          ///< ... on this host: faults can signal them
  bool idle() const { return ready && inst < 0 && draining_inst < 0; }
};

struct Site {
  const SiteSpec* spec = nullptr;
  std::vector<Slot> slots;
  std::unique_ptr<Launcher> launcher;  ///< engine: dask or slurm (nullptr: a local pool)
  double slow_factor = 1, slow_until = 0, next_toggle = 0;
  bool stopped_phase = false;
  double penalty = 0, penalty_t = 0;  ///< decayed count of failures and moves off this site
  long completed = 0, failed = 0;
  bool drained = false;  ///< an operator's drain: nothing new starts here until an undrain
  /// Per task name: the step times seen on this site lately (fast EW mean), over a longer
  /// time (slow EW mean), and when last updated.
  struct StepTimes {
    double fast = 0, slow = 0, t = 0;
  };
  std::map<std::string, StepTimes> step_time;
};

struct Fault {
  const FaultSpec* spec = nullptr;
  double start_t = -1, end_t = -1;
  bool done = false;
  std::string target;  ///< worker, instance or site it hit
  std::vector<std::pair<int, std::size_t>> hit;  ///< (instance, attempts it had then)
  std::string note;
};

struct ActionRecord {
  std::string id, kind, task, site, target, reason, origin;
  double received_t = 0, done_t = -1;
  std::string outcome = "pending", message;
};

struct Stream {
  std::size_t task = 0;
  double next_t = 0, end_t = 0, rate = 0;
  long created = 0, total = 0;
  long first_index = 0;  ///< the index of its first instance (after a resume, past the earlier run's)
};

// A JSON file's value. Throws (unreadable file, bad JSON).
json::value read_json_file(const fs::path& file) {
  std::ifstream f(file);
  if (!f) throw Error("cannot read " + file.string());
  std::stringstream text;
  text << f.rdbuf();
  return json::parse(text.str());
}

std::string fmt_time(double t) {
  char b[32];
  std::snprintf(b, sizeof b, "[%7.1fs]", t);
  return b;
}

class Runner {
 public:
  Runner(const SpecInput& in, const RunOptions& opt, std::ostream& log) : in_(in), spec_(in.spec), opt_(opt), log_(log) {
    add_job_tasks();
  }

  int run();

  /// A run that threw (a site that could not start, ...) still closes the plugin before its
  /// relay and the callback's targets go away; run() leaves nothing open otherwise.
  ~Runner() {
    if (plugin_ && lib_) {
      lib_->set_action_callback(plugin_, nullptr, nullptr);
      lib_->close(plugin_, 2000);
      plugin_ = nullptr;
    }
  }

 private:
  // ---- time & log
  double now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  std::int64_t wall_us(double t) const { return start_us_ + static_cast<std::int64_t>(t * 1e6); }
  void say(const std::string& line) {
    erase_view();
    log_ << fmt_time(now()) << " " << line << "\n";
    draw_view();
    log_.flush();
  }
  // The live terminal view (stdout a terminal): a status block under the log lines.
  void erase_view();
  void draw_view();
  double site_health(const Site& s, double t) const;
  void drain_site(const diaspora_action& a);

  // ---- setup
  void start_relay_and_plugin();
  void start_sites();
  void spawn_worker(Site& s, Slot& slot);
  void make_instances();
  fs::path write_spank_spec();

  // ---- remote sites (engine: dask, slurm)
  void on_hello(Hello h);
  void release_remote(Site& s, Slot& slot);
  void remote_lost(Site& s, Slot& slot, const std::string& why);
  void launchers_tick();
  void announce_start(int ii, int ai, Site& s, Slot& slot, bool log);
  /// Sends `sig` to what runs a slot's attempt on this host (a remote worker process).
  void signal_remote(const Slot& slot, int sig) const {
    if (slot.same_host && slot.remote_pid > 0) ::kill(slot.remote_pid, sig);
  }

  // ---- plugin hooks
  diaspora_task_info info(const Instance& inst, const Attempt& a) const;
  void hook_failed(const Instance& inst, const Attempt& a, bool retryable);
  void resource(const std::string& id, const char* kind, const char* state, const std::string& site,
                const std::string& metric, double value);
  void ack(const std::string& action_id, bool ok, const std::string& message);

  // ---- the loop
  void loop();
  void poll_io(double timeout_s);
  void on_worker_message(Site& s, Slot& slot, const json::object& m);
  void on_command_line(Site& s, Slot& slot, const std::string& line);
  void reap();
  void on_slot_process_exit(Site& s, Slot& slot, bool worker, int status);
  void dispatch();
  bool start_attempt(int ii, int ai, Site& s, Slot& slot);
  void generate_stream_instances();
  void handle_actions();
  void carry_out(const diaspora_action& a, ActionRecord& rec);
  void faults_tick();
  void duty_cycle_tick();
  void command_heartbeats();
  void baseline_checks();
  void baseline_retry(int ii, const std::string& cause, const std::string& why);
  void awaiting_checks();
  bool finished() const;
  bool restart_relay();

  // ---- attempts
  int add_instance(Instance inst);
  void submit_instance(std::size_t task, long index);
  bool restore(Instance& inst);
  void read_prior();
  void submit_hook(const Instance& inst, const Attempt& a);
  int queue_attempt(int ii, Attempt a);
  void stop_attempt(int ii, int ai, const std::string& outcome, const std::string& reason, bool report_failed);
  void attempt_ended(int ii, int ai, bool ok, const std::string& reason, bool lost = false);
  void instance_final(int ii, InstState st, const std::string& reason);
  bool policy_can_recover(const Instance& inst) const;
  Site* find_site(const std::string& name);
  Slot* choose_slot(const Instance& inst, const Attempt& a, Site** site_out);
  double site_score(const Site& s, double t, const std::string& task) const;
  long reserved(const Site& s) const;
  double observed_speed(const Site& s, double t, const std::string& task) const;
  void add_penalty(Site& s, double amount);
  int find_instance(const std::string& hook_id, int* attempt_out) const;
  void kill_slot_process(Site& s, Slot& slot);
  void stop_everything(const std::string& why);

  // ---- rehearsal jobs: tasks first_job_.. of spec_.tasks are the spec's rehearsal jobs
  void add_job_tasks();
  bool is_job(std::size_t task) const { return task >= first_job_; }
  const RehearsalJobSpec& job_of(std::size_t task) const { return spec_.rehearsal[task - first_job_]; }
  fs::path job_dir(std::size_t task) const { return opt_.out_dir / "rehearsal" / job_of(task).name; }
  std::vector<std::string> job_argv(std::size_t task);
  bool draining(int ii) const;
  void jobs_tick();
  std::pair<fs::path, fs::path> relay_credentials() const;  ///< CA file, token file
  /// The topic the plugin publishes the workflow's events on.
  std::string events_topic() const { return spec_.relay.topic_prefix.value_or(spec_.name) + ".events"; }

  // ---- report
  void read_anomalies();
  void write_report(int exit_status);

  const SpecInput& in_;
  WorkflowSpec spec_;                 ///< the spec, its rehearsal jobs appended to tasks
  std::size_t first_job_ = 0;
  RunOptions opt_;
  std::ostream& log_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  std::int64_t start_us_ = now_us();

  const PluginLibrary* lib_ = nullptr;
  diaspora_plugin* plugin_ = nullptr;
  std::unique_ptr<EmbeddedRelay> relay_;
  std::unique_ptr<WorkerListener> listener_;  ///< remote workers connect here (remote sites only)
  std::string host_ = host_name();
  std::string relay_url_;
  int wake_[2] = {-1, -1};

  std::mutex actions_mu_;
  std::deque<diaspora_action> incoming_;
  std::vector<ActionRecord> actions_;

  std::vector<Site> sites_;
  std::vector<Instance> insts_;
  std::unordered_map<std::string, int> index_;   ///< instance id -> index in insts_
  std::set<int> awaiting_;                       ///< instances waiting for the policies
  std::vector<std::pair<int, int>> lost_;        ///< baseline: attempts whose worker died unnoticed
  long open_ = 0;                                ///< instances not completed, failed or cancelled
  PriorRun prior_;                               ///< --resume: what the log says happened before
  std::deque<std::pair<int, int>> queue_;  ///< (instance, attempt) waiting for a slot
  std::vector<Stream> streams_;
  std::vector<Fault> faults_;
  double throttle_ = 1, throttle_until_ = 0;
  bool stopping_ = false;
  std::string stop_reason_;
  fs::path data_dir_, tasks_dir_, ckpt_dir_;
  json::object plugin_stats_;
  json::array anomalies_;  ///< the policies' anomaly.predicted events, read back for the report
  int view_lines_ = 0;
  double view_next_ = 0, view_events_t_ = 0, view_rate_ = 0;
  std::uint64_t view_events_ = 0;
  bool relay_retry_said_ = false;
};

// ---- setup ------------------------------------------------------------------------------------

void action_callback(const diaspora_action* a, void* user) {
  auto* self = static_cast<std::pair<std::mutex*, std::deque<diaspora_action>*>*>(user);
  {
    std::lock_guard<std::mutex> lk(*self->first);
    self->second->push_back(*a);
  }
  const char c = 'a';
  [[maybe_unused]] auto r = ::write(g_wake_write, &c, 1);
}

void Runner::start_relay_and_plugin() {
  json::value doc = in_.document;
  json::object& root = doc.get_object();
  const std::string prefix = spec_.relay.topic_prefix.value_or(spec_.name);
  json::object& plugin = root["plugin"].is_object() ? root["plugin"].get_object() : (root["plugin"] = json::object{}).get_object();
  plugin["spool_dir"] = (opt_.out_dir / "spool").string();
  if (spec_.relay.embedded()) {
    const fs::path data = spec_.relay.data_dir ? fs::path(root["relay"].get_object()["data_dir"].get_string().c_str())
                                               : opt_.out_dir / "relay" / "data";
    relay_ = std::make_unique<EmbeddedRelay>(opt_.out_dir / "relay", data, prefix);
    relay_url_ = relay_->url();
    ::setenv("DIASPORA_RELAY_URL", relay_url_.c_str(), 1);
    ::setenv("DIASPORA_RELAY_CA", relay_->ca_file().c_str(), 1);
    ::setenv("DIASPORA_RELAY_TOKEN_FILE", relay_->token_file().c_str(), 1);
    say("relay: embedded at " + relay_url_ + ", log in " + data.string());
  } else {
    relay_url_ = spec_.relay.url;
    say("relay: " + relay_url_);
  }
  lib_ = &load_plugin(spec_.plugin.library ? fs::path(root["plugin"].get_object()["library"].get_string().c_str()) : fs::path());
  say(std::string("plugin: ") + lib_->path.string() + " (" + lib_->library_version() + ")");
  char err[8192] = {0};
  const std::string yaml = json::serialize(doc);
  if (lib_->open_yaml(yaml.c_str(), &plugin_, err, sizeof err) != DIASPORA_OK)
    throw Error(std::string("the plugin refused the spec: ") + err);
  static std::pair<std::mutex*, std::deque<diaspora_action>*> cb;
  cb = {&actions_mu_, &incoming_};
  lib_->set_action_callback(plugin_, action_callback, &cb);
}

void Runner::spawn_worker(Site& s, Slot& slot) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    throw Error("socketpair: " + storage::errno_text(errno));
  SpawnSpec sp;
  sp.argv = {self_executable().string(), "__worker", s.spec->name, std::to_string(slot.index)};
  sp.fds = {{sv[1], 3}};
  sp.stderr_file = opt_.out_dir / "workers.log";
  sp.env_extra = {"DIASPORA_SITE=" + s.spec->name, "DIASPORA_WORKER=" + std::to_string(slot.index)};
  slot.pid = spawn(sp);
  ::close(sv[1]);
  track_group(slot.pid, true);
  slot.ch = LineChannel(sv[0]);
  slot.ready = false;
  slot.respawn_at = -1;
  if (s.stopped_phase) signal_group(slot.pid, SIGSTOP);
}

// The spec the Slurm SPANK plugin opens (`sbatch --diaspora=`): this run's, with the relay
// named explicitly (slurmstepd sees neither the embedded relay nor the runner's environment).
fs::path Runner::write_spank_spec() {
  json::value doc = in_.document;
  json::object& root = doc.get_object();
  const auto [ca, token] = relay_credentials();
  json::object& relay = root["relay"].is_object() ? root["relay"].get_object() : (root["relay"] = json::object{}).get_object();
  relay["url"] = relay_url_;
  if (!ca.empty()) relay["ca_file"] = fs::absolute(ca).string();
  if (!token.empty()) relay["token_file"] = fs::absolute(token).string();
  relay.erase("data_dir");
  json::object& plugin = root["plugin"].is_object() ? root["plugin"].get_object() : (root["plugin"] = json::object{}).get_object();
  plugin["spool_dir"] = (opt_.out_dir / "spool").string();
  const fs::path file = fs::absolute(opt_.out_dir / "engines" / "slurm-spec.yaml");
  fs::create_directories(file.parent_path());
  write_file_atomic(file, json::serialize(doc) + "\n", 0600, Durability::file);
  return file;
}

void Runner::start_sites() {
  std::string bind = "127.0.0.1";
  for (const auto& ss : spec_.sites) {
    Site s;
    s.spec = &ss;
    for (int i = 0; i < ss.workers; ++i) {
      Slot slot;
      slot.index = i;
      s.slots.push_back(std::move(slot));
    }
    sites_.push_back(std::move(s));
    if (ss.engine == Engine::dask && ss.endpoint && ss.endpoint->starts_with("tcp://")) {
      const std::string hp = ss.endpoint->substr(6);
      if (const std::string a = local_address_towards(hp.substr(0, hp.rfind(':'))); !a.starts_with("127.")) bind = a;
    }
  }
  for (auto& s : sites_) {
    if (s.spec->engine == Engine::local) {
      for (auto& slot : s.slots) spawn_worker(s, slot);
      continue;
    }
    if (!listener_) listener_ = std::make_unique<WorkerListener>(bind);
    LaunchContext ctx;
    ctx.out_dir = opt_.out_dir;
    auto spank = s.spec->attributes.find("spank");
    if (s.spec->engine == Engine::slurm && !(spank != s.spec->attributes.end() && spank->second.is_bool() && !spank->second.get_bool()))
      ctx.spank_spec = write_spank_spec();
    say("site " + s.spec->name + ": starting its " + std::string(to_string(s.spec->engine)) + " launcher");
    s.launcher = make_launcher(*s.spec, ctx);
    for (auto& slot : s.slots) slot.ready = true;  // a launch per attempt: a slot is free until used
  }
  std::string what;
  for (auto& s : sites_)
    what += (what.empty() ? "" : ", ") + s.spec->name + " (" + std::to_string(s.slots.size()) + " workers" +
            (s.launcher ? ", " + s.launcher->describe() : "") + ")";
  say("sites: " + what + (listener_ ? "; remote workers connect to " + listener_->address() : ""));
}

void Runner::make_instances() {
  for (std::size_t t = 0; t < spec_.tasks.size(); ++t) {
    const TaskSpec& ts = spec_.tasks[t];
    if (ts.rate) {
      Stream st;
      st.task = t;
      st.rate = *ts.rate;
      st.next_t = 0;
      st.end_t = ts.duration ? ts.duration->count() : 60.0;
      st.total = instances_of(ts);
      // Resumed: the instances the earlier run submitted are restored or submitted again
      // now; the stream goes on from the next one at its rate.
      if (auto it = prior_.submitted.find(ts.name); it != prior_.submitted.end()) {
        const long upto = std::min(it->second + 1, st.total);
        for (long k = 0; k < upto; ++k) {
          submit_instance(t, k);
        }
        st.end_t = std::max(0.0, st.end_t - static_cast<double>(upto) / st.rate);
        st.total -= upto;
        st.created = 0;
        st.first_index = upto;
      }
      streams_.push_back(st);
      continue;
    }
    for (long k = 0; k < ts.count; ++k) {
      submit_instance(t, k);
    }
  }
}

// ---- rehearsal jobs ------------------------------------------------------------------------------

void Runner::add_job_tasks() {
  first_job_ = spec_.tasks.size();
  for (const auto& j : spec_.rehearsal) {
    TaskSpec t;  // one instance, run as a command (job_argv) on the job's site if it names one
    t.name = j.name;
    t.count = 1;
    t.resources.cpus = static_cast<double>(j.world_size);
    if (j.site) t.preferred_sites = {*j.site};
    t.location = j.location;
    spec_.tasks.push_back(std::move(t));
  }
}

std::pair<fs::path, fs::path> Runner::relay_credentials() const {
  if (relay_) return {relay_->ca_file(), relay_->token_file()};
  return {spec_.relay.ca_file ? in_.base_dir / *spec_.relay.ca_file : fs::path(),
          spec_.relay.token_file ? in_.base_dir / *spec_.relay.token_file : fs::path()};
}

// diaspora-train's command line for a rehearsal job: the spec's config (or a small one
// written here), the job's keys as --set, ptycho-stream's relay and stream, and --resume
// when the job has a checkpoint (an earlier attempt, a migration, a resumed run).
std::vector<std::string> Runner::job_argv(std::size_t task) {
  const RehearsalJobSpec& j = job_of(task);
  const fs::path dir = job_dir(task);
  fs::create_directories(dir);
  const fs::path bin = trainer_executable();
  if (bin.empty()) throw Error("diaspora-train is not next to diaspora-run (" + self_executable().parent_path().string() +
                               "): build with DIASPORA_WITH_TORCH=ON");
  fs::path config = j.config ? in_.base_dir / *j.config : dir / "job.yaml";
  if (!j.config)
    write_file_atomic(config, "# written by diaspora run for rehearsal job " + j.name +
                                  " (the spec's keys and set: are given as --set)\ntrain:\n  threads: 1\n  log_every: 5\n");
  std::vector<std::string> argv{bin.string(), "--config", config.string(), "--out", dir.string(),
                                "--set", "strategy=" + j.strategy, "--set", "dataset.name=" + j.dataset};
  auto set = [&](const std::string& key, const std::string& value) {
    argv.push_back("--set");
    argv.push_back(key + "=" + value);
  };
  if (j.buffer_size) set("buffer_size", std::to_string(*j.buffer_size));
  if (j.stream) {
    const auto [ca, token] = relay_credentials();
    long total = 0;
    for (const auto& ts : spec_.tasks)
      if (ts.name == *j.stream) total = instances_of(ts);
    set("dataset.relay", relay_url_);
    set("dataset.topic", events_topic());
    set("dataset.stream", *j.stream);
    set("dataset.scan_dir", (data_dir_ / *j.stream).string());  // this run's scans only
    set("dataset.ca_file", ca.string());
    set("dataset.token_file", token.string());
    set("dataset.tasks", std::to_string(total));
  }
  for (const auto& [key, value] : j.set)
    set(key, value.is_string() ? std::string(value.get_string()) : json::serialize(value));
  if (j.world_size > 1) {
    argv.push_back("--world-size");
    argv.push_back(std::to_string(j.world_size));
  }
  if (fs::exists(dir / "checkpoint" / "LATEST")) {
    argv.push_back("--resume");
    argv.push_back(dir.string());
  }
  return argv;
}

bool Runner::draining(int ii) const {
  for (const auto& s : sites_)
    for (const auto& slot : s.slots)
      if (slot.draining_inst == ii) return true;
  return false;
}

void Runner::jobs_tick() {
  const double t = now();
  for (auto& s : sites_)  // checkpoint_every: SIGUSR1 (the trainer checkpoints at its next step and goes on)
    for (auto& slot : s.slots) {
      if (slot.cmd_pid <= 0 || slot.inst < 0 || slot.draining_inst >= 0) continue;
      const Instance& inst = insts_[static_cast<std::size_t>(slot.inst)];
      const Attempt& a = inst.attempts[static_cast<std::size_t>(slot.att)];
      if (!is_job(inst.task) || !job_of(inst.task).checkpoint_every || a.progress <= 0) continue;
      const double every = job_of(inst.task).checkpoint_every->count();
      if (slot.next_checkpoint <= 0) slot.next_checkpoint = t + every;
      if (t < slot.next_checkpoint) continue;
      signal_group(slot.cmd_pid, SIGUSR1);
      slot.next_checkpoint = t + every;
    }
  for (auto& s : sites_)  // a job that does not stop when told: killed (it resumes from its last checkpoint)
    for (auto& slot : s.slots)
      if (slot.draining_inst >= 0 && t > slot.drain_deadline && slot.cmd_pid > 0) {
        say("rehearsal job " + insts_[static_cast<std::size_t>(slot.draining_inst)].id + " did not stop within " +
            std::to_string(static_cast<int>(opt_.job_drain_s)) + " s of SIGTERM: killed");
        signal_group(slot.cmd_pid, SIGKILL);
        slot.drain_deadline = t + 3600;
      }
  // A job trained on a stream waits for every scan: when the stream has ended and one of its
  // instances failed for good, the job can never finish. It is stopped (checkpointed) and failed.
  for (int ii = 0; ii < static_cast<int>(insts_.size()); ++ii) {
    Instance& inst = insts_[static_cast<std::size_t>(ii)];
    if (!is_job(inst.task) || !job_of(inst.task).stream || inst.state == InstState::completed ||
        inst.state == InstState::failed || inst.state == InstState::cancelled)
      continue;
    const std::string& source = *job_of(inst.task).stream;
    bool open = false;
    for (const auto& st : streams_) open |= spec_.tasks[st.task].name == source && st.created < st.total;
    std::string lost;
    for (const auto& x : insts_) {
      if (spec_.tasks[x.task].name != source) continue;
      open |= x.state != InstState::completed && x.state != InstState::failed && x.state != InstState::cancelled;
      if (x.state == InstState::failed || x.state == InstState::cancelled) lost = x.id;
    }
    if (open || lost.empty()) continue;
    const std::string why = "its stream '" + source + "' lost scan " + lost + " (" +
                            std::string(to_string(insts_[static_cast<std::size_t>(index_.at(lost))].state)) +
                            "); the job was stopped at its last checkpoint";
    for (int ai = 0; ai < static_cast<int>(inst.attempts.size()); ++ai) stop_attempt(ii, ai, "stopped", why, false);
    instance_final(ii, InstState::failed, why);
  }
}

void Runner::generate_stream_instances() {
  if (stopping_) return;
  const double t = now();
  if (throttle_ < 1 && t >= throttle_until_) {
    throttle_ = 1;
    say("throttle over: new instances at the full rate again");
  }
  for (auto& st : streams_) {
    while (st.created < st.total && t >= st.next_t) {
      submit_instance(st.task, st.first_index + st.created);
      ++st.created;
      st.next_t += 1.0 / (st.rate * throttle_);
    }
  }
}

// ---- hooks --------------------------------------------------------------------------------------

diaspora_task_info Runner::info(const Instance& inst, const Attempt& a) const {
  diaspora_task_info i{};
  i.struct_size = sizeof i;
  i.task_id = a.hook_id.c_str();
  i.site = a.site.empty() ? nullptr : a.site.c_str();
  i.attempt = a.number;
  i.step = -1;
  (void)inst;
  return i;
}

void Runner::hook_failed(const Instance& inst, const Attempt& a, bool retryable) {
  auto i = info(inst, a);
  i.retryable = retryable ? 1 : 0;
  const std::string reason = a.reason.empty() ? std::string("failed") : a.reason.substr(0, DIASPORA_MAX_TEXT);
  i.reason = reason.c_str();
  lib_->task_failed(plugin_, &i);
}

void Runner::resource(const std::string& id, const char* kind, const char* state, const std::string& site,
                      const std::string& metric, double value) {
  diaspora_metric_value mv{metric.c_str(), value};
  diaspora_resource_info r{};
  r.struct_size = sizeof r;
  r.resource_id = id.c_str();
  r.kind = kind;
  r.state = state;
  r.site = site.empty() ? nullptr : site.c_str();
  r.metrics = metric.empty() ? nullptr : &mv;
  r.metric_count = metric.empty() ? 0 : 1;
  lib_->resource_status(plugin_, &r);
}

void Runner::ack(const std::string& action_id, bool ok, const std::string& message) {
  if (action_id.empty()) return;
  const std::string m = message.substr(0, DIASPORA_MAX_TEXT);
  if (ok) lib_->action_done(plugin_, action_id.c_str(), m.c_str());
  else lib_->action_failed(plugin_, action_id.c_str(), m.c_str());
  for (auto& r : actions_)
    if (r.id == action_id && r.outcome == "pending") {
      r.outcome = ok ? "done" : "failed";
      r.message = message;
      r.done_t = now();
    }
}

// ---- attempts -----------------------------------------------------------------------------------

// --resume: an instance the earlier run completed is kept in the report, not run again.
bool Runner::restore(Instance& inst) {
  if (!prior_.completed.count(inst.id)) return false;
  inst.state = InstState::completed;
  inst.restored = true;
  inst.reason = "completed in the run this one resumes";
  insts_.push_back(std::move(inst));
  index_[insts_.back().id] = static_cast<int>(insts_.size()) - 1;
  return true;
}

// --resume: first the plugin delivers what the killed runner left in its spool, then the
// workflow's events are read back from the relay.
void Runner::read_prior() {
  diaspora_stats st{};
  st.struct_size = sizeof st;
  for (const double until = now() + 30; now() < until; ::usleep(50000)) {
    lib_->get_stats(plugin_, &st);
    if (st.connected && st.spool_records == 0) break;
  }
  const std::string topic = events_topic();
  const auto [ca, token] = relay_credentials();
  prior_ = read_prior_run(relay_url_, ca, token, topic);
  say("resume: read " + std::to_string(prior_.events) + " events of " + topic + "; " +
      std::to_string(prior_.completed.size()) + " instances completed before, not run again");
}

void Runner::submit_hook(const Instance& inst, const Attempt& a) {
  const TaskSpec& ts = spec_.tasks[inst.task];
  auto i = info(inst, a);
  i.name = ts.name.c_str();
  i.attempt = 0;
  if (ts.deadline) i.deadline_s = ts.deadline->count();
  lib_->task_submitted(plugin_, &i);
}

// Instance `index` of a task: restored (--resume) or submitted now, its first attempt queued.
void Runner::submit_instance(std::size_t task, long index) {
  Instance inst;
  inst.id = spec_.tasks[task].name + "." + std::to_string(index);
  inst.task = task;
  inst.index = index;
  inst.submitted_t = now();
  if (restore(inst)) return;
  const int ii = add_instance(std::move(inst));
  Attempt a;
  a.hook_id = insts_[static_cast<std::size_t>(ii)].id;
  submit_hook(insts_[static_cast<std::size_t>(ii)], a);
  queue_attempt(ii, std::move(a));
}

int Runner::add_instance(Instance inst) {
  insts_.push_back(std::move(inst));
  const int ii = static_cast<int>(insts_.size()) - 1;
  index_[insts_.back().id] = ii;
  ++open_;
  return ii;
}

int Runner::queue_attempt(int ii, Attempt a) {
  Instance& inst = insts_[static_cast<std::size_t>(ii)];
  int n = 0;
  if (auto it = prior_.attempts.find(a.hook_id); it != prior_.attempts.end()) n = it->second;
  for (const auto& x : inst.attempts)
    if (x.hook_id == a.hook_id) n = std::max(n, x.number);
  a.number = n + 1;
  if (a.number > 1 && a.cause == "first attempt") a.cause = "resumed (the run it resumes had " + std::to_string(n) + ")";
  a.queued_t = now();
  a.outcome = "queued";
  inst.attempts.push_back(std::move(a));
  const int ai = static_cast<int>(inst.attempts.size()) - 1;
  if (!inst.attempts.back().speculative) {
    inst.state = InstState::pending;
    awaiting_.erase(ii);
  }
  // Recovering attempts (restarts, migrations, copies) go before first attempts: the work
  // already late comes first.
  if (inst.attempts.back().number > 1 || inst.attempts.back().speculative) {
    auto it = std::find_if(queue_.begin(), queue_.end(), [&](const auto& q) {
      const Attempt& x = insts_[static_cast<std::size_t>(q.first)].attempts[static_cast<std::size_t>(q.second)];
      return x.number == 1 && !x.speculative;
    });
    queue_.insert(it, {ii, ai});
  } else {
    queue_.emplace_back(ii, ai);
  }
  return ai;
}

Site* Runner::find_site(const std::string& name) {
  for (auto& s : sites_)
    if (s.spec->name == name) return &s;
  return nullptr;
}

double Runner::site_score(const Site& s, double t, const std::string& task) const {
  // The baseline places by the declared speed and cost only, as an engine without
  // Diaspora does (Parsl's HTEX takes any free worker).
  if (opt_.baseline_retry_after_s) return s.spec->speed / (1.0 + 0.1 * s.spec->cost);
  const double decayed = s.penalty * std::exp(-(t - s.penalty_t) / 60.0);
  return s.spec->speed * observed_speed(s, t, task) / (1.0 + decayed) / (1.0 + 0.1 * s.spec->cost);
}

// How fast this site runs `task` lately compared with the fastest site that ran it (the
// engine's own measure, like a scheduler's duration estimates): 1 without recent data.
double Runner::observed_speed(const Site& s, double t, const std::string& task) const {
  constexpr double kFresh = 30;  // seconds: older measurements say nothing about now
  if (opt_.baseline_retry_after_s) return 1.0;
  auto it = s.step_time.find(task);
  if (it == s.step_time.end() || t - it->second.t > kFresh || it->second.fast <= 0) return 1.0;
  // The reference: this site's own longer-run step time, or the fastest site's recent one.
  double best = it->second.slow;
  for (const auto& o : sites_) {
    auto jt = o.step_time.find(task);
    if (jt != o.step_time.end() && t - jt->second.t <= kFresh && jt->second.fast > 0) best = std::min(best, jt->second.fast);
  }
  return std::clamp(best / it->second.fast, 0.01, 1.0);
}

void Runner::add_penalty(Site& s, double amount) {
  const double t = now();
  s.penalty = s.penalty * std::exp(-(t - s.penalty_t) / 60.0) + amount;
  s.penalty_t = t;
}

long Runner::reserved(const Site& s) const {
  long n = 0;
  for (int ii : awaiting_) {
    const Instance& inst = insts_[static_cast<std::size_t>(ii)];
    if (!inst.attempts.empty() && inst.attempts.back().site == s.spec->name) ++n;
  }
  return n;
}

Slot* Runner::choose_slot(const Instance& inst, const Attempt& a, Site** site_out) {
  const TaskSpec& ts = spec_.tasks[inst.task];
  auto allowed = [&](const Site& s) {
    if (s.launcher && !ts.kind) return false;  // commands and rehearsal jobs run on local sites
    if (s.drained) return false;
    if (!a.pin_site.empty()) return s.spec->name == a.pin_site;
    if (!a.avoid_site.empty() && s.spec->name == a.avoid_site) return false;
    return ts.allowed_sites.empty() ||
           std::find(ts.allowed_sites.begin(), ts.allowed_sites.end(), s.spec->name) != ts.allowed_sites.end();
  };
  // A failed attempt waiting for the policies' decision keeps a worker of its site for
  // the recovering attempt: first attempts do not take the last free ones.
  const bool first = a.number == 1 && !a.speculative;
  auto idle_slot = [&](Site& s) -> Slot* {
    long idle = 0;
    Slot* found = nullptr;
    for (auto& sl : s.slots)
      if (sl.idle()) {
        ++idle;
        if (!found) found = &sl;
      }
    if (found && first && idle <= reserved(s)) return nullptr;
    return found;
  };
  const double t = now();
  // Preferred sites first, in order, while they are in good standing (no recent failures
  // or moves off them); then the best-scoring allowed site with a free worker.
  for (const auto& name : ts.preferred_sites) {
    Site* s = find_site(name);
    if (s && allowed(*s) && site_score(*s, t, ts.name) > 0.5 * s->spec->speed / (1.0 + 0.1 * s->spec->cost))
      if (Slot* sl = idle_slot(*s)) {
        *site_out = s;
        return sl;
      }
  }
  // A site running this task at under half its speed is used only when no allowed site
  // runs it well: waiting for a worker there is shorter than running slowly here.
  bool healthy_elsewhere = false;
  for (auto& s : sites_) healthy_elsewhere |= allowed(s) && observed_speed(s, t, ts.name) >= 0.5;
  Site* best = nullptr;
  Slot* best_slot = nullptr;
  double best_score = -1;
  for (auto& s : sites_) {
    if (!allowed(s)) continue;
    if (healthy_elsewhere && observed_speed(s, t, ts.name) < 0.5) continue;
    Slot* sl = idle_slot(s);
    if (!sl) continue;
    long busy = 0;
    for (auto& x : s.slots) busy += x.inst >= 0;
    const double score = site_score(s, t, ts.name) * (1.0 - 0.5 * static_cast<double>(busy) / static_cast<double>(s.slots.size()));
    if (score > best_score) best = &s, best_slot = sl, best_score = score;
  }
  *site_out = best;
  return best_slot;
}

void Runner::dispatch() {
  if (stopping_) return;
  auto idle_slots = [&] {
    long n = 0;
    for (const auto& s : sites_)
      for (const auto& sl : s.slots) n += sl.idle();
    return n;
  };
  for (auto it = queue_.begin(); it != queue_.end() && idle_slots() > 0;) {
    auto [ii, ai] = *it;
    Instance& inst = insts_[static_cast<std::size_t>(ii)];
    Attempt& a = inst.attempts[static_cast<std::size_t>(ai)];
    if (a.outcome != "queued") {  // cancelled while waiting
      it = queue_.erase(it);
      continue;
    }
    Site* s = nullptr;
    Slot* slot = draining(ii) ? nullptr : choose_slot(inst, a, &s);
    if (!slot) {
      ++it;
      continue;
    }
    it = queue_.erase(it);
    start_attempt(ii, ai, *s, *slot);
  }
}

bool Runner::start_attempt(int ii, int ai, Site& s, Slot& slot) {
  Instance& inst = insts_[static_cast<std::size_t>(ii)];
  Attempt& a = inst.attempts[static_cast<std::size_t>(ai)];
  const TaskSpec& ts = spec_.tasks[inst.task];
  a.site = s.spec->name;
  a.slot = slot.index;
  a.start_t = a.last_beat = now();
  a.outcome = "running";
  slot.inst = ii;
  slot.att = ai;
  if (!a.speculative || inst.state == InstState::awaiting || inst.state == InstState::pending) inst.state = InstState::running;
  awaiting_.erase(ii);
  const std::string worker = s.spec->name + "/worker-" + std::to_string(slot.index);
  const fs::path ckpt = ckpt_dir_ / (inst.id + ".json");
  long resume = 0;
  if (fs::exists(ckpt)) {
    try {
      const json::value c = read_json_file(ckpt);
      if (c.is_object() && c.get_object().contains("step") && c.get_object().at("step").is_int64())
        resume = static_cast<long>(c.get_object().at("step").get_int64());
    } catch (const std::exception&) {
      resume = 0;  // an unreadable checkpoint: start over
    }
  }
  if (ts.kind) {
    json::object args;
    for (const auto& [k, v] : ts.args) args[k] = v;
    json::object msg{{"op", "run"},
                     {"id", inst.id},
                     {"attempt", a.number},
                     {"kind", *ts.kind},
                     {"args", args},
                     {"memory", static_cast<std::int64_t>(ts.resources.memory)},
                     {"data_dir", (data_dir_ / ts.name).string()},
                     {"checkpoint", ckpt.string()},
                     {"resume_step", static_cast<std::int64_t>(resume)}};
    if (s.launcher) {  // started when its worker connects and says ready (on_worker_message)
      slot.key = make_uuid();
      slot.connected = false;
      slot.pending_run = std::move(msg);
      const std::string name = a.hook_id + "." + std::to_string(a.number);
      try {
        s.launcher->launch(slot.key, name, {self_executable().string(), "__worker", "--connect", listener_->address(), "--key", slot.key},
                           {"DIASPORA_SITE=" + s.spec->name, "DIASPORA_WORKER=" + std::to_string(slot.index)});
      } catch (const std::exception& e) {
        slot.inst = slot.att = -1;
        slot.key.clear();
        attempt_ended(ii, ai, false, "site " + s.spec->name + ": " + e.what());
        return false;
      }
      say("launch " + name + " on " + worker + " through " + s.launcher->describe() + " (" + a.cause + ")");
      return true;
    }
    announce_start(ii, ai, s, slot, false);
    if (!slot.ch.send(msg)) {
      attempt_ended(ii, ai, false, "worker " + worker + " did not take the task (its channel is closed)");
      return false;
    }
  } else {
    int pfd[2];
    if (::pipe2(pfd, O_CLOEXEC) != 0) throw Error("pipe: " + storage::errno_text(errno));
    SpawnSpec sp;
    if (is_job(inst.task)) {
      sp.parent_death_signal = SIGTERM;  // the runner killed: the job checkpoints and stops (--resume continues it)
      try {
        sp.argv = job_argv(inst.task);
      } catch (const std::exception& e) {  // diaspora::Error, or the job folder cannot be made
        ::close(pfd[0]);
        ::close(pfd[1]);
        slot.inst = slot.att = -1;  // the slot is free again
        attempt_ended(ii, ai, false, e.what());
        return false;
      }
    } else {
      sp.argv = {"/bin/sh", "-c", *ts.command};
    }
    announce_start(ii, ai, s, slot, false);
    sp.fds = {{pfd[1], 3}};
    const std::string base = (tasks_dir_ / (a.hook_id + "." + std::to_string(a.number))).string();
    sp.stdout_file = base + ".out";
    sp.stderr_file = base + ".err";
    sp.memory_limit = ts.resources.memory;
    sp.env_extra = {"DIASPORA_PROGRESS_FD=3",
                    "DIASPORA_TASK_ID=" + a.hook_id,
                    "DIASPORA_ATTEMPT=" + std::to_string(a.number),
                    "DIASPORA_SITE=" + s.spec->name,
                    "DIASPORA_DATA_DIR=" + (data_dir_ / ts.name).string()};
    try {
      fs::create_directories(data_dir_ / ts.name);
      slot.cmd_pid = spawn(sp);
    } catch (const std::exception& e) {
      ::close(pfd[0]);
      ::close(pfd[1]);
      slot.inst = slot.att = -1;  // the slot is free again
      attempt_ended(ii, ai, false, e.what());
      return false;
    }
    ::close(pfd[1]);
    track_group(slot.cmd_pid, true);
    slot.progress = LineChannel(pfd[0]);
    slot.next_beat = now() + opt_.heartbeat_s;
    slot.next_checkpoint = 0;
    if (s.stopped_phase) signal_group(slot.cmd_pid, SIGSTOP);
  }
  announce_start(ii, ai, s, slot, true);
  return true;
}

// An attempt starts running on `slot`: the started hook (`log` false), then (`log` true)
// the log line and the acknowledgement of the action that asked for it.
void Runner::announce_start(int ii, int ai, Site& s, Slot& slot, bool log) {
  Instance& inst = insts_[static_cast<std::size_t>(ii)];
  Attempt& a = inst.attempts[static_cast<std::size_t>(ai)];
  const std::string worker = s.spec->name + "/worker-" + std::to_string(slot.index);
  if (!log) {
    a.start_t = a.last_beat = now();
    auto i = info(inst, a);
    i.worker = worker.c_str();
    lib_->task_started(plugin_, &i);
    return;
  }
  say("start " + a.hook_id + " attempt " + std::to_string(a.number) + " on " + worker + " (" + a.cause + ")");
  if (!a.action_id.empty()) ack(a.action_id, true, "attempt " + std::to_string(a.number) + " of " + a.hook_id + " running on " + worker);
}

void Runner::kill_slot_process(Site& s, Slot& slot) {
  if (s.launcher) {  // the worker is told, killed when on this host, and its launch withdrawn
    if (slot.connected) slot.ch.send({{"op", "cancel"}});
    signal_remote(slot, SIGKILL);
    signal_remote(slot, SIGCONT);
    release_remote(s, slot);
    return;
  }
  if (slot.cmd_pid > 0 && slot.inst >= 0 && is_job(insts_[static_cast<std::size_t>(slot.inst)].task)) {
    // A rehearsal job checkpoints on SIGTERM (its ranks finish the step, write the
    // checkpoint, exit 3); its next attempt waits for that (draining()).
    signal_group(slot.cmd_pid, SIGTERM);
    signal_group(slot.cmd_pid, SIGCONT);
    slot.draining_inst = slot.inst;
    slot.drain_deadline = now() + opt_.job_drain_s;
  } else if (slot.cmd_pid > 0) {
    signal_group(slot.cmd_pid, SIGKILL);
    signal_group(slot.cmd_pid, SIGCONT);
  } else if (slot.pid > 0) {
    signal_group(slot.pid, SIGKILL);
    signal_group(slot.pid, SIGCONT);
  }
}

void Runner::stop_attempt(int ii, int ai, const std::string& outcome, const std::string& reason, bool report_failed) {
  Instance& inst = insts_[static_cast<std::size_t>(ii)];
  Attempt& a = inst.attempts[static_cast<std::size_t>(ai)];
  if (a.outcome == "queued") {
    a.outcome = outcome;
    a.reason = reason;
    a.end_t = now();
    return;
  }
  if (!a.live()) return;
  Site* s = find_site(a.site);
  if (s && a.slot >= 0) {
    Slot& slot = s->slots[static_cast<std::size_t>(a.slot)];
    if (slot.inst == ii && slot.att == ai) {
      kill_slot_process(*s, slot);  // the worker is replaced when its exit is reaped
      slot.inst = slot.att = -1;
      slot.ready = s->launcher || (slot.cmd_pid > 0 && slot.pid > 0 && slot.ready);  // a command's worker stays usable
    }
  }
  a.outcome = outcome;
  a.reason = reason;
  a.end_t = now();
  auto i = info(inst, a);
  const std::string r = reason.substr(0, DIASPORA_MAX_TEXT);
  i.reason = r.c_str();
  if (report_failed) {
    i.retryable = 1;
    lib_->task_failed(plugin_, &i);
  } else {
    lib_->task_cancelled(plugin_, &i);
  }
}

bool Runner::policy_can_recover(const Instance& inst) const {
  const std::string& name = spec_.tasks[inst.task].name;
  for (const auto& p : spec_.policies) {
    if (p.action != ActionKind::restart && p.action != ActionKind::migrate && p.action != ActionKind::speculate) continue;
    if (!p.signal.starts_with("task.")) continue;
    if (p.targets.empty() || std::find(p.targets.begin(), p.targets.end(), name) != p.targets.end()) return true;
  }
  return false;
}

void Runner::instance_final(int ii, InstState st, const std::string& reason) {
  Instance& inst = insts_[static_cast<std::size_t>(ii)];
  if (inst.state == InstState::completed || inst.state == InstState::failed || inst.state == InstState::cancelled) return;
  inst.state = st;
  awaiting_.erase(ii);
  --open_;
  inst.end_t = now();
  inst.reason = reason;
  for (auto& a : inst.attempts)
    if (a.outcome == "queued") {
      a.outcome = "cancelled";
      a.reason = "the instance " + std::string(to_string(st));
      a.end_t = now();
    }
  if (st != InstState::completed) say(std::string(to_string(st)) + " " + inst.id + ": " + reason);
}

// An attempt finished by itself (done, failed, or its process died).
void Runner::attempt_ended(int ii, int ai, bool ok, const std::string& reason, bool lost) {
  Instance& inst = insts_[static_cast<std::size_t>(ii)];
  Attempt& a = inst.attempts[static_cast<std::size_t>(ai)];
  Site* s = find_site(a.site);
  if (lost && opt_.baseline_retry_after_s) {
    // The baseline does not see a lost worker: the attempt looks alive until its silence
    // exceeds retry-after.
    a.lost = true;
    lost_.emplace_back(ii, ai);
    return;
  }
  a.end_t = now();
  a.reason = reason;
  if (ok) {
    a.outcome = "completed";
    auto i = info(inst, a);
    i.has_exit_code = 1;
    lib_->task_completed(plugin_, &i);
    if (s) ++s->completed;
    const bool first = inst.state != InstState::completed;
    if (first) {
      for (std::size_t k = 0; k < inst.attempts.size(); ++k)
        if (static_cast<int>(k) != ai && (inst.attempts[k].live() || inst.attempts[k].outcome == "queued"))
          stop_attempt(ii, static_cast<int>(k), "cancelled", a.hook_id + " attempt " + std::to_string(a.number) + " finished first", false);
      instance_final(ii, InstState::completed, "");
      const TaskSpec& ts = spec_.tasks[inst.task];
      const double took = a.end_t - inst.submitted_t;
      const bool late = ts.deadline && took > ts.deadline->count();
      say("done " + a.hook_id + " on " + a.site + " in " + std::to_string(took).substr(0, std::to_string(took).find('.') + 2) +
          " s" + (late ? " (deadline missed)" : ""));
      if (const json::value* f = inst.result.if_contains("file"); f && f->is_string()) {
        const json::value* b = inst.result.if_contains("bytes");
        const json::value* c = inst.result.if_contains("checksum");
        const std::string uri = "file://" + std::string(f->get_string());
        const std::string sum = c && c->is_string() ? std::string(c->get_string()) : std::string();
        diaspora_data_info d{};
        d.struct_size = sizeof d;
        d.stream = ts.name.c_str();
        d.seq = inst.index;
        d.bytes = b && b->is_int64() ? b->get_int64() : -1;
        d.uri = uri.c_str();
        d.checksum = sum.empty() ? nullptr : sum.c_str();
        d.site = a.site.c_str();
        lib_->data_arrived(plugin_, &d);
      }
    }
    return;
  }
  a.outcome = "failed";
  if (s) {
    ++s->failed;
    add_penalty(*s, 1.0);
  }
  say("failed " + a.hook_id + " attempt " + std::to_string(a.number) + " on " + a.site + ": " + reason);
  bool others_alive = false;
  for (const auto& x : inst.attempts) others_alive |= x.live() || x.outcome == "queued";
  if (opt_.baseline_retry_after_s) {
    hook_failed(inst, a, true);
    if (!others_alive) baseline_retry(ii, "baseline: retry after an error", reason);
    return;
  }
  const bool recoverable = policy_can_recover(inst) && !stopping_;
  hook_failed(inst, a, recoverable);
  if (others_alive) return;
  if (recoverable) {
    inst.state = InstState::awaiting;
    inst.awaiting_since = now();
    awaiting_.insert(ii);
  } else {
    instance_final(ii, InstState::failed, reason);
  }
}

int Runner::find_instance(const std::string& hook_id, int* attempt_out) const {
  auto it = index_.find(hook_id.substr(0, hook_id.find('@')));
  if (it == index_.end()) return -1;
  const Instance& inst = insts_[static_cast<std::size_t>(it->second)];
  int best = -1;
  for (std::size_t k = 0; k < inst.attempts.size(); ++k)
    if (inst.attempts[k].hook_id == hook_id) best = static_cast<int>(k);
  if (attempt_out) *attempt_out = best;
  return it->second;
}

// ---- actions ----------------------------------------------------------------------------------

void Runner::handle_actions() {
  std::deque<diaspora_action> batch;
  {
    std::lock_guard<std::mutex> lk(actions_mu_);
    batch.swap(incoming_);
  }
  for (const auto& a : batch) {
    ActionRecord rec;
    rec.id = a.id;
    rec.kind = a.kind_name;
    rec.task = a.task_id;
    rec.site = a.site;
    rec.target = a.target_site;
    rec.reason = a.reason;
    rec.origin = a.origin;
    rec.received_t = now();
    actions_.push_back(rec);
    say("action " + rec.kind + (rec.task.empty() ? "" : " " + rec.task) + (rec.target.empty() ? "" : " -> " + rec.target) +
        " (" + rec.origin + "): " + rec.reason.substr(0, 200));
    carry_out(a, actions_.back());
  }
}

void Runner::carry_out(const diaspora_action& a, ActionRecord& rec) {
  const std::string kind = a.kind_name;
  if (stopping_) return ack(a.id, false, "the run is stopping");
  if (a.kind == DIASPORA_ACTION_DRAIN || a.kind == DIASPORA_ACTION_UNDRAIN) return drain_site(a);
  if (a.kind == DIASPORA_ACTION_THROTTLE) {
    throttle_ = std::max(1.0 / 16, throttle_ * 0.5);
    throttle_until_ = now() + 60;
    return ack(a.id, true, "new instances at " + std::to_string(static_cast<int>(throttle_ * 100)) + " % of their rate for 60 s");
  }
  int ai = -1;
  const int ii = find_instance(a.task_id, &ai);
  if (ii < 0) return ack(a.id, false, "no task instance '" + std::string(a.task_id) + "' in this run");
  Instance& inst = insts_[static_cast<std::size_t>(ii)];
  const bool final = inst.state == InstState::completed || inst.state == InstState::cancelled;
  if (final) return ack(a.id, false, inst.id + " already " + std::string(to_string(inst.state)));
  if (ai < 0) return ack(a.id, false, "no attempt of '" + std::string(a.task_id) + "'");
  Attempt& cur = inst.attempts[static_cast<std::size_t>(ai)];
  switch (a.kind) {
    case DIASPORA_ACTION_RESTART:
    case DIASPORA_ACTION_MIGRATE: {
      const bool migrate = a.kind == DIASPORA_ACTION_MIGRATE;
      std::string target = migrate ? std::string(a.target_site) : std::string();
      if (migrate) {
        Site* t = find_site(target);
        const TaskSpec& ts = spec_.tasks[inst.task];
        if (!t) return ack(a.id, false, "no site '" + target + "' in this run");
        if (t->drained) return ack(a.id, false, "site '" + target + "' is drained (an operator's drain; undrain it first)");
        if (t->launcher && !ts.kind)
          return ack(a.id, false, "site '" + target + "' (engine: " + std::string(to_string(t->spec->engine)) +
                                      ") runs built-in kinds only, not " + ts.name);
        if (!ts.allowed_sites.empty() && std::find(ts.allowed_sites.begin(), ts.allowed_sites.end(), target) == ts.allowed_sites.end())
          return ack(a.id, false, "site '" + target + "' is not in " + ts.name + "'s allowed_sites");
      }
      bool queued_one = false;
      for (std::size_t k = 0; k < inst.attempts.size(); ++k)
        queued_one |= inst.attempts[k].hook_id == cur.hook_id && inst.attempts[k].outcome == "queued";
      if (queued_one && !migrate)  // e.g. a second policy reacting to the same trouble
        return ack(a.id, false, "not needed: a new attempt of " + cur.hook_id + " is already waiting for a worker");
      const std::string from = cur.site;
      if (cur.live() && a.site[0] != '\0' && from != a.site)  // decided on an attempt that has moved since
        return ack(a.id, false, cur.hook_id + " is no longer on " + a.site + " (attempt " + std::to_string(cur.number) +
                                    " runs on " + from + ")");
      if (cur.live()) {
        if (Site* s = find_site(from); s && migrate) add_penalty(*s, 1.0);
        stop_attempt(ii, ai, "stopped", std::string("stopped for ") + (migrate ? "migration to " + target : "restart") + " (action " + a.id + ")", true);
      }
      for (std::size_t k = 0; k < inst.attempts.size(); ++k)  // a migrate replaces a waiting attempt
        if (inst.attempts[k].hook_id == cur.hook_id && inst.attempts[k].outcome == "queued")
          stop_attempt(ii, static_cast<int>(k), "cancelled", "replaced by action " + std::string(a.id), false);
      Attempt n;
      n.hook_id = cur.hook_id;
      n.speculative = cur.speculative;
      n.pin_site = target;
      n.action_id = a.id;
      n.cause = std::string(kind) + " (action " + a.id + (from.empty() ? "" : ", from " + from) + ")";
      queue_attempt(ii, std::move(n));
      (void)rec;
      return;  // acknowledged when the new attempt starts
    }
    case DIASPORA_ACTION_SPECULATE: {
      if (inst.state != InstState::running) return ack(a.id, false, inst.id + " is not running (" + std::string(to_string(inst.state)) + ")");
      if (is_job(inst.task))
        return ack(a.id, false, "a rehearsal job is not copied (two trainers would share its checkpoints); migrate it instead");
      Attempt n;
      n.hook_id = inst.id + "@copy" + std::to_string(++inst.copies);
      n.speculative = true;
      n.pin_site = a.target_site;
      if (n.pin_site.empty()) n.avoid_site = cur.site;
      n.action_id = a.id;
      n.cause = std::string("speculate (action ") + a.id + ")";
      auto i = info(inst, n);
      i.name = spec_.tasks[inst.task].name.c_str();
      i.attempt = 0;
      lib_->task_submitted(plugin_, &i);
      queue_attempt(ii, std::move(n));
      return;
    }
    case DIASPORA_ACTION_CHECKPOINT: {
      if (!cur.live()) return ack(a.id, false, cur.hook_id + " is not running");
      Site* s = find_site(cur.site);
      Slot& slot = s->slots[static_cast<std::size_t>(cur.slot)];
      if (slot.cmd_pid > 0 && is_job(inst.task) && cur.step <= 0 && cur.progress <= 0)
        return ack(a.id, false, cur.hook_id + " has not started training yet (nothing to checkpoint)");
      if (slot.cmd_pid > 0) {
        signal_group(slot.cmd_pid, SIGUSR1);
        return ack(a.id, true, "SIGUSR1 sent to the command's process group");
      }
      slot.pending_checkpoint = a.id;
      if (!slot.ch.send({{"op", "checkpoint"}})) return ack(a.id, false, "the worker is gone");
      return;  // acknowledged on "checkpointed"
    }
    case DIASPORA_ACTION_CANCEL: {
      for (std::size_t k = 0; k < inst.attempts.size(); ++k)
        stop_attempt(ii, static_cast<int>(k), "cancelled", std::string("cancelled by action ") + a.id, false);
      instance_final(ii, InstState::cancelled, std::string("cancelled by action ") + a.id + ": " + a.reason);
      return ack(a.id, true, inst.id + " cancelled");
    }
    default:
      return ack(a.id, false, "unknown action kind " + kind);
  }
}

// drain: nothing new starts on the site (attempts running there finish; waiting attempts
// pinned to it are placed elsewhere); undrain: it takes new work again.
void Runner::drain_site(const diaspora_action& a) {
  const bool drain = a.kind == DIASPORA_ACTION_DRAIN;
  const std::string name = a.site[0] != '\0' ? a.site : a.target_site;
  if (name.empty()) return ack(a.id, false, std::string("a ") + a.kind_name + " names the site ('site')");
  Site* s = find_site(name);
  if (!s) return ack(a.id, false, "no site '" + name + "' in this run");
  if (s->drained == drain) return ack(a.id, true, "site '" + name + "' was already " + (drain ? "drained" : "taking work"));
  s->drained = drain;
  long running = 0, moved = 0;
  for (const auto& sl : s->slots) running += sl.inst >= 0;
  if (drain)
    for (auto [ii, ai] : queue_) {
      Attempt& q = insts_[static_cast<std::size_t>(ii)].attempts[static_cast<std::size_t>(ai)];
      if (q.outcome == "queued" && q.pin_site == name) {
        q.pin_site.clear();
        q.avoid_site = name;
        ++moved;
      }
    }
  dispatch();
  return ack(a.id, true, drain ? "site '" + name + "' drained: nothing new starts there; " + std::to_string(running) +
                                     " running attempt(s) finish there" +
                                     (moved ? ", " + std::to_string(moved) + " waiting one(s) placed elsewhere" : "")
                               : "site '" + name + "' takes new work again");
}

// ---- I/O ----------------------------------------------------------------------------------------

void Runner::on_worker_message(Site& s, Slot& slot, const json::object& m) {
  const json::value* opv = m.if_contains("op");
  const std::string op = opv && opv->is_string() ? std::string(opv->get_string()) : "";
  if (op == "ready") {
    slot.ready = true;
    if (s.launcher && slot.connected && slot.inst >= 0 && !slot.pending_run.empty()) {  // a remote attempt begins
      const json::object run = std::exchange(slot.pending_run, {});
      announce_start(slot.inst, slot.att, s, slot, false);
      if (!slot.ch.send(run)) return remote_lost(s, slot, "its connection closed before the task was sent");
      if (s.stopped_phase) signal_remote(slot, SIGSTOP);
      announce_start(slot.inst, slot.att, s, slot, true);
    }
    return;
  }
  if (op == "checkpointed") {
    const std::string id = std::exchange(slot.pending_checkpoint, "");
    const json::value* st = m.if_contains("step");
    ack(id, true, "checkpoint written at step " + (st ? json::serialize(*st) : std::string("?")));
    return;
  }
  if (slot.inst < 0) return;  // a late message of an attempt that was stopped
  const int ii = slot.inst, ai = slot.att;
  Instance& inst = insts_[static_cast<std::size_t>(ii)];
  Attempt& a = inst.attempts[static_cast<std::size_t>(ai)];
  if (op == "beat") {
    a.last_beat = now();
    auto num = [&](const char* k) {
      const json::value* v = m.if_contains(k);
      return v && v->is_number() ? v->to_number<double>() : 0.0;
    };
    a.step = static_cast<long>(num("step"));
    if (const double st = num("step_time"); st > 0) {
      auto& e = s.step_time[spec_.tasks[inst.task].name];
      const bool fresh = e.fast > 0 && now() - e.t < 30;
      e.fast = fresh ? 0.8 * e.fast + 0.2 * st : st;
      e.slow = fresh ? 0.98 * e.slow + 0.02 * st : st;
      e.t = now();
    }
    a.progress = std::clamp(num("progress"), 0.0, 1.0);
    diaspora_metric_value mv{"step_time_s", num("step_time")};
    auto i = info(inst, a);
    i.progress = a.progress;
    i.step = a.step;
    i.metrics = &mv;
    i.metric_count = 1;
    lib_->task_progress(plugin_, &i);
  } else if (op == "done" || op == "failed") {
    if (s.launcher) release_remote(s, slot);  // a one-shot worker: it exits when the channel closes
    slot.inst = slot.att = -1;
    if (op == "done") {
      if (const json::value* r = m.if_contains("result"); r && r->is_object() && inst.state != InstState::completed)
        inst.result = r->get_object();
      attempt_ended(ii, ai, true, "");
    } else {
      const json::value* r = m.if_contains("reason");
      attempt_ended(ii, ai, false, r && r->is_string() ? std::string(r->get_string()) : "failed");
    }
  }
  (void)s;
}

void Runner::on_command_line(Site& s, Slot& slot, const std::string& line) {
  (void)s;
  if (slot.inst < 0) return;
  Instance& inst = insts_[static_cast<std::size_t>(slot.inst)];
  Attempt& a = inst.attempts[static_cast<std::size_t>(slot.att)];
  const ProgressLine pl = parse_progress_line(line);
  if (pl.kind == ProgressLine::Kind::none) return;
  auto i = info(inst, a);
  a.last_beat = now();
  if (pl.kind == ProgressLine::Kind::progress) {
    a.progress = pl.value;
    i.progress = pl.value;
    i.step = pl.step;
    lib_->task_progress(plugin_, &i);
  } else if (pl.kind == ProgressLine::Kind::metric) {
    const std::vector<diaspora_metric_value> mv = pl.metric_values();
    i.metrics = mv.data();
    i.metric_count = mv.size();
    lib_->task_heartbeat(plugin_, &i);
  } else {
    lib_->task_heartbeat(plugin_, &i);
  }
}

void Runner::poll_io(double timeout_s) {
  std::vector<pollfd> fds;
  std::vector<std::tuple<Site*, Slot*, bool>> who;  // bool: command progress pipe
  fds.push_back({wake_[0], POLLIN, 0});
  who.emplace_back(nullptr, nullptr, false);
  if (listener_)
    for (int fd : listener_->fds()) {
      fds.push_back({fd, POLLIN, 0});
      who.emplace_back(nullptr, nullptr, false);
    }
  for (auto& s : sites_)
    for (auto& slot : s.slots) {
      if (slot.ch.fd() >= 0) {
        fds.push_back({slot.ch.fd(), POLLIN, 0});
        who.emplace_back(&s, &slot, false);
      }
      if (slot.progress.fd() >= 0) {
        fds.push_back({slot.progress.fd(), POLLIN, 0});
        who.emplace_back(&s, &slot, true);
      }
    }
  const int ms = std::clamp(static_cast<int>(timeout_s * 1000), 0, 100);
  if (::poll(fds.data(), fds.size(), ms) <= 0) return;
  if (fds[0].revents) {
    char buf[256];
    while (::read(wake_[0], buf, sizeof buf) > 0) {
    }
  }
  for (std::size_t k = 1; k < fds.size(); ++k) {
    if (!fds[k].revents) continue;
    auto [s, slot, cmd] = who[k];
    if (!slot) continue;  // the listener's: served below
    if (cmd) {
      const bool open = slot->progress.fill();
      while (auto line = slot->progress.next_line()) on_command_line(*s, *slot, *line);
      if (!open) slot->progress.close();
      continue;
    }
    const bool open = slot->ch.fill();
    while (slot->ch.fd() >= 0)
      if (auto m = slot->ch.next()) on_worker_message(*s, *slot, *m);
      else break;
    if (!open && s->launcher) remote_lost(*s, *slot, "its connection closed");
    else if (!open) slot->ch.close();  // the worker is gone: reap() handles its exit
  }
  if (listener_)
    for (Hello& h : listener_->service()) on_hello(std::move(h));
}

// ---- remote sites -------------------------------------------------------------------------------

// A remote worker connected: it belongs to the launch out for a slot's attempt, or it is
// late (the attempt was stopped, or the engine ran the launch twice) and is sent away.
void Runner::on_hello(Hello h) {
  for (auto& s : sites_)
    for (auto& slot : s.slots) {
      if (!s.launcher || slot.key != h.key || slot.connected || slot.inst < 0) continue;
      slot.ch = std::move(h.ch);
      slot.connected = true;
      slot.remote_pid = h.pid;
      slot.engine_pid = h.engine_pid;
      slot.same_host = h.host == host_;
      s.launcher->connected(slot.key);
      while (slot.ch.fd() >= 0)  // the lines that came with the hello ("ready")
        if (auto m = slot.ch.next()) on_worker_message(s, slot, *m);
        else break;
      return;
    }
  h.ch.close();  // the worker exits: nothing for it
}

// The slot's launch is over (its attempt ended or was stopped): the connection closes (the
// worker exits) and the engine lets go of it.
void Runner::release_remote(Site& s, Slot& slot) {
  slot.ch.close();
  if (!slot.key.empty()) s.launcher->cancel(slot.key);
  slot.key.clear();
  slot.connected = false;
  slot.pending_run = {};
  slot.remote_pid = slot.engine_pid = -1;
  slot.same_host = false;
}

// A remote attempt's worker is gone without finishing (its process or its engine worker
// died, its job ended): the attempt is lost, as when a local worker dies.
void Runner::remote_lost(Site& s, Slot& slot, const std::string& why) {
  const int ii = slot.inst, ai = slot.att;
  release_remote(s, slot);
  if (ii < 0) return;
  slot.inst = slot.att = -1;
  if (slot.pending_checkpoint.size()) ack(std::exchange(slot.pending_checkpoint, ""), false, "the worker died: " + why);
  attempt_ended(ii, ai, false, "worker " + s.spec->name + "/worker-" + std::to_string(slot.index) + " died (" + why + ")", true);
}

// What the engines say about launches: one that ended before its worker connected failed.
void Runner::launchers_tick() {
  for (auto& s : sites_) {
    if (!s.launcher) continue;
    for (const LaunchEnded& e : s.launcher->poll())
      for (auto& slot : s.slots)
        if (slot.key == e.key && !slot.connected && slot.inst >= 0) {
          const int ii = slot.inst, ai = slot.att;
          release_remote(s, slot);
          slot.inst = slot.att = -1;
          attempt_ended(ii, ai, false, "site " + s.spec->name + ": " + e.reason);
        }
  }
}

void Runner::on_slot_process_exit(Site& s, Slot& slot, bool worker, int status) {
  const std::string what = describe_wait_status(status);
  if (worker) {
    track_group(slot.pid, false);
    slot.pid = -1;
    slot.ch.close();
    slot.ready = false;
    if (slot.pending_checkpoint.size()) ack(std::exchange(slot.pending_checkpoint, ""), false, "the worker died: " + what);
    if (slot.inst >= 0 && slot.cmd_pid < 0) {
      const int ii = slot.inst, ai = slot.att;
      slot.inst = slot.att = -1;
      attempt_ended(ii, ai, false, "worker " + s.spec->name + "/worker-" + std::to_string(slot.index) + " died (" + what + ")", true);
    }
    slot.respawn_at = stopping_ ? -1 : now();
    return;
  }
  track_group(slot.cmd_pid, false);
  slot.cmd_pid = -1;
  if (slot.draining_inst >= 0) {
    say("rehearsal job " + insts_[static_cast<std::size_t>(slot.draining_inst)].id + " stopped on " + s.spec->name + " (" + what +
        (WIFEXITED(status) && WEXITSTATUS(status) == 3 ? ", checkpointed)" : ")"));
    slot.draining_inst = -1;
  }
  // Read what the command reported before it exited.
  if (slot.progress.fd() >= 0) {
    slot.progress.fill();
    while (auto line = slot.progress.next_line()) on_command_line(s, slot, *line);
    slot.progress.close();
  }
  if (slot.inst < 0) return;
  const int ii = slot.inst, ai = slot.att;
  slot.inst = slot.att = -1;
  Attempt& a = insts_[static_cast<std::size_t>(ii)].attempts[static_cast<std::size_t>(ai)];
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    if (is_job(insts_[static_cast<std::size_t>(ii)].task)) {  // the trainer's summary is the job's result
      try {
        if (const json::value v = read_json_file(job_dir(insts_[static_cast<std::size_t>(ii)].task) / "summary.json"); v.is_object()) insts_[static_cast<std::size_t>(ii)].result = v.get_object();
      } catch (const std::exception& e) {
        say("warning: " + insts_[static_cast<std::size_t>(ii)].id + ": summary.json unreadable: " + e.what());
      }
    }
    return attempt_ended(ii, ai, true, "");
  }
  std::string reason = "command " + what;
  // The last line the command wrote to stderr says why, most of the time.
  const fs::path err = tasks_dir_ / (a.hook_id + "." + std::to_string(a.number) + ".err");
  std::ifstream f(err);
  std::string line, last;
  while (std::getline(f, line))
    if (!line.empty()) last = line;
  if (!last.empty()) reason += ": " + last.substr(0, 500);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) reason += " (command not found?)";
  attempt_ended(ii, ai, false, reason, WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

void Runner::reap() {
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (auto& s : sites_)
      for (auto& slot : s.slots) {
        if (slot.pid == pid) on_slot_process_exit(s, slot, true, status);
        else if (slot.cmd_pid == pid) on_slot_process_exit(s, slot, false, status);
      }
  }
}

// ---- time-driven --------------------------------------------------------------------------------

void Runner::command_heartbeats() {
  const double t = now();
  for (auto& s : sites_)
    for (auto& slot : s.slots) {
      if (slot.cmd_pid <= 0 || slot.inst < 0 || t < slot.next_beat) continue;
      slot.next_beat = t + opt_.heartbeat_s;
      if (process_stopped(slot.cmd_pid)) continue;  // stopped (a hang): no heartbeat
      Instance& inst = insts_[static_cast<std::size_t>(slot.inst)];
      Attempt& a = inst.attempts[static_cast<std::size_t>(slot.att)];
      a.last_beat = t;
      auto i = info(inst, a);
      lib_->task_heartbeat(plugin_, &i);
    }
}

void Runner::duty_cycle_tick() {
  const double t = now();
  constexpr double kPeriod = 0.1;
  for (auto& s : sites_) {
    const bool slowed = s.slow_factor > 1 && t < s.slow_until;
    if (!slowed) {
      if (s.stopped_phase) {
        s.stopped_phase = false;
        for (auto& slot : s.slots) {
          signal_group(slot.pid, SIGCONT);
          signal_group(slot.cmd_pid, SIGCONT);
          signal_remote(slot, SIGCONT);
        }
      }
      continue;
    }
    if (t < s.next_toggle) continue;
    s.stopped_phase = !s.stopped_phase;
    const double run = kPeriod / s.slow_factor;
    s.next_toggle = t + (s.stopped_phase ? kPeriod - run : run);
    for (auto& slot : s.slots) {
      signal_group(slot.pid, s.stopped_phase ? SIGSTOP : SIGCONT);
      signal_group(slot.cmd_pid, s.stopped_phase ? SIGSTOP : SIGCONT);
      signal_remote(slot, s.stopped_phase ? SIGSTOP : SIGCONT);
    }
  }
}

void Runner::faults_tick() {
  const double t = now();
  for (std::size_t fi = 0; fi < faults_.size(); ++fi) {
    Fault& f = faults_[fi];
    const FaultSpec& fs = *f.spec;
    if (f.start_t < 0 && t >= fs.at.count() && !stopping_) {
      f.start_t = t;
      const std::string kind(to_string(fs.kind));
      auto running_attempt = [&](const std::string& site_name, const std::optional<std::string>& task) -> std::pair<int, int> {
        std::pair<int, int> best{-1, -1};
        double oldest = 1e300;
        for (int ii = 0; ii < static_cast<int>(insts_.size()); ++ii) {
          const Instance& inst = insts_[static_cast<std::size_t>(ii)];
          if (task && spec_.tasks[inst.task].name != *task) continue;
          for (int ai = 0; ai < static_cast<int>(inst.attempts.size()); ++ai) {
            const Attempt& a = inst.attempts[static_cast<std::size_t>(ai)];
            if (!a.live() || a.lost || (!site_name.empty() && a.site != site_name)) continue;
            if (const Site* s = find_site(a.site); s && s->launcher && !s->slots[static_cast<std::size_t>(a.slot)].connected)
              continue;  // still in the engine's queue: nothing of it runs yet
            if (a.start_t < oldest) oldest = a.start_t, best = {ii, ai};
          }
        }
        return best;
      };
      switch (fs.kind) {
        case FaultKind::slow_site: {
          Site* s = find_site(*fs.site);
          s->slow_factor = fs.factor;
          s->slow_until = fs.lasts ? t + fs.lasts->count() : 1e300;
          s->next_toggle = t;
          f.end_t = fs.lasts ? t + fs.lasts->count() : -1;
          f.target = s->spec->name;
          for (int ii = 0; ii < static_cast<int>(insts_.size()); ++ii)
            for (const auto& a : insts_[static_cast<std::size_t>(ii)].attempts)
              if (a.live() && a.site == s->spec->name) f.hit.emplace_back(ii, insts_[static_cast<std::size_t>(ii)].attempts.size());
          resource(s->spec->name, "site", "degraded", s->spec->name, "fault_slow_site_factor", fs.factor);
          say("fault slow-site: " + f.target + " runs " + std::to_string(fs.factor).substr(0, 4) + "x slower" +
              (fs.lasts ? " for " + std::to_string(static_cast<int>(fs.lasts->count())) + " s" : ""));
          break;
        }
        case FaultKind::kill_worker:
        case FaultKind::hang_task: {
          const std::string site_name = fs.site.value_or("");
          auto [ii, ai] = running_attempt(site_name, fs.task);
          if (ii < 0) {
            f.note = "nothing was running there: no effect";
            f.done = true;
            say("fault " + kind + ": nothing running" + (site_name.empty() ? "" : " on " + site_name) + ", no effect");
            break;
          }
          Instance& inst = insts_[static_cast<std::size_t>(ii)];
          Attempt& a = inst.attempts[static_cast<std::size_t>(ai)];
          Site* s = find_site(a.site);
          Slot& slot = s->slots[static_cast<std::size_t>(a.slot)];
          const std::string worker = s->spec->name + "/worker-" + std::to_string(slot.index);
          f.target = a.hook_id + " on " + worker;
          f.hit.emplace_back(ii, inst.attempts.size());
          if (fs.kind == FaultKind::kill_worker && s->launcher) {
            // The engine's worker process (a Dask worker; its nanny starts another) or the
            // job's worker; a worker on another host, or one not connected yet, is out of reach.
            const pid_t victim = slot.engine_pid > 0 ? slot.engine_pid : slot.remote_pid;
            if (slot.same_host && victim > 0) ::kill(victim, SIGKILL);
            else f.note = "the attempt's worker is not on this host (or not started yet): no effect";
            resource(worker, "worker", "down", s->spec->name, "fault_kill_worker", 1);
          } else if (fs.kind == FaultKind::kill_worker) {
            signal_group(slot.cmd_pid > 0 ? slot.cmd_pid : slot.pid, SIGKILL);
            resource(worker, "worker", "down", s->spec->name, "fault_kill_worker", 1);
          } else {
            if (slot.cmd_pid > 0) signal_group(slot.cmd_pid, SIGSTOP);
            else slot.ch.send({{"op", "hang"}});
            resource(worker, "worker", "degraded", s->spec->name, "fault_hang_task", 1);
          }
          f.done = true;
          say("fault " + kind + ": " + f.target);
          break;
        }
        case FaultKind::stop_relay: {
          if (!relay_) {
            f.note = "the relay is not embedded: no effect";
            f.done = true;
            break;
          }
          resource("relay", "relay", "down", "", "fault_stop_relay", 1);
          relay_->stop();
          f.end_t = fs.lasts ? t + fs.lasts->count() : -1;
          f.target = relay_url_;
          say("fault stop-relay: relay stopped" + (fs.lasts ? " for " + std::to_string(static_cast<int>(fs.lasts->count())) + " s" : ""));
          break;
        }
      }
      continue;
    }
    if (f.start_t >= 0 && !f.done && f.end_t >= 0 && t >= f.end_t) {
      f.done = true;
      if (fs.kind == FaultKind::stop_relay && relay_) {
        if (!restart_relay()) {
          f.done = false;  // try again on the next tick
          f.end_t = t + 0.2;
          continue;
        }
        resource("relay", "relay", "up", "", "fault_stop_relay", 0);
      } else if (fs.kind == FaultKind::slow_site) {
        resource(*fs.site, "site", "up", *fs.site, "fault_slow_site_factor", 1);
        say("fault slow-site over: " + *fs.site);
      }
    }
  }
}

void Runner::baseline_checks() {
  if (!opt_.baseline_retry_after_s) return;
  const double t = now(), limit = *opt_.baseline_retry_after_s;
  // The live attempts: those on a worker, and those whose worker died unnoticed.
  std::vector<std::pair<int, int>> live = lost_;
  for (const auto& s : sites_)
    for (const auto& sl : s.slots)
      if (sl.inst >= 0) live.emplace_back(sl.inst, sl.att);
  for (auto [ii, ai] : live) {
    Instance& inst = insts_[static_cast<std::size_t>(ii)];
    Attempt& a = inst.attempts[static_cast<std::size_t>(ai)];
    if (!a.live() || t - a.last_beat < limit) continue;
    const std::string why = "no heartbeat for " + std::to_string(static_cast<int>(limit)) + " s (baseline retry-after)";
    if (a.lost) {
      a.outcome = "failed";
      a.reason = why;
      a.end_t = t;
      hook_failed(inst, a, true);
      std::erase(lost_, std::make_pair(ii, ai));
    } else {
      stop_attempt(ii, ai, "failed", why, true);
    }
    say("baseline: " + a.hook_id + " " + why);
    baseline_retry(ii, "baseline: retry after heartbeat silence", why);
  }
}

// The baseline's retry: a new attempt while the instance has had fewer than 3, else it fails.
void Runner::baseline_retry(int ii, const std::string& cause, const std::string& why) {
  Instance& inst = insts_[static_cast<std::size_t>(ii)];
  if (inst.attempts.size() < 3 && !stopping_) {
    Attempt n;
    n.hook_id = inst.id;
    n.cause = cause;
    queue_attempt(ii, std::move(n));
  } else {
    instance_final(ii, InstState::failed, why + " (3 attempts)");
  }
}

void Runner::awaiting_checks() {
  const double t = now();
  for (int ii : std::vector<int>(awaiting_.begin(), awaiting_.end())) {
    Instance& inst = insts_[static_cast<std::size_t>(ii)];
    if (t - inst.awaiting_since < opt_.failure_grace_s) continue;
    std::string last;
    for (const auto& a : inst.attempts)
      if (!a.reason.empty()) last = a.reason;
    instance_final(ii, InstState::failed, last + " (no policy restarted it within " +
                                              std::to_string(static_cast<int>(opt_.failure_grace_s)) + " s)");
  }
}

// Starts the stopped embedded relay again on its port; false (said once) while the port
// cannot be bound yet.
bool Runner::restart_relay() {
  try {
    relay_->start();
    say("relay started again on " + relay_url_);
    relay_retry_said_ = false;
    return true;
  } catch (const Error& e) {
    if (!relay_retry_said_) say(std::string("relay: cannot start again yet (") + e.what() + "); retrying");
    relay_retry_said_ = true;
    return false;
  }
}

void Runner::erase_view() {
  if (!opt_.live_view || view_lines_ == 0) return;
  log_ << "\x1b[" << view_lines_ << "F\x1b[J";
  view_lines_ = 0;
}

double Runner::site_health(const Site& s, double t) const {
  double speed = 1;
  for (const auto& [task, st] : s.step_time) speed = std::min(speed, observed_speed(s, t, task));
  return speed / (1.0 + s.penalty * std::exp(-(t - s.penalty_t) / 60.0));
}

void Runner::draw_view() {
  if (!opt_.live_view || !lib_ || !plugin_) return;
  const double t = now();
  diaspora_stats st{};
  st.struct_size = sizeof st;
  lib_->get_stats(plugin_, &st);
  if (t - view_events_t_ >= 1) {
    view_rate_ = static_cast<double>(st.events_acked - view_events_) / std::max(1e-3, t - view_events_t_);
    view_events_ = st.events_acked;
    view_events_t_ = t;
  }
  long done = 0, failed = 0, running = 0;
  for (const auto& inst : insts_) {
    done += inst.state == InstState::completed;
    failed += inst.state == InstState::failed;
    running += inst.state == InstState::running;
  }
  std::ostringstream v;
  char b[256];
  std::snprintf(b, sizeof b, "\x1b[1m%s\x1b[0m  %.0f s  %zu instances: %ld done, %ld running, %zu queued, %ld failed  "
                "%.0f events/s%s\n", spec_.name.c_str(), t, insts_.size(), done, running, queue_.size(), failed, view_rate_,
                st.connected ? "" : "  (relay unreachable: spooling)");
  v << b;
  int lines = 1;
  for (const auto& s : sites_) {
    long busy = 0;
    for (const auto& sl : s.slots) busy += sl.inst >= 0;
    std::snprintf(b, sizeof b, "  %-16s running %ld/%zu  done %ld  failed %ld  health %.2f%s\n", s.spec->name.c_str(), busy,
                  s.slots.size(), s.completed, s.failed, site_health(s, t), s.drained ? "  (drained)" : "");
    v << b;
    ++lines;
  }
  const std::size_t first = actions_.size() > 3 ? actions_.size() - 3 : 0;
  for (std::size_t i = first; i < actions_.size(); ++i) {
    const auto& a = actions_[i];
    std::string line = "  " + fmt_time(a.received_t) + " " + a.kind + " " + a.task + " (" + a.outcome + "): " + a.reason;
    if (line.size() > 150) line = line.substr(0, 147) + "...";
    v << line << "\n";
    ++lines;
  }
  log_ << v.str();
  log_.flush();
  view_lines_ = lines;
  view_next_ = t + 0.5;
}

bool Runner::finished() const {
  for (const auto& st : streams_)
    if (st.created < st.total && !stopping_) return false;
  return open_ == 0;
}

void Runner::stop_everything(const std::string& why) {
  for (int ii = 0; ii < static_cast<int>(insts_.size()); ++ii) {
    Instance& inst = insts_[static_cast<std::size_t>(ii)];
    if (inst.state == InstState::completed || inst.state == InstState::failed || inst.state == InstState::cancelled) continue;
    for (int ai = 0; ai < static_cast<int>(inst.attempts.size()); ++ai) stop_attempt(ii, ai, "cancelled", why, false);
    instance_final(ii, InstState::cancelled, why);
  }
}

void Runner::loop() {
  int last_signals = 0;
  while (!finished()) {
    if (g_signals.load() != last_signals) {
      last_signals = g_signals.load();
      if (!stopping_) {
        stopping_ = true;
        stop_reason_ = "interrupted by a signal";
        say("signal: stopping (no new work; a second signal stops at once)");
        stop_everything("the run was interrupted");
      }
    }
    faults_tick();
    duty_cycle_tick();
    generate_stream_instances();
    handle_actions();
    for (auto& s : sites_)
      for (auto& slot : s.slots)
        if (slot.pid < 0 && slot.respawn_at >= 0 && now() >= slot.respawn_at) spawn_worker(s, slot);
    launchers_tick();
    dispatch();
    command_heartbeats();
    baseline_checks();
    awaiting_checks();
    jobs_tick();
    double next = 0.1;
    for (const auto& st : streams_)
      if (st.created < st.total) next = std::min(next, std::max(0.0, st.next_t - now()));
    for (const auto& s : sites_)
      if (s.slow_factor > 1) next = std::min(next, std::max(0.0, s.next_toggle - now()));
    poll_io(next);
    reap();
    if (opt_.live_view && now() >= view_next_) {
      erase_view();
      draw_view();
    }
  }
  erase_view();
}

// ---- the whole run ------------------------------------------------------------------------------

int Runner::run() {
  fs::create_directories(opt_.out_dir);
  data_dir_ = opt_.out_dir / "data";
  tasks_dir_ = opt_.out_dir / "tasks";
  ckpt_dir_ = opt_.out_dir / "checkpoints";
  fs::create_directories(data_dir_);
  fs::create_directories(tasks_dir_);
  fs::create_directories(ckpt_dir_);
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) throw Error("pipe: " + storage::errno_text(errno));
  g_wake_write = wake_[1];
  say("workflow " + spec_.name + " from " + spec_.file + ", output in " + opt_.out_dir.string() +
      (opt_.baseline_retry_after_s ? " (baseline: retry after " + std::to_string(static_cast<int>(*opt_.baseline_retry_after_s)) + " s of silence, no policies)"
       : spec_.policies.empty()    ? " (no policies)"
                                   : " (" + std::to_string(spec_.policies.size()) + " policies)"));
  start_relay_and_plugin();
  start_sites();
  for (const auto& f : spec_.faults) {
    Fault x;
    x.spec = &f;
    faults_.push_back(x);
  }
  // Wait for the workers to say ready (a second at most) so the first tasks start at once.
  const double until = now() + 5;
  for (;;) {
    bool all = true;
    for (auto& s : sites_)
      for (auto& slot : s.slots) all &= slot.ready;
    if (all || now() > until) break;
    poll_io(0.05);
    reap();
  }
  if (opt_.resume) read_prior();
  t0_ = std::chrono::steady_clock::now();
  start_us_ = now_us();
  make_instances();
  loop();

  // Faults still in force end with the run (a stopped relay starts again, so the spool drains).
  for (auto& s : sites_) s.slow_until = 0;
  duty_cycle_tick();
  for (int i = 0; relay_ && !relay_->running() && i < 100; ++i)  // the spool must drain into it
    if (!restart_relay()) ::usleep(100000);
  int failed = 0, completed = 0;
  for (const auto& inst : insts_) {
    failed += inst.state != InstState::completed;
    completed += inst.state == InstState::completed;
  }
  const int status = failed == 0 && !stopping_ ? 0 : 1;
  say("finished: " + std::to_string(completed) + " completed, " + std::to_string(failed) + " not completed");

  // Workers: close their channels (they exit), then make sure.
  for (auto& s : sites_)
    for (auto& slot : s.slots) {
      slot.ch.close();
      signal_group(slot.pid, SIGCONT);
    }
  double deadline = now() + 2;
  for (const auto& s : sites_)
    for (const auto& slot : s.slots)
      if (slot.draining_inst >= 0) deadline = std::max(deadline, slot.drain_deadline);  // a job writing its checkpoint
  for (;;) {
    bool any = false;
    for (auto& s : sites_)
      for (auto& slot : s.slots) any |= slot.pid > 0 || slot.cmd_pid > 0;
    if (!any) break;
    if (now() > deadline)
      for (auto& s : sites_)
        for (auto& slot : s.slots) {
          signal_group(slot.pid, SIGKILL);
          signal_group(slot.cmd_pid, SIGKILL);
        }
    stopping_ = true;
    ::usleep(20000);
    reap();
  }
  for (auto& s : sites_)
    if (s.launcher) s.launcher->shutdown(15);  // a LocalCluster stops, Slurm jobs still out are cancelled
  lib_->set_action_callback(plugin_, nullptr, nullptr);
  // Let the plugin deliver what it holds (a relay that was stopped has its spool to take)
  // before the counters go into the report; close() then has nothing left to wait for.
  diaspora_stats st{};
  st.struct_size = sizeof st;
  for (const double drained_by = now() + 15; now() < drained_by; ::usleep(50000)) {
    lib_->get_stats(plugin_, &st);
    if (st.events_acked + st.events_lost + st.events_rejected >= st.events_accepted && st.spool_records == 0) break;
  }
  const int rc = lib_->close(plugin_, 15000);
  plugin_ = nullptr;
  say("plugin closed: " + std::to_string(st.events_accepted) + " events, " + lib_->library_version() +
      (rc == DIASPORA_OK ? ", all acked by the relay" : std::string(", close: ") + lib_->status_name(rc)));
  plugin_stats_ = {{"events_accepted", st.events_accepted}, {"events_acked", st.events_acked},
                   {"events_spilled", st.events_spilled},   {"events_lost", st.events_lost},
                   {"events_rejected", st.events_rejected}, {"reconnects", st.reconnects},
                   {"actions_received", st.actions_received}, {"close_status", lib_->status_name(rc)}};
  read_anomalies();
  write_report(status);
  if (relay_) relay_->stop();
  say("report: " + (opt_.out_dir / "report.json").string() + ", " + (opt_.out_dir / "report.html").string());
  return status;
}

// The anomaly scores the policies published (org.diaspora.anomaly.predicted), read back from
// the events topic for the report's timeline: time since the start, score, series, task.
void Runner::read_anomalies() {
  if (spec_.policies.empty() || opt_.baseline_retry_after_s) return;
  const auto [ca, token] = relay_credentials();
  const std::string topic = events_topic();
  constexpr std::size_t kMax = 5000;
  try {
    read_topic(relay_url_, ca, token, topic, 30, [&](const json::object& e) {
      const json::value* type = e.if_contains("type");
      const json::value* data = e.if_contains("data");
      const json::value* time = e.if_contains("time");
      if (anomalies_.size() >= kMax || !type || !type->is_string() || type->get_string() != "org.diaspora.anomaly.predicted" ||
          !data || !data->is_object() || !time || !time->is_string())
        return;
      const auto tp = parse_rfc3339(std::string(time->get_string()));
      if (!tp) return;
      const auto us = std::chrono::duration_cast<std::chrono::microseconds>(tp->time_since_epoch()).count();
      if (us < start_us_) return;  // an earlier run's (a relay log shared between runs)
      json::object a{{"t_s", std::round(static_cast<double>(us - start_us_) / 1e3) / 1e3}};
      for (const char* k : {"score", "series", "detector", "explanation", "site"})
        if (const json::value* v = data->get_object().if_contains(k)) a[k] = *v;
      if (const json::value* v = data->get_object().if_contains("task_id")) a["task"] = *v;
      anomalies_.push_back(std::move(a));
    });
  } catch (const std::exception& e) {
    say(std::string("warning: the anomaly scores were not read back for the report: ") + e.what());
  }
}

void Runner::write_report(int exit_status) {
  auto opt_t = [](double t) { return t >= 0 ? json::value(std::round(t * 1000) / 1000) : json::value(nullptr); };
  json::object r;
  r["workflow"] = spec_.name;
  r["spec"] = spec_.file;
  r["mode"] = opt_.baseline_retry_after_s ? "baseline" : spec_.policies.empty() ? "no-policies" : "policies";
  if (opt_.baseline_retry_after_s) r["baseline_retry_after_s"] = *opt_.baseline_retry_after_s;
  r["started_us"] = start_us_;
  r["duration_s"] = opt_t(now());
  r["exit_status"] = exit_status;
  if (!stop_reason_.empty()) r["interrupted"] = stop_reason_;
  r["relay"] = relay_url_;
  r["plugin"] = json::object{{"library", lib_->path.string()}, {"version", lib_->library_version()}, {"stats", plugin_stats_}};
  json::array sites;
  for (const auto& s : sites_)
    sites.push_back(json::object{{"name", s.spec->name},
                                 {"workers", static_cast<std::int64_t>(s.slots.size())},
                                 {"speed", s.spec->speed},
                                 {"completed", s.completed},
                                 {"failed", s.failed}});
  r["sites"] = std::move(sites);
  r["anomalies"] = anomalies_;
  json::array insts;
  long completed = 0, failed = 0, cancelled = 0, misses = 0, with_deadline = 0, attempts = 0;
  for (const auto& inst : insts_) {
    const TaskSpec& ts = spec_.tasks[inst.task];
    json::object o{{"id", inst.id}, {"task", ts.name}, {"state", to_string(inst.state)},
                   {"submitted_s", opt_t(inst.submitted_t)}, {"end_s", opt_t(inst.end_t)}};
    if (!inst.reason.empty()) o["reason"] = inst.reason;
    if (inst.restored) o["restored"] = true;
    if (is_job(inst.task)) o["rehearsal"] = (job_dir(inst.task)).string();
    if (ts.deadline && !inst.restored) {
      ++with_deadline;
      const bool met = inst.state == InstState::completed && inst.end_t - inst.submitted_t <= ts.deadline->count();
      misses += !met;
      o["deadline_s"] = ts.deadline->count();
      o["deadline_met"] = met;
    }
    if (!inst.result.empty()) o["result"] = inst.result;
    json::array as;
    for (const auto& a : inst.attempts) {
      ++attempts;
      json::object x{{"number", a.number}, {"id", a.hook_id}, {"cause", a.cause}, {"outcome", a.outcome},
                     {"site", a.site}, {"start_s", opt_t(a.start_t)}, {"end_s", opt_t(a.end_t)}};
      if (a.slot >= 0) x["worker"] = a.site + "/worker-" + std::to_string(a.slot);
      if (!a.reason.empty()) x["reason"] = a.reason;
      if (a.speculative) x["speculative"] = true;
      as.push_back(std::move(x));
    }
    o["attempts"] = std::move(as);
    completed += inst.state == InstState::completed;
    failed += inst.state == InstState::failed;
    cancelled += inst.state == InstState::cancelled;
    insts.push_back(std::move(o));
  }
  r["instances"] = std::move(insts);
  json::array faults;
  std::vector<double> reactions;
  for (const auto& f : faults_) {
    json::object o{{"kind", to_string(f.spec->kind)}, {"at_s", f.spec->at.count()}, {"start_s", opt_t(f.start_t)},
                   {"end_s", opt_t(f.end_t)}};
    if (f.spec->site) o["site"] = *f.spec->site;
    if (f.spec->task) o["task"] = *f.spec->task;
    if (f.spec->kind == FaultKind::slow_site) o["factor"] = f.spec->factor;
    if (!f.target.empty()) o["target"] = f.target;
    if (!f.note.empty()) o["note"] = f.note;
    json::array hits;
    for (const auto& [ii, n] : f.hit) {
      const Instance& inst = insts_[static_cast<std::size_t>(ii)];
      json::object h{{"instance", inst.id}, {"state", to_string(inst.state)}};
      double recovered = -1;
      for (std::size_t k = n; k < inst.attempts.size(); ++k)
        if (inst.attempts[k].start_t >= 0 && (recovered < 0 || inst.attempts[k].start_t < recovered))
          recovered = inst.attempts[k].start_t;
      h["recovering_attempt_running_s"] = opt_t(recovered);
      h["reaction_s"] = recovered >= 0 ? opt_t(recovered - f.start_t) : json::value(nullptr);
      if (recovered >= 0) reactions.push_back(recovered - f.start_t);
      hits.push_back(std::move(h));
    }
    o["hit"] = std::move(hits);
    faults.push_back(std::move(o));
  }
  r["faults"] = std::move(faults);
  json::array acts;
  for (const auto& a : actions_)
    acts.push_back(json::object{{"id", a.id}, {"kind", a.kind}, {"task", a.task}, {"site", a.site}, {"target_site", a.target},
                                {"origin", a.origin}, {"reason", a.reason}, {"received_s", opt_t(a.received_t)},
                                {"done_s", opt_t(a.done_t)}, {"outcome", a.outcome}, {"message", a.message}});
  r["actions"] = std::move(acts);
  json::object rs{{"count", static_cast<std::int64_t>(reactions.size())}};
  if (!reactions.empty()) {
    rs["max_s"] = opt_t(*std::max_element(reactions.begin(), reactions.end()));
    double sum = 0;
    for (double x : reactions) sum += x;
    rs["mean_s"] = opt_t(sum / static_cast<double>(reactions.size()));
  }
  r["summary"] = json::object{{"instances", static_cast<std::int64_t>(insts_.size())},
                              {"completed", completed},
                              {"failed", failed},
                              {"cancelled", cancelled},
                              {"attempts", attempts},
                              {"with_deadline", with_deadline},
                              {"deadline_misses", misses},
                              {"actions", static_cast<std::int64_t>(actions_.size())},
                              {"reactions", std::move(rs)}};
  write_report_files(opt_.out_dir, r);
}

}  // namespace

void install_signal_handlers() {
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

int run_workflow(const SpecInput& input, const RunOptions& options, std::ostream& log) {
  Runner r(input, options, log);
  return r.run();
}

}  // namespace diaspora::run
