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


class Call:
    """The attempt wrapper an adapter submits instead of `fn` (picklable when `fn` is).
    In the worker it reports started / heartbeats, runs fn(*args, **kwargs) with this
    module's functions bound to the attempt, and returns its result."""

    def __init__(self, fn, task_id: str, attempt: int, address: str | None, heartbeat_s: float = 1.0):
        self.fn = fn
        self.task_id = task_id
        self.attempt = attempt
        self.address = address
        self.heartbeat_s = heartbeat_s

    def __call__(self, *args, **kwargs):
        if not self.address:
            return self.fn(*args, **kwargs)
        ctx = _Context(self.task_id, self.attempt, self.address)
        control = Listener(ctx.on_control, tag="attempt")
        done = threading.Event()
        prev = [0.0, time.monotonic()]
        resource_sample(prev)

        def beat():
            while not done.wait(self.heartbeat_s):
                ctx.send("hb", m=resource_sample(prev))

        outer = getattr(_local, "ctx", None)
        _local.ctx = ctx
        ctx.send("started", w=f"{socket.gethostname()}:{os.getpid()}", pp=os.getppid(), ctl=control.address)
        hb = threading.Thread(target=beat, name="diaspora-heartbeat", daemon=True)
        hb.start()
        try:
            return self.fn(*args, **kwargs)
        finally:
            done.set()
            hb.join(timeout=2)
            _local.ctx = outer
            control.close()
            ctx.send("ended")  # the worker process is free of this attempt (process_control)

    def __repr__(self) -> str:
        return f"diaspora.task.Call({getattr(self.fn, '__name__', self.fn)!r}, {self.task_id!r}, attempt {self.attempt})"
