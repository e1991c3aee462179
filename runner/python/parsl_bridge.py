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

What else it survives: a lost block (its manager, the node) is replaced by the poller (the
simple strategy, no block error handler); a manager that died alone leaves workers that are
killed when the bridge ends; an interchange that exited is replaced by a new HTEX in
DIR/restart-N (up to MAX_RESTARTS), what the old one held reported ended. Each event is a
line of the site's log (stderr).
"""

from __future__ import annotations

import argparse
import os
import shutil
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
MAX_RESTARTS = 3  # new HTEXes after an interchange died, before the site is given up


def start_htex(site: str, workers: int, run_dir: str):
    """Starts an HTEX of `workers` workers on one LocalProvider block in `run_dir` and its
    JobStatusPoller; returns (htex, poller) once the block's manager has joined (its workers
    run). Raises RuntimeError (what to read) when none joins within MANAGER_TIMEOUT_S."""
    from parsl.executors import HighThroughputExecutor
    from parsl.executors.high_throughput.executor import DEFAULT_INTERCHANGE_LAUNCH_CMD
    from parsl.jobs.job_status_poller import JobStatusPoller
    from parsl.providers import LocalProvider
    # The interchange dies with the thread that started it (setpriv --pdeathsig: util-linux):
    # a bridge that is killed leaves no interchange for its block's manager to stay with.
    launch = list(DEFAULT_INTERCHANGE_LAUNCH_CMD)
    if shutil.which("setpriv"):
        launch = ["setpriv", "--pdeathsig", "KILL", *launch]
    htex = HighThroughputExecutor(label=site, address="127.0.0.1", max_workers_per_node=workers,
                                  interchange_launch_cmd=launch,
                                  cores_per_worker=1.0 / max(1, workers), heartbeat_period=HEARTBEAT_PERIOD_S,
                                  heartbeat_threshold=HEARTBEAT_THRESHOLD_S,
                                  # a lost block is replaced, not the executor failed for good
                                  # (Parsl's default error handler would refuse every later
                                  # task once its one block failed)
                                  block_error_handler=False,
                                  provider=LocalProvider(init_blocks=1, min_blocks=1, max_blocks=1))
    htex.run_dir = os.path.abspath(run_dir)
    htex.provider.script_dir = os.path.join(htex.run_dir, "submit_scripts")
    os.makedirs(htex.provider.script_dir, exist_ok=True)
    htex.start()
    poller = JobStatusPoller(strategy="simple", max_idletime=120.0, strategy_period=STRATEGY_PERIOD_S)
    poller.add_executors([htex])
    # Ready once the block's manager has joined (its workers run), as a local site's workers
    # run when it is ready: the run's clock (and its faults' `at`) starts then.
    deadline = time.monotonic() + MANAGER_TIMEOUT_S
    while not htex.connected_managers():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no HTEX manager joined within {MANAGER_TIMEOUT_S:.0f} s (the block's output: "
                               f"{htex.provider.script_dir}/*.err)")
        time.sleep(0.05)
    return htex, poller


class ParslBridge(Bridge):
    engine = "Parsl"

    def __init__(self, sock: socket.socket, site: str, workers: int, run_dir: str, htex, poller):
        super().__init__(sock, None, None)
        self.site, self.workers, self.run_dir = site, workers, run_dir
        self.htex, self.poller = htex, poller
        self.htex_lock = threading.Lock()  # submit() against a replacement of the HTEX
        self.restarts = 0
        self.groups: set[int] = set()  # the process groups of the blocks started (watch())
        self.note_groups()

    def log(self, line: str) -> None:
        print(f"parsl_bridge: site {self.site}: {line}", file=sys.stderr, flush=True)

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
        site's block name (JOBNAME=parsl.SITE.block-N, which LocalProvider exports), so a
        group id taken again by some other process is never hit."""
        mark = f"JOBNAME=parsl.{self.site}.block-".encode()
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                if os.getpgid(int(d)) in self.groups and mark in open(f"/proc/{d}/environ", "rb").read():
                    os.kill(int(d), signal.SIGKILL)
            except OSError:
                pass

    def submit(self, msg: dict):
        with self.htex_lock:
            return self.htex.submit(run_worker, {}, list(msg["argv"]), list(msg.get("env", [])))

    def cancel(self, key: str) -> None:
        with self.lock:
            self.futures.pop(key, None)  # HTEX has no cancel: forgotten, its end is not reported

    def replace_htex(self, status: int) -> bool:
        """The interchange exited (killed, crashed): nothing sent to this HTEX will run. Its
        blocks are killed (their attempts' workers die: the runner restarts them), every
        launch it held is reported ended, and a new HTEX starts in RUN_DIR/restart-N (the old
        one is abandoned: its poller and result thread would wait on the dead interchange).
        False when MAX_RESTARTS are used up or the new one does not start: the bridge ends."""
        why = f"the HTEX interchange exited (status {status})"
        with self.htex_lock:
            self.kill_groups()
            self.groups.clear()
            with self.lock:
                lost, self.futures = list(self.futures), {}
            for key in lost:
                self.send({"op": "ended", "key": key, "reason": why})
            if self.restarts >= MAX_RESTARTS:
                self.log(f"{why}; {MAX_RESTARTS} restarts used up: the site is given up")
                return False
            self.restarts += 1
            run_dir = os.path.join(self.run_dir, f"restart-{self.restarts}")
            self.log(f"{why}; {len(lost)} launches ended; starting another HTEX in {run_dir} "
                     f"(restart {self.restarts} of {MAX_RESTARTS})")
            try:
                self.htex, self.poller = start_htex(self.site, self.workers, run_dir)
            except Exception as e:  # noqa: BLE001 -- reported, then the bridge ends
                self.log(f"the new HTEX did not start: {type(e).__name__}: {e}")
                return False
            self.note_groups()
            self.log("the new HTEX is ready")
            return True

    def watch(self, stop: threading.Event) -> None:
        """Every STRATEGY_PERIOD_S: notes the blocks' process groups, writes each change of a
        block's state to the site's log (a block that failed, its node lost, and the one the
        poller started instead) and replaces the HTEX when its interchange has exited. When
        the site is given up, the runner's socket is shut: serve() ends, the runner sees the
        bridge exit and fails what it had out."""
        seen: dict[str, str] = {}
        while not stop.wait(STRATEGY_PERIOD_S):
            self.note_groups()
            status = self.htex.interchange_proc.poll() if self.htex.interchange_proc is not None else None
            if status is not None:
                seen = {}
                if not self.replace_htex(status):
                    self.sock.shutdown(socket.SHUT_RDWR)
                    return
                continue
            try:
                now = {bid: js.state.name for bid, js in dict(self.htex.status_facade).items()}
            except Exception:  # noqa: BLE001 -- the poller replaces the dict meanwhile: next round
                continue
            for bid, state in sorted(now.items()):
                if seen.get(bid) != state:
                    self.log(f"block {bid} {state}")
            seen = now


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="parsl_bridge.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--run-dir", required=True)
    a, sock = start(ap, argv)

    try:
        import parsl  # noqa: F401
    except ImportError as e:
        return send_missing(sock, "Parsl", e)
    # The HTEX processes: interchange.py and process_worker_pool.py are scripts of this
    # Python's environment; its workers import run_worker from this folder.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH", "")) if p)
    htex = poller = bridge = None
    try:
        try:
            htex, poller = start_htex(a.site, a.workers, a.run_dir)
        except Exception as e:  # noqa: BLE001 -- any failure to start HTEX is the site's error
            return send_error(sock, str(e) if isinstance(e, RuntimeError) else f"{type(e).__name__}: {e}")
        bridge = ParslBridge(sock, a.site, a.workers, a.run_dir, htex, poller)
        bridge.send({"op": "ready", "scheduler": f"HTEX interchange (run dir {htex.run_dir})", "workers": a.workers})
        print(f"parsl_bridge: site {a.site}, HTEX with {a.workers} workers, run dir {htex.run_dir}",
              file=sys.stderr, flush=True)
        stop = threading.Event()
        threading.Thread(target=bridge.watch, args=(stop,), daemon=True).start()
        try:
            bridge.serve()
        finally:
            stop.set()
        return 0
    finally:
        if bridge is not None:
            htex, poller = bridge.htex, bridge.poller  # the one in use (a replaced one is abandoned)
        # One whose interchange is dead is abandoned too: its poller and shutdown would wait
        # on it; kill_groups() ends its blocks.
        alive = htex is not None and htex.interchange_proc is not None and htex.interchange_proc.poll() is None
        if poller is not None and alive:
            poller.close()  # scales the block in (its manager and workers end)
        if alive:
            htex.shutdown()
        if bridge is not None:
            bridge.kill_groups()  # what a failed block left (scale-in ended the others)


if __name__ == "__main__":
    try:
        rc = main()
    except SystemExit as e:  # SIGTERM (start()) exits through main's finally
        rc = e.code if isinstance(e.code, int) else 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # not sys.exit: an abandoned HTEX's threads must not hold the exit
