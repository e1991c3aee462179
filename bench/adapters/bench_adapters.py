#!/usr/bin/python3
"""bench/adapters: what the Python adapters cost.

1. Hook cost from Python: diaspora.Plugin's hooks (ctypes over libdiaspora_plugin.so, a
   real relay on 127.0.0.1 acking everything), ns per call, next to the floor of a ctypes
   call into the library (diaspora_abi_version). Target: <= 2 us a hook.
2. Dask throughput: N no-op tasks (default 10,000) through a LocalCluster with worker
   processes (2 workers, 1 thread each), without and with the Diaspora scheduler and
   worker plugins registered, alternated in the same run (the scheduler plugin switched in
   and out of one cluster between blocks). Printed: tasks/s of each block and the ratio.
   Target: with >= 98 % of without.
3. The scheduler plugin's own cost per task (five transitions called directly, no Dask).

Usage: bench/adapters/bench_adapters.py [--build build] [--tasks 10000] [--rounds 10] [--calls 200000]
       [--only hooks,transitions,dask]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(REPO / "engine-adapters" / "python"))


def relay_and_spec(tmp: Path, build: Path, sites: list[dict] | None = None):
    """A relay on 127.0.0.1 (no fsync) and a spec for it with `sites` (two Dask sites)."""
    os.environ["DIASPORA_BIN_DIR"] = str((REPO / build / "bin").resolve())
    import relay_harness as rh  # reads DIASPORA_BIN_DIR at import

    creds = rh.Credentials(tmp / "creds")
    relay = rh.RelayProcess(creds, tmp / "relay", fsync="never").start()
    tok = tmp / "token"
    tok.write_text(creds.token("publish:*", "subscribe:*") + "\n")
    spec = rh.write_spec(tmp, creds, tok, relay.port, name="bench", queue_size=262144,
                         sites=sites or [{"name": "a", "engine": "dask"}, {"name": "b", "engine": "dask"}])
    return relay, spec


def bench_hooks(spec: Path, relay, calls: int) -> None:
    """Each case twice: 'quiet' with the relay stopped (SIGSTOP) while a chunk is timed, so
    that the plugin's publisher and the relay do not compete for the 2 cores (the queue
    holds the chunk; it is drained between chunks), and 'live' with everything running."""
    import signal

    import diaspora

    with diaspora.Plugin.open(spec) as p:
        lib = p._lib
        n = calls
        t0 = time.perf_counter_ns()
        for _ in range(n):
            lib.diaspora_abi_version()
        floor = (time.perf_counter_ns() - t0) / n
        m = {"step_time_s": 0.25}
        cases = {
            "heartbeat(id)": lambda i: p.heartbeat("task-1"),
            "heartbeat(id, metrics={1})": lambda i: p.heartbeat("task-1", metrics=m),
            "progress(id, f, step)": lambda i: p.progress("task-1", 0.5, step=i),
            "started(id, site, worker)": lambda i: p.started("task-1", site="a", worker="w0"),
            "metric(site, id, name, v)": lambda i: p.metric("site", "a", "queue_length", 3.0),
        }
        p.submitted("task-1", site="a")
        print(f"{'call':34} {'quiet ns':>10} {'live ns':>10}  (target <= 2000 ns; a ctypes call: {floor:.0f} ns)")
        chunk = 50_000
        for name, fn in cases.items():
            res = []
            for quiet in (True, False):
                done, spent = 0, 0
                while done < n:
                    k = min(chunk, n - done)
                    if quiet:
                        relay.proc.send_signal(signal.SIGSTOP)
                        time.sleep(0.05)
                    t0 = time.perf_counter_ns()
                    for i in range(k):
                        fn(i)
                    spent += time.perf_counter_ns() - t0
                    if quiet:
                        relay.proc.send_signal(signal.SIGCONT)
                    done += k
                    assert p.wait_acked(120), p.stats()  # the queue drains between chunks
                res.append(spent / n)
            print(f"{name:34} {res[0]:>10.0f} {res[1]:>10.0f}")
        s = p.stats()
        print(f"(events accepted {s['events_accepted']}, acked {s['events_acked']}, spilled {s['events_spilled']}, "
              f"lost {s['events_lost']})")


def bench_transitions(spec: Path, tasks: int) -> None:
    """The scheduler plugin's own cost: `tasks` keys through the five transitions of a
    no-op task (released->waiting->processing->memory->released->forgotten), called directly
    on the plugin with a stand-in scheduler (no Dask at work), a live handle acking."""
    import types

    import diaspora
    import diaspora.dask as dd

    p = diaspora.Plugin.open(spec)
    sp = dd.DiasporaSchedulerPlugin(plugin=p)
    ws = types.SimpleNamespace(address="tcp://127.0.0.1:1234", name=0)
    keys = [f"noop-{i:032x}" for i in range(tasks)]
    sp.scheduler = types.SimpleNamespace(tasks={k: types.SimpleNamespace(processing_on=ws) for k in keys},
                                         workers={ws.address: ws})
    t0 = time.perf_counter()
    for k in keys:
        sp.transition(k, "released", "waiting")
        sp.transition(k, "waiting", "processing")
        sp.transition(k, "processing", "memory")
        sp.transition(k, "memory", "released")
        sp.transition(k, "released", "forgotten")
    took = time.perf_counter() - t0
    assert p.wait_acked(60)
    s = p.stats()
    p.close()
    print(f"{tasks} tasks: {took / tasks * 1e6:.1f} us a task in the scheduler plugin (5 transitions, 3 events); "
          f"events accepted {s['events_accepted']}, lost {s['events_lost']}")


def noop(i):
    return i


def bench_dask(spec: Path, tasks: int, rounds: int, tmp: Path) -> None:
    """One LocalCluster; the scheduler plugin (with its live handle) is switched in and out
    of the scheduler between blocks of tasks, so that both sides share the cluster, its
    warm workers and the machine's moment: `rounds` blocks each of tasks / rounds tasks,
    alternated (without, with, without, ...). The worker plugin stays registered
    throughout (its heartbeat thread idles without executing tasks)."""
    import logging

    from distributed import Client, LocalCluster

    import diaspora
    import diaspora.dask as dd

    logging.getLogger("distributed").setLevel(logging.ERROR)
    per = max(1, tasks // rounds)
    times = {False: [], True: []}
    p = diaspora.Plugin.open(spec)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      host="127.0.0.1") as c, Client(c) as client:
        sp = dd.register(c.scheduler, plugin=p)
        c.scheduler.plugins.pop("diaspora")
        client.gather(client.map(noop, range(500), pure=False))  # warm
        print(f"{'block':8} {'without (tasks/s)':>20} {'with plugins (tasks/s)':>24}")
        for r in range(rounds):
            row = []
            for on in (False, True):
                if on:
                    c.scheduler.plugins["diaspora"] = sp
                t0 = time.perf_counter()
                client.gather(client.map(noop, range(r * per, (r + 1) * per), pure=False))
                times[on].append(time.perf_counter() - t0)
                if on:
                    time.sleep(0.5)  # the last transitions (released, forgotten) reach the plugin
                    c.scheduler.plugins.pop("diaspora")
                row.append(per / times[on][-1])
            print(f"{r + 1:<8} {row[0]:>20.0f} {row[1]:>24.0f}")
        s = p.stats()
    p.close()
    assert s["events_lost"] == 0, s
    tw, tp = per * rounds / sum(times[False]), per * rounds / sum(times[True])
    ratios = sorted(w / q for w, q in zip(times[False], times[True]))
    print(f"{'all':8} {tw:>20.0f} {tp:>24.0f}   with/without = {tp / tw:.3f} (median of the blocks' ratios "
          f"{statistics.median(ratios):.3f}; target >= 0.98)")
    print(f"(plugin: events accepted {s['events_accepted']}, acked {s['events_acked']}, lost {s['events_lost']})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--only", default="hooks,transitions,dask")
    args = ap.parse_args()
    only = set(args.only.split(","))
    with tempfile.TemporaryDirectory(prefix="bench-adapters-") as d:
        tmp = Path(d)
        relay, spec = relay_and_spec(tmp, Path(args.build))
        try:
            if "hooks" in only:
                print("-- Python hook cost (diaspora.Plugin over ctypes)")
                bench_hooks(spec, relay, args.calls)
                print()
            if "transitions" in only:
                print("-- the Dask scheduler plugin's own cost per task")
                bench_transitions(spec, args.tasks)
                print()
            if "dask" in only:
                print(f"-- Dask LocalCluster, {args.tasks} no-op tasks each way in {args.rounds} alternated blocks, "
                      "2 worker processes x 1 thread")
                bench_dask(spec, args.tasks, args.rounds, tmp)
        finally:
            relay.stop()


if __name__ == "__main__":
    main()
