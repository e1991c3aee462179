"""`diaspora.Plugin`: one handle of libdiaspora_plugin.so, over its C ABI (ctypes).

    import diaspora
    with diaspora.Plugin.open("workflow.yaml") as p:
        p.submitted("t1", site="a", name="recon")
        p.started("t1", site="a", worker="w0")
        p.heartbeat("t1", metrics={"step_time_s": 0.4})
        p.completed("t1", exit_code=0)
        for action in p.actions(timeout=0):   # or p.on_action(callback)
            action.done("restarted")

Threads: every method may be called from any thread, as the C ABI allows, except close()
(once, after the other calls returned). ctypes releases the GIL for the whole foreign
call, so a hook that takes the plugin's spill path, or close() waiting for acks, never
holds up other Python threads. Action callbacks run on the plugin's control thread.
"""

from __future__ import annotations

import ctypes as C
import logging
import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping

from . import _abi as A
from .errors import AbiError, ClosedError, DiasporaError, LibraryError, SpecError

log = logging.getLogger("diaspora")

_TI = A.TaskInfo
_TIS = C.sizeof(A.TaskInfo)
_byref = C.byref
_M = A.Metric
_MS = C.sizeof(A.Metric)
_pack = A.pack_metrics
_tls = threading.local()  # per thread: the structs of the hot hooks, reused
_SCOPES = {"task": A.SCOPE_TASK, "site": A.SCOPE_SITE, "resource": A.SCOPE_RESOURCE}


def _b(s: str | None) -> bytes | None:
    return None if s is None else s.encode()


@dataclass
class Action:
    """An action the plugin's policies (origin "local") or an operator (origin "control")
    asks the engine to carry out. Acknowledge it once with done() or failed()."""

    id: str
    kind: str  # restart | migrate | speculate | checkpoint | throttle | cancel | drain | undrain
    task_id: str
    site: str
    target_site: str
    reason: str
    origin: str
    issued_us: int  # when this plugin received it
    requested_us: int  # when it was requested (the request's own time; 0: unknown)
    _plugin: "Plugin" = field(repr=False, compare=False, default=None)  # type: ignore[assignment]

    @classmethod
    def _from_struct(cls, s: A.ActionStruct, plugin: "Plugin") -> "Action":
        d = lambda v: v.decode("utf-8", errors="replace")  # noqa: E731
        return cls(d(s.id), d(s.kind_name), d(s.task_id), d(s.site), d(s.target_site), d(s.reason),
                   d(s.origin), int(s.issued_us), int(s.requested_us), plugin)

    def done(self, message: str | None = None) -> None:
        """The engine carried the action out (published as action.done, status done).
        Raises DiasporaError (DIASPORA_ERR_NOT_FOUND) when it was already acknowledged."""
        self._plugin._ack(self._plugin._lib.diaspora_action_done, self.id, message)

    def failed(self, reason: str) -> None:
        """The engine could not carry it out; `reason` (required) says why."""
        if not reason:
            raise ValueError("Action.failed needs a reason")
        self._plugin._ack(self._plugin._lib.diaspora_action_failed, self.id, reason)


class Plugin:
    """One open plugin handle. Use Plugin.open(); the constructor is internal."""

    enabled = True

    def __init__(self, lib: C.CDLL, handle: C.c_void_p, library_path: str):
        self._lib = lib
        self._h = handle
        self.library_path = library_path
        self._callback = None  # keeps the ctypes callback alive while installed
        self._closed = False
        for hook in A.TASK_HOOKS:
            setattr(self, f"_f_{hook}", A.fast_hook(lib, f"diaspora_task_{hook}"))
        self._f_metric = A.fast_hook(lib, "diaspora_metric_sample")

    # ---- open / close ----------------------------------------------------------------------

    @classmethod
    def open(cls, spec: str | os.PathLike, *, library: str | os.PathLike | None = None,
             required: bool | None = None) -> "Plugin":
        """Opens a handle from a spec: a path (str or PathLike) or YAML text (a str with a
        newline in it, or a JSON object). The library is `library`, else the spec's plugin.library (relative to
        the spec's folder), else $DIASPORA_PLUGIN_LIBRARY, else the build tree's or the
        installed one. Never waits for the relay.

        Raises SpecError (every problem as FILE:LINE:COL lines), LibraryError, AbiError or
        DiasporaError (spool unusable, ...). When `required` is False, or None and the spec
        says plugin.required: false, these are logged as a warning instead and a disabled
        plugin is returned: every hook does nothing and no action ever arrives, so the
        engine runs its graph without Diaspora."""
        text, path = cls._spec_source(spec)
        settings = _peek_plugin_settings(text, path)
        if required is None:
            required = settings.get("required", True) is not False
        try:
            lib_arg = library
            if lib_arg is None and isinstance(settings.get("library"), str):
                lib_arg = Path(settings["library"])
                if not lib_arg.is_absolute() and path is not None:
                    lib_arg = path.parent / lib_arg
            lib, lib_path = A.load_library(lib_arg)
            h = C.c_void_p()
            err = C.create_string_buffer(16384)
            if path is not None:
                rc = lib.diaspora_open_file(os.fsencode(path), C.byref(h), err, len(err))
            else:
                rc = lib.diaspora_open_yaml(text.encode(), C.byref(h), err, len(err))
            if rc != A.OK:
                msg = err.value.decode("utf-8", errors="replace").strip()
                if rc == A.ERR_CONFIG:
                    raise SpecError(msg)
                raise DiasporaError(msg or A.STATUS_NAMES[rc], A.STATUS_NAMES[rc] if rc < len(A.STATUS_NAMES) else str(rc))
            return cls(lib, h, lib_path)
        except (SpecError, LibraryError, AbiError, DiasporaError) as e:
            if required:
                raise
            warnings.warn(f"diaspora: running without the plugin (plugin.required is false): {e}",
                          RuntimeWarning, stacklevel=2)
            log.warning("running without the plugin (plugin.required is false): %s", e)
            return DisabledPlugin(str(e))

    @staticmethod
    def _spec_source(spec) -> tuple[str | None, Path | None]:
        if isinstance(spec, os.PathLike):
            return None, Path(spec)
        if isinstance(spec, str):
            text = "\n" in spec or spec.lstrip().startswith("{")
            return (spec, None) if text else (None, Path(spec))
        raise TypeError(f"spec must be a path or YAML text, not {type(spec).__name__}")

    def close(self, timeout: float = 10.0) -> bool:
        """Flushes for about `timeout` seconds, spools what the relay has not acked, stops
        the plugin's threads and frees the handle. Returns True when everything was acked,
        False when events remain in the spool for the next open. Raises DiasporaError when
        the spool failed or events were lost. Idempotent; call it once the other calls have
        returned (it must not run concurrently with them)."""
        if self._closed:
            return True
        self._closed = True
        h, self._h = self._h, None
        rc = self._lib.diaspora_close(h, int(max(0.0, timeout) * 1000))
        self._callback = None
        if rc == A.OK:
            return True
        if rc == A.ERR_TIMEOUT:
            return False
        raise DiasporaError(f"close: {A.STATUS_NAMES[rc]} (the spool failed or events were lost)", A.STATUS_NAMES[rc])

    def __enter__(self) -> "Plugin":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # a forgotten handle still flushes to its spool
        try:
            if not self._closed and self._h is not None:
                self.close(0)
        except Exception:
            pass

    # ---- errors ------------------------------------------------------------------------------

    def last_error(self) -> str:
        """The handle's most recent problem (from any thread, including the plugin's own)."""
        if self._h is None:
            return ""
        buf = C.create_string_buffer(8192)
        self._lib.diaspora_last_error(self._h, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def _raise(self, rc: int, what: str):
        name = A.STATUS_NAMES[rc] if 0 <= rc < len(A.STATUS_NAMES) else f"status {rc}"
        if self._h is None or rc == A.ERR_CLOSED:
            raise ClosedError(f"{what}: the plugin handle is closed")
        raise DiasporaError(f"{what}: {name}: {self.last_error()}", name)

    # ---- task hooks: one call each, arguments copied by the plugin --------------------------
    # Fields left at their defaults are "not reported"; timestamp_us 0 = now. Each hook
    # builds the smallest struct it needs and sets only the fields given: ctypes field
    # stores are the cost here (bench/adapters measures a hook at about a microsecond).

    def _call(self, fn, hook: str, task_id: str, info) -> None:
        h = self._h
        if h is None:
            raise ClosedError(f"{hook}: the plugin handle is closed")
        rc = fn(h, _byref(info))
        if rc:
            self._raise(rc, f"{hook}({task_id!r})")

    def submitted(self, task_id: str, *, site: str | None = None, name: str | None = None, attempt: int = 0,
                  deadline_s: float = 0.0, timestamp_us: int = 0) -> None:
        """The engine accepted the task (attempt 1, 2, ... for a retry). `deadline_s`: seconds it should take."""
        info = _TI(_TIS, task_id.encode(), site and site.encode(), None, name and name.encode(), timestamp_us,
                   attempt)
        if deadline_s:
            info.deadline_s = deadline_s
        self._call(self._f_submitted, "submitted", task_id, info)

    def started(self, task_id: str, *, site: str | None = None, worker: str | None = None, attempt: int = 0,
                timestamp_us: int = 0) -> None:
        """The task began running on `worker` of `site`."""
        info = _TI(_TIS, task_id.encode())
        if site:
            info.site = site.encode()
        if worker:
            info.worker = worker.encode()
        if attempt:
            info.attempt = attempt
        if timestamp_us:
            info.timestamp_us = timestamp_us
        self._call(self._f_started, "started", task_id, info)

    def heartbeat(self, task_id: str, *, metrics: Mapping[str, float] | None = None, site: str | None = None,
                  worker: str | None = None, attempt: int = 0, timestamp_us: int = 0) -> None:
        """The running task is alive; `metrics` such as {"step_time_s": 0.4} feed task.<name> signals."""
        if metrics is None and site is None and worker is None and not attempt and not timestamp_us:
            try:  # the common case: this thread's own struct, only the id set
                info = _tls.hb
            except AttributeError:
                info = _tls.hb = _TI(_TIS)
            info.task_id = task_id.encode()
        else:
            info = _TI(_TIS, task_id.encode())
            if site:
                info.site = site.encode()
            if worker:
                info.worker = worker.encode()
            if attempt:
                info.attempt = attempt
            if timestamp_us:
                info.timestamp_us = timestamp_us
            if metrics:
                info.metrics, keep = _pack(metrics)
                info.metric_count = len(metrics)
        h = self._h
        if h is None:
            raise ClosedError("heartbeat: the plugin handle is closed")
        rc = self._f_heartbeat(h, _byref(info))
        if rc:
            self._raise(rc, f"heartbeat({task_id!r})")

    def progress(self, task_id: str, fraction: float, *, step: int = -1,
                 metrics: Mapping[str, float] | None = None, timestamp_us: int = 0) -> None:
        """Fraction done in [0, 1] and optionally the step number."""
        if metrics is None and not timestamp_us:
            try:
                info = _tls.pg
            except AttributeError:
                info = _tls.pg = _TI(_TIS)
            info.task_id = task_id.encode()
        else:
            info = _TI(_TIS, task_id.encode())
            if timestamp_us:
                info.timestamp_us = timestamp_us
            if metrics:
                info.metrics, keep = _pack(metrics)
                info.metric_count = len(metrics)
        info.progress = fraction
        info.step = step
        h = self._h
        if h is None:
            raise ClosedError("progress: the plugin handle is closed")
        rc = self._f_progress(h, _byref(info))
        if rc:
            self._raise(rc, f"progress({task_id!r})")

    def completed(self, task_id: str, *, exit_code: int | None = None, site: str | None = None, attempt: int = 0,
                  timestamp_us: int = 0) -> None:
        """The task succeeded."""
        info = _TI(_TIS, task_id.encode(), site and site.encode(), None, None, timestamp_us, attempt)
        if exit_code is not None:
            info.exit_code = exit_code
            info.has_exit_code = 1
        self._call(self._f_completed, "completed", task_id, info)

    def failed(self, task_id: str, reason: str, *, exit_code: int | None = None, retryable: bool = False,
               failure: str | None = None, site: str | None = None, attempt: int = 0, timestamp_us: int = 0) -> None:
        """The task failed; `reason` (required, e.g. the exception text); `retryable` when
        the engine itself will try it again; `failure` "error" (the task's own: an exception,
        an exit status) or "lost" (its worker or process died), which the default protection
        retries (docs/anomaly.md, "Default protection"); None: not said."""
        if failure not in (None, "error", "lost"):
            raise ValueError(f"failure must be 'error', 'lost' or None, not {failure!r}")
        if not reason:
            raise ValueError("failed() needs a reason")
        info = _TI(_TIS, task_id.encode(), site and site.encode(), None, None, timestamp_us, attempt)
        info.reason = reason[: A.MAX_TEXT].encode()
        if exit_code is not None:
            info.exit_code = exit_code
            info.has_exit_code = 1
        if retryable:
            info.retryable = 1
        if failure:
            info.failure = A.FAILURE_ERROR if failure == "error" else A.FAILURE_LOST
        self._call(self._f_failed, "failed", task_id, info)

    def cancelled(self, task_id: str, reason: str | None = None, *, site: str | None = None,
                  attempt: int = 0, timestamp_us: int = 0) -> None:
        """The task was cancelled (released, superseded by a copy, ...)."""
        info = _TI(_TIS, task_id.encode(), site and site.encode(), None, None, timestamp_us, attempt)
        if reason:
            info.reason = reason[: A.MAX_TEXT].encode()
        self._call(self._f_cancelled, "cancelled", task_id, info)

    # ---- metrics, data, resources -------------------------------------------------------------

    def metric(self, scope: str, id: str, name: str, value: float, *, timestamp_us: int = 0) -> None:
        """A free-form sample: scope "task", "site" or "resource"; feeds <scope>.<name> signals."""
        h = self._h
        if h is None:
            raise ClosedError("metric: the plugin handle is closed")
        sc = _SCOPES.get(scope)
        if sc is None:
            raise ValueError(f"scope must be 'task', 'site' or 'resource', not {scope!r}")
        m = _M(_MS, sc, id.encode(), name.encode(), value, timestamp_us)
        rc = self._f_metric(h, _byref(m))
        if rc:
            self._raise(rc, f"metric({scope}, {id!r}, {name!r})")

    def data_arrived(self, stream: str, seq: int, *, bytes: int = -1, uri: str | None = None,
                     checksum: str | None = None, site: str | None = None, timestamp_us: int = 0) -> None:
        """Item `seq` of `stream` arrived (a detector frame, a file, ...)."""
        if self._h is None:
            raise ClosedError("data_arrived: the plugin handle is closed")
        d = A.DataInfo(C.sizeof(A.DataInfo), stream.encode(), seq, bytes, _b(uri), _b(checksum), _b(site), timestamp_us)
        rc = self._lib.diaspora_data_arrived(self._h, C.byref(d))
        if rc:
            self._raise(rc, f"data_arrived({stream!r}, {seq})")

    # ---- data items (docs/streaming.md) -------------------------------------------------------

    def put_item(self, data: bytes, *, topic: str | None = None, id: str | None = None, type: str | None = None,
                 stream: str | None = None, seq: int = -1, content_type: str | None = None, site: str | None = None,
                 deadline: str | None = None, timeout: float = 60.0) -> ItemRef:
        """Puts `data` through the relay as one data item (topic default "<workflow>.data") and
        returns where it is, once the relay acknowledged it. Blocks (backpressure): the item goes
        over a connection of its own, never the events' queue or spool, and is resent across
        reconnects until `timeout` seconds (then DiasporaError DIASPORA_ERR_TIMEOUT). Putting the
        same `id` again writes nothing twice (`duplicate`). A refusal is DiasporaError
        DIASPORA_ERR_INVALID with the relay's reason."""
        if self._h is None:
            raise ClosedError("put_item: the plugin handle is closed")
        buf = bytes(data)
        info = A.ItemInfo(C.sizeof(A.ItemInfo), C.cast(C.c_char_p(buf), C.c_void_p), len(buf), _b(topic), _b(id),
                          _b(type), _b(stream), seq, _b(content_type), _b(site), _b(deadline), int(timeout * 1000))
        ref = A.ItemRef(C.sizeof(A.ItemRef))
        rc = self._lib.diaspora_item_put(self._h, C.byref(info), C.byref(ref))
        if rc:
            self._raise(rc, "put_item")
        return ItemRef(ref.topic.decode(), ref.offset, bool(ref.duplicate), bool(ref.late))

    def get_item(self, offset: int | str | ItemRef, *, topic: str | None = None, timeout: float = 60.0) -> tuple[bytes, dict]:
        """The data item whose event is at `offset` of `topic` (default "<workflow>.data"), or
        at an ItemRef or its diaspora://TOPIC/OFFSET URI (a data_arrived event's `uri`):
        its bytes (size and SHA-256 checked) and its event. DiasporaError DIASPORA_ERR_NOT_FOUND
        when the offset holds no item, DIASPORA_ERR_IO on a checksum mismatch,
        DIASPORA_ERR_TIMEOUT when nothing came."""
        import json
        if self._h is None:
            raise ClosedError("get_item: the plugin handle is closed")
        if isinstance(offset, str):
            offset = ItemRef.parse(offset)
        if isinstance(offset, ItemRef):
            topic, offset = offset.topic, offset.offset
        data, size, event = C.c_void_p(), C.c_size_t(), C.c_void_p()
        rc = self._lib.diaspora_item_get(self._h, _b(topic), offset, int(timeout * 1000), C.byref(data), C.byref(size),
                                         C.byref(event))
        if rc:
            self._raise(rc, f"get_item({offset})")
        try:
            return C.string_at(data, size.value), json.loads(C.string_at(event).decode())
        finally:
            self._lib.diaspora_item_free(data)
            self._lib.diaspora_item_free(event)

    def resource_status(self, resource_id: str, kind: str, state: str, *, site: str | None = None,
                        metrics: Mapping[str, float] | None = None, timestamp_us: int = 0) -> None:
        """A resource's state: kind site|worker|node|gpu|link|relay, state up|degraded|down|unknown."""
        if self._h is None:
            raise ClosedError("resource_status: the plugin handle is closed")
        r = A.ResourceInfo(C.sizeof(A.ResourceInfo), resource_id.encode(), kind.encode(), state.encode(), _b(site),
                           timestamp_us)
        if metrics:
            packed, keep = _pack(metrics)
            r.metrics = C.cast(C.c_char_p(packed), C.POINTER(A.MetricValue))
            r.metric_count = len(metrics)
        rc = self._lib.diaspora_resource_status(self._h, C.byref(r))
        if rc:
            self._raise(rc, f"resource_status({resource_id!r})")

    # ---- actions --------------------------------------------------------------------------------

    def on_action(self, callback: Callable[[Action], None] | None) -> None:
        """Installs `callback(action)` (None removes it). It runs on the plugin's control
        thread, one call at a time, and should return quickly (hand the action to the
        engine's own thread). If it raises, the action is acknowledged as failed with the
        exception's text. Actions that arrived before stay available to actions()."""
        if self._h is None:
            raise ClosedError("on_action: the plugin handle is closed")
        if callback is None:
            cb = A.ACTION_CALLBACK()
        else:
            def trampoline(ptr, _user):
                action = Action._from_struct(ptr.contents, self)
                try:
                    callback(action)
                except Exception as e:  # never let it unwind into C
                    log.exception("action callback raised for %s", action.id)
                    try:
                        action.failed(f"the engine's action callback raised {type(e).__name__}: {e}")
                    except DiasporaError:
                        pass
            cb = A.ACTION_CALLBACK(trampoline)
        rc = self._lib.diaspora_set_action_callback(self._h, cb, None)
        if rc:
            self._raise(rc, "on_action")
        self._callback = cb if callback is not None else None

    def poll_action(self) -> Action | None:
        """The oldest action waiting (one that arrived with no callback installed), or None."""
        if self._h is None:
            raise ClosedError("poll_action: the plugin handle is closed")
        s = A.ActionStruct()
        s.struct_size = C.sizeof(A.ActionStruct)
        rc = self._lib.diaspora_poll_action(self._h, C.byref(s))
        if rc == A.ERR_EMPTY:
            return None
        if rc:
            self._raise(rc, "poll_action")
        return Action._from_struct(s, self)

    def actions(self, timeout: float | None = None, interval: float = 0.01) -> Iterator[Action]:
        """Yields actions as they arrive, until `timeout` seconds have passed with none
        (None: until the handle is closed; 0: only those waiting now)."""
        idle_since = time.monotonic()
        while not self._closed:
            a = self.poll_action()
            if a is not None:
                idle_since = time.monotonic()
                yield a
                continue
            if timeout is not None and time.monotonic() - idle_since >= timeout:
                return
            time.sleep(interval)

    def _ack(self, fn, action_id: str, text: str | None) -> None:
        if self._h is None:
            raise ClosedError("acknowledge: the plugin handle is closed")
        rc = fn(self._h, action_id.encode(), _b(text and text[: A.MAX_TEXT]))
        if rc:
            self._raise(rc, f"acknowledge action {action_id!r}")

    # ---- statistics -------------------------------------------------------------------------------

    def stats(self) -> dict:
        """The plugin's counters (events_accepted, events_acked, spool_records, connected, ...)."""
        if self._h is None:
            raise ClosedError("stats: the plugin handle is closed")
        s = A.Stats()
        s.struct_size = C.sizeof(A.Stats)
        rc = self._lib.diaspora_get_stats(self._h, C.byref(s))
        if rc:
            self._raise(rc, "stats")
        return {name: int(getattr(s, name)) for name, _ in A.Stats._fields_ if name != "struct_size"}

    def wait_acked(self, timeout: float = 30.0) -> bool:
        """Waits until every accepted event is acked by the relay (True) or `timeout` passes.
        A metric sample merged into a later one (metrics_coalesced) is acked with it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.stats()
            if s["events_acked"] + s["metrics_coalesced"] >= s["events_accepted"] and s["spool_records"] == 0:
                return True
            time.sleep(0.02)
        return False

    @staticmethod
    def library_version(library: str | os.PathLike | None = None) -> str:
        """The version string of the library that open() would load."""
        lib, _ = A.load_library(library)
        return lib.diaspora_library_version().decode()


@dataclass(frozen=True)
class ItemRef:
    """Where Plugin.put_item put an item: its event's offset in `topic` (its chunks follow)."""
    topic: str
    offset: int
    duplicate: bool = False  # the relay held it already (same id): nothing written
    late: bool = False       # stored after its deadline

    @property
    def uri(self) -> str:
        """diaspora://TOPIC/OFFSET: where it is, for data_arrived(uri=...) and get_item()."""
        return f"diaspora://{self.topic}/{self.offset}"

    @staticmethod
    def parse(uri: str) -> "ItemRef":
        """The ItemRef of a diaspora://TOPIC/OFFSET URI; ValueError for anything else."""
        rest = uri[len("diaspora://"):] if uri.startswith("diaspora://") else ""
        topic, _, offset = rest.partition("/")
        if not topic or not offset.isdigit():
            raise ValueError(f"{uri!r} is not a data item's URI (diaspora://TOPIC/OFFSET)")
        return ItemRef(topic, int(offset))


class _NoLibrary:
    def __getattr__(self, name):
        return None


class DisabledPlugin(Plugin):
    """What open() returns when the plugin is not required and could not be opened:
    every hook does nothing, no action arrives. `reason` says why it is disabled."""

    enabled = False

    def __init__(self, reason: str):  # noqa: D107 (no handle at all)
        self.reason = reason
        self._closed = False
        self._h = None
        self._lib = _NoLibrary()
        self.library_path = ""

    def _call(self, *args, **kwargs) -> None:
        return None

    def heartbeat(self, *args, **kwargs) -> None:
        return None

    def progress(self, *args, **kwargs) -> None:
        return None

    def metric(self, *args, **kwargs) -> None:
        return None

    def data_arrived(self, *args, **kwargs) -> None:
        return None

    def put_item(self, *args, **kwargs):
        # Bytes cannot be dropped the way a hook's event is: say so.
        raise DiasporaError(f"put_item: the plugin is disabled ({self.reason})", "DIASPORA_ERR_CLOSED")

    def get_item(self, *args, **kwargs):
        raise DiasporaError(f"get_item: the plugin is disabled ({self.reason})", "DIASPORA_ERR_CLOSED")

    def resource_status(self, *args, **kwargs) -> None:
        return None

    def on_action(self, callback) -> None:
        return None

    def poll_action(self) -> None:
        return None

    def actions(self, timeout: float | None = None, interval: float = 0.01) -> Iterator[Action]:
        return iter(())

    def stats(self) -> dict:
        return {}

    def wait_acked(self, timeout: float = 30.0) -> bool:
        return True

    def last_error(self) -> str:
        return self.reason

    def close(self, timeout: float = 10.0) -> bool:
        self._closed = True
        return True


def _peek_plugin_settings(text: str | None, path: Path | None) -> dict:
    """plugin.library and plugin.required from the spec, read before the library is loaded
    (the plugin validates the whole spec itself; a spec that does not parse here gives {})."""
    try:
        import yaml

        doc = yaml.safe_load(text if text is not None else path.read_text())
        plugin = doc.get("plugin") if isinstance(doc, dict) else None
        return plugin if isinstance(plugin, dict) else {}
    except Exception:
        return {}



for _hook in A.TASK_HOOKS:
    setattr(DisabledPlugin, f"_f_{_hook}", None)
