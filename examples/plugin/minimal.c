/*
 * minimal.c -- the smallest engine that uses the Diaspora plugin.
 *
 * It loads libdiaspora_plugin.so at run time with dlopen (as a workflow engine would),
 * refuses a library of another ABI major version, opens a handle from a workflow spec,
 * reports the lifecycle of a few tasks, carries out the actions it receives (here: it
 * only prints them and acknowledges them), and closes with a flush timeout.
 *
 *   cc -std=c11 -I plugin/include examples/plugin/minimal.c -ldl -o minimal
 *   ./minimal build/lib/libdiaspora_plugin.so my-workflow.yaml [TASKS] [WAIT_ACTIONS_S]
 *
 * Exit status: 0 when every event was acknowledged by the relay, 1 on a usage or open
 * error, 2 when events were left in the spool at close (they are replayed next time).
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "diaspora/plugin.h"

/* The functions this engine uses, resolved with dlsym. */
static struct {
  uint32_t (*abi_version)(void);
  int (*abi_check)(uint32_t, char*, size_t);
  int (*open_file)(const char*, diaspora_plugin**, char*, size_t);
  int (*close)(diaspora_plugin*, int64_t);
  size_t (*last_error)(const diaspora_plugin*, char*, size_t);
  int (*submitted)(diaspora_plugin*, const diaspora_task_info*);
  int (*started)(diaspora_plugin*, const diaspora_task_info*);
  int (*progress)(diaspora_plugin*, const diaspora_task_info*);
  int (*completed)(diaspora_plugin*, const diaspora_task_info*);
  int (*poll_action)(diaspora_plugin*, diaspora_action*);
  int (*action_done)(diaspora_plugin*, const char*, const char*);
  int (*get_stats)(const diaspora_plugin*, diaspora_stats*);
  const char* (*status_name)(int);
} api;

static int load(void* lib) {
#define LOAD(field, symbol)                                              \
  *(void**)(&api.field) = dlsym(lib, symbol);                            \
  if (!api.field) {                                                      \
    fprintf(stderr, "minimal: %s is missing from the library\n", symbol); \
    return -1;                                                           \
  }
  LOAD(abi_version, "diaspora_abi_version");
  LOAD(abi_check, "diaspora_abi_check");
  LOAD(open_file, "diaspora_open_file");
  LOAD(close, "diaspora_close");
  LOAD(last_error, "diaspora_last_error");
  LOAD(submitted, "diaspora_task_submitted");
  LOAD(started, "diaspora_task_started");
  LOAD(progress, "diaspora_task_progress");
  LOAD(completed, "diaspora_task_completed");
  LOAD(poll_action, "diaspora_poll_action");
  LOAD(action_done, "diaspora_action_done");
  LOAD(get_stats, "diaspora_get_stats");
  LOAD(status_name, "diaspora_status_name");
#undef LOAD
  return 0;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Carries out waiting actions. A real engine would restart, migrate or cancel here. */
static int handle_actions(diaspora_plugin* h) {
  int handled = 0;
  diaspora_action a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  while (api.poll_action(h, &a) == DIASPORA_OK) {
    printf("action %s: %s task '%s'%s%s because %s\n", a.id, a.kind_name, a.task_id,
           a.target_site[0] ? " to " : "", a.target_site, a.reason);
    api.action_done(h, a.id, "handled by the minimal example");
    ++handled;
  }
  return handled;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s LIBDIASPORA_PLUGIN_SO SPEC.yaml [TASKS] [WAIT_ACTIONS_S]\n", argv[0]);
    return 1;
  }
  const int tasks = argc > 3 ? atoi(argv[3]) : 3;
  const int wait_actions_s = argc > 4 ? atoi(argv[4]) : 0;

  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "minimal: cannot load the plugin: %s\n", dlerror());
    return 1;
  }
  if (load(lib) != 0) return 1;
  char err[4096] = "";
  if (!DIASPORA_ABI_COMPATIBLE(api.abi_version())) {
    fprintf(stderr, "minimal: the plugin's ABI %u.%u does not serve this engine (built for %u.%u)\n",
            (unsigned)(api.abi_version() >> 16), (unsigned)(api.abi_version() & 0xffff),
            (unsigned)DIASPORA_ABI_VERSION_MAJOR, (unsigned)DIASPORA_ABI_VERSION_MINOR);
    return 1;
  }
  if (api.abi_check(DIASPORA_ABI_VERSION, err, sizeof err) != DIASPORA_OK) {
    fprintf(stderr, "minimal: %s\n", err);
    return 1;
  }

  diaspora_plugin* h = NULL;
  int rc = api.open_file(argv[2], &h, err, sizeof err);
  if (rc != DIASPORA_OK) {
    fprintf(stderr, "minimal: cannot open the plugin (%s):\n%s\n", api.status_name(rc), err);
    return 1;
  }

  int handled = 0;
  for (int t = 0; t < tasks && rc == DIASPORA_OK; ++t) {
    char id[32];
    snprintf(id, sizeof id, "task-%d", t);
    diaspora_task_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    info.task_id = id;
    info.site = "local";
    info.attempt = 1;
    info.step = -1;
    rc = api.submitted(h, &info);
    info.worker = "worker-0";
    if (rc == DIASPORA_OK) rc = api.started(h, &info);
    for (int step = 1; step <= 4 && rc == DIASPORA_OK; ++step) {
      diaspora_metric_value m[1] = {{"step_time_s", 0.01 * step}};
      info.progress = step / 4.0;
      info.step = step;
      info.metrics = m;
      info.metric_count = 1;
      rc = api.progress(h, &info);
    }
    info.metrics = NULL;
    info.metric_count = 0;
    info.has_exit_code = 1;
    info.exit_code = 0;
    if (rc == DIASPORA_OK) rc = api.completed(h, &info);
    handled += handle_actions(h);
  }
  if (rc != DIASPORA_OK) {
    api.last_error(h, err, sizeof err);
    fprintf(stderr, "minimal: a hook failed (%s): %s\n", api.status_name(rc), err);
  }
  for (int i = 0; i < wait_actions_s * 10; ++i) {  /* optionally wait for operator actions */
    handled += handle_actions(h);
    sleep_ms(100);
  }
  handled += handle_actions(h);

  diaspora_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  api.get_stats(h, &st);
  rc = api.close(h, 10000);
  printf("reported %d tasks (%llu events accepted), handled %d actions, close: %s\n", tasks,
         (unsigned long long)st.events_accepted, handled, api.status_name(rc));
  dlclose(lib);
  return rc == DIASPORA_OK ? 0 : 2;
}
