// diaspora-train's job, shared by its translation units: the models, the task stream and
// the Job (trainer.cpp: setup, steps, evaluation, output; checkpoint.cpp: checkpoints and
// resume). The plugin link is plugin_link.hpp. Internal to the trainer (not installed).
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>
#include <time.h>
#include <unistd.h>


#include <boost/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cinttypes>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <sstream>
#include <stop_token>
#include <thread>

#include "diaspora/datasets.hpp"
#include "diaspora/files.hpp"
#include "diaspora/rehearsal.hpp"
#include "diaspora/scan_file.hpp"
#include "diaspora/thread_name.hpp"
#include "diaspora/trainer.hpp"
#include "plugin_link.hpp"
#include "random.hpp"

namespace diaspora::rehearsal {
namespace json = boost::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace detail {

class ScanFeed;
class CheckpointShipper;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// CPU seconds used so far by this process (every thread) or by the calling thread
/// (CLOCK_PROCESS_CPUTIME_ID / CLOCK_THREAD_CPUTIME_ID). Unlike wall time they do not count
/// the time another process had the core, so two jobs sharing one core are charged their own.
inline double cpu_seconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// ---- models ----------------------------------------------------------------------------

/// A model maps a batch of inputs to logits [B,10] or to (amplitude, phase) maps [B,2,n,n].
struct NetImpl : torch::nn::Module {
  virtual torch::Tensor forward(torch::Tensor x) = 0;
  /// The last layer's weight [classes, features] of a classifier; undefined otherwise.
  virtual torch::Tensor class_weights() { return {}; }
};

/// Small CNN for 28x28 images (LeNet-like): two 5x5 convolutions, each followed by group
/// normalisation and max-pooling, then two linear layers. About 1.1 M multiply-adds per
/// image. Group (not batch) normalisation: it has no running statistics, so a step's
/// output depends on its own samples only, every rank holds the same model, and training
/// and evaluation compute the same function. With it, and a cosine schedule, joint
/// training reaches 91 % in 5 epochs (Adam 0.002; at Fashion-MNIST's shipped 0.001 scratch
/// ends at 90.9-91.2 %: docs/rehearsal.md, "Models").
struct SmallCnn : NetImpl {
  torch::nn::Conv2d c1{nullptr}, c2{nullptr};
  torch::nn::GroupNorm n1{nullptr}, n2{nullptr};
  torch::nn::Linear f1{nullptr}, f2{nullptr};
  explicit SmallCnn(int classes) {
    c1 = register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 5).bias(false)));
    n1 = register_module("n1", torch::nn::GroupNorm(4, 16));
    c2 = register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5).bias(false)));
    n2 = register_module("n2", torch::nn::GroupNorm(8, 32));
    f1 = register_module("f1", torch::nn::Linear(32 * 4 * 4, 128));
    f2 = register_module("f2", torch::nn::Linear(128, classes));
  }
  torch::Tensor forward(torch::Tensor x) override {
    x = torch::max_pool2d(torch::relu(n1->forward(c1->forward(x))), 2);
    x = torch::max_pool2d(torch::relu(n2->forward(c2->forward(x))), 2);
    return f2->forward(torch::relu(f1->forward(x.flatten(1))));
  }
  torch::Tensor class_weights() override { return f2->weight; }
};

/// PtychoNN-style network: a convolutional encoder (three conv + max-pool stages) and two
/// decoders (three conv + 2x upsampling stages each) for amplitude (sigmoid, in [0,1]) and
/// phase (pi * tanh, in [-pi, pi]). Input [B,1,n,n], output [B,2,n,n]; n a multiple of 8.
struct PtychoNet : NetImpl {
  torch::nn::Sequential encoder{nullptr}, amp{nullptr}, phase{nullptr};
  static torch::nn::Conv2d conv(int in, int out) {
    return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1));
  }
  static torch::nn::Sequential decoder() {
    auto up = [] {
      return torch::nn::Upsample(
          torch::nn::UpsampleOptions().scale_factor(std::vector<double>{2.0, 2.0}).mode(torch::kNearest));
    };
    return torch::nn::Sequential(conv(64, 32), torch::nn::ReLU(), up(), conv(32, 16), torch::nn::ReLU(), up(),
                                 conv(16, 8), torch::nn::ReLU(), up(), conv(8, 1));
  }
  PtychoNet() {
    auto pool = [] { return torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)); };
    encoder = register_module("encoder", torch::nn::Sequential(conv(1, 16), torch::nn::ReLU(), pool(), conv(16, 32),
                                                               torch::nn::ReLU(), pool(), conv(32, 64),
                                                               torch::nn::ReLU(), pool()));
    amp = register_module("amplitude", decoder());
    phase = register_module("phase", decoder());
  }
  torch::Tensor forward(torch::Tensor x) override {
    auto z = encoder->forward(x);
    return torch::cat({torch::sigmoid(amp->forward(z)), M_PI * torch::tanh(phase->forward(z))}, 1);
  }
};

// ---- the task stream -------------------------------------------------------------------

struct TaskData {
  torch::Tensor x;  // inputs [N,1,h,w]
  torch::Tensor y;  // Long [N] labels, or Float [N,2,n,n] targets
};

struct Stream {
  bool classification = true;
  std::vector<TaskData> train, test;
  std::vector<std::int64_t> output_sizes;  // per-sample model output shape
  torch::Tensor weight;                     // ptycho: illumination_weight(probe), [n,n]
};

torch::Tensor first_rows(const torch::Tensor& t, std::int64_t limit);

Stream load_stream(const TrainerConfig& cfg);

/// ptycho-stream: appends one scan file's samples to `s` (inputs: its patterns; targets: the
/// normalised reconstruction's patches; every test_every-th position held out). `name`
/// names the file in errors. @throws RehearsalError.
void add_scan(Stream& s, const ScanFile& scan, const DatasetConfig& d, const std::string& name);

/// A row of the metric matrix as JSON: a value not measured (NaN: a ptycho-stream scan that
/// had not arrived) is null, and reads back as NaN (parse_manifest, manifest.hpp).
inline json::value row_json(const std::vector<double>& row) {
  json::array a;
  for (double v : row) a.push_back(std::isnan(v) ? json::value(nullptr) : json::value(v));
  return a;
}

SampleLayout buffer_layout(const Stream& s, const TrainerConfig& cfg);

// ---- files ---------------------------------------------------------------------------------

std::string read_text(const fs::path& file);

// The task's loss: cross-entropy, or (ptycho) the mean ptycho_error over the batch.
torch::Tensor task_loss(const Stream& s, const torch::Tensor& out, const torch::Tensor& y);
// What the accuracy (error) matrix holds; kept in checkpoint manifests.
const char* metric_name(const Stream& s);

// ---- the job -------------------------------------------------------------------------------

/// Position in the stream: the next step trains batch `batch` of epoch `epoch` of task `task`.
struct Position {
  int task = 0;
  int epoch = 0;
  std::int64_t batch = 0;
  std::int64_t step = 0;  // global step count (also the sampler's step)
};

/// A checkpoint whose files are being written by a background thread (`dsp-checkpoint`):
/// the step's state was captured at the step boundary (serialised model and optimizer,
/// copies of the buffer and of the drawn representatives), so training goes on while the
/// rank file is serialised, written and fsynced. It is complete once every rank's file is
/// durable and rank 0 has written the manifest and LATEST (Job::poll_checkpoint).
struct PendingCheckpoint {
  std::string name;      // "ckpt-<step>"
  std::string manifest;  // rank 0: the manifest's text
  std::atomic<bool> done{false};
  std::exception_ptr error;  // set by the writer before done
  std::jthread writer;
};

class Job {
 public:
  Job(const TrainerConfig& cfg, const RankOptions& opt);
  ~Job();  // out of line: ScanFeed and CheckpointShipper are complete in trainer.cpp only
  int run();

 private:
  // setup
  void setup_groups();
  void build_model();
  double align_weights(int task);
  torch::Tensor logit_prior(const torch::Tensor& labels, int task) const;
  void make_optimizer();
  void schedule_lr(std::int64_t steps_per_epoch);
  json::object stream_identity() const;
  void flush_insertions(const char* where);
  void drop_metrics_after(std::int64_t step);
  void setup();
  int train();
  template <class Open>
  void load_rank_files(Open& open, int old_world);
  std::int64_t task_samples(int task) const;
  // ptycho-stream: loads the scans of tasks up to `upto`, waiting for them; false when a stop
  // was requested first. Other datasets: true (everything is loaded by setup).
  bool ensure_tasks(int upto);
  std::int64_t steps_per_epoch(int task) const { return steps_per_epoch_at(task, world_); }
  std::int64_t steps_per_epoch_at(int task, int world) const;
  torch::Tensor epoch_order(int task, int epoch) const;
  const TaskData& task_data(int task);
  // training
  double train_step(const torch::Tensor& idx, int task);
  void allreduce_grads();
  // Runs one of the trainer's own all-reduces over the ranks (`what` names it); a failure
  // (a rank ended, the network between the ranks dropped, sampling.timeout passed) is
  // rethrown as a RehearsalError naming the step and the collective.
  void all_reduce(const char* what, std::vector<torch::Tensor>& values,
                  const c10d::AllreduceOptions& options = c10d::AllreduceOptions());
  void update_ema();
  std::vector<double> evaluate();
  int agree_stop(int local);
  std::vector<std::int64_t> over_ranks(std::vector<std::int64_t> values, c10d::ReduceOp op);
  std::vector<std::int64_t> max_over_ranks(std::vector<std::int64_t> values) {
    return over_ranks(std::move(values), c10d::ReduceOp::MAX);
  }
  // checkpoints
  fs::path checkpoint_root() const;
  void save_checkpoint(const std::string& why, bool background = false);
  void finish_checkpoint();
  void poll_checkpoint(int max_state);
  // Rank 0, once checkpoint `name` is published: with checkpoint.item_topic, puts it as a
  // data item and says its URI (the log, diaspora run's progress channel). A relay that
  // refuses or stays away is said in the log; the job goes on (the checkpoint is on disk).
  void checkpoint_published(const std::string& name);
  int checkpoint_state() const;
  void load_checkpoint(const fs::path& from);
  // output
  void log_step(double loss, double step_s, double cpu_s, double wait_s, std::int64_t reps);
  void report_evaluation(const std::vector<double>& row, double average);
  // One write of whole lines on diaspora run's progress channel (docs/run.md), when there
  // is one; ignored if it fails, and none after its reader has gone (EPIPE).
  void tell_progress(std::string_view lines);
  void write_summary();
  void barrier();

  const TrainerConfig& cfg_;
  const RankOptions& opt_;
  int rank_ = 0, world_ = 1;
  Stream data_;
  TaskData scratch_;      // scratch: tasks 0..scratch_task_ concatenated
  int scratch_task_ = -1;
  std::shared_ptr<NetImpl> model_;
  std::shared_ptr<NetImpl> ema_;  // train.ema > 0: the averaged weights that are evaluated
  std::int64_t ema_updates_ = 0;
  std::unique_ptr<torch::optim::Optimizer> optim_;
  double base_lr_ = 0;  // train.lr or the optimizer's default
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroup> train_group_, sampler_group_;
  std::unique_ptr<RehearsalBuffer> buffer_;
  std::unique_ptr<AsyncInserter> inserter_;
  std::unique_ptr<GlobalSampler> sampler_;
  Position pos_;
  std::vector<std::vector<double>> matrix_;  // metric on task j after task i
  double elapsed_before_ = 0;                // runtime of earlier segments (resume)
  Clock::time_point started_;
  double cpu_before_ = 0;   // CPU seconds of earlier segments (resume; 0 from older checkpoints)
  double cpu_started_ = 0;  // the process's CPU seconds when this segment started
  // The job's wall and CPU seconds so far, earlier segments included (summary, checkpoints).
  double runtime_so_far() const { return elapsed_before_ + seconds_since(started_); }
  double cpu_so_far() const { return cpu_before_ + cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu_started_; }
  std::ofstream metrics_;
  std::unique_ptr<PluginLink> plugin_;
  double sum_step_s_ = 0, sum_wait_s_ = 0;
  std::int64_t steps_here_ = 0, samples_here_ = 0;
  std::string resumed_from_;
  std::unique_ptr<PendingCheckpoint> pending_;  // a background checkpoint not yet complete
  std::int64_t buffer_capacity_ = 0;            // slots of the buffers over all ranks
  std::unique_ptr<ScanFeed> feed_;              // ptycho-stream's source
  std::unique_ptr<CheckpointShipper> shipper_;  // checkpoint.item_topic (rank 0)
  int progress_fd_ = -1;                        // DIASPORA_PROGRESS_FD (rank 0 under diaspora run)
  bool checkpoint_asked_ = false;               // a rank got SIGUSR1: checkpoint at this step
};

}  // namespace detail
}  // namespace diaspora::rehearsal
