// What every part of a run reads about it: the spec (its rehearsal jobs appended as tasks),
// the options, the clock, the plugin's hooks, the log, the run's folders and relay, and
// whether the run is stopping. The runner owns it and fills it in as the run starts; the
// parts hold a reference.
//
// Thread safety: the runner thread.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include <boost/json/object.hpp>

#include "clock.hpp"
#include "diaspora/runner.hpp"
#include "diaspora/spec.hpp"
#include "hooks.hpp"
#include "item_outbox.hpp"

namespace diaspora::runner {

struct Context {
  Context(const WorkflowSpec& spec_, std::size_t first_job_, const RunOptions& opt_, const Clock& clock_, Hooks& hooks_,
          std::function<void(const std::string&)> say_)
      : spec(spec_), first_job(first_job_), opt(opt_), clock(clock_), hooks(hooks_), say(std::move(say_)) {}

  const WorkflowSpec& spec;  ///< tasks first_job.. are the spec's rehearsal jobs (rehearsal_jobs.hpp)
  std::size_t first_job = 0;
  const RunOptions& opt;
  const Clock& clock;
  Hooks& hooks;
  std::function<void(const std::string&)> say;  ///< one log line, stamped with the run's time

  std::filesystem::path data_dir, tasks_dir, ckpt_dir;  ///< OUT/data, OUT/tasks, OUT/checkpoints
  std::string relay_url;                                ///< set when the relay is up
  std::filesystem::path ca_file, token_file;            ///< its credentials (empty: none)
  std::string host;                                     ///< this host's name
  /// Each site with a relay of its own (sites[].relay): that relay as the plugin reads it
  /// (its files found from the spec's folder, the run's topic prefix). Set with the plugins.
  std::map<std::string, boost::json::object> site_relays;

  ItemOutbox* items = nullptr;  ///< puts the outputs of tasks with output: item (set once the plugin is open)

  std::int64_t started_us = 0;  ///< when t = 0 came, µs since the epoch
  bool started = false;     ///< t = 0 has come (the clock was reset): log lines before it are the setup's
  bool stopping = false;    ///< no new work: the run ends (a signal, or the end of the run)
  std::string stop_reason;  ///< why, when a signal stopped it

  double now() const { return clock.now(); }
  bool baseline() const { return opt.baseline_retry_after_s.has_value(); }
  const TaskSpec& task(std::size_t t) const { return spec.tasks[t]; }
  bool is_job(std::size_t t) const { return t >= first_job; }
  const RehearsalJobSpec& job_of(std::size_t t) const { return spec.rehearsal[t - first_job]; }
  std::filesystem::path job_dir(std::size_t t) const { return opt.out_dir / "rehearsal" / job_of(t).name; }
  /// The plugin spool of a site with a relay of its own: OUT/spool/site-<name> (the run's
  /// own plugin and the Slurm SPANK plugin of that site keep their engines' spools there).
  std::filesystem::path site_spool_dir(const std::string& site) const { return opt.out_dir / "spool" / ("site-" + site); }
  /// The workflow's topic prefix (relay.topic_prefix, else its name).
  std::string prefix() const { return spec.relay.topic_prefix.value_or(spec.name); }
  /// The topic the plugin publishes the workflow's events on.
  std::string events_topic() const { return prefix() + ".events"; }
  /// The topic a task's outputs go to as data items (output: item): "<prefix>.data.<task>".
  std::string data_topic(const std::string& task) const { return prefix() + ".data." + task; }
};

}  // namespace diaspora::runner
