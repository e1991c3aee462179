// Rehearsal config files: YAML -> JSON (core), schema validation, then the structs.
// No LibTorch here, so this translation unit stays cheap to compile.
#include <boost/json.hpp>

#include <algorithm>
#include <cstdint>


#include "diaspora/event.hpp"  // parse_rfc3339_us
#include "diaspora/rehearsal.hpp"
#include "diaspora/rehearsal_config.hpp"
#include "diaspora/trainer.hpp"

namespace diaspora::rehearsal {
namespace json = boost::json;

namespace {

Location locate(const YamlDocument& doc, const std::string& path) {
  auto it = doc.value_locations.find(path);
  return it != doc.value_locations.end() ? it->second : Location{1, 1};
}

// A problem with the value at `path`, located where the document has it.
void add_diag(std::vector<Diagnostic>& diags, const YamlDocument& doc, const std::string& file, const std::string& path,
              std::string msg) {
  const Location l = locate(doc, path);
  diags.push_back({file, l.line, l.column, path, std::move(msg)});
}

// Throws `diags`, if any. A problem in an overridden value (line 0: apply_override's
// location) is the override's: its FILE becomes "--set KEY=VALUE".
void throw_if_any(std::vector<Diagnostic> diags, const std::vector<std::string>& overrides) {
  if (diags.empty()) return;
  for (auto& d : diags) {
    if (d.line != 0) continue;
    for (const auto& o : overrides) {
      const std::string key = o.substr(0, o.find('='));
      if (d.path == key || d.path.rfind(key + ".", 0) == 0 || d.path.rfind(key + "[", 0) == 0) d.file = "--set " + o;
    }
  }
  throw SpecError(std::move(diags));
}

// An integer the schema has checked. YAML may write it as a float (200. or 1e3 is an
// integer to JSON Schema): read exactly when it fits, else clamped to the type's range
// (found by tests/fuzz/fuzz_train_config.cpp: "buffer_size: 200." ended diaspora-train with
// an uncaught exception). Never throws.
std::int64_t as_i64(const json::value& v) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64()) return static_cast<std::int64_t>(std::min<std::uint64_t>(v.get_uint64(), INT64_MAX));
  if (v.is_double()) return static_cast<std::int64_t>(std::clamp(v.get_double(), -9.2e18, 9.2e18));
  return 0;
}

std::uint64_t as_u64(const json::value& v) {
  if (v.is_uint64()) return v.get_uint64();
  if (v.is_int64()) return static_cast<std::uint64_t>(std::max<std::int64_t>(v.get_int64(), 0));
  if (v.is_double()) return static_cast<std::uint64_t>(std::clamp(v.get_double(), 0.0, 1.8e19));
  return 0;
}

// The buffer:, insertion: and sampling: sections of a validated document.
RehearsalConfig rehearsal_sections(const YamlDocument& doc, const std::string& file, std::vector<Diagnostic>& diags) {
  RehearsalConfig c;
  const json::object& root = doc.root.as_object();
  auto fail = [&](const std::string& path, std::string msg) { add_diag(diags, doc, file, path, std::move(msg)); };

  if (const auto* b = root.if_contains("buffer")) {
    const json::object& o = b->as_object();
    if (const auto* v = o.if_contains("memory")) {
      auto bytes = parse_size(*v);
      if (!bytes || *bytes == 0) fail("buffer.memory", "must be at least 1 byte");
      else c.buffer.memory_bytes = *bytes;
    }
    if (const auto* v = o.if_contains("max_samples")) c.buffer.max_samples = as_u64(*v);
    if (const auto* v = o.if_contains("class_balanced")) c.buffer.class_balanced = v->as_bool();
    if (const auto* v = o.if_contains("label_tensor")) c.buffer.label_tensor = static_cast<int>(as_i64(*v));
    if (const auto* v = o.if_contains("seed")) c.buffer.seed = as_u64(*v);
  }
  if (const auto* s = root.if_contains("insertion")) {
    const json::object& o = s->as_object();
    if (const auto* v = o.if_contains("queue_batches")) c.insertion.queue_batches = static_cast<std::size_t>(as_u64(*v));
  }
  if (const auto* s = root.if_contains("sampling")) {
    const json::object& o = s->as_object();
    if (const auto* v = o.if_contains("representatives")) c.sampling.representatives = as_i64(*v);
    if (const auto* v = o.if_contains("seed")) c.sampling.seed = as_u64(*v);
    if (const auto* v = o.if_contains("prefetch")) c.sampling.prefetch = v->as_bool();
    if (const auto* v = o.if_contains("backend")) c.sampling.backend = std::string(v->as_string());
    if (const auto* v = o.if_contains("comm_device")) c.sampling.comm_device = std::string(v->as_string());
    if (const auto* v = o.if_contains("timeout")) {
      auto d = parse_duration(v->as_string());
      if (!d || d->count() < 0.001) fail("sampling.timeout", "must be at least 1ms");
      else c.sampling.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(d->count() * 1000.0));
    }
    const bool cuda = c.sampling.comm_device.rfind("cuda", 0) == 0;
    if (c.sampling.backend == "nccl" && !cuda)
      fail(o.contains("comm_device") ? "sampling.comm_device" : "sampling.backend",
           "backend nccl needs comm_device cuda (or cuda:N)");
    if (c.sampling.backend == "gloo" && cuda)
      fail("sampling.comm_device", "backend gloo communicates from the CPU: use comm_device cpu, or backend nccl");
  }
  return c;
}

// Sets doc.root at `path` (dotted keys; objects are created on the way) to `value`.
void apply_override(YamlDocument& doc, const std::string& spec, std::vector<Diagnostic>& diags) {
  const std::string where = "--set " + spec;
  auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0) {
    diags.push_back({where, 0, 0, "", "expected KEY=VALUE, e.g. --set train.epochs=2"});
    return;
  }
  const std::string key = spec.substr(0, eq);
  YamlDocument v = parse_yaml(spec.substr(eq + 1), where);
  if (!v.errors.empty()) {
    diags.push_back({where, 0, 0, key, "the value is not valid YAML: " + v.errors.front().message});
    return;
  }
  if (doc.root.is_null()) doc.root = json::object();  // a document of comments only
  if (!doc.root.is_object()) {  // a list or a scalar: not replaced, the schema reports it
    diags.push_back({where, 0, 0, key, "the config is not a mapping of keys, so there is no key to set"});
    return;
  }
  json::object* obj = &doc.root.as_object();
  std::size_t start = 0;
  for (;;) {
    auto dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part.empty()) {
      diags.push_back({where, 0, 0, key, "empty key component"});
      return;
    }
    if (dot == std::string::npos) {
      (*obj)[part] = v.root;
      doc.value_locations[key] = Location{0, 0};
      return;
    }
    json::value& next = (*obj)[part];
    if (!next.is_object()) next = json::object();
    obj = &next.as_object();
    start = dot + 1;
  }
}

YamlDocument parse_checked(std::string_view yaml, const std::string& file, const std::vector<std::string>& overrides) {
  YamlDocument doc = parse_yaml(yaml, file);  // an empty file is an error, as for every YAML input ({} = defaults)
  std::vector<Diagnostic> diags = doc.errors;
  if (diags.empty()) {
    for (const auto& o : overrides) apply_override(doc, o, diags);
  }
  if (diags.empty()) diags = validate_yaml(doc, "rehearsal.schema.json", file);
  throw_if_any(std::move(diags), overrides);
  return doc;
}

constexpr std::uintmax_t kMaxConfigBytes = 1u << 20;

}  // namespace

RehearsalConfig load_config_string(std::string_view yaml, std::string_view name) {
  const std::string file(name);
  YamlDocument doc = parse_checked(yaml, file, {});
  std::vector<Diagnostic> diags;
  RehearsalConfig c = rehearsal_sections(doc, file, diags);
  throw_if_any(std::move(diags), {});
  return c;
}

RehearsalConfig load_config_file(const std::filesystem::path& file) {
  return load_config_string(read_yaml_file(file, kMaxConfigBytes, "rehearsal config"), file.string());
}

TrainerConfig load_trainer_config_string(std::string_view yaml, std::string_view name,
                                         const std::vector<std::string>& overrides) {
  const std::string file(name);
  YamlDocument doc = parse_checked(yaml, file, overrides);
  std::vector<Diagnostic> diags;
  TrainerConfig c;
  c.rehearsal = rehearsal_sections(doc, file, diags);
  auto fail = [&](const std::string& path, std::string msg) { add_diag(diags, doc, file, path, std::move(msg)); };
  const json::object& root = doc.root.as_object();
  auto num = [](const json::value& v) { return v.is_double() ? v.as_double() : v.is_int64() ? static_cast<double>(v.as_int64()) : static_cast<double>(v.as_uint64()); };
  auto i64 = as_i64;
  auto str = [](const json::value& v) { return std::string(v.as_string()); };
  if (const auto* v = root.if_contains("strategy")) c.strategy = str(*v);
  if (const auto* v = root.if_contains("alpha")) c.alpha = num(*v);
  if (const auto* v = root.if_contains("beta")) c.beta = num(*v);
  if (const auto* v = root.if_contains("weight_align")) c.weight_align = v->as_bool();
  if (const auto* v = root.if_contains("buffer_size")) c.buffer_size = i64(*v);
  if (const auto* v = root.if_contains("seed")) c.seed = as_u64(*v);
  if (const auto* d = root.if_contains("dataset")) {
    const json::object& o = d->as_object();
    DatasetConfig& ds = c.dataset;
    if (const auto* v = o.if_contains("name")) ds.name = str(*v);
    if (const auto* v = o.if_contains("dir")) ds.dir = str(*v);
    if (const auto* v = o.if_contains("tasks")) ds.tasks = static_cast<int>(i64(*v));
    if (const auto* v = o.if_contains("classes_per_task")) ds.classes_per_task = static_cast<int>(i64(*v));
    if (const auto* v = o.if_contains("train_per_task")) ds.train_per_task = i64(*v);
    if (const auto* v = o.if_contains("test_per_task")) ds.test_per_task = i64(*v);
    if (const auto* v = o.if_contains("patch")) ds.patch = static_cast<int>(i64(*v));
    if (const auto* v = o.if_contains("object_size")) ds.object_size = static_cast<int>(i64(*v));
    if (const auto* v = o.if_contains("scan_step")) ds.scan_step = static_cast<int>(i64(*v));
    if (const auto* v = o.if_contains("photons")) ds.photons = num(*v);
    if (const auto* v = o.if_contains("test_every")) ds.test_every = static_cast<int>(i64(*v));
    if (const auto* v = o.if_contains("probe_drift")) ds.probe_drift = num(*v);
    if (const auto* v = o.if_contains("relay")) ds.relay = str(*v);
    if (const auto* v = o.if_contains("topic")) ds.topic = str(*v);
    if (const auto* v = o.if_contains("stream")) ds.stream = str(*v);
    if (const auto* v = o.if_contains("ca_file")) ds.ca_file = str(*v);
    if (const auto* v = o.if_contains("token_file")) ds.token_file = str(*v);
    if (const auto* v = o.if_contains("wait")) ds.wait_s = num(*v);
    if (const auto* v = o.if_contains("scan_dir")) ds.scan_dir = str(*v);
    if (const auto* v = o.if_contains("item_topic")) ds.item_topic = str(*v);
    if (const auto* v = o.if_contains("cache_dir")) ds.cache_dir = str(*v);
    if (const auto* v = o.if_contains("since")) {
      const auto us = parse_rfc3339_us(str(*v));
      if (!us) throw RehearsalError("dataset.since: '" + str(*v) + "' is not an RFC 3339 time (e.g. 2026-12-07T10:00:00Z)");
      ds.since_us = *us;
    }
  }
  if (const auto* t = root.if_contains("train")) {
    const json::object& o = t->as_object();
    TrainConfig& tr = c.train;
    if (const auto* v = o.if_contains("epochs")) tr.epochs = static_cast<int>(i64(*v));
    if (const auto* v = o.if_contains("batch_size")) tr.batch_size = i64(*v);
    if (const auto* v = o.if_contains("lr")) tr.lr = num(*v);
    if (const auto* v = o.if_contains("optimizer")) tr.optimizer = str(*v);
    if (const auto* v = o.if_contains("momentum")) tr.momentum = num(*v);
    if (const auto* v = o.if_contains("schedule")) tr.schedule = str(*v);
    if (const auto* v = o.if_contains("augment")) tr.augment = str(*v);
    if (const auto* v = o.if_contains("logit_adjust")) tr.logit_adjust = v->as_bool();
    if (const auto* v = o.if_contains("ema")) tr.ema = num(*v);
    if (const auto* v = o.if_contains("threads")) tr.threads = static_cast<int>(i64(*v));
    if (const auto* v = o.if_contains("deterministic")) tr.deterministic = v->as_bool();
    if (const auto* v = o.if_contains("log_every")) tr.log_every = i64(*v);
  }
  if (const auto* k = root.if_contains("checkpoint")) {
    const json::object& o = k->as_object();
    if (const auto* v = o.if_contains("every_steps")) c.checkpoint_every = i64(*v);
    if (const auto* v = o.if_contains("dir")) c.checkpoint_dir = str(*v);
    if (const auto* v = o.if_contains("item_topic")) c.checkpoint_item_topic = str(*v);
    if (const auto* v = o.if_contains("relay")) c.checkpoint_relay = str(*v);
    if (const auto* v = o.if_contains("ca_file")) c.checkpoint_ca_file = str(*v);
    if (const auto* v = o.if_contains("token_file")) c.checkpoint_token_file = str(*v);
  }
  if (const auto* p = root.if_contains("plugin")) {
    const json::object& o = p->as_object();
    if (const auto* v = o.if_contains("spec")) c.plugin_spec = str(*v);
    if (const auto* v = o.if_contains("task_id")) c.plugin_task_id = str(*v);
    if (const auto* v = o.if_contains("site")) c.plugin_site = str(*v);
  }
  // Consistency the schema cannot express.
  const DatasetConfig& ds = c.dataset;
  const bool ds_given = root.contains("dataset");
  if (ds.name == "fashion-mnist" && ds.tasks * ds.classes_per_task != 10)
    fail(ds_given && root.at("dataset").as_object().contains("tasks") ? "dataset.tasks" : "dataset.classes_per_task",
         "fashion-mnist has 10 classes: tasks x classes_per_task must be 10 (5 x 2, 2 x 5, 10 x 1), not " +
             std::to_string(ds.tasks) + " x " + std::to_string(ds.classes_per_task));
  if (c.weight_align && ds.name != "fashion-mnist")
    fail("weight_align", ds.name + " has no classifier whose class weights could be aligned: remove weight_align");
  if (c.train.augment != "none" && ds.name != "fashion-mnist")
    fail("train.augment", c.train.augment + " mirrors and moves images of labelled classes; " + ds.name +
                              "'s targets would not move with its diffraction patterns: use none");
  if (c.train.logit_adjust && ds.name != "fashion-mnist")
    fail("train.logit_adjust", ds.name + " has no classes whose logits could be adjusted: remove train.logit_adjust");
  if (ds.name == "ptycho-sim") {
    if (ds.patch % 8 != 0) fail("dataset.patch", "must be a multiple of 8 (the encoder halves it three times)");
    if (ds.object_size < ds.patch) fail("dataset.object_size", "must be at least dataset.patch");
    if (ds.scan_step >= ds.patch) fail("dataset.scan_step", "must be below dataset.patch (overlapping scan)");
  }
  if (ds.name == "ptycho-stream") {
    for (const auto& [key, value] : {std::pair<const char*, const std::string*>{"relay", &ds.relay}, {"topic", &ds.topic},
                                     {"stream", &ds.stream}, {"ca_file", &ds.ca_file}, {"token_file", &ds.token_file}})
      if (value->empty())
        fail(ds_given ? "dataset" : "", std::string("ptycho-stream needs dataset.") + key +
                                            " (the relay, topic and data stream whose scans it trains on: docs/rehearsal.md)");
  } else if (!ds.relay.empty() || !ds.topic.empty() || !ds.stream.empty()) {
    fail("dataset", "relay, topic and stream are keys of dataset.name: ptycho-stream only");
  }
  if (!c.checkpoint_item_topic.empty())
    for (const auto& [key, value] : {std::pair<const char*, const std::string*>{"relay", &c.checkpoint_relay},
                                     {"ca_file", &c.checkpoint_ca_file}, {"token_file", &c.checkpoint_token_file}})
      if (value->empty())
        fail("checkpoint", std::string("checkpoint.item_topic needs checkpoint.") + key +
                               " (the relay the checkpoints are put on: docs/rehearsal.md)");
  throw_if_any(std::move(diags), overrides);
  return c;
}

TrainerConfig load_trainer_config_file(const std::filesystem::path& file, const std::vector<std::string>& overrides) {
  TrainerConfig c = load_trainer_config_string(read_yaml_file(file, kMaxConfigBytes, "rehearsal config"), file.string(), overrides);
  // Relative paths in a config file are relative to the file's directory.
  const std::filesystem::path base = file.parent_path();
  auto resolve = [&](std::string& p) {
    if (!p.empty() && std::filesystem::path(p).is_relative()) p = (base / p).lexically_normal().string();
  };
  resolve(c.plugin_spec);
  resolve(c.dataset.dir);
  resolve(c.checkpoint_dir);
  resolve(c.checkpoint_ca_file);
  resolve(c.checkpoint_token_file);
  resolve(c.dataset.ca_file);
  resolve(c.dataset.token_file);
  resolve(c.dataset.scan_dir);
  resolve(c.dataset.cache_dir);
  return c;
}

}  // namespace diaspora::rehearsal
