#include "remote_sites.hpp"

#include <signal.h>

#include <boost/json/serialize.hpp>

#include "diaspora/event.hpp"
#include "diaspora/files.hpp"

namespace diaspora::runner {

namespace fs = std::filesystem;
namespace json = boost::json;

// The spec the Slurm SPANK plugin of `site` opens (`sbatch --diaspora=`): this run's, with
// the relay named explicitly (slurmstepd sees neither the embedded relay nor the runner's
// environment): the site's own relay when it has one (sites federated: its jobs' events go
// where its attempts' go, with the site's spool), else the run's.
fs::path RemoteSites::write_spank_spec(const json::value& document, const std::string& site) {
  json::value doc = document;
  json::object& root = doc.get_object();
  json::object& plugin = root["plugin"].is_object() ? root["plugin"].get_object() : (root["plugin"] = json::object{}).get_object();
  fs::path file = ctx_.opt.out_dir / "engines" / "slurm-spec.yaml";
  if (auto own = ctx_.site_relays.find(site); own != ctx_.site_relays.end()) {
    root["relay"] = own->second;
    plugin["spool_dir"] = ctx_.site_spool_dir(site).string();
    file = ctx_.opt.out_dir / "engines" / ("slurm-spec-" + site + ".yaml");
  } else {
    json::object& relay = root["relay"].is_object() ? root["relay"].get_object() : (root["relay"] = json::object{}).get_object();
    relay["url"] = ctx_.relay_url;
    if (!ctx_.ca_file.empty()) relay["ca_file"] = fs::absolute(ctx_.ca_file).string();
    if (!ctx_.token_file.empty()) relay["token_file"] = fs::absolute(ctx_.token_file).string();
    relay.erase("data_dir");
    plugin["spool_dir"] = (ctx_.opt.out_dir / "spool").string();
  }
  file = fs::absolute(file);
  fs::create_directories(file.parent_path());
  write_file_atomic(file, json::serialize(doc) + "\n", 0600, Durability::file);
  return file;
}

void RemoteSites::start(const json::value& document) {
  std::string bind = "127.0.0.1";
  for (const auto& s : sites_.all()) {
    const SiteSpec& ss = *s.spec;
    if (ss.engine == Engine::dask && ss.endpoint && ss.endpoint->starts_with("tcp://")) {
      const std::string hp = ss.endpoint->substr(6);
      if (const std::string a = local_address_towards(hp.substr(0, hp.rfind(':'))); !a.starts_with("127.")) bind = a;
    }
  }
  for (auto& s : sites_.all()) {
    if (s.spec->engine == Engine::local) continue;
    if (!listener_) listener_ = std::make_unique<WorkerListener>(bind);
    LaunchContext lc;
    lc.out_dir = ctx_.opt.out_dir;
    auto spank = s.spec->attributes.find("spank");
    if (s.spec->engine == Engine::slurm && !(spank != s.spec->attributes.end() && spank->second.is_bool() && !spank->second.get_bool()))
      lc.spank_spec = write_spank_spec(document, s.name());
    ctx_.say("site " + s.name() + ": starting its " + std::string(to_string(s.spec->engine)) + " launcher");
    s.launcher = make_launcher(*s.spec, lc);
    for (auto& slot : s.slots) slot.ready = true;  // a launch per attempt: a slot is free until used
  }
}

std::vector<int> RemoteSites::fds() const { return listener_ ? listener_->fds() : std::vector<int>{}; }

bool RemoteSites::launch(int ii, int ai, Site& s, Slot& slot, json::object run) {
  const Attempt& a = store_.attempt(ii, ai);
  slot.key = make_uuid();
  slot.connected = false;
  slot.pending_run = std::move(run);
  const std::string name = a.hook_id + "." + std::to_string(a.number);
  try {
    s.launcher->launch(slot.key, name, {self_executable().string(), "__worker", "--connect", listener_->address(), "--key", slot.key},
                       {"DIASPORA_SITE=" + s.name(), "DIASPORA_WORKER=" + std::to_string(slot.index)});
  } catch (const std::exception& e) {
    slot.inst = slot.att = -1;
    slot.key.clear();
    slot.pending_run = {};
    lifecycle_.ended(ii, ai, false, "site " + s.name() + ": " + e.what());
    return false;
  }
  ctx_.say("launch " + name + " on " + worker_name(s.name(), slot.index) + " through " + s.launcher->describe() + " (" +
           a.cause + ")");
  return true;  // started when its worker connects and says ready (on_ready)
}

void RemoteSites::on_ready(Site& s, Slot& slot) {
  if (!slot.connected || slot.inst < 0 || slot.pending_run.empty()) return;
  const json::object run = std::exchange(slot.pending_run, {});
  lifecycle_.announce_start(slot.inst, slot.att, s, slot, false);
  if (!slot.ch.send(run)) return lost(s, slot, "its connection closed before the task was sent");
  if (s.stopped_phase) signal(slot, SIGSTOP);
  lifecycle_.announce_start(slot.inst, slot.att, s, slot, true);
}

void RemoteSites::signal(const Slot& slot, int sig) {
  if (slot.same_host && slot.remote_pid > 0) ::kill(slot.remote_pid, sig);
}

void RemoteSites::service() {
  if (!listener_) return;
  for (Hello& h : listener_->service()) on_hello(std::move(h));
}

// A remote worker connected: it belongs to the launch out for a slot's attempt, or it is
// late (the attempt was stopped, or the engine ran the launch twice) and is sent away. The
// lines that came with the hello ("ready") are the caller's to read (Workers::read).
void RemoteSites::on_hello(Hello h) {
  for (auto& s : sites_.all())
    for (auto& slot : s.slots) {
      if (!s.remote() || slot.key != h.key || slot.connected || slot.inst < 0) continue;
      slot.ch = std::move(h.ch);
      slot.connected = true;
      slot.remote_pid = h.pid;
      slot.engine_pid = h.engine_pid;
      slot.same_host = h.host == ctx_.host;
      s.launcher->connected(slot.key);
      if (on_connect) on_connect(s, slot);
      return;
    }
  h.ch.close();  // the worker exits: nothing for it
}

// The slot's launch is over (its attempt ended or was stopped): the connection closes (the
// worker exits) and the engine lets go of it.
void RemoteSites::release(Site& s, Slot& slot) {
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
void RemoteSites::lost(Site& s, Slot& slot, const std::string& why) {
  const int ii = slot.inst, ai = slot.att;
  release(s, slot);
  if (ii < 0) return;
  slot.inst = slot.att = -1;
  if (!slot.pending_checkpoint.empty()) actions_.acknowledge(std::exchange(slot.pending_checkpoint, ""), false, "the worker died: " + why);
  lifecycle_.ended(ii, ai, false, "worker " + worker_name(s.name(), slot.index) + " died (" + why + ")", true);
}

void RemoteSites::tick() {
  for (auto& s : sites_.all()) {
    if (!s.remote()) continue;
    for (const LaunchEnded& e : s.launcher->poll())
      for (auto& slot : s.slots)
        if (slot.key == e.key && !slot.connected && slot.inst >= 0) {
          const int ii = slot.inst, ai = slot.att;
          release(s, slot);
          slot.inst = slot.att = -1;
          lifecycle_.ended(ii, ai, false, "site " + s.name() + ": " + e.reason);
        }
  }
}

void RemoteSites::stop(Site& s, Slot& slot) {  // the worker is told, killed when on this host, and its launch withdrawn
  if (slot.connected) slot.ch.send({{"op", "cancel"}});
  signal(slot, SIGKILL);
  signal(slot, SIGCONT);
  release(s, slot);
}

void RemoteSites::pause(Site&, Slot& slot, bool paused) { signal(slot, paused ? SIGSTOP : SIGCONT); }

// The engine's worker process (a Dask worker; its nanny starts another) or the job's
// worker; a worker on another host, or one not connected yet, is out of reach.
std::string RemoteSites::kill_worker(Site&, Slot& slot) {
  const pid_t victim = slot.engine_pid > 0 ? slot.engine_pid : slot.remote_pid;
  if (!slot.same_host || victim <= 0) return "the attempt's worker is not on this host (or not started yet): no effect";
  ::kill(victim, SIGKILL);
  return "";
}

void RemoteSites::shutdown() {
  for (auto& s : sites_.all())
    if (s.remote()) s.launcher->shutdown(15);  // a LocalCluster stops, Slurm jobs still out are cancelled
}

}  // namespace diaspora::runner
