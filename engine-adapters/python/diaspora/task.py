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

The adapter wraps each attempt in `Runner`, which reports "started" (with the worker's
host:pid), sends a heartbeat with the process's CPU use and memory every `heartbeat_s`
while the function runs, and listens for "stop" and "checkpoint" requests. Python cannot
interrupt a running function: an attempt that was stopped (restarted elsewhere, lost a
speculative race, cancelled) ends at its next step() call; one that never calls step()
runs to its end and its result is dropped.
"""

from __future__ import annotations

import os
import resource
import signal
import threading
import time

from .channel import Listener, Sender, host_name, new_udp_address, parse_udp, route_to

_local = threading.local()
_PAGE = os.sysconf("SC_PAGE_SIZE")


class AttemptStopped(Exception):
    """Raised by step() in an attempt the adapter has stopped; let it propagate."""


class _Context:
    """One attempt running in this process (made by Runner)."""

    def __init__(self, task_id: str, attempt: int, address: str, agent: "_Agent"):
        self.task_id = task_id
        self.attempt = attempt
        self.address = address
        self.agent = agent
        self.began = time.monotonic()
        self.began_us = time.time_ns() // 1000
        self.last_step = self.began
        self.announced = False  # "started" sent (by the agent, or by the first report)
        self.stopped = False  # set by the control listener's thread, read by step()
        self.checkpoint_asked = False

    def send(self, kind: str, **fields) -> None:
        """A report of the attempt's code: the attempt is announced first if it was not yet."""
        if not self.announced:
            self.agent.announce(self)
        self.report(kind, **fields)

    def report(self, kind: str, **fields) -> None:
        Sender.send(self.address, {"t": self.task_id, "a": self.attempt, "k": kind, **fields})

    def on_control(self, msg: dict) -> None:
        if msg.get("a") != self.attempt:
            return
        if msg.get("k") == "stop":
            self.stopped = True
        elif msg.get("k") == "checkpoint":
            self.checkpoint_asked = True


class EngineContext:
    """A task's reporting context where an engine runs the task itself (no `Runner` around it,
    as in a Dask task): reports go to `address` under the task id; no stop or checkpoint
    channel. Engine adapters make these in their context hooks (set_context_hook)."""

    def __init__(self, task_id: str, address: str):
        self.task_id = task_id
        self.attempt = 0
        self.address = address
        self.last_step = time.monotonic()
        self.stopped = False  # set by the control listener's thread, read by step()
        self.checkpoint_asked = False

    def send(self, kind: str, **fields) -> None:
        Sender.send(self.address, {"t": self.task_id, "k": kind, **fields})


# The engine adapter's hook (None: none registered): returns the context of the task running
# on the calling thread, or None. This module knows no engine; each adapter module
# registers its own (diaspora.dask does in its worker plugin).
_context_hook = None


def set_context_hook(hook) -> None:
    """Registers `hook() -> EngineContext | None`, asked by step(), progress() and metric()
    on threads no `Runner` runs on; None removes it. For engine adapters (one per process)."""
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
    if ctx.stopped:
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
    if ctx is None or not ctx.checkpoint_asked:
        return False
    ctx.checkpoint_asked = False
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


ANNOUNCE_AFTER_S = 0.02


class _Agent:
    """What one worker process keeps for every attempt it runs (made on the first Runner call in
    the process, again after a fork): one control listener that hands "stop" and
    "checkpoint" to the attempt named, and one thread that reports. An attempt is announced
    ("started", with the worker, its manager, the control address and the time it began)
    ANNOUNCE_AFTER_S after it began, or at its first report if that comes sooner; an attempt
    that ends before that is never announced here and costs no datagram at all (the adapter
    reports it started when its result arrives). An announced attempt gets a heartbeat with
    the process's CPU and memory every `heartbeat_s`, and "ended" when it ends. A "kill" for
    an attempt still running here ends the process (SIGKILL; the engine starts a new worker):
    how an adapter frees the slot of a hung attempt on another host.

    One agent per transport: reports to a UNIX address get a UNIX control listener; reports
    to "udp://HOST:PORT/KEY" a UDP one under the same key, on the interface that reaches HOST."""

    _lock = threading.Lock()
    _agents: dict[str, "_Agent"] = {}  # "unix", or the UDP key: the agent of that transport

    def __init__(self, heartbeat_s: float, address: str):
        self.pid = os.getpid()
        self.worker = f"{host_name()}:{self.pid}"  # what "started" says of this process
        self.heartbeat_s = heartbeat_s
        self.running: dict[tuple[str, int], _Context] = {}
        self.lock = threading.Lock()  # running, and each attempt's announced / ended order
        self.sleeping = False
        self.wake = threading.Event()
        if address.startswith("udp://"):
            ctl = new_udp_address(route_to(address), key=parse_udp(address)[2].hex())
            self.control = Listener(self._on_control, address=ctl)
        else:
            self.control = Listener(self._on_control, tag="attempt")
        self._prev = [0.0, time.monotonic()]
        resource_sample(self._prev)
        threading.Thread(target=self._report, name="diaspora-heartbeat", daemon=True).start()

    @classmethod
    def get(cls, heartbeat_s: float, address: str) -> "_Agent":
        kind = address.rpartition("/")[2] if address.startswith("udp://") else "unix"
        a = cls._agents.get(kind)
        if a is not None and a.pid == os.getpid() and a.heartbeat_s <= heartbeat_s:
            return a
        with cls._lock:
            a = cls._agents.get(kind)
            if a is None or a.pid != os.getpid():
                a = cls._agents[kind] = _Agent(heartbeat_s, address)
            a.heartbeat_s = min(a.heartbeat_s, heartbeat_s)
            return a

    def begin(self, ctx: _Context) -> None:
        with self.lock:
            self.running[(ctx.task_id, ctx.attempt)] = ctx
        if self.sleeping:
            self.wake.set()

    def end(self, ctx: _Context) -> None:
        with self.lock:
            self.running.pop((ctx.task_id, ctx.attempt), None)
            if ctx.announced:  # under the lock: "ended" never overtakes "started"
                ctx.report("ended")

    def announce(self, ctx: _Context) -> None:
        with self.lock:
            self._announce(ctx)

    def _announce(self, ctx: _Context) -> None:
        if not ctx.announced:
            ctx.announced = True
            ctx.report("started", w=self.worker, pp=os.getppid(), ctl=self.control.address, s=ctx.began_us)

    def _on_control(self, msg: dict) -> None:
        ctx = self.running.get((msg.get("t"), msg.get("a")))
        if ctx is None:
            return
        if msg.get("k") == "kill":  # the attempt is still running in this process: end it
            os.kill(os.getpid(), signal.SIGKILL)
        ctx.on_control(msg)

    def _report(self) -> None:
        next_beat = time.monotonic() + self.heartbeat_s
        idle_since = time.monotonic()
        while True:
            if self.running:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= self.heartbeat_s:  # idle a while: no 50 Hz wake-ups
                self.sleeping = True
                if not self.running:
                    self.wake.wait()  # until an attempt begins
                self.wake.clear()
                self.sleeping = False
                idle_since = time.monotonic()
            time.sleep(ANNOUNCE_AFTER_S)
            now = time.monotonic()
            beat = now >= next_beat
            with self.lock:
                for ctx in list(self.running.values()):
                    if now - ctx.began >= ANNOUNCE_AFTER_S:
                        self._announce(ctx)
                announced = [c for c in self.running.values() if c.announced] if beat else []
            if beat:
                next_beat = now + self.heartbeat_s
                if announced:
                    m = resource_sample(self._prev)
                    for ctx in announced:
                        ctx.report("hb", m=m)


class Runner:
    """The wrapper an adapter submits instead of `fn` (picklable when `fn` is), called as
    runner((task_id, attempt number), *args, **kwargs). In the worker it reports started /
    heartbeats / ended, runs fn(*args, **kwargs) with this module's functions bound to the
    attempt, and returns its result. One Runner serves every attempt of every task of `fn`
    (it holds no attempt of its own), so an engine that caches the serialised form of a
    callable (Parsl does, by identity) pickles it once, not once per attempt."""

    __slots__ = ("fn", "address", "heartbeat_s")

    def __init__(self, fn, address: str | None, heartbeat_s: float = 1.0):
        self.fn = fn
        self.address = address
        self.heartbeat_s = heartbeat_s

    def __call__(self, attempt: tuple[str, int], /, *args, **kwargs):
        if not self.address:
            return self.fn(*args, **kwargs)
        agent = _Agent.get(self.heartbeat_s, self.address)
        ctx = _Context(attempt[0], attempt[1], self.address, agent)
        outer = getattr(_local, "ctx", None)
        _local.ctx = ctx
        agent.begin(ctx)
        try:
            return self.fn(*args, **kwargs)
        finally:
            _local.ctx = outer
            agent.end(ctx)  # "ended": the worker process is free of this attempt (process_control)

    def __repr__(self) -> str:
        return f"diaspora.task.Runner({getattr(self.fn, '__name__', self.fn)!r})"
