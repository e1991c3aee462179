#!/usr/bin/python3
"""bench/parsl: Diaspora inside real Parsl, side by side with plain Parsl and Ray, in one run.

The same workload and faults on:
  parsl       Parsl's DataFlowKernel over two HighThroughputExecutors (sites a and b, 2
              workers each, LocalProvider on 127.0.0.1), Parsl's defaults (retries 0)
  parsl-r3    the same with Config(retries=3)
  diaspora    Parsl with diaspora.parsl.DiasporaExecutor over the same two HTEX, a spec with
              no policy (the default protection), retries 0
  ray         Ray (local, 4 CPUs; max_retries 3 by default), for the killed worker only:
              Ray has no sites to stop a manager of or slow

Workload ("none": no fault, the reference makespan): 8 tasks of 30 steps of 0.1 s (3 s each;
2 waves on 4 workers), a deadline of 20 s after submission; plain Parsl sends each task to a
random one of the two executors (its default for an app that lists both; its retries go to
the same one), Diaspora alternates
the first attempts between a and b and places the rest itself. Faults, 1.5 s in, on site a:
  kill-worker   SIGKILL of a worker process running a task
  stop-manager  SIGSTOP of site a's HTEX manager (SIGCONT after the run)
  hang          SIGSTOP of a worker process running a task (it never resumes)
  slow-site     SIGSTOP/SIGCONT duty cycle (stopped 0.45 s of every 0.5 s) of site a's workers
A run ends when every task has an outcome or 200 s pass (plain Parsl calls a stopped manager
lost 120 to 150 s after its last heartbeat: heartbeat_threshold 120 s, heartbeat_period 30 s). Printed: tasks completed, deadline misses, reaction (fault to the
first attempt of the hit task that starts after it; "-" when none started), makespan.

Then the no-op throughput: N tasks (default 2,000) that return at once, through one HTEX of
2 workers, plain and under a DiasporaExecutor, alternated; tasks/s and the ratio (target:
the plugin costs at most 10 %).

Usage: .venv/bin/python bench/parsl/bench_parsl.py [--build build] [--faults kill-worker,...]
       [--systems parsl,parsl-r3,diaspora,ray] [--noop 2000] [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(REPO / "engine-adapters" / "python"))
HERE = str(Path(__file__).resolve().parent)  # bench_tasks: the workers import it (PYTHONPATH)
sys.path.insert(0, HERE)
sys.path.insert(0, str(REPO / "bench" / "adapters"))
from adapter_tasks import DutyCycle  # noqa: E402
from bench_adapters import relay_and_spec  # noqa: E402

TASKS, STEPS, STEP_S, DEADLINE_S, FAULT_AT, RUN_BOUND = 8, 30, 0.1, 20.0, 1.5, 200.0
FAULTS = ["none", "kill-worker", "stop-manager", "hang", "slow-site"]
SYSTEMS = ["parsl", "parsl-r3", "diaspora", "ray"]


def htex(label: str, workers: int = 2):
    from parsl.executors import HighThroughputExecutor
    from parsl.providers import LocalProvider

    return HighThroughputExecutor(label=label, address="127.0.0.1", max_workers_per_node=workers,
                                  cores_per_worker=0.1,
                                  provider=LocalProvider(init_blocks=1, min_blocks=1, max_blocks=1,
                                                         worker_init=f"export BENCH_SITE={label}"))


class Marks:
    """The attempts' start records (bench_tasks.work writes one file per attempt)."""

    def __init__(self, folder: Path):
        self.folder = folder

    def all(self) -> list[dict]:
        out = []
        for f in self.folder.glob("*.json"):
            try:
                out.append(json.loads(f.read_text()))
            except (OSError, ValueError):
                pass
        return out

    def running_on(self, site: str) -> list[dict]:
        ms = self.all()
        ends = {(m["task"], m["pid"]) for m in ms if m.get("end")}
        return [m for m in ms if not m.get("end") and m["site"] == site and (m["task"], m["pid"]) not in ends]


def wait_for(cond, timeout: float):
    t = time.monotonic() + timeout
    while time.monotonic() < t:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    return None


def inject(fault: str, marks: Marks, site_pids) -> tuple[float, set, callable]:
    """Injects `fault` on site a; returns (when, the hit tasks, the undo to call at the end)."""
    if fault == "none":
        return time.monotonic(), set(), lambda: None
    running = wait_for(lambda: marks.running_on("a"), 30) or []
    if not running:
        return time.monotonic(), set(), lambda: None
    m = running[0]
    if fault == "kill-worker":
        t = time.monotonic()
        os.kill(m["pid"], signal.SIGKILL)
        return t, {m["task"]}, lambda: None
    if fault == "hang":
        t = time.monotonic()
        os.kill(m["pid"], signal.SIGSTOP)
        return t, {m["task"]}, lambda: None  # killed when its block is scaled in
    if fault == "stop-manager":
        t = time.monotonic()
        os.kill(m["ppid"], signal.SIGSTOP)
        return t, {x["task"] for x in running}, lambda: os.kill(m["ppid"], signal.SIGCONT)
    if fault == "slow-site":
        duty = DutyCycle(site_pids("a") or [x["pid"] for x in running])
        t = time.monotonic()
        duty.start()
        return t, {x["task"] for x in running}, duty.stop
    raise ValueError(fault)


def outcome(marks: Marks, tasks: int, done: dict, submitted: float, t_fault: float, hit: set) -> dict:
    """A run's row: `done` maps each task completed to when its result arrived."""
    ms = marks.all()
    reactions = []
    for k in hit:
        later = [m["t"] for m in ms if m["task"] == k and not m.get("end") and m["t"] > t_fault]
        reactions.append(min(later) - t_fault if later else None)
    ends = [m["t"] for m in ms if m.get("end")]
    misses = sum(1 for k in range(tasks) if k not in done or done[k] - submitted > DEADLINE_S)
    return {"completed": len(done), "misses": misses,
            "reaction_s": (None if any(r is None for r in reactions) or not reactions else max(reactions)),
            "makespan_s": (max(ends) - submitted) if len(done) == tasks and ends else None}


def run_parsl(system: str, fault: str, tmp: Path, spec: Path | None) -> dict:
    import parsl
    from parsl.config import Config

    import bench_tasks

    marks = Marks(tmp / f"marks-{system}-{fault}")
    marks.folder.mkdir(parents=True)
    sites = [htex("a"), htex("b")]
    if system == "diaspora":
        from diaspora.parsl import DiasporaExecutor, retry_handler

        ex = DiasporaExecutor(sites=sites, spec=spec)
        cfg = Config(executors=[ex], retries=0, retry_handler=retry_handler, usage_tracking=0, strategy="none",
                     run_dir=str(tmp / f"run-{system}-{fault}"), initialize_logging=False)
        labels = ["diaspora"]
    else:
        cfg = Config(executors=sites, retries=3 if system == "parsl-r3" else 0, usage_tracking=0, strategy="none",
                     run_dir=str(tmp / f"run-{system}-{fault}"), initialize_logging=False)
        labels = ["a", "b"]
    dfk = parsl.load(cfg)
    undo = lambda: None  # noqa: E731
    try:
        wait_for(lambda: all(len(h.connected_managers()) >= 1 for h in sites), 60)

        def site_pids(label):
            return [m["pid"] for m in marks.all() if m["site"] == label and not m.get("end")]

        submitted = time.monotonic()
        futs, done = {}, {}  # task → its AppFuture; task → when its result arrived
        # Plain Parsl spreads the apps over both executors as it does by default (a random
        # executor per task, kept for its retries); with Diaspora, the first attempts
        # alternate between a and b.
        app = parsl.python_app(bench_tasks.work, executors=labels)
        for k in range(TASKS):
            if system == "diaspora":
                f = app(k, STEPS, STEP_S, str(marks.folder),
                        parsl_resource_specification={"diaspora": {"site": "ab"[k % 2]}})
            else:
                f = app(k, STEPS, STEP_S, str(marks.folder))
            f.add_done_callback(lambda fut, k=k: fut.exception() is None and done.__setitem__(k, time.monotonic()))
            futs[k] = f
        time.sleep(FAULT_AT)
        t_fault, hit, undo = inject(fault, marks, site_pids)
        end = submitted + RUN_BOUND
        while time.monotonic() < end and not all(f.done() for f in futs.values()):
            time.sleep(0.1)
        return outcome(marks, TASKS, done, submitted, t_fault, hit)
    finally:
        undo()
        dfk.cleanup()
        parsl.clear()


def run_ray(tmp: Path) -> dict:
    import ray

    import bench_tasks

    marks = Marks(tmp / "marks-ray")
    marks.folder.mkdir(parents=True)
    os.environ["BENCH_SITE"] = "a"  # the raylet and its workers inherit this environment
    try:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    finally:
        del os.environ["BENCH_SITE"]
    try:
        work = ray.remote(bench_tasks.work)  # max_retries: Ray's default (3)
        submitted = time.monotonic()
        refs = {k: work.remote(k, STEPS, STEP_S, str(marks.folder)) for k in range(TASKS)}
        time.sleep(FAULT_AT)
        t_fault, hit, _ = inject("kill-worker", marks, lambda s: [])
        done_at = {}
        pending = {r: k for k, r in refs.items()}
        end = submitted + RUN_BOUND
        while pending and time.monotonic() < end:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            for r in ready:
                k = pending.pop(r)
                try:
                    ray.get(r)
                    done_at[k] = time.monotonic()
                except Exception:  # noqa: BLE001 - a task Ray gave up on
                    pass
        return outcome(marks, TASKS, done_at, submitted, t_fault, hit)
    finally:
        ray.shutdown()


def noop_throughput(tmp: Path, spec: Path, n: int, rounds: int) -> dict:
    import parsl
    from parsl.config import Config

    import bench_tasks
    from diaspora.parsl import DiasporaExecutor

    rates = {"parsl": [], "diaspora": []}
    cpu = {"parsl": [], "diaspora": []}  # CPU of this (the submitting) process per task, µs
    for r in range(rounds):
        for system in ("parsl", "diaspora"):
            h = htex("a")
            ex = DiasporaExecutor(sites=[h], spec=spec) if system == "diaspora" else h
            dfk = parsl.load(Config(executors=[ex], usage_tracking=0, strategy="none", initialize_logging=False,
                                    run_dir=str(tmp / f"noop-{system}-{r}")))
            try:
                wait_for(lambda: len(h.connected_managers()) >= 1, 60)
                app = parsl.python_app(bench_tasks.noop, executors=[ex.label])
                [f.result() for f in [app(i) for i in range(50)]]  # warm
                t0, c0 = time.perf_counter(), time.process_time()
                futs = [app(i) for i in range(n)]
                [f.result() for f in futs]
                rates[system].append(n / (time.perf_counter() - t0))
                cpu[system].append((time.process_time() - c0) / n * 1e6)
            finally:
                dfk.cleanup()
                parsl.clear()
    med = {k: sorted(v)[len(v) // 2] for k, v in rates.items()}
    us = {k: sorted(v)[len(v) // 2] for k, v in cpu.items()}
    return {"tasks": n, "rounds": rounds, "parsl_tasks_per_s": med["parsl"], "diaspora_tasks_per_s": med["diaspora"],
            "ratio": med["diaspora"] / med["parsl"], "all": rates, "parsl_cpu_us_per_task": us["parsl"],
            "diaspora_cpu_us_per_task": us["diaspora"]}


def fmt(x, unit="s"):
    return "-" if x is None else f"{x:.2f} {unit}".strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--noop", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    os.environ["PYTHONPATH"] = HERE
    import parsl

    out = {"parsl": parsl.__version__, "runs": []}
    with tempfile.TemporaryDirectory(prefix="diaspora-bench-parsl-") as t:
        tmp = Path(t)
        relay, spec = relay_and_spec(tmp, Path(a.build), [{"name": "a", "engine": "local", "workers": 2},
                                                          {"name": "b", "engine": "local", "workers": 2}])
        try:
            print(f"Parsl {parsl.__version__}; {TASKS} tasks of {STEPS * STEP_S:.0f} s on sites a, b (2 HTEX workers "
                  f"each), deadline {DEADLINE_S:.0f} s, fault at {FAULT_AT} s on site a\n")
            print("| fault | system | completed | deadline misses | reaction | makespan |")
            print("|---|---|---|---|---|---|")
            for fault in [f for f in a.faults.split(",") if f]:
                for system in [s for s in a.systems.split(",") if s]:
                    if system == "ray" and fault != "kill-worker":
                        continue
                    r = run_ray(tmp) if system == "ray" else run_parsl(system, fault, tmp, spec)
                    r.update(fault=fault, system=system)
                    out["runs"].append(r)
                    print(f"| {fault} | {system} | {r['completed']}/{TASKS} | {r['misses']} | {fmt(r['reaction_s'])} | "
                          f"{fmt(r['makespan_s'])} |", flush=True)
            if a.noop:
                n = noop_throughput(tmp, spec, a.noop, a.rounds)
                out["noop"] = n
                print(f"\nno-op throughput, one HTEX of 2 workers, {n['tasks']} tasks, median of {n['rounds']}: "
                      f"Parsl {n['parsl_tasks_per_s']:.0f}/s, with Diaspora {n['diaspora_tasks_per_s']:.0f}/s, "
                      f"ratio {n['ratio']:.2f}; CPU of the submitting process per task: Parsl "
                      f"{n['parsl_cpu_us_per_task']:.0f} us, with Diaspora {n['diaspora_cpu_us_per_task']:.0f} us")
        finally:
            relay.stop()
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
