#!/usr/bin/python3
"""Prints what bench/rehearsal/stream.sh measured on the longer ptycho-sim stream, seed by
seed: the rehearsal job's cost as a multiple of scratch's (target <= 0.5) and its
first-scan error at the end as a multiple of scratch's (target <= 1.1), with the
incremental job beside them; and draws the training time per scan of the three, median
over the seeds, in OUT/stream-runtime.svg (per scan, and accumulated).

Layout it reads: OUT/{scratch,rehearsal,incremental}-seedS/{summary.json,metrics.jsonl},
OUT/mode ("shared" or "pairs", as stream.sh ran them; none: pairs), and in pairs mode
OUT/{scratch,rehearsal}-swapped-seedS (the same pair with the cores swapped).
The cost: in shared mode (scratch and rehearsal on one core at once) the ratio of the
jobs' CPU seconds (summary cpu_s); in pairs mode the ratio of their wall runtimes, where a
seed has the swapped pair the geometric mean of the two pairs' ratios. The seconds per scan
are the training thread's CPU time of the steps (cpu_ms) where the lines have it, else
their wall time (step_ms)."""
import json
import math
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from table import ERROR_TARGET, STREAM_COST_TARGET  # noqa: E402  (bench/rehearsal/table.py)

KINDS = ("scratch", "rehearsal", "incremental")
COLOURS = {"scratch": "#c0392b", "rehearsal": "#2471a3", "incremental": "#7f8c8d"}


def per_scan_seconds(metrics: Path, tasks: int) -> tuple:
    """Training time spent on each scan of the stream (the cpu_ms, else the step_ms, of the
    steps taken while that scan was the newest), in seconds; and whether every step had
    cpu_ms."""
    out, cpu = [0.0] * tasks, True
    for line in metrics.read_text().splitlines():
        d = json.loads(line)
        if "step_ms" in d and 0 <= d.get("task", -1) < tasks:
            cpu = cpu and "cpu_ms" in d
            out[d["task"]] += d.get("cpu_ms", d["step_ms"]) / 1000
    return out, cpu


def collect(out: Path) -> dict:
    """seed -> kind -> (summary, per-scan seconds, whether they are CPU seconds), for the seeds
    that have all three."""
    seeds = {}
    for d in sorted(out.glob("*-seed*")):
        m = re.fullmatch(r"(scratch|rehearsal|incremental|scratch-swapped|rehearsal-swapped)-seed(\d+)", d.name)
        if not m or not (d / "summary.json").exists():
            continue
        s = json.loads((d / "summary.json").read_text())
        seeds.setdefault(int(m.group(2)), {})[m.group(1)] = (s, *per_scan_seconds(d / "metrics.jsonl", s["tasks"]))
    return {k: v for k, v in sorted(seeds.items()) if all(kind in v for kind in KINDS)}


def svg(medians: dict, tasks: int, unit: str = "seconds") -> str:
    """Two panels: seconds per scan, and accumulated seconds, one line per kind."""
    w, h, pad = 360, 240, 44
    def panel(x0, title, series):
        top = max(max(v) for v in series.values()) * 1.1 or 1
        px = lambda i: x0 + pad + i * (w - pad - 12) / max(tasks - 1, 1)
        py = lambda v: h - pad + 8 - v / top * (h - pad - 24)
        parts = [f'<text x="{x0 + w / 2}" y="14" text-anchor="middle" font-size="12">{title}</text>',
                 f'<line x1="{x0 + pad}" y1="{h - pad + 8}" x2="{x0 + w - 12}" y2="{h - pad + 8}" stroke="#333"/>',
                 f'<line x1="{x0 + pad}" y1="20" x2="{x0 + pad}" y2="{h - pad + 8}" stroke="#333"/>']
        for k in range(5):
            v = top * k / 4
            parts.append(f'<text x="{x0 + pad - 4}" y="{py(v) + 4:.1f}" text-anchor="end" font-size="10">{v:.0f}</text>')
        for i in range(tasks):
            parts.append(f'<text x="{px(i):.1f}" y="{h - pad + 22}" text-anchor="middle" font-size="10">{i + 1}</text>')
        parts.append(f'<text x="{x0 + w / 2}" y="{h - 8}" text-anchor="middle" font-size="11">scan</text>')
        for kind, v in series.items():
            pts = " ".join(f"{px(i):.1f},{py(y):.1f}" for i, y in enumerate(v))
            parts.append(f'<polyline fill="none" stroke="{COLOURS[kind]}" stroke-width="2" points="{pts}"/>')
        return parts
    acc = {k: [sum(v[:i + 1]) for i in range(len(v))] for k, v in medians.items()}
    body = panel(0, f"training {unit} per scan (median over seeds)", medians)
    body += panel(w, f"{unit} accumulated", acc)
    for j, kind in enumerate(KINDS):
        body.append(f'<rect x="{60 + 130 * j}" y="{h + 4}" width="12" height="3" fill="{COLOURS[kind]}"/>'
                    f'<text x="{76 + 130 * j}" y="{h + 10}" font-size="11">{kind}</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * w}" height="{h + 18}" '
            f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>' + "".join(body) + "</svg>\n")


def main() -> int:
    return report(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/diaspora-bench-stream"))


def report(out: Path) -> int:
    """Prints the table, the verdicts and the per-scan medians of stream.sh's OUT, and writes
    the plot; 0, or 1 when there is no seed to judge."""
    seeds = collect(out)
    shared = (out / "mode").exists() and (out / "mode").read_text().strip() == "shared"
    if not seeds:
        print(f"no seed with scratch, rehearsal and incremental summaries under {out}")
        return 1
    first = next(iter(seeds.values()))
    reh = first["rehearsal"][0]
    tasks = reh["tasks"]
    print(f"ptycho-sim, {tasks} scans, 1 rank: rehearsal = {reh['strategy']} at {reh['buffer_size']}, "
          f"b + R = {reh['batch_size']} + {reh['representatives']}, {reh['epochs']} epochs")
    what = "CPU s" if shared else "s"
    print("cost: " + ("CPU seconds, scratch and rehearsal sharing one core (MODE=shared)" if shared
                      else "wall runtime, scratch and rehearsal on two cores (MODE=pairs)"))
    print(f"| seed | scratch {what} | rehearsal {what} | incremental {what} | rehearsal / scratch cost | "
          "first-scan error: scratch | rehearsal (x scratch) | incremental (x scratch) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    key = "cpu_s" if shared else "runtime_s"
    costs, errors = [], []
    for seed, k in seeds.items():
        sc, re_, inc = (k[x][0] for x in KINDS)
        if shared and not all(key in j for j in (sc, re_, inc)):
            print(f"seed {seed}: a summary without cpu_s (a diaspora-train older than 2026-12-03): left out")
            continue
        cost, err = re_[key] / sc[key], re_["first_task_final"] / sc["first_task_final"]
        cost_text = f"{cost:.2f}"
        if not shared and "scratch-swapped" in k and "rehearsal-swapped" in k:
            swapped = k["rehearsal-swapped"][0]["runtime_s"] / k["scratch-swapped"][0]["runtime_s"]
            first, cost = cost, math.sqrt(cost * swapped)
            cost_text = f"{cost:.2f} ({first:.3f}, swapped {swapped:.3f})"
        costs.append(cost)
        errors.append(err)
        print(f"| {seed} | {sc[key]:.1f} | {re_[key]:.1f} | {inc[key]:.1f} | {cost_text} | "
              f"{sc['first_task_final']:.3g} | {re_['first_task_final']:.3g} ({err:.2f}) | "
              f"{inc['first_task_final']:.3g} ({inc['first_task_final'] / sc['first_task_final']:.2f}) |")
    if not costs:
        print("no seed to judge")
        return 1
    worst_cost, worst_err = max(costs), max(errors)
    print(f"- rehearsal {'CPU time' if shared else 'runtime'} <= {worst_cost:.2f} x scratch's on every seed "
          f"(target <= {STREAM_COST_TARGET}): "
          f"{'met' if worst_cost <= STREAM_COST_TARGET else 'NOT met'}")
    print(f"- first-scan error <= {worst_err:.2f} x scratch's on every seed (target <= {ERROR_TARGET}): "
          f"{'met' if worst_err <= ERROR_TARGET else 'NOT met'}")
    medians = {kind: [statistics.median(k[kind][1][i] for k in seeds.values()) for i in range(tasks)] for kind in KINDS}
    unit = "CPU seconds" if all(k[kind][2] for k in seeds.values() for kind in KINDS) else "seconds"
    print(f"training {unit} per scan (median): " + "; ".join(
        f"{kind} " + " ".join(f"{v:.1f}" for v in medians[kind]) for kind in KINDS))
    (out / "stream-runtime.svg").write_text(svg(medians, tasks, unit))
    print(f"plot: {out / 'stream-runtime.svg'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
