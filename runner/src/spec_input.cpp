#include "diaspora/runner.hpp"

#include <unistd.h>

#include <boost/json/serialize.hpp>

#include <thread>

#include "diaspora/policy.hpp"
#include "kinds.hpp"
#include "adapters.hpp"

namespace diaspora::runner {

namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

constexpr std::uintmax_t kMaxSpecBytes = 16u << 20;

// Applies one --set to `root`; returns the canonical path ("tasks[0].count") or throws
// Error with what is wrong.
std::string apply_set(json::value& root, const std::string& set) {
  const auto eq = set.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error("expected KEY=VALUE, e.g. --set tasks.burn.count=8 or --set sites[0].workers=4");
  const std::string key = set.substr(0, eq), text = set.substr(eq + 1);
  if (text.empty()) throw Error("empty value (quote it for an empty string: KEY=\"\")");
  YamlDocument vdoc = parse_yaml(text, "--set");
  if (!vdoc.errors.empty()) throw Error("the value is not valid YAML: " + vdoc.errors.front().message);
  // Split KEY into segments: names, [index], numbers.
  std::vector<std::string> segs;
  std::string cur;
  for (std::size_t i = 0; i < key.size(); ++i) {
    const char c = key[i];
    if (c == '.') {
      if (!cur.empty()) segs.push_back(cur);
      cur.clear();
    } else if (c == '[') {
      if (!cur.empty()) segs.push_back(cur);
      cur.clear();
      const auto close = key.find(']', i);
      if (close == std::string::npos) throw Error("unclosed '[' in the key");
      segs.push_back("#" + key.substr(i + 1, close - i - 1));
      i = close;
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) segs.push_back(cur);
  if (segs.empty()) throw Error("empty key");
  json::value* node = &root;
  std::string canon;
  for (std::size_t i = 0; i < segs.size(); ++i) {
    const bool last = i + 1 == segs.size();
    std::string s = segs[i];
    const bool bracket = s.starts_with('#');
    if (bracket) s.erase(0, 1);
    if (node->is_array()) {
      json::array& arr = node->get_array();
      std::size_t idx = arr.size();
      const bool numeric = !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
      if (numeric) {
        idx = std::stoul(s);
        if (idx >= arr.size())
          throw Error("index " + s + " is out of range (" + canon + " has " + std::to_string(arr.size()) + " items)");
      } else {
        for (std::size_t j = 0; j < arr.size(); ++j)
          if (arr[j].is_object() && arr[j].get_object().contains("name") && arr[j].get_object().at("name") == json::value(s))
            idx = j;
        if (idx == arr.size()) throw Error("no item named '" + s + "' in " + canon);
      }
      canon += "[" + std::to_string(idx) + "]";
      if (last) throw Error("cannot replace a whole item of " + canon + "; set one of its keys");
      node = &arr[idx];
      continue;
    }
    if (bracket) throw Error(canon + " is not a list");
    if (node->is_null()) *node = json::object{};
    if (!node->is_object()) throw Error((canon.empty() ? "(root)" : canon) + " is not a mapping");
    canon += (canon.empty() ? "" : ".") + s;
    json::object& obj = node->get_object();
    if (last) {
      obj[s] = vdoc.root;
      return canon;
    }
    node = &obj[s];  // created (null) when missing: a mapping is made on the next step
  }
  return canon;
}

void absolutize(json::value& root, std::initializer_list<const char*> path, const fs::path& base) {
  json::value* v = &root;
  for (const char* k : path) {
    if (!v->is_object() || !v->get_object().contains(k)) return;
    v = &v->get_object()[k];
  }
  if (v->is_string()) {
    const fs::path p(std::string(v->get_string()));
    if (p.is_relative()) *v = (base / p).lexically_normal().string();
  }
}

void compile_policies(const WorkflowSpec& spec, std::vector<Diagnostic>& out) {
  const std::vector<Diagnostic> found = resilience::check_policies(spec);
  out.insert(out.end(), found.begin(), found.end());
}

// What the runner needs beyond the schema: engines it drives, the kinds' args, resources.
void check_runnable(const WorkflowSpec& spec, const YamlDocument& doc, std::vector<Diagnostic>& out) {
  auto at = [&](const std::string& path, Location fallback) {
    auto it = doc.value_locations.find(path);
    return it != doc.value_locations.end() ? it->second : fallback;
  };
  auto add = [&](const std::string& path, Location l, std::string msg) {
    out.push_back({spec.file, l.line, l.column, path, std::move(msg)});
  };
  for (std::size_t i = 0; i < spec.sites.size(); ++i) {
    const SiteSpec& s = spec.sites[i];
    if (s.engine != Engine::local && s.engine != Engine::dask && s.engine != Engine::parsl && s.engine != Engine::slurm) {
      const std::string p = "sites[" + std::to_string(i) + "].engine";
      add(p, at(p, s.location),
          "'" + std::string(to_string(s.engine)) + "' sites are driven by the engine adapters (docs/adapters.md), "
          "not by `diaspora run`; use engine: local, dask, parsl or slurm (comment this site out to run the rest)");
    }
    if (s.engine == Engine::parsl && s.endpoint && *s.endpoint != "local") {
      const std::string p = "sites[" + std::to_string(i) + "].endpoint";
      add(p, at(p, s.location), "a Parsl site of `diaspora run` is an HTEX on a LocalProvider of this host: its "
                                "endpoint is `local` (or left out); for HTEX on a cluster's provider use "
                                "diaspora.parsl.DiasporaExecutor (docs/adapters.md)");
    }
    if (s.engine == Engine::dask && s.endpoint && *s.endpoint != "local" && !s.endpoint->starts_with("tcp://")) {
      const std::string p = "sites[" + std::to_string(i) + "].endpoint";
      add(p, at(p, s.location), "a Dask site's endpoint is `local` (a LocalCluster of `workers` processes) or a "
                                "scheduler address tcp://HOST:PORT");
    }
  }
  // Dask and Slurm sites run the built-in kinds; a command task or a rehearsal job needs a
  // local site among those it may use.
  auto is_local = [&](const std::string& name) {
    for (const auto& s : spec.sites)
      if (s.name == name) return s.engine == Engine::local;
    return false;
  };
  auto check_local_site = [&](const std::string& path, Location l, const std::vector<std::string>& allowed, const char* what) {
    bool ok = false;
    for (const auto& s : spec.sites) ok |= s.engine == Engine::local && (allowed.empty() || std::count(allowed.begin(), allowed.end(), s.name));
    if (!ok)
      add(path, l, std::string(what) + " runs on engine: local sites only (Dask and Slurm sites run the built-in kinds) "
                   "and none is allowed here; add a local site or use a built-in kind");
  };
  for (std::size_t i = 0; i < spec.tasks.size(); ++i)
    if (!spec.tasks[i].kind) {
      const std::string p = "tasks[" + std::to_string(i) + "].command";
      check_local_site(p, at(p, spec.tasks[i].location), spec.tasks[i].allowed_sites, "a command task");
    }
  for (std::size_t i = 0; i < spec.rehearsal.size(); ++i) {
    const auto& j = spec.rehearsal[i];
    const std::string p = "rehearsal[" + std::to_string(i) + "].site";
    if (j.site && !is_local(*j.site)) add(p, at(p, j.location), "a rehearsal job runs on an engine: local site; '" + *j.site + "' is not one");
    else if (!j.site) check_local_site("rehearsal[" + std::to_string(i) + "]", j.location, {}, "a rehearsal job");
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::uint64_t ram = static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  for (std::size_t i = 0; i < spec.tasks.size(); ++i) {
    const TaskSpec& t = spec.tasks[i];
    const std::string base = "tasks[" + std::to_string(i) + "]";
    if (t.kind) {
      for (const std::string& e : check_kind_args(*t.kind, t.args)) {
        const std::string key = e.substr(0, e.find(':'));
        add(base + "." + key, at(base + "." + key, at(base + ".args", t.location)), e.substr(e.find(':') + 2));
      }
    } else if (!t.args.empty()) {
      add(base + ".args", at(base + ".args", t.location), "args are for built-in kinds; a command gets its arguments in the command line");
    }
    char cpus[32];
    std::snprintf(cpus, sizeof cpus, "%g", t.resources.cpus);
    if (t.resources.cpus > cores)
      add(base + ".resources.cpus", at(base + ".resources.cpus", t.location),
          "needs " + std::string(cpus) + " CPUs but this host has " + std::to_string(cores) +
              " (local sites share this host's cores)");
    if (t.resources.memory > ram)
      add(base + ".resources.memory", at(base + ".resources.memory", t.location),
          "needs " + std::to_string(t.resources.memory >> 20) + " MiB but this host has " + std::to_string(ram >> 20) + " MiB");
    if (t.resources.gpus > 0)
      add(base + ".resources.gpus", at(base + ".resources.gpus", t.location), "local sites offer no GPU to a task");
  }
  for (std::size_t i = 0; i < spec.rehearsal.size(); ++i) {
    const RehearsalJobSpec& j = spec.rehearsal[i];
    const std::string base = "rehearsal[" + std::to_string(i) + "]";
    if (trainer_executable().empty())
      add(base, j.location, "rehearsal jobs run diaspora-train, which is not next to diaspora-run (" +
                                self_executable().parent_path().string() + "): build with DIASPORA_WITH_TORCH=ON");
    if (j.world_size > cores)
      add(base + ".world_size", at(base + ".world_size", j.location),
          std::to_string(j.world_size) + " ranks but this host has " + std::to_string(cores) + " cores (local sites share them)");
    if (j.stream)
      for (const auto& t : spec.tasks)
        if (t.name == *j.stream) {
          if (t.kind != std::optional<std::string>("ptycho-reconstruct"))
            add(base + ".stream", at(base + ".stream", j.location),
                "task '" + t.name + "' does not write scan files: a ptycho-stream trains on a ptycho-reconstruct task's scans");
          const long total = instances_of(t);
          if (total > 64)
            add(base + ".stream", at(base + ".stream", j.location),
                "task '" + t.name + "' makes " + std::to_string(total) + " scans; a rehearsal job trains on at most 64 (dataset.tasks)");
        }
  }
}

}  // namespace

long instances_of(const TaskSpec& ts) {
  if (!ts.rate) return static_cast<long>(ts.count);
  return static_cast<long>(std::floor((ts.duration ? ts.duration->count() : 60.0) * *ts.rate + 1e-9));
}

std::optional<SpecInput> load_run_spec(const fs::path& file, const std::vector<std::string>& sets, bool no_policies,
                                       std::vector<std::string>& errors) {
  std::vector<Diagnostic> diags;
  SpecLoadResult r = load_spec_file(file);
  diags = r.diagnostics;
  if (r.ok()) compile_policies(*r.spec, diags);
  if (!diags.empty()) {
    for (const auto& d : diags) errors.push_back(d.str());
    return std::nullopt;
  }
  const std::string text = read_yaml_file(file, kMaxSpecBytes, "spec");
  YamlDocument doc = parse_yaml(text, file.string());
  json::value root = doc.root;

  std::vector<std::pair<std::string, std::string>> applied;  // canonical path, the --set as given
  for (const auto& s : sets) {
    try {
      applied.emplace_back(apply_set(root, s), s);
    } catch (const Error& e) {
      errors.push_back("--set " + s + ": error: " + e.what());
    }
  }
  if (!errors.empty()) return std::nullopt;
  if (no_policies && root.is_object()) {  // the baseline: no policies, no default protection either
    root.get_object().erase("policies");
    root.get_object()["defaults"] = "off";
  }

  SpecInput in;
  in.base_dir = fs::absolute(file).parent_path();
  if (!applied.empty() || no_policies) {
    SpecLoadResult r2 = load_spec_string(json::serialize(root), file.string());
    std::vector<Diagnostic> d2 = r2.diagnostics;
    if (r2.ok()) compile_policies(*r2.spec, d2);
    for (const auto& d : d2) {
      std::string who;
      for (const auto& [canon, given] : applied)
        if (d.path == canon || d.path.starts_with(canon + ".") || d.path.starts_with(canon + "[")) who = given;
      errors.push_back((who.empty() ? file.string() + " (with the --set values)" : "--set " + who) + ": error: " + d.path +
                       ": " + d.message);
    }
    if (!errors.empty()) return std::nullopt;
    in.spec = std::move(*r2.spec);
  } else {
    in.spec = std::move(*r.spec);
  }
  in.spec.file = file.string();
  std::vector<Diagnostic> runnable;
  check_runnable(in.spec, doc, runnable);
  for (const auto& d : runnable) errors.push_back(d.str());
  if (!errors.empty()) return std::nullopt;

  for (auto p : {std::initializer_list<const char*>{"relay", "ca_file"}, {"relay", "token_file"}, {"relay", "data_dir"},
                 {"plugin", "library"}, {"plugin", "spool_dir"}})
    absolutize(root, p, in.base_dir);
  in.document = std::move(root);
  return in;
}

std::filesystem::path check_learned_normals(const WorkflowSpec& spec, const std::filesystem::path& file) {
  std::filesystem::path f = file;
  if (std::filesystem::is_directory(f)) f /= "normals.json";
  resilience::PolicyEngine(spec).import_normals_file(f);
  return std::filesystem::absolute(f);
}

}  // namespace diaspora::runner
