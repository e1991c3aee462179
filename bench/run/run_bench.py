#!/usr/bin/python3
"""bench/run: `diaspora run` with the policies against the baseline, and against Dask.

1. Recovery: a killed worker and a hung task (cpu-burn instances, one local site). The same
   spec and faults run twice: with the policies, and with `--baseline retry-after=120s`
   (no prediction: a task is retried only after 120 s without heartbeats, Parsl HTEX's
   default threshold, or when it exits with an error). Printed side by side: the reaction
   time of each fault (fault -> the recovering attempt running), deadline misses, total time.
2. Slow site: examples/workflows/ptycho-stream.yaml (its rehearsal job included) with a 10 s
   deadline, cluster-a (the preferred, declared-fast site) given 16 workers and made 4x
   slower from 2 s to the end, the 5 s relay outage: with the policies and as the baseline.
   Deadline misses side by side (target: <= 1 % with the policies where the baseline, which
   knows only the declared speeds, misses most).
3. Throughput: N no-op task instances through one local site of W workers, every lifecycle
   event acked by the relay (the plugin's counters checked), side by side with a Dask
   LocalCluster (distributed from requirements.lock, W worker processes, 1 thread each) and
   Ray (a local instance of W CPUs, requirements.lock) running N no-op tasks in the same
   script. Printed: tasks/s of each, and the runner's CPU per task.

Usage: bench/run/run_bench.py [--build build] [--retry-after 120s] [--tasks 2000] [--workers 2]
       [--only recovery,slow,throughput] [--json]
--json: no peers (no baseline, no Dask); one JSON line of this build's figures (what
bench/compare_builds.sh compares between two builds): tasks_per_s, runner_cpu_us_per_task,
recovery_reaction_mean_s, recovery_total_s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

RECOVERY = """version: 1
name: bench-recovery
sites:
  - {name: a, engine: local, workers: 2}
tasks:
  - name: burn
    kind: cpu-burn
    args: {seconds: 6, step: 0.5}
    count: 4
    deadline: 60s
policies:
  - name: restart-failed
    signal: task.failures
    detector: threshold
    threshold: 1
    action: restart
  - name: restart-silent
    signal: task.heartbeat_gap
    detector: phi-accrual
    threshold: 8
    cooldown: 5s               # the default 60 s would hold back a second restart of the same task
    action: restart
faults:
  - {at: 3s, kind: kill-worker, site: a}
  - {at: 9s, kind: hang-task, site: a}
"""

NOOP = """version: 1
name: bench-noop
sites:
  - {{name: a, engine: local, workers: {workers}}}
tasks:
  - name: noop
    kind: sleep
    args: {{seconds: 0.000001, step: 1}}
    count: {tasks}
"""


def diaspora_run(build: Path, spec: Path, out: Path, *extra: str) -> tuple[dict, float, float]:
    """Runs the spec; returns (report, wall seconds, the runner process's own CPU seconds)."""
    t0 = time.monotonic()
    p = subprocess.Popen([str(build / "bin" / "diaspora-run"), str(spec), "--out", str(out), *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cpu = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    while p.poll() is None:
        try:  # the runner's own utime + stime, sampled until it exits
            f = (Path("/proc") / str(p.pid) / "stat").read_text()
            parts = f[f.rindex(")") + 2:].split()
            cpu = (int(parts[11]) + int(parts[12])) / tick
        except (OSError, ValueError, IndexError):
            pass
        time.sleep(0.05)
    wall = time.monotonic() - t0
    if p.returncode not in (0, 1):
        sys.exit(f"diaspora run {spec} failed ({p.returncode}):\n{p.stderr.read()}")
    return json.loads((out / "report.json").read_text()), wall, cpu


def reactions(rep: dict) -> list[tuple[str, float | None]]:
    """(fault, reaction) for each fault and instance it hit; faults by number and kind (the
    same fault may hit another instance in the other run)."""
    out = []
    for n, f in enumerate(rep["faults"]):
        for k, h in enumerate(f["hit"]):
            out.append((f"{f['kind']} #{n + 1}" + (f".{k + 1}" if len(f["hit"]) > 1 else ""), h["reaction_s"]))
    return out


def fmt(x: float | None, unit: str = "s") -> str:
    return "-" if x is None else f"{x:.2f} {unit}"


def side_by_side(title: str, pol: tuple[dict, float, float], base: tuple[dict, float, float], retry: str) -> None:
    (rp, wp, _), (rb, wb, _) = pol, base
    print(f"\n{title}")
    print(f"{'':34} {'policies':>14} {'baseline ' + retry:>22} {'ratio':>8}")
    rp_r, rb_r = dict(reactions(rp)), dict(reactions(rb))
    for key in rp_r:
        a, b = rp_r.get(key), rb_r.get(key)
        ratio = f"{b / a:.1f}x" if a and b else "-"
        print(f"{'reaction ' + key:34} {fmt(a):>14} {fmt(b):>22} {ratio:>8}")
    for name, f in (("deadline misses", lambda r: f"{r['summary']['deadline_misses']} of {r['summary']['with_deadline']}"),
                    ("instances completed", lambda r: f"{r['summary']['completed']} of {r['summary']['instances']}"),
                    ("actions", lambda r: str(len(r["actions"]))),
                    ("events lost", lambda r: str(r["plugin"]["stats"]["events_lost"]))):
        print(f"{name:34} {f(rp):>14} {f(rb):>22}")
    print(f"{'total time':34} {fmt(wp):>14} {fmt(wb):>22} {wb / wp:>7.1f}x")


def dask_noop(tasks: int, workers: int) -> float:
    """Tasks per second of a Dask LocalCluster (processes) running `tasks` no-op tasks."""
    code = f"""
import time
from distributed import Client, LocalCluster
def noop(i):
    return i
if __name__ == "__main__":
    with LocalCluster(n_workers={workers}, threads_per_worker=1, processes=True, dashboard_address=None,
                      host="127.0.0.1") as cluster, Client(cluster) as client:
        client.submit(noop, -1).result()  # warm: workers up and connected
        t0 = time.monotonic()
        futures = client.map(noop, range({tasks}), pure=False)
        client.gather(futures)
        print(time.monotonic() - t0)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"dask failed:\n{p.stderr[-2000:]}")
    return tasks / float(p.stdout.strip().splitlines()[-1])


def ray_noop(tasks: int, workers: int) -> float:
    """Tasks per second of Ray (a local instance of `workers` CPUs) running `tasks` no-op tasks."""
    code = f"""
import time
import ray
ray.init(num_cpus={workers}, include_dashboard=False, log_to_driver=False)
@ray.remote
def noop(i):
    return i
ray.get([noop.remote(-k) for k in range(1, {workers} + 1)])  # warm: the workers up
t0 = time.monotonic()
ray.get([noop.remote(i) for i in range({tasks})])
print(time.monotonic() - t0)
ray.shutdown()
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"ray failed:\n{p.stderr[-2000:]}")
    return tasks / float(p.stdout.strip().splitlines()[-1])


def figures_json(build: Path, tasks: int, workers: int) -> None:
    """One line of this build's figures (recovery with the policies, then throughput)."""
    with tempfile.TemporaryDirectory(prefix="diaspora-bench-run.") as tmp:
        tmp = Path(tmp)
        (tmp / "recovery.yaml").write_text(RECOVERY)
        rep, wall, _ = diaspora_run(build, tmp / "recovery.yaml", tmp / "rec")
        times = [r for _, r in reactions(rep) if r is not None]
        (tmp / "noop.yaml").write_text(NOOP.format(tasks=tasks, workers=workers))
        noop, _, cpu = diaspora_run(build, tmp / "noop.yaml", tmp / "noop")
        print(json.dumps({"tasks_per_s": tasks / noop["duration_s"], "runner_cpu_us_per_task": cpu / tasks * 1e6,
                          "recovery_reaction_mean_s": sum(times) / len(times) if times else None,
                          "recovery_total_s": rep["duration_s"]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--retry-after", default="120s")
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", default="recovery,slow,throughput")
    ap.add_argument("--json", action="store_true", help="this build's figures as one JSON line, no peers")
    args = ap.parse_args()
    if args.json:
        return figures_json(Path(args.build), args.tasks, args.workers)
    build = Path(args.build)
    only = set(args.only.split(","))
    with tempfile.TemporaryDirectory(prefix="diaspora-bench-run.") as tmp:
        tmp = Path(tmp)
        if "recovery" in only:
            spec = tmp / "recovery.yaml"
            spec.write_text(RECOVERY)
            pol = diaspora_run(build, spec, tmp / "rec-pol")
            base = diaspora_run(build, spec, tmp / "rec-base", "--baseline", f"retry-after={args.retry_after}")
            side_by_side("1. recovery: a killed worker (t=3 s) and a hung task (t=9 s), 4 x 6 s cpu-burn on 2 workers",
                         pol, base, args.retry_after)
        if "slow" in only:
            spec = REPO / "examples" / "workflows" / "ptycho-stream.yaml"
            # cluster-a big enough to take every scan (16 workers: a placement that knows only
            # the declared speeds keeps using it) and 4x slower from 2 s to the end.
            tight = ("--set", "tasks.reconstruct.deadline=10s", "--set", "sites.cluster-a.workers=16",
                     "--set", "faults[0].at=2s", "--set", "faults[0].for=80s")
            pol = diaspora_run(build, spec, tmp / "slow-pol", *tight)
            base = diaspora_run(build, spec, tmp / "slow-base", *tight, "--baseline", f"retry-after={args.retry_after}")
            side_by_side("2. slow site: examples/workflows/ptycho-stream.yaml with a 10 s deadline (about 3x a scan's "
                         "work), 16 workers on cluster-a, cluster-a 4x slower from 2 s to the end, the relay stopped 5 s",
                         pol, base, args.retry_after)
        if "throughput" in only:
            spec = tmp / "noop.yaml"
            spec.write_text(NOOP.format(tasks=args.tasks, workers=args.workers))
            rep, wall, cpu = diaspora_run(build, spec, tmp / "noop")
            st = rep["plugin"]["stats"]
            acked = st["events_acked"] >= st["events_accepted"] and st["events_lost"] == 0
            ours = args.tasks / rep["duration_s"]
            theirs = dask_noop(args.tasks, args.workers)
            ray_rate = ray_noop(args.tasks, args.workers)
            print(f"\n3. throughput: {args.tasks} no-op tasks, {args.workers} worker processes")
            print(f"{'':34} {'diaspora run':>14} {'Dask LocalCluster':>22} {'ratio':>8}")
            print(f"{'tasks/s':34} {ours:>14.0f} {theirs:>22.0f} {ours / theirs:>7.2f}x")
            print(f"{'Ray (local, same CPUs), tasks/s':34} {'':>14} {ray_rate:>22.0f} {ours / ray_rate:>7.2f}x")
            print(f"{'runner CPU per task':34} {cpu / args.tasks * 1e6:>11.0f} us {'':>22}")
            print(f"{'lifecycle events acked':34} {str(st['events_acked']) + ('' if acked else ' (NOT ALL)'):>14} "
                  f"{'(none: no events)':>22}")
            print(f"(wall time of the whole diaspora run, start-up and report included: {wall:.1f} s)")


if __name__ == "__main__":
    main()
