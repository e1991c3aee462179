#!/usr/bin/python3
"""Prints the ptycho-sim frontier that bench/rehearsal/frontier.sh measured: for each
rehearsal cell (strategy, buffer) and number R of representatives a step, the runtime as a
multiple of its incremental neighbour's (run at the same time) and the first-scan error at
the end as a multiple of scratch's, seed by seed; then which R meet both of the issue's
ptycho targets (runtime <= 1.2x incremental, first-scan error <= 1.1x scratch) on every seed.

Layout it reads (what frontier.sh writes): OUT/seedS/rR/ holds one run.sh output folder
(OUT/seedS/rR/pt-scratch-w1/summary.json, .../pt-er-b2000-w1/summary.json,
.../pair/pt-er-b2000-w1/summary.json, ...)."""
import math
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from table import load, load_pairs  # noqa: E402  (bench/rehearsal/table.py)

RUNTIME_TARGET = 1.2
ERROR_TARGET = 1.1


def collect(out: Path) -> dict:
    """(strategy, buffer, R) -> {seed: (runtime ratio, first-scan error ratio, average error
    ratio)}. A seed folder without a scratch job, or a cell without its neighbour, is left
    out with a note on stderr (an interrupted run)."""
    cells = {}
    for seed_dir in sorted(out.glob("seed*")):
        m = re.fullmatch(r"seed(\d+)", seed_dir.name)
        if not m:
            continue
        seed = int(m.group(1))
        for r_dir in sorted(seed_dir.glob("r*")):
            rm = re.fullmatch(r"r(\d+)", r_dir.name)
            if not rm:
                continue
            runs, pairs = load(r_dir), load_pairs(r_dir)
            scratch = runs.get("pt-scratch-w1")
            if scratch is None:
                print(f"note: {r_dir} has no scratch job; left out", file=sys.stderr)
                continue
            for name, s in runs.items():
                if s["strategy"] in ("scratch", "incremental"):
                    continue
                if name not in pairs:
                    print(f"note: {r_dir / name} has no incremental neighbour; left out", file=sys.stderr)
                    continue
                rt, base, _ = pairs[name][0]
                key = (s["strategy"], s["buffer_size"], int(rm.group(1)))
                cells.setdefault(key, {})[seed] = (
                    rt / base,
                    s["first_task_final"] / scratch["first_task_final"],
                    s["average_error"] / scratch["average_error"],
                )
    return cells


def geometric_mean(xs: list) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def report(cells: dict) -> list:
    """The table's lines, then one verdict line per (strategy, buffer)."""
    lines = [
        "| strategy | buffer | R | x incremental runtime (median, range) | first-scan error x scratch, by seed "
        "| geometric mean | seeds <= 1.10 | average error x scratch (geometric mean) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    verdicts = {}
    for (strategy, buffer, reps), by_seed in sorted(cells.items()):
        seeds = sorted(by_seed)
        runtime = [by_seed[s][0] for s in seeds]
        first = [by_seed[s][1] for s in seeds]
        average = [by_seed[s][2] for s in seeds]
        within = sum(1 for x in first if x <= ERROR_TARGET)
        per_seed = ", ".join(f"{s}: {by_seed[s][1]:.2f}" for s in seeds)
        lines.append(
            f"| {strategy} | {buffer} | {reps} | {statistics.median(runtime):.2f} ({min(runtime):.2f}-{max(runtime):.2f}) "
            f"| {per_seed} | {geometric_mean(first):.2f} | {within} of {len(seeds)} | {geometric_mean(average):.2f} |")
        both = statistics.median(runtime) <= RUNTIME_TARGET and within == len(seeds)
        verdicts.setdefault((strategy, buffer), []).append((reps, both))
    lines.append("")
    for (strategy, buffer), rs in sorted(verdicts.items()):
        ok = [str(r) for r, both in rs if both]
        lines.append(f"- {strategy} at {buffer}: R meeting both ptycho targets (runtime <= {RUNTIME_TARGET}x, "
                     f"first-scan error <= {ERROR_TARGET}x on every seed): {', '.join(ok) if ok else 'none'}")
    return lines


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/diaspora-bench-frontier")
    cells = collect(out)
    if not cells:
        print(f"no frontier cells under {out} (expected OUT/seedS/rR/ folders from frontier.sh)")
        return 1
    print("\n".join(report(cells)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
