#include "diaspora/spec.hpp"
#include "diaspora/files.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "diaspora/json_schema.hpp"

namespace diaspora {

namespace json = boost::json;
using schema::format_path;
using schema::Path;

SpecError::SpecError(std::vector<Diagnostic> diagnostics, std::source_location where)
    : Error(
          [&] {
            std::string msg;
            for (const auto& d : diagnostics) msg += (msg.empty() ? "" : "\n") + d.str();
            return msg;
          }(),
          where),
      diagnostics_(std::move(diagnostics)) {}

std::string_view to_string(Engine e) noexcept {
  switch (e) {
    case Engine::local: return "local";
    case Engine::dask: return "dask";
    case Engine::parsl: return "parsl";
    case Engine::globus_compute: return "globus-compute";
    case Engine::slurm: return "slurm";
  }
  return "?";
}

std::string_view to_string(ActionKind a) noexcept {
  switch (a) {
    case ActionKind::restart: return "restart";
    case ActionKind::migrate: return "migrate";
    case ActionKind::speculate: return "speculate";
    case ActionKind::checkpoint: return "checkpoint";
    case ActionKind::throttle: return "throttle";
    case ActionKind::alert: return "alert";
  }
  return "?";
}

std::string_view to_string(DefaultsMode m) noexcept {
  switch (m) {
    case DefaultsMode::on: return "on";
    case DefaultsMode::off: return "off";
    case DefaultsMode::observe: return "observe";
  }
  return "?";
}

std::string_view to_string(FaultKind f) noexcept {
  switch (f) {
    case FaultKind::slow_site: return "slow-site";
    case FaultKind::kill_worker: return "kill-worker";
    case FaultKind::stop_relay: return "stop-relay";
    case FaultKind::hang_task: return "hang-task";
    case FaultKind::slow_task: return "slow-task";
  }
  return "?";
}

const SiteSpec* WorkflowSpec::find_site(std::string_view n) const noexcept {
  for (const auto& s : sites)
    if (s.name == n) return &s;
  return nullptr;
}

std::optional<Duration> parse_duration(std::string_view text) {
  std::size_t unit = text.find_first_not_of("0123456789.");
  if (unit == 0 || unit == std::string_view::npos) return std::nullopt;
  double value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + unit, value);
  if (ec != std::errc() || ptr != text.data() + unit || value < 0) return std::nullopt;
  std::string_view u = text.substr(unit);
  if (u == "ms") return Duration(value / 1000.0);
  if (u == "s") return Duration(value);
  if (u == "m") return Duration(value * 60.0);
  if (u == "h") return Duration(value * 3600.0);
  if (u == "d") return Duration(value * 86400.0);
  return std::nullopt;
}

std::optional<std::uint64_t> parse_size(const json::value& v) {
  if (v.is_int64()) return v.get_int64() >= 0 ? std::optional<std::uint64_t>(v.get_int64()) : std::nullopt;
  if (v.is_uint64()) return v.get_uint64();
  if (!v.is_string()) return std::nullopt;
  std::string_view text = v.get_string();
  std::size_t unit = text.find_first_not_of("0123456789");
  if (unit == 0) return std::nullopt;
  std::uint64_t n = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + std::min(unit, text.size()), n);
  if (ec != std::errc()) return std::nullopt;
  std::string_view u = unit == std::string_view::npos ? "B" : text.substr(unit);
  std::uint64_t mult = u == "B" ? 1 : u == "KiB" ? 1ull << 10 : u == "MiB" ? 1ull << 20 : u == "GiB" ? 1ull << 30 : 0;
  if (mult == 0 || n > UINT64_MAX / mult) return std::nullopt;
  return n * mult;
}

namespace {

// ---- cross-reference checks -----------------------------------------------------------
// Run on the JSON form so they also work (best effort) when the schema found errors.
struct RefChecker {
  const YamlDocument& doc;
  std::string file;
  std::vector<Diagnostic>& out;

  Location loc(const Path& p) const {
    auto it = doc.value_locations.find(format_path(p));
    return it == doc.value_locations.end() ? Location{1, 1} : it->second;
  }
  void report(const Path& p, std::string msg) {
    Location l = loc(p);
    out.push_back({file, l.line, l.column, format_path(p), std::move(msg)});
  }
  const json::array* section(std::string_view key) const {
    if (!doc.root.is_object()) return nullptr;
    const json::value* v = doc.root.get_object().if_contains(key);
    return v && v->is_array() ? &v->get_array() : nullptr;
  }
  static const json::string* str_field(const json::value& item, std::string_view key) {
    if (!item.is_object()) return nullptr;
    const json::value* v = item.get_object().if_contains(key);
    return v && v->is_string() ? &v->get_string() : nullptr;
  }

  // Collects names of a section, reporting duplicates against `seen`.
  void collect(std::string_view sec, std::map<std::string, Path>& seen) {
    const json::array* arr = section(sec);
    if (!arr) return;
    for (std::size_t i = 0; i < arr->size(); ++i) {
      const json::string* n = str_field((*arr)[i], "name");
      if (!n) continue;
      Path p{std::string(sec), i, std::string("name")};
      auto [it, fresh] = seen.emplace(std::string(*n), p);
      if (!fresh) {
        Location first = loc(it->second);
        report(p, "duplicate name '" + std::string(*n) + "' (first defined at " + std::to_string(first.line) + ":" +
                      std::to_string(first.column) + ")");
      }
    }
  }

  // Checks every string in item[key] (a string or an array of strings) against `known`.
  void refs(std::string_view sec, std::string_view key, const std::map<std::string, Path>& known,
            std::string_view what) {
    const json::array* arr = section(sec);
    if (!arr) return;
    for (std::size_t i = 0; i < arr->size(); ++i) {
      if (!(*arr)[i].is_object()) continue;
      const json::value* v = (*arr)[i].get_object().if_contains(key);
      if (!v) continue;
      auto check = [&](const json::value& x, Path p) {
        if (x.is_string() && !known.count(std::string(x.get_string())))
          report(p, "unknown " + std::string(what) + " '" + std::string(x.get_string()) + "'" +
                        suggest(x.get_string(), known));
      };
      Path base{std::string(sec), i, std::string(key)};
      if (v->is_array()) {
        for (std::size_t j = 0; j < v->get_array().size(); ++j) {
          Path p = base;
          p.emplace_back(j);
          check(v->get_array()[j], p);
        }
      } else {
        check(*v, base);
      }
    }
  }

  static std::string suggest(std::string_view word, const std::map<std::string, Path>& known) {
    std::vector<std::string> names;
    for (const auto& [n, p] : known) names.push_back(n);
    std::string best = schema::closest_match(word, names);
    if (!best.empty()) return "; did you mean '" + best + "'?";
    if (names.empty()) return "";
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    return " (defined: " + list + ")";
  }

  void run() {
    std::map<std::string, Path> sites, jobs, policies;
    collect("sites", sites);
    collect("tasks", jobs);
    const std::map<std::string, Path> tasks_only = jobs;
    collect("rehearsal", jobs);  // tasks and rehearsal jobs share one namespace
    collect("policies", policies);
    std::map<std::string, Path> targets = sites;
    targets.insert(jobs.begin(), jobs.end());

    refs("tasks", "preferred_sites", sites, "site");
    refs("tasks", "allowed_sites", sites, "site");
    refs("policies", "targets", targets, "target");
    refs("policies", "to_sites", sites, "site");
    refs("rehearsal", "site", sites, "site");
    refs("rehearsal", "stream", tasks_only, "task");
    if (const json::array* jobs_list = section("rehearsal")) {
      for (std::size_t i = 0; i < jobs_list->size(); ++i) {
        const json::string* ds = str_field((*jobs_list)[i], "dataset");
        const bool has_stream = (*jobs_list)[i].is_object() && (*jobs_list)[i].get_object().contains("stream");
        if (ds && *ds == "ptycho-stream" && !has_stream)
          report(Path{std::string("rehearsal"), i, std::string("dataset")},
                 "ptycho-stream needs 'stream': the task whose data.arrived scans the job trains on");
        if (ds && *ds != "ptycho-stream" && has_stream)
          report(Path{std::string("rehearsal"), i, std::string("stream")}, "'stream' is for dataset ptycho-stream only");
      }
    }
    refs("faults", "site", sites, "site");
    refs("faults", "task", jobs, "task");
    if (const json::value* relay = doc.root.is_object() ? doc.root.get_object().if_contains("relay") : nullptr;
        relay && relay->is_object() && relay->get_object().contains("qos")) {
      const json::string* url = str_field(*relay, "url");
      if (url && *url != "embedded")
        report(Path{std::string("relay"), std::string("qos")},
               "qos is for the embedded relay: the relay at " + std::string(*url) +
                   " takes its classes from its relay.yaml (docs/relay.md)");
      if (const json::string* ri = str_field(relay->get_object().at("qos"), "report_interval"))
        if (const auto d = parse_duration(*ri); d && (d->count() < 1 || d->count() > 3600 || d->count() != std::floor(d->count())))
          report(Path{std::string("relay"), std::string("qos"), std::string("report_interval")},
                 "must be whole seconds from 1s to 1h (the relay looks for congested connections once a second at most), not " +
                     std::string(*ri));
    }
    if (const json::array* site_list = section("sites")) {
      for (std::size_t i = 0; i < site_list->size(); ++i) {
        if (const json::value* sr = (*site_list)[i].is_object() ? (*site_list)[i].get_object().if_contains("relay") : nullptr;
            sr && sr->is_object() && sr->get_object().contains("qos"))
          report(Path{std::string("sites"), i, std::string("relay"), std::string("qos")},
                 "qos is for the embedded relay: a site's relay takes its classes from its relay.yaml (docs/relay.md)");
      }
    }

    if (const json::array* tasks = section("tasks")) {
      for (std::size_t i = 0; i < tasks->size(); ++i) {
        const json::value& t = (*tasks)[i];
        if (!t.is_object()) continue;
        const json::value* pref = t.get_object().if_contains("preferred_sites");
        const json::value* allowed = t.get_object().if_contains("allowed_sites");
        if (!pref || !allowed || !pref->is_array() || !allowed->is_array()) continue;
        for (std::size_t j = 0; j < pref->get_array().size(); ++j) {
          const json::value& s = pref->get_array()[j];
          const auto& al = allowed->get_array();
          if (s.is_string() && std::find(al.begin(), al.end(), s) == al.end())
            report(Path{std::string("tasks"), i, std::string("preferred_sites"), j},
                   "preferred site '" + std::string(s.get_string()) + "' is not in allowed_sites");
        }
      }
    }
    if (const json::array* pols = section("policies")) {
      const json::array* site_list = section("sites");
      std::size_t nsites = site_list ? site_list->size() : 0;
      for (std::size_t i = 0; i < pols->size(); ++i) {
        const json::string* a = str_field((*pols)[i], "action");
        if (a && (*a == "migrate" || *a == "speculate") && nsites < 2)
          report(Path{std::string("policies"), i, std::string("action")},
                 "action '" + std::string(*a) + "' needs at least two sites");
      }
    }
  }
};

// ---- typed model -----------------------------------------------------------------------

std::string get_str(const json::object& o, std::string_view k, std::string def = {}) {
  const json::value* v = o.if_contains(k);
  return v && v->is_string() ? std::string(v->get_string()) : def;
}
std::optional<std::string> opt_str(const json::object& o, std::string_view k) {
  const json::value* v = o.if_contains(k);
  return v && v->is_string() ? std::optional<std::string>(v->get_string()) : std::nullopt;
}
std::optional<double> opt_num(const json::object& o, std::string_view k) {
  const json::value* v = o.if_contains(k);
  if (!v || !v->is_number()) return std::nullopt;
  return v->to_number<double>();
}
std::int64_t get_int(const json::object& o, std::string_view k, std::int64_t def) {
  auto n = opt_num(o, k);
  return n ? static_cast<std::int64_t>(*n) : def;
}
std::optional<Duration> opt_dur(const json::object& o, std::string_view k) {
  auto s = opt_str(o, k);
  return s ? parse_duration(*s) : std::nullopt;
}
std::vector<std::string> str_list(const json::object& o, std::string_view k) {
  std::vector<std::string> out;
  if (const json::value* v = o.if_contains(k); v && v->is_array())
    for (const auto& x : v->get_array())
      if (x.is_string()) out.emplace_back(x.get_string());
  return out;
}
ScalarMap scalar_map(const json::object& o, std::string_view k) {
  ScalarMap out;
  if (const json::value* v = o.if_contains(k); v && v->is_object())
    for (const auto& kv : v->get_object()) out.emplace(std::string(kv.key()), kv.value());
  return out;
}
const json::object& sub(const json::object& o, std::string_view k) {
  static const json::object empty;
  const json::value* v = o.if_contains(k);
  return v && v->is_object() ? v->get_object() : empty;
}
template <class Fn>
void each(const json::object& root, std::string_view k, Fn fn) {
  if (const json::value* v = root.if_contains(k); v && v->is_array())
    for (std::size_t i = 0; i < v->get_array().size(); ++i) fn(v->get_array()[i].get_object(), i);
}

WorkflowSpec build(const YamlDocument& doc, std::string file) {
  const json::object& r = doc.root.get_object();
  auto loc = [&](std::string_view sec, std::size_t i) {
    auto it = doc.value_locations.find(format_path(Path{std::string(sec), i}));
    return it == doc.value_locations.end() ? Location{} : it->second;
  };
  WorkflowSpec w;
  w.file = std::move(file);
  w.version = static_cast<int>(get_int(r, "version", 1));
  w.name = get_str(r, "name");
  w.description = get_str(r, "description");
  const std::string defaults = get_str(r, "defaults", "on");
  w.defaults = defaults == "off" ? DefaultsMode::off : defaults == "observe" ? DefaultsMode::observe : DefaultsMode::on;
  w.sensitivity = opt_num(r, "sensitivity").value_or(1.0);

  auto relay_of = [](const json::object& relay) {
    RelaySpec out;
    out.url = get_str(relay, "url", "embedded");
    if (const json::value* f = relay.if_contains("failover"); f && f->is_array())
      for (const auto& u : f->get_array())
        if (u.is_string()) out.failover.emplace_back(u.get_string());
    if (auto s = opt_str(relay, "ca_file")) out.ca_file = *s;
    if (auto s = opt_str(relay, "token_file")) out.token_file = *s;
    if (auto s = opt_str(relay, "data_dir")) out.data_dir = *s;
    out.topic_prefix = opt_str(relay, "topic_prefix");
    const json::object& qos = sub(relay, "qos");
    if (const json::value* c = qos.if_contains("classes"); c && c->is_array())
      for (const auto& rule : c->get_array())
        if (rule.is_object()) out.qos_classes.emplace_back(get_str(rule.get_object(), "topics"), get_str(rule.get_object(), "class"));
    if (const json::value* d = qos.if_contains("drop_late"); d && d->is_array())
      for (const auto& cls : d->get_array())
        if (cls.is_string()) out.qos_drop_late.emplace_back(cls.get_string());
    out.qos_report_interval = opt_dur(qos, "report_interval").value_or(out.qos_report_interval);
    return out;
  };
  w.relay = relay_of(sub(r, "relay"));

  const json::object& plugin = sub(r, "plugin");
  if (auto s = opt_str(plugin, "library")) w.plugin.library = *s;
  if (auto s = opt_str(plugin, "spool_dir")) w.plugin.spool_dir = *s;
  if (auto s = opt_str(plugin, "normals")) w.plugin.normals = *s;
  if (const auto* v = plugin.if_contains("spool_limit")) w.plugin.spool_limit = parse_size(*v).value_or(w.plugin.spool_limit);
  w.plugin.queue_size = get_int(plugin, "queue_size", w.plugin.queue_size);
  if (auto s = opt_str(plugin, "engine_id")) w.plugin.engine_id = *s;
  w.plugin.max_inflight = get_int(plugin, "max_inflight", w.plugin.max_inflight);
  if (get_str(plugin, "coalesce", "congested") == "queue_full") w.plugin.coalesce = PluginSpec::Coalesce::queue_full;
  if (const auto* v = plugin.if_contains("control"); v && v->is_bool()) w.plugin.control = v->get_bool();
  if (const auto* v = plugin.if_contains("required"); v && v->is_bool()) w.plugin.required = v->get_bool();
  w.plugin.reconnect_max = opt_dur(plugin, "reconnect_max").value_or(w.plugin.reconnect_max);
  const json::object& batch = sub(plugin, "batch");
  w.plugin.batch.max_events = get_int(batch, "max_events", w.plugin.batch.max_events);
  if (const auto* v = batch.if_contains("max_bytes")) w.plugin.batch.max_bytes = parse_size(*v).value_or(w.plugin.batch.max_bytes);
  w.plugin.batch.max_delay = opt_dur(batch, "max_delay").value_or(w.plugin.batch.max_delay);

  each(r, "sites", [&](const json::object& o, std::size_t i) {
    SiteSpec s;
    s.name = get_str(o, "name");
    std::string e = get_str(o, "engine", "local");
    s.engine = e == "dask" ? Engine::dask : e == "parsl" ? Engine::parsl : e == "globus-compute" ? Engine::globus_compute
             : e == "slurm" ? Engine::slurm : Engine::local;
    s.workers = get_int(o, "workers", 1);
    s.endpoint = opt_str(o, "endpoint");
    s.speed = opt_num(o, "speed").value_or(1.0);
    s.cost = opt_num(o, "cost").value_or(0.0);
    s.attributes = scalar_map(o, "attributes");
    if (const json::value* rv = o.if_contains("relay"); rv && rv->is_object()) s.relay = relay_of(rv->get_object());
    s.location = loc("sites", i);
    w.sites.push_back(std::move(s));
  });
  each(r, "tasks", [&](const json::object& o, std::size_t i) {
    TaskSpec t;
    t.name = get_str(o, "name");
    t.command = opt_str(o, "command");
    t.kind = opt_str(o, "kind");
    t.args = scalar_map(o, "args");
    t.inputs = str_list(o, "inputs");
    const json::object& res = sub(o, "resources");
    t.resources.cpus = opt_num(res, "cpus").value_or(1.0);
    if (const auto* v = res.if_contains("memory")) t.resources.memory = parse_size(*v).value_or(0);
    t.resources.gpus = get_int(res, "gpus", 0);
    t.deadline = opt_dur(o, "deadline");
    t.preferred_sites = str_list(o, "preferred_sites");
    t.allowed_sites = str_list(o, "allowed_sites");
    t.count = get_int(o, "count", 1);
    t.rate = opt_num(o, "rate");
    t.duration = opt_dur(o, "duration");
    if (get_str(o, "output", "file") == "item") t.output = TaskSpec::Output::item;
    t.location = loc("tasks", i);
    w.tasks.push_back(std::move(t));
  });
  each(r, "policies", [&](const json::object& o, std::size_t i) {
    PolicySpec p;
    p.name = get_str(o, "name");
    p.signal = get_str(o, "signal");
    p.detector = get_str(o, "detector", "ensemble");
    p.threshold = opt_num(o, "threshold");
    p.for_count = get_int(o, "for", 1);
    p.cooldown = opt_dur(o, "cooldown").value_or(p.cooldown);
    std::string a = get_str(o, "action");
    p.action = a == "restart" ? ActionKind::restart : a == "migrate" ? ActionKind::migrate
             : a == "speculate" ? ActionKind::speculate : a == "checkpoint" ? ActionKind::checkpoint
             : a == "throttle" ? ActionKind::throttle : ActionKind::alert;
    p.targets = str_list(o, "targets");
    p.to_sites = str_list(o, "to_sites");
    p.max_attempts = get_int(o, "max_attempts", 3);
    p.location = loc("policies", i);
    for (const auto& kv : o)
      if (auto it = doc.value_locations.find(format_path(Path{std::string("policies"), i, std::string(kv.key())}));
          it != doc.value_locations.end())
        p.field_locations.emplace(std::string(kv.key()), it->second);
    w.policies.push_back(std::move(p));
  });
  each(r, "rehearsal", [&](const json::object& o, std::size_t i) {
    RehearsalJobSpec j;
    j.name = get_str(o, "name");
    j.site = opt_str(o, "site");
    if (auto s = opt_str(o, "config")) j.config = *s;
    j.dataset = get_str(o, "dataset");
    j.stream = opt_str(o, "stream");
    j.strategy = get_str(o, "strategy");
    if (auto n = opt_num(o, "buffer_size")) j.buffer_size = static_cast<std::int64_t>(*n);
    j.world_size = get_int(o, "world_size", 1);
    j.checkpoint_every = opt_dur(o, "checkpoint_every");
    if (get_str(o, "checkpoints", "file") == "item") j.checkpoints = RehearsalJobSpec::Checkpoints::item;
    j.set = scalar_map(o, "set");
    j.location = loc("rehearsal", i);
    w.rehearsal.push_back(std::move(j));
  });
  each(r, "faults", [&](const json::object& o, std::size_t i) {
    FaultSpec f;
    f.at = opt_dur(o, "at").value_or(Duration{0});
    std::string k = get_str(o, "kind");
    f.kind = k == "kill-worker"  ? FaultKind::kill_worker
             : k == "stop-relay" ? FaultKind::stop_relay
             : k == "hang-task"  ? FaultKind::hang_task
             : k == "slow-task"  ? FaultKind::slow_task
                                 : FaultKind::slow_site;
    f.site = opt_str(o, "site");
    f.task = opt_str(o, "task");
    f.factor = opt_num(o, "factor").value_or(1.0);
    f.lasts = opt_dur(o, "for");
    f.location = loc("faults", i);
    w.faults.push_back(std::move(f));
  });
  return w;
}

}  // namespace

SpecLoadResult load_spec_string(std::string_view yaml, std::string_view name) {
  SpecLoadResult result;
  YamlDocument doc = parse_yaml(yaml, name);
  result.diagnostics = validate_yaml(doc, "workflow.schema.json", name);
  bool parsed = std::none_of(doc.errors.begin(), doc.errors.end(), [](const Diagnostic& d) { return d.path.empty(); });
  if (parsed && doc.root.is_object()) {
    RefChecker{doc, std::string(name), result.diagnostics}.run();
  }
  std::stable_sort(result.diagnostics.begin(), result.diagnostics.end(), [](const Diagnostic& a, const Diagnostic& b) {
    return std::tie(a.line, a.column) < std::tie(b.line, b.column);
  });
  if (result.diagnostics.empty()) result.spec = build(doc, std::string(name));
  return result;
}

std::string read_yaml_file(const std::filesystem::path& file, std::uintmax_t max_bytes, std::string_view kind) {
  std::error_code ec;
  auto fail = [&](std::string msg) -> std::string {
    throw SpecError(std::vector<Diagnostic>{{file.string(), 0, 0, "", std::move(msg)}});
  };
  if (!std::filesystem::exists(file, ec)) return fail("no such file");
  if (std::filesystem::is_directory(file, ec))
    return fail("is a directory; give a " + std::string(kind) + " file (.yaml)");
  auto size = std::filesystem::file_size(file, ec);
  if (ec) return fail("cannot read: " + ec.message());
  if (size > max_bytes)
    return fail("file of " + std::to_string(size) + " bytes is larger than the " + std::to_string(max_bytes >> 20) +
                " MiB limit for a " + std::string(kind));
  try {
    return read_file(file, max_bytes);
  } catch (const Error&) {
    return fail("cannot open for reading");
  }
}

SpecLoadResult load_spec_file(const std::filesystem::path& file) {
  constexpr std::uintmax_t kMaxSpecBytes = 16u << 20;
  std::string text;
  try {
    text = read_yaml_file(file, kMaxSpecBytes, "spec");
  } catch (const SpecError& e) {
    SpecLoadResult r;
    r.diagnostics = e.diagnostics();
    return r;
  }
  return load_spec_string(text, file.string());
}

WorkflowSpec parse_spec_string(std::string_view yaml, std::string_view name) {
  auto r = load_spec_string(yaml, name);
  if (!r.ok()) throw SpecError(std::move(r.diagnostics));
  return std::move(*r.spec);
}

WorkflowSpec parse_spec_file(const std::filesystem::path& file) {
  auto r = load_spec_file(file);
  if (!r.ok()) throw SpecError(std::move(r.diagnostics));
  return std::move(*r.spec);
}

}  // namespace diaspora
