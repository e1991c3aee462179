// The spec's rehearsal jobs (`rehearsal:`): each is one instance of a task appended to the
// spec's tasks, run as `diaspora-train` on its site (a command of its own, SIGTERM when the
// runner dies: it checkpoints). A job checkpoints every `checkpoint_every` (SIGUSR1), is
// killed when it does not stop within --job-drain of SIGTERM, and is stopped and failed
// when the stream it trains on has lost a scan for good.
//
// Thread safety: the runner thread.
#pragma once

#include <string>
#include <vector>

#include "context.hpp"
#include "lifecycle.hpp"
#include "sites.hpp"
#include "store.hpp"
#include "streams.hpp"

namespace diaspora::runner {

class RehearsalJobs {
 public:
  RehearsalJobs(Context& ctx, InstanceStore& store, Sites& sites, Lifecycle& lifecycle, const Streams& streams,
                const std::filesystem::path& base_dir)
      : ctx_(ctx), store_(store), sites_(sites), lifecycle_(lifecycle), streams_(streams), base_dir_(base_dir) {}

  /// `spec` with one task per rehearsal job appended (one instance, its site preferred);
  /// the first of them is at index spec.tasks.size() before the call.
  static WorkflowSpec with_job_tasks(WorkflowSpec spec);

  /// diaspora-train's command line for the job of `task`: the spec's config (or a small
  /// one written here), the job's keys as --set, ptycho-stream's relay and stream, and
  /// --resume when the job has a checkpoint (an earlier attempt, a migration, a resumed
  /// run): with `checkpoints: item`, --resume-item and the newest checkpoint item's URI. Throws diaspora::Error (no diaspora-train next to diaspora-run) or a
  /// filesystem error (the job folder cannot be made).
  std::vector<std::string> argv(std::size_t task);
  /// The trainer's summary.json becomes the job instance's result (a warning when unreadable,
  /// unless the trainer said its result on the progress channel: its folder is at its site).
  void take_summary(Instance& inst);
  /// A job with `checkpoints: item` said it put a checkpoint at `uri` (its progress
  /// channel): kept in OUT/rehearsal/JOB/checkpoint-item, where argv() finds it for the next
  /// attempt (or a resumed run). A URI off the job's own data topic, or from a job without
  /// `checkpoints: item`, is ignored with a warning. A file that cannot be written: a warning.
  void take_checkpoint_item(const Instance& inst, const std::string& uri);
  /// checkpoint_every, the drain deadline, and jobs whose stream lost a scan.
  void tick();

 private:
  Context& ctx_;
  InstanceStore& store_;
  Sites& sites_;
  Lifecycle& lifecycle_;
  const Streams& streams_;
  std::filesystem::path base_dir_;
};

}  // namespace diaspora::runner
