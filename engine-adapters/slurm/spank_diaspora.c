/*
 * spank_diaspora.so -- Diaspora inside Slurm (SPANK, slurm 22.05's spank.h).
 *
 * Adds `--diaspora=SPEC` to srun, sbatch and salloc. For a job step run with it, slurmstepd
 * (the remote context) opens the engine plugin (libdiaspora_plugin.so, loaded with dlopen
 * through its public C ABI) from SPEC and reports each task of the step:
 *   submitted + started   when the task is forked (task id "slurm-JOB.STEP.RANK", worker =
 *                         this node, attempt = SLURM_RESTART_COUNT + 1)
 *   completed / failed    when it exits: the exit status, or "killed by signal N (SIGX)"
 *                         (scancel, the time limit, the OOM killer, ...)
 * and carries out the plugin's `restart` actions as a requeue of the job (`scontrol requeue
 * JOB`, batch jobs only); other actions are refused with the reason.
 *
 * plugstack.conf:  optional /path/spank_diaspora.so [library=/path/libdiaspora_plugin.so]
 *                                                   [close_timeout_ms=5000] [site=NAME]
 * Without library=, libdiaspora_plugin.so.1 beside this file, then the linker's path.
 *
 * The spec must name its relay (relay.url: wss://..., absolute ca_file and token_file):
 * slurmstepd does not see the job's environment. A reporting failure never fails the job
 * (errors are logged with slurm_error and the task runs on).
 *
 * Threads: SPANK callbacks run on slurmstepd's main thread, one at a time; the plugin's
 * action callback runs on its control thread and only forks `scontrol`.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <slurm/spank.h>

#include "diaspora/plugin.h"
#include "diaspora/wait_failure.h"

SPANK_PLUGIN(diaspora, 1)

static char spec_path[4096];
static char library_path[4096];
static char site_name[DIASPORA_MAX_ID + 1];
static long close_timeout_ms = 5000;

static void* dl;
static diaspora_plugin* handle;
static uint32_t job_id, step_id;
static int attempt = 1;
static char node[256];

/* The ABI functions used, resolved with dlsym. */
static int (*p_open_file)(const char*, diaspora_plugin**, char*, size_t);
static int (*p_close)(diaspora_plugin*, int64_t);
static int (*p_abi_check)(uint32_t, char*, size_t);
static int (*p_submitted)(diaspora_plugin*, const diaspora_task_info*);
static int (*p_started)(diaspora_plugin*, const diaspora_task_info*);
static int (*p_completed)(diaspora_plugin*, const diaspora_task_info*);
static int (*p_failed)(diaspora_plugin*, const diaspora_task_info*);
static int (*p_set_cb)(diaspora_plugin*, diaspora_action_callback, void*);
static int (*p_done)(diaspora_plugin*, const char*, const char*);
static int (*p_action_failed)(diaspora_plugin*, const char*, const char*);
static size_t (*p_last_error)(const diaspora_plugin*, char*, size_t);

static int opt_diaspora(int val, const char* optarg, int remote) {
  (void)val;
  (void)remote;
  if (optarg == NULL || optarg[0] == '\0' || strlen(optarg) >= sizeof spec_path) {
    slurm_error("diaspora: --diaspora needs the path of a workflow spec");
    return -1;
  }
  snprintf(spec_path, sizeof spec_path, "%s", optarg);
  return 0;
}

struct spank_option spank_options[] = {
    {"diaspora", "SPEC", "Report this job's tasks through Diaspora, with the workflow spec SPEC (a path on the nodes)",
     1, 0, (spank_opt_cb_f)opt_diaspora},
    SPANK_OPTIONS_TABLE_END};

static void parse_args(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    if (strncmp(argv[i], "library=", 8) == 0) snprintf(library_path, sizeof library_path, "%s", argv[i] + 8);
    else if (strncmp(argv[i], "site=", 5) == 0) snprintf(site_name, sizeof site_name, "%s", argv[i] + 5);
    else if (strncmp(argv[i], "close_timeout_ms=", 17) == 0) close_timeout_ms = strtol(argv[i] + 17, NULL, 10);
    else slurm_error("diaspora: unknown plugstack.conf argument '%s' (library=, site=, close_timeout_ms=)", argv[i]);
  }
}

/* Every context: read plugstack.conf's arguments. Slurm registers spank_options[] itself
 * for srun and slurmstepd; sbatch and salloc (the allocator context) need the call. */
int slurm_spank_init(spank_t sp, int argc, char** argv) {
  parse_args(argc, argv);
  if (spank_context() == S_CTX_ALLOCATOR)
    return spank_option_register(sp, &spank_options[0]) == ESPANK_SUCCESS ? 0 : -1;
  return 0;
}

#define RESOLVE(ptr, name)                                        \
  do {                                                            \
    *(void**)(&(ptr)) = dlsym(dl, name);                          \
    if ((ptr) == NULL) {                                          \
      slurm_error("diaspora: %s lacks %s", where, name);          \
      return -1;                                                  \
    }                                                             \
  } while (0)

static int load_library(void) {
  char beside[4096] = "";
  Dl_info self;
  if (dladdr((void*)spec_path, &self) && self.dli_fname) {
    snprintf(beside, sizeof beside, "%s", self.dli_fname);
    char* slash = strrchr(beside, '/');
    if (slash) snprintf(slash + 1, sizeof beside - (size_t)(slash + 1 - beside), "libdiaspora_plugin.so.1");
  }
  const char* tries[3] = {library_path[0] ? library_path : NULL, beside[0] ? beside : NULL, "libdiaspora_plugin.so.1"};
  const char* where = NULL;
  for (int i = 0; i < 3 && dl == NULL; ++i) {
    if (tries[i] == NULL) continue;
    dl = dlopen(tries[i], RTLD_NOW | RTLD_LOCAL);
    where = tries[i];
    if (dl == NULL && (i == 0 || i == 2)) slurm_error("diaspora: cannot load %s: %s", tries[i], dlerror());
    if (i == 0 && dl == NULL) return -1; /* an explicit library= must load */
  }
  if (dl == NULL) return -1;
  RESOLVE(p_abi_check, "diaspora_abi_check");
  RESOLVE(p_open_file, "diaspora_open_file");
  RESOLVE(p_close, "diaspora_close");
  RESOLVE(p_submitted, "diaspora_task_submitted");
  RESOLVE(p_started, "diaspora_task_started");
  RESOLVE(p_completed, "diaspora_task_completed");
  RESOLVE(p_failed, "diaspora_task_failed");
  RESOLVE(p_set_cb, "diaspora_set_action_callback");
  RESOLVE(p_done, "diaspora_action_done");
  RESOLVE(p_action_failed, "diaspora_action_failed");
  RESOLVE(p_last_error, "diaspora_last_error");
  char why[512] = "";
  if (p_abi_check(DIASPORA_ABI_VERSION, why, sizeof why) != DIASPORA_OK) {
    slurm_error("diaspora: %s: %s", where, why);
    return -1;
  }
  return 0;
}

/* The plugin's control thread: `restart` requeues the job with scontrol (batch jobs). */
static void on_action(const diaspora_action* a, void* user) {
  (void)user;
  if (a->kind != DIASPORA_ACTION_RESTART) {
    char msg[256];
    snprintf(msg, sizeof msg, "the Slurm plugin cannot %s a task; it requeues jobs on restart", a->kind_name);
    p_action_failed(handle, a->id, msg);
    return;
  }
  char job[32];
  snprintf(job, sizeof job, "%u", job_id);
  /* slurmstepd reaps its children itself, so the exit status of `scontrol requeue` comes
   * back through a pipe from an intermediate process that waits for it. */
  int fds[2];
  int status = -1;
  if (pipe(fds) == 0) {
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      const pid_t c = fork();
      if (c == 0) {
        execlp("scontrol", "scontrol", "requeue", job, (char*)NULL);
        _exit(127);
      }
      int st = 0;
      const int code = (c > 0 && waitpid(c, &st, 0) == c && WIFEXITED(st)) ? WEXITSTATUS(st) : 255;
      const unsigned char b = (unsigned char)code;
      (void)!write(fds[1], &b, 1);
      _exit(0);
    }
    close(fds[1]);
    unsigned char b = 255;
    if (pid > 0 && read(fds[0], &b, 1) == 1) status = b;
    close(fds[0]);
  }
  if (status != 0) {
    char msg[160];
    snprintf(msg, sizeof msg, "scontrol requeue %s failed (status %d): only batch jobs can be requeued", job, status);
    p_action_failed(handle, a->id, msg);
    return;
  }
  char msg[64];
  snprintf(msg, sizeof msg, "job %s requeued", job);
  p_done(handle, a->id, msg);
}

/* slurmstepd, once per step, before the tasks: open the handle. */
int slurm_spank_user_init(spank_t sp, int argc, char** argv) {
  (void)argc;
  (void)argv;
  if (spank_remote(sp) != 1 || spec_path[0] == '\0') return 0;
  if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS) return 0;
  if (spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS) step_id = 0;
  uint32_t restarts = 0;
  char count[32] = "";
  if (spank_get_item(sp, S_SLURM_RESTART_COUNT, &restarts) == ESPANK_SUCCESS && restarts > 0)
    attempt = (int)restarts + 1;
  else if (spank_getenv(sp, "SLURM_RESTART_COUNT", count, sizeof count) == ESPANK_SUCCESS)
    attempt = atoi(count) + 1; /* the job's environment (a requeued batch job's steps) */
  gethostname(node, sizeof node - 1);
  if (load_library() != 0) return 0; /* never fail the job for reporting */
  /* One engine per step: its own spool and control topic (<prefix>.control.slurm-JOB.STEP). */
  char engine[64];
  if (step_id == 0xfffffffbu) snprintf(engine, sizeof engine, "slurm-%u.batch", job_id);
  else snprintf(engine, sizeof engine, "slurm-%u.%u", job_id, step_id);
  setenv("DIASPORA_ENGINE_ID", engine, 1);
  char err[4096] = "";
  if (p_open_file(spec_path, &handle, err, sizeof err) != DIASPORA_OK) {
    slurm_error("diaspora: %s", err);
    handle = NULL;
    return 0;
  }
  p_set_cb(handle, on_action, NULL);
  return 0;
}

static void task_info(spank_t sp, diaspora_task_info* i, char* id, size_t id_len) {
  uint32_t rank = 0;
  spank_get_item(sp, S_TASK_GLOBAL_ID, &rank);
  if (step_id == 0xfffffffbu) /* SLURM_BATCH_SCRIPT */
    snprintf(id, id_len, "slurm-%u.batch", job_id);
  else
    snprintf(id, id_len, "slurm-%u.%u.%u", job_id, step_id, rank);
  memset(i, 0, sizeof *i);
  i->struct_size = sizeof *i;
  i->task_id = id;
  i->site = site_name[0] ? site_name : NULL;
  i->worker = node;
  i->attempt = attempt;
  i->step = -1;
}

static void report(int (*hook)(diaspora_plugin*, const diaspora_task_info*), const diaspora_task_info* i,
                   const char* what) {
  if (hook(handle, i) != DIASPORA_OK) {
    char buf[512] = "";
    p_last_error(handle, buf, sizeof buf);
    slurm_error("diaspora: %s of %s not reported: %s", what, i->task_id, buf);
  }
}

int slurm_spank_task_post_fork(spank_t sp, int argc, char** argv) {
  (void)argc;
  (void)argv;
  if (handle == NULL) return 0;
  char id[DIASPORA_MAX_ID + 1];
  diaspora_task_info i;
  task_info(sp, &i, id, sizeof id);
  char name[64];
  snprintf(name, sizeof name, "slurm-job-%u", job_id);
  i.name = name;
  report(p_submitted, &i, "submitted");
  i.name = NULL;
  report(p_started, &i, "started");
  return 0;
}

int slurm_spank_task_exit(spank_t sp, int argc, char** argv) {
  (void)argc;
  (void)argv;
  if (handle == NULL) return 0;
  int status = 0;
  if (spank_get_item(sp, S_TASK_EXIT_STATUS, &status) != ESPANK_SUCCESS) return 0;
  char id[DIASPORA_MAX_ID + 1];
  diaspora_task_info i;
  task_info(sp, &i, id, sizeof id);
  char reason[128];
  i.has_exit_code = 1;
  if (WIFEXITED(status)) {
    i.exit_code = WEXITSTATUS(status);
    if (i.exit_code == 0) {
      report(p_completed, &i, "completed");
      return 0;
    }
    snprintf(reason, sizeof reason, "exit status %d", i.exit_code);
  } else if (WIFSIGNALED(status)) {
    const int s = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(s);
    i.exit_code = 128 + s;
    snprintf(reason, sizeof reason, "killed by signal %d (SIG%s)%s", s, abbrev ? abbrev : "?",
             s == SIGTERM || s == SIGKILL ? ": cancelled (scancel), over its time limit, or killed" : "");
  } else {
    i.exit_code = 255;
    snprintf(reason, sizeof reason, "wait status %d", status);
  }
  i.reason = reason;
  i.failure = diaspora_failure_of_wait_status(status); /* a node or the OOM killer's SIGKILL: lost */
  report(p_failed, &i, "failed");
  return 0;
}

/* slurmstepd, at the end of the step: flush (at most close_timeout_ms; the rest stays in
 * the spool for the next step on this node) and unload. */
int slurm_spank_exit(spank_t sp, int argc, char** argv) {
  (void)argc;
  (void)argv;
  if (spank_remote(sp) != 1 || handle == NULL) return 0;
  p_set_cb(handle, NULL, NULL);
  const int rc = p_close(handle, close_timeout_ms);
  if (rc != DIASPORA_OK) slurm_info("diaspora: closing: status %d (events not acked stay in the spool)", rc);
  handle = NULL;
  return 0;
}
