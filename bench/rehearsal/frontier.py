#!/usr/bin/python3
"""Prints the ptycho-sim frontier that bench/rehearsal/frontier.sh measured: for each
rehearsal cell (strategy, buffer) and number R of representatives a step, the runtime as a
multiple of its incremental neighbour's (run at the same time) and the first-scan error at
the end as a multiple of scratch's, seed by seed; then which R meet the issue's ptycho
targets: the first-scan error <= 1.1x scratch's on every seed (it governs the settings), and
the machinery's overhead, the runtime ratio over the compute ratio (b + R) / b, <= 1.05 in
the median over the seeds.

Layout it reads (what frontier.sh writes): OUT/seedS/rR/ holds one run.sh output folder
(OUT/seedS/rR/pt-scratch-w1/summary.json, .../pt-er-b2000-w1/summary.json,
.../pair/pt-er-b2000-w1/summary.json, ...; -w2 for 2 ranks)."""
import math
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from table import ERROR_TARGET, MACHINERY_TARGET, load, load_pairs  # noqa: E402  (bench/rehearsal/table.py)


def collect(out: Path) -> dict:
    """(strategy, buffer, ranks, R) -> {seed: (runtime ratio, first-scan error ratio, average
    error ratio, machinery overhead)}; the error ratios are to the scratch job of the same
    folder and ranks; the overhead is the runtime ratio over (b + R) / b, b the job's
    batch_size. A cell without such a scratch job, or without its incremental neighbour, is
    left out with a note on stderr (an interrupted run)."""
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
            scratch = {s["world_size"]: s for s in runs.values() if s["strategy"] == "scratch"}
            for name, s in runs.items():
                if s["strategy"] in ("scratch", "incremental"):
                    continue
                if s["world_size"] not in scratch:
                    print(f"note: {r_dir} has no scratch job on {s['world_size']} rank(s); {name} left out",
                          file=sys.stderr)
                    continue
                if name not in pairs:
                    print(f"note: {r_dir / name} has no incremental neighbour; left out", file=sys.stderr)
                    continue
                rt, base, _ = pairs[name][0]
                sc = scratch[s["world_size"]]
                if min(base, sc["first_task_final"], sc["average_error"], s["first_task_final"]) <= 0:
                    print(f"note: {r_dir / name}: a zero runtime or error, no ratio; left out", file=sys.stderr)
                    continue
                reps = int(rm.group(1))
                key = (s["strategy"], s["buffer_size"], s["world_size"], reps)
                cells.setdefault(key, {})[seed] = (
                    rt / base,
                    s["first_task_final"] / sc["first_task_final"],
                    s["average_error"] / sc["average_error"],
                    rt / base / ((s["batch_size"] + reps) / s["batch_size"]),
                )
    return cells


def geometric_mean(xs: list) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def report(cells: dict) -> list:
    """The table's lines, then one verdict line per (strategy, buffer)."""
    # The verdicts compare the unrounded ratios (1.104 is printed 1.10 and is not <= 1.10).
    lines = [
        "| strategy | buffer | ranks | R | x incremental runtime (median, range) | machinery overhead (median) "
        f"| first-scan error x scratch, by seed | geometric mean | seeds <= {ERROR_TARGET:.2f} "
        "| average error x scratch (geometric mean) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts = {}
    for (strategy, buffer, ranks, reps), by_seed in sorted(cells.items()):
        seeds = sorted(by_seed)
        runtime = [by_seed[s][0] for s in seeds]
        first = [by_seed[s][1] for s in seeds]
        average = [by_seed[s][2] for s in seeds]
        machinery = statistics.median(by_seed[s][3] for s in seeds)
        within = sum(1 for x in first if x <= ERROR_TARGET)
        per_seed = ", ".join(f"{s}: {by_seed[s][1]:.2f}" for s in seeds)
        lines.append(
            f"| {strategy} | {buffer} | {ranks} | {reps} | {statistics.median(runtime):.2f} ({min(runtime):.2f}-{max(runtime):.2f}) "
            f"| {machinery:.2f} | {per_seed} | {geometric_mean(first):.2f} | {within} of {len(seeds)} | {geometric_mean(average):.2f} |")
        both = machinery <= MACHINERY_TARGET and within == len(seeds)
        verdicts.setdefault((strategy, buffer, ranks), []).append((reps, both, len(seeds)))
    lines.append("")
    for (strategy, buffer, ranks), rs in sorted(verdicts.items()):
        ok = [f"{r} ({n} seeds)" for r, both, n in rs if both]
        lines.append(f"- {strategy} at {buffer} on {ranks} rank(s): R meeting the ptycho targets (first-scan error <= "
                     f"{ERROR_TARGET}x on every seed, machinery overhead <= {MACHINERY_TARGET} in the median): "
                     f"{', '.join(ok) if ok else 'none'}")
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
