"""The tasks of bench/parsl, importable by HTEX and Ray workers: the same app code runs under
plain Parsl, Parsl with Diaspora and Ray (diaspora.task.step() is a no-op outside an
adapter). Each attempt writes a start record (and an end record) to `marks`."""

from __future__ import annotations

import json
import os
import time


def _mark(marks: str, task: int, end: bool) -> None:
    rec = {"task": task, "pid": os.getpid(), "ppid": os.getppid(), "site": os.environ.get("BENCH_SITE", "?"),
           "t": time.monotonic(), "end": end}
    path = os.path.join(marks, f"{task}.{os.getpid()}.{'end' if end else 'start'}.{time.monotonic_ns()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(rec, f)
    os.replace(path + ".tmp", path)


def work(task: int, steps: int, step_s: float, marks: str) -> int:
    """`steps` steps of `step_s` (sleeps), each reported with diaspora.task.step()."""
    from diaspora import task as dtask

    _mark(marks, task, False)
    for _ in range(steps):
        time.sleep(step_s)
        dtask.step()
    _mark(marks, task, True)
    return task


def noop(i: int) -> int:
    return i
