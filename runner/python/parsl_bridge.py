"""`diaspora run`'s bridge to Parsl: how an `engine: parsl` site runs its attempts.

The runner (C++) starts one bridge per Parsl site:

    .venv/bin/python runner/python/parsl_bridge.py --site NAME --workers N --fd 3 --run-dir DIR

It starts a real Parsl HighThroughputExecutor (an interchange, a LocalProvider block of one
manager with N workers on 127.0.0.1, encrypted, usage tracking off), as Globus Compute's
engine starts one: its run directory DIR, Parsl's JobStatusPoller for the block. Each
attempt the runner places on the site becomes one HTEX task that runs the one-shot worker
`diaspora-run __worker --connect ... --key ...` as a child of the HTEX worker process (the
function `run_worker` of dask_bridge.py, beside this file). That child connects back to the
runner and runs the attempt; the HTEX task returns its exit status.

The protocol on the socket at `--fd` is dask_bridge.py's (launch, cancel; ready, error,
ended). HTEX cannot cancel a task: a cancelled launch is forgotten here (no "ended"), and if
it starts later its one-shot worker finds its key unknown to the runner and exits. The
runner closing the socket ends the bridge: the block is scaled in and the executor shut
down. A killed HTEX worker (the runner's kill-worker fault: DIASPORA_ENGINE_WORKER_PID) is
replaced by its manager within HEARTBEAT_PERIOD_S; its task ends with Parsl's WorkerLost.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dask_bridge import Bridge, run_worker, send_error, send_missing, start  # noqa: E402  (the protocol; run_worker is pickled by reference)

MANAGER_TIMEOUT_S = 80.0  # for the block's manager to join (the runner waits 90 s for "ready")
# How often the manager's watchdog looks at its workers (and the manager and interchange
# exchange heartbeats). Parsl's default is 30 s: a killed worker process would leave the
# site one worker short, and its task unanswered (WorkerLost), for up to 30 s.
HEARTBEAT_PERIOD_S = 2
# When the interchange gives a silent manager up (Parsl's default 120 s) and fails the
# tasks it held (ManagerLost). A manager's running attempts do not wait for it: their
# workers run on and report to the runner themselves.
HEARTBEAT_THRESHOLD_S = 30
# How often the JobStatusPoller looks at the block and, when it has failed (its manager, the
# node, was lost), starts another (strategy "simple" keeps min_blocks = 1 while tasks wait).
STRATEGY_PERIOD_S = 2.0


class ParslBridge(Bridge):
    engine = "Parsl"

    def __init__(self, sock: socket.socket, htex):
        super().__init__(sock, None, None)
        self.htex = htex
        self.groups: set[int] = set()  # the process groups of the blocks started (watch_blocks)

    def note_groups(self) -> None:
        """Remembers the process group of each block LocalProvider started while its script
        runs: a block whose manager alone died leaves workers (waiting forever on the dead
        manager's queues) in that group, which kill_groups() ends."""
        for job in list(self.htex.provider.resources.values()):
            try:
                self.groups.add(os.getpgid(job["remote_pid"]))
            except (OSError, KeyError, TypeError):
                pass

    def kill_groups(self) -> None:
        """SIGKILLs what is left in the blocks' process groups: only processes that carry this
        executor's block name (JOBNAME=parsl.LABEL.block-N, which LocalProvider exports), so
        a group id taken again by some other process is never hit."""
        mark = f"JOBNAME=parsl.{self.htex.label}.block-".encode()
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                if os.getpgid(int(d)) in self.groups and mark in open(f"/proc/{d}/environ", "rb").read():
                    os.kill(int(d), signal.SIGKILL)
            except OSError:
                pass

    def submit(self, msg: dict):
        return self.htex.submit(run_worker, {}, list(msg["argv"]), list(msg.get("env", [])))

    def cancel(self, key: str) -> None:
        with self.lock:
            self.futures.pop(key, None)  # HTEX has no cancel: forgotten, its end is not reported

    def watch_blocks(self, site: str, stop: threading.Event) -> None:
        """Writes each change of the site's blocks' states to the site's log (stderr): a block
        that failed (its node lost) and the one the poller started instead."""
        seen: dict[str, str] = {}
        while not stop.wait(STRATEGY_PERIOD_S):
            self.note_groups()
            try:
                now = {bid: js.state.name for bid, js in dict(self.htex.status_facade).items()}
            except Exception:  # noqa: BLE001 -- the poller replaces the dict meanwhile: next round
                continue
            for bid, state in sorted(now.items()):
                if seen.get(bid) != state:
                    print(f"parsl_bridge: site {site}: block {bid} {state}", file=sys.stderr, flush=True)
            seen = now


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="parsl_bridge.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--run-dir", required=True)
    a, sock = start(ap, argv)

    try:
        from parsl.executors import HighThroughputExecutor
        from parsl.jobs.job_status_poller import JobStatusPoller
        from parsl.providers import LocalProvider
    except ImportError as e:
        return send_missing(sock, "Parsl", e)
    # The HTEX processes: interchange.py and process_worker_pool.py are scripts of this
    # Python's environment; its workers import run_worker from this folder.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH", "")) if p)
    htex = poller = bridge = None
    try:
        try:
            htex = HighThroughputExecutor(label=a.site, address="127.0.0.1", max_workers_per_node=a.workers,
                                          cores_per_worker=1.0 / max(1, a.workers), heartbeat_period=HEARTBEAT_PERIOD_S,
                                          heartbeat_threshold=HEARTBEAT_THRESHOLD_S,
                                          # a lost block is replaced, not the executor failed
                                          # for good (Parsl's default error handler would
                                          # refuse every later task once its one block failed)
                                          block_error_handler=False,
                                          provider=LocalProvider(init_blocks=1, min_blocks=1, max_blocks=1))
            htex.run_dir = os.path.abspath(a.run_dir)
            htex.provider.script_dir = os.path.join(htex.run_dir, "submit_scripts")
            os.makedirs(htex.provider.script_dir, exist_ok=True)
            htex.start()
            poller = JobStatusPoller(strategy="simple", max_idletime=120.0, strategy_period=STRATEGY_PERIOD_S)
            poller.add_executors([htex])
            # Ready once the block's manager has joined (its workers run), as a local site's
            # workers run when it is ready: the run's clock (and its faults' `at`) starts then.
            deadline = time.monotonic() + MANAGER_TIMEOUT_S
            while not htex.connected_managers():
                if time.monotonic() > deadline:
                    return send_error(sock, f"no HTEX manager joined within {MANAGER_TIMEOUT_S:.0f} s (the block's "
                                            f"output: {htex.provider.script_dir}/*.err)")
                time.sleep(0.05)
        except Exception as e:  # noqa: BLE001 -- any failure to start HTEX is the site's error
            return send_error(sock, f"{type(e).__name__}: {e}")
        bridge = ParslBridge(sock, htex)
        bridge.note_groups()
        bridge.send({"op": "ready", "scheduler": f"HTEX interchange (run dir {htex.run_dir})", "workers": a.workers})
        print(f"parsl_bridge: site {a.site}, HTEX with {a.workers} workers, run dir {htex.run_dir}",
              file=sys.stderr, flush=True)
        stop = threading.Event()
        threading.Thread(target=bridge.watch_blocks, args=(a.site, stop), daemon=True).start()
        try:
            bridge.serve()
        finally:
            stop.set()
        return 0
    finally:
        if poller is not None:
            poller.close()  # scales the block in (its manager and workers end)
        if htex is not None:
            htex.shutdown()
        if bridge is not None:
            bridge.kill_groups()  # what a failed block left (scale-in ended the others)


if __name__ == "__main__":
    sys.exit(main())
