"""What a task's own code calls while it runs under a Diaspora adapter (ResilientExecutor,
the Dask plugins): steps, progress and metrics that feed the policies, and cooperative
stopping. Outside an adapter every function is a cheap no-op, so the same code runs
anywhere.

    from diaspora import task

    def reconstruct(frames):
        for i, f in enumerate(frames):
            work(f)
            task.step()                   # step_time_s for the policies; raises
                                          # task.AttemptStopped if this attempt was stopped
            task.progress((i + 1) / len(frames), step=i)
            if task.checkpoint_requested():
                save_state()

The adapter wraps each attempt in `Call`, which reports "started" (with the worker's
host:pid), sends a heartbeat with the process's CPU use and memory every `heartbeat_s`
while the function runs, and listens for "stop" and "checkpoint" requests. Python cannot
interrupt a running function: an attempt that was stopped (restarted elsewhere, lost a
speculative race, cancelled) ends at its next step() call; one that never calls step()
runs to its end and its result is dropped.
"""

from __future__ import annotations

import os
import resource
import socket
import threading
import time

from .channel import Listener, Sender

_local = threading.local()
_PAGE = os.sysconf("SC_PAGE_SIZE")


class AttemptStopped(Exception):
    """Raised by step() in an attempt the adapter has stopped; let it propagate."""


class _Context:
    def __init__(self, task_id: str, attempt: int, address: str):
        self.task_id = task_id
        self.attempt = attempt
        self.address = address
        self.last_step = time.monotonic()
        self.stop = threading.Event()
        self.checkpoint = threading.Event()

    def send(self, kind: str, **fields) -> None:
        Sender.send(self.address, {"t": self.task_id, "a": self.attempt, "k": kind, **fields})

    def on_control(self, msg: dict) -> None:
        if msg.get("a") != self.attempt:
            return
        if msg.get("k") == "stop":
            self.stop.set()
        elif msg.get("k") == "checkpoint":
            self.checkpoint.set()


class EngineContext:
    """A task's reporting context where an engine runs the task itself (no `Call` around it,
    as in a Dask task): reports go to `address` under the task id; no stop or checkpoint
    channel. Engine adapters make these in their context hooks (set_context_hook)."""

    def __init__(self, task_id: str, address: str):
        self.task_id = task_id
        self.attempt = 0
        self.address = address
        self.last_step = time.monotonic()
        self.stop = threading.Event()
        self.checkpoint = threading.Event()

    def send(self, kind: str, **fields) -> None:
        Sender.send(self.address, {"t": self.task_id, "k": kind, **fields})


# The engine adapter's hook (None: none registered): returns the context of the task running
# on the calling thread, or None. This module knows no engine; each adapter module
# registers its own (diaspora.dask does in its worker plugin).
_context_hook = None


def set_context_hook(hook) -> None:
    """Registers `hook() -> EngineContext | None`, asked by step(), progress() and metric()
    on threads no `Call` runs on; None removes it. For engine adapters (one per process)."""
    global _context_hook
    _context_hook = hook


def _context():
    ctx = getattr(_local, "ctx", None)
    if ctx is not None:
        return ctx
    hook = _context_hook
    return hook() if hook is not None else None


def current() -> tuple[str, int] | None:
    """(task id, attempt) of the attempt running on this thread, or None."""
    ctx = getattr(_local, "ctx", None)
    return None if ctx is None else (ctx.task_id, ctx.attempt)


def step(**metrics: float) -> None:
    """Marks the end of one step of work: sends a heartbeat with `step_time_s` (the time
    since the previous step, or since the attempt started) and `metrics`. Raises
    AttemptStopped when the adapter has stopped this attempt."""
    ctx = _context()
    if ctx is None:
        return
    now = time.monotonic()
    m = {"step_time_s": now - ctx.last_step}
    ctx.last_step = now
    m.update({k: float(v) for k, v in metrics.items()})
    ctx.send("hb", m=m)
    if ctx.stop.is_set():
        raise AttemptStopped(f"attempt {ctx.attempt} of {ctx.task_id} was stopped by the adapter")


def progress(fraction: float, step: int | None = None) -> None:
    """Fraction done in [0, 1] (and the step number): feeds task.progress_rate and the
    deadline forecast."""
    ctx = _context()
    if ctx is not None:
        ctx.send("progress", p=min(1.0, max(0.0, float(fraction))), s=-1 if step is None else int(step))


def metric(name: str, value: float) -> None:
    """A task metric (task.<name> signal)."""
    ctx = _context()
    if ctx is not None:
        ctx.send("hb", m={name: float(value)})


def checkpoint_requested() -> bool:
    """True once after the adapter received a `checkpoint` action for this task."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None or not ctx.checkpoint.is_set():
        return False
    ctx.checkpoint.clear()
    return True


def resource_sample(prev: list[float]) -> dict[str, float]:
    """The process's CPU use (cores since the previous sample) and resident memory (MiB), as
    heartbeat metrics; `prev` holds [cpu seconds, monotonic time] between calls. For
    adapters' heartbeats."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    cpu = ru.ru_utime + ru.ru_stime
    now = time.monotonic()
    cores = (cpu - prev[0]) / (now - prev[1]) if now > prev[1] else 0.0
    prev[0], prev[1] = cpu, now
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * _PAGE
    except OSError:
        rss = ru.ru_maxrss * 1024
    return {"cpu_cores": max(0.0, cores), "rss_mib": rss / 2**20}


class _Agent:
    """What one worker process keeps for every attempt it runs (made on the first Call in
    the process, again after a fork): one control listener that hands "stop" and
    "checkpoint" to the attempt named, and one heartbeat thread that sends a heartbeat with
    the process's CPU and memory for each attempt running, every `heartbeat_s`. So an
    attempt costs two datagrams (started, ended), not a socket and a thread."""

    _lock = threading.Lock()
    _current: "_Agent | None" = None

    def __init__(self, heartbeat_s: float):
        self.pid = os.getpid()
        self.worker = f"{socket.gethostname()}:{self.pid}"  # what "started" says of this process
        self.heartbeat_s = heartbeat_s
        self.running: dict[tuple[str, int], _Context] = {}
        self.control = Listener(self._on_control, tag="attempt")
        self._prev = [0.0, time.monotonic()]
        resource_sample(self._prev)
        threading.Thread(target=self._beat, name="diaspora-heartbeat", daemon=True).start()

    @classmethod
    def get(cls, heartbeat_s: float) -> "_Agent":
        with cls._lock:
            a = cls._current
            if a is None or a.pid != os.getpid():
                a = cls._current = _Agent(heartbeat_s)
            a.heartbeat_s = min(a.heartbeat_s, heartbeat_s)
            return a

    def _on_control(self, msg: dict) -> None:
        ctx = self.running.get((msg.get("t"), msg.get("a")))
        if ctx is not None:
            ctx.on_control(msg)

    def _beat(self) -> None:
        while True:
            time.sleep(self.heartbeat_s)
            running = list(self.running.values())
            if running:
                m = resource_sample(self._prev)
                for ctx in running:
                    ctx.send("hb", m=m)


class Call:
    """The attempt wrapper an adapter submits instead of `fn` (picklable when `fn` is).
    In the worker it reports started / heartbeats / ended, runs fn(*args, **kwargs) with
    this module's functions bound to the attempt, and returns its result."""

    def __init__(self, fn, task_id: str, attempt: int, address: str | None, heartbeat_s: float = 1.0):
        self.fn = fn
        self.task_id = task_id
        self.attempt = attempt
        self.address = address
        self.heartbeat_s = heartbeat_s

    def __call__(self, *args, **kwargs):
        if not self.address:
            return self.fn(*args, **kwargs)
        agent = _Agent.get(self.heartbeat_s)
        ctx = _Context(self.task_id, self.attempt, self.address)
        key = (self.task_id, self.attempt)
        outer = getattr(_local, "ctx", None)
        _local.ctx = ctx
        agent.running[key] = ctx
        ctx.send("started", w=agent.worker, pp=os.getppid(), ctl=agent.control.address)
        try:
            return self.fn(*args, **kwargs)
        finally:
            agent.running.pop(key, None)
            _local.ctx = outer
            ctx.send("ended")  # the worker process is free of this attempt (process_control)

    def __repr__(self) -> str:
        return f"diaspora.task.Call({getattr(self.fn, '__name__', self.fn)!r}, {self.task_id!r}, attempt {self.attempt})"
