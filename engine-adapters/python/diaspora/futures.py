"""`ResilientExecutor`: any `concurrent.futures` executors as the sites of one resilient
executor. ProcessPoolExecutor, ThreadPoolExecutor, a Dask client's executor
(`client.get_executor(workers=...)`), and executors with the same contract (Parsl's,
Globus Compute's: docs/adapters.md has untested recipes) can be mixed.

    from concurrent.futures import ProcessPoolExecutor
    from diaspora.futures import ResilientExecutor

    with ResilientExecutor({"a": ProcessPoolExecutor(2), "b": ProcessPoolExecutor(2)},
                           spec="workflow.yaml") as ex:
        fut = ex.submit(reconstruct, frame)     # one Future: the first successful attempt
        print(fut.result())

Each attempt is reported to the plugin (submitted, started with the worker's host:pid,
heartbeats with CPU and memory, completed / failed with the exception text / cancelled);
the spec's policies decide, and the executor carries out their actions across the
wrapped executors: restart (a new attempt, on another site when its own is broken),
migrate (the attempt stopped, a new one on the target site), speculate (a copy
`ID@copyN` elsewhere; the first result wins, the others are stopped), cancel, checkpoint
(diaspora.task.checkpoint_requested() turns true in the attempt). A failed attempt that
no action follows within `failure_grace` seconds fails the Future with its exception,
as the wrapped executor would have. Stopped attempts end at their next
diaspora.task.step() (Python cannot interrupt a running function).

Threads: submit() and shutdown() from any thread. Every state change (a submit, an
attempt's end, a report from a worker, an action) is an event, handled one at a time on
the thread that posts it, or by the thread already handling events, which then handles it
too: nobody waits on anybody, submit() hands the first attempt to its site before it
returns, and an engine's completion is handled on the engine's own thread. The outer
Futures are set after the state is let go, so their callbacks may submit again. An
internal thread hands the plugin's actions in and, every 0.1 s, fails the attempts whose
grace ran out and looks at the worker processes (process_control; at once when one exits:
diaspora.exits.ExitWatch).

Sites: an executor with submit(fn, *args, **kwargs) -> Future is called with a wrapper
diaspora.task.Runner (one per function: engines that cache a callable's serialisation
pickle it once) and the attempt as the first argument. A site may instead offer
submit_attempt(fn, attempt, turn, args, kwargs), told the attempt's turn (RECOVER,
REPLACED, NEW) to order its queue by; one whose `cancellable` is False never has its
Futures cancelled (a stopped attempt's result is dropped instead).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import itertools
import logging
import os
import queue
import signal
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from .channel import Listener, Sender, host_name
from .errors import DiasporaError
from .exits import ExitWatch
from .plugin import Action, Plugin
from .task import AttemptStopped, Runner

log = logging.getLogger("diaspora.futures")


_LIVE = ("pending", "running")

# An attempt's turn in a site's queue, for sites that order their queue (submit_attempt):
RECOVER = 0  # a restart, migration or copy: work a fault interrupted goes first
REPLACED = 1  # a first attempt placed again before it ran (its site went out of use)
NEW = 2  # a first attempt


@dataclass
class _Attempt:
    number: int
    site: str
    hook_id: str  # the task id reported to the plugin: the task's, or ID@copyN for a copy
    copy: bool = False
    inner: cf.Future | None = None
    _state: str = "pending"  # pending | running | done | failed | stopped
    ctl: str | None = None  # the attempt's control address (from its "started" report)
    pid: int = 0  # its worker process and that process's parent (the engine's manager), when
    ppid: int = 0  # the worker runs on this host (from its "started" report)
    loads: dict | None = None  # site → its live attempts, kept up to date by the state setter
    turn: int = 2  # RECOVER, REPLACED or NEW: its place in a site's queue (submit_attempt)
    remote: bool = False  # its worker runs on another host (from its "started" report)

    def __post_init__(self):
        if self.loads is not None:
            self.loads[self.site] = self.loads.get(self.site, 0) + 1

    @property
    def state(self) -> str:
        return self._state

    @state.setter
    def state(self, v: str) -> None:
        if self.loads is not None and (self._state in _LIVE) != (v in _LIVE):
            self.loads[self.site] += 1 if v in _LIVE else -1
        self._state = v

    @property
    def live(self) -> bool:
        return self._state in _LIVE


@dataclass(eq=False)  # identity: tasks are kept in sets
class _Task:
    id: str
    name: str
    fn: Callable
    args: tuple
    kwargs: dict
    outer: cf.Future
    allowed: list[str]
    deadline_s: float
    attempts: list[_Attempt] = field(default_factory=list)
    copies: int = 0
    failed_at: float | None = None
    grace: float = 0.0  # how long the failure at failed_at waits for a restart or migrate
    last_exc: BaseException | None = None
    resolved: bool = False

    def live(self) -> list[_Attempt]:
        return [a for a in self.attempts if a.live]


class LostAttempt(Exception):
    """An attempt lost with its worker or its worker's manager (process_control), or to
    what `classify` calls lost: the last failure of a task whose attempts were all lost."""


_GONE = ("", "Z", "X")  # process states (_proc_state): gone, zombie, dead
_STOPPED = ("T", "t")  # stopped (SIGSTOP), traced


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state, parent pid, ...); [] when
    the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _proc_state(pid: int) -> str:
    """The state letter of a process of this host (R, S, D, T, t, Z, ...), "" when gone."""
    fields = _stat(pid)
    return fields[0] if fields else ""


def _ancestors(pid: int, depth: int = 6) -> tuple[int, ...]:
    """The pids above `pid` (its parent, grandparent, ...; at most `depth`, not init): an
    engine's block (a LocalProvider job is the pid of a shell above the manager)."""
    out = []
    for _ in range(depth):
        fields = _stat(pid)
        if len(fields) < 2 or not fields[1].isdigit() or int(fields[1]) <= 1:
            break
        pid = int(fields[1])
        out.append(pid)
    return tuple(out)


def default_classify(exc: BaseException) -> str:
    """A broken pool lost the attempt; any other exception is the task's own."""
    return "lost" if isinstance(exc, cf.BrokenExecutor) else "error"


class ResilientExecutor(cf.Executor):
    """Wraps `sites` (name → executor) behind one `concurrent.futures.Executor`.

    spec / plugin: the workflow spec to open a plugin from (closed at shutdown), or an open
        diaspora.Plugin (left open). One of them is required.
    heartbeat_s: heartbeat period of a running attempt (its worker sends them).
    failure_grace: seconds a failed attempt waits for a restart or migrate action before
        its Future fails.
    error_grace: the same for an attempt that failed with the task's own error (classify:
        "error"); default failure_grace. 0: the Future fails at once (the default protection
        never retries a task's own error; only a policy of the spec could).
    max_attempts: attempts per task (restarts and migrations included; copies not counted).
    classify: exception of a failed attempt → "lost" (its worker, node or pool died; the
        default protection restarts it) or "error" (the task's own; not retried).
    outcome: inner Future → (result, exception), for engines whose Futures carry a failure
        as a result (Parsl's RemoteExceptionWrapper).
    report_address: where the workers send their reports: None, a UNIX datagram socket of
        this process (workers on this host); "udp://HOST[:PORT]", UDP on HOST (an address of
        this machine the workers can reach), each datagram signed under a fresh key that the
        workers get inside the task wrapper (workers on other hosts; no process control over
        those: a stopped attempt's worker is asked to end itself).
    close_plugin: whether shutdown() closes the plugin (default: when it was opened from
        `spec` here; an adapter that opened `plugin` itself for the executor says True).
    process_control: the workers run on this host and the engine replaces a worker process
        that dies (Parsl's HighThroughputExecutor): a stopped attempt's worker is killed
        (SIGKILL) so a hung attempt gives its slot back; every 0.25 s, and at once when one
        of them exits (a pidfd: ExitWatch), the worker process and its parent (the engine's
        manager) of each running attempt are looked at, and an attempt whose worker or
        manager died, or whose manager is stopped (SIGSTOP), is reported lost at once; its
        site is out of use while none of its managers runs (a site with managers() -> ids is
        asked every second, and is back in use when a new manager joins it).
    """

    KEEP_FINISHED = 10_000  # finished tasks remembered (their attempts, for actions and operators)

    def __init__(self, sites: Mapping[str, cf.Executor], spec=None, *, plugin: Plugin | None = None,
                 heartbeat_s: float = 1.0, failure_grace: float = 3.0, max_attempts: int = 5,
                 error_grace: float | None = None, classify: Callable[[BaseException], str] = default_classify,
                 outcome: Callable[[cf.Future], tuple] | None = None, process_control: bool = False,
                 close_plugin: bool | None = None, report_address: str | None = None):
        if not sites:
            raise ValueError("ResilientExecutor needs at least one site")
        for name, ex in sites.items():
            if not callable(getattr(ex, "submit", None)) and not callable(getattr(ex, "submit_attempt", None)):
                raise TypeError(f"site {name!r}: {type(ex).__name__} has no submit()")
        if (spec is None) == (plugin is None):
            raise ValueError("give either spec= (a path or YAML text) or plugin= (an open diaspora.Plugin)")
        self._sites = dict(sites)
        self._order = list(self._sites)
        self._plugin = plugin if plugin is not None else Plugin.open(spec)
        self._own_plugin = plugin is None if close_plugin is None else close_plugin
        self._heartbeat_s = heartbeat_s
        self._failure_grace = failure_grace
        self._error_grace = failure_grace if error_grace is None else error_grace
        self._max_attempts = max_attempts
        self._classify = classify
        self._outcome = outcome
        self._process_control = process_control
        self._host = host_name()
        self._managers: dict[int, str] = {}  # manager pid (process_control) → its site
        self._manager_line: dict[int, tuple[int, ...]] = {}  # manager pid → its ancestors' pids
        self._dead_lines: dict[str, set[int]] = {}  # site → ancestors' pids of its managers that died
        self._pid_owner: dict[int, tuple[str, int]] = {}  # worker pid → the attempt it runs
        self._next_watch = 0.0
        # a watched worker or manager that exits is looked at now, not at the next 0.25 s
        self._exits = ExitWatch(lambda pid: self._q.put(("exited", pid))) if process_control else None
        self._down: dict[str, str] = {}  # site → why it is out of use
        self._awaiting: dict[str, frozenset | None] = {}  # site whose managers exited → the ones it had
        self._next_probe = 0.0
        self._prober: threading.Thread | None = None
        self._loads: dict[str, int] = {}  # site → live attempts (pending or running)
        self._failing: set[_Task] = set()  # tasks whose last attempt failed (failed_at set)
        self._tasks: dict[str, _Task] = {}  # live tasks, and the last KEEP_FINISHED finished ones
        self._finished: collections.deque = collections.deque()
        self._by_hook: dict[tuple[str, int], tuple[_Task, _Attempt]] = {}
        self._ids = itertools.count()
        self._runners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # fn → its Runner
        self._q: queue.Queue = queue.Queue()  # actions, sync and exit, for the executor's thread
        self._lock = threading.Lock()  # the state: held by whichever thread handles events
        self._events: collections.deque = collections.deque()  # posted, not handled yet
        self._draining = threading.local()  # .on: this thread is in _post
        self._outcomes: collections.deque = collections.deque()  # (outer Future, how, value): set unlocked
        self._closed = False
        self._shutdown_lock = threading.Lock()
        self._listener = Listener(lambda m: self._post("msg", m), address=report_address, tag="executor")
        self._thread = threading.Thread(target=self._loop, name="diaspora-executor", daemon=True)
        self._thread.start()
        for s in self._order:
            self._plugin.resource_status(s, "site", "up", site=s)
        self._plugin.on_action(lambda a: self._q.put(("action", a)))

    # ---- public API --------------------------------------------------------------------------

    @property
    def plugin(self) -> Plugin:
        return self._plugin

    def submit(self, fn: Callable, /, *args, **kwargs) -> cf.Future:
        """Runs fn(*args, **kwargs) on the best site; returns one Future for all attempts."""
        return self.submit_task(fn, args, kwargs)

    def submit_task(self, fn: Callable, args: Iterable = (), kwargs: Mapping | None = None, *,
                    task_id: str | None = None, name: str | None = None, site: str | None = None,
                    allowed_sites: Iterable[str] | None = None, deadline_s: float = 0.0) -> cf.Future:
        """submit() with the task's options: its id (default NAME-N), the first site, the
        sites it may run on, and a deadline in seconds (fed to the plugin's forecast)."""
        with self._shutdown_lock:
            if self._closed:
                raise RuntimeError("cannot submit after shutdown")
            name = name or getattr(fn, "__name__", "task")
            tid = task_id or f"{name}-{next(self._ids)}"
            allowed = list(allowed_sites) if allowed_sites is not None else self._order  # never changed
            for s in (allowed if allowed is not self._order else []) + ([site] if site else []):
                if s not in self._sites:
                    raise ValueError(f"unknown site {s!r}; the sites are {', '.join(self._order)}")
            if tid in self._tasks:
                raise ValueError(f"task id {tid!r} is already in use")
            outer: cf.Future = cf.Future()
            task = _Task(tid, name, fn, tuple(args), dict(kwargs or {}), outer, allowed, float(deadline_s))
            self._tasks[tid] = task
            outer.add_done_callback(lambda f, t=task: f.cancelled() and self._post("cancelled", t))
        self._post("start", task, site)  # not under _shutdown_lock: outer callbacks it runs may submit
        return outer

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stops taking tasks; with cancel_futures cancels those not finished; with wait
        waits for every Future. Then closes the plugin if the executor opened it. The
        wrapped executors are the caller's to shut down."""
        with self._shutdown_lock:
            if self._closed:
                return
            self._closed = True
        tasks = list(self._tasks.values())
        if cancel_futures:
            for t in tasks:
                t.outer.cancel()
        if wait:
            cf.wait([t.outer for t in tasks])
            self._q.put(("sync", done := threading.Event()))
            done.wait(30)
        self._q.put(("exit",))
        self._thread.join(timeout=30)
        if self._exits is not None:
            self._exits.close()
        self._listener.close()
        self._plugin.on_action(None)
        if self._own_plugin:
            self._plugin.close()

    # ---- the executor's thread ----------------------------------------------------------------

    def _loop(self) -> None:
        """The executor's thread: hands the plugin's actions in, and every 0.1 s (or after an
        action) lets the failures that waited their grace fail and looks at the processes."""
        while True:
            try:
                ev = self._q.get(timeout=0.1)
            except queue.Empty:
                ev = None
            if ev is not None and ev[0] == "exit":
                return
            if ev is not None:
                self._post(*ev)
            self._post("tick")
            if self._awaiting and time.monotonic() >= self._next_probe and not (
                    self._prober and self._prober.is_alive()):
                self._next_probe = time.monotonic() + 1.0
                self._prober = threading.Thread(target=self._probe_managers, args=(list(self._awaiting),),
                                                name="diaspora-probe", daemon=True)
                self._prober.start()

    def _probe_managers(self, sites: list[str]) -> None:
        """Tells each site whose managers all exited which of its processes died (a site with
        hold_dead(pids) stops sending work to those managers: an engine may list a dead one,
        and give it tasks, until it times it out), then asks which managers it has now. Off
        the executor's thread: an engine may take its time to answer."""
        for site in sites:
            ex = self._sites[site]
            try:
                if callable(getattr(ex, "hold_dead", None)) and self._dead_lines.get(site):
                    ex.hold_dead(set(self._dead_lines[site]))
                ids = frozenset(ex.managers())
            except Exception as e:  # noqa: BLE001 - an engine that cannot answer now: ask again later
                log.debug("site %s: no list of managers: %s", site, e)
                continue
            self._post("managers", site, ids)

    def _on_managers(self, site: str, ids: frozenset) -> None:
        """The first answer after a site's managers exited is what it had then (an engine
        lists a dead manager until it times it out); a manager not in it is a new one (the
        engine started a new block): the site is usable again."""
        if site not in self._awaiting:
            return
        before = self._awaiting[site]
        if before is None:
            self._awaiting[site] = ids
        elif ids - before:
            del self._awaiting[site]
            if site in self._down:
                del self._down[site]
                log.warning("site %s is usable again: a new manager joined it", site)
                self._plugin.resource_status(site, "site", "up", site=site)

    def _post(self, kind: str, *args) -> None:
        """Handles an event on the calling thread, or leaves it to the thread that holds the
        state (it handles every event posted before it lets go), so no caller ever waits for
        another: submit() starts the attempt on the submitting thread, an engine's completion
        is handled on the engine's thread. Events are handled one at a time, in the order
        posted. The outer Futures are set after the state is let go: their callbacks (the
        DataFlowKernel's, a caller's) may submit again, or take locks of their own."""
        self._events.append((kind, args))
        if getattr(self._draining, "on", False):
            return  # posted from a callback of this thread's own _post: its loop handles it (no recursion)
        self._draining.on = True
        try:
            self._drain()
        finally:
            self._draining.on = False

    def _drain(self) -> None:
        while self._events and self._lock.acquire(blocking=False):
            try:
                while self._events:
                    kind, args = self._events.popleft()
                    try:
                        getattr(self, "_on_" + kind)(*args)
                        if self._failing:
                            self._expire_failures()
                    except Exception:
                        log.exception("ResilientExecutor: handling %r failed", kind)
            finally:
                self._lock.release()
            while self._outcomes:
                fut, kind, value = self._outcomes.popleft()
                try:
                    if kind == "cancel":
                        fut.cancel()
                    elif kind == "exception":
                        fut.set_exception(value)
                    else:
                        fut.set_result(value)
                except cf.InvalidStateError:  # cancelled meanwhile
                    pass

    def _on_tick(self) -> None:
        self._expire_failures()
        if self._process_control and time.monotonic() >= self._next_watch:
            self._next_watch = time.monotonic() + 0.25
            self._watch_processes()

    def _on_exited(self, pid: int) -> None:
        """A watched worker or manager exited (ExitWatch): the tick after it looks at once."""
        self._next_watch = 0.0

    def _on_sync(self, done: threading.Event) -> None:
        done.set()

    def _on_start(self, task: _Task, site: str | None) -> None:
        self._start(task, site, copy=False)

    def _start(self, task: _Task, site: str | None, *, copy: bool, turn: int = NEW) -> _Attempt | None:
        """Starts an attempt on `site` (or the best site); tries the others when a site
        refuses it. Returns the attempt, or None when no site took it (the Future fails)."""
        tried: list[str] = []
        while True:
            s = site if site and site not in self._down and site not in tried else self._pick(task, tried)
            if s is None:
                why = "; ".join(f"{k}: {v}" for k, v in self._down.items() if k in task.allowed) or "no site allowed"
                self._resolve_error(task, task.last_exc or RuntimeError(f"task {task.id}: no site can run it ({why})"))
                return None
            tried.append(s)
            att = self._launch(task, s, copy, turn)
            if att is not None:
                return att

    def _launch(self, task: _Task, site: str, copy: bool, turn: int = NEW) -> _Attempt | None:
        """Submits an attempt to `site`. A site with `submit_attempt` is told the attempt's
        turn: RECOVER (a restart, migration or copy: work a fault interrupted), REPLACED (a
        first attempt placed again before it ran: its site went out of use) or NEW."""
        if copy:
            task.copies += 1
            att = _Attempt(1, site, f"{task.id}@copy{task.copies}", copy=True, loads=self._loads)
        else:
            att = _Attempt(1 + sum(1 for a in task.attempts if not a.copy), site, task.id, loads=self._loads)
        task.attempts.append(att)
        self._by_hook[(att.hook_id, att.number)] = (task, att)
        self._plugin.submitted(att.hook_id, site=site, name=task.name, attempt=att.number, deadline_s=task.deadline_s)
        att.turn = turn
        ex = self._sites[site]
        try:
            if hasattr(ex, "submit_attempt"):
                att.inner = ex.submit_attempt(self._runner(task.fn), (att.hook_id, att.number), turn, task.args,
                                              task.kwargs)
            else:
                att.inner = ex.submit(self._runner(task.fn), (att.hook_id, att.number), *task.args, **task.kwargs)
        except Exception as e:  # a broken pool, an executor that was shut down, ...
            att.state = "failed"
            self._site_down(site, f"{type(e).__name__}: {e}")
            self._plugin.failed(att.hook_id, f"site {site} refused the attempt: {type(e).__name__}: {e}",
                                retryable=True, failure="lost", site=site, attempt=att.number)
            return None
        task.failed_at = None
        att.inner.add_done_callback(lambda f, t=task, a=att: self._post("done", t, a, f))
        return att

    def _runner(self, fn: Callable) -> Runner:
        """The one Runner of `fn` (a new one for a callable that cannot be weakly referenced)."""
        try:
            r = self._runners.get(fn)
        except TypeError:  # not hashable or not weakly referenceable
            return Runner(fn, self._listener.address, self._heartbeat_s)
        if r is None:
            r = self._runners[fn] = Runner(fn, self._listener.address, self._heartbeat_s)
        return r

    def _pick(self, task: _Task, exclude: Iterable[str] = ()) -> str | None:
        """The allowed site in use with the lowest load (live attempts per worker), in the
        order the sites were given when loads tie."""
        load = self._loads
        best = None
        for i, s in enumerate(self._order):
            if s not in task.allowed or s in self._down or s in exclude:
                continue
            cap = max(1, int(getattr(self._sites[s], "_max_workers", 1) or 1))
            key = (load.get(s, 0) / cap, i)
            if best is None or key < best[0]:
                best = (key, s)
        return None if best is None else best[1]

    def _site_down(self, site: str, why: str) -> None:
        if site in self._down:
            return
        self._down[site] = why
        log.warning("site %s is out of use: %s", site, why)
        self._plugin.resource_status(site, "site", "down", site=site)

    def _on_msg(self, m: dict) -> None:
        hit = self._by_hook.get((m["t"], m.get("a")))
        if hit is None:
            return
        task, att = hit
        kind = m.get("k")
        if kind == "started":
            att.ctl = m.get("ctl") if isinstance(m.get("ctl"), str) else None
            self._note_processes(att, m)
            if att.state == "stopped":  # stopped before it began: tell it at once
                self._tell(att, "stop")
                self._kill_worker(att)
                return
            if att.state == "pending":
                att.state = "running"
                began = m.get("s")  # when it began (µs since the epoch): announced up to 20 ms later
                now_us = time.time_ns() // 1000
                began = began if type(began) is int and now_us - 3_600_000_000 < began <= now_us else 0
                self._plugin.started(att.hook_id, site=att.site, worker=str(m.get("w", ""))[:255] or None,
                                     attempt=att.number, timestamp_us=began)
            return
        if kind == "ended":
            self._release(att)
            return
        if att.state != "running":
            return
        try:
            if kind == "hb" and isinstance(m.get("m"), dict):
                metrics = {k[:63]: float(v) for k, v in list(m["m"].items())[:64]}
                self._plugin.heartbeat(att.hook_id, metrics=metrics, site=att.site, attempt=att.number)
            elif kind == "progress":
                self._plugin.progress(att.hook_id, float(m["p"]), step=int(m.get("s", -1)))
        except (DiasporaError, TypeError, ValueError, KeyError) as e:
            log.warning("a report of %s was refused: %s", att.hook_id, e)

    def _tell(self, att: _Attempt, kind: str) -> bool:
        return bool(att.ctl) and Sender.send(att.ctl, {"t": att.hook_id, "a": att.number, "k": kind})

    def _on_done(self, task: _Task, att: _Attempt, f: cf.Future) -> None:
        self._by_hook.pop((att.hook_id, att.number), None)
        self._release(att)
        if att.state in ("stopped", "failed"):
            return  # reported when it was stopped, or lost (process_control)
        if att.state == "pending":  # it never reported (another host, or too short): keep the lifecycle whole
            self._plugin.started(att.hook_id, site=att.site, attempt=att.number)
        if f.cancelled():
            result, exc = None, None
        elif self._outcome is not None:
            result, exc = self._outcome(f)
        else:
            exc = f.exception()
            result = None if exc is not None else f.result()
        if f.cancelled() or isinstance(exc, AttemptStopped):
            att.state = "stopped"
            self._plugin.cancelled(att.hook_id, "cancelled by the wrapped executor", site=att.site, attempt=att.number)
            exc = cf.CancelledError(f"attempt {att.number} of {task.id} was cancelled by site {att.site}")
            grace = self._failure_grace
        elif exc is None:
            att.state = "done"
            self._plugin.completed(att.hook_id, site=att.site, attempt=att.number)
            if not task.resolved:
                self._finish(task)
                for other in task.live():
                    self._stop(other, f"attempt {att.number} on {att.site} finished first")
                self._outcomes.append((task.outer, "result", result))
            return
        else:
            att.state = "failed"
            if isinstance(exc, cf.BrokenExecutor):
                self._site_down(att.site, f"{type(exc).__name__}: {exc}")
            kind = self._classify(exc)
            self._plugin.failed(att.hook_id, f"{type(exc).__name__}: {exc}" or type(exc).__name__, retryable=False,
                                failure="lost" if kind == "lost" else "error", site=att.site, attempt=att.number)
            grace = self._failure_grace if kind == "lost" else self._error_grace
        self._attempt_failed(task, exc, grace)

    def _attempt_failed(self, task: _Task, exc: BaseException, grace: float) -> None:
        """An attempt ended without a result: with no other attempt left, the task waits
        `grace` seconds for a restart or migrate before its Future fails (_expire_failures)."""
        task.grace = grace
        task.last_exc = exc
        if not task.resolved and not task.live():
            task.failed_at = time.monotonic()  # the policies may still restart it
            self._failing.add(task)

    def _expire_failures(self) -> None:
        """Fails the Futures of the tasks whose failure waited its grace with no restart (only
        the tasks that failed are looked at: this runs after every event)."""
        if not self._failing:
            return
        now = time.monotonic()
        for task in list(self._failing):
            if task.failed_at is None or task.resolved:
                self._failing.discard(task)
            elif now - task.failed_at >= task.grace:
                self._failing.discard(task)
                self._resolve_error(task, task.last_exc or RuntimeError(f"task {task.id} failed"))

    def _resolve_error(self, task: _Task, exc: BaseException) -> None:
        task.failed_at = None
        if task.resolved:
            return
        self._finish(task)
        for a in task.live():
            self._stop(a, "the task failed")
        self._outcomes.append((task.outer, "exception", exc))

    def _finish(self, task: _Task) -> None:
        """Marks the task resolved; only the last KEEP_FINISHED finished tasks are kept (for
        actions on them, operators and tests), so a long run's memory stays bounded."""
        task.resolved = True
        self._finished.append(task)
        while len(self._finished) > self.KEEP_FINISHED:
            old = self._finished.popleft()
            if self._tasks.get(old.id) is old:
                del self._tasks[old.id]

    def _stop(self, att: _Attempt, why: str) -> None:
        """Stops a live attempt: cancelled if it has not started, else asked to stop at its
        next step; reported cancelled now."""
        if not att.live:
            return
        att.state = "stopped"
        if att.inner is not None and getattr(self._sites[att.site], "cancellable", True):
            att.inner.cancel()
        self._tell(att, "stop")
        self._kill_worker(att)
        self._plugin.cancelled(att.hook_id, why[:4095], site=att.site, attempt=att.number)

    # ---- process_control: the workers and managers of this host ----------------------------

    def _note_processes(self, att: _Attempt, m: dict) -> None:
        host, _, pid = str(m.get("w", "")).rpartition(":")
        att.remote = host != self._host
        if not self._process_control or att.remote or not pid.isdigit():
            return
        att.pid = int(pid)
        att.ppid = int(m["pp"]) if isinstance(m.get("pp"), int) and m["pp"] > 1 else 0
        self._pid_owner[att.pid] = (att.hook_id, att.number)
        self._exits.watch(att.pid)
        if att.ppid and att.ppid != os.getpid() and att.ppid not in self._managers:
            self._managers[att.ppid] = att.site
            self._manager_line[att.ppid] = _ancestors(att.ppid)
            self._exits.watch(att.ppid)

    def _release(self, att: _Attempt) -> bool:
        """Forgets that att's worker process runs att; False when it was not known to."""
        if att.pid and self._pid_owner.get(att.pid) == (att.hook_id, att.number):
            del self._pid_owner[att.pid]
            return True
        return False

    def _kill_worker(self, att: _Attempt) -> None:
        """Kills the worker process of a stopped attempt if it still runs that attempt (the
        engine starts a fresh worker), so a hung or losing attempt frees its slot: on this
        host with SIGKILL, on another by asking its worker to end itself ("kill")."""
        if not self._process_control:
            return
        if att.remote:
            self._tell(att, "kill")
            return
        if not self._release(att):
            return
        try:
            os.kill(att.pid, signal.SIGKILL)
            log.info("killed worker %d of %s attempt %d", att.pid, att.hook_id, att.number)
        except OSError:
            pass

    def _watch_processes(self) -> None:
        """Sites whose managers are all stopped or gone go out of use (back in use when one
        runs again); running attempts whose worker or manager is gone or stopped are lost."""
        state = {pid: _proc_state(pid) for pid in self._managers}
        by_site: dict[str, list[int]] = {}
        for pid, site in self._managers.items():
            by_site.setdefault(site, []).append(pid)
        for site, pids in by_site.items():
            if any(state[p] not in _GONE + _STOPPED for p in pids):
                if self._down.get(site, "").startswith("manager"):
                    del self._down[site]
                    self._awaiting.pop(site, None)
                    log.warning("site %s is usable again: a manager of it runs", site)
                    self._plugin.resource_status(site, "site", "up", site=site)
            elif site not in self._down:
                stopped = [p for p in pids if state[p] in _STOPPED]
                self._site_down(site, f"manager process {stopped[0]} is stopped" if stopped
                                else f"manager process {pids[0]} exited")
                self._replace_pending(site)
        for pid in [p for p, st in state.items() if st in _GONE]:
            site = self._managers.pop(pid)  # gone for good; the engine is told to send it nothing more
            self._dead_lines.setdefault(site, set()).update(self._manager_line.pop(pid, ()))
        for site, why in self._down.items():  # no manager of it left: back in use when a new one joins
            if (why.startswith("manager") and site not in self._awaiting and site not in self._managers.values()
                    and callable(getattr(self._sites[site], "managers", None))):
                self._awaiting[site] = None  # (_on_managers)
        for task, att in list(self._by_hook.values()):  # the attempts not ended yet
            if att.state != "running" or not att.pid:
                continue
            w = _proc_state(att.pid)
            mgr = state.get(att.ppid, "R") if att.ppid else "R"
            if w in _GONE:
                self._lose(task, att, f"its worker process {att.pid} exited")
            elif mgr in _GONE:
                self._lose(task, att, f"its manager process {att.ppid} exited")
            elif mgr in _STOPPED:
                self._lose(task, att, f"its manager process {att.ppid} is stopped")

    def _replace_pending(self, site: str) -> None:
        """The attempts waiting in the queue of a site that went out of use start again on
        another site (they never ran: no retry is spent); the old ones are stopped (if one
        starts later, its worker is killed)."""
        for task, att in list(self._by_hook.values()):
            if att.site == site and att.state == "pending" and not task.resolved:
                self._stop(att, f"site {site} is out of use: {self._down.get(site, '')}; placed again")
                self._start(task, None, copy=att.copy, turn=min(att.turn, REPLACED))

    def _lose(self, task: _Task, att: _Attempt, why: str) -> None:
        """Reports a running attempt lost now (process_control); what its engine says of it
        later is ignored."""
        att.state = "failed"
        self._release(att)
        self._plugin.failed(att.hook_id, f"attempt {att.number} on {att.site} was lost: {why}", retryable=False,
                            failure="lost", site=att.site, attempt=att.number)
        self._attempt_failed(task, LostAttempt(f"task {task.id}: attempt {att.number} on site {att.site} was lost: "
                                               f"{why}"), self._failure_grace)

    def _on_cancelled(self, task: _Task) -> None:
        if not task.resolved:
            self._finish(task)
        task.failed_at = None
        for a in task.live():
            self._stop(a, "the task's Future was cancelled")

    def _on_action(self, a: Action) -> None:
        base = a.task_id.split("@copy", 1)[0]
        task = self._tasks.get(base)
        if a.kind == "throttle":
            return a.failed("ResilientExecutor does not throttle: it submits what its caller submits")
        if a.kind in ("drain", "undrain"):
            return a.failed(f"ResilientExecutor does not {a.kind} sites: its sites are the executors it wraps")
        if task is None:
            return a.failed(f"unknown task {a.task_id!r} (or one that finished before the last "
                            f"{self.KEEP_FINISHED} finished)")
        if task.resolved:
            return a.failed(f"not needed: task {task.id} has already finished")
        live = task.live()
        if a.kind == "checkpoint":
            told = [x for x in live if self._tell(x, "checkpoint")]
            return a.done(f"asked {len(told)} attempt(s)") if told else a.failed("no running attempt to ask")
        if a.kind == "cancel":
            self._outcomes.append((task.outer, "cancel", None))
            self._on_cancelled(task)
            return a.done("cancelled")
        if a.kind == "speculate":
            used = {x.site for x in live}
            target = a.target_site or self._pick(task, used)
            err = self._unusable(task, target)
            if err:
                return a.failed(err)
            att = self._launch(task, target, copy=True, turn=RECOVER)
            return a.done(f"copy {att.hook_id} on {target}") if att else a.failed(f"site {target} refused the copy")
        if a.kind not in ("restart", "migrate"):
            return a.failed(f"unsupported action {a.kind!r}")
        if sum(1 for x in task.attempts if not x.copy) >= self._max_attempts:
            self._resolve_error(task, task.last_exc or RuntimeError(f"task {task.id}: {self._max_attempts} attempts"))
            return a.failed(f"task {task.id} has used its {self._max_attempts} attempts")
        if a.kind == "migrate":
            target = a.target_site
            err = self._unusable(task, target)
            if err:
                return a.failed(err)
        elif a.target_site and not self._unusable(task, a.target_site):
            target = a.target_site  # a restart off a suspect site (the default protection)
        else:
            current = next((x.site for x in reversed(task.attempts) if not x.copy), None)
            target = current if current and current not in self._down else self._pick(task)
            if target is None:
                return a.failed("no site is usable: " + "; ".join(f"{k}: {v}" for k, v in self._down.items()))
        for x in live:
            self._stop(x, f"stopped for {a.kind} (action {a.id})" if a.kind == "restart"
                       else f"stopped for migration to {target} (action {a.id})")
        att = self._start(task, target, copy=False, turn=RECOVER)
        if att is None:
            return a.failed(f"no site took the new attempt of {task.id}")
        return a.done(f"attempt {att.number} of {task.id} on {att.site}")

    def _unusable(self, task: _Task, site: str | None) -> str | None:
        if not site:
            return f"no other site is usable for {task.id}"
        if site not in self._sites:
            return f"unknown site {site!r}"
        if site not in task.allowed:
            return f"site {site} is not allowed for {task.id}"
        if site in self._down:
            return f"site {site} is out of use: {self._down[site]}"
        return None

