"""diaspora.futures.ResilientExecutor over real executors (spawned ProcessPoolExecutors, a
Dask LocalCluster's executor) with a real relay and the plugin's policies: a worker
process SIGKILLed mid-task, a site slowed by a SIGSTOP duty cycle, a hung attempt copied
elsewhere. The Future's result is right, no attempt is left running, and the relay holds
each attempt's lifecycle in order."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from relay_harness import REPO, publish_action, relay_events, wait_subscribed, wait_until, write_spec  # noqa: E402

sys.path.insert(0, str(REPO / "engine-adapters" / "python"))
import adapter_tasks as at  # noqa: E402
from diaspora.futures import ResilientExecutor  # noqa: E402

RESTART = [{"name": "restart-failed", "signal": "task.failures", "detector": "threshold", "threshold": 1,
            "action": "restart"}]
MIGRATE = at.SLOW_MIGRATE
SPECULATE = [{"name": "copy-silent", "signal": "task.heartbeat_gap", "detector": "phi-accrual", "threshold": 8,
              "action": "speculate"}]
SITES = [{"name": "a", "engine": "local", "workers": 2}, {"name": "b", "engine": "local", "workers": 2}]


def pool(n: int = 2) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"))


def attempts_all_done(ex: ResilientExecutor, timeout: float = 20) -> None:
    """No attempt left running: every attempt's own future finished."""
    wait_until(lambda: all(a.inner is None or a.inner.done() for t in ex._tasks.values() for a in t.attempts),
               timeout, "every attempt to end")


def lifecycle(events: list[dict], task_id: str) -> list[tuple]:
    out = []
    for e in events:
        if e["type"].startswith("org.diaspora.task.") and e["data"]["task_id"] == task_id:
            kind = e["type"].rsplit(".", 1)[1]
            if kind != "heartbeat":
                out.append((kind, e["data"].get("site"), e["data"].get("attempt")))
    return out


def test_a_killed_worker_process_is_restarted_on_the_other_site(relay, token, tmp_path):
    spec = write_spec(tmp_path, relay.creds, token[1], relay.port, name="futs", sites=SITES,
                      extra={"policies": RESTART})
    marks = tmp_path / "marks"
    marks.mkdir()
    a, b = pool(), pool()
    try:
        with ResilientExecutor({"a": a, "b": b}, spec=spec, heartbeat_s=0.2) as ex:
            fut = ex.submit_task(at.stepper, (40, 0.05, 21, str(marks)), task_id="recon-1", site="a")
            ok = [ex.submit(at.stepper, 2, 0.01, k) for k in range(4)]
            first = wait_until(lambda: at.markers(marks).get("recon-1.1"), 60, "the first attempt to run")
            os.kill(first["pid"], signal.SIGKILL)
            assert fut.result(timeout=90) == 42
            assert sorted(f.result(timeout=60) for f in ok) == [0, 2, 4, 6]  # those on a: restarted too
            attempts_all_done(ex)
            t = ex._tasks["recon-1"]
            assert [(x.site, x.state) for x in t.attempts] == [("a", "failed"), ("b", "done")]
            assert "a" in ex._down and "BrokenProcessPool" in ex._down["a"]
            assert ex.plugin.wait_acked(30)
    finally:
        a.shutdown(wait=False, cancel_futures=True)
        b.shutdown()
    events = relay_events(relay, token[0], 1, topic="futs.events",
                          counted=lambda e: e["type"] == "org.diaspora.task.completed" and e["data"]["task_id"] == "recon-1")
    life = lifecycle(events, "recon-1")
    assert life[:3] == [("submitted", "a", 1), ("started", "a", 1), ("failed", "a", 1)], life
    assert life[3:] == [("submitted", "b", 2), ("started", "b", 2), ("completed", "b", 2)], life
    failed = next(e["data"] for e in events if e["type"] == "org.diaspora.task.failed" and e["data"]["task_id"] == "recon-1")
    assert "BrokenProcessPool" in failed["reason"]
    done = [e["data"] for e in events if e["type"] == "org.diaspora.action.done" and e["data"]["task_id"] == "recon-1"]
    assert done and done[0]["status"] == "done" and "on b" in done[0]["message"], done
    beats = [e for e in events if e["type"] == "org.diaspora.task.heartbeat" and e["data"]["task_id"] == "recon-1"]
    assert any("step_time_s" in e["data"].get("metrics", {}) for e in beats)
    assert any("rss_mib" in e["data"].get("metrics", {}) for e in beats)
    # Every heartbeat names its site and attempt, so a reader can tie them to the attempt.
    assert all(e["data"].get("site") in ("a", "b") and e["data"].get("attempt") in (1, 2) for e in beats), beats[:3]
    assert failed.get("failure") == "lost", failed  # a broken pool lost it; not the task's own error


def test_a_slowed_site_is_migrated_off_and_the_old_attempt_stops(relay, token, tmp_path):
    spec = write_spec(tmp_path, relay.creds, token[1], relay.port, name="futs", sites=SITES,
                      extra={"policies": MIGRATE})
    marks = tmp_path / "marks"
    marks.mkdir()
    a, b = pool(1), pool(1)
    try:
        with ResilientExecutor({"a": a, "b": b}, spec=spec, heartbeat_s=0.5) as ex:
            fut = ex.submit_task(at.stepper, (120, 0.05, 5, str(marks)), task_id="recon-2", site="a", deadline_s=60)
            m = wait_until(lambda: at.reached(marks, "recon-2.1", 20), 60, "20 steps on a")
            slow = at.DutyCycle([m["pid"]])
            slow.start()
            try:
                wait_until(lambda: "recon-2.2" in at.markers(marks), 60, "the attempt on b")
            finally:
                slow.stop()
            assert fut.result(timeout=90) == 10
            attempts_all_done(ex)
            t = ex._tasks["recon-2"]
            assert [(x.site, x.state) for x in t.attempts] == [("a", "stopped"), ("b", "done")]
            assert isinstance(t.attempts[0].inner.exception(), Exception)  # AttemptStopped at its next step
            assert at.markers(marks)["recon-2.1"]["step"] < 119
            assert ex.plugin.wait_acked(30)
    finally:
        a.shutdown()
        b.shutdown()
    events = relay_events(relay, token[0], 1, topic="futs.events",
                          counted=lambda e: e["type"] == "org.diaspora.task.completed")
    life = lifecycle(events, "recon-2")
    assert life[:2] == [("submitted", "a", 1), ("started", "a", 1)] and life[2] == ("cancelled", "a", 1), life
    assert life[3:] == [("submitted", "b", 2), ("started", "b", 2), ("completed", "b", 2)], life
    cancelled = next(e["data"] for e in events if e["type"] == "org.diaspora.task.cancelled")
    assert "migration to b" in cancelled["reason"]
    (mig,) = [e["data"] for e in events if e["type"] == "org.diaspora.action.done"]
    assert mig["action"] == "migrate" and mig["status"] == "done"


def test_a_hung_attempt_gets_a_copy_that_wins(relay, token, tmp_path):
    spec = write_spec(tmp_path, relay.creds, token[1], relay.port, name="futs", sites=SITES,
                      extra={"policies": SPECULATE})
    marks = tmp_path / "marks"
    marks.mkdir()
    a, b = pool(1), pool(1)
    try:
        with ResilientExecutor({"a": a, "b": b}, spec=spec, heartbeat_s=0.2) as ex:
            fut = ex.submit_task(at.stepper, (60, 0.05, 7, str(marks)), task_id="recon-3", site="a")
            m = wait_until(lambda: at.reached(marks, "recon-3.1", 10), 60, "10 steps on a")
            os.kill(m["pid"], signal.SIGSTOP)
            try:
                assert fut.result(timeout=90) == 14
            finally:
                os.kill(m["pid"], signal.SIGCONT)
            attempts_all_done(ex)
            t = ex._tasks["recon-3"]
            assert [(x.hook_id, x.site, x.state) for x in t.attempts] == \
                [("recon-3", "a", "stopped"), ("recon-3@copy1", "b", "done")]
            assert ex.plugin.wait_acked(30)
    finally:
        a.shutdown()
        b.shutdown()
    events = relay_events(relay, token[0], 1, topic="futs.events",
                          counted=lambda e: e["type"] == "org.diaspora.task.completed")
    assert lifecycle(events, "recon-3@copy1") == [("submitted", "b", 1), ("started", "b", 1), ("completed", "b", 1)]
    orig = lifecycle(events, "recon-3")
    assert orig[-1][0] == "cancelled" and "finished first" in next(
        e["data"]["reason"] for e in events if e["type"] == "org.diaspora.task.cancelled")


def test_without_a_policy_a_failure_fails_the_future_and_results_pass_through(relay, token, tmp_path):
    spec = write_spec(tmp_path, relay.creds, token[1], relay.port, name="futs", sites=SITES)
    with ThreadPoolExecutor(2) as a, ThreadPoolExecutor(2) as b:
        with ResilientExecutor({"a": a, "b": b}, spec=spec, failure_grace=0.5) as ex:
            bad = ex.submit(at.explode, "bad frame")
            good = [ex.submit(at.stepper, 1, 0.0, k) for k in range(20)]
            with pytest.raises(ValueError, match="bad frame"):
                bad.result(timeout=30)
            assert [f.result(timeout=30) for f in good] == [2 * k for k in range(20)]
            sites = {t.attempts[0].site for t in ex._tasks.values()}
            assert sites == {"a", "b"}  # spread by load
            with pytest.raises(ValueError, match="unknown site"):
                ex.submit_task(at.explode, ("x",), site="c")
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(at.explode, "late")


def test_a_dask_executor_and_a_process_pool_as_two_sites(relay, token, tmp_path):
    from distributed import Client, LocalCluster

    spec = write_spec(tmp_path, relay.creds, token[1], relay.port, name="futs",
                      sites=[{"name": "dask", "engine": "dask", "endpoint": "local"}, SITES[1]],
                      extra={"policies": RESTART + MIGRATE})
    marks = tmp_path / "marks"
    marks.mkdir()
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=None,
                      host="127.0.0.1") as cluster, Client(cluster) as client:
        dask_pid = next(iter(client.run(os.getpid).values()))
        b = pool(2)
        try:
            sites = {"dask": client.get_executor(pure=False), "b": b}
            with ResilientExecutor(sites, spec=spec, heartbeat_s=0.5) as ex:
                # 1. A slowed Dask worker: migrated to the process pool.
                slow_fut = ex.submit_task(at.stepper, (120, 0.05, 3, str(marks)), task_id="slow", site="dask")
                wait_until(lambda: at.reached(marks, "slow.1", 20), 90, "20 steps on dask")
                duty = at.DutyCycle([dask_pid])
                duty.start()
                try:
                    wait_until(lambda: "slow.2" in at.markers(marks), 60, "the attempt on b")
                finally:
                    duty.stop()
                assert slow_fut.result(timeout=90) == 6
                # 2. A killed process-pool worker: restarted on Dask.
                kill_fut = ex.submit_task(at.stepper, (40, 0.05, 4, str(marks)), task_id="kill", site="b")
                victim = wait_until(lambda: at.markers(marks).get("kill.1"), 60, "the attempt on b")
                os.kill(victim["pid"], signal.SIGKILL)
                assert kill_fut.result(timeout=90) == 8
                attempts_all_done(ex)
                assert [(x.site, x.state) for x in ex._tasks["slow"].attempts] == [("dask", "stopped"), ("b", "done")]
                assert [(x.site, x.state) for x in ex._tasks["kill"].attempts] == [("b", "failed"), ("dask", "done")]
                assert at.markers(marks)["kill.2"]["pid"] == dask_pid
        finally:
            b.shutdown(wait=False, cancel_futures=True)


class Recording(ThreadPoolExecutor):
    """A thread pool that records which thread submitted each call, and what it was given."""

    def __init__(self):
        super().__init__(4)
        self.calls: list[tuple[int, object]] = []

    def submit(self, fn, /, *args, **kwargs):
        self.calls.append((threading.get_ident(), fn))
        return super().submit(fn, *args, **kwargs)


def _event_time(e: dict) -> float:
    return datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp()


def test_submit_places_at_once_callbacks_may_submit_again_starts_are_stamped_and_memory_is_bounded(relay, token,
                                                                                                  tmp_path):
    spec = write_spec(tmp_path, relay.creds, token[1], relay.port, name="futs", sites=SITES[:1])
    site = Recording()
    with site, ResilientExecutor({"a": site}, spec=spec) as ex:
        ex.KEEP_FINISHED = 50  # of the ~300 tasks below, only the last 50 finished are remembered
        # The attempt is handed to the site on the submitting thread, before submit() returns.
        f = ex.submit(at.stepper, 0, 0.0, 1)
        assert [t for t, _ in site.calls] == [threading.get_ident()]
        assert f.result(timeout=30) == 2
        # Each task's done callback submits the next, as Parsl's DataFlowKernel does with a
        # dependent task, while other threads submit too: nothing waits on anything.
        results, done = [], threading.Event()

        def link(fut, k):
            results.append(fut.result())
            if k < 100:
                ex.submit(at.stepper, 0, 0.0, k + 1).add_done_callback(lambda g: link(g, k + 1))
            else:
                done.set()

        ex.submit(at.stepper, 0, 0.0, 0).add_done_callback(lambda g: link(g, 0))
        with ThreadPoolExecutor(4) as others:
            side = list(others.map(lambda k: ex.submit(at.stepper, 0, 0.0, k), range(200)))
        assert done.wait(60), f"the chain stopped after {len(results)} links"
        assert results == [2 * k for k in range(101)]
        assert [g.result(timeout=30) for g in side] == [2 * k for k in range(200)]
        # Every attempt of stepper got the same wrapper object: an engine that caches a
        # callable's serialisation (Parsl) pickles it once.
        assert len({id(fn) for _, fn in site.calls}) == 1
        # A longer attempt is announced while it runs, stamped with the time it began.
        slow = ex.submit_task(at.stepper, (10, 0.05, 7), task_id="slow")
        wait_until(lambda: ex._tasks["slow"].attempts[0].state == "running", 5, "the slow attempt to be announced")
        assert slow.result(timeout=30) == 14
        assert len(ex._tasks) == 50 and "slow" in ex._tasks
        assert ex.plugin.wait_acked(30)
    events = relay_events(relay, token[0], 1, topic="futs.events",
                          counted=lambda e: e["type"] == "org.diaspora.task.completed" and e["data"]["task_id"] == "slow")
    for tid in ("slow", next(e["data"]["task_id"] for e in events if e["data"].get("task_id", "").startswith("stepper"))):
        mine = {e["type"].rsplit(".", 1)[1]: e for e in events if e["data"].get("task_id") == tid
                and e["type"] != "org.diaspora.task.heartbeat"}
        assert list(mine) == ["submitted", "started", "completed"], (tid, list(mine))
        t_sub, t_start, t_end = (_event_time(mine[k]) for k in ("submitted", "started", "completed"))
        assert t_sub <= t_start <= t_end, (tid, t_sub, t_start, t_end)
        if tid == "slow":  # it ran 0.5 s: started is when it began, not when it was announced or ended
            assert t_end - t_start >= 0.45 and t_start - t_sub < 0.2, (t_sub, t_start, t_end)


def test_operator_actions_it_cannot_carry_out_are_refused_and_restarts_stop_at_max_attempts(relay, token, tmp_path):
    # docs/adapters.md: throttle, drain and undrain are refused with the reason; an action on
    # an unknown task too; restarts and migrations stop at max_attempts, and the Future then
    # fails. Actions come from an operator on the executor's control topic.
    spec = write_spec(tmp_path, relay.creds, token[1], relay.port, name="ops", sites=SITES)
    marks = tmp_path / "marks"
    marks.mkdir()
    with ThreadPoolExecutor(2) as a, ThreadPoolExecutor(2) as b:
        with ResilientExecutor({"a": a, "b": b}, spec=spec, max_attempts=2, heartbeat_s=0.2) as ex:
            wait_subscribed(relay, "ops.control.engine")
            fut = ex.submit_task(at.stepper, (400, 0.05, 1, str(marks)), task_id="long-1", site="a")
            wait_until(lambda: at.markers(marks).get("long-1.1"), 30, "the first attempt to run")
            asks = [("op-1", {"action": "throttle"}), ("op-2", {"action": "drain", "site": "a"}),
                    ("op-3", {"action": "undrain", "site": "a"}), ("op-4", {"action": "restart", "task_id": "nope-9"}),
                    ("op-5", {"action": "restart", "task_id": "long-1"}),
                    ("op-6", {"action": "migrate", "task_id": "long-1", "target_site": "b"})]
            for aid, data in asks:
                publish_action(relay, token[0], {"action_id": aid, "reason": "operator", **data},
                               topic="ops.control.engine")
                if aid == "op-5":  # the restart runs before the migration is asked
                    wait_until(lambda: at.markers(marks).get("long-1.2"), 30, "the restarted attempt to run")
            events = relay_events(relay, token[0], len(asks), topic="ops.events",
                                  counted=lambda e: e["type"] == "org.diaspora.action.done")
            done = {e["data"]["action_id"]: e["data"] for e in events if e["type"] == "org.diaspora.action.done"}
            say = {k: (v["status"], v.get("message", "")) for k, v in done.items()}
            assert say["op-1"][0] == "failed" and "does not throttle" in say["op-1"][1], say
            assert say["op-2"][0] == "failed" and "does not drain" in say["op-2"][1], say
            assert say["op-3"][0] == "failed" and "does not undrain" in say["op-3"][1], say
            assert say["op-4"][0] == "failed" and "unknown task 'nope-9'" in say["op-4"][1], say
            assert say["op-5"][0] == "done", say  # attempt 2 of 2
            assert say["op-6"][0] == "failed" and "has used its 2 attempts" in say["op-6"][1], say
            with pytest.raises(RuntimeError, match="2 attempts"):
                fut.result(timeout=30)
            attempts_all_done(ex)


def test_an_exit_watch_hears_a_process_that_is_not_its_child_exit_and_forgets_it():
    """ExitWatch (process_control's early ear): a grandchild SIGKILLed is heard once, on the
    watch's thread, and forgotten; a watch twice is one watch; a pid that does not exist is
    refused; an on_exit that raises does not stop the watch; after close() nothing is
    watched and watch() refuses."""
    from diaspora.exits import ExitWatch
    import subprocess

    if not ExitWatch.supported():
        pytest.fail("no pidfds on this host (Linux 5.3+ and Python 3.9+ give them): process_control "
                    "falls back to its 0.25 s look, which this test cannot check")
    heard: list[tuple[int, str]] = []

    def on_exit(pid: int) -> None:
        heard.append((pid, threading.current_thread().name))
        if len(heard) == 1:
            raise RuntimeError("an on_exit that fails")

    # Two grandchildren (the shell's children): not this process's children, as HTEX's
    # workers are not the submitting process's.
    sh = subprocess.Popen(["bash", "-c", "sleep 60 & echo $!; sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(sh.stdout.readline()), int(sh.stdout.readline())]
        w = ExitWatch(on_exit, name="exit-test")
        assert w.watch(pids[0]) and w.watch(pids[0]) and w.watch(pids[1])
        assert w.watched() == set(pids)
        dead = subprocess.run(["bash", "-c", "sleep 0.1 & echo $!; wait"], capture_output=True, text=True)
        assert not w.watch(int(dead.stdout)), "a process that exited (and was reaped) cannot be watched"
        assert not w.watch(0) and not w.watch(-1)
        os.kill(pids[0], signal.SIGKILL)
        wait_until(lambda: len(heard) == 1, 10, "the first exit heard")
        os.kill(pids[1], signal.SIGKILL)
        wait_until(lambda: len(heard) == 2, 10, "the second exit heard (after an on_exit that raised)")
        assert heard == [(pids[0], "exit-test"), (pids[1], "exit-test")]
        assert w.watched() == set()
        w.close()
        assert not w.watch(sh.pid) and w.watched() == set()
        w.close()  # twice is harmless
    finally:
        sh.kill()
        sh.wait()
