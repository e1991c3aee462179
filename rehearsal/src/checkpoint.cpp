// diaspora-train's checkpoints: written at step boundaries (in the background when asked),
// atomically published (rank files, manifest, LATEST), and loaded on --resume on the same
// or another world size (docs/rehearsal.md, "Checkpoints").
#include "job.hpp"
#include "checkpoint_item.hpp"
#include "manifest.hpp"

#include "diaspora/json_exact.hpp"

namespace diaspora::rehearsal::detail {

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
  if (d.name == "ptycho-stream") {  // the relay's address may change between runs; its log's content does not
    o["topic"] = d.topic;
    o["stream"] = d.stream;
    o["test_every"] = d.test_every;
  } else if (data_.classification) {
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
    m["elapsed_s"] = runtime_so_far();
    m["cpu_s"] = cpu_so_far();
    json::array mat;
    for (const auto& row : matrix_) mat.push_back(row_json(row));
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
    if (rank_ == 0) checkpoint_published(name);
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
  if (world_ == 1) return checkpoint_published(p->name);  // the writer published it
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
  if (rank_ == 0) checkpoint_published(p->name);
}

void Job::checkpoint_published(const std::string& name) {
  if (cfg_.checkpoint_item_topic.empty()) return;
  if (!shipper_) shipper_ = std::make_unique<CheckpointShipper>(cfg_);
  const fs::path dir = checkpoint_root() / name;
  std::int64_t step = 0;
  std::from_chars(name.data() + 5, name.data() + name.size(), step);  // "ckpt-STEP"
  try {
    const std::string uri = shipper_->ship(dir, step);
    print_line("checkpoint " + name + " put as " + uri);
    tell_progress("checkpoint " + uri + "\n");  // diaspora run keeps the newest: the next attempt resumes from it
  } catch (const RehearsalError& e) {
    print_line(std::string("warning: ") + e.what() + "; the checkpoint stays in " + dir.string() + " only");
  }
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
  std::string text;
  try {
    text = read_text(dir / "manifest.json");
  } catch (const std::exception& e) {
    throw RehearsalError("checkpoint " + dir.string() + ": manifest.json unreadable: " + e.what());
  }
  auto mismatch = [&](const char* key, const std::string& have, const std::string& want) {
    if (have != want)
      throw RehearsalError("checkpoint " + dir.string() + " was written with " + key + " " + have +
                           "; this config has " + want + " (resume with the same config)");
  };
  const Manifest m = parse_manifest(text, (dir / "manifest.json").string(), [&](const Manifest& id) {
    mismatch("strategy", id.strategy, cfg_.strategy);
    mismatch("dataset", id.dataset, cfg_.dataset.name);
    mismatch("tasks", std::to_string(id.tasks), std::to_string(cfg_.dataset.tasks));
    // Before the field existed, ptycho-sim's matrix held the whole-patch MSE: rows of the two
    // errors must not be mixed in one matrix.
    if (!data_.classification && !id.metric)
      throw RehearsalError("checkpoint " + dir.string() +
                           " was written by an older diaspora-train whose ptycho-sim error was the whole-patch "
                           "MSE; its error matrix cannot be continued with ptycho_error: start the job again");
    if (id.metric) mismatch("metric", *id.metric, metric_name(data_));
    // The averaged weights continue only with the decay they were averaged with (a
    // checkpoint from before the field had none).
    auto text_of = [](double v) {
      char b[32];
      std::snprintf(b, sizeof b, "%.10g", v);
      return std::string(b);
    };
    if (id.ema != cfg_.train.ema) mismatch("train.ema", text_of(id.ema), text_of(cfg_.train.ema));
    // Checkpoints from before the field was written carry no stream identity: not checked.
    if (id.stream) {
      for (const auto& [key, want] : stream_identity()) {
        const json::value* h = id.stream->if_contains(key);
        const std::string setting = key == "seed"         ? std::string("seed")
                                    : key == "batch_size" ? std::string("train.batch_size")
                                                          : "dataset." + std::string(key);
        // Exact: integers as their digits (a seed may exceed 2^53), numbers written from a
        // double as the same shortest text.
        mismatch(setting.c_str(), h ? json::serialize(*h) : std::string("none"), json::serialize(want));
      }
    } else if (id.seed) {  // older checkpoints: the seed at least
      mismatch("seed", json::serialize(*id.seed), json::serialize(json::value(cfg_.seed)));
    }
  });
  pos_.step = m.step;
  pos_.task = m.task;
  pos_.epoch = m.epoch;
  pos_.batch = m.batch;
  elapsed_before_ = m.elapsed_s;
  cpu_before_ = m.cpu_s;
  matrix_ = m.matrix;
  const int old_world = m.world_size;
  if (pos_.task > cfg_.dataset.tasks ||
      (pos_.task < static_cast<int>(data_.train.size()) && pos_.batch > steps_per_epoch_at(pos_.task, old_world)))
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

}  // namespace diaspora::rehearsal::detail
