"""Diaspora inside Dask (distributed 2026.8 from PyPI, tested; 2022.12 works too): a scheduler plugin that reports every
task transition and worker change through the engine plugin and carries out its actions
with Dask's own means, and a worker plugin that sends per-task heartbeats with the
worker's CPU and memory.

    from distributed import Client, LocalCluster
    import diaspora.dask

    client = Client(LocalCluster(n_workers=4))
    diaspora.dask.register(client, "workflow.yaml", sites={"a": [0, 1], "b": [2, 3]})
    client.submit(...)                 # reported: submitted, started, heartbeats, completed

Sites are groups of workers, named by worker name or address (`sites=`), by a function
(`site_of=`), or all one site (`default_site`, "dask"). Task ids are the Dask keys.

Transitions: released→waiting submitted (attempt n); →processing started (worker, site);
processing→memory completed; →erred failed with the exception text; processing→released
then →waiting (its worker left) failed (retryable) and submitted again as attempt n+1;
released→forgotten of an unfinished key cancelled.

Actions, on the scheduler's event loop:
- restart: an erred key is retried (Scheduler.stimulus_retry, what Client.retry does); a
  processing key's worker is removed (Dask cannot stop one running task; its keys go
  elsewhere, the Nanny starts a fresh worker process).
- migrate: the key is restricted to the target site's workers; if it is processing on
  another site, that worker is removed as for restart, so it reruns on the target.
- cancel: the key is cancelled for every client that wants it.
- drain_site(site) (a method, for operators): retire the site's workers (Dask moves their
  data first).
- speculate, checkpoint, throttle: refused with the reason: run tasks through
  diaspora.futures.ResilientExecutor with `client.get_executor(workers=...)` sites for
  copies, cooperative stops and checkpoints.

The worker plugin reaches the scheduler plugin over a UNIX datagram socket: same host
only (a LocalCluster, or workers beside the scheduler). Remote workers report nothing
through it; the transitions still come from the scheduler.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Iterable, Mapping

from dask.utils import key_split
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from . import task as _task
from .channel import Listener, Sender, new_address
from .plugin import Action, Plugin

log = logging.getLogger("diaspora.dask")

_WATCHED = frozenset(("waiting", "queued", "no-worker", "processing", "memory", "erred", "released", "forgotten"))


class _KeyRecord:
    __slots__ = ("key", "state", "attempt", "submitted_us", "lost_on")

    def __init__(self, key):
        self.key = key
        self.state = None  # submitted | running | lost | done
        self.attempt = 0
        self.submitted_us = 0
        self.lost_on = ""


def key_id(key) -> str:
    """The task id of a Dask key (tuples as Dask prints them), at most 255 bytes."""
    s = key if isinstance(key, str) else str(key)
    return s.encode()[:255].decode(errors="ignore")


class DiasporaSchedulerPlugin(SchedulerPlugin):
    """Reports the scheduler's view through the plugin and acts on its actions.

    spec: the workflow spec (path or YAML text) opened on the scheduler in start(); or
    plugin: an open diaspora.Plugin (only with Scheduler.add_plugin in the same process).
    sites: site name → worker names or addresses; site_of(address, name) instead; else
    every worker is `default_site`."""

    name = "diaspora"

    def __init__(self, spec=None, *, plugin: Plugin | None = None, sites: Mapping[str, Iterable] | None = None,
                 site_of: Callable[[str, object], str] | None = None, default_site: str = "dask",
                 address: str | None = None):
        if (spec is None) == (plugin is None):
            raise ValueError("give either spec= (a path or YAML text) or plugin= (an open diaspora.Plugin)")
        self._spec = str(spec) if isinstance(spec, os.PathLike) else spec
        self._given_plugin = plugin
        self._sites = {s: {str(w) for w in ws} for s, ws in (sites or {}).items()}
        self._site_of = site_of
        self.default_site = default_site
        self.address = address or new_address("dask")  # where DiasporaWorkerPlugin sends
        self._init_runtime()

    def _init_runtime(self) -> None:
        self.plugin: Plugin | None = self._given_plugin
        self.scheduler = None
        self._listener: Listener | None = None
        self._lock = threading.Lock()
        self._tasks: dict[str, _KeyRecord] = {}  # task id → what was reported of its Dask key
        self._site_cache: dict[str, str] = {}

    def __getstate__(self):  # register_scheduler_plugin pickles the plugin
        if self._given_plugin is not None:
            raise TypeError("a DiasporaSchedulerPlugin made with plugin= cannot be pickled: pass spec= "
                            "(or use scheduler.add_plugin in the scheduler's process)")
        return {k: v for k, v in self.__dict__.items()
                if k in ("_spec", "_sites", "_site_of", "default_site", "address", "_given_plugin")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._init_runtime()

    # ---- set-up ------------------------------------------------------------------------------

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        if self.plugin is None:
            self.plugin = Plugin.open(self._spec)
        self._listener = Listener(self._on_report, address=self.address)
        self.plugin.on_action(self._on_action_thread)
        for addr, ws in scheduler.workers.items():
            self._worker_status(addr, ws, "up")

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self.plugin is not None and not self.plugin._closed:
            self.plugin.on_action(None)
            if self._given_plugin is None:
                self.plugin.close()

    def site_of(self, address: str, ws=None) -> str:
        """The site of a worker (by address or name)."""
        name = getattr(ws, "name", None) if ws is not None else None
        if ws is None and self.scheduler is not None:
            w = self.scheduler.workers.get(address)
            name = getattr(w, "name", None)
        if self._site_of is not None:
            return self._site_of(address, name)
        for site, members in self._sites.items():
            if address in members or (name is not None and str(name) in members):
                return site
        return self.default_site

    def workers_of(self, site: str) -> list[str]:
        return [a for a, ws in self.scheduler.workers.items() if self.site_of(a, ws) == site]

    # ---- scheduler hooks (the scheduler's event loop) ------------------------------------------

    def add_worker(self, scheduler, worker: str, **kwargs) -> None:
        self._worker_status(worker, scheduler.workers.get(worker), "up")

    def remove_worker(self, scheduler, worker: str, **kwargs) -> None:  # kwargs: stimulus_id, ...
        self._worker_status(worker, None, "down")

    def _worker_status(self, address: str, ws, state: str) -> None:
        if self.plugin is None:
            return
        # A removed worker is no longer in scheduler.workers: its site is the one it joined.
        known = self.__dict__.setdefault("_joined", {})
        site = known.pop(address, None) if state == "down" else None
        if site is None:
            site = self.site_of(address, ws)
        if state == "up":
            known[address] = site
        try:
            self.plugin.resource_status(address[:255], "worker", state, site=site)
        except Exception as e:
            log.warning("diaspora: worker %s status not reported: %s", address, e)

    def transition(self, key, start: str, finish: str, *args, **kwargs) -> None:
        if self.plugin is None or finish not in _WATCHED:
            return
        tid = key if type(key) is str and len(key) < 64 else key_id(key)
        try:
            with self._lock:
                self._transition(key, tid, start, finish, kwargs)
        except Exception as e:  # never fail the scheduler because of reporting
            log.warning("diaspora: transition %s %s→%s not reported: %s", tid, start, finish, e)

    def _transition(self, key, tid: str, start: str, finish: str, kwargs: dict) -> None:
        p = self.plugin
        r = self._tasks.get(tid)
        st = r.state if r is not None else None
        if finish == "processing":
            if st == "submitted":
                ws = self.scheduler.tasks[key].processing_on
                addr = ws.address
                site = self._site_cache.get(addr)
                if site is None:
                    site = self._site_cache[addr] = self.site_of(addr, ws)
                r.state = "running"
                p.started(tid, site=site, worker=addr[:255], attempt=r.attempt)
        elif finish == "memory":
            if st == "running":
                r.state = "done"
                p.completed(tid)
        elif finish == "forgotten":
            if st in ("submitted", "running", "lost"):
                p.cancelled(tid, "released by its clients before it finished")
            self._tasks.pop(tid, None)
        elif finish == "erred":
            if st in ("running", "submitted"):
                r.state = "done"
                text = kwargs.get("exception_text") or ("a dependency failed" if start != "processing" else "erred")
                p.failed(tid, str(text)[:4095] or "erred", failure="error")  # its exception (or Dask gave up)
        elif finish == "released":
            if start == "processing" and st == "running":
                ts = self.scheduler.tasks.get(key)
                r.state = "lost"  # waiting next (its worker left) or forgotten (cancelled)
                r.lost_on = kwargs.get("worker", "") or getattr(getattr(ts, "processing_on", None), "address", "?")
        elif st in (None, "lost", "done"):  # waiting, queued, no-worker: a new attempt
            if r is None:
                r = self._tasks[tid] = _KeyRecord(key)
            elif st == "lost":
                p.failed(tid, f"its worker {r.lost_on} left while it was processing", retryable=True, failure="lost")
            r.attempt += 1
            r.submitted_us = int(time.time() * 1e6)
            r.state = "submitted"
            p.submitted(tid, name=key_id(key_split(key)), attempt=r.attempt)

    # ---- reports from DiasporaWorkerPlugin (listener thread) ------------------------------------

    def _on_report(self, m: dict) -> None:
        tid = m["t"]
        with self._lock:
            r = self._tasks.get(tid)
            if r is None or r.state != "running":
                return  # not (or no longer) running: a late report is dropped
            if m.get("k") == "hb" and isinstance(m.get("m"), dict):
                metrics = {str(k)[:63]: float(v) for k, v in list(m["m"].items())[:64]}
                self.plugin.heartbeat(tid, metrics=metrics)
            elif m.get("k") == "progress":
                self.plugin.progress(tid, float(m["p"]), step=int(m.get("s", -1)))

    # ---- actions ---------------------------------------------------------------------------------

    def _on_action_thread(self, action: Action) -> None:
        # The control thread hands the action to the scheduler's event loop.
        self.scheduler.loop.add_callback(self._act, action)

    async def _act(self, a: Action) -> None:
        try:
            msg = await self._carry_out(a)
        except Exception as e:
            log.exception("diaspora: action %s failed", a.id)
            a.failed(f"{type(e).__name__}: {e}")
            return
        if msg.startswith("refused: "):
            a.failed(msg[len("refused: "):])
        else:
            a.done(msg)

    async def _carry_out(self, a: Action) -> str:
        s = self.scheduler
        if a.kind in ("speculate", "checkpoint", "throttle"):
            return (f"refused: the Dask scheduler plugin cannot {a.kind} a key; run the tasks through "
                    "diaspora.futures.ResilientExecutor over client.get_executor(workers=...) sites for that")
        if a.kind == "drain":
            if not a.site:
                return "refused: a drain names the site"
            retired = await self.drain_site(a.site)
            if not retired:
                return f"refused: site {a.site!r} has no workers"
            return f"site {a.site}: {len(retired)} worker(s) retired (their results moved to other workers first)"
        if a.kind == "undrain":
            return ("refused: retired Dask workers do not come back; start new workers for the site "
                    "(dask worker ... --resources/--name as the site's)")
        rec = self._tasks.get(a.task_id)
        key = rec.key if rec is not None else None
        ts = s.tasks.get(key) if key is not None else None
        if ts is None:
            return f"refused: no Dask key {a.task_id!r} on this scheduler"
        if a.kind == "cancel":
            clients = [cs.client_key for cs in ts.who_wants] or [None]
            for c in clients:
                await _maybe_await(s.stimulus_cancel([key], c, force=True))
            return f"cancelled {a.task_id} for {len(clients)} client(s)"
        if a.kind in ("restart", "migrate") and ts.state != "erred" and \
                rec.submitted_us > (a.requested_us or a.issued_us):
            # Decided on an earlier attempt (e.g. the failure of a worker that left), and
            # Dask has already started another one.
            return (f"refused: not needed: attempt {rec.attempt} of {a.task_id} was submitted "
                    f"after the decision (it is {ts.state})")
        if a.kind == "migrate":
            targets = self.workers_of(a.target_site)
            if not targets:
                return f"refused: site {a.target_site!r} has no workers"
            ts.worker_restrictions = set(targets)
            ts.loose_restrictions = False
            where = getattr(ts.processing_on, "address", None) if ts.state == "processing" else None
            if where is None or where in targets:
                return f"{a.task_id} restricted to {a.target_site} ({len(targets)} workers), state {ts.state}"
            await _maybe_await(s.remove_worker(where, stimulus_id=f"diaspora-migrate-{a.id}", close=True))
            return f"{a.task_id} restricted to {a.target_site}; worker {where} removed so it reruns there"
        if a.kind == "restart":
            if ts.state == "erred":
                s.stimulus_retry([key])
                return f"{a.task_id} retried"
            if ts.state == "processing":
                where = ts.processing_on.address
                await _maybe_await(s.remove_worker(where, stimulus_id=f"diaspora-restart-{a.id}", close=True))
                return f"worker {where} removed; {a.task_id} is rescheduled"
            return f"refused: not needed: {a.task_id} is {ts.state}"
        return f"refused: unsupported action {a.kind!r}"

    async def drain_site(self, site: str) -> list[str]:
        """Retires every worker of `site` (their data moves to other workers first) and
        closes them. Returns their addresses. On the scheduler's event loop."""
        workers = self.workers_of(site)
        if workers:
            await self.scheduler.retire_workers(workers=workers, close_workers=True,
                                                stimulus_id=f"diaspora-drain-{site}-{time.time()}")
        return workers


async def _maybe_await(x):
    if hasattr(x, "__await__"):
        return await x
    return x


class _DaskTaskContexts:
    """diaspora.task's context hook in a Dask worker: the task executing on this thread
    (distributed's thread_state.key) reports to the scheduler plugin under its key."""

    def __init__(self, address: str):
        self.address = address
        self._local = threading.local()

    def __call__(self):
        from distributed.worker import thread_state

        key = getattr(thread_state, "key", None)
        if key is None:
            return None
        tid = key_id(key)
        ctx = getattr(self._local, "ctx", None)
        if ctx is None or ctx.task_id != tid:
            ctx = self._local.ctx = _task.EngineContext(tid, self.address)
        return ctx


class DiasporaWorkerPlugin(WorkerPlugin):
    """In each worker: a heartbeat every `heartbeat_s` for each executing task, with the
    worker process's CPU use (cores) and resident memory; and diaspora.task.step() /
    progress() / metric() in Dask tasks report to the scheduler plugin at `address`."""

    name = "diaspora-worker"

    def __init__(self, address: str, heartbeat_s: float = 1.0):
        self.address = address
        self.heartbeat_s = heartbeat_s

    def setup(self, worker) -> None:
        self._worker = worker
        self._done = threading.Event()
        _task.set_context_hook(_DaskTaskContexts(self.address))
        self._thread = threading.Thread(target=self._beat, name="diaspora-worker-heartbeat", daemon=True)
        self._thread.start()

    def teardown(self, worker) -> None:
        _task.set_context_hook(None)
        self._done.set()
        self._thread.join(timeout=2)

    def _beat(self) -> None:
        prev = [0.0, time.monotonic()]
        _task.resource_sample(prev)
        while not self._done.wait(self.heartbeat_s):
            try:
                executing = [ts.key for ts in list(self._worker.state.executing)]
            except Exception:
                continue
            if not executing:
                _task.resource_sample(prev)
                continue
            m = _task.resource_sample(prev)
            for key in executing:
                Sender.send(self.address, {"t": key_id(key), "k": "hb", "m": m})


def register(client_or_scheduler, spec=None, *, plugin: Plugin | None = None, heartbeat_s: float = 1.0,
             **kwargs) -> DiasporaSchedulerPlugin:
    """Registers both plugins with one call, on a running Client (the scheduler plugin is
    sent to the scheduler, which opens the spec there) or on a Scheduler object in this
    process (then plugin= may be an open handle). Returns the scheduler plugin (with a
    Client: the copy made here; the live one is the scheduler's)."""
    sp = DiasporaSchedulerPlugin(spec, plugin=plugin, **kwargs)
    wp = DiasporaWorkerPlugin(sp.address, heartbeat_s)
    from distributed import Client

    if isinstance(client_or_scheduler, Client):
        client = client_or_scheduler
        if hasattr(client, "register_plugin"):  # distributed >= 2023.9
            client.register_plugin(sp, name=sp.name)
            client.register_plugin(wp, name=wp.name)
        else:
            client.register_scheduler_plugin(sp, name=sp.name)
            client.register_worker_plugin(wp, name=wp.name)
        return sp
    from distributed.utils import sync

    scheduler = client_or_scheduler
    sync(scheduler.loop, _register_on_scheduler, scheduler, sp, wp)
    return sp


async def _register_on_scheduler(scheduler, sp: DiasporaSchedulerPlugin, wp: DiasporaWorkerPlugin) -> None:
    from distributed.protocol.pickle import dumps

    import inspect

    # distributed >= 2023.9 wants `idempotent` (keyword-only, no default) on both.
    kw = {"idempotent": False} if "idempotent" in inspect.signature(scheduler.register_scheduler_plugin).parameters else {}
    await scheduler.register_scheduler_plugin(sp, name=sp.name, **kw)  # calls sp.start(scheduler)
    await scheduler.register_worker_plugin(None, dumps(wp), name=wp.name, **kw)
