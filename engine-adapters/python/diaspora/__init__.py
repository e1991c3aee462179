"""Diaspora inside Python engines: a thin binding over the engine plugin's C ABI
(libdiaspora_plugin.so) and adapters built on it.

- `diaspora.Plugin`: open a handle from a workflow spec, report task lifecycles, receive
  and acknowledge the plugin's actions (docs/adapters.md, "Python").
- `diaspora.futures.ResilientExecutor`: any `concurrent.futures` executors as sites.
- `diaspora.parsl.DiasporaExecutor`: a Parsl executor over real HighThroughputExecutors.
- `diaspora.dask`: `DiasporaSchedulerPlugin` and `DiasporaWorkerPlugin` for Dask.
- `diaspora.task`: what a task's own code calls to report steps, progress and metrics.

The package needs only the standard library; each engine adapter needs its engine (the
versions tested are pinned in requirements.lock). `pip install -e engine-adapters/python`
(scripts/install-deps.sh does so into the project's .venv).
"""

from .errors import AbiError, ClosedError, DiasporaError, LibraryError, SpecError
from .plugin import Action, DisabledPlugin, ItemRef, Plugin

__all__ = ["Plugin", "DisabledPlugin", "Action", "ItemRef", "DiasporaError", "SpecError", "LibraryError", "AbiError",
           "ClosedError"]
