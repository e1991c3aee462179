"""Tests of bench/rehearsal/frontier.py (the ptycho-sim runtime/error frontier's summary) and
of frontier.sh's argument checks, on summary.json files written here with known values, so
every ratio the report prints can be computed by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "rehearsal"))
import frontier  # noqa: E402


def summary(path: Path, strategy: str, runtime: float, first: float, average: float, buffer: int = 0,
            ranks: int = 1) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "summary.json").write_text(json.dumps({
        "strategy": strategy, "buffer_size": buffer, "dataset": "ptycho-sim", "world_size": ranks,
        "runtime_s": runtime, "first_task_final": first, "average_error": average, "batch_size": 16}))


def cell(r_dir: Path, runtime: float, neighbour: float, first: float, average: float = 1.0) -> None:
    """An ER 2,000 job and its concurrent incremental neighbour, as run.sh leaves them."""
    summary(r_dir / "pt-er-b2000-w1", "er", runtime, first, average, buffer=2000)
    summary(r_dir / "pair" / "pt-er-b2000-w1", "incremental", neighbour, 9.0, 9.0)
    (r_dir / "pair" / "pt-er-b2000-w1.concurrent").touch()


def frontier_tree(out: Path) -> None:
    """Two seeds, R = 4 and 16; scratch's first-scan error 0.001 (seed 0) and 0.002 (seed
    1), its average error 0.002; R = 16's folders link to R = 4's scratch, as frontier.sh's do."""
    for seed, scratch_first in ((0, 0.001), (1, 0.002)):
        base = out / f"seed{seed}"
        summary(base / "r4" / "pt-scratch-w1", "scratch", 30.0, scratch_first, 0.002)
        summary(base / "r4" / "pt-incremental-w1", "incremental", 10.0, 0.003, 0.003)
        (base / "r16").mkdir(parents=True)
        for name in ("pt-scratch-w1", "pt-incremental-w1"):
            os.symlink(f"../r4/{name}", base / "r16" / name)
    # R = 4: runtime 1.2x and 1.1x, first-scan error 1.3x and 1.05x scratch's
    cell(out / "seed0" / "r4", 12.0, 10.0, 0.0013, 0.0026)
    cell(out / "seed1" / "r4", 11.0, 10.0, 0.0021, 0.0024)
    # R = 16: runtime 2.2x and 1.6x (b + R = 2 b: machinery 1.1 and 0.8), first-scan error 1.0x and 1.1x
    cell(out / "seed0" / "r16", 22.0, 10.0, 0.001, 0.002)
    cell(out / "seed1" / "r16", 16.0, 10.0, 0.0022, 0.002)


def test_ratios_by_seed_and_verdict(tmp_path):
    frontier_tree(tmp_path)
    cells = frontier.collect(tmp_path)
    assert set(cells) == {("er", 2000, 1, 4), ("er", 2000, 1, 16)}
    rt, first, avg, machinery = cells[("er", 2000, 1, 4)][0]
    assert abs(rt - 1.2) < 1e-9 and abs(first - 1.3) < 1e-9 and abs(avg - 1.3) < 1e-9
    assert abs(machinery - 1.2 / (20 / 16)) < 1e-9  # 16 new samples + 4 representatives a step
    rt, first, avg, machinery = cells[("er", 2000, 1, 16)][1]
    assert abs(rt - 1.6) < 1e-9 and abs(first - 1.1) < 1e-9 and abs(avg - 1.0) < 1e-9 and abs(machinery - 0.8) < 1e-9

    lines = frontier.report(cells)
    r4 = next(line for line in lines if line.startswith("| er | 2000 | 1 | 4 |"))
    assert "1.15 (1.10-1.20)" in r4  # median and range of the runtime ratios
    assert "0: 1.30, 1: 1.05" in r4 and "| 1 of 2 |" in r4
    r16 = next(line for line in lines if line.startswith("| er | 2000 | 1 | 16 |"))
    assert "| 2 of 2 |" in r16  # 1.0 and 1.1: the target is <= 1.10
    assert "| 1.90 (1.60-2.20) | 0.95 |" in r16  # machinery: the median of 1.1 and 0.8
    # R = 4 misses the error target on seed 0; R = 16 meets it, its machinery at 0.95
    assert lines[-1] == ("- er at 2000 on 1 rank(s): R meeting the ptycho targets (first-scan error <= 1.1x on every "
                         "seed, machinery overhead <= 1.05 in the median): 16 (2 seeds)")


def test_machinery_overhead_over_its_target_fails_the_cell(tmp_path):
    frontier_tree(tmp_path)
    cell(tmp_path / "seed1" / "r16", 23.0, 10.0, 0.0022, 0.002)  # 2.3x runtime for 2x the samples: 1.15
    assert frontier.report(frontier.collect(tmp_path))[-1].endswith("in the median): none")


def test_cell_meeting_both_targets_is_named(tmp_path):
    frontier_tree(tmp_path)
    cell(tmp_path / "seed0" / "r4", 11.0, 10.0, 0.00105)  # now 1.1x runtime, 1.05x error
    assert frontier.report(frontier.collect(tmp_path))[-1].endswith("in the median): 4 (2 seeds), 16 (2 seeds)")


def test_incomplete_folders_are_left_out_with_a_note(tmp_path, capsys):
    frontier_tree(tmp_path)
    (tmp_path / "seed1" / "r16" / "pair" / "pt-er-b2000-w1" / "summary.json").unlink()  # interrupted pair
    (tmp_path / "seed0" / "r16" / "pt-scratch-w1").unlink()  # no scratch job
    cells = frontier.collect(tmp_path)
    assert ("er", 2000, 1, 16) not in cells and set(cells[("er", 2000, 1, 4)]) == {0, 1}
    err = capsys.readouterr().err
    assert "seed0/r16 has no scratch job on 1 rank(s)" in err and "no incremental neighbour" in err


def test_two_rank_cells_compare_with_two_rank_scratch(tmp_path):
    frontier_tree(tmp_path)
    r4 = tmp_path / "seed0" / "r4"
    summary(r4 / "pt-scratch-w2", "scratch", 20.0, 0.004, 0.004, ranks=2)
    summary(r4 / "pt-er-b2000-w2", "er", 9.0, 0.005, 0.006, buffer=2000, ranks=2)
    summary(r4 / "pair" / "pt-er-b2000-w2", "incremental", 10.0, 9.0, 9.0, ranks=2)  # run before: no mark
    rt, first, avg, _ = frontier.collect(tmp_path)[("er", 2000, 2, 4)][0]
    assert abs(rt - 0.9) < 1e-9 and abs(first - 1.25) < 1e-9 and abs(avg - 1.5) < 1e-9
    assert abs(frontier.collect(tmp_path)[("er", 2000, 1, 4)][0][1] - 1.3) < 1e-9  # 1 rank: its own scratch
    lines = frontier.report(frontier.collect(tmp_path))
    assert any(line.startswith("- er at 2000 on 2 rank(s)") and line.endswith("in the median): none") for line in lines)


def test_zero_error_is_left_out_not_divided_by(tmp_path, capsys):
    frontier_tree(tmp_path)
    summary(tmp_path / "seed1" / "r4" / "pt-scratch-w1", "scratch", 30.0, 0.0, 0.002)
    cells = frontier.collect(tmp_path)
    assert set(cells[("er", 2000, 1, 4)]) == {0} and set(cells[("er", 2000, 1, 16)]) == {0}
    assert "a zero runtime or error" in capsys.readouterr().err


def test_empty_folder_is_an_error(tmp_path):
    p = subprocess.run([sys.executable, str(REPO / "bench" / "rehearsal" / "frontier.py"), str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "no frontier cells" in p.stdout


def test_frontier_sh_rejects_bad_lists(tmp_path):
    for env, message in (({"REPS": "4 x"}, "REPS takes positive integers, not 'x'"),
                         ({"SEEDS": "0 -1"}, "SEEDS takes non-negative integers, not '-1'"),
                         ({"REPS": " "}, "REPS and SEEDS need at least one value each"),
                         ({"SEEDS": "\t"}, "REPS and SEEDS need at least one value each"),
                         ({"RANKS": "3"}, "RANKS must be 1 or 2, not '3'")):
        p = subprocess.run(["bash", str(REPO / "bench" / "rehearsal" / "frontier.sh")],
                           env={**os.environ, "OUT": str(tmp_path), **env}, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 2 and message in p.stdout, (env, p.stdout, p.stderr)
    assert not any(tmp_path.iterdir())  # nothing was run
    # An OUT keeps the SET of its first call: another one would mix two configurations.
    (tmp_path / "SET").write_text("train.ema=0.99")
    p = subprocess.run(["bash", str(REPO / "bench" / "rehearsal" / "frontier.sh")],
                       env={**os.environ, "OUT": str(tmp_path), "SET": "train.epochs=2"}, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "was measured with SET='train.ema=0.99', not SET='train.epochs=2'" in p.stdout, p.stdout
