"""Task functions for the adapter tests, importable by worker processes (spawned process
pools, Dask workers). Each writes a marker file per attempt (its pid and the step it
reached) so that a test can find the process to fault."""

from __future__ import annotations

import json
import os
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
            tmp = marker.with_suffix(".tmp")
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
