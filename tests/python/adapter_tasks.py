"""Task functions for the adapter tests, importable by worker processes (spawned process
pools, Dask workers). Each writes a marker file per attempt (its pid and the step it
reached) so that a test can find the process to fault; and the fault the tests share
(a SIGSTOP duty cycle)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

from diaspora import task


def stepper(steps: int, step_s: float, value: int, marker_dir: str | None = None) -> int:
    """Sleeps `steps` steps of `step_s`, reporting each with task.step(); returns 2 × value."""
    me = task.current() or ("plain", 0)
    marker = Path(marker_dir) / f"{me[0]}.{me[1]}.json" if marker_dir else None
    for i in range(steps):
        time.sleep(step_s)
        if marker is not None:
            tmp = marker.with_suffix(f".{os.getpid()}.tmp")  # two attempts may overlap (one being migrated off)
            tmp.write_text(json.dumps({"pid": os.getpid(), "step": i}))
            tmp.replace(marker)
        task.step()
    return value * 2


def explode(message: str) -> None:
    raise ValueError(message)


def markers(marker_dir: str | Path) -> dict[str, dict]:
    """{"<task id>.<attempt>": {"pid":..., "step":...}} of every attempt that has reported."""
    out = {}
    for f in Path(marker_dir).glob("*.json"):
        try:
            out[f.stem] = json.loads(f.read_text())
        except (OSError, ValueError):
            pass
    return out


def reached(marker_dir: str | Path, attempt: str, step: int = 0) -> dict | None:
    """The marker of `attempt` ("<task id>.<attempt>") once it has reached `step`, else None."""
    m = markers(marker_dir).get(attempt)
    return m if m is not None and m.get("step", 0) >= step else None


# The migrate policy of the slowed-site tests: steps 3x the task's normal on that site (a
# DutyCycle slows them 10x). A z-score of the steps (ewma) depends on the noise that the
# machine's load adds to the normal steps: the Parsl test failed with it in CI.
SLOW_MIGRATE = [{"name": "move-off", "signal": "task.step_time", "detector": "relative", "threshold": 3, "for": 3,
                 "action": "migrate"}]


class DutyCycle(threading.Thread):
    """SIGSTOP / SIGCONT of `pids` (stopped `off` s, running `on` s) until stop()."""

    def __init__(self, pids, off: float = 0.45, on: float = 0.05):
        super().__init__(daemon=True)
        self.pids, self.off, self.on, self.done = list(pids), off, on, threading.Event()

    def run(self):
        while not self.done.is_set():
            self._sig(signal.SIGSTOP)
            time.sleep(self.off)
            self._sig(signal.SIGCONT)
            time.sleep(self.on)

    def _sig(self, s):
        for p in self.pids:
            try:
                os.kill(p, s)
            except ProcessLookupError:
                pass

    def stop(self):
        self.done.set()
        self.join()
        self._sig(signal.SIGCONT)
