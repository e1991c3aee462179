"""Diaspora inside Parsl: `DiasporaExecutor`, one Parsl executor whose sites are real inner
executors (HighThroughputExecutor on any provider), with Diaspora's events, default
protection and actions.

    import parsl
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from parsl.providers import LocalProvider
    from diaspora.parsl import DiasporaExecutor

    def site(label):
        return HighThroughputExecutor(label=label, address="127.0.0.1", max_workers_per_node=2,
                                      provider=LocalProvider(init_blocks=1, max_blocks=1))

    parsl.load(Config(executors=[DiasporaExecutor(sites=[site("a"), site("b")], spec="workflow.yaml")]))

Every app of that Config now runs on site a or b; `parsl_resource_specification=
{"diaspora": {"site": "b", "sites": ["a", "b"], "deadline_s": 60}}` on an app call picks its
first site, the sites it may use and a deadline. Task ids are Parsl's: `<app>-<task id>`
(and `.try<N>` for a later Parsl try).

What the executor does (docs/adapters.md, "Parsl"):
- starts the inner executors itself (each gets a run directory `<run_dir>/<label>/<site>`
  and Parsl's JobStatusPoller, as Globus Compute's engine does) and shuts them down;
- wraps every app function (as Parsl's monitoring does) so the worker process reports
  started, heartbeats with CPU and memory, steps and progress (diaspora.task) to the
  submitting process, over a UNIX socket: the workers must share a host with the process
  that loads Parsl (LocalProvider; remote workers run but report only their end);
- reports every attempt to the plugin and carries out its actions: restart (same or another
  site), migrate (the next attempt on another site), speculate (a copy on another site; the
  first result wins, the loser's worker is killed and HTEX starts a fresh one), cancel, and
  checkpoint (diaspora.task.checkpoint_requested());
- sees a lost worker or manager at once (process_control in diaspora.futures): a killed
  worker or manager fails its attempts as "lost" as it exits (a pidfd), a stopped (SIGSTOP)
  manager within about 0.25 s, where HTEX says WorkerLost after its watchdog and ManagerLost only after
  `heartbeat_threshold` (120 s); a restarted hung attempt's worker is killed, so no slot is
  lost;
- who retries: Diaspora restarts lost attempts (its default protection, docs/anomaly.md);
  an app's own exception is not retried by Diaspora. Parsl's `Config(retries=N)` retries
  what reaches it; give `retry_handler=diaspora.parsl.retry_handler` so that a task Diaspora
  already retried and gave up on is not retried by Parsl too.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import logging
import os
import socket
import sys
from typing import Any, Callable, Iterable, Mapping

from parsl.app.errors import RemoteExceptionWrapper
from parsl.executors import HighThroughputExecutor
from parsl.executors.base import ParslExecutor
from parsl.executors.high_throughput.errors import ManagerLost, WorkerLost

from .futures import NEW, LostAttempt, ResilientExecutor
from .plugin import Plugin

log = logging.getLogger("diaspora.parsl")

_LOST = (WorkerLost, ManagerLost, LostAttempt, cf.BrokenExecutor)


class ConfigError(ValueError):
    """A DiasporaExecutor was configured wrongly (sites, labels, resource specification)."""


def classify(exc: BaseException) -> str:
    """"lost" for an attempt its worker or manager lost (HTEX's WorkerLost, ManagerLost),
    "error" for the app's own exception."""
    return "lost" if isinstance(exc, _LOST) else "error"


def outcome(f: cf.Future) -> tuple[Any, BaseException | None]:
    """(result, exception) of an inner Parsl Future: a RemoteExceptionWrapper result is the
    exception it wraps."""
    exc = f.exception()
    if exc is not None:
        return None, exc
    r = f.result()
    if isinstance(r, RemoteExceptionWrapper):
        try:
            r.reraise()
        except BaseException as e:  # noqa: BLE001 - the app's exception, whatever it is
            return None, e
    return r, None


def retry_handler(exc: BaseException, task_record: Mapping) -> float:
    """A Parsl `Config(retry_handler=...)`: a task Diaspora already restarted (its attempts
    were lost) costs more than any `retries`, so Parsl does not retry it again; anything else
    costs 1, as without a handler."""
    return float("inf") if isinstance(exc, _LOST) else 1.0


def _takes(func: Callable, param: str) -> bool:
    """Whether func accepts the keyword `param` (Parsl passes parsl_resource_specification on
    to an app that declares it; one that does not gets it removed here)."""
    import inspect

    try:
        ps = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return True
    return param in ps or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ps.values())


def report_address_for(sites: Mapping[str, ParslExecutor]) -> str | None:
    """Where the workers of `sites` report: a UNIX socket when every site runs its workers
    on this host (a LocalProvider, or no provider), else UDP on the address the workers use
    to reach this process (the first HTEX `address` given, else this host's name)."""
    from parsl.providers import LocalProvider

    remote = [ex for ex in sites.values()
              if getattr(ex, "provider", None) is not None and not isinstance(ex.provider, LocalProvider)]
    if not remote:
        return None
    given = [ex.address for ex in remote if isinstance(getattr(ex, "address", None), str) and ex.address]
    return f"udp://{given[0] if given else socket.getfqdn()}:0"


class _Site:
    """One inner Parsl executor seen as a `concurrent.futures` executor by ResilientExecutor.
    Its Futures are the inner executor's own, which it sets itself: ResilientExecutor never
    cancels them (`cancellable`); a stopped attempt's result is dropped."""

    cancellable = False

    def __init__(self, name: str, inner: ParslExecutor):
        self.name = name
        self.inner = inner
        self._prioritised = isinstance(inner, HighThroughputExecutor)  # HTEX takes `priority`
        self._held: set[str] = set()  # blocks put on hold (hold_dead)

    def submit_attempt(self, fn: Callable, attempt: tuple[str, int], turn: int, args: tuple,
                       kwargs: dict) -> cf.Future:
        """Submits one attempt. In an HTEX interchange (HTEX's `priority`: lower first; tasks
        without one go last) a restart, migration or copy (RECOVER: work a fault interrupted)
        goes first, then the first attempts placed again because their site went out of use
        before they ran (REPLACED), then new work: recovery never waits behind work that never
        started."""
        spec = {"priority": turn} if turn != NEW and self._prioritised else {}
        return self.inner.submit(fn, spec, attempt, *args, **kwargs)

    def managers(self) -> set[str]:
        """The ids of the managers connected to the inner executor now that take work (HTEX's
        interchange lists a manager that died until its heartbeat_threshold passes)."""
        if not callable(getattr(self.inner, "connected_managers", None)):
            return set()
        return {str(m["manager"]) for m in self.inner.connected_managers()
                if isinstance(m, dict) and "manager" in m and m.get("active", True)}

    def hold_dead(self, pids: set[int]) -> None:
        """Puts on hold (HTEX: no more tasks to them) the managers of every block whose job is
        one of `pids`: processes above a manager that died (a LocalProvider job id is the pid
        of the shell that runs the block). Without this the interchange would send new tasks
        to the dead manager until its heartbeat_threshold (120 s) passed."""
        blocks = getattr(self.inner, "blocks_to_job_id", None)
        hold = getattr(self.inner, "_hold_block", None)
        if not isinstance(blocks, dict) or not callable(hold):
            return
        wanted = {str(p) for p in pids}
        for block, job in list(blocks.items()):
            if str(job) in wanted and block not in self._held:
                hold(block)
                self._held.add(block)

    @property
    def _max_workers(self) -> int:
        """Worker slots: workers per node x nodes per block x blocks (at least one)."""
        ex = self.inner
        per_node = getattr(ex, "workers_per_node", None) or getattr(ex, "max_workers_per_node", None) or 1
        prov = getattr(ex, "provider", None)
        nodes = getattr(prov, "nodes_per_block", 1) or 1
        blocks = max(1, getattr(prov, "init_blocks", 1) or 0, getattr(prov, "min_blocks", 0) or 0)
        try:
            return max(1, int(per_node) * int(nodes) * int(blocks))
        except (TypeError, ValueError, OverflowError):
            return 1


class DiasporaExecutor(ParslExecutor):
    """A Parsl executor over `sites`: a list of Parsl executors (the site is each one's
    label) or a mapping site name → executor. `spec` (a workflow spec: path or YAML text)
    or `plugin` (an open diaspora.Plugin, left open) is required; `heartbeat_s`,
    `failure_grace`, `error_grace` and `max_attempts` are diaspora.futures.ResilientExecutor's
    (error_grace 0: an app's own exception reaches Parsl at once; give the seconds a policy of
    the spec needs to restart it when the spec has one on task errors).
    `strategy`, `max_idletime`, `strategy_period`: Parsl's JobStatusPoller for the inner
    executors (Parsl's defaults: "simple", 120 s, 5 s). `report_address`: where the workers
    report ("auto": a UNIX socket when every site's provider is a LocalProvider, else
    "udp://HOST:0" on the first HTEX `address` given, else this host's name; None; or
    "udp://HOST[:PORT]" with HOST an address of this machine the workers can reach).

    The DataFlowKernel calls start(), submit() (from its submitting thread) and shutdown();
    submit() may be called from any thread. Raises ConfigError for an empty or duplicated
    site, an inner executor that is not a Parsl executor, or a bad resource specification;
    diaspora.LibraryError / SpecError when the plugin cannot be opened (at start())."""

    def __init__(self, sites: Iterable[ParslExecutor] | Mapping[str, ParslExecutor], spec=None, *,
                 plugin: Plugin | None = None, label: str = "diaspora", heartbeat_s: float = 1.0,
                 failure_grace: float = 3.0, error_grace: float = 0.0, max_attempts: int = 5, strategy: str = "simple",
                 max_idletime: float = 120.0, strategy_period: float = 5.0, report_address: str | None = "auto"):
        super().__init__()
        if isinstance(sites, Mapping):
            named = list(sites.items())
        else:
            named = [(getattr(ex, "label", None), ex) for ex in sites]
        if not named:
            raise ConfigError("DiasporaExecutor needs at least one site (an inner Parsl executor)")
        self.sites: dict[str, ParslExecutor] = {}
        for name, ex in named:
            if not isinstance(ex, ParslExecutor):
                raise ConfigError(f"site {name!r}: {type(ex).__name__} is not a Parsl executor "
                                  "(give HighThroughputExecutor(...) or another parsl.executors class)")
            if not isinstance(name, str) or not name or name == label:
                raise ConfigError(f"site name {name!r}: give each inner executor a label of its own "
                                  f"(not empty, not the DiasporaExecutor's {label!r})")
            if name in self.sites:
                raise ConfigError(f"site {name!r} is given twice: inner executors need distinct labels")
            self.sites[name] = ex
            if getattr(ex, "heartbeat_period", None) == 30 and getattr(ex, "heartbeat_threshold", 0) > 2:
                # HTEX's manager looks for dead workers (and starts new ones) every
                # heartbeat_period: Diaspora kills the workers of hung and losing attempts, so
                # Parsl's default 30 s would leave such a slot dead for up to 30 s.
                ex.heartbeat_period = 2
        if (spec is None) == (plugin is None):
            raise ConfigError("give either spec= (a workflow spec: path or YAML text) or plugin= (an open "
                              "diaspora.Plugin)")
        self.label = label
        self.spec = spec
        self._given_plugin = plugin
        self.report_address = report_address_for(self.sites) if report_address == "auto" else report_address
        if self.report_address is not None and not self.report_address.startswith("udp://"):
            raise ConfigError(f"report_address {report_address!r}: give \"auto\", None (workers on this host) or "
                              "\"udp://HOST[:PORT]\" (an address of this machine the workers can reach)")
        self._options = dict(heartbeat_s=heartbeat_s, failure_grace=failure_grace, error_grace=error_grace,
                             max_attempts=max_attempts, report_address=self.report_address)
        self._poller_kwargs = dict(strategy=strategy, max_idletime=max_idletime, strategy_period=strategy_period)
        self._poller = None
        self._started: list[ParslExecutor] = []
        self._resilient: ResilientExecutor | None = None
        self._ids = itertools.count()

    # ---- the executor's life -------------------------------------------------------------

    def start(self) -> None:
        """Opens the plugin, starts every inner executor (run_dir, run_id, script_dir set as
        the DataFlowKernel would) and a JobStatusPoller that scales their blocks."""
        from parsl.executors.status_handling import BlockProviderExecutor
        from parsl.jobs.job_status_poller import JobStatusPoller

        plugin = self._given_plugin if self._given_plugin is not None else Plugin.open(self.spec)
        try:
            for name, ex in self.sites.items():
                ex.run_id = self.run_id
                ex.run_dir = os.path.join(self.run_dir, self.label, name)
                os.makedirs(ex.run_dir, exist_ok=True)
                ex.log_config = getattr(self, "log_config", None)
                prov = getattr(ex, "provider", None)
                if prov is not None and hasattr(prov, "script_dir"):
                    prov.script_dir = os.path.join(ex.run_dir, "submit_scripts")
                    os.makedirs(prov.script_dir, exist_ok=True)
                ex.start()
                self._started.append(ex)
            self._poller = JobStatusPoller(**self._poller_kwargs)
            self._poller.add_executors([ex for ex in self._started if isinstance(ex, BlockProviderExecutor)])
            self._resilient = ResilientExecutor({n: _Site(n, ex) for n, ex in self.sites.items()}, plugin=plugin,
                                                classify=classify, outcome=outcome, process_control=True,
                                                close_plugin=self._given_plugin is None, **self._options)
        except BaseException:
            self._stop_inner()
            if self._given_plugin is None:
                plugin.close()
            raise

    def submit(self, func: Callable, resource_specification: dict, *args, **kwargs) -> cf.Future:
        """One Future for every attempt of the task (the first result that succeeds)."""
        if self._resilient is None:
            raise RuntimeError(f"DiasporaExecutor {self.label!r} was not started (load it in a parsl Config)")
        opts = dict(resource_specification or {})
        mine = opts.pop("diaspora", None) or {}
        if opts:
            raise ConfigError(f"resource specification {sorted(opts)}: DiasporaExecutor takes only "
                              "{'diaspora': {'site': ..., 'sites': [...], 'deadline_s': ...}}")
        if not isinstance(mine, Mapping) or set(mine) - {"site", "sites", "deadline_s", "task_id"}:
            raise ConfigError(f"resource specification 'diaspora': {mine!r}: the keys are site, sites, deadline_s, "
                              "task_id")
        if "parsl_resource_specification" in kwargs and not _takes(func, "parsl_resource_specification"):
            kwargs = {k: v for k, v in kwargs.items() if k != "parsl_resource_specification"}
        name = getattr(func, "__name__", "task")
        tid = mine.get("task_id") or self._task_id(name)
        try:
            return self._resilient.submit_task(func, args, kwargs, task_id=tid, name=name, site=mine.get("site"),
                                               allowed_sites=mine.get("sites"),
                                               deadline_s=float(mine.get("deadline_s", 0.0)))
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def _task_id(self, name: str) -> str:
        """`<app>-<Parsl task id>` (`.try<N>` for Parsl's later tries) when the DataFlowKernel
        submits; `<app>-d<N>` otherwise."""
        frame = sys._getframe(2)  # submit() <- the DataFlowKernel's launch_task
        rec = frame.f_locals.get("task_record") if frame is not None else None
        if isinstance(rec, dict) and isinstance(rec.get("id"), int):
            t = rec.get("try_id") or 0
            return f"{name}-{rec['id']}" + (f".try{t}" if t else "")
        return f"{name}-d{next(self._ids)}"

    @property
    def plugin(self) -> Plugin | None:
        return None if self._resilient is None else self._resilient.plugin

    @property
    def resilient(self) -> ResilientExecutor | None:
        """The ResilientExecutor that carries out the actions (for tests and operators)."""
        return self._resilient

    def shutdown(self) -> None:
        """Stops taking tasks, cancels what is unfinished, closes the plugin (if opened here),
        scales in and shuts down the inner executors."""
        if self._resilient is not None:
            self._resilient.shutdown(wait=False, cancel_futures=True)
            self._resilient = None
        self._stop_inner()
        super().shutdown()

    def _stop_inner(self) -> None:
        if self._poller is not None:
            self._poller.close()
            self._poller = None
        for ex in self._started:
            try:
                ex.shutdown()
            except Exception:  # noqa: BLE001 - shut the others down too
                log.exception("shutting down site %s failed", ex.label)
        self._started = []

    def monitor_resources(self) -> bool:
        return True
