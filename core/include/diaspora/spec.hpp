// Workflow specs: the YAML file a user writes (schemas/workflow.schema.json), loaded into
// a typed model after schema and cross-reference validation, with every error located as
// FILE:LINE:COL.
#pragma once

#include <boost/json/value.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "diaspora/error.hpp"

namespace diaspora {

/// One problem found in a spec, located in its file. LINE and COL are 1-based.
struct Diagnostic {
  std::string file;     ///< as given to the loader (or "<string>")
  int line = 0;         ///< 0 when unknown (e.g. an unreadable file)
  int column = 0;
  std::string path;     ///< key path, e.g. "sites[1].engine"; "(root)" for the document
  std::string message;  ///< what is wrong, and how to fix it where we can tell

  /// "FILE:LINE:COL: error: PATH: MESSAGE", the format compilers use, so editors jump to it.
  std::string str() const;
};

/// Thrown by parse_spec_* when a spec has errors; carries all of them, in file order.
class SpecError : public Error {
 public:
  explicit SpecError(std::vector<Diagnostic> diagnostics,
                     std::source_location where = std::source_location::current());
  const std::vector<Diagnostic>& diagnostics() const noexcept { return diagnostics_; }

 private:
  std::vector<Diagnostic> diagnostics_;
};

using Duration = std::chrono::duration<double>;  ///< seconds, fractional

struct Location {
  int line = 0;
  int column = 0;
};

struct RelaySpec {
  std::string url = "embedded";  ///< "embedded" or wss://host:port[/path]
  /// More relays in front of the same store (relays on one JetStream cluster), tried in
  /// turn after `url` when the one in use is lost (the plugin; docs/relay.md).
  std::vector<std::string> failover;
  std::optional<std::filesystem::path> ca_file;
  std::optional<std::filesystem::path> token_file;
  std::optional<std::filesystem::path> data_dir;
  std::optional<std::string> topic_prefix;
  /// qos: the embedded relay's classes of service (docs/streaming.md): (topic pattern, class)
  /// rules tried before the defaults, and the classes whose late items are dropped.
  std::vector<std::pair<std::string, std::string>> qos_classes;
  std::vector<std::string> qos_drop_late;
  Duration qos_report_interval{5.0};  ///< qos.report_interval: congestion rounds of the embedded relay
  bool embedded() const noexcept { return url == "embedded"; }
};

struct BatchSpec {
  std::int64_t max_events = 512;
  std::uint64_t max_bytes = 1u << 20;
  Duration max_delay{0.020};
};

struct PluginSpec {
  std::optional<std::filesystem::path> library;
  std::filesystem::path spool_dir = ".diaspora/spool";
  /// Where the policy engine keeps what it learned (the task normals): read at open when
  /// the file exists, written at close. Unset: nothing kept.
  std::optional<std::filesystem::path> normals;
  std::uint64_t spool_limit = 256ull << 20;
  std::int64_t queue_size = 65536;
  std::string engine_id = "engine";  ///< source suffix, control topic suffix, spool subdirectory
  std::int64_t max_inflight = 16;    ///< batches sent and not yet acked
  /// When metric samples are coalesced per series: also while the link to the relay is
  /// congested (the window of unacked batches full for 50 ms; the default), or only when
  /// the hook queue is full (queue_full: every sample is queued while there is room).
  enum class Coalesce { congested, queue_full } coalesce = Coalesce::congested;
  bool control = true;               ///< subscribe to the control topic
  bool required = true;              ///< adapters: refuse to run without the plugin (false: warn, run without)
  Duration reconnect_max{5.0};       ///< backoff ceiling
  BatchSpec batch;
};

enum class Engine { local, dask, parsl, globus_compute, slurm };
std::string_view to_string(Engine e) noexcept;

using ScalarMap = std::map<std::string, boost::json::value>;  ///< string, number or boolean values

struct SiteSpec {
  std::string name;
  Engine engine = Engine::local;
  std::int64_t workers = 1;
  std::optional<std::string> endpoint;
  double speed = 1.0;
  double cost = 0.0;
  ScalarMap attributes;
  /// The site's own relay (sites federated, docs/relay.md): its attempts' events go there
  /// through a plugin of its own. Unset: the run's relay. Never embedded.
  std::optional<RelaySpec> relay;
  Location location;
};

struct ResourceSpec {
  double cpus = 1.0;
  std::uint64_t memory = 0;  ///< bytes; 0 = unspecified
  std::int64_t gpus = 0;
};

struct TaskSpec {
  std::string name;
  std::optional<std::string> command;  ///< exactly one of command / kind
  std::optional<std::string> kind;     ///< sleep | cpu-burn | ptycho-reconstruct
  ScalarMap args;
  std::vector<std::string> inputs;
  ResourceSpec resources;
  std::optional<Duration> deadline;
  std::vector<std::string> preferred_sites;
  std::vector<std::string> allowed_sites;  ///< empty = any site
  std::int64_t count = 1;
  std::optional<double> rate;          ///< instances per second for a stream
  std::optional<Duration> duration;    ///< how long a stream runs
  /// How each instance's output file is announced: file (a file:// URI) or item (put on the
  /// relay as a data item, docs/streaming.md: a diaspora:// URI).
  enum class Output { file, item } output = Output::file;
  Location location;
};

enum class ActionKind { restart, migrate, speculate, checkpoint, throttle, alert };
std::string_view to_string(ActionKind a) noexcept;

struct PolicySpec {
  std::string name;
  std::string signal;             ///< e.g. "task.step_time"
  std::string detector = "ensemble";
  std::optional<double> threshold;
  std::int64_t for_count = 1;     ///< `for:` consecutive observations
  Duration cooldown{60.0};
  ActionKind action = ActionKind::alert;
  std::vector<std::string> targets;   ///< empty = everything
  std::vector<std::string> to_sites;  ///< empty = every other site
  std::int64_t max_attempts = 3;
  Location location;
  std::map<std::string, Location> field_locations;  ///< where the value of each key given is, by key
};

struct RehearsalJobSpec {
  std::string name;
  std::optional<std::string> site;
  std::optional<std::filesystem::path> config;
  std::string dataset;
  std::optional<std::string> stream;  ///< ptycho-stream: the task whose data.arrived scans it trains on
  std::string strategy;
  std::optional<std::int64_t> buffer_size;
  std::int64_t world_size = 1;
  std::optional<Duration> checkpoint_every;
  /// Where the job's checkpoints travel between its attempts: file (its folder, which its
  /// sites share) or item (each put on the relay as a data item on <prefix>.data.<job>;
  /// the next attempt fetches the newest: sites that share no file system).
  enum class Checkpoints { file, item } checkpoints = Checkpoints::file;
  ScalarMap set;
  Location location;
};

/// `defaults:`: whether the built-in protection set (docs/anomaly.md, "Default
/// protection") runs beside the spec's policies: on (the default), off, or observe
/// (its decisions are reported as alerts and nothing is done).
enum class DefaultsMode { on, off, observe };
std::string_view to_string(DefaultsMode m) noexcept;

enum class FaultKind { slow_site, kill_worker, stop_relay, hang_task, slow_task };
std::string_view to_string(FaultKind f) noexcept;

struct FaultSpec {
  Duration at{0};
  FaultKind kind = FaultKind::slow_site;
  std::optional<std::string> site;
  std::optional<std::string> task;  ///< hang-task, kill-worker, slow-task: an instance of this task
  double factor = 1.0;
  std::optional<Duration> lasts;  ///< `for:`; nullopt = until the end
  Location location;
};

/// A validated workflow spec.
///
/// @par Thread Safety
/// A plain value; safe to read concurrently once loaded.
struct WorkflowSpec {
  std::string file;  ///< where it was loaded from
  int version = 1;
  std::string name;
  std::string description;
  RelaySpec relay;
  PluginSpec plugin;
  std::vector<SiteSpec> sites;
  std::vector<TaskSpec> tasks;
  std::vector<PolicySpec> policies;
  std::vector<RehearsalJobSpec> rehearsal;
  std::vector<FaultSpec> faults;
  DefaultsMode defaults = DefaultsMode::on;
  /// `sensitivity:` (> 0, default 1): one knob for the relative detectors and the defaults.
  /// "Worse than normal" means `1 + 1/sensitivity` times the task's normal (2x at 1).
  double sensitivity = 1.0;

  /// The site named `name`, or nullptr.
  const SiteSpec* find_site(std::string_view name) const noexcept;
};

/// Result of loading: the spec when there were no errors, and every diagnostic.
struct SpecLoadResult {
  std::optional<WorkflowSpec> spec;
  std::vector<Diagnostic> diagnostics;
  bool ok() const noexcept { return spec.has_value(); }
};

/// Loads and validates a spec file: YAML syntax, the schema (every error, not only the
/// first), then cross-references (undefined sites and targets, duplicate names). Never
/// throws; a missing or unreadable file is a diagnostic. Thread-safe.
SpecLoadResult load_spec_file(const std::filesystem::path& file);

/// Same, from YAML text; `name` is used as FILE in diagnostics.
SpecLoadResult load_spec_string(std::string_view yaml, std::string_view name = "<string>");

/// Reads a YAML input file (a spec, a rehearsal config, ...) of at most `max_bytes` bytes.
/// `kind` names it in messages ("spec", "rehearsal config").
/// @throws SpecError with one diagnostic at line 0 of `file`: no such file, a directory,
///         unreadable, or larger than `max_bytes`. Thread-safe.
std::string read_yaml_file(const std::filesystem::path& file, std::uintmax_t max_bytes, std::string_view kind);

/// Throwing forms: return the spec or throw SpecError with all diagnostics.
WorkflowSpec parse_spec_file(const std::filesystem::path& file);
WorkflowSpec parse_spec_string(std::string_view yaml, std::string_view name = "<string>");

/// "30s" / "250ms" / "1.5m" / "2h" / "7d" -> seconds; nullopt when malformed. (Each
/// schema decides which units a field accepts; workflow specs stop at hours.)
std::optional<Duration> parse_duration(std::string_view text);
/// 4096 / "512KiB" / "64MiB" / "2GiB" / "100B" -> bytes; nullopt when malformed.
std::optional<std::uint64_t> parse_size(const boost::json::value& v);

/// A YAML document converted to JSON, with the source position of every node.
/// Used by every YAML input of Diaspora (workflow specs, relay and rehearsal configs).
struct YamlDocument {
  boost::json::value root;
  std::map<std::string, Location> value_locations;  ///< key: format_path of the node
  std::map<std::string, Location> key_locations;    ///< key: format_path of the mapping entry
  std::vector<Diagnostic> errors;                   ///< syntax errors, duplicate keys
};

/// Parses YAML text (YAML 1.2 core schema for plain scalars: null, booleans true/false,
/// integers, floats; anything quoted is a string). Never throws.
YamlDocument parse_yaml(std::string_view text, std::string_view file_name);

/// Validates a YAML document against a built-in schema (e.g. "workflow.schema.json") and
/// returns located diagnostics; used for every YAML input. Never throws.
std::vector<Diagnostic> validate_yaml(const YamlDocument& doc, std::string_view schema_name,
                                      std::string_view file_name);

}  // namespace diaspora
