"""Raw ctypes access to libdiaspora_plugin.so (the declarations are the diaspora package's
_abi module), returning the C status codes, for tests that drive the plugin from Python (and from child processes that get killed).

Run as a script it is a tiny engine used by the crash tests:
    python3 plugin_ctypes.py SPEC TASKS [--kill-when-spooled N] [--close-timeout-ms MS]
It reports TASKS tasks (submitted, started, 3 heartbeats, completed = 6 events each), then
either SIGKILLs itself once N events are in the spool or closes, and prints a JSON line of
its statistics.
"""

from __future__ import annotations

import ctypes as C
import json
import os
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("DIASPORA_BIN_DIR", REPO / "build" / "bin"))
LIB = BIN.parent / "lib" / "libdiaspora_plugin.so"

sys.path.insert(0, str(REPO / "engine-adapters" / "python"))
from relay_harness import wait_until as wait_for  # noqa: E402,F401 (used by the tests through this module)
from diaspora._abi import (ACTION_CALLBACK as ACTION_CB, MAX_ID, MAX_TEXT, ActionStruct as Action,  # noqa: E402,F401
                           MetricValue, Stats, TaskInfo, _declare)

OK, ERR_NULL, ERR_INVALID, ERR_CONFIG, ERR_IO, ERR_CLOSED, ERR_TIMEOUT, ERR_NOT_FOUND, ERR_EMPTY = range(9)


def load(path: Path = LIB) -> C.CDLL:
    lib = C.CDLL(str(path))
    _declare(lib)
    return lib


class Plugin:
    """One open handle."""

    def __init__(self, spec: str | Path, lib: C.CDLL | None = None):
        self.lib = lib or load()
        self.h = C.c_void_p()
        err = C.create_string_buffer(8192)
        if isinstance(spec, Path):
            rc = self.lib.diaspora_open_file(str(spec).encode(), C.byref(self.h), err, len(err))
        else:
            rc = self.lib.diaspora_open_yaml(spec.encode(), C.byref(self.h), err, len(err))
        if rc != OK:
            raise RuntimeError(f"open failed ({rc}): {err.value.decode()}")

    def task(self, hook: str, task_id: str, **fields) -> int:
        info = TaskInfo(struct_size=C.sizeof(TaskInfo), task_id=task_id.encode(), step=-1)
        metrics = fields.pop("metrics", None)
        for k, v in fields.items():
            setattr(info, k, v.encode() if isinstance(v, str) else v)
        if metrics:
            arr = (MetricValue * len(metrics))(*[MetricValue(k.encode(), v) for k, v in metrics.items()])
            info.metrics = C.addressof(arr)
            info.metric_count = len(metrics)
        return getattr(self.lib, f"diaspora_task_{hook}")(self.h, C.byref(info))

    def stats(self) -> dict:
        s = Stats(struct_size=C.sizeof(Stats))
        assert self.lib.diaspora_get_stats(self.h, C.byref(s)) == OK
        return {name: getattr(s, name) for name, _ in Stats._fields_ if name != "struct_size"}

    def last_error(self) -> str:
        buf = C.create_string_buffer(8192)
        self.lib.diaspora_last_error(self.h, buf, len(buf))
        return buf.value.decode()

    def poll_action(self) -> dict | None:
        a = Action(struct_size=C.sizeof(Action))
        rc = self.lib.diaspora_poll_action(self.h, C.byref(a))
        if rc == ERR_EMPTY:
            return None
        assert rc == OK, rc
        return {k: (getattr(a, k).decode() if isinstance(getattr(a, k), bytes) else getattr(a, k))
                for k, _ in Action._fields_ if k != "struct_size"}

    def action_done(self, action_id: str, message: str | None = None) -> int:
        return self.lib.diaspora_action_done(self.h, action_id.encode(), message.encode() if message else None)

    def close(self, timeout_ms: int = 10000) -> int:
        rc = self.lib.diaspora_close(self.h, timeout_ms)
        self.h = None
        return rc


def report_tasks(p: Plugin, tasks: int, prefix: str = "task", pace: float = 0) -> int:
    """Reports `tasks` full lifecycles; each task's heartbeats carry seq metrics 0..2 so
    that order can be checked on the relay; `pace` seconds after each task (a steady
    stream). Returns the number of events."""
    import time
    for t in range(tasks):
        tid = f"{prefix}-{t}"
        assert p.task("submitted", tid, site="local", attempt=1) == OK
        assert p.task("started", tid, site="local", worker="w0") == OK
        for k in range(3):
            assert p.task("heartbeat", tid, metrics={"k": float(k)}) == OK
        assert p.task("completed", tid, has_exit_code=1, exit_code=0) == OK
        if pace:
            time.sleep(pace)
    return tasks * 6


def main(argv: list[str]) -> int:
    spec, tasks = Path(argv[0]), int(argv[1])
    kill_when = None
    close_ms = 10000
    if "--kill-when-spooled" in argv:
        kill_when = int(argv[argv.index("--kill-when-spooled") + 1])
    if "--close-timeout-ms" in argv:
        close_ms = int(argv[argv.index("--close-timeout-ms") + 1])
    p = Plugin(spec)
    n = report_tasks(p, tasks)
    if kill_when is not None:
        wait_for(lambda: p.stats()["spool_records"] >= kill_when, 60, "events in the spool")
        print(json.dumps(p.stats()), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    rc = p.close(close_ms)
    print(json.dumps({"events": n, "close": rc}), flush=True)
    return 0 if rc == OK else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
