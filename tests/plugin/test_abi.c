/*
 * test_abi.c -- every entry of the C ABI with NULL and invalid arguments, compiled as C11
 * and linked against libdiaspora_plugin.so. No relay is needed: the spec points at a
 * closed port, so events go to the spool (which is checked too).
 *
 * usage: test_abi WORK_DIR      (exit 0 = pass; each failed check is printed)
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#include "diaspora/plugin.h"

static int failures = 0;
static int checks = 0;

#define EXPECT_RC(expr, want)                                                                   \
  do {                                                                                          \
    int got_ = (expr);                                                                          \
    ++checks;                                                                                   \
    if (got_ != (want)) {                                                                       \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s\n", __FILE__, __LINE__, #expr,        \
              diaspora_status_name(got_), diaspora_status_name(want));                          \
      ++failures;                                                                               \
    }                                                                                           \
  } while (0)

#define EXPECT(cond)                                                              \
  do {                                                                            \
    ++checks;                                                                     \
    if (!(cond)) {                                                                \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);         \
      ++failures;                                                                 \
    }                                                                             \
  } while (0)

static char spec[4096];
static char long_id[DIASPORA_MAX_ID + 2];     /* one byte over DIASPORA_MAX_ID */
static char long_text[DIASPORA_MAX_TEXT + 2]; /* one byte over DIASPORA_MAX_TEXT */
static char long_metric[DIASPORA_MAX_METRIC_NAME + 2];

static diaspora_task_info task(const char* id) {
  diaspora_task_info t;
  memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.task_id = id;
  t.step = -1;
  return t;
}

typedef int (*hook_fn)(diaspora_plugin*, const diaspora_task_info*);

static void check_task_hook(diaspora_plugin* h, hook_fn fn, const char* name) {
  diaspora_task_info t = task("t-1");
  fprintf(stderr, "  %s\n", name);
  EXPECT_RC(fn(NULL, &t), DIASPORA_ERR_NULL);
  EXPECT_RC(fn(h, NULL), DIASPORA_ERR_NULL);
  t.struct_size = 8;
  EXPECT_RC(fn(h, &t), DIASPORA_ERR_INVALID);
  t = task(NULL);
  EXPECT_RC(fn(h, &t), DIASPORA_ERR_NULL);
  t = task("");
  EXPECT_RC(fn(h, &t), DIASPORA_ERR_INVALID);
  t = task(long_id);
  EXPECT_RC(fn(h, &t), DIASPORA_ERR_INVALID);
  t = task("t-1");
  t.site = long_id;
  EXPECT_RC(fn(h, &t), DIASPORA_ERR_INVALID);
  t = task("t-1");
  t.timestamp_us = -5;
  EXPECT_RC(fn(h, &t), DIASPORA_ERR_INVALID);
  t = task("t-1");
  t.timestamp_us = 253402300800000000LL; /* the year 10000: nanoseconds passed by mistake */
  EXPECT_RC(fn(h, &t), DIASPORA_ERR_INVALID);
  t = task("t-1");
  t.attempt = -1;
  EXPECT_RC(fn(h, &t), DIASPORA_ERR_INVALID);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_abi WORK_DIR\n");
    return 2;
  }
  const char* dir = argv[1];
  memset(long_id, 'x', sizeof long_id - 1);
  memset(long_text, 'x', sizeof long_text - 1);
  memset(long_metric, 'x', sizeof long_metric - 1);
  char token_file[1024];
  snprintf(token_file, sizeof token_file, "%s/token", dir);
  FILE* f = fopen(token_file, "w");
  if (!f) return 2;
  fputs("not-a-real-token\n", f);
  fclose(f);
  snprintf(spec, sizeof spec,
           "version: 1\nname: abi-test\n"
           "relay: {url: 'wss://127.0.0.1:1', token_file: '%s'}\n"
           "plugin: {spool_dir: '%s/spool', engine_id: abi, control: false, reconnect_max: 200ms}\n"
           "sites: [{name: local, engine: local}]\n",
           token_file, dir);

  /* version */
  EXPECT(diaspora_abi_version() == DIASPORA_ABI_VERSION);
  EXPECT(DIASPORA_ABI_COMPATIBLE(diaspora_abi_version()));
  EXPECT(!DIASPORA_ABI_COMPATIBLE(diaspora_abi_version() + (1u << 16)));
  char err[4096];
  EXPECT_RC(diaspora_abi_check(DIASPORA_ABI_VERSION, err, sizeof err), DIASPORA_OK);
  EXPECT_RC(diaspora_abi_check(DIASPORA_ABI_VERSION + (1u << 16), err, sizeof err), DIASPORA_ERR_VERSION);
  EXPECT(strstr(err, "major") != NULL);
  EXPECT_RC(diaspora_abi_check(DIASPORA_ABI_VERSION + 1, err, sizeof err), DIASPORA_ERR_VERSION);
  EXPECT(strstr(err, "newer") != NULL);
  EXPECT_RC(diaspora_abi_check(DIASPORA_ABI_VERSION + (1u << 16), NULL, 0), DIASPORA_ERR_VERSION);
  EXPECT(strlen(diaspora_library_version()) > 0);
  EXPECT(strcmp(diaspora_status_name(DIASPORA_ERR_TIMEOUT), "DIASPORA_ERR_TIMEOUT") == 0);
  EXPECT(strcmp(diaspora_status_name(12345), "unknown status") == 0);

  /* open */
  diaspora_plugin* h = (diaspora_plugin*)1;
  EXPECT_RC(diaspora_open_file(NULL, &h, err, sizeof err), DIASPORA_ERR_NULL);
  EXPECT(h == NULL);
  EXPECT_RC(diaspora_open_file("x.yaml", NULL, err, sizeof err), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_open_yaml(NULL, &h, err, sizeof err), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_open_yaml("version: 1\n", NULL, err, sizeof err), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_open_file("/nonexistent/spec.yaml", &h, err, sizeof err), DIASPORA_ERR_CONFIG);
  EXPECT(strstr(err, "/nonexistent/spec.yaml") != NULL);
  EXPECT_RC(diaspora_open_yaml("version: 1\nname: x\nsites: [\n", &h, err, sizeof err), DIASPORA_ERR_CONFIG);
  EXPECT(strstr(err, "<yaml>:") != NULL);
  EXPECT_RC(diaspora_open_yaml("version: 1\nname: x\nplugin: {queue_sise: 10}\nsites: [{name: a, engine: local}]\n", &h,
                               err, sizeof err),
            DIASPORA_ERR_CONFIG);
  EXPECT(strstr(err, "<yaml>:3:") != NULL && strstr(err, "queue_size") != NULL);
  EXPECT_RC(diaspora_open_yaml("version: 1\nname: x\nrelay: {url: embedded}\nsites: [{name: a, engine: local}]\n", &h, err,
                               sizeof err),
            DIASPORA_ERR_CONFIG);
  EXPECT(strstr(err, "DIASPORA_RELAY_URL") != NULL);
  EXPECT_RC(diaspora_open_yaml("version: 1\nname: x\nrelay: {url: 'wss://127.0.0.1:1', token_file: /nonexistent}\n"
                               "sites: [{name: a, engine: local}]\n",
                               &h, err, sizeof err),
            DIASPORA_ERR_CONFIG);
  EXPECT(strstr(err, "token") != NULL);
  EXPECT_RC(diaspora_open_yaml(spec, &h, NULL, 0), DIASPORA_OK);
  EXPECT(h != NULL);
  if (!h) return 1;
  /* the same spool cannot be opened twice */
  diaspora_plugin* h2 = NULL;
  EXPECT_RC(diaspora_open_yaml(spec, &h2, err, sizeof err), DIASPORA_ERR_IO);
  EXPECT(strstr(err, "in use") != NULL);

  /* task hooks */
  fprintf(stderr, "task hooks:\n");
  check_task_hook(h, diaspora_task_submitted, "submitted");
  check_task_hook(h, diaspora_task_started, "started");
  check_task_hook(h, diaspora_task_heartbeat, "heartbeat");
  check_task_hook(h, diaspora_task_progress, "progress");
  check_task_hook(h, diaspora_task_completed, "completed");
  check_task_hook(h, diaspora_task_failed, "failed");
  check_task_hook(h, diaspora_task_cancelled, "cancelled");
  uint64_t ok_calls = 0;
  diaspora_task_info t = task("t-1");
  EXPECT_RC(diaspora_task_submitted(h, &t), DIASPORA_OK); ++ok_calls;
  t.deadline_s = -1;
  EXPECT_RC(diaspora_task_submitted(h, &t), DIASPORA_ERR_INVALID);
  t = task("t-1");
  EXPECT_RC(diaspora_task_started(h, &t), DIASPORA_OK); ++ok_calls;
  t.progress = 1.5;
  EXPECT_RC(diaspora_task_progress(h, &t), DIASPORA_ERR_INVALID);
  t.progress = NAN;
  EXPECT_RC(diaspora_task_progress(h, &t), DIASPORA_ERR_INVALID);
  t.progress = 0.5;
  t.step = -7;
  EXPECT_RC(diaspora_task_progress(h, &t), DIASPORA_ERR_INVALID);
  t.step = 3;
  diaspora_metric_value m[2] = {{"cpu", 0.5}, {"mem bytes", 1.0}};
  t.metrics = m;
  t.metric_count = 2;
  EXPECT_RC(diaspora_task_progress(h, &t), DIASPORA_ERR_INVALID); /* space in a metric name */
  m[1].name = "memory_bytes";
  m[1].value = INFINITY;
  EXPECT_RC(diaspora_task_heartbeat(h, &t), DIASPORA_ERR_INVALID);
  m[1].value = 1e9;
  m[1].name = NULL;
  EXPECT_RC(diaspora_task_heartbeat(h, &t), DIASPORA_ERR_NULL);
  m[1].name = "memory_bytes";
  t.metric_count = 65;
  EXPECT_RC(diaspora_task_heartbeat(h, &t), DIASPORA_ERR_INVALID);
  t.metrics = NULL;
  t.metric_count = 1;
  EXPECT_RC(diaspora_task_heartbeat(h, &t), DIASPORA_ERR_NULL);
  t.metrics = m;
  t.metric_count = 2;
  EXPECT_RC(diaspora_task_progress(h, &t), DIASPORA_OK); ++ok_calls;
  EXPECT_RC(diaspora_task_heartbeat(h, &t), DIASPORA_OK); ++ok_calls;
  t = task("t-1");
  EXPECT_RC(diaspora_task_failed(h, &t), DIASPORA_ERR_NULL); /* reason is required */
  t.reason = "";
  EXPECT_RC(diaspora_task_failed(h, &t), DIASPORA_ERR_INVALID);
  t.reason = "worker lost";
  t.retryable = 1;
  t.failure = 3; /* ABI 1.2: not a diaspora_failure_kind */
  EXPECT_RC(diaspora_task_failed(h, &t), DIASPORA_ERR_INVALID);
  t.failure = DIASPORA_FAILURE_LOST;
  EXPECT_RC(diaspora_task_failed(h, &t), DIASPORA_OK); ++ok_calls;
  t.failure = 3; /* a 1.1 caller's struct ends before failure: those bytes are not read */
  t.struct_size = offsetof(diaspora_task_info, failure);
  EXPECT_RC(diaspora_task_failed(h, &t), DIASPORA_OK); ++ok_calls;
  t = task("t-1");
  EXPECT_RC(diaspora_task_cancelled(h, &t), DIASPORA_OK); ++ok_calls; /* out of order: reported, not refused */
  {
    /* a caller compiled against a later minor version passes a larger struct */
    struct {
      diaspora_task_info v1;
      double future_field;
    } bigger;
    memset(&bigger, 0, sizeof bigger);
    bigger.v1.struct_size = sizeof bigger;
    bigger.v1.task_id = "t-2";
    EXPECT_RC(diaspora_task_submitted(h, &bigger.v1), DIASPORA_OK); ++ok_calls;
  }

  /* metrics */
  diaspora_metric mt;
  memset(&mt, 0, sizeof mt);
  mt.struct_size = sizeof mt;
  mt.scope = DIASPORA_SCOPE_SITE;
  mt.id = "edge";
  mt.name = "queue_length";
  mt.value = 3;
  EXPECT_RC(diaspora_metric_sample(NULL, &mt), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_metric_sample(h, NULL), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_metric_sample(h, &mt), DIASPORA_OK); ++ok_calls;
  mt.scope = 0;
  EXPECT_RC(diaspora_metric_sample(h, &mt), DIASPORA_ERR_INVALID);
  mt.scope = DIASPORA_SCOPE_TASK;
  mt.value = NAN;
  EXPECT_RC(diaspora_metric_sample(h, &mt), DIASPORA_ERR_INVALID);
  mt.value = 1;
  mt.name = "a/b";
  EXPECT_RC(diaspora_metric_sample(h, &mt), DIASPORA_ERR_INVALID);
  mt.name = NULL;
  EXPECT_RC(diaspora_metric_sample(h, &mt), DIASPORA_ERR_NULL);
  mt.name = "x";
  mt.id = NULL;
  EXPECT_RC(diaspora_metric_sample(h, &mt), DIASPORA_ERR_NULL);
  mt.id = long_id;
  EXPECT_RC(diaspora_metric_sample(h, &mt), DIASPORA_ERR_INVALID);
  mt.id = "t-1";
  mt.name = long_metric;
  EXPECT_RC(diaspora_metric_sample(h, &mt), DIASPORA_ERR_INVALID);
  mt.name = "x";
  mt.timestamp_us = -1;
  EXPECT_RC(diaspora_metric_sample(h, &mt), DIASPORA_ERR_INVALID);
  mt.timestamp_us = 0;
  mt.struct_size = 4;
  EXPECT_RC(diaspora_metric_sample(h, &mt), DIASPORA_ERR_INVALID);

  /* data */
  diaspora_data_info d;
  memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  d.stream = "detector";
  d.seq = 7;
  d.bytes = 4096;
  d.checksum = "crc32c:1a2b3c4d";
  EXPECT_RC(diaspora_data_arrived(NULL, &d), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_data_arrived(h, NULL), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_data_arrived(h, &d), DIASPORA_OK); ++ok_calls;
  d.checksum = "not a checksum";
  EXPECT_RC(diaspora_data_arrived(h, &d), DIASPORA_ERR_INVALID);
  d.checksum = NULL;
  d.seq = -1;
  EXPECT_RC(diaspora_data_arrived(h, &d), DIASPORA_ERR_INVALID);
  d.seq = 1;
  d.bytes = -2;
  EXPECT_RC(diaspora_data_arrived(h, &d), DIASPORA_ERR_INVALID);
  d.bytes = -1;
  d.uri = long_text;
  EXPECT_RC(diaspora_data_arrived(h, &d), DIASPORA_ERR_INVALID);
  d.uri = NULL;
  d.site = long_id;
  EXPECT_RC(diaspora_data_arrived(h, &d), DIASPORA_ERR_INVALID);
  d.site = NULL;
  d.timestamp_us = -3;
  EXPECT_RC(diaspora_data_arrived(h, &d), DIASPORA_ERR_INVALID);
  d.timestamp_us = 0;
  d.struct_size = 8;
  EXPECT_RC(diaspora_data_arrived(h, &d), DIASPORA_ERR_INVALID);
  d.struct_size = sizeof d;
  d.stream = NULL;
  EXPECT_RC(diaspora_data_arrived(h, &d), DIASPORA_ERR_NULL);

  /* resources */
  diaspora_resource_info r;
  memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  r.resource_id = "node-3";
  r.kind = "node";
  r.state = "degraded";
  EXPECT_RC(diaspora_resource_status(NULL, &r), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_resource_status(h, NULL), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_resource_status(h, &r), DIASPORA_OK); ++ok_calls;
  r.kind = "toaster";
  EXPECT_RC(diaspora_resource_status(h, &r), DIASPORA_ERR_INVALID);
  r.kind = "node";
  r.state = "sleepy";
  EXPECT_RC(diaspora_resource_status(h, &r), DIASPORA_ERR_INVALID);
  r.state = NULL;
  EXPECT_RC(diaspora_resource_status(h, &r), DIASPORA_ERR_NULL);
  r.state = "up";
  r.resource_id = NULL;
  EXPECT_RC(diaspora_resource_status(h, &r), DIASPORA_ERR_NULL);
  r.resource_id = long_id;
  EXPECT_RC(diaspora_resource_status(h, &r), DIASPORA_ERR_INVALID);
  r.resource_id = "node-3";
  r.kind = NULL;
  EXPECT_RC(diaspora_resource_status(h, &r), DIASPORA_ERR_NULL);
  r.kind = "gpu";
  r.metrics = NULL;
  r.metric_count = 2;
  EXPECT_RC(diaspora_resource_status(h, &r), DIASPORA_ERR_NULL);
  r.metric_count = 0;
  r.struct_size = 8;
  EXPECT_RC(diaspora_resource_status(h, &r), DIASPORA_ERR_INVALID);
  r.struct_size = sizeof r;
  EXPECT_RC(diaspora_resource_status(h, &r), DIASPORA_OK); ++ok_calls;

  /* data items (ABI 1.3): arguments checked before anything is sent; no relay listens on
   * port 1, so a valid put times out (and fast: timeout_ms) and a get too */
  diaspora_item_info it;
  memset(&it, 0, sizeof it);
  it.struct_size = sizeof it;
  it.bytes = "abc";
  it.size = 3;
  it.seq = -1;
  it.timeout_ms = 300;
  diaspora_item_ref ref;
  memset(&ref, 0, sizeof ref);
  ref.struct_size = sizeof ref;
  EXPECT_RC(diaspora_item_put(NULL, &it, &ref), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_item_put(h, NULL, &ref), DIASPORA_ERR_NULL);
  it.struct_size = 8;
  EXPECT_RC(diaspora_item_put(h, &it, &ref), DIASPORA_ERR_INVALID);
  it.struct_size = sizeof it;
  ref.struct_size = 4;
  EXPECT_RC(diaspora_item_put(h, &it, &ref), DIASPORA_ERR_INVALID);
  ref.struct_size = sizeof ref;
  it.bytes = NULL;
  EXPECT_RC(diaspora_item_put(h, &it, &ref), DIASPORA_ERR_NULL);
  it.bytes = "abc";
  it.topic = long_id;
  EXPECT_RC(diaspora_item_put(h, &it, &ref), DIASPORA_ERR_INVALID);
  it.topic = NULL;
  it.seq = -2;
  EXPECT_RC(diaspora_item_put(h, &it, &ref), DIASPORA_ERR_INVALID);
  it.seq = 4;
  it.deadline = "soon";
  EXPECT_RC(diaspora_item_put(h, &it, &ref), DIASPORA_ERR_INVALID);
  it.deadline = "2030-01-01T00:00:00Z";
  EXPECT_RC(diaspora_item_put(h, &it, NULL), DIASPORA_ERR_TIMEOUT);
  void* bytes = NULL;
  size_t size = 0;
  char* event_json = NULL;
  EXPECT_RC(diaspora_item_get(h, NULL, 0, 300, NULL, &size, &event_json), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_item_get(h, long_id, 0, 300, &bytes, &size, &event_json), DIASPORA_ERR_INVALID);
  EXPECT_RC(diaspora_item_get(h, NULL, 0, 300, &bytes, &size, &event_json), DIASPORA_ERR_TIMEOUT);
  EXPECT(bytes == NULL && event_json == NULL);  /* nothing allocated on an error */
  diaspora_item_free(NULL);

  /* actions */
  diaspora_action a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  EXPECT_RC(diaspora_set_action_callback(NULL, NULL, NULL), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_set_action_callback(h, NULL, NULL), DIASPORA_OK);
  EXPECT_RC(diaspora_poll_action(NULL, &a), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_poll_action(h, NULL), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_poll_action(h, &a), DIASPORA_ERR_EMPTY);
  a.struct_size = 0;
  EXPECT_RC(diaspora_poll_action(h, &a), DIASPORA_ERR_INVALID);
  EXPECT_RC(diaspora_action_done(NULL, "a-1", NULL), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_action_done(h, NULL, NULL), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_action_done(h, "a-1", NULL), DIASPORA_ERR_NOT_FOUND);
  EXPECT_RC(diaspora_action_failed(h, "a-1", NULL), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_action_failed(h, "a-1", "could not"), DIASPORA_ERR_NOT_FOUND);
  EXPECT_RC(diaspora_action_failed(NULL, "a-1", "could not"), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_action_failed(h, NULL, "could not"), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_action_done(h, "", NULL), DIASPORA_ERR_INVALID);
  EXPECT_RC(diaspora_action_failed(h, "", "could not"), DIASPORA_ERR_INVALID);
  EXPECT_RC(diaspora_action_failed(h, "a-1", ""), DIASPORA_ERR_INVALID); /* a reason is required */
  EXPECT_RC(diaspora_action_done(h, long_id, NULL), DIASPORA_ERR_INVALID);
  EXPECT_RC(diaspora_action_done(h, "a-1", long_text), DIASPORA_ERR_INVALID);
  EXPECT_RC(diaspora_action_failed(h, "a-1", long_text), DIASPORA_ERR_INVALID);

  /* last error and stats */
  EXPECT(diaspora_last_error(NULL, err, sizeof err) == 0);
  size_t n = diaspora_last_error(h, NULL, 0);
  EXPECT(n > 0);
  char small[8];
  EXPECT(diaspora_last_error(h, small, sizeof small) == n && strlen(small) == 7);
  diaspora_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  EXPECT_RC(diaspora_get_stats(NULL, &st), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_get_stats(h, NULL), DIASPORA_ERR_NULL);
  st.struct_size = 3;
  EXPECT_RC(diaspora_get_stats(h, &st), DIASPORA_ERR_INVALID);
  st.struct_size = sizeof st;
  EXPECT_RC(diaspora_get_stats(h, &st), DIASPORA_OK);
  EXPECT(st.events_accepted == ok_calls);
  EXPECT(st.connected == 0);

  /* close: the relay is unreachable, so everything ends in the spool */
  EXPECT_RC(diaspora_close(NULL, 0), DIASPORA_ERR_NULL);
  EXPECT_RC(diaspora_close(h, -1), DIASPORA_ERR_INVALID);
  EXPECT_RC(diaspora_close(h, 100), DIASPORA_ERR_TIMEOUT);

  /* reopening finds them there, to be replayed */
  EXPECT_RC(diaspora_open_yaml(spec, &h, err, sizeof err), DIASPORA_OK);
  if (h) {
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    EXPECT_RC(diaspora_get_stats(h, &st), DIASPORA_OK);
    /* the ok_calls events, the invalid-transition warning, and a stats event */
    EXPECT(st.spool_records >= ok_calls);
    EXPECT_RC(diaspora_close(h, 0), DIASPORA_ERR_TIMEOUT);
  }

  printf("%d checks, %d failures\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
