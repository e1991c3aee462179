// The Diaspora event types (DESIGN.md "Event model") and their typed data payloads.
// Each payload's JSON form is defined by schemas/events/<type>.schema.json; the structs
// here mirror those schemas field by field (optional fields are std::optional).
#pragma once

#include <boost/describe/class.hpp>
#include <boost/json/value.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "diaspora/event.hpp"

namespace diaspora::events {

using Metrics = std::map<std::string, double>;

// Fields shared by every org.diaspora.task.* payload.
struct TaskRef {
  std::string task_id;
  std::optional<std::string> workflow;
  std::optional<std::string> site;
  std::optional<std::int64_t> attempt;
};
BOOST_DESCRIBE_STRUCT(TaskRef, (), (task_id, workflow, site, attempt))

struct TaskResources {
  std::optional<double> cpus;
  std::optional<std::int64_t> memory_bytes;
  std::optional<std::int64_t> gpus;
};
BOOST_DESCRIBE_STRUCT(TaskResources, (), (cpus, memory_bytes, gpus))

struct TaskSubmitted : TaskRef {
  static constexpr std::string_view type = "org.diaspora.task.submitted";
  std::optional<std::string> name;
  std::optional<std::string> engine;
  std::optional<double> deadline_s;
  std::optional<TaskResources> resources;
};
BOOST_DESCRIBE_STRUCT(TaskSubmitted, (TaskRef), (name, engine, deadline_s, resources))

struct TaskStarted : TaskRef {
  static constexpr std::string_view type = "org.diaspora.task.started";
  std::optional<std::string> worker;
  std::optional<double> queue_wait_s;
};
BOOST_DESCRIBE_STRUCT(TaskStarted, (TaskRef), (worker, queue_wait_s))

struct TaskHeartbeat : TaskRef {
  static constexpr std::string_view type = "org.diaspora.task.heartbeat";
  std::optional<std::string> worker;
  std::optional<std::int64_t> seq;
  std::optional<Metrics> metrics;
};
BOOST_DESCRIBE_STRUCT(TaskHeartbeat, (TaskRef), (worker, seq, metrics))

struct TaskProgress : TaskRef {
  static constexpr std::string_view type = "org.diaspora.task.progress";
  double progress = 0;  ///< fraction done, [0, 1]
  std::optional<std::string> worker;
  std::optional<std::int64_t> step;
  std::optional<Metrics> metrics;
};
BOOST_DESCRIBE_STRUCT(TaskProgress, (TaskRef), (progress, worker, step, metrics))

struct TaskCompleted : TaskRef {
  static constexpr std::string_view type = "org.diaspora.task.completed";
  std::optional<std::string> worker;
  std::optional<double> runtime_s;
  std::optional<std::int64_t> exit_code;
  std::optional<std::vector<std::string>> outputs;
};
BOOST_DESCRIBE_STRUCT(TaskCompleted, (TaskRef), (worker, runtime_s, exit_code, outputs))

struct TaskFailed : TaskRef {
  static constexpr std::string_view type = "org.diaspora.task.failed";
  std::string reason;
  std::optional<std::string> worker;
  std::optional<std::int64_t> exit_code;
  std::optional<bool> retryable;
  std::optional<std::string> failure;  ///< "error" | "lost" (ABI 1.2), when the engine said
  std::optional<double> runtime_s;
};
BOOST_DESCRIBE_STRUCT(TaskFailed, (TaskRef), (reason, worker, exit_code, retryable, failure, runtime_s))

struct TaskCancelled : TaskRef {
  static constexpr std::string_view type = "org.diaspora.task.cancelled";
  std::optional<std::string> reason;
};
BOOST_DESCRIBE_STRUCT(TaskCancelled, (TaskRef), (reason))

struct TaskRestarted : TaskRef {
  static constexpr std::string_view type = "org.diaspora.task.restarted";
  std::string reason;
  std::optional<std::string> action_id;
};
BOOST_DESCRIBE_STRUCT(TaskRestarted, (TaskRef), (reason, action_id))

struct TaskMigrated : TaskRef {
  static constexpr std::string_view type = "org.diaspora.task.migrated";
  std::string from_site;
  std::string to_site;
  std::string reason;
  std::optional<std::string> action_id;
};
BOOST_DESCRIBE_STRUCT(TaskMigrated, (TaskRef), (from_site, to_site, reason, action_id))

struct ResourceStatus {
  static constexpr std::string_view type = "org.diaspora.resource.status";
  std::string resource_id;
  std::string kind;   ///< site | worker | node | gpu | link | relay
  std::string state;  ///< up | degraded | down | unknown
  std::optional<std::string> site;
  std::optional<Metrics> metrics;
  /// The task the resource works for, if it says (a link: the task its client said in hello).
  std::optional<std::string> task_id;
};
BOOST_DESCRIBE_STRUCT(ResourceStatus, (), (resource_id, kind, state, site, metrics, task_id))

struct DataArrived {
  static constexpr std::string_view type = "org.diaspora.data.arrived";
  std::string stream;
  std::int64_t seq = 0;
  std::optional<std::int64_t> bytes;
  std::optional<std::string> uri;
  std::optional<std::string> checksum;  ///< "<algorithm>:<hex>", e.g. "crc32c:1a2b3c4d"
  std::optional<std::string> site;
};
BOOST_DESCRIBE_STRUCT(DataArrived, (), (stream, seq, bytes, uri, checksum, site))

/// One file of an item that carries several (a folder, such as a trainer's checkpoint):
/// the item's bytes are its files one after the other, in the order listed.
struct ItemFile {
  std::string name;  ///< a plain file name (no folder)
  std::int64_t size = 0;
};
BOOST_DESCRIBE_STRUCT(ItemFile, (), (name, size))

/// The event of a data item carried by the fabric (docs/streaming.md): its bytes follow it
/// as chunks; the item attributes (itemsize, itemchunks, itemsha256) are on the event.
struct DataItem {
  static constexpr std::string_view type = "org.diaspora.data.item";
  std::optional<std::string> stream;
  std::optional<std::int64_t> seq;
  std::optional<std::string> file;          ///< the file it was read from, if any (its name)
  std::optional<std::string> content_type;  ///< a media type, e.g. application/x-hdf5
  std::optional<std::string> site;
  std::optional<std::vector<ItemFile>> files;  ///< the files the bytes hold, if several
};
BOOST_DESCRIBE_STRUCT(DataItem, (), (stream, seq, file, content_type, site, files))

struct Forecast {
  std::string metric;
  double eta_s = 0;  ///< seconds until the metric is expected to cross `threshold`
  std::optional<double> threshold;
};
BOOST_DESCRIBE_STRUCT(Forecast, (), (metric, eta_s, threshold))

struct AnomalyPredicted {
  static constexpr std::string_view type = "org.diaspora.anomaly.predicted";
  std::string series;
  double score = 0;  ///< [0, 1]
  std::string detector;
  std::optional<std::string> explanation;
  std::optional<double> value;
  std::optional<Forecast> forecast;
  std::optional<std::string> task_id;
  std::optional<std::string> site;
  std::optional<std::string> policy;        ///< the policy that decided
  std::optional<double> score_threshold;    ///< the policy's threshold on the score's scale
};
BOOST_DESCRIBE_STRUCT(AnomalyPredicted, (),
                      (series, score, detector, explanation, value, forecast, task_id, site, policy, score_threshold))

struct ActionRequested {
  static constexpr std::string_view type = "org.diaspora.action.requested";
  std::string action_id;
  std::string action;  ///< restart | migrate | speculate | checkpoint | throttle | cancel | alert
  std::string reason;
  std::optional<std::string> task_id;
  std::optional<std::string> site;
  std::optional<std::string> target_site;  ///< required for migrate
  std::optional<std::string> policy;
  std::optional<std::int64_t> attempt;
};
BOOST_DESCRIBE_STRUCT(ActionRequested, (),
                      (action_id, action, reason, task_id, site, target_site, policy, attempt))

struct ActionDone {
  static constexpr std::string_view type = "org.diaspora.action.done";
  std::string action_id;
  std::string status;  ///< done | failed
  std::optional<std::string> action;
  std::optional<std::string> message;
  std::optional<std::string> task_id;
};
BOOST_DESCRIBE_STRUCT(ActionDone, (), (action_id, status, action, message, task_id))

struct MetricSample {
  static constexpr std::string_view type = "org.diaspora.metric";
  std::string scope;  ///< task | site | resource
  std::string id;     ///< the task, site or resource id, according to `scope`
  std::string name;
  double value = 0;
  std::optional<std::int64_t> count;  ///< samples coalesced into this one (>= 1); absent = 1
  std::optional<std::string> site;
};
BOOST_DESCRIBE_STRUCT(MetricSample, (), (scope, id, name, value, count, site))

struct PluginWarning {
  static constexpr std::string_view type = "org.diaspora.plugin.warning";
  /// invalid_transition | metrics_coalesced | spool_over_limit | event_rejected |
  /// action_expired | events_lost
  std::string code;
  std::string message;
  std::optional<std::string> task_id;
  std::optional<std::int64_t> count;
  std::optional<std::string> engine;
};
BOOST_DESCRIBE_STRUCT(PluginWarning, (), (code, message, task_id, count, engine))

struct PluginStats {
  static constexpr std::string_view type = "org.diaspora.plugin.stats";
  std::string engine;
  std::int64_t events_accepted = 0;
  std::int64_t events_acked = 0;
  std::int64_t events_spilled = 0;
  std::int64_t metrics_coalesced = 0;
  std::int64_t events_lost = 0;
  std::int64_t spool_records = 0;
  std::int64_t spool_bytes = 0;
  std::int64_t reconnects = 0;
  std::int64_t invalid_transitions = 0;
  std::int64_t actions_received = 0;
  bool connected = false;
  std::optional<bool> closing;  ///< true in the last counters, published as the plugin closes
};
BOOST_DESCRIBE_STRUCT(PluginStats, (),
                      (engine, events_accepted, events_acked, events_spilled, metrics_coalesced, events_lost,
                       spool_records, spool_bytes, reconnects, invalid_transitions, actions_received, connected, closing))

/// Every Diaspora event type, sorted.
const std::vector<std::string_view>& all_types();

/// True when `type` is one of all_types().
bool is_known_type(std::string_view type) noexcept;

/// JSON form of a payload (absent optionals are omitted).
template <class Payload>
boost::json::value to_json(const Payload& payload);

/// Reads a payload from JSON after checking it against its schema. Throws EventError
/// (invalid_data) with the schema's message on mismatch.
template <class Payload>
Payload from_json(const boost::json::value& data);

/// Builds an event carrying `payload`: type from Payload::type, `subject` from the task
/// or resource id when the payload has one, time = now, id = a fresh UUID.
template <class Payload>
Event make_event(std::string source, const Payload& payload);

/// Reads the payload of an event of type Payload::type. Throws EventError (unknown_type)
/// when the event's type differs, or (invalid_data) when the data does not match.
template <class Payload>
Payload payload_of(const Event& event);

}  // namespace diaspora::events
