"""Two process pools as two sites of one resilient executor.

    .venv/bin/python examples/adapters/futures_two_pools.py workflow.yaml
"""
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from diaspora import task
from diaspora.futures import ResilientExecutor


def reconstruct(frame: int) -> int:
    for _ in range(5):
        time.sleep(0.02)  # a step of real work
        task.step()       # step_time_s for the policies; ends a stopped attempt
    return frame * frame


if __name__ == "__main__":
    spec = sys.argv[1] if len(sys.argv) > 1 else "workflow.yaml"
    with ProcessPoolExecutor(2) as a, ProcessPoolExecutor(2) as b:
        with ResilientExecutor({"a": a, "b": b}, spec=spec) as ex:
            futures = [ex.submit(reconstruct, f) for f in range(8)]
            print("results:", [f.result() for f in futures])
