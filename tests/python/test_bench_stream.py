"""Tests of bench/rehearsal/stream.py (the longer ptycho-sim stream's summary) on summary.json
and metrics.jsonl files written here with known values, so every figure it prints can be
computed by hand (wall runtimes of pairs, CPU seconds of a shared core), and of stream.sh's
argument check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STREAM_PY = REPO / "bench" / "rehearsal" / "stream.py"


def job(out: Path, name: str, runtime: float, first: float, step_ms: list, cpu: float | None = None) -> None:
    """A job whose scan t took len(step_ms[t]) steps of the given milliseconds; with `cpu`,
    it used that many CPU seconds, and each step half its wall time in CPU (cpu_ms)."""
    d = out / name
    d.mkdir(parents=True)
    summary = {"strategy": name.split("-")[0] if not name.startswith("rehearsal") else "er", "buffer_size": 4000,
               "batch_size": 16, "representatives": 24, "epochs": 8, "tasks": len(step_ms), "runtime_s": runtime,
               "first_task_final": first}
    if cpu is not None:
        summary["cpu_s"] = cpu
    (d / "summary.json").write_text(json.dumps(summary))
    extra = (lambda ms: {"cpu_ms": ms / 2}) if cpu is not None else (lambda ms: {})
    lines = [json.dumps({"step": i, "task": t, "step_ms": ms, **extra(ms)})
             for t, steps in enumerate(step_ms) for i, ms in enumerate(steps)]
    lines.append(json.dumps({"eval_after_task": 0, "step": 3, "error": [first]}))  # no step_ms: not counted
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def tree(out: Path, rehearsal_runtime: float = 40.0, rehearsal_first: float = 0.00105) -> None:
    for seed in (0, 1):
        job(out, f"scratch-seed{seed}", 100.0, 0.001, [[1000.0], [1000.0, 1000.0]])
        job(out, f"rehearsal-seed{seed}", rehearsal_runtime, rehearsal_first, [[2500.0], [2500.0]])
        job(out, f"incremental-seed{seed}", 20.0, 0.002, [[1000.0], [1000.0]])


def run(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(STREAM_PY), str(out)], capture_output=True, text=True, timeout=60)


def test_ratios_verdicts_and_plot(tmp_path):
    tree(tmp_path)
    p = run(tmp_path)
    assert p.returncode == 0, p.stderr
    assert "| 0 | 100.0 | 40.0 | 20.0 | 0.40 | 0.001 | 0.00105 (1.05) | 0.002 (2.00) |" in p.stdout
    assert "rehearsal runtime <= 0.40 x scratch's on every seed (target <= 0.5): met" in p.stdout
    assert "first-scan error <= 1.05 x scratch's on every seed (target <= 1.1): met" in p.stdout
    # seconds per scan from the steps: scratch 1 then 2, rehearsal 2.5 and 2.5
    assert "scratch 1.0 2.0; rehearsal 2.5 2.5; incremental 1.0 1.0" in p.stdout
    svg = (tmp_path / "stream-runtime.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<polyline") == 6  # three kinds, two panels


def test_swapped_pair_gives_the_geometric_mean(tmp_path):
    # Seed 0 once more with the cores swapped: 40 / 100 and 62.5 / 100 -> sqrt(0.4 x 0.625) = 0.5.
    tree(tmp_path)
    job(tmp_path, "scratch-swapped-seed0", 100.0, 0.001, [[1000.0], [1000.0, 1000.0]])
    job(tmp_path, "rehearsal-swapped-seed0", 62.5, 0.00105, [[2500.0], [2500.0]])
    p = run(tmp_path)
    assert p.returncode == 0, p.stderr
    assert "| 0 | 100.0 | 40.0 | 20.0 | 0.50 (0.400, swapped 0.625) | 0.001 |" in p.stdout, p.stdout
    assert "| 1 | 100.0 | 40.0 | 20.0 | 0.40 | 0.001 |" in p.stdout, p.stdout  # seed 1: one pair
    assert "rehearsal runtime <= 0.50 x scratch's on every seed (target <= 0.5): met" in p.stdout
    # Only the swapped scratch: the first pair's ratio alone.
    (tmp_path / "rehearsal-swapped-seed0" / "summary.json").unlink()
    assert "| 0 | 100.0 | 40.0 | 20.0 | 0.40 | 0.001 |" in run(tmp_path).stdout


def test_shared_mode_judges_cpu_time(tmp_path):
    # Shared core: wall times say nothing (both ran the whole time); CPU seconds 45 / 100.
    (tmp_path / "mode").write_text("shared\n")
    for seed in (0, 1):
        job(tmp_path, f"scratch-seed{seed}", 200.0, 0.001, [[1000.0], [1000.0, 1000.0]], cpu=100.0)
        job(tmp_path, f"rehearsal-seed{seed}", 190.0, 0.00105, [[2500.0], [2500.0]], cpu=45.0 + 10 * seed)
        job(tmp_path, f"incremental-seed{seed}", 20.0, 0.002, [[1000.0], [1000.0]], cpu=19.0)
    p = run(tmp_path)
    assert p.returncode == 0, p.stderr
    assert "cost: CPU seconds, scratch and rehearsal sharing one core" in p.stdout, p.stdout
    assert "| 0 | 100.0 | 45.0 | 19.0 | 0.45 | 0.001 |" in p.stdout, p.stdout
    assert "| 1 | 100.0 | 55.0 | 19.0 | 0.55 | 0.001 |" in p.stdout, p.stdout
    assert "rehearsal CPU time <= 0.55 x scratch's on every seed (target <= 0.5): NOT met" in p.stdout
    # per scan from cpu_ms (half the step_ms here)
    assert "training CPU seconds per scan (median): scratch 0.5 1.0; rehearsal 1.2 1.2; incremental 0.5 0.5" \
        in p.stdout, p.stdout
    assert "training CPU seconds per scan" in (tmp_path / "stream-runtime.svg").read_text()
    # A summary without cpu_s cannot be judged in shared mode: its seed is left out, said so.
    s = json.loads((tmp_path / "rehearsal-seed1" / "summary.json").read_text())
    del s["cpu_s"]
    (tmp_path / "rehearsal-seed1" / "summary.json").write_text(json.dumps(s))
    p = run(tmp_path)
    assert "seed 1: a summary without cpu_s" in p.stdout and "| 1 |" not in p.stdout, p.stdout
    assert "rehearsal CPU time <= 0.45 x scratch's on every seed (target <= 0.5): met" in p.stdout


def test_table_py_prints_the_stream_targets_too(tmp_path):
    tree(tmp_path)
    table = REPO / "bench" / "rehearsal" / "table.py"
    p = subprocess.run([sys.executable, str(table), "--stream", str(tmp_path)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert "rehearsal runtime <= 0.40 x scratch's on every seed (target <= 0.5): met" in p.stdout, p.stdout
    p = subprocess.run([sys.executable, str(table), "--stream"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--stream needs the directory" in p.stdout, p.stdout


def test_misses_are_named(tmp_path):
    tree(tmp_path, rehearsal_runtime=60.0, rehearsal_first=0.0012)
    p = run(tmp_path)
    assert "(target <= 0.5): NOT met" in p.stdout and "(target <= 1.1): NOT met" in p.stdout


def test_a_seed_without_all_three_jobs_is_left_out(tmp_path):
    tree(tmp_path)
    (tmp_path / "incremental-seed1" / "summary.json").unlink()
    p = run(tmp_path)
    assert "| 0 |" in p.stdout and "| 1 |" not in p.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    p = run(empty)
    assert p.returncode == 1 and "no seed with scratch, rehearsal and incremental" in p.stdout


def test_stream_sh_rejects_bad_seeds(tmp_path):
    p = subprocess.run(["bash", str(REPO / "bench" / "rehearsal" / "stream.sh")],
                       env={**os.environ, "OUT": str(tmp_path / "o"), "SEEDS": "0 x"}, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "SEEDS takes non-negative integers, not 'x'" in p.stdout, (p.stdout, p.stderr)
    p = subprocess.run(["bash", str(REPO / "bench" / "rehearsal" / "stream.sh")],
                       env={**os.environ, "OUT": str(tmp_path / "o"), "SWAP": "yes"}, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "SWAP must be 0 or 1, not 'yes'" in p.stdout, (p.stdout, p.stderr)
    for var, value, said in (("MODE", "both", "MODE must be shared or pairs, not 'both'"),
                             ("NICE", "20", "NICE takes 0-19, not '20'")):
        p = subprocess.run(["bash", str(REPO / "bench" / "rehearsal" / "stream.sh")],
                           env={**os.environ, "OUT": str(tmp_path / "o"), var: value}, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 2 and said in p.stdout, (var, p.stdout, p.stderr)
