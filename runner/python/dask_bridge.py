"""`diaspora run`'s bridge to Dask: how an `engine: dask` site runs its attempts.

The runner (C++) starts one bridge per Dask site:

    .venv/bin/python runner/python/dask_bridge.py --site NAME --endpoint local|tcp://HOST:PORT
                                    --workers N --fd 3 [--restrict ADDR,ADDR...]
                                    [--connect-timeout SECONDS]

`endpoint: local` starts a LocalCluster of N single-threaded worker processes on 127.0.0.1
(stopped when the bridge ends); `tcp://` joins a running scheduler. Each attempt the runner
places on the site becomes one Dask task (key = the attempt's name and its launch key) that
runs the one-shot worker `diaspora-run __worker --connect ... --key ...` as a child of the
Dask worker process. That child connects back to the runner and runs the attempt; the Dask
task returns its exit status. With `--restrict`, tasks run only on those workers.

Protocol: newline-delimited JSON on the socket at `--fd`.
    runner -> bridge: {"op":"launch","key","name","argv":[...],"env":["K=V",...]}
                      {"op":"cancel","key"}
    bridge -> runner: {"op":"ready","scheduler":ADDRESS,"workers":COUNT}
                      {"op":"error","reason"}                (could not start; it exits)
                      {"op":"ended","key","reason"}           (the Dask task finished)
The runner closing the socket ends the bridge: what is still out is cancelled, the client
(and the LocalCluster) closed. Worker processes started by a LocalCluster are children of
the bridge; the runner's SIGTERM (its parent-death signal) closes them too.

The one-shot worker gets DIASPORA_ENGINE_WORKER_PID (the Dask worker's pid, for the runner's
kill-worker fault) and dies with the Dask worker (PR_SET_PDEATHSIG), as a task would.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def run_worker(argv: list[str], env: list[str]) -> int:
    """The Dask task of one attempt: runs the one-shot worker and returns its exit status
    (negative: the signal that killed it). Runs on a Dask worker thread."""
    e = dict(os.environ)
    e.update(kv.split("=", 1) for kv in env)
    e["DIASPORA_ENGINE_WORKER_PID"] = str(os.getpid())
    p = subprocess.Popen(argv, env=e, preexec_fn=_die_with_parent, stdin=subprocess.DEVNULL)
    return p.wait()


def start(ap: argparse.ArgumentParser, argv: list[str] | None):
    """Parses a bridge's arguments (--site, --workers, --fd and the engine's own `ap` has)
    and opens the runner's socket; SIGTERM then exits through the callers' finally."""
    ap.add_argument("--site", required=True)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--fd", type=int, default=3)
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    return a, socket.socket(fileno=a.fd)


def send_error(sock: socket.socket, reason: str) -> int:
    """Tells the runner the engine could not start ({"op":"error"}); returns the exit status 1."""
    sock.sendall((json.dumps({"op": "error", "reason": reason}) + "\n").encode())
    return 1


def send_missing(sock: socket.socket, package: str, e: ImportError) -> int:
    """send_error for an engine this Python cannot import."""
    return send_error(sock, f"{package} is not installed for {sys.executable} ({e}); scripts/install-deps.sh installs "
                            "it into .venv, DIASPORA_PYTHON names another Python")


class Bridge:
    """The runner's side of the protocol over one engine (parsl_bridge.py subclasses it):
    launch() submits with submit(), ended() reports each end once, cancel() drops a launch."""

    engine = "Dask"

    def __init__(self, sock: socket.socket, client, restrict: list[str] | None):
        self.sock = sock
        self.client = client
        self.restrict = restrict
        self.futures: dict = {}
        self.lock = threading.Lock()  # the socket: done callbacks write from Dask's thread

    def send(self, msg: dict) -> None:
        data = (json.dumps(msg) + "\n").encode()
        with self.lock:
            try:
                self.sock.sendall(data)
            except OSError:
                pass  # the runner is gone: the read loop ends

    def ended(self, key: str, fut) -> None:
        with self.lock:
            if self.futures.pop(key, None) is None:
                return  # cancelled by the runner: it knows
        if fut.cancelled():
            reason = f"the {self.engine} task was cancelled"
        elif fut.exception() is not None:
            reason = f"the {self.engine} task failed: {type(fut.exception()).__name__}: {fut.exception()}"
        else:
            rc = fut.result()
            reason = ("the worker exited with status %d" % rc) if rc >= 0 else \
                ("the worker was killed by signal %d (%s)" % (-rc, signal.Signals(-rc).name))
        self.send({"op": "ended", "key": key, "reason": reason})

    def submit(self, msg: dict):
        """The engine's Future of one launch."""
        dask_key = f"diaspora-{msg.get('name', 'attempt')}-{msg['key'][:8]}"
        return self.client.submit(run_worker, list(msg["argv"]), list(msg.get("env", [])), key=dask_key, pure=False,
                                  retries=0, workers=self.restrict, allow_other_workers=False)

    def launch(self, msg: dict) -> None:
        key = msg["key"]
        fut = self.submit(msg)
        with self.lock:
            self.futures[key] = fut
        fut.add_done_callback(lambda f, k=key: self.ended(k, f))

    def cancel(self, key: str) -> None:
        with self.lock:
            fut = self.futures.pop(key, None)
        if fut is not None:
            fut.cancel()

    def serve(self) -> None:
        buf = b""
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                op = msg.get("op")
                if op == "launch":
                    try:
                        self.launch(msg)
                    except Exception as e:  # noqa: BLE001 -- reported to the runner as the launch's end
                        self.send({"op": "ended", "key": msg.get("key", ""),
                                   "reason": f"{self.engine} refused the task: {e}"})
                elif op == "cancel":
                    self.cancel(msg.get("key", ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dask_bridge.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", default="local")
    ap.add_argument("--restrict", default="")
    ap.add_argument("--connect-timeout", type=float, default=30)
    a, sock = start(ap, argv)

    try:
        from distributed import Client, LocalCluster
    except ImportError as e:
        return send_missing(sock, "distributed", e)
    cluster = client = None
    bridge = None
    try:
        try:
            if a.endpoint == "local":
                cluster = LocalCluster(n_workers=a.workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                       dashboard_address=None, silence_logs=logging.WARNING)
                client = Client(cluster)
            else:
                client = Client(a.endpoint, timeout=a.connect_timeout)
        except Exception as e:  # noqa: BLE001 -- any failure to reach Dask is the site's error
            return send_error(sock, f"{type(e).__name__}: {e}")
        restrict = [w for w in a.restrict.split(",") if w] or None
        bridge = Bridge(sock, client, restrict)
        info = client.scheduler_info()
        bridge.send({"op": "ready", "scheduler": info.get("address", a.endpoint), "workers": len(info.get("workers", {}))})
        print(f"dask_bridge: site {a.site} on {info.get('address')}, {len(info.get('workers', {}))} workers",
              file=sys.stderr, flush=True)
        bridge.serve()
        return 0
    finally:
        if bridge is not None:
            for key in list(bridge.futures):
                bridge.cancel(key)
        if client is not None:
            client.close(timeout=10)
        if cluster is not None:
            cluster.close(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
