"""Diaspora inside Python engines: a thin binding over the engine plugin's C ABI
(libdiaspora_plugin.so) and adapters built on it.

- `diaspora.Plugin`: open a handle from a workflow spec, report task lifecycles, receive
  and acknowledge the plugin's actions (docs/adapters.md, "Python").
- `diaspora.futures.ResilientExecutor`: any `concurrent.futures` executors as sites.
- `diaspora.dask`: `DiasporaSchedulerPlugin` and `DiasporaWorkerPlugin` for Dask.
- `diaspora.task`: what a task's own code calls to report steps, progress and metrics.

Only the standard library and Debian packages (python3-yaml; python3-distributed for the
Dask adapter) are used. With a source checkout: `PYTHONPATH=engine-adapters/python`.
"""

from .errors import AbiError, ClosedError, DiasporaError, LibraryError, SpecError
from .plugin import Action, DisabledPlugin, Plugin

__all__ = ["Plugin", "DisabledPlugin", "Action", "DiasporaError", "SpecError", "LibraryError", "AbiError",
           "ClosedError"]
