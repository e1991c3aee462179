#include "rehearsal_jobs.hpp"

#include <signal.h>

#include <boost/json/serialize.hpp>

#include "diaspora/data_item.hpp"
#include "diaspora/error.hpp"
#include "diaspora/event.hpp"  // format_rfc3339_us
#include "diaspora/files.hpp"
#include "diaspora/json_exact.hpp"

namespace diaspora::runner {

namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

constexpr const char* kCheckpointItemFile = "checkpoint-item";  // the newest checkpoint item's URI

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

}  // namespace

WorkflowSpec RehearsalJobs::with_job_tasks(WorkflowSpec spec) {
  for (const auto& j : spec.rehearsal) {
    TaskSpec t;  // one instance, run as a command (argv()) on the job's site if it names one
    t.name = j.name;
    t.count = 1;
    t.resources.cpus = static_cast<double>(j.world_size);
    if (j.site) t.preferred_sites = {*j.site};
    t.location = j.location;
    spec.tasks.push_back(std::move(t));
  }
  return spec;
}

std::vector<std::string> RehearsalJobs::argv(std::size_t task) {
  const RehearsalJobSpec& j = ctx_.job_of(task);
  const fs::path dir = ctx_.job_dir(task);
  fs::create_directories(dir);
  const fs::path bin = trainer_executable();
  if (bin.empty())
    throw Error("diaspora-train is not next to diaspora-run (" + self_executable().parent_path().string() +
                "): build with DIASPORA_WITH_TORCH=ON");
  std::vector<std::string> argv{bin.string(), "--out", dir.string()};
  auto set = [&](const std::string& key, const std::string& value) {
    argv.push_back("--set");
    argv.push_back(key + "=" + value);
  };
  if (j.config) {
    argv.insert(argv.begin() + 1, {"--config", (base_dir_ / *j.config).string()});
  } else {  // no file to ship to the job's site: the trainer's defaults, one thread, a report every 5 steps
    set("train.threads", "1");
    set("train.log_every", "5");
  }
  set("strategy", j.strategy);
  set("dataset.name", j.dataset);
  if (j.buffer_size) set("buffer_size", std::to_string(*j.buffer_size));
  if (j.stream) {
    long total = 0;
    for (const auto& ts : ctx_.spec.tasks)
      if (ts.name == *j.stream) total = instances_of(ts);
    set("dataset.relay", ctx_.relay_url);
    set("dataset.topic", ctx_.events_topic());
    set("dataset.stream", *j.stream);
    set("dataset.scan_dir", (ctx_.data_dir / *j.stream).string());  // this run's scans only
    set("dataset.ca_file", ctx_.ca_file.string());
    set("dataset.token_file", ctx_.token_file.string());
    set("dataset.tasks", std::to_string(total));
    for (const auto& ts : ctx_.spec.tasks)
      if (ts.name == *j.stream && ts.output == TaskSpec::Output::item) {  // scans through the relay, no shared folder
        set("dataset.item_topic", ctx_.data_topic(*j.stream));
        if (!ctx_.opt.resume) set("dataset.since", format_rfc3339_us(ctx_.started_us));  // not an earlier run's
      }
  }
  for (const auto& [key, value] : j.set) set(key, value.is_string() ? std::string(value.get_string()) : json::serialize(value));
  if (j.world_size > 1) {
    argv.push_back("--world-size");
    argv.push_back(std::to_string(j.world_size));
  }
  if (j.checkpoints == RehearsalJobSpec::Checkpoints::item) {  // each checkpoint put on the relay: no shared folder
    set("checkpoint.item_topic", ctx_.data_topic(j.name));
    set("checkpoint.relay", ctx_.relay_url);
    set("checkpoint.ca_file", ctx_.ca_file.string());
    set("checkpoint.token_file", ctx_.token_file.string());
    if (fs::exists(dir / kCheckpointItemFile)) {
      argv.push_back("--resume-item");
      argv.push_back(trim(read_file(dir / kCheckpointItemFile)));
    }
  } else if (fs::exists(dir / "checkpoint" / "LATEST")) {
    argv.push_back("--resume");
    argv.push_back(dir.string());
  }
  return argv;
}

void RehearsalJobs::take_checkpoint_item(const Instance& inst, const std::string& uri) {
  if (!ctx_.is_job(inst.task)) return;
  const RehearsalJobSpec& j = ctx_.job_of(inst.task);
  const auto at = data::parse_item_uri(uri);
  if (j.checkpoints != RehearsalJobSpec::Checkpoints::item || !at || at->topic != ctx_.data_topic(j.name))
    return ctx_.say("warning: " + inst.id + " said it put a checkpoint at " + uri +
                    ", which is not on its checkpoint topic " + ctx_.data_topic(j.name) + " (checkpoints: item): ignored");
  try {
    write_file_atomic(ctx_.job_dir(inst.task) / kCheckpointItemFile, uri + "\n");
  } catch (const std::exception& e) {
    ctx_.say("warning: " + inst.id + ": its checkpoint " + uri + " could not be noted (" + e.what() +
             "): its next attempt starts from an older one");
  }
}

void RehearsalJobs::take_summary(Instance& inst) {
  const fs::path file = ctx_.job_dir(inst.task) / "summary.json";
  if (!inst.result.empty() && !fs::exists(file)) return;  // said on the progress channel; its folder is at its site
  try {
    if (const json::value v = parse_json_exact(read_file(ctx_.job_dir(inst.task) / "summary.json")); v.is_object())
      inst.result = v.get_object();
  } catch (const std::exception& e) {
    ctx_.say("warning: " + inst.id + ": summary.json unreadable: " + e.what());
  }
}

void RehearsalJobs::tick() {
  const double t = ctx_.now();
  for (auto& s : sites_.all())  // checkpoint_every: SIGUSR1 (the trainer checkpoints at its next step and goes on)
    for (auto& slot : s.slots) {
      if (slot.cmd_pid <= 0 || slot.inst < 0 || slot.draining_inst >= 0) continue;
      const Instance& inst = store_.at(slot.inst);
      const Attempt& a = store_.attempt(slot.inst, slot.att);
      if (!ctx_.is_job(inst.task) || !ctx_.job_of(inst.task).checkpoint_every || a.progress <= 0) continue;
      const double every = ctx_.job_of(inst.task).checkpoint_every->count();
      if (slot.next_checkpoint <= 0) slot.next_checkpoint = t + every;
      if (t < slot.next_checkpoint) continue;
      signal_group(slot.cmd_pid, SIGUSR1);
      slot.next_checkpoint = t + every;
    }
  for (auto& s : sites_.all())  // a job that does not stop when told: killed (it resumes from its last checkpoint)
    for (auto& slot : s.slots)
      if (slot.draining_inst >= 0 && t > slot.drain_deadline && slot.cmd_pid > 0) {
        ctx_.say("rehearsal job " + store_.at(slot.draining_inst).id + " did not stop within " +
                 std::to_string(static_cast<int>(ctx_.opt.job_drain_s)) + " s of SIGTERM: killed");
        signal_group(slot.cmd_pid, SIGKILL);
        slot.drain_deadline = t + 3600;
      }
  // A job trained on a stream waits for every scan: when the stream has ended and one of its
  // instances failed for good, the job can never finish. It is stopped (checkpointed) and failed.
  for (int ii = 0; ii < store_.size(); ++ii) {
    const Instance& inst = store_.at(ii);
    if (!ctx_.is_job(inst.task) || !ctx_.job_of(inst.task).stream || inst.final()) continue;
    const std::string& source = *ctx_.job_of(inst.task).stream;
    bool open = streams_.making(source);
    std::string lost;
    for (const auto& x : store_.all()) {
      if (ctx_.task(x.task).name != source) continue;
      open |= !x.final();
      if (x.state == InstanceState::failed || x.state == InstanceState::cancelled) lost = x.id;
    }
    if (open || lost.empty()) continue;
    const std::string why = "its stream '" + source + "' lost scan " + lost + " (" +
                            std::string(to_string(store_.at(store_.index_of(lost)).state)) +
                            "); the job was stopped at its last checkpoint";
    for (int ai = 0; ai < static_cast<int>(inst.attempts.size()); ++ai) lifecycle_.stop(ii, ai, Outcome::stopped, why, false);
    lifecycle_.finish(ii, InstanceState::failed, why);
  }
}

}  // namespace diaspora::runner
