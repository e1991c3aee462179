/*
 * diaspora/plugin.h -- the stable C ABI of libdiaspora_plugin.so.
 *
 * A workflow engine (Parsl, Dask, Globus Compute, a batch wrapper, ...) loads the plugin
 * at run time, opens one handle from a workflow spec, reports each task's lifecycle
 * through the hook calls below and receives resilience actions back. The plugin turns
 * every call into a CloudEvents event on the Diaspora relay (TLS WebSocket, acked), keeps
 * events in an on-disk spool while the relay is away and replays them in order.
 *
 * Contract, in short (docs/plugin.md has the whole manual):
 *  - Every function is plain C, returns a diaspora_status (or a documented value), never
 *    throws, never aborts, and checks its arguments: NULL where a pointer is required is
 *    DIASPORA_ERR_NULL, anything else out of range is DIASPORA_ERR_INVALID.
 *  - Hooks (diaspora_task_*, diaspora_metric, diaspora_data_arrived,
 *    diaspora_resource_status) may be called from any number of engine threads at once.
 *    They copy their arguments into a bounded lock-free queue and return: no blocking,
 *    no allocation, no system call on the fast path. Strings are copied; the caller
 *    keeps ownership of everything it passes.
 *  - When the queue is full, lifecycle events (task hooks, data, resource status) go to
 *    the on-disk spool (slower, never dropped); free-form metrics are coalesced (the
 *    latest value per series is kept and the count of merged samples published).
 *  - Every struct passed in starts with `struct_size`, set by the caller to
 *    sizeof(the struct) as compiled: later minor versions append fields, and the library
 *    reads only what the caller's struct holds.
 *
 * Versioning: DIASPORA_ABI_VERSION is (major << 16) | minor. A library is usable by a
 * caller compiled against this header when the majors are equal and the library's minor
 * is at least the header's (see DIASPORA_ABI_COMPATIBLE / diaspora_abi_check).
 */
#ifndef DIASPORA_PLUGIN_H
#define DIASPORA_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define DIASPORA_API __attribute__((visibility("default")))
#else
#define DIASPORA_API
#endif

#define DIASPORA_ABI_VERSION_MAJOR 1
#define DIASPORA_ABI_VERSION_MINOR 3
#define DIASPORA_ABI_VERSION \
  ((uint32_t)(((uint32_t)DIASPORA_ABI_VERSION_MAJOR << 16) | (uint32_t)DIASPORA_ABI_VERSION_MINOR))

/* True when a library reporting ABI version `lib` (diaspora_abi_version()) serves a
 * caller compiled against this header: same major, library minor >= header minor. */
#define DIASPORA_ABI_COMPATIBLE(lib)                                     \
  ((((uint32_t)(lib)) >> 16) == (uint32_t)DIASPORA_ABI_VERSION_MAJOR && \
   (((uint32_t)(lib)) & 0xffffu) + 1u > (uint32_t)DIASPORA_ABI_VERSION_MINOR)

/* Limits on strings passed in (bytes, without the terminating NUL). Longer is
 * DIASPORA_ERR_INVALID. Strings should be UTF-8; invalid bytes are replaced by U+FFFD
 * in the published event. */
#define DIASPORA_MAX_ID 255       /* task, site, worker, resource, stream ids, names */
#define DIASPORA_MAX_TEXT 4095    /* reasons, URIs (checksums: DIASPORA_MAX_ID) */
#define DIASPORA_MAX_METRIC_NAME 63
#define DIASPORA_MAX_METRICS 64   /* metrics per call */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes --------------------------------------------------------------------- */

typedef enum diaspora_status {
  DIASPORA_OK = 0,
  DIASPORA_ERR_NULL = 1,      /* a required pointer argument was NULL */
  DIASPORA_ERR_INVALID = 2,   /* an argument is malformed or out of range (see last error) */
  DIASPORA_ERR_CONFIG = 3,    /* open: the spec or the plugin configuration is invalid */
  DIASPORA_ERR_IO = 4,        /* the spool could not be written or read (disk full, ...) */
  DIASPORA_ERR_CLOSED = 5,    /* the handle is being closed */
  DIASPORA_ERR_TIMEOUT = 6,   /* close: not everything was acked in time (rest is spooled) */
  DIASPORA_ERR_NOT_FOUND = 7, /* unknown or already acknowledged action id */
  DIASPORA_ERR_EMPTY = 8,     /* poll: no action is waiting */
  DIASPORA_ERR_VERSION = 9,   /* ABI mismatch (diaspora_abi_check) */
  DIASPORA_ERR_INTERNAL = 10  /* unexpected internal failure; the last error says what */
} diaspora_status;

/* Opaque handle: one per engine (or per engine process). */
typedef struct diaspora_plugin diaspora_plugin;

/* ---- version ---------------------------------------------------------------------------- */

/* The library's ABI version, (major << 16) | minor. Any thread, any time. */
DIASPORA_API uint32_t diaspora_abi_version(void);

/* Checks that this library serves a caller compiled against ABI `caller_version`
 * (pass DIASPORA_ABI_VERSION). Returns DIASPORA_OK, or DIASPORA_ERR_VERSION and writes a
 * readable explanation ("plugin library ABI 1.0 cannot serve an engine built for ABI 2.0: ...")
 * into `errbuf`
 * (NUL-terminated, truncated to errbuf_len; errbuf may be NULL when errbuf_len is 0).
 * Any thread, any time. */
DIASPORA_API int diaspora_abi_check(uint32_t caller_version, char* errbuf, size_t errbuf_len);

/* The library's version string, e.g. "0.1.0". Static storage. Any thread. */
DIASPORA_API const char* diaspora_library_version(void);

/* Name of a status code ("DIASPORA_ERR_NULL", ...); "unknown status" otherwise. Static
 * storage. Any thread. */
DIASPORA_API const char* diaspora_status_name(int status);

/* ---- open / close ----------------------------------------------------------------------- */

/* Opens a handle from a workflow spec file (YAML; the `name`, `relay`, `plugin` and
 * `policies` sections are used, the rest is validated). Starts the publisher and control threads,
 * opens the spool (replaying what a previous process left there) and begins connecting
 * to the relay in the background: open never waits for the relay.
 * On success returns DIASPORA_OK and stores the handle in *out. On failure returns
 * DIASPORA_ERR_NULL (spec_path or out NULL), DIASPORA_ERR_CONFIG (every problem of the
 * spec written to errbuf as "FILE:LINE:COL: error: ..." lines; a problem found after
 * loading, such as an unreadable token file, as "FILE: error: ..."), DIASPORA_ERR_IO (spool directory not
 * usable, or in use by another process) or DIASPORA_ERR_INTERNAL; *out is then NULL.
 * errbuf (caller-owned, may be NULL when errbuf_len is 0) receives a NUL-terminated
 * message, truncated to errbuf_len. Any thread; the handle may be used from any thread. */
DIASPORA_API int diaspora_open_file(const char* spec_path, diaspora_plugin** out, char* errbuf,
                                    size_t errbuf_len);

/* Same as diaspora_open_file, from YAML text (diagnostics name the file "<yaml>"). */
DIASPORA_API int diaspora_open_yaml(const char* yaml, diaspora_plugin** out, char* errbuf,
                                    size_t errbuf_len);

/* Flushes and closes. Waits about flush_timeout_ms (>= 0; more than a year counts as a
 * year, so INT64_MAX may stand for "as long as it takes") for queued events to be acked
 * by the relay (a connection attempt or a blocked send in progress may add up to its own
 * 5 s timeout); what is not acked by then is written to the spool (and synced),
 * to be replayed by the next open on the same spool directory. Stops the threads (after
 * the action callback, if running, returns) and frees the handle in every case, except
 * when it returns DIASPORA_ERR_NULL or DIASPORA_ERR_INVALID (negative timeout) or
 * DIASPORA_ERR_CLOSED (called from the action callback: close from another thread).
 * Returns DIASPORA_OK when everything was acked, DIASPORA_ERR_TIMEOUT when events
 * remain in the spool (with timeout 0 this is the usual result: it only spools), and
 * DIASPORA_ERR_IO when the spool failed at close or, with everything else acked, some
 * event was lost during the handle's life (events_lost in the statistics).
 * Call it once, from any engine thread, after every other call on the handle returned. */
DIASPORA_API int diaspora_close(diaspora_plugin* plugin, int64_t flush_timeout_ms);

/* Copies the handle's last error message (NUL-terminated, truncated to buf_len) into buf
 * and returns its full length (like snprintf); 0 when nothing has gone wrong yet. The
 * message is per handle and never cleared: the most recent problem, from a failing call
 * on any thread or from the plugin's own threads (relay unreachable, spool trouble,
 * refused events). buf may be NULL when buf_len is 0. Returns 0 when plugin is NULL.
 * Any thread, concurrently with every other call on the handle. */
DIASPORA_API size_t diaspora_last_error(const diaspora_plugin* plugin, char* buf, size_t buf_len);

/* ---- task hooks ------------------------------------------------------------------------- */

/* What failed a task (diaspora_task_info.failure, ABI 1.2). The default protection
 * (docs/anomaly.md, "Default protection") retries a lost attempt and never the task's own
 * error: the same code on the same input fails again (Ray's default, too). */
typedef enum diaspora_failure_kind {
  DIASPORA_FAILURE_UNKNOWN = 0, /* not said: an exit_code that is set and not 0 is an error, else lost */
  DIASPORA_FAILURE_ERROR = 1,   /* the task's own: an exception, a non-zero exit status, bad arguments */
  DIASPORA_FAILURE_LOST = 2     /* the infrastructure's: its worker, node or process died (a signal,
                                   out of memory), the engine lost it */
} diaspora_failure_kind;

/* One metric sample: name (1..DIASPORA_MAX_METRIC_NAME bytes) and a finite value. */
typedef struct diaspora_metric_value {
  const char* name;
  double value;
} diaspora_metric_value;

/* What a task hook reports. Zero-initialise, set struct_size = sizeof(diaspora_task_info)
 * and the fields the hook uses; fields left 0 / NULL mean "not reported". */
typedef struct diaspora_task_info {
  size_t struct_size;
  const char* task_id;   /* required: the engine's task id (1..DIASPORA_MAX_ID bytes) */
  const char* site;      /* optional: site (cluster, endpoint) the task belongs to */
  const char* worker;    /* optional: worker / node running it (started, heartbeat, ...) */
  const char* name;      /* optional: app or function name (submitted) */
  int64_t timestamp_us;  /* microseconds since the Unix epoch; 0 = now */
  int32_t attempt;       /* 1 for the first try, 2 for the first retry, ...; 0 = unknown */
  int32_t exit_code;     /* completed / failed, used when has_exit_code != 0 */
  int32_t has_exit_code;
  int32_t retryable;     /* failed: 1 = the engine will retry, 0 = unknown/no */
  double progress;       /* progress hook: fraction done in [0, 1] */
  int64_t step;          /* progress hook: step number, >= 0; -1 = none */
  double deadline_s;     /* submitted: seconds the task should take at most; 0 = none */
  const char* reason;    /* failed: required (1..DIASPORA_MAX_TEXT bytes); cancelled: optional */
  const diaspora_metric_value* metrics;  /* heartbeat / progress: optional samples */
  size_t metric_count;                   /* 0..DIASPORA_MAX_METRICS */
  /* ABI 1.2, read only when struct_size covers it: failed: a diaspora_failure_kind
   * (0..2; anything else is DIASPORA_ERR_INVALID). */
  int32_t failure;
} diaspora_task_info;

/* The task hooks. Each validates `info`, copies it into the queue and returns at once.
 * Returns DIASPORA_OK; DIASPORA_ERR_NULL (plugin, info or info->task_id NULL, or a
 * metric name NULL); DIASPORA_ERR_INVALID (struct_size smaller than the first version of
 * the struct, an empty or too long string, a non-finite number, progress outside [0, 1],
 * an empty reason for failed); DIASPORA_ERR_CLOSED (the handle is closing);
 * DIASPORA_ERR_IO (the queue was full and the spool could not be written: the event is
 * lost and counted); DIASPORA_ERR_INTERNAL (an unexpected failure such as running out of
 * memory on the spool path; the last error says what). A NULL reason for failed is
 * DIASPORA_ERR_NULL. Any thread, concurrently. Never blocks except on the spool path,
 * taken when the queue is full or when the call's strings and metrics exceed 424 bytes
 * (a slot's room): then the call moves the queue's events to the spool and writes its
 * own after them, under a lock; the publisher sends from the spool until it is drained
 * and acked, then from the queue again. */
DIASPORA_API int diaspora_task_submitted(diaspora_plugin* plugin, const diaspora_task_info* info);
DIASPORA_API int diaspora_task_started(diaspora_plugin* plugin, const diaspora_task_info* info);
DIASPORA_API int diaspora_task_heartbeat(diaspora_plugin* plugin, const diaspora_task_info* info);
DIASPORA_API int diaspora_task_progress(diaspora_plugin* plugin, const diaspora_task_info* info);
DIASPORA_API int diaspora_task_completed(diaspora_plugin* plugin, const diaspora_task_info* info);
DIASPORA_API int diaspora_task_failed(diaspora_plugin* plugin, const diaspora_task_info* info);
DIASPORA_API int diaspora_task_cancelled(diaspora_plugin* plugin, const diaspora_task_info* info);

/* ---- metrics, data, resources ----------------------------------------------------------- */

typedef enum diaspora_scope {
  DIASPORA_SCOPE_TASK = 1,
  DIASPORA_SCOPE_SITE = 2,
  DIASPORA_SCOPE_RESOURCE = 3
} diaspora_scope;

typedef struct diaspora_metric {
  size_t struct_size;
  int32_t scope;         /* a diaspora_scope */
  const char* id;        /* required: the task, site or resource id */
  const char* name;      /* required: metric name, 1..DIASPORA_MAX_METRIC_NAME bytes */
  double value;          /* finite */
  int64_t timestamp_us;  /* 0 = now */
} diaspora_metric;

/* A free-form metric sample, published as org.diaspora.metric. When the queue is full,
 * samples of the same (scope, id, name) are coalesced into the latest one and the event
 * carries how many were merged. Same errors and threading as the task hooks. */
DIASPORA_API int diaspora_metric_sample(diaspora_plugin* plugin, const diaspora_metric* metric);

typedef struct diaspora_data_info {
  size_t struct_size;
  const char* stream;    /* required: stream or dataset name */
  int64_t seq;           /* required: >= 0, position in the stream */
  int64_t bytes;         /* >= 0; -1 = unknown */
  const char* uri;       /* optional */
  const char* checksum;  /* optional, "<algorithm>:<hex>" */
  const char* site;      /* optional */
  int64_t timestamp_us;  /* 0 = now */
} diaspora_data_info;

/* Data arrival (org.diaspora.data.arrived). Same errors and threading as the task hooks. */
DIASPORA_API int diaspora_data_arrived(diaspora_plugin* plugin, const diaspora_data_info* info);

typedef struct diaspora_resource_info {
  size_t struct_size;
  const char* resource_id; /* required */
  const char* kind;        /* required: site | worker | node | gpu | link | relay */
  const char* state;       /* required: up | degraded | down | unknown */
  const char* site;        /* optional */
  int64_t timestamp_us;    /* 0 = now */
  const diaspora_metric_value* metrics;
  size_t metric_count;
} diaspora_resource_info;

/* Resource status (org.diaspora.resource.status). Same errors and threading as the task
 * hooks; an unknown kind or state is DIASPORA_ERR_INVALID. */
DIASPORA_API int diaspora_resource_status(diaspora_plugin* plugin, const diaspora_resource_info* info);

/* ---- actions ------------------------------------------------------------------------------ */

typedef enum diaspora_action_kind {
  DIASPORA_ACTION_RESTART = 1,    /* start a new attempt of task_id */
  DIASPORA_ACTION_MIGRATE = 2,    /* move task_id to target_site */
  DIASPORA_ACTION_SPECULATE = 3,  /* run a copy of task_id on target_site (or anywhere) */
  DIASPORA_ACTION_CHECKPOINT = 4, /* ask task_id to checkpoint */
  DIASPORA_ACTION_THROTTLE = 5,   /* slow down submissions (to site, or everywhere) */
  DIASPORA_ACTION_CANCEL = 6,     /* cancel task_id */
  DIASPORA_ACTION_DRAIN = 7,      /* start nothing new on site (running tasks finish there) */
  DIASPORA_ACTION_UNDRAIN = 8     /* site takes new work again after a drain */
} diaspora_action_kind;

/* An action for the engine. Strings are NUL-terminated and owned by the struct. */
typedef struct diaspora_action {
  size_t struct_size;               /* poll: set by the caller; callback: set by the plugin */
  char id[DIASPORA_MAX_ID + 1];     /* acknowledge with diaspora_action_done/failed */
  int32_t kind;                     /* a diaspora_action_kind */
  char kind_name[16];               /* "restart", "migrate", ... */
  char task_id[DIASPORA_MAX_ID + 1];     /* empty for throttle without a task, drain, undrain */
  char site[DIASPORA_MAX_ID + 1];        /* where the task is, when known; drain/undrain: the site */
  char target_site[DIASPORA_MAX_ID + 1]; /* migrate (always set), speculate (optional) */
  char reason[DIASPORA_MAX_TEXT + 1];    /* readable: what was seen and why this action */
  char origin[16];                  /* "control" (operator via the relay) or "local" */
  int64_t issued_us;                /* when the plugin received it, µs since the Unix epoch */
  /* ABI 1.1: when it was requested, µs since the Unix epoch, by the requester's clock: the
   * action.requested event's CloudEvents `time` (control), the decision's time (local); 0
   * when the event carries no valid `time`. Unlike issued_us it does not change when an
   * unhandled request is delivered again to the next engine of the same engine id.
   * diaspora_poll_action writes it only when struct_size covers it. */
  int64_t requested_us;
} diaspora_action;

/* Called for each action, on the plugin's control thread (one thread; calls are never
 * concurrent). The pointer is valid only during the call: copy what you keep. The
 * callback may call any function of this header on the same handle except
 * diaspora_close and diaspora_set_action_callback. It should return quickly (hand the
 * action to the engine's own thread); while it runs, further actions wait. */
typedef void (*diaspora_action_callback)(const diaspora_action* action, void* user_data);

/* Installs (or with callback NULL removes) the action callback. Actions that arrived
 * while no callback was installed stay available to diaspora_poll_action; the callback
 * receives only later ones. Returns DIASPORA_OK, DIASPORA_ERR_NULL (plugin NULL),
 * DIASPORA_ERR_CLOSED (called from the callback itself) or DIASPORA_ERR_INTERNAL (out of
 * memory; the last error says what). Any engine thread. */
DIASPORA_API int diaspora_set_action_callback(diaspora_plugin* plugin, diaspora_action_callback callback,
                                              void* user_data);

/* Takes the oldest action waiting for polling (one that arrived while no callback was
 * installed) into *out, whose
 * struct_size the caller sets. Returns DIASPORA_OK, DIASPORA_ERR_EMPTY (none waiting),
 * DIASPORA_ERR_NULL, DIASPORA_ERR_INVALID (struct_size too small) or
 * DIASPORA_ERR_INTERNAL (an unexpected failure; the last error says what). Never blocks.
 * Any thread. At most 4096 actions wait; older ones beyond that are failed automatically
 * ("the engine did not poll for it") and published as such. */
DIASPORA_API int diaspora_poll_action(diaspora_plugin* plugin, diaspora_action* out);

/* Acknowledges an action: the engine carried it out (done) or could not (failed, with a
 * reason). Published as org.diaspora.action.done with status "done" / "failed".
 * `message` is optional for done, required for failed (1..DIASPORA_MAX_TEXT bytes).
 * Returns DIASPORA_OK, DIASPORA_ERR_NULL, DIASPORA_ERR_INVALID (an empty or too long
 * id, message or reason), DIASPORA_ERR_NOT_FOUND (no such action waiting for
 * acknowledgement) or DIASPORA_ERR_INTERNAL (an unexpected failure; the last error says
 * what). Any thread. */
DIASPORA_API int diaspora_action_done(diaspora_plugin* plugin, const char* action_id, const char* message);
DIASPORA_API int diaspora_action_failed(diaspora_plugin* plugin, const char* action_id, const char* reason);

/* ---- statistics --------------------------------------------------------------------------- */

/* ---- data items (ABI 1.3; docs/streaming.md) -------------------------------------------
 *
 * Bulk bytes (a detector frame, a scan, a checkpoint) through the relay, read back by
 * offset at any site. Unlike the hooks these calls BLOCK: an item goes over a relay
 * session of its own (never the events' queue or spool, so lifecycle events never wait
 * behind bulk bytes and a relay outage never fills the spool with them), and
 * diaspora_item_put returns only once the relay acknowledged the item (stored: fsynced on
 * the embedded log), resending it across reconnects and failover relays until its
 * timeout: backpressure to the producer. Call them from threads that may block, not from
 * an engine's event loop. Any thread; calls on one handle are serialised. */

typedef struct diaspora_item_info {
  size_t struct_size;
  const void* bytes;          /* the item's bytes (NULL only when size is 0) */
  size_t size;                /* at most the relay's max_item_bytes (128 MiB by default) */
  const char* topic;          /* optional: default "<workflow>.data" */
  const char* id;             /* optional: the item's event id (default: a new UUID); putting
                                 the same id again writes nothing twice */
  const char* type;           /* optional: the event's type (default org.diaspora.data.item) */
  const char* stream;         /* optional: data.stream */
  int64_t seq;                /* >= 0: data.seq; -1: none */
  const char* content_type;   /* optional: data.content_type, a media type */
  const char* site;           /* optional: data.site */
  const char* deadline;       /* optional, RFC 3339: stored later, the relay says it was late */
  int64_t timeout_ms;         /* how long to keep trying; 0: 60 s */
} diaspora_item_info;

typedef struct diaspora_item_ref {
  size_t struct_size;                 /* set by the caller */
  char topic[DIASPORA_MAX_ID + 1];    /* where it is */
  uint64_t offset;                    /* the offset of its event (its chunks follow) */
  int32_t duplicate;                  /* 1: the relay held it already (same id), nothing written */
  int32_t late;                       /* 1: stored after its deadline */
} diaspora_item_ref;

/* Puts one item and fills *out (may be NULL). Returns DIASPORA_OK; DIASPORA_ERR_NULL;
 * DIASPORA_ERR_INVALID for bad arguments or an item the relay refused (too large, a
 * topic the token may not publish on: the last error has the relay's reason);
 * DIASPORA_ERR_TIMEOUT when the relay could not be reached (or did not ack) within
 * timeout_ms; DIASPORA_ERR_CLOSED while closing. */
DIASPORA_API int diaspora_item_put(diaspora_plugin* plugin, const diaspora_item_info* info, diaspora_item_ref* out);

/* Fetches the item whose event is at `offset` of `topic` (NULL: "<workflow>.data"),
 * checks its size and SHA-256, and returns its bytes in *bytes_out (*size_out of them)
 * and its event's JSON text in *event_json_out (NUL-terminated; may be NULL if not
 * wanted), both allocated by the library: free each with diaspora_item_free. Returns
 * DIASPORA_OK; DIASPORA_ERR_NULL; DIASPORA_ERR_NOT_FOUND when the offset holds no item (an
 * event that announces none, or one no longer retained); DIASPORA_ERR_IO when the bytes do
 * not match the checksum or the item is incomplete (its put was cut short); DIASPORA_ERR_TIMEOUT when nothing came within timeout_ms (0:
 * 60 s; an offset past the topic's end waits for it); DIASPORA_ERR_CLOSED while closing.
 * On an error nothing is allocated. */
DIASPORA_API int diaspora_item_get(diaspora_plugin* plugin, const char* topic, uint64_t offset, int64_t timeout_ms,
                                   void** bytes_out, size_t* size_out, char** event_json_out);

/* Frees what diaspora_item_get allocated (NULL is fine). Any thread. */
DIASPORA_API void diaspora_item_free(void* p);

typedef struct diaspora_stats {
  size_t struct_size;           /* set by the caller */
  uint64_t events_accepted;     /* hook calls that returned DIASPORA_OK */
  uint64_t events_acked;        /* events the relay acknowledged */
  uint64_t events_spilled;      /* went to the spool: queue full, or too large for a slot */
  uint64_t metrics_coalesced;   /* metric samples merged into a later one */
  uint64_t events_lost;         /* could not be queued nor spooled (DIASPORA_ERR_IO) */
  uint64_t spool_records;       /* events in the spool now */
  uint64_t spool_bytes;         /* bytes in the spool now */
  uint64_t reconnects;          /* successful connections after the first */
  uint64_t invalid_transitions; /* task hooks out of lifecycle order (reported as events) */
  uint64_t actions_received;    /* actions received for the engine (delivered or waiting) */
  uint64_t events_rejected;     /* refused by the relay (nack naming the event); see last error */
  int32_t connected;            /* 1 when the publisher holds a relay session */
  int32_t control_connected;    /* 1 when subscribed to the control topic */
} diaspora_stats;

/* Copies the counters into *out (whose struct_size the caller sets). Returns DIASPORA_OK,
 * DIASPORA_ERR_NULL or DIASPORA_ERR_INVALID. Any thread; the counters are read one by one
 * (not a consistent snapshot). */
DIASPORA_API int diaspora_get_stats(const diaspora_plugin* plugin, diaspora_stats* out);

#ifdef __cplusplus
}
#endif

#endif /* DIASPORA_PLUGIN_H */
