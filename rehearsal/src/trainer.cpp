// diaspora-train's engine: the task stream, the strategies, data-parallel steps with the
// distributed rehearsal buffer, evaluation, metrics and the summary (the job's declaration
// is job.hpp; its checkpoints are checkpoint.cpp).
#include "diaspora/scan_file.hpp"
#include "job.hpp"
#include "plot.hpp"
#include "checkpoint_item.hpp"
#include "scan_feed.hpp"

namespace diaspora::rehearsal {
namespace detail {

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
  if (d.name == "ptycho-stream") return s;  // the scans come one by one (Job::ensure_tasks)
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

void add_scan(Stream& s, const ScanFile& scan, const DatasetConfig& d, const std::string& name) {
  const auto n = static_cast<std::int64_t>(scan.patch), S = static_cast<std::int64_t>(scan.object_size);
  const auto p = static_cast<std::int64_t>(scan.positions.size());
  if (n % 8 != 0) throw RehearsalError(name + ": patch " + std::to_string(n) + " is not a multiple of 8 (the encoder halves it three times)");
  if (!s.output_sizes.empty() && s.output_sizes[1] != n)
    throw RehearsalError(name + ": patch " + std::to_string(n) + ", but scan 0 of the stream had " + std::to_string(s.output_sizes[1]));
  if (p < 2) throw RehearsalError(name + ": " + std::to_string(p) + " positions; a scan needs 2 or more (training and test)");
  auto x = torch::from_blob(const_cast<float*>(scan.diffraction.data()), {p, 1, n, n}, torch::kFloat).clone();
  auto obj = torch::view_as_complex(
                 torch::from_blob(const_cast<std::complex<float>*>(scan.object.data()), {S, S, 2}, torch::kFloat).clone())
                 .contiguous();
  // Labels from the reconstruction, which ptychography fixes only up to a global phase and
  // (with the probe reconstructed too) a scale: the phase is turned so that the scanned area's
  // mean is real, the amplitude divided by its 99th percentile there and clipped to [0,1].
  auto mask = torch::zeros({S, S}, torch::kBool);
  for (const auto& [r, c] : scan.positions) mask.narrow(0, r, n).narrow(1, c, n).fill_(true);
  auto inside = obj.masked_select(mask);
  auto mean = inside.mean();
  const double mag = std::abs(mean.item<c10::complex<float>>());
  if (mag > 0) obj = obj * (mean.conj() / mag);
  auto amp = obj.abs();
  const double scale = torch::quantile(amp.masked_select(mask), 0.99).item<double>();
  if (!(scale > 0)) throw RehearsalError(name + ": the reconstructed object is zero over the scanned area");
  amp = (amp / scale).clamp(0, 1);
  auto phase = torch::angle(obj);
  std::vector<torch::Tensor> targets;
  for (const auto& [r, c] : scan.positions)
    targets.push_back(torch::stack({amp.narrow(0, r, n).narrow(1, c, n), phase.narrow(0, r, n).narrow(1, c, n)}));
  auto y = torch::stack(targets).to(torch::kFloat);
  std::vector<std::int64_t> tr, te;
  for (std::int64_t i = 0; i < p; ++i) (i % d.test_every == 0 ? te : tr).push_back(i);
  auto ti = first_rows(torch::tensor(tr), d.train_per_task);
  auto vi = first_rows(torch::tensor(te), d.test_per_task);
  if (s.train.empty()) {  // the weight of the error: the reconstructed probe's intensity of scan 0
    auto w = torch::from_blob(const_cast<float*>(scan.probe_intensity.data()), {n, n}, torch::kFloat).clone();
    if (!(w.sum().item<double>() > 0)) throw RehearsalError(name + ": the probe's intensity is zero");
    s.weight = w / w.sum();
    s.output_sizes = {2, n, n};
  }
  s.train.push_back({x.index_select(0, ti), y.index_select(0, ti)});
  s.test.push_back({x.index_select(0, vi), y.index_select(0, vi)});
}

Job::Job(const TrainerConfig& cfg, const RankOptions& opt) : cfg_(cfg), opt_(opt) {}
Job::~Job() = default;

bool Job::ensure_tasks(int upto) {
  if (!feed_) return true;
  const int last = std::min(upto, cfg_.dataset.tasks - 1);
  while (static_cast<int>(data_.train.size()) <= last) {
    const auto seq = static_cast<std::int64_t>(data_.train.size());
    const auto file = feed_->wait_for(seq, opt_.stop_flag);
    if (!file) return false;
    try {
      add_scan(data_, read_scan_file(*file), cfg_.dataset, file->string());
    } catch (const RehearsalError&) {
      throw;
    } catch (const std::exception& e) {
      throw RehearsalError(std::string("scan ") + std::to_string(seq) + " of stream '" + cfg_.dataset.stream + "': " + e.what());
    }
  }
  return true;
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

std::string read_text(const fs::path& file) {
  try {
    return read_file(file);
  } catch (const Error& e) {
    throw RehearsalError(std::string("cannot read ") + e.what());
  }
}

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
  make_optimizer();
}

// weight_align (WA, "weight aligning"): at the end of task t > 0, the rows of the
// classifier's weight for t's classes are scaled by gamma = mean norm of the older classes'
// rows / mean norm of the new ones'. Trained on a stream of new classes only, those rows
// grow longer than the old ones, and the logits with them: this removes the bias towards
// the latest classes without touching what the features are. The same on every rank (same
// weights); the evaluated average (train.ema) gets its own gamma. Returns the model's
// gamma (0: nothing was scaled).
double Job::align_weights(int task) {
  const std::int64_t k = cfg_.dataset.classes_per_task, old = task * k;
  if (old <= 0) return 0;  // task 0: no older classes to align to
  torch::NoGradGuard ng;
  double gamma = 0;
  for (auto* net : {model_.get(), ema_.get()}) {
    if (!net) continue;
    torch::Tensor w = net->class_weights();
    if (!w.defined() || old + k > w.size(0)) continue;
    const torch::Tensor norms = w.norm(2, 1);
    const double mean_old = norms.narrow(0, 0, old).mean().item<double>();
    const double mean_new = norms.narrow(0, old, k).mean().item<double>();
    if (mean_new <= 0) continue;
    w.narrow(0, old, k).mul_(mean_old / mean_new);
    if (net == model_.get()) gamma = mean_old / mean_new;
  }
  return gamma;
}

// A new optimizer (no state: Adam's moment estimates, SGD's momentum) on the model's
// parameters, at the base learning rate.
void Job::make_optimizer() {
  const bool adam = cfg_.train.optimizer == "adam";
  const double lr = base_lr_ = cfg_.train.lr > 0 ? cfg_.train.lr : (adam ? 1e-3 : 0.05);
  if (adam) optim_ = std::make_unique<torch::optim::Adam>(model_->parameters(), torch::optim::AdamOptions(lr));
  else
    optim_ = std::make_unique<torch::optim::SGD>(model_->parameters(),
                                                 torch::optim::SGDOptions(lr).momentum(cfg_.train.momentum));
}

// The learning rate of the next step (train.schedule): cosine goes from the base rate at a
// task's first step towards 0 at its last, and starts again (with a new optimizer: train())
// at the next task. A function of the position only, so a resumed job continues on the same
// curve.
void Job::schedule_lr(std::int64_t steps_per_epoch) {
  if (cfg_.train.schedule != "cosine") return;
  const double total = static_cast<double>(cfg_.train.epochs) * static_cast<double>(steps_per_epoch);
  const double done = static_cast<double>(pos_.epoch) * static_cast<double>(steps_per_epoch) + static_cast<double>(pos_.batch);
  const double lr = total > 0 ? base_lr_ * 0.5 * (1 + std::cos(M_PI * done / total)) : base_lr_;
  for (auto& group : optim_->param_groups()) group.options().set_lr(lr);
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

// train.logit_adjust (logit-adjusted cross-entropy, Menon et al. 2021): log of each seen
// class's share of `labels` (the step's labelled samples; +1 each, so a class absent from
// this step keeps a finite offset), one entry per class seen up to `task`. Added to the
// logits inside the step's cross-entropy terms, it takes the class imbalance of a step
// (b stream samples of k new classes against a few representatives of each old one) out of
// what the logits learn; classes not seen yet are left out of the softmax. Undefined (no
// adjustment) without the key, or for strategies that draw no representatives.
torch::Tensor Job::logit_prior(const torch::Tensor& labels, int task) const {
  if (!cfg_.adjusts_logits()) return {};
  const std::int64_t seen = (task + 1) * cfg_.dataset.classes_per_task;
  const torch::Tensor counts = torch::bincount(labels, {}, seen).narrow(0, 0, seen).to(torch::kFloat) + 1.0f;
  return (counts / counts.sum()).log();
}

// One step on the stream batch `idx` of task `task` (plus representatives).
double Job::train_step(const torch::Tensor& idx, int task) {
  const auto t0 = Clock::now();
  const double cpu0 = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
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
  torch::Tensor input = x;
  if (nreps > 0) {
    torch::Tensor rx = reps.batch.tensors[0];
    // train.augment: fresh draws every step, from (seed, step, rank) only, so a resume and
    // every rank reproduce them.
    if (cfg_.train.augment == "shift-flip")
      rx = shift_flip(rx, cfg_.seed ^ 0x6175676d656e74ull, (static_cast<std::uint64_t>(pos_.step) << 16) | static_cast<std::uint64_t>(rank_));
    input = torch::cat({x, rx});
  }
  optim_->zero_grad();
  torch::Tensor out = model_->forward(input);
  if (det) {
    const auto w0 = Clock::now();
    flush_insertions("mid-step");  // step i-1's candidates are in the buffers
    wait_s += seconds_since(w0);
    sampler_->prefetch();  // draw i+1 sees them, and nothing newer
  }
  torch::Tensor stream_out = out.narrow(0, 0, b);
  // The representatives in the step's task loss: ER all R; DER++ the second half (the first
  // half is for the distance to the stored outputs: every rehearsal strategy trains on the
  // same number of samples a step); DER none.
  const torch::Tensor& ry = nreps > 0 ? reps.batch.tensors[1] : y;
  const std::int64_t h = cfg_.strategy == "derpp" ? (nreps + 1) / 2 : cfg_.strategy == "der" ? nreps : 0;
  // The labels of the step's task-loss terms: what the logit prior counts, and ER's one
  // task loss over the stream and the representatives together.
  const bool er = cfg_.strategy == "er" && nreps > 0;
  const torch::Tensor labels =
      nreps > 0 && (er || cfg_.adjusts_logits()) ? torch::cat({y, ry.narrow(0, h, nreps - h)}) : y;
  const torch::Tensor prior = logit_prior(labels, task);
  auto loss_of = [&](const torch::Tensor& z, const torch::Tensor& l) {
    return prior.defined() ? torch::nn::functional::cross_entropy(z.narrow(1, 0, prior.size(0)) + prior, l)
                           : task_loss(data_, z, l);
  };
  torch::Tensor loss = er ? loss_of(out, labels) : loss_of(stream_out, y);
  if (nreps > 0 && !er) {
    // DER: alpha * the distance to the stored outputs; DER++ plus beta * the task loss.
    torch::Tensor rout = out.narrow(0, b, nreps);
    loss = loss + cfg_.alpha * output_distance(data_, rout.narrow(0, 0, h), reps.batch.outputs.narrow(0, 0, h));
    if (nreps - h > 0) loss = loss + cfg_.beta * loss_of(rout.narrow(0, h, nreps - h), ry.narrow(0, h, nreps - h));
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
  log_step(lv, step_s, cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - cpu0, wait_s, nreps);
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
  out.resize(static_cast<std::size_t>(cfg_.dataset.tasks), std::nan(""));  // ptycho-stream: scans yet to come
  return out;
}

// Once a step, every rank: the largest stop request over the ranks, and (in the same
// all-reduce) the state of a background checkpoint, which completes it once every rank's
// file is durable.
int Job::agree_stop(int local) {
  // A checkpoint request (SIGUSR1) rides in the same all-reduce: every rank sees it at the
  // same step, so they checkpoint together.
  const int asked = opt_.checkpoint_flag && opt_.checkpoint_flag->exchange(0) != 0 ? 1 : 0;
  const auto v = max_over_ranks({local, checkpoint_state(), asked});
  poll_checkpoint(static_cast<int>(v[1]));
  checkpoint_asked_ = checkpoint_asked_ || v[2] != 0;  // until a checkpoint is written (same on every rank)
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

void Job::log_step(double loss, double step_s, double cpu_s, double wait_s, std::int64_t reps) {
  sum_step_s_ += step_s;
  sum_wait_s_ += wait_s;
  ++steps_here_;
  if (rank_ != 0) return;
  const double sps = step_s > 0 ? static_cast<double>((cfg_.train.batch_size + reps) * world_) / step_s : 0;
  char line[512];
  std::snprintf(line, sizeof line,
                "{\"step\":%" PRId64 ",\"task\":%d,\"epoch\":%d,\"loss\":%.9g,\"lr\":%.9g,\"step_ms\":%.4f,"
                "\"cpu_ms\":%.4f,\"samples_per_s\":%.1f,\"buffer_fill\":%" PRId64 ",\"representatives\":%" PRId64
                ",\"wait_ms\":%.4f}\n",
                pos_.step, pos_.task, pos_.epoch, loss, optim_->param_groups()[0].options().get_lr(), step_s * 1e3,
                cpu_s * 1e3, sps, buffer_ ? buffer_->size() : 0, reps, wait_s * 1e3);
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
    if (progress_fd_ >= 0) {  // diaspora run's progress channel (docs/run.md): one write, ignored if it fails
      char msg[320];
      const int len = std::snprintf(msg, sizeof msg,
                                    "progress %.6f %" PRId64 "\nmetric step_time %.6f loss %.9g buffer_fill %" PRId64
                                    " samples_per_s %.1f wait_ms %.4f\n",
                                    (pos_.task + frac) / cfg_.dataset.tasks, pos_.step, step_s, loss,
                                    buffer_ ? buffer_->size() : 0, sps, wait_s * 1e3);
      tell_progress(std::string_view(msg, static_cast<std::size_t>(len)));
    }
    if (plugin_) {
      const double overall = (pos_.task + frac) / cfg_.dataset.tasks;
      plugin_->progress(pos_.step, overall,
                        {{"loss", loss}, {"samples_per_s", sps}, {"step_ms", step_s * 1e3}, {"wait_ms", wait_s * 1e3},
                         {"buffer_fill", static_cast<double>(buffer_ ? buffer_->size() : 0)}});
    }
  }
}

void Job::tell_progress(std::string_view lines) {
  if (progress_fd_ >= 0 && ::write(progress_fd_, lines.data(), lines.size()) < 0 && errno == EPIPE) progress_fd_ = -1;
}

// After a task's evaluation: its row of the accuracy (error) matrix as one report, on
// diaspora run's progress channel and to the plugin (the console's Training page). At most
// 30 tasks are named (a report carries 32 metrics); the average covers every task seen.
void Job::report_evaluation(const std::vector<double>& row, double average) {
  const char* what = data_.classification ? "accuracy" : "error";
  const std::size_t seen = std::min<std::size_t>(static_cast<std::size_t>(pos_.task) + 1, 30);
  std::vector<std::pair<std::string, double>> m{{"eval_after_task", static_cast<double>(pos_.task)}};
  for (std::size_t j = 0; j < seen && j < row.size(); ++j) m.emplace_back(std::string(what) + ".t" + std::to_string(j), row[j]);
  m.emplace_back(std::string("average_") + what, average);
  if (progress_fd_ >= 0) {
    std::string msg = "metric";
    char v[64];
    for (const auto& [n, x] : m) {
      std::snprintf(v, sizeof v, " %.9g", x);
      msg += " " + n + v;
    }
    msg += "\n";
    tell_progress(msg);
  }
  if (plugin_) {
    std::vector<diaspora_metric_value> mv;
    for (const auto& [n, x] : m) mv.push_back({n.c_str(), x});
    plugin_->progress(pos_.step, static_cast<double>(pos_.task + 1) / cfg_.dataset.tasks, mv);
  }
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
  s["augment"] = cfg_.train.augment;
  s["logit_adjust"] = cfg_.adjusts_logits();
  s["weight_align"] = cfg_.aligns_weights();
  s["world_size"] = world_;
  s["seed"] = cfg_.seed;
  s["dataset"] = cfg_.dataset.name;
  s["tasks"] = cfg_.dataset.tasks;
  s["steps"] = pos_.step;
  s["runtime_s"] = runtime_so_far();
  s["cpu_s"] = cpu_so_far();
  json::array mat;
  for (const auto& row : matrix_) mat.push_back(row_json(row));
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
  const std::string summary = json::serialize(s);
  write_file_atomic(opt_.out / "summary.json", summary + "\n");
  if (progress_fd_ >= 0) tell_progress("result " + summary + "\n");  // the run's result for the job, wherever its folder is
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
  cpu_started_ = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  torch::set_num_threads(cfg_.train.threads > 0 ? cfg_.train.threads
                                                : static_cast<int>(std::max(1u, hw / static_cast<unsigned>(world_))));
  // The plugin first, so that a job failing while it starts (missing data, a bad
  // checkpoint, a rendezvous that fails) is reported as a failed task too.
  if (rank_ == 0) plugin_ = std::make_unique<PluginLink>(cfg_, opt_.resume.has_value());
  if (const char* fd = std::getenv("DIASPORA_PROGRESS_FD"); fd && rank_ == 0) progress_fd_ = std::atoi(fd);
  try {
    setup();
  } catch (const std::exception& e) {
    if (plugin_) plugin_->finished(false, e.what());
    throw;
  }
  if (data_.train.empty()) {
    if (rank_ == 0) print_line("stopped before scan 0 of stream '" + cfg_.dataset.stream + "' arrived: nothing to checkpoint");
    return kTrainCheckpointed;
  }
  return train();
}

void Job::setup() {
  torch::manual_seed(cfg_.seed);
  data_ = load_stream(cfg_);
  if (cfg_.dataset.name == "ptycho-stream") {
    DatasetConfig d = cfg_.dataset;
    if (d.cache_dir.empty()) d.cache_dir = (opt_.out / "scans").string();  // scans fetched from the relay
    feed_ = std::make_unique<ScanFeed>(std::move(d));
    if (!ensure_tasks(0)) return;  // stopped before the stream's first scan arrived
  }
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
      if (feed_) {  // ptycho-stream: wait for this task's scan (every rank reads the same log)
        const int stop = agree_stop(ensure_tasks(pos_.task) ? 0 : kTrainCheckpointed);
        if (stop != 0) {
          finish_checkpoint();  // the previous task's end is this position's checkpoint
          if (rank_ == 0)
            print_line("stopped while waiting for scan " + std::to_string(pos_.task) + "; continue with --resume " +
                       opt_.out.string());
          return stop;
        }
      }
      if (static_cast<std::size_t>(pos_.task) < matrix_.size()) continue;  // evaluated before the checkpoint
      const bool fresh_task = pos_.epoch == 0 && pos_.batch == 0;
      if (cfg_.strategy == "scratch" && fresh_task && pos_.task > 0) {
        torch::manual_seed(cfg_.seed * 7919 + static_cast<std::uint64_t>(pos_.task));
        build_model();  // scratch retrains a new model on everything seen so far
      } else if (cfg_.train.schedule == "cosine" && fresh_task && pos_.task > 0) {
        // A restarted schedule restarts the optimizer too. Adam's second moments, small at the
        // end of a converged task, turn the new task's large first gradients into steps of
        // several times the rate: without the restart incremental's and ER at 200's networks
        // died (one class left), though DER++ gained a point (docs/rehearsal.md).
        make_optimizer();
      }
      const std::int64_t spe = steps_per_epoch(pos_.task);
      for (; pos_.epoch < cfg_.train.epochs; ++pos_.epoch, pos_.batch = 0) {
        const torch::Tensor order = epoch_order(pos_.task, pos_.epoch);
        for (; pos_.batch < spe; ) {
          const std::int64_t bs = cfg_.train.batch_size;
          torch::Tensor idx = order.narrow(0, (pos_.batch * world_ + rank_) * bs, bs);
          schedule_lr(spe);
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
          if (checkpoint_asked_ && !task_done) {
            if (rank_ == 0) print_line("checkpoint requested (SIGUSR1): writing ckpt-" + std::to_string(pos_.step));
            save_checkpoint("request", true);
            checkpoint_asked_ = false;
          }
          else if (cfg_.checkpoint_every > 0 && pos_.step % cfg_.checkpoint_every == 0 && !task_done)
            save_checkpoint("period", true);
        }
      }
      flush_insertions("task end");
      const double gamma = cfg_.aligns_weights() ? align_weights(pos_.task) : 0.0;
      matrix_.push_back(evaluate());
      if (rank_ == 0) {
        const auto& row = matrix_.back();
        double avg = 0;
        for (std::size_t j = 0; j <= static_cast<std::size_t>(pos_.task); ++j) avg += row[j];
        avg /= pos_.task + 1;
        json::object e;
        e["eval_after_task"] = pos_.task;
        e["step"] = pos_.step;
        e[data_.classification ? "accuracy" : "error"] = row_json(row);
        e["average_seen"] = avg;
        if (gamma > 0) e["weight_align_gamma"] = gamma;  // the new classes' rows were scaled by it
        metrics_ << json::serialize(e) << "\n";
        metrics_.flush();
        report_evaluation(row, avg);
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
      checkpoint_asked_ = false;  // a request made during the task is answered by this one
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

}  // namespace detail

using detail::Job;

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
