"""diaspora.parsl.DiasporaExecutor inside a real Parsl DataFlowKernel whose sites are real
HighThroughputExecutors (LocalProvider, loopback only, usage tracking off), with a real
relay and the plugin's default protection (no policy in the spec): a killed worker, a
stopped (SIGSTOP) manager, a hung (SIGSTOP) attempt, a migrate between the two executors,
a speculative copy, an app that raises (not retried) and bad configuration."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from relay_harness import REPO, relay_events, wait_until, write_spec  # noqa: E402

sys.path.insert(0, str(REPO / "engine-adapters" / "python"))
import adapter_tasks as at  # noqa: E402

import parsl  # noqa: E402  (requirements.lock, installed into .venv by scripts/install-deps.sh)
from parsl.config import Config  # noqa: E402
from parsl.executors import HighThroughputExecutor  # noqa: E402
from parsl.providers import LocalProvider  # noqa: E402

from diaspora.parsl import ConfigError, DiasporaExecutor, retry_handler  # noqa: E402
from diaspora.channel import Sender  # noqa: E402
from diaspora.futures import NEW, RECOVER, REPLACED  # noqa: E402

# The HTEX interchange and worker pool are scripts of this Python's environment (PATH); the
# worker pools (LocalProvider: a child of this process) import the test tasks (PYTHONPATH).
os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), str(REPO / "engine-adapters" / "python")])

SITES = [{"name": "a", "engine": "local", "workers": 2}, {"name": "b", "engine": "local", "workers": 2}]


def htex(label: str, workers: int = 2, worker_init: str = "", **options) -> HighThroughputExecutor:
    # heartbeat_period 2 s: the inner HTEX's own loss detection is not what is tested here
    # (Diaspora's is); its pool's stdout/stderr go to the run directory.
    return HighThroughputExecutor(label=label, address="127.0.0.1", max_workers_per_node=workers,
                                  cores_per_worker=0.1, heartbeat_period=2, heartbeat_threshold=120,
                                  provider=LocalProvider(init_blocks=1, min_blocks=1, max_blocks=1,
                                                         worker_init=worker_init), **options)


@contextlib.contextmanager
def loaded(relay, token, tmp_path, policies=None, worker_init="", htex_options=None, **options):
    """A loaded Parsl config with a DiasporaExecutor over sites a and b, whose spec has
    `policies` (none: the default protection only); yields (dfk, executor); cleans up."""
    extra = {"policies": policies} if policies else None
    spec = write_spec(tmp_path, relay.creds, token[1], relay.port, name="parsl", sites=SITES, extra=extra)
    inner = [htex(x, worker_init=worker_init, **(htex_options or {})) for x in ("a", "b")]
    ex = DiasporaExecutor(sites=inner, spec=spec, heartbeat_s=0.5, failure_grace=15, **options)
    d = parsl.load(Config(executors=[ex], run_dir=str(tmp_path / "runinfo"), usage_tracking=0,
                          strategy="none", initialize_logging=False))
    try:
        wait_until(lambda: all(len(s.inner.connected_managers()) >= 1 for s in ex.resilient._sites.values()),
                   60, "both HTEX managers to connect")
        (tmp_path / "marks").mkdir()
        yield d, ex
    finally:
        d.cleanup()
        parsl.clear()


@pytest.fixture
def dfk(relay, token, tmp_path):
    with loaded(relay, token, tmp_path) as x:
        yield x


step_app = parsl.python_app(at.stepper, executors=["diaspora"])
explode_app = parsl.python_app(at.explode, executors=["diaspora"])


def task_of(ex: DiasporaExecutor, fut) -> str:
    """The Diaspora task id of an AppFuture (the app's name and Parsl's task id)."""
    return f"stepper-{fut.tid}"


def lifecycle(events: list[dict], task_id: str) -> list[tuple]:
    return [(e["type"].rsplit(".", 1)[1], e["data"].get("site"), e["data"].get("attempt")) for e in events
            if e["type"].startswith("org.diaspora.task.") and e["data"]["task_id"] == task_id
            and not e["type"].endswith("heartbeat")]


def first_marker(marks: Path, tid: str, attempt: int = 1, step: int = 0) -> dict:
    return wait_until(lambda: at.reached(marks, f"{tid}.{attempt}", step), 60, f"attempt {attempt} of {tid} to run")


def manager_of(ex: DiasporaExecutor, tid: str) -> int:
    """The pid of the manager of tid's first attempt, once known (its "started" report, which
    names it, is a datagram handled on another thread: maybe after the first step's marker)."""
    return wait_until(lambda: ex.resilient._tasks[tid].attempts[0].ppid, 10, "the attempt's manager to be known")


def wait_gone(pid: int, what: str) -> None:
    """Waits (10 s) until process `pid` has exited (gone, or a zombie)."""
    from diaspora.futures import _GONE, _proc_state

    wait_until(lambda: _proc_state(pid) in _GONE, 10, what)


def test_a_killed_worker_is_restarted_at_once_by_the_default_protection(dfk, relay, token, tmp_path):
    d, ex = dfk
    marks = tmp_path / "marks"
    fut = step_app(40, 0.05, 21, str(marks), parsl_resource_specification={"diaspora": {"site": "a"}})
    tid = task_of(ex, fut)
    m = first_marker(marks, tid)
    t0 = time.monotonic()
    os.kill(m["pid"], signal.SIGKILL)
    second = wait_until(lambda: at.reached(marks, f"{tid}.2"), 30, "the restarted attempt to run")
    reaction = time.monotonic() - t0
    print(f"killed worker: the restarted attempt ran {reaction:.2f} s after the kill")
    assert fut.result(timeout=60) == 42
    assert second["pid"] != m["pid"]
    assert reaction < 10, f"the restarted attempt ran {reaction:.1f} s after the kill"
    t = ex.resilient._tasks[tid]
    assert [x.state for x in t.attempts] == ["failed", "done"]
    assert ex.plugin.wait_acked(30)
    events = relay_events(relay, token[0], 1, topic="parsl.events",
                          counted=lambda e: e["type"] == "org.diaspora.task.completed" and e["data"]["task_id"] == tid)
    life = lifecycle(events, tid)
    assert life[:3] == [("submitted", "a", 1), ("started", "a", 1), ("failed", "a", 1)], life
    assert life[-1][0] == "completed" and life[-1][2] == 2, life
    failed = next(e for e in events if e["type"] == "org.diaspora.task.failed" and e["data"]["task_id"] == tid)
    assert failed["data"].get("failure") == "lost", failed["data"]
    # seen by Diaspora's own watch of the worker process, not by HTEX's WorkerLost
    assert "its worker process" in failed["data"]["reason"], failed["data"]


def test_an_app_that_raises_is_not_retried_and_parsl_sees_its_exception(dfk):
    d, ex = dfk
    fut = explode_app("bad frame")
    with pytest.raises(ValueError, match="bad frame"):
        fut.result(timeout=60)
    t = ex.resilient._tasks[f"explode-{fut.tid}"]
    assert len(t.attempts) == 1 and t.attempts[0].state == "failed"
    # a site the executor does not have: the app fails with the reason, nothing is submitted
    bad = step_app(1, 0.01, 1, parsl_resource_specification={"diaspora": {"site": "zz"}})
    with pytest.raises(ConfigError, match="unknown site 'zz'; the sites are a, b"):
        bad.result(timeout=30)


def test_the_retry_handler_keeps_parsl_from_retrying_what_diaspora_owned():
    from parsl.executors.high_throughput.errors import WorkerLost

    assert retry_handler(WorkerLost(1, "h"), {}) == float("inf")
    assert retry_handler(ValueError("x"), {}) == 1.0


def test_a_plugin_library_that_is_not_there_stops_parsl_load_with_each_path_tried(relay, token, tmp_path):
    from diaspora import LibraryError

    spec = write_spec(tmp_path, relay.creds, token[1], relay.port, name="parsl", sites=SITES,
                      library=str(tmp_path / "nowhere" / "libdiaspora_plugin.so"))
    ex = DiasporaExecutor(sites=[htex("a"), htex("b")], spec=spec)
    with pytest.raises(LibraryError, match="nowhere/libdiaspora_plugin.so"):
        parsl.load(Config(executors=[ex], run_dir=str(tmp_path / "runinfo"), usage_tracking=0, strategy="none",
                          initialize_logging=False))
    parsl.clear()
    assert ex.resilient is None and not ex._started  # no HTEX was started


def test_bad_configuration_gets_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="distinct labels"):
        DiasporaExecutor(sites=[htex("a"), htex("a")], spec="x")
    with pytest.raises(ConfigError, match="not a Parsl executor"):
        DiasporaExecutor(sites={"a": object()}, spec="x")
    with pytest.raises(ConfigError, match="at least one site"):
        DiasporaExecutor(sites=[], spec="x")


def test_a_stopped_manager_loses_its_attempts_at_once_and_its_queue_and_site_until_it_runs_again(dfk, relay, token, tmp_path):
    d, ex = dfk
    marks = tmp_path / "marks"
    fut = step_app(60, 0.05, 5, str(marks), parsl_resource_specification={"diaspora": {"site": "a"}})
    tid = task_of(ex, fut)
    first_marker(marks, tid)
    # a second task keeps a's other worker busy, a third waits in a's queue
    others = [step_app(60, 0.05, k, str(marks), parsl_resource_specification={"diaspora": {"site": "a"}})
              for k in (6, 7)]
    first_marker(marks, task_of(ex, others[0]))
    manager = manager_of(ex, tid)
    assert manager != os.getpid()
    t0 = time.monotonic()
    os.kill(manager, signal.SIGSTOP)
    try:
        wait_until(lambda: at.reached(marks, f"{tid}.2"), 30, "the restarted attempt to run")
        reaction = time.monotonic() - t0
        print(f"stopped manager: the restarted attempt ran {reaction:.2f} s after the SIGSTOP")
        assert "a" in ex.resilient._down and "stopped" in ex.resilient._down["a"]
        assert fut.result(timeout=60) == 10
        t = ex.resilient._tasks[tid]
        assert [(x.site, x.state) for x in t.attempts] == [("a", "failed"), ("b", "done")]
        assert [x.turn for x in t.attempts] == [NEW, RECOVER]  # the restart goes first in b's queue
        assert reaction < 10, f"the restarted attempt ran {reaction:.1f} s after the manager stopped"
        assert [f.result(timeout=60) for f in others] == [12, 14]
        queued = ex.resilient._tasks[task_of(ex, others[1])]  # it never ran on a: placed again on b
        assert [(x.site, x.state) for x in queued.attempts] == [("a", "stopped"), ("b", "done")]
        assert [x.turn for x in queued.attempts] == [NEW, REPLACED]  # after restarts, before new work
    finally:
        os.kill(manager, signal.SIGCONT)
    wait_until(lambda: "a" not in ex.resilient._down, 10, "site a to be usable again")
    assert step_app(1, 0.01, 1, parsl_resource_specification={"diaspora": {"site": "a"}}).result(timeout=60) == 2


def test_a_killed_manager_takes_its_site_out_of_use_until_parsl_starts_a_new_block(relay, token, tmp_path):
    # block_error_handler=False: with Parsl's default, the one block's failure puts the HTEX
    # in a bad state for good (Parsl fails its tasks; Diaspora keeps the site out of use).
    marks = tmp_path / "marks"
    with loaded(relay, token, tmp_path, htex_options={"block_error_handler": False}, strategy_period=1) as (d, ex):
        fut = step_app(60, 0.05, 3, str(marks), parsl_resource_specification={"diaspora": {"site": "a"}})
        tid = task_of(ex, fut)
        first_marker(marks, tid)
        manager = manager_of(ex, tid)
        before = ex.resilient._sites["a"].managers()
        assert len(before) == 1
        block = os.getpgid(manager)  # the block's process group (LocalProvider's setpgrp)
        os.kill(manager, signal.SIGKILL)
        wait_until(lambda: at.reached(marks, f"{tid}.2"), 30, "the restarted attempt to run")
        assert "exited" in ex.resilient._down.get("a", ""), ex.resilient._down
        assert fut.result(timeout=60) == 6
        # Lost on a, restarted on b. Site a comes back while b's attempt runs: on a loaded
        # machine the default protection may move it again (default-slow: its steps 2x their
        # normal), so b's attempt is the last or was stopped for a move, and the task ended done.
        tried = [(x.site, x.state) for x in ex.resilient._tasks[tid].attempts]
        assert tried[:1] == [("a", "failed")] and tried[1][0] == "b" and tried[-1][1] == "done", tried
        assert all(state == "stopped" for _, state in tried[1:-1]), tried
        if len(tried) > 2:  # each move after the restart was the default protection's
            assert ex.plugin.wait_acked(30)
            def is_move(e: dict) -> bool:
                return e["type"] == "org.diaspora.action.requested" and e["data"].get("task_id") == tid
            moves = [e["data"].get("policy") for e in relay_events(relay, token[0], len(tried) - 1, topic="parsl.events",
                                                                   counted=is_move) if is_move(e)]
            assert moves[:1] == ["default-retry"] and all(str(p).startswith("default-") for p in moves[1:]), (tried, moves)
        # Parsl's JobStatusPoller (min_blocks 1) starts a new block; its manager joins: a is back.
        wait_until(lambda: "a" not in ex.resilient._down, 60, "site a to be usable again")
        assert ex.resilient._sites["a"].managers() - before
        again = step_app(1, 0.01, 9, str(marks), parsl_resource_specification={"diaspora": {"site": "a"}})
        assert again.result(timeout=60) == 18
        assert [x.site for x in ex.resilient._tasks[task_of(ex, again)].attempts] == ["a"]
    # The dead manager's workers wait forever on its queues (Parsl does not end them, and its
    # scale-in only reaches live blocks): ended here so that no test leaves them behind.
    try:
        os.killpg(block, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_a_hung_attempt_is_restarted_and_its_worker_killed_to_free_the_slot(dfk, relay, token, tmp_path):
    d, ex = dfk
    marks = tmp_path / "marks"
    fut = step_app(40, 0.05, 4, str(marks), parsl_resource_specification={"diaspora": {"site": "a"}})
    tid = task_of(ex, fut)
    m = first_marker(marks, tid, step=3)
    t0 = time.monotonic()
    os.kill(m["pid"], signal.SIGSTOP)  # a hang: no steps, no heartbeats
    wait_until(lambda: at.reached(marks, f"{tid}.2"), 30, "the restarted attempt to run")
    reaction = time.monotonic() - t0
    print(f"hung attempt: the restarted attempt ran {reaction:.2f} s after the SIGSTOP")
    assert fut.result(timeout=60) == 8
    wait_gone(m["pid"], "the hung worker to be killed")
    assert reaction < 15, f"the restarted attempt ran {reaction:.1f} s after the hang"
    assert ex.plugin.wait_acked(30)
    events = relay_events(relay, token[0], 1, topic="parsl.events",
                          counted=lambda e: e["type"] == "org.diaspora.task.completed" and e["data"]["task_id"] == tid)
    acts = [e["data"] for e in events if e["type"] == "org.diaspora.action.done" and e["data"].get("task_id") == tid]
    assert [(a["action"], a["status"]) for a in acts][:1] == [("restart", "done")], acts
    # the slot came back: both of a's workers run a task at once again
    pair = [step_app(10, 0.05, k, str(marks), parsl_resource_specification={"diaspora": {"site": "a"}})
            for k in (100, 101)]
    assert sorted(f.result(timeout=60) for f in pair) == [200, 202]


def test_workers_on_another_host_report_over_signed_udp_and_a_stopped_attempts_worker_ends_itself(relay, token,
                                                                                                  tmp_path):
    # The workers report another host name (DIASPORA_HOST, set in the pools' worker_init): the
    # executor has no process control over them. Their reports come over UDP, signed with the
    # run's key; a hang is seen by its silence; the hung attempt's worker is asked to end itself.
    marks = tmp_path / "marks"
    with loaded(relay, token, tmp_path, worker_init="export DIASPORA_HOST=node-7",
                report_address="udp://127.0.0.1") as (d, ex):
        assert ex.resilient._listener.address.startswith("udp://127.0.0.1:")
        fut = step_app(40, 0.05, 4, str(marks), parsl_resource_specification={"diaspora": {"site": "a"}})
        tid = task_of(ex, fut)
        m = first_marker(marks, tid, step=3)
        att = ex.resilient._tasks[tid].attempts[0]
        assert att.remote and att.pid == 0 and att.ctl.startswith("udp://127.0.0.1:"), att
        t0 = time.monotonic()
        os.kill(m["pid"], signal.SIGSTOP)  # a hang: no steps, no heartbeats
        try:
            wait_until(lambda: at.reached(marks, f"{tid}.2"), 30, "the restarted attempt to run")
            reaction = time.monotonic() - t0
            print(f"hung attempt on another host: the restarted attempt ran {reaction:.2f} s after the SIGSTOP")
            assert fut.result(timeout=60) == 8
            assert att.state == "stopped", att  # restarted for its silence, not lost by a look at /proc
            assert reaction < 15, f"the restarted attempt ran {reaction:.1f} s after the hang"
        finally:
            os.kill(m["pid"], signal.SIGCONT)  # the "kill" waiting in its socket now ends it
        wait_gone(m["pid"], "the hung worker to end itself")
        # A datagram signed with another key is dropped and changes nothing.
        before = ex.resilient._listener.dropped
        forged = ex.resilient._listener.address.rsplit("/", 1)[0] + "/" + "ab" * 32
        assert Sender.send(forged, {"t": tid, "a": 1, "k": "started", "w": "evil:1"})
        wait_until(lambda: ex.resilient._listener.dropped == before + 1, 5, "the forged datagram to be dropped")
        assert att.state == "stopped"


def test_report_address_auto_is_a_unix_socket_for_local_workers_and_udp_for_a_batch_provider(tmp_path):
    from parsl.providers import SlurmProvider

    assert DiasporaExecutor(sites=[htex("a")], spec="x").report_address is None
    remote = HighThroughputExecutor(label="hpc", address="10.1.2.3", provider=SlurmProvider(partition="p"))
    assert DiasporaExecutor(sites=[htex("a"), remote], spec="x").report_address == "udp://10.1.2.3:0"
    with pytest.raises(ConfigError, match="report_address"):
        DiasporaExecutor(sites=[htex("a")], spec="x", report_address="tcp://host:1")


SPECULATE = [{"name": "copy-silent", "signal": "task.heartbeat_gap", "detector": "phi-accrual", "threshold": 8,
              "action": "speculate"}]


def test_a_speculative_copy_wins_and_the_losers_worker_is_freed(relay, token, tmp_path):
    marks = tmp_path / "marks"
    with loaded(relay, token, tmp_path, SPECULATE) as (d, ex):
        fut = step_app(30, 0.05, 7, str(marks), parsl_resource_specification={"diaspora": {"site": "a"}})
        tid = task_of(ex, fut)
        m = first_marker(marks, tid, step=3)
        os.kill(m["pid"], signal.SIGSTOP)
        assert fut.result(timeout=90) == 14
        t = ex.resilient._tasks[tid]
        assert [(x.hook_id, x.site, x.state) for x in t.attempts] == [(tid, "a", "stopped"),
                                                                        (f"{tid}@copy1", "b", "done")]
        wait_gone(m["pid"], "the losing attempt's worker to be killed")


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (an HTEX manager's workers)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def test_a_slowed_site_is_migrated_off_to_the_other_executor(relay, token, tmp_path):
    marks = tmp_path / "marks"
    with loaded(relay, token, tmp_path, at.SLOW_MIGRATE) as (d, ex):
        fut = step_app(80, 0.05, 3, str(marks), parsl_resource_specification={"diaspora": {"site": "a"}})
        tid = task_of(ex, fut)
        m = first_marker(marks, tid, step=10)
        manager = manager_of(ex, tid)
        duty = at.DutyCycle(children(manager))  # every worker of site a: the site is slow
        duty.start()
        try:
            assert fut.result(timeout=120) == 6
        finally:
            duty.stop()
        t = ex.resilient._tasks[tid]
        tried = [(x.site, x.state) for x in t.attempts]
        assert tried == [("a", "stopped"), ("b", "done")], tried
