// diaspora-train's engine: models, the task stream, the strategies, data-parallel steps
// with the distributed rehearsal buffer, checkpoint/resume, metrics and the plugin.
// The only translation unit of the trainer that includes <torch/torch.h> (slow to compile).
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>
#include <unistd.h>


#include <boost/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
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
#include "diaspora/plugin.h"
#include "diaspora/rehearsal.hpp"
#include "diaspora/thread_name.hpp"
#include "diaspora/trainer.hpp"
#include "plot.hpp"
#include "random.hpp"

namespace diaspora::rehearsal {
namespace json = boost::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- models ----------------------------------------------------------------------------

/// A model maps a batch of inputs to logits [B,10] or to (amplitude, phase) maps [B,2,n,n].
struct NetImpl : torch::nn::Module {
  virtual torch::Tensor forward(torch::Tensor x) = 0;
};

/// Small CNN for 28x28 images (LeNet-like): two 5x5 convolutions with max-pooling, two
/// linear layers. About 1.1 M multiply-adds per image.
struct SmallCnn : NetImpl {
  torch::nn::Conv2d c1{nullptr}, c2{nullptr};
  torch::nn::Linear f1{nullptr}, f2{nullptr};
  explicit SmallCnn(int classes) {
    c1 = register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 5)));
    c2 = register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5)));
    f1 = register_module("f1", torch::nn::Linear(32 * 4 * 4, 128));
    f2 = register_module("f2", torch::nn::Linear(128, classes));
  }
  torch::Tensor forward(torch::Tensor x) override {
    x = torch::max_pool2d(torch::relu(c1->forward(x)), 2);
    x = torch::max_pool2d(torch::relu(c2->forward(x)), 2);
    return f2->forward(torch::relu(f1->forward(x.flatten(1))));
  }
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

torch::Tensor first_rows(const torch::Tensor& t, std::int64_t limit) {
  return limit > 0 && t.size(0) > limit ? t.narrow(0, 0, limit) : t;
}

Stream load_stream(const TrainerConfig& cfg) {
  const DatasetConfig& d = cfg.dataset;
  Stream s;
  if (d.name == "fashion-mnist") {
    const FashionMnist train = load_fashion_mnist(d.dir, true);
    const FashionMnist test = load_fashion_mnist(d.dir, false);
    auto tr = class_incremental_split(train.labels, d.tasks, d.classes_per_task);
    auto te = class_incremental_split(test.labels, d.tasks, d.classes_per_task);
    for (int t = 0; t < d.tasks; ++t) {
      auto ti = first_rows(tr[static_cast<std::size_t>(t)].indices, d.train_per_task);
      auto vi = first_rows(te[static_cast<std::size_t>(t)].indices, d.test_per_task);
      s.train.push_back({train.images.index_select(0, ti), train.labels.index_select(0, ti)});
      s.test.push_back({test.images.index_select(0, vi), test.labels.index_select(0, vi)});
    }
    s.output_sizes = {kFashionMnistClasses};
    return s;
  }
  s.classification = false;
  PtychoConfig pc;
  pc.patch = d.patch;
  pc.object_size = d.object_size;
  pc.step = d.scan_step;
  pc.photons = d.photons;
  const double curvature = pc.probe_curvature;
  for (int t = 0; t < d.tasks; ++t) {
    pc.probe_curvature = curvature * (1 + d.probe_drift * t);  // dataset.probe_drift: a defocus that drifts
    PtychoScan scan = simulate_ptycho(pc, t, cfg.seed);
    const std::int64_t p = scan.diffraction.size(0);
    std::vector<std::int64_t> tr, te;
    for (std::int64_t i = 0; i < p; ++i) (i % d.test_every == 0 ? te : tr).push_back(i);
    auto ti = first_rows(torch::tensor(tr), d.train_per_task);
    auto vi = first_rows(torch::tensor(te), d.test_per_task);
    auto target = torch::cat({scan.amplitude, scan.phase}, 1);
    // |probe|^2 is the same for every task (a drift changes only the probe's phase).
    if (t == 0) s.weight = illumination_weight(scan.probe);
    s.train.push_back({scan.diffraction.index_select(0, ti), target.index_select(0, ti)});
    s.test.push_back({scan.diffraction.index_select(0, vi), target.index_select(0, vi)});
  }
  s.output_sizes = {2, d.patch, d.patch};
  return s;
}

SampleLayout buffer_layout(const Stream& s, const TrainerConfig& cfg) {
  auto spec = [](const torch::Tensor& t) {
    TensorSpec ts;
    ts.dtype = t.scalar_type();
    ts.sizes.assign(t.sizes().begin() + 1, t.sizes().end());
    return ts;
  };
  SampleLayout l;
  l.tensors = {spec(s.train[0].x), spec(s.train[0].y)};
  if (cfg.stores_outputs()) l.outputs = TensorSpec{c10::ScalarType::Float, s.output_sizes};
  return l;
}

// ---- files ---------------------------------------------------------------------------------

std::string read_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw RehearsalError("cannot read " + file.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- the plugin (rank 0) ----------------------------------------------------------------

/// Reports the job as one task through the plugin's C ABI and turns actions into stop codes.
class PluginLink {
 public:
  PluginLink(const TrainerConfig& cfg, bool resumed) : task_(cfg.plugin_task_id), site_(cfg.plugin_site) {
    if (cfg.plugin_spec.empty()) return;
    char err[1024] = {0};
    if (int rc = diaspora_open_file(cfg.plugin_spec.c_str(), &p_, err, sizeof err); rc != DIASPORA_OK)
      throw RehearsalError("plugin: cannot open with " + cfg.plugin_spec + ": " + err);
    diaspora_task_info i = info();
    i.name = "diaspora-train";
    i.attempt = resumed ? 2 : 1;
    diaspora_task_submitted(p_, &i);
    diaspora_task_started(p_, &i);
  }
  ~PluginLink() {
    if (p_) diaspora_close(p_, 5000);
  }
  PluginLink(const PluginLink&) = delete;
  PluginLink& operator=(const PluginLink&) = delete;

  bool active() const { return p_ != nullptr; }

  void progress(std::int64_t step, double fraction, const std::vector<diaspora_metric_value>& metrics) {
    if (!p_) return;
    diaspora_task_info i = info();
    i.step = step;
    i.progress = std::clamp(fraction, 0.0, 1.0);
    i.metrics = metrics.data();
    i.metric_count = metrics.size();
    diaspora_task_progress(p_, &i);
  }

  /// Polls waiting actions: returns the stop code of the first one for this task
  /// (kTrainCheckpointed, kTrainMigrate, kTrainCancelled) or 0; others are refused.
  int poll() {
    if (!p_) return 0;
    diaspora_action a{};
    a.struct_size = sizeof a;
    while (diaspora_poll_action(p_, &a) == DIASPORA_OK) {
      if (a.task_id[0] != '\0' && task_ != a.task_id) {
        diaspora_action_failed(p_, a.id, "diaspora-train runs only its own task");
        continue;
      }
      int code = 0;
      switch (a.kind) {
        case DIASPORA_ACTION_CHECKPOINT: code = kTrainCheckpointed; break;
        case DIASPORA_ACTION_MIGRATE: code = kTrainMigrate; break;
        case DIASPORA_ACTION_CANCEL: code = kTrainCancelled; break;
        case DIASPORA_ACTION_RESTART: code = kTrainCheckpointed; break;  // checkpoint; the engine restarts with --resume
        default:
          diaspora_action_failed(p_, a.id, "diaspora-train handles checkpoint, migrate, restart and cancel");
          continue;
      }
      pending_.push_back(a.id);
      target_ = a.target_site;
      return code;
    }
    return 0;
  }

  /// The job stopped after a checkpoint: acknowledges the actions and reports the task.
  void stopped(int code, const std::string& where) {
    if (!p_) return;
    std::string msg = "checkpointed at " + where + (code == kTrainMigrate ? "; resume on " + target_ + " with --resume" : "");
    for (const auto& id : pending_) diaspora_action_done(p_, id.c_str(), msg.c_str());
    diaspora_task_info i = info();
    i.reason = msg.c_str();
    diaspora_task_cancelled(p_, &i);
  }
  void finished(bool ok, const std::string& reason) {
    if (!p_) return;
    diaspora_task_info i = info();
    if (ok) {
      i.has_exit_code = 1;
      diaspora_task_completed(p_, &i);
    } else {
      i.reason = reason.c_str();
      diaspora_task_failed(p_, &i);
    }
  }

 private:
  diaspora_task_info info() const {
    diaspora_task_info i{};
    i.struct_size = sizeof i;
    i.task_id = task_.c_str();
    i.site = site_.empty() ? nullptr : site_.c_str();
    i.step = -1;
    return i;
  }
  diaspora_plugin* p_ = nullptr;
  std::string task_, site_, target_;
  std::vector<std::string> pending_;
};

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
  Job(const TrainerConfig& cfg, const RankOptions& opt) : cfg_(cfg), opt_(opt) {}
  int run();

 private:
  // setup
  void setup_groups();
  void build_model();
  json::object stream_identity() const;
  void flush_insertions(const char* where);
  void drop_metrics_after(std::int64_t step);
  void setup();
  int train();
  template <class Open>
  void load_rank_files(Open& open, int old_world);
  std::int64_t task_samples(int task) const;
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
  int checkpoint_state() const;
  void load_checkpoint(const fs::path& from);
  // output
  void log_step(double loss, double step_s, double wait_s, std::int64_t reps);
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
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroup> train_group_, sampler_group_;
  std::unique_ptr<RehearsalBuffer> buffer_;
  std::unique_ptr<AsyncInserter> inserter_;
  std::unique_ptr<GlobalSampler> sampler_;
  Position pos_;
  std::vector<std::vector<double>> matrix_;  // metric on task j after task i
  double elapsed_before_ = 0;                // runtime of earlier segments (resume)
  Clock::time_point started_;
  std::ofstream metrics_;
  std::unique_ptr<PluginLink> plugin_;
  double sum_step_s_ = 0, sum_wait_s_ = 0;
  std::int64_t steps_here_ = 0, samples_here_ = 0;
  std::string resumed_from_;
  std::unique_ptr<PendingCheckpoint> pending_;  // a background checkpoint not yet complete
  std::int64_t buffer_capacity_ = 0;            // slots of the buffers over all ranks
};

void Job::setup_groups() {
  const auto timeout = cfg_.rehearsal.sampling.timeout;
  std::string host = "127.0.0.1";
  if (world_ == 1) {
    store_ = c10::make_intrusive<c10d::HashStore>();
  } else {
    const MasterAddress address = parse_master_address(opt_.master);
    host = address.host;
    c10d::TCPStoreOptions o;
    o.port = address.port;
    o.isServer = rank_ == 0;
    o.numWorkers = static_cast<std::size_t>(world_);
    o.timeout = timeout;
    try {
      store_ = c10::make_intrusive<c10d::TCPStore>(host, o);
    } catch (const std::exception& e) {
      throw RehearsalError("rendezvous with " + opt_.master + " failed: " + e.what());
    }
  }
  const std::string dev_host = (host == "localhost" || host.rfind("127.", 0) == 0) ? "127.0.0.1" : "";
  train_group_ = make_process_group("gloo", c10::make_intrusive<c10d::PrefixStore>("train", store_), rank_, world_,
                                    timeout, dev_host);
  if (cfg_.uses_buffer())
    sampler_group_ = make_process_group(cfg_.rehearsal.sampling.backend,
                                        c10::make_intrusive<c10d::PrefixStore>("sampler", store_), rank_, world_,
                                        timeout, dev_host);
}

void Job::build_model() {
  auto make_net = [&]() -> std::shared_ptr<NetImpl> {
    if (data_.classification) return std::make_shared<SmallCnn>(static_cast<int>(data_.output_sizes[0]));
    return std::make_shared<PtychoNet>();
  };
  model_ = make_net();
  ema_.reset();
  ema_updates_ = 0;
  if (cfg_.train.ema > 0) {  // the averaged copy starts as the model (its own tensors)
    // Its initialisation must not consume the generator: a run with the average draws
    // the same numbers as one without.
    auto gen = at::detail::getDefaultCPUGenerator();
    const auto state = gen.get_state();
    ema_ = make_net();
    gen.set_state(state);
    torch::NoGradGuard ng;
    auto from = model_->parameters();
    auto to = ema_->parameters();
    for (std::size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
  }
  const bool adam = cfg_.train.optimizer == "adam";
  const double lr = cfg_.train.lr > 0 ? cfg_.train.lr : (adam ? 1e-3 : 0.05);
  if (adam) optim_ = std::make_unique<torch::optim::Adam>(model_->parameters(), torch::optim::AdamOptions(lr));
  else
    optim_ = std::make_unique<torch::optim::SGD>(model_->parameters(),
                                                 torch::optim::SGDOptions(lr).momentum(cfg_.train.momentum));
}

// Training samples of `task`: its own, or (scratch) those of tasks 0..task.
std::int64_t Job::task_samples(int task) const {
  std::int64_t n = 0;
  const int first = cfg_.strategy == "scratch" ? 0 : task;
  for (int t = first; t <= task; ++t) n += data_.train[static_cast<std::size_t>(t)].x.size(0);
  return n;
}

std::int64_t Job::steps_per_epoch_at(int task, int world) const {
  return task_samples(task) / (cfg_.train.batch_size * world);
}

// The indices (into the concatenation of the task's training sets, tasks 0..task for
// scratch) of one epoch, in a random order that depends on (seed, task, epoch) only.
torch::Tensor Job::epoch_order(int task, int epoch) const {
  const std::int64_t n = task_samples(task);
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  Rng rng(cfg_.seed, (static_cast<std::uint64_t>(task) << 32) | static_cast<std::uint64_t>(epoch));
  rng.shuffle(order);
  return torch::tensor(order);
}

// The training samples of `task`: its own, or (scratch) tasks 0..task back to back.
const TaskData& Job::task_data(int task) {
  if (cfg_.strategy != "scratch" || task == 0) return data_.train[static_cast<std::size_t>(task)];
  if (scratch_task_ != task) {
    std::vector<torch::Tensor> xs, ys;
    for (int t = 0; t <= task; ++t) {
      xs.push_back(data_.train[static_cast<std::size_t>(t)].x);
      ys.push_back(data_.train[static_cast<std::size_t>(t)].y);
    }
    scratch_ = {torch::cat(xs), torch::cat(ys)};
    scratch_task_ = task;
  }
  return scratch_;
}

// The task's loss: cross-entropy, or (ptycho) the mean ptycho_error over the batch.
torch::Tensor task_loss(const Stream& s, const torch::Tensor& out, const torch::Tensor& y) {
  return s.classification ? torch::nn::functional::cross_entropy(out, y) : ptycho_error(out, y, s.weight).mean();
}

// DER's distance to stored outputs: MSE of the logits, or (ptycho) the task's own loss, so
// the part of an output its data does not determine is not rehearsed either.
torch::Tensor output_distance(const Stream& s, const torch::Tensor& out, const torch::Tensor& stored) {
  return s.classification ? torch::mse_loss(out, stored) : task_loss(s, out, stored);
}

// What the accuracy (error) matrix holds; kept in checkpoint manifests.
const char* metric_name(const Stream& s) { return s.classification ? "accuracy" : "ptycho_error"; }

void Job::allreduce_grads() {
  if (world_ == 1) return;
  std::vector<torch::Tensor> grads;
  for (auto& p : model_->parameters())
    if (p.grad().defined()) grads.push_back(p.grad().flatten());
  std::vector<torch::Tensor> flat{torch::cat(grads)};
  all_reduce("gradient all-reduce", flat);
  flat[0].div_(world_);
  std::int64_t off = 0;
  for (auto& p : model_->parameters()) {
    if (!p.grad().defined()) continue;
    const std::int64_t n = p.grad().numel();
    p.grad().copy_(flat[0].narrow(0, off, n).view_as(p.grad()));
    off += n;
  }
}

// One step on the stream batch `idx` of task `task` (plus representatives).
double Job::train_step(const torch::Tensor& idx, int task) {
  const auto t0 = Clock::now();
  // The stream batch (scratch: idx indexes tasks 0..task back to back).
  const TaskData& source = task_data(task);
  torch::Tensor x = source.x.index_select(0, idx);
  torch::Tensor y = source.y.index_select(0, idx);
  double wait_s = 0;
  std::int64_t nreps = 0;
  SampledBatch reps;
  // Deterministic mode keeps one order between the buffer's writes and reads without a
  // full stop per step: the draw for step i+1 starts mid-step i, right after step i-1's
  // insertion is flushed (it ran during this forward pass), and step i's insertion is
  // submitted once that draw has read the buffers (it ran during this backward pass). So
  // draw i+1 always sees the buffers as of step i-1 (with the sizes draw i exchanged).
  const bool det = sampler_ && cfg_.train.deterministic;
  if (sampler_) {
    const auto w0 = Clock::now();
    reps = det ? sampler_->take() : sampler_->next();  // step pos_.step (next(): starts fetching i+1)
    wait_s += seconds_since(w0);
    nreps = reps.batch.size();
  }
  const std::int64_t b = x.size(0);
  torch::Tensor input = nreps > 0 ? torch::cat({x, reps.batch.tensors[0]}) : x;
  optim_->zero_grad();
  torch::Tensor out = model_->forward(input);
  if (det) {
    const auto w0 = Clock::now();
    flush_insertions("mid-step");  // step i-1's candidates are in the buffers
    wait_s += seconds_since(w0);
    sampler_->prefetch();  // draw i+1 sees them, and nothing newer
  }
  torch::Tensor stream_out = out.narrow(0, 0, b);
  torch::Tensor loss = task_loss(data_, stream_out, y);
  if (nreps > 0) {
    torch::Tensor rout = out.narrow(0, b, nreps);
    const torch::Tensor& ry = reps.batch.tensors[1];
    if (cfg_.strategy == "er") {
      loss = task_loss(data_, out, torch::cat({y, ry}));
    } else {
      // DER: alpha * the distance to the stored outputs; DER++ uses the first half of the R
      // representatives for that and the second, disjoint half for beta * the task loss,
      // so every rehearsal strategy trains on the same number of samples a step.
      const std::int64_t h = cfg_.strategy == "derpp" ? (nreps + 1) / 2 : nreps;
      loss = loss + cfg_.alpha * output_distance(data_, rout.narrow(0, 0, h), reps.batch.outputs.narrow(0, 0, h));
      if (cfg_.strategy == "derpp" && nreps - h > 0)
        loss = loss + cfg_.beta * task_loss(data_, rout.narrow(0, h, nreps - h), ry.narrow(0, h, nreps - h));
    }
  }
  loss.backward();
  allreduce_grads();
  optim_->step();
  update_ema();
  if (inserter_) {
    if (det) {
      // The in-flight draw must not see this step's candidates at a timing-dependent moment.
      const auto w0 = Clock::now();
      sampler_->settle();
      wait_s += seconds_since(w0);
    }
    Batch cand;
    cand.tensors = {x, y};
    if (cfg_.stores_outputs()) cand.outputs = stream_out.detach();
    inserter_->try_submit(std::move(cand));  // deterministic: flushed mid-way through the next step
  }
  const double step_s = seconds_since(t0);
  const double lv = loss.item<double>();
  log_step(lv, step_s, wait_s, nreps);
  samples_here_ += (b + nreps) * world_;
  return lv;
}

// train.ema: the evaluated weights are an exponential moving average of the trained ones,
// w_ema <- d w_ema + (1 - d) w with d = min(ema, (1 + n) / (10 + n)) after the n-th update
// (the usual warm-up, so the first steps do not keep the initial weights). Every rank
// holds the same weights (gradients are all-reduced), so every rank's average is the same.
void Job::update_ema() {
  if (!ema_) return;
  const double n = static_cast<double>(ema_updates_++);
  const double d = std::min(cfg_.train.ema, (1 + n) / (10 + n));
  torch::NoGradGuard ng;
  auto from = model_->parameters();
  auto to = ema_->parameters();
  for (std::size_t i = 0; i < to.size(); ++i) to[i].mul_(d).add_(from[i], 1 - d);
}

// Metric on every task's test set: accuracy (classification) or the mean ptycho_error
// (probe-weighted squared error of amplitude and phase, phase up to a constant). Each rank
// evaluates every world-th sample; sums are all-reduced.
std::vector<double> Job::evaluate() {
  torch::NoGradGuard ng;
  std::vector<double> out;
  for (const auto& t : data_.test) {
    double sum = 0, count = 0;
    const std::int64_t n = t.x.size(0);
    auto mine = torch::arange(rank_, n, world_, torch::kLong);
    for (std::int64_t i = 0; i < mine.size(0); i += 500) {
      auto idx = mine.narrow(0, i, std::min<std::int64_t>(500, mine.size(0) - i));
      auto pred = (ema_ ? ema_ : model_)->forward(t.x.index_select(0, idx));
      auto y = t.y.index_select(0, idx);
      if (data_.classification) sum += pred.argmax(1).eq(y).sum().item<double>();
      else sum += ptycho_error(pred, y, data_.weight).sum().item<double>();
      count += static_cast<double>(idx.size(0));
    }
    std::vector<torch::Tensor> v{torch::tensor({sum, count}, torch::kDouble)};
    if (world_ > 1) all_reduce("all-reduce of the evaluation", v);
    out.push_back(v[0][0].item<double>() / std::max(1.0, v[0][1].item<double>()));
  }
  return out;
}

// Once a step, every rank: the largest stop request over the ranks, and (in the same
// all-reduce) the state of a background checkpoint, which completes it once every rank's
// file is durable.
int Job::agree_stop(int local) {
  const auto v = max_over_ranks({local, checkpoint_state()});
  poll_checkpoint(static_cast<int>(v[1]));
  return static_cast<int>(v[0]);
}

// The element-wise maximum of `values` over the ranks (a collective; one rank: `values`).
// The element-wise reduction (`op`) of `values` over the ranks; every rank calls it at the
// same point.
std::vector<std::int64_t> Job::over_ranks(std::vector<std::int64_t> values, c10d::ReduceOp op) {
  if (world_ == 1) return values;
  std::vector<torch::Tensor> v{torch::tensor(values, torch::kLong)};
  c10d::AllreduceOptions o;
  o.reduceOp = op;
  all_reduce("all-reduce of the ranks' state (stop, checkpoint, buffer)", v, o);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = v[0][static_cast<std::int64_t>(i)].item<std::int64_t>();
  return values;
}

void Job::barrier() {
  if (world_ == 1) return;
  std::vector<torch::Tensor> v{torch::zeros({1})};
  all_reduce("barrier", v);
}

void Job::all_reduce(const char* what, std::vector<torch::Tensor>& values, const c10d::AllreduceOptions& options) {
  try {
    train_group_->allreduce(values, options)->wait();
  } catch (const std::exception& e) {
    throw RehearsalError("step " + std::to_string(pos_.step) + ": " + what +
                         " with the other ranks failed (a rank ended, the network between the ranks dropped, or "
                         "sampling.timeout passed): " + e.what());
  }
}

void Job::log_step(double loss, double step_s, double wait_s, std::int64_t reps) {
  sum_step_s_ += step_s;
  sum_wait_s_ += wait_s;
  ++steps_here_;
  if (rank_ != 0) return;
  const double sps = step_s > 0 ? static_cast<double>((cfg_.train.batch_size + reps) * world_) / step_s : 0;
  char line[512];
  std::snprintf(line, sizeof line,
                "{\"step\":%" PRId64 ",\"task\":%d,\"epoch\":%d,\"loss\":%.9g,\"step_ms\":%.4f,\"samples_per_s\":%.1f,"
                "\"buffer_fill\":%" PRId64 ",\"representatives\":%" PRId64 ",\"wait_ms\":%.4f}\n",
                pos_.step, pos_.task, pos_.epoch, loss, step_s * 1e3, sps, buffer_ ? buffer_->size() : 0, reps,
                wait_s * 1e3);
  metrics_ << line;
  if (pos_.step % cfg_.train.log_every == 0) {
    metrics_.flush();
    const std::int64_t spe = steps_per_epoch(pos_.task);
    const std::int64_t per = spe * cfg_.train.epochs;
    const double frac = per > 0 ? static_cast<double>(pos_.epoch * spe + pos_.batch + 1) / static_cast<double>(per) : 1.0;
    if (opt_.progress_bar) {
      const int width = 30, filled = static_cast<int>(frac * width);
      std::fprintf(stderr, "\r task %d/%d [%s%s] %3.0f%%  step %" PRId64 "  loss %.4f  %.0f samples/s ", pos_.task + 1,
                   cfg_.dataset.tasks, std::string(static_cast<std::size_t>(filled), '#').c_str(),
                   std::string(static_cast<std::size_t>(width - filled), ' ').c_str(), frac * 100, pos_.step, loss, sps);
    }
    if (plugin_) {
      const double overall = (pos_.task + frac) / cfg_.dataset.tasks;
      plugin_->progress(pos_.step, overall,
                        {{"loss", loss}, {"samples_per_s", sps}, {"step_ms", step_s * 1e3}, {"wait_ms", wait_s * 1e3},
                         {"buffer_fill", static_cast<double>(buffer_ ? buffer_->size() : 0)}});
    }
  }
}

// ---- checkpoints ---------------------------------------------------------------------------

fs::path Job::checkpoint_root() const {
  return cfg_.checkpoint_dir.empty() ? opt_.out / "checkpoint" : fs::path(cfg_.checkpoint_dir);
}

torch::Tensor to_tensor(const std::vector<std::int64_t>& v) { return torch::tensor(v, torch::kLong); }
torch::Tensor to_tensor(const std::vector<std::uint64_t>& v) {
  std::vector<std::int64_t> s(v.begin(), v.end());
  return torch::tensor(s, torch::kLong);
}
std::vector<std::int64_t> to_vec(const torch::Tensor& t) {
  auto c = t.to(torch::kLong).contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

// The serialised form of a module or optimizer, taken now (the live tensors change).
torch::Tensor archive_bytes(const std::function<void(torch::serialize::OutputArchive&)>& save) {
  torch::serialize::OutputArchive a;
  save(a);
  std::ostringstream os;
  a.save_to(os);
  const std::string b = os.str();
  torch::Tensor t = torch::empty({static_cast<std::int64_t>(b.size())}, torch::kByte);
  std::memcpy(t.data_ptr<std::uint8_t>(), b.data(), b.size());
  return t;
}

// Reads what archive_bytes wrote under `key` (or, from checkpoints of earlier versions, a
// nested archive of that name) into `into`.
void read_archive(torch::serialize::InputArchive& a, const std::string& key, torch::serialize::InputArchive& into) {
  torch::Tensor b;
  if (a.try_read(key + ".bytes", b)) {
    b = b.contiguous();
    into.load_from(reinterpret_cast<const char*>(b.data_ptr<std::uint8_t>()), static_cast<std::size_t>(b.numel()));
  } else {
    a.read(key, into);
  }
}

// The keys that decide which samples the job streams and in which order (the position in a
// checkpoint counts batches of them): a resumed run must have the same (docs/rehearsal.md
// "Trainer", --resume). dataset.dir may change (the same files elsewhere).
json::object Job::stream_identity() const {
  const DatasetConfig& d = cfg_.dataset;
  json::object o{{"seed", cfg_.seed},
                 {"batch_size", cfg_.train.batch_size},
                 {"train_per_task", d.train_per_task},
                 {"test_per_task", d.test_per_task}};
  if (data_.classification) {
    o["classes_per_task"] = d.classes_per_task;
  } else {
    o["patch"] = d.patch;
    o["object_size"] = d.object_size;
    o["scan_step"] = d.scan_step;
    o["photons"] = d.photons;
    o["test_every"] = d.test_every;
    o["probe_drift"] = d.probe_drift;
  }
  return o;
}

// A job resumed into the --out it was checkpointed from: the lines of steps after the
// checkpoint (a segment lost to a crash, a torn last line) are dropped, so that the
// resumed steps appear once.
void Job::drop_metrics_after(std::int64_t step) {
  const fs::path file = opt_.out / "metrics.jsonl";
  if (!fs::exists(file)) return;
  std::istringstream in(read_text(file));
  std::string kept, line;
  bool dropped = false;
  while (std::getline(in, line)) {
    boost::system::error_code ec;
    const json::value v = json::parse(line, ec);
    const json::object* o = !ec && v.is_object() ? &v.get_object() : nullptr;
    const json::value* s = o ? o->if_contains("step") : nullptr;
    // A step's line carries its index (the checkpoint at `step` follows step - 1); a task's
    // evaluation line is kept if the checkpoint holds that task's row.
    bool keep = false;
    if (const json::value* e = o ? o->if_contains("eval_after_task") : nullptr)
      keep = e->is_int64() && e->get_int64() >= 0 && static_cast<std::size_t>(e->get_int64()) < matrix_.size();
    else
      keep = s && (s->is_int64() || s->is_uint64()) && s->to_number<std::int64_t>() < step;
    if (keep) kept.append(line).append(1, '\n');
    else dropped = true;
  }
  if (dropped) write_file_atomic(file, kept);
}

// Waits until the candidates submitted so far are in the buffer; the run's order of
// insertions and draws (deterministic mode, checkpoints) depends on it, so a wait that
// times out is an error rather than a silent loss of reproducibility.
void Job::flush_insertions(const char* where) {
  if (inserter_ && !inserter_->flush())
    throw RehearsalError(std::string("the rehearsal buffer's insertions did not finish within a minute (") + where +
                         "): the inserter thread is stuck or the machine is overloaded");
}

// Rank 0, once every rank's file of checkpoint `name` is durable: the manifest, then
// LATEST, then the older checkpoints go. Each file is written atomically, in this order,
// so a crash at any moment leaves LATEST naming a complete checkpoint.
void publish_checkpoint(const fs::path& root, const std::string& name, const std::string& manifest) {
  write_file_atomic(root / name / "manifest.json", manifest);
  write_file_atomic(root / "LATEST", name + "\n");
  for (const auto& e : fs::directory_iterator(root))  // older checkpoints are superseded
    if (e.is_directory() && e.path().filename().string().rfind("ckpt-", 0) == 0 && e.path().filename() != name)
      fs::remove_all(e.path());
}

void Job::save_checkpoint(const std::string& why, bool background) {
  finish_checkpoint();  // one checkpoint at a time, completed in order
  if (metrics_.is_open()) metrics_.flush();  // the lines up to this step are written before it can be published
  const fs::path root = checkpoint_root();
  const std::string name = "ckpt-" + std::to_string(pos_.step);
  const fs::path dir = root / name;
  if (rank_ == 0) fs::create_directories(dir);
  barrier();
  // Everything the archive holds is a copy taken now: training may go on while it is written.
  auto a = std::make_unique<torch::serialize::OutputArchive>();
  a->write("step", c10::IValue(pos_.step));
  if (rank_ == 0) {
    a->write("model.bytes", archive_bytes([&](auto& m) { model_->save(m); }));
    a->write("optimizer.bytes", archive_bytes([&](auto& o) { optim_->save(o); }));
    if (ema_) {
      a->write("ema.bytes", archive_bytes([&](auto& m) { ema_->save(m); }));
      a->write("ema.updates", c10::IValue(ema_updates_));
    }
  }
  if (buffer_) {
    flush_insertions("checkpoint");
    BufferSnapshot s = buffer_->snapshot();
    a->write("buffer.capacity", c10::IValue(s.capacity));
    a->write("buffer.seen", c10::IValue(static_cast<std::int64_t>(s.seen)));
    a->write("buffer.rows", s.rows.defined() ? s.rows : torch::empty({0}, torch::kByte));
    a->write("buffer.class_labels", to_tensor(s.class_labels));
    a->write("buffer.class_seen", to_tensor(s.class_seen));
    std::vector<std::int64_t> counts, slots;
    for (const auto& c : s.class_slots) {
      counts.push_back(static_cast<std::int64_t>(c.size()));
      slots.insert(slots.end(), c.begin(), c.end());
    }
    a->write("buffer.class_counts", to_tensor(counts));
    a->write("buffer.class_slots", to_tensor(slots));
    a->write("buffer.rng", to_tensor(s.rng_state));
    auto pre = sampler_->prefetched();  // its tensors are never modified, only read
    a->write("reps.present", c10::IValue(pre.has_value()));
    if (pre) {
      a->write("reps.step", c10::IValue(static_cast<std::int64_t>(pre->step)));
      for (std::size_t k = 0; k < pre->batch.tensors.size(); ++k)
        a->write("reps.tensor" + std::to_string(k), pre->batch.tensors[k]);
      a->write("reps.outputs", pre->batch.outputs.defined() ? pre->batch.outputs : torch::empty({0}));
      a->write("reps.global_indices", to_tensor(pre->global_indices));
      a->write("reps.rank_sizes", to_tensor(pre->rank_sizes));
      a->write("reps.next_info", to_tensor(pre->next_info));
    }
  }
  a->write("torch_rng", at::detail::getDefaultCPUGenerator().get_state());
  std::string manifest;
  if (rank_ == 0) {
    json::object m;
    m["version"] = 1;
    m["step"] = pos_.step;
    m["task"] = pos_.task;
    m["epoch"] = pos_.epoch;
    m["batch"] = pos_.batch;
    m["world_size"] = world_;
    m["seed"] = cfg_.seed;
    m["strategy"] = cfg_.strategy;
    m["dataset"] = cfg_.dataset.name;
    m["tasks"] = cfg_.dataset.tasks;
    m["metric"] = metric_name(data_);
    m["ema"] = cfg_.train.ema;
    m["stream"] = stream_identity();  // a resume must see the same samples in the same order
    m["reason"] = why;
    m["elapsed_s"] = elapsed_before_ + seconds_since(started_);
    json::array mat;
    for (const auto& row : matrix_) mat.push_back(json::value_from(row));
    m["matrix"] = mat;
    manifest = json::serialize(m) + "\n";
  }
  auto write_rank_file = [a = std::move(a), file = dir / ("rank-" + std::to_string(rank_) + ".pt")] {
    std::ostringstream bytes;
    a->save_to(bytes);
    write_file_atomic(file, bytes.str());
  };
  if (!background) {
    write_rank_file();
    barrier();  // every rank's file is durable
    if (rank_ == 0) publish_checkpoint(root, name, manifest);
    barrier();
    return;
  }
  pending_ = std::make_unique<PendingCheckpoint>();
  PendingCheckpoint* p = pending_.get();
  p->name = name;
  p->manifest = std::move(manifest);
  const bool alone = world_ == 1;  // no other rank to wait for: the writer publishes it
  const auto delay = std::chrono::milliseconds(opt_.checkpoint_delay_ms);
  p->writer = std::jthread([p, root, alone, delay, write = std::move(write_rank_file)](std::stop_token stop) mutable {
    name_this_thread("dsp-checkpoint");
    if (delay.count() > 0) {  // --checkpoint-delay-ms; cut short when the job is torn down
      std::mutex m;
      std::condition_variable_any cv;
      std::unique_lock lk(m);
      cv.wait_for(lk, stop, delay, [] { return false; });
    }
    try {
      write();
      if (alone) publish_checkpoint(root, p->name, p->manifest);
    } catch (...) {
      p->error = std::current_exception();
    }
    p->done.store(true, std::memory_order_release);
  });
}

// 0: no background checkpoint, or this rank's part of it is done; 1: still writing;
// 2: writing failed.
int Job::checkpoint_state() const {
  if (!pending_) return 0;
  if (!pending_->done.load(std::memory_order_acquire)) return 1;
  return pending_->error ? 2 : 0;
}

// Called by every rank with the largest checkpoint_state() over the ranks: completes the
// background checkpoint once every rank's file is durable, or fails the job on every rank
// if one could not write its file.
void Job::poll_checkpoint(int max_state) {
  if (!pending_ || max_state == 1) return;
  if (pending_->writer.joinable()) pending_->writer.join();
  std::unique_ptr<PendingCheckpoint> p = std::move(pending_);
  if (max_state == 2) {
    std::string why = "another rank could not write its file";
    if (p->error) {
      try {
        std::rethrow_exception(p->error);
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    throw RehearsalError("checkpoint " + (checkpoint_root() / p->name).string() + " was not written: " + why);
  }
  if (world_ == 1) return;  // the writer published it
  // Rank 0 publishes; every rank learns whether that worked (one more all-reduce a
  // checkpoint), so that a failure stops them all.
  std::string why;
  if (rank_ == 0) {
    try {
      publish_checkpoint(checkpoint_root(), p->name, p->manifest);
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  if (max_over_ranks({why.empty() ? 0 : 1})[0] != 0)
    throw RehearsalError("checkpoint " + (checkpoint_root() / p->name).string() + " was not published: " +
                         (rank_ == 0 ? why : "rank 0 could not write its manifest or LATEST"));
}

// Waits for the background checkpoint, if any, and completes it (every rank calls it at
// the same point: before the next checkpoint and at the end of the job).
void Job::finish_checkpoint() {
  if (!pending_) return;
  pending_->writer.join();
  poll_checkpoint(static_cast<int>(max_over_ranks({checkpoint_state()})[0]));
}

void Job::load_checkpoint(const fs::path& from) {
  fs::path root = from;
  if (!fs::exists(root / "LATEST") && fs::exists(root / "checkpoint" / "LATEST")) root /= "checkpoint";
  if (!fs::exists(root / "LATEST"))
    throw RehearsalError("--resume " + from.string() + ": no checkpoint there (no LATEST file in it or in its checkpoint/)");
  std::string name = read_text(root / "LATEST");
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
  const fs::path dir = root / name;
  json::value mv;
  try {
    mv = json::parse(read_text(dir / "manifest.json"));
  } catch (const std::exception& e) {
    throw RehearsalError("checkpoint " + dir.string() + ": manifest.json unreadable: " + e.what());
  }
  int old_world = 0;
  try {
    const json::object& m = mv.as_object();
    auto mismatch = [&](const char* key, const std::string& have, const std::string& want) {
      if (have != want)
        throw RehearsalError("checkpoint " + dir.string() + " was written with " + key + " " + have +
                             "; this config has " + want + " (resume with the same config)");
    };
    mismatch("strategy", std::string(m.at("strategy").as_string()), cfg_.strategy);
    mismatch("dataset", std::string(m.at("dataset").as_string()), cfg_.dataset.name);
    mismatch("tasks", std::to_string(m.at("tasks").to_number<int>()), std::to_string(cfg_.dataset.tasks));
    // Before the field existed, ptycho-sim's matrix held the whole-patch MSE: rows of the two
    // errors must not be mixed in one matrix.
    if (!data_.classification && !m.contains("metric"))
      throw RehearsalError("checkpoint " + dir.string() +
                           " was written by an older diaspora-train whose ptycho-sim error was the whole-patch "
                           "MSE; its error matrix cannot be continued with ptycho_error: start the job again");
    if (const auto* metric = m.if_contains("metric"))
      mismatch("metric", std::string(metric->as_string()), metric_name(data_));
    // The averaged weights continue only with the decay they were averaged with (a
    // checkpoint from before the field had none).
    const double ema = m.contains("ema") ? m.at("ema").to_number<double>() : 0.0;
    auto text = [](double v) {
      char b[32];
      std::snprintf(b, sizeof b, "%.10g", v);
      return std::string(b);
    };
    if (ema != cfg_.train.ema) mismatch("train.ema", text(ema), text(cfg_.train.ema));
    // Checkpoints from before the field was written carry no stream identity: not checked.
    if (const auto* st = m.if_contains("stream")) {
      const json::object have = st->as_object();
      for (const auto& [key, want] : stream_identity()) {
        const json::value* h = have.if_contains(key);
        const std::string name = key == "seed"         ? std::string("seed")
                                 : key == "batch_size" ? std::string("train.batch_size")
                                                       : "dataset." + std::string(key);
        // Exact: integers as their digits (a seed may exceed 2^53), numbers written from a
        // double as the same shortest text.
        mismatch(name.c_str(), h ? json::serialize(*h) : std::string("none"), json::serialize(want));
      }
    } else if (const auto* seed = m.if_contains("seed")) {  // older checkpoints: the seed at least
      mismatch("seed", json::serialize(*seed), json::serialize(json::value(cfg_.seed)));
    }
    pos_.step = m.at("step").to_number<std::int64_t>();
    pos_.task = m.at("task").to_number<int>();
    pos_.epoch = m.at("epoch").to_number<int>();
    pos_.batch = m.at("batch").to_number<std::int64_t>();
    elapsed_before_ = m.at("elapsed_s").to_number<double>();
    matrix_.clear();
    for (const auto& row : m.at("matrix").as_array()) matrix_.push_back(json::value_to<std::vector<double>>(row));
    old_world = m.at("world_size").to_number<int>();
  } catch (const RehearsalError&) {
    throw;
  } catch (const std::exception& e) {
    throw RehearsalError("checkpoint " + (dir / "manifest.json").string() +
                         " is not a diaspora-train manifest (a field is missing or of the wrong type: " + e.what() + ")");
  }
  if (old_world < 1 || pos_.step < 0 || pos_.task < 0 || pos_.task > cfg_.dataset.tasks || pos_.epoch < 0 ||
      pos_.batch < 0 || (pos_.task < cfg_.dataset.tasks && pos_.batch > steps_per_epoch_at(pos_.task, old_world)))
    throw RehearsalError("checkpoint " + (dir / "manifest.json").string() + " holds an impossible position (world " +
                         std::to_string(old_world) + ", task " + std::to_string(pos_.task) + ", step " +
                         std::to_string(pos_.step) + ")");
  const auto full_row = [&](const std::vector<double>& row) {
    return row.size() == static_cast<std::size_t>(cfg_.dataset.tasks);
  };
  if (matrix_.size() != static_cast<std::size_t>(pos_.task) || !std::all_of(matrix_.begin(), matrix_.end(), full_row))
    throw RehearsalError("checkpoint " + (dir / "manifest.json").string() + " is inconsistent: its matrix has " +
                         std::to_string(matrix_.size()) + " rows for task " + std::to_string(pos_.task) +
                         " (one row of " + std::to_string(cfg_.dataset.tasks) + " values per finished task expected)");
  // The epoch's order depends on (seed, task, epoch) only; old_world * batch batches of
  // batch_size are consumed: continue after them (rounded down with another world size).
  pos_.batch = pos_.batch * old_world / world_;
  resumed_from_ = dir.string();

  fs::path reading;  // the rank file being read, for the error message
  auto open = [&](int r) {
    torch::serialize::InputArchive a;
    reading = dir / ("rank-" + std::to_string(r) + ".pt");
    try {
      a.load_from(reading.string());
    } catch (const std::exception& e) {
      throw RehearsalError("checkpoint file " + reading.string() + " is unreadable: " + e.what());
    }
    return a;
  };
  try {
    load_rank_files(open, old_world);
  } catch (const RehearsalError&) {
    throw;
  } catch (const std::exception& e) {
    throw RehearsalError("checkpoint file " + reading.string() +
                         " lacks a field or holds one of the wrong type or shape (a damaged or foreign file): " +
                         e.what());
  }
}

template <class Open>
void Job::load_rank_files(Open& open, int old_world) {
  {
    auto a = open(0);
    torch::serialize::InputArchive mm, oo;
    read_archive(a, "model", mm);
    read_archive(a, "optimizer", oo);
    model_->load(mm);
    optim_->load(oo);
    if (ema_) {  // the manifest's train.ema matched: the average is in the file
      torch::serialize::InputArchive ee;
      read_archive(a, "ema", ee);
      ema_->load(ee);
      c10::IValue n;
      a.read("ema.updates", n);
      ema_updates_ = n.toInt();
    }
  }
  auto mine = open(old_world == world_ ? rank_ : 0);
  torch::Tensor rng_state;
  mine.read("torch_rng", rng_state);
  auto gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(rng_state);
  if (!buffer_) return;

  auto snapshot_of = [&](torch::serialize::InputArchive& a) {
    BufferSnapshot s;
    s.layout = buffer_->layout();
    c10::IValue v;
    a.read("buffer.capacity", v);
    s.capacity = v.toInt();
    a.read("buffer.seen", v);
    s.seen = static_cast<std::uint64_t>(v.toInt());
    torch::Tensor t;
    a.read("buffer.rows", s.rows);
    if (s.rows.dim() != 2) s.rows = torch::empty({0, static_cast<std::int64_t>(s.layout->row_bytes())}, torch::kByte);
    a.read("buffer.class_labels", t);
    s.class_labels = to_vec(t);
    a.read("buffer.class_seen", t);
    for (auto x : to_vec(t)) s.class_seen.push_back(static_cast<std::uint64_t>(x));
    torch::Tensor counts, slots;
    a.read("buffer.class_counts", counts);
    a.read("buffer.class_slots", slots);
    auto c = to_vec(counts), sl = to_vec(slots);
    std::size_t off = 0;
    for (auto n : c) {
      if (n < 0 || off + static_cast<std::size_t>(n) > sl.size()) throw RehearsalError("checkpoint: class slot lists are inconsistent");
      s.class_slots.emplace_back(sl.begin() + static_cast<std::ptrdiff_t>(off), sl.begin() + static_cast<std::ptrdiff_t>(off + static_cast<std::size_t>(n)));
      off += static_cast<std::size_t>(n);
    }
    a.read("buffer.rng", t);
    for (auto x : to_vec(t)) s.rng_state.push_back(static_cast<std::uint64_t>(x));
    return s;
  };
  std::optional<SampledBatch> reps;
  // Each rank's own state comes back only if no rank's capacity changed (buffer_size or
  // buffer.memory may differ by one slot on some ranks only): decided by all ranks together.
  c10::IValue cap;
  mine.read("buffer.capacity", cap);
  const bool changed = old_world != world_ || cap.toInt() != buffer_->capacity();
  if (max_over_ranks({changed ? 1 : 0})[0] == 0) {  // else: re-partitioned, drawn afresh
    buffer_->restore(snapshot_of(mine));
    c10::IValue present;
    mine.read("reps.present", present);
    if (present.toBool()) {
      SampledBatch b;
      c10::IValue v;
      mine.read("reps.step", v);
      b.step = static_cast<std::uint64_t>(v.toInt());
      for (std::size_t k = 0; k < 2; ++k) {
        torch::Tensor t;
        mine.read("reps.tensor" + std::to_string(k), t);
        b.batch.tensors.push_back(t);
      }
      torch::Tensor o, gi, rs;
      mine.read("reps.outputs", o);
      if (cfg_.stores_outputs()) b.batch.outputs = o;
      mine.read("reps.global_indices", gi);
      mine.read("reps.rank_sizes", rs);
      b.global_indices = to_vec(gi);
      b.rank_sizes = to_vec(rs);
      torch::Tensor ni;  // absent from checkpoints of earlier versions: sizes are gathered afresh
      if (mine.try_read("reps.next_info", ni)) b.next_info = to_vec(ni);
      if (b.batch.size() > 0) buffer_->validate(b.batch);  // the layout of this job's samples
      if (b.global_indices.size() != static_cast<std::size_t>(b.batch.size()))
        throw RehearsalError("the prefetched representatives' indices do not match their samples");
      reps = std::move(b);
    }
  } else {
    std::vector<BufferSnapshot> all;
    for (int r = 0; r < old_world; ++r) {
      auto a = open(r);
      all.push_back(snapshot_of(a));
    }
    buffer_->restore(repartition(all, rank_, world_, buffer_->capacity(), cfg_.seed));
  }
  sampler_->seek(static_cast<std::uint64_t>(pos_.step), std::move(reps));
}

// ---- output -------------------------------------------------------------------------------

void Job::write_summary() {
  const bool cls = data_.classification;
  json::object s;
  s["strategy"] = cfg_.strategy;
  s["buffer_size"] = cfg_.uses_buffer() ? cfg_.buffer_size : 0;
  s["buffer_capacity"] = buffer_capacity_;  // slots over all ranks (buffer.memory may hold fewer than buffer_size)
  s["representatives"] = cfg_.uses_buffer() ? cfg_.rehearsal.sampling.representatives : 0;  // R per rank and step
  s["batch_size"] = cfg_.train.batch_size;                                         // stream samples per rank and step
  s["epochs"] = cfg_.train.epochs;
  s["ema"] = cfg_.train.ema;  // 0: the trained weights were evaluated
  s["world_size"] = world_;
  s["seed"] = cfg_.seed;
  s["dataset"] = cfg_.dataset.name;
  s["tasks"] = cfg_.dataset.tasks;
  s["steps"] = pos_.step;
  s["runtime_s"] = elapsed_before_ + seconds_since(started_);
  json::array mat;
  for (const auto& row : matrix_) mat.push_back(json::value_from(row));
  s[cls ? "accuracy_matrix" : "error_matrix"] = mat;
  double avg = 0;
  for (double v : matrix_.back()) avg += v;
  avg /= static_cast<double>(matrix_.back().size());
  s[cls ? "average_accuracy" : "average_error"] = avg;
  s["first_task_final"] = matrix_.back().front();
  s["mean_step_ms"] = steps_here_ ? sum_step_s_ / static_cast<double>(steps_here_) * 1e3 : 0.0;
  s["wait_fraction"] = sum_step_s_ > 0 ? sum_wait_s_ / sum_step_s_ : 0.0;
  s["samples_per_s"] = sum_step_s_ > 0 ? static_cast<double>(samples_here_) / sum_step_s_ : 0.0;
  if (inserter_) {
    auto st = inserter_->stats();
    s["inserted_samples"] = st.samples_stored;
    s["dropped_samples"] = st.samples_dropped;
  }
  if (!resumed_from_.empty()) s["resumed_from"] = resumed_from_;
  write_file_atomic(opt_.out / "summary.json", json::serialize(s) + "\n");
  // The plot is a convenience: the matrix above is the result.
  std::vector<std::vector<double>> full(matrix_.size());
  for (std::size_t i = 0; i < matrix_.size(); ++i) {
    full[i] = matrix_[i];
    for (std::size_t j = i + 1; j < full[i].size(); ++j) full[i][j] = std::nan("");
  }
  try {
    write_matrix_plot(opt_.out / "curves.png", full,
                      cfg_.strategy + " on " + cfg_.dataset.name + " (buffer " + std::to_string(cfg_.buffer_size) + ")",
                      cls ? "accuracy" : "error");
  } catch (const std::exception& e) {
    std::cerr << "diaspora-train: warning: curves.png not written: " << e.what() << "\n";
  }
}

int Job::run() {
  rank_ = opt_.rank;
  world_ = opt_.world;
  started_ = Clock::now();
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  torch::set_num_threads(cfg_.train.threads > 0 ? cfg_.train.threads
                                                : static_cast<int>(std::max(1u, hw / static_cast<unsigned>(world_))));
  // The plugin first, so that a job failing while it starts (missing data, a bad
  // checkpoint, a rendezvous that fails) is reported as a failed task too.
  if (rank_ == 0) plugin_ = std::make_unique<PluginLink>(cfg_, opt_.resume.has_value());
  try {
    setup();
  } catch (const std::exception& e) {
    if (plugin_) plugin_->finished(false, e.what());
    throw;
  }
  return train();
}

void Job::setup() {
  torch::manual_seed(cfg_.seed);
  data_ = load_stream(cfg_);
  if (steps_per_epoch(0) == 0)
    throw RehearsalError("task 0 has fewer training samples than batch_size x ranks (" +
                         std::to_string(cfg_.train.batch_size * world_) + "): lower train.batch_size");
  setup_groups();
  build_model();
  if (cfg_.uses_buffer()) {
    BufferConfig bc = cfg_.rehearsal.buffer;
    const std::int64_t share = cfg_.buffer_size / world_ + (rank_ < cfg_.buffer_size % world_ ? 1 : 0);
    bc.max_samples = static_cast<std::uint64_t>(std::max<std::int64_t>(1, share));
    bc.class_balanced = data_.classification;
    bc.label_tensor = 1;
    std::uint64_t mix = cfg_.seed * 1000003ull + static_cast<std::uint64_t>(rank_);
    bc.seed = cfg_.rehearsal.buffer.seed ^ splitmix64(mix);
    buffer_ = std::make_unique<RehearsalBuffer>(bc, buffer_layout(data_, cfg_));
    inserter_ = std::make_unique<AsyncInserter>(*buffer_, cfg_.rehearsal.insertion);
    SamplerConfig sc = cfg_.rehearsal.sampling;
    sc.seed = sc.seed ^ cfg_.seed;
    sampler_ = std::make_unique<GlobalSampler>(*buffer_, sampler_group_, sc);
    // buffer.memory may hold fewer samples than buffer_size asks for: say so, and report
    // the slots there are.
    buffer_capacity_ = over_ranks({buffer_->capacity()}, c10d::ReduceOp::SUM)[0];
    if (rank_ == 0 && buffer_capacity_ < cfg_.buffer_size)
      std::cerr << "diaspora-train: warning: buffer.memory holds " << buffer_capacity_ << " of the " << cfg_.buffer_size
                << " samples of buffer_size over all ranks (" << buffer_->layout()->row_bytes()
                << " bytes a sample): raise buffer.memory\n";
  }
  if (opt_.resume) load_checkpoint(*opt_.resume);
  if (rank_ == 0) {
    fs::create_directories(opt_.out);
    std::error_code ec;  // resumed from this job's own checkpoints (not another --out's)
    if (opt_.resume && fs::equivalent(fs::path(resumed_from_).parent_path(), checkpoint_root(), ec))
      drop_metrics_after(pos_.step);
    metrics_.open(opt_.out / "metrics.jsonl", std::ios::app);
    if (!metrics_) throw RehearsalError("cannot write " + (opt_.out / "metrics.jsonl").string());
  }
}

int Job::train() {
  std::int64_t steps_run = 0;
  try {
    for (; pos_.task < cfg_.dataset.tasks; ++pos_.task, pos_.epoch = 0, pos_.batch = 0) {
      if (static_cast<std::size_t>(pos_.task) < matrix_.size()) continue;  // evaluated before the checkpoint
      const bool fresh_task = pos_.epoch == 0 && pos_.batch == 0;
      if (cfg_.strategy == "scratch" && fresh_task && pos_.task > 0) {
        torch::manual_seed(cfg_.seed * 7919 + static_cast<std::uint64_t>(pos_.task));
        build_model();  // scratch retrains a new model on everything seen so far
      }
      const std::int64_t spe = steps_per_epoch(pos_.task);
      for (; pos_.epoch < cfg_.train.epochs; ++pos_.epoch, pos_.batch = 0) {
        const torch::Tensor order = epoch_order(pos_.task, pos_.epoch);
        for (; pos_.batch < spe; ) {
          const std::int64_t bs = cfg_.train.batch_size;
          torch::Tensor idx = order.narrow(0, (pos_.batch * world_ + rank_) * bs, bs);
          train_step(idx, pos_.task);
          ++pos_.batch;
          ++pos_.step;
          ++steps_run;
          int stop = opt_.stop_flag && opt_.stop_flag->load() ? kTrainCheckpointed : 0;
          if (opt_.stop_after > 0 && steps_run >= opt_.stop_after) stop = kTrainCheckpointed;
          if (plugin_) stop = std::max(stop, plugin_->poll());
          stop = agree_stop(stop);
          if (stop != 0) {
            save_checkpoint(stop == kTrainMigrate ? "migrate" : stop == kTrainCancelled ? "cancel" : "stop");
            if (plugin_) plugin_->stopped(stop, "step " + std::to_string(pos_.step) + " in " + checkpoint_root().string());
            if (opt_.progress_bar) std::fprintf(stderr, "\n");
            if (rank_ == 0)
              std::cerr << "diaspora-train: checkpointed at step " << pos_.step << " in " << checkpoint_root().string()
                        << "; continue with --resume " << opt_.out.string() << "\n";
            return stop;
          }
          // Not on a task's last step: the task-end checkpoint of that same step follows.
          const bool task_done = pos_.batch == spe && pos_.epoch + 1 == cfg_.train.epochs;
          if (cfg_.checkpoint_every > 0 && pos_.step % cfg_.checkpoint_every == 0 && !task_done)
            save_checkpoint("period", true);
        }
      }
      flush_insertions("task end");
      matrix_.push_back(evaluate());
      if (rank_ == 0) {
        const auto& row = matrix_.back();
        double avg = 0;
        for (std::size_t j = 0; j <= static_cast<std::size_t>(pos_.task); ++j) avg += row[j];
        avg /= pos_.task + 1;
        json::object e;
        e["eval_after_task"] = pos_.task;
        e["step"] = pos_.step;
        e[data_.classification ? "accuracy" : "error"] = json::value_from(row);
        e["average_seen"] = avg;
        metrics_ << json::serialize(e) << "\n";
        metrics_.flush();
        if (opt_.progress_bar) std::fprintf(stderr, "\n");
        std::cerr << "diaspora-train: after task " << pos_.task << ": " << (data_.classification ? "accuracy" : "error")
                  << " on tasks seen " << avg << "\n";
      }
      pos_.epoch = cfg_.train.epochs;
      pos_.batch = 0;
      Position next = pos_;
      ++pos_.task;  // the checkpoint of a task's end resumes at the next task
      pos_.epoch = 0;
      save_checkpoint("task end", true);
      pos_ = next;
    }
    finish_checkpoint();  // the last task's checkpoint is durable before the job reports done
    if (rank_ == 0) write_summary();
    if (plugin_) plugin_->finished(true, "");
  } catch (const std::exception& e) {
    if (plugin_) plugin_->finished(false, e.what());
    throw;
  }
  return kTrainDone;
}

}  // namespace

void print_line(std::string_view text) {
  std::string line = "diaspora-train: ";
  line.append(text);
  line += '\n';
  std::cerr.flush();
  std::fflush(stderr);
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());  // nothing to do on failure
}

MasterAddress parse_master_address(std::string_view master) {
  const auto colon = master.rfind(':');
  std::string_view host = colon == std::string_view::npos ? std::string_view{} : master.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string_view port = colon == std::string_view::npos ? std::string_view{} : master.substr(colon + 1);
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (host.empty() || port.empty() || ec != std::errc() || end != port.data() + port.size() || value < 1 ||
      value > 65535)
    throw Error("--master must be HOST:PORT with a port in 1-65535, not '" + std::string(master) + "'");
  return {std::string(host), static_cast<std::uint16_t>(value)};
}

int run_trainer(const TrainerConfig& config, const RankOptions& options) {
  std::unique_ptr<Job> job;  // torn down after the error is printed (a stuck thread may hang the teardown)
  try {
    job = std::make_unique<Job>(config, options);
    return job->run();
  } catch (const std::exception& e) {
    // One write, so that the lines of ranks failing together do not interleave.
    print_line("rank " + std::to_string(options.rank) + ": " + e.what());
    return kTrainError;
  }
}

}  // namespace diaspora::rehearsal
