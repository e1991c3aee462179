"""Diaspora inside a Globus Compute endpoint: `DiasporaEngine`, a GlobusComputeEngine (an
HTEX underneath) whose tasks are reported through the engine plugin and protected by its
default protection and the spec's policies.

An endpoint selects it in its `config.py` (the YAML `engine: type:` names only Globus
Compute's own engines):

    from globus_compute_endpoint.endpoint.config import UserEndpointConfig
    from parsl.providers import LocalProvider
    from diaspora.globus_compute import DiasporaEngine

    config = UserEndpointConfig(engine=DiasporaEngine(
        spec="/path/to/workflow.yaml", site="polaris", max_workers_per_node=4,
        provider=LocalProvider(init_blocks=1, max_blocks=1)))

Each task the endpoint receives is one Diaspora task (its id is the Globus Compute task id)
on one site (`site`, default "endpoint"): submitted, started (the worker's host:pid),
heartbeats with CPU and memory, what the function reports through diaspora.task, completed
or failed. Lost workers and managers are seen at once and their tasks restarted, a hung
task restarted and its worker killed, as in diaspora.parsl (process_control: the workers on
the endpoint's host). A task's own exception is the function's and goes back to the user
at once (Globus Compute packs it into the Result). Diaspora owns the retries of lost
attempts: keep `max_retries_on_system_failure` at 0 (its default).

What was run: the engine started directly, as Globus Compute's own tests start engines
(tests/python/test_adapters_globus_compute.py); the endpoint daemon, the Globus web service
and the AMQP path need the Globus service and were not run.
"""

from __future__ import annotations

import itertools
import typing as t

from globus_compute_endpoint.engines import GlobusComputeEngine

from .futures import ResilientExecutor
from .parsl import _Site, classify, outcome, report_address_for
from .plugin import Plugin


class DiasporaEngine(GlobusComputeEngine):
    """A GlobusComputeEngine with Diaspora. `spec` (a workflow spec: path or YAML text) or
    `plugin` (an open diaspora.Plugin, left open) is required; `site` names the endpoint's
    site in the spec; `heartbeat_s`, `failure_grace`, `max_attempts` are
    diaspora.futures.ResilientExecutor's; `report_address` is diaspora.parsl.DiasporaExecutor's
    ("auto": UDP for workers of a batch provider, on the engine's HTEX `address`). Every other keyword is GlobusComputeEngine's.
    The endpoint calls start(), submit() (from its task thread) and shutdown(). Raises
    ValueError without a spec; the plugin's SpecError / LibraryError at start()."""

    def __init__(self, *args, spec=None, plugin: Plugin | None = None, site: str = "endpoint",
                 heartbeat_s: float = 1.0, failure_grace: float = 3.0, max_attempts: int = 5,
                 report_address: str | None = "auto", **kwargs):
        if (spec is None) == (plugin is None):
            raise ValueError("DiasporaEngine needs spec= (a workflow spec: path or YAML text) or plugin= (an open "
                             "diaspora.Plugin)")
        super().__init__(*args, **kwargs)
        self.diaspora_spec = spec
        self._given_plugin = plugin
        self.site = site
        self._options = dict(heartbeat_s=heartbeat_s, failure_grace=failure_grace, max_attempts=max_attempts)
        self._report_address = report_address
        self._resilient: ResilientExecutor | None = None
        self._ids = itertools.count(1)

    def start(self, *args, **kwargs) -> None:
        """Starts the engine (its HTEX and JobStatusPoller), then opens the plugin."""
        super().start(*args, **kwargs)
        plugin = self._given_plugin if self._given_plugin is not None else Plugin.open(self.diaspora_spec)
        where = self._report_address
        where = report_address_for({self.site: self.executor}) if where == "auto" else where
        self._resilient = ResilientExecutor({self.site: _Site(self.site, self.executor)}, plugin=plugin,
                                            classify=classify, outcome=outcome, process_control=True,
                                            error_grace=0.0, close_plugin=self._given_plugin is None,
                                            report_address=where, **self._options)

    def _submit(self, resource_specification: dict, func: t.Callable, packed_task: bytes,
                args: tuple = (), kwargs: dict | None = None):
        """One task through ResilientExecutor: func(packed_task, *args, **kwargs) (Globus
        Compute's execute_task) in an HTEX worker, wrapped to report its attempt."""
        if self._resilient is None:
            raise RuntimeError("DiasporaEngine was not started")
        if resource_specification:
            raise ValueError(f"resource specification {sorted(resource_specification)}: DiasporaEngine runs tasks "
                             "on its HTEX as they come (no MPI resource specification)")
        tid = str(args[0]) if args else f"gc-task-{next(self._ids)}"
        fut = self._resilient.submit_task(func, (packed_task, *args), kwargs or {}, task_id=tid, name="globus-compute")
        fut.executor_task_id = next(self._ids)
        return fut

    @property
    def resilient(self) -> ResilientExecutor | None:
        """The ResilientExecutor that carries out the actions (for tests and operators)."""
        return self._resilient

    def shutdown(self, /, **kwargs) -> None:
        if self._resilient is not None:
            self._resilient.shutdown(wait=False, cancel_futures=True)
            self._resilient = None
        super().shutdown(**kwargs)
