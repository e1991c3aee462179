"""ctypes declarations of the plugin's C ABI (plugin/include/diaspora/plugin.h, ABI 1.3)
and the search for libdiaspora_plugin.so.

Why ctypes: it is in the standard library (no compiler, no build step, no package beyond
Debian's python3), it releases the GIL around every foreign call (so a hook that takes the
spill path, or close() waiting for acks, never stalls other Python threads), and a hook
call costs about a microsecond (bench/adapters/bench_hooks.py measures it). pybind11 or
cffi would add a compiled module per Python version for no gain on this ABI, which is
plain C with fixed structs.

Everything here mirrors the header one for one; keep them in step (tests/python
test_adapters_binding.py checks the struct sizes against the library's expectations).
"""

from __future__ import annotations

import ctypes as C
import os
import struct
from pathlib import Path

ABI_MAJOR, ABI_MINOR = 1, 3
ABI_VERSION = (ABI_MAJOR << 16) | ABI_MINOR

MAX_ID = 255
MAX_TEXT = 4095
MAX_METRIC_NAME = 63
MAX_METRICS = 64

# diaspora_status
OK, ERR_NULL, ERR_INVALID, ERR_CONFIG, ERR_IO, ERR_CLOSED, ERR_TIMEOUT, ERR_NOT_FOUND, ERR_EMPTY, \
    ERR_VERSION, ERR_INTERNAL = range(11)
STATUS_NAMES = ["DIASPORA_OK", "DIASPORA_ERR_NULL", "DIASPORA_ERR_INVALID", "DIASPORA_ERR_CONFIG",
                "DIASPORA_ERR_IO", "DIASPORA_ERR_CLOSED", "DIASPORA_ERR_TIMEOUT", "DIASPORA_ERR_NOT_FOUND",
                "DIASPORA_ERR_EMPTY", "DIASPORA_ERR_VERSION", "DIASPORA_ERR_INTERNAL"]

# diaspora_scope
SCOPE_TASK, SCOPE_SITE, SCOPE_RESOURCE = 1, 2, 3

# diaspora_action_kind
ACTION_KINDS = {1: "restart", 2: "migrate", 3: "speculate", 4: "checkpoint", 5: "throttle", 6: "cancel", 7: "drain", 8: "undrain"}

TASK_HOOKS = ("submitted", "started", "heartbeat", "progress", "completed", "failed", "cancelled")


class MetricValue(C.Structure):
    _fields_ = [("name", C.c_char_p), ("value", C.c_double)]


class TaskInfo(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("task_id", C.c_char_p), ("site", C.c_char_p),
                ("worker", C.c_char_p), ("name", C.c_char_p), ("timestamp_us", C.c_int64),
                ("attempt", C.c_int32), ("exit_code", C.c_int32), ("has_exit_code", C.c_int32),
                ("retryable", C.c_int32), ("progress", C.c_double), ("step", C.c_int64),
                ("deadline_s", C.c_double), ("reason", C.c_char_p),
                # const diaspora_metric_value*, declared as char* so that a bytes object
                # holding the packed array (pack_metrics) can be stored directly: much
                # cheaper from Python than building MetricValue objects.
                ("metrics", C.c_char_p), ("metric_count", C.c_size_t),
                ("failure", C.c_int32)]  # ABI 1.2: a diaspora_failure_kind (FAILURE_*)


FAILURE_UNKNOWN, FAILURE_ERROR, FAILURE_LOST = 0, 1, 2


class Metric(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("scope", C.c_int32), ("id", C.c_char_p), ("name", C.c_char_p),
                ("value", C.c_double), ("timestamp_us", C.c_int64)]


class DataInfo(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("stream", C.c_char_p), ("seq", C.c_int64), ("bytes", C.c_int64),
                ("uri", C.c_char_p), ("checksum", C.c_char_p), ("site", C.c_char_p), ("timestamp_us", C.c_int64)]


class ResourceInfo(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("resource_id", C.c_char_p), ("kind", C.c_char_p),
                ("state", C.c_char_p), ("site", C.c_char_p), ("timestamp_us", C.c_int64),
                ("metrics", C.POINTER(MetricValue)), ("metric_count", C.c_size_t)]


class ItemInfo(C.Structure):  # ABI 1.3
    _fields_ = [("struct_size", C.c_size_t), ("bytes", C.c_void_p), ("size", C.c_size_t), ("topic", C.c_char_p),
                ("id", C.c_char_p), ("type", C.c_char_p), ("stream", C.c_char_p), ("seq", C.c_int64),
                ("content_type", C.c_char_p), ("site", C.c_char_p), ("deadline", C.c_char_p),
                ("timeout_ms", C.c_int64)]


class ItemRef(C.Structure):  # ABI 1.3
    _fields_ = [("struct_size", C.c_size_t), ("topic", C.c_char * (MAX_ID + 1)), ("offset", C.c_uint64),
                ("duplicate", C.c_int32), ("late", C.c_int32)]


class ActionStruct(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("id", C.c_char * (MAX_ID + 1)), ("kind", C.c_int32),
                ("kind_name", C.c_char * 16), ("task_id", C.c_char * (MAX_ID + 1)),
                ("site", C.c_char * (MAX_ID + 1)), ("target_site", C.c_char * (MAX_ID + 1)),
                ("reason", C.c_char * (MAX_TEXT + 1)), ("origin", C.c_char * 16), ("issued_us", C.c_int64),
                ("requested_us", C.c_int64)]  # ABI 1.1


STAT_COUNTERS = ("events_accepted", "events_acked", "events_spilled", "metrics_coalesced", "events_lost",
                 "spool_records", "spool_bytes", "reconnects", "invalid_transitions", "actions_received",
                 "events_rejected")


class Stats(C.Structure):
    _fields_ = ([("struct_size", C.c_size_t)] + [(n, C.c_uint64) for n in STAT_COUNTERS]
                + [("connected", C.c_int32), ("control_connected", C.c_int32)])


_metric_names: dict[str, tuple[bytes, int]] = {}
_packers: dict[int, struct.Struct] = {}


def pack_metrics(metrics) -> tuple[bytes, list]:
    """The diaspora_metric_value array of a {name: value} mapping, packed into bytes, and
    what must stay alive while the plugin reads it (the names' bytes live in a cache of at
    most 4096 names; others are in the returned list: hold it until the call returns).
    Raises ValueError for more than MAX_METRICS samples and TypeError for a non-number."""
    n = len(metrics)
    if n > MAX_METRICS:
        raise ValueError(f"at most {MAX_METRICS} metrics per call, not {n}")
    packer = _packers.get(n) or _packers.setdefault(n, struct.Struct("Pd" * n))
    flat: list = []
    keep: list = []
    for k, v in metrics.items():
        hit = _metric_names.get(k)
        if hit is None:
            b = k.encode()
            hit = (b, C.cast(C.c_char_p(b), C.c_void_p).value)
            if len(_metric_names) < 4096:
                _metric_names[k] = hit
            else:
                keep.append(hit)
        flat.append(hit[1])
        flat.append(v)
    return packer.pack(*flat), keep


ACTION_CALLBACK = C.CFUNCTYPE(None, C.POINTER(ActionStruct), C.c_void_p)


def _declare(lib: C.CDLL) -> None:
    """Argument and result types of every ABI function (a missing one raises AttributeError)."""
    vp, cp, sz = C.c_void_p, C.c_char_p, C.c_size_t
    lib.diaspora_abi_version.restype = C.c_uint32
    lib.diaspora_abi_version.argtypes = []
    lib.diaspora_abi_check.argtypes = [C.c_uint32, cp, sz]
    lib.diaspora_library_version.restype = cp
    lib.diaspora_library_version.argtypes = []
    lib.diaspora_status_name.restype = cp
    lib.diaspora_status_name.argtypes = [C.c_int]
    lib.diaspora_open_file.argtypes = [cp, C.POINTER(vp), cp, sz]
    lib.diaspora_open_yaml.argtypes = [cp, C.POINTER(vp), cp, sz]
    lib.diaspora_close.argtypes = [vp, C.c_int64]
    lib.diaspora_last_error.argtypes = [vp, cp, sz]
    lib.diaspora_last_error.restype = sz
    for hook in TASK_HOOKS:
        getattr(lib, f"diaspora_task_{hook}").argtypes = [vp, C.POINTER(TaskInfo)]
    lib.diaspora_metric_sample.argtypes = [vp, C.POINTER(Metric)]
    lib.diaspora_data_arrived.argtypes = [vp, C.POINTER(DataInfo)]
    lib.diaspora_resource_status.argtypes = [vp, C.POINTER(ResourceInfo)]
    lib.diaspora_set_action_callback.argtypes = [vp, ACTION_CALLBACK, vp]
    lib.diaspora_poll_action.argtypes = [vp, C.POINTER(ActionStruct)]
    lib.diaspora_action_done.argtypes = [vp, cp, cp]
    lib.diaspora_action_failed.argtypes = [vp, cp, cp]
    lib.diaspora_get_stats.argtypes = [vp, C.POINTER(Stats)]
    lib.diaspora_item_put.argtypes = [vp, C.POINTER(ItemInfo), C.POINTER(ItemRef)]  # ABI 1.3
    lib.diaspora_item_get.argtypes = [vp, cp, C.c_uint64, C.c_int64, C.POINTER(C.c_void_p), C.POINTER(C.c_size_t),
                                      C.POINTER(C.c_void_p)]
    lib.diaspora_item_free.argtypes = [C.c_void_p]
    lib.diaspora_item_free.restype = None


def fast_hook(lib: C.CDLL, name: str):
    """A second function object for `name` without argtypes (restype int): ctypes then
    skips its per-argument type checks, a third of a hook's cost. Callers must pass
    exactly (c_void_p handle, C.byref(struct)), which the Plugin class does."""
    f = lib._FuncPtr((name, lib))
    f.restype = C.c_int
    return f


def library_candidates(explicit: str | os.PathLike | None = None) -> list[str]:
    """Where the library is looked for, in order: `explicit` (an argument or the spec's
    plugin.library), $DIASPORA_PLUGIN_LIBRARY, the build tree this package sits in
    ($DIASPORA_BIN_DIR/../lib, else <repo>/build/lib), the installed library beside an
    installed package (<prefix>/lib), then the dynamic linker's search path."""
    if explicit:
        return [str(explicit)]
    out: list[str] = []
    env = os.environ.get("DIASPORA_PLUGIN_LIBRARY")
    if env:
        return [env]
    here = Path(__file__).resolve().parent
    if os.environ.get("DIASPORA_BIN_DIR"):
        out.append(str(Path(os.environ["DIASPORA_BIN_DIR"]).parent / "lib" / "libdiaspora_plugin.so"))
    out.append(str(here.parents[2] / "build" / "lib" / "libdiaspora_plugin.so"))  # engine-adapters/python/diaspora
    for up in here.parents[1:5]:  # <prefix>/lib/python3/dist-packages/diaspora -> <prefix>/lib
        if up.name == "lib":
            out.append(str(up / "libdiaspora_plugin.so"))
            break
    out = [p for p in dict.fromkeys(out) if Path(p).exists()]
    out.append("libdiaspora_plugin.so.1")
    return out


_loaded: dict[str, C.CDLL] = {}


def load_library(explicit: str | os.PathLike | None = None) -> tuple[C.CDLL, str]:
    """Loads (once per path) and checks the library: the first candidate that loads and
    serves ABI 1.3. Raises LibraryError naming every file tried and why it failed."""
    from .errors import LibraryError, AbiError

    tried: list[str] = []
    for path in library_candidates(explicit):
        if path in _loaded:
            return _loaded[path], path
        try:
            lib = C.CDLL(path)
        except OSError as e:
            tried.append(f"{path}: {e}")
            continue
        # The version first: an older library lacks the newer functions, and should be
        # refused for its version, not taken for something else.
        try:
            lib.diaspora_abi_check.argtypes = [C.c_uint32, C.c_char_p, C.c_size_t]
            lib.diaspora_abi_check.restype = C.c_int
        except AttributeError as e:
            tried.append(f"{path}: not a Diaspora plugin library ({e})")
            continue
        err = C.create_string_buffer(512)
        if lib.diaspora_abi_check(ABI_VERSION, err, len(err)) != OK:
            raise AbiError(f"{path}: {err.value.decode(errors='replace')}")
        try:
            _declare(lib)
        except AttributeError as e:
            tried.append(f"{path}: not a Diaspora plugin library ({e})")
            continue
        _loaded[path] = lib
        return lib, path
    raise LibraryError("cannot load libdiaspora_plugin.so (build it with `make build`, or set "
                       "plugin.library in the spec or DIASPORA_PLUGIN_LIBRARY): " + "; ".join(tried))
