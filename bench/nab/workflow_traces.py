#!/usr/bin/env python3
"""Workflow-shaped anomaly traces, scored like NAB, with lead times (issue 24;
docs/anomaly.md, "Workflow traces").

A generator of the signals Diaspora's policies watch: a task's step time, a task's
heartbeat gap, a site's throughput and a queue's length, with labelled faults (a slowdown
that ramps, a sudden slowdown, a stall, workers dying, capacity lost) over structure that
is not a fault (noise, periodic load, slow drift, late heartbeats). Every parameter and
seed is in bench/nab/workflow_configs.json; configurations marked `heldout` are never
used to choose a setting or a threshold.

Each series is written in NAB's layout with NAB-style windows (centred on each fault's
onset, 10 % of the series in all) and scored as the policy engine uses the ensemble: a
score counts only on the side the signal goes bad (`diaspora-nab --bad-side`), and each
signal has its own threshold, as each policy has (swept over that signal's tuning
configurations only with NAB's scorer, standard profile, and applied as is to the
held-out ones; `--both-sides` and `--one-threshold` give the protocol used before
2026-12-07). Each fault gets a lead time: its harm time (when the task or site has lost
`slack` seconds of work against its schedule, or, for a stall, when Parsl's 120 s
heartbeat threshold would notice) minus the first detection at or after the fault's
window opened. Positive: the detector fired before the harm.

Usage (from the repository root, after `make build`):
    .venv/bin/python bench/nab/workflow_traces.py [--build build] [--scorer ../shared/tools/nab]
        [--configs bench/nab/workflow_configs.json] [--work /tmp/diaspora-traces]
        [--nab-config FILE] [--json OUT.json] [--both-sides] [--one-threshold] [--fresh [FILE]]

`--fresh` adds a second held-out set (bench/nab/workflow_fresh.json), sealed on 2026-12-07
because the first had been looked at too often: scored once per candidate, never tuned on.
`--fresh bench/nab/workflow_third.json` scores the third, sealed before the settings that
make an anomaly last were chosen (docs/anomaly.md, "An anomaly must last"), the same way.
bench/nab/policy_threshold.py scores the same traces at a policy's default threshold.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import random
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
START = dt.datetime(2026, 1, 5)
SLACK_TASK_S = 60.0     # a task that lost a minute against its schedule
SLACK_SITE_S = 300.0    # a site that lost five minutes of its capacity
STALL_HARM_S = 120.0    # Parsl's heartbeat threshold
QUEUE_HARM_S = 300.0    # a queue holding five minutes of work
# The side each signal goes bad on: the policy engine's ensemble detector counts a score
# only there (resilience/src/policy.cpp, bad_side_score), and so does this benchmark.
BAD_SIDE = {"step_time": "up", "heartbeat_gap": "up", "queue_length": "up", "throughput": "down"}


def poisson(rng: random.Random, lam: float) -> int:
    if lam <= 0:
        return 0
    if lam > 30:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def periodic(c: dict, t: float) -> float:
    p = c.get("period_s", 0)
    return 1.0 + (c.get("amplitude", 0.0) * math.sin(2 * math.pi * t / p) if p else 0.0)


def drift(c: dict, t: float) -> float:
    return 1.0 + c.get("drift_per_h", 0.0) * t / 3600.0


def place_faults(rng: random.Random, c: dict, n: int, k: int) -> list[dict]:
    """k faults at rows after the probation (15 %), apart from each other and the end."""
    faults, lo = [], int(0.15 * n) + 50
    span = (n - lo) // max(k, 1)
    for j in range(k):
        row = lo + j * span + rng.randrange(0, max(1, span // 3))
        faults.append({"row": row, "kind": rng.choice(c["kinds"])})
    return faults


def trace(c: dict, i: int, clean: bool) -> tuple[list[float], list[dict]]:
    """One series (values every dt_s) and its faults with onset and harm times."""
    rng = random.Random(c["seed"] * 1000 + i)
    n, step = c["points"], c["dt_s"]
    faults = [] if clean else place_faults(rng, c, n, c["faults_per_trace"])
    for f in faults:
        f["t"] = f["row"] * step
        f["duration_s"] = rng.uniform(0.15, 0.25) * (n - f["row"]) * step
    sig = c["signal"]
    values: list[float] = []

    def factor(t: float) -> float:  # capacity left (1: all), from the faults active at t
        out = 1.0
        for f in faults:
            if not (f["t"] <= t < f["t"] + f["duration_s"]):
                continue
            if f["kind"] == "ramp":
                out *= 1.0 / (1.0 + 2.0 * min(1.0, (t - f["t"]) / 600.0))  # to a third over 10 min
            elif f["kind"] == "jump":
                out *= 0.4
            elif f["kind"] == "death":
                out *= 0.75  # a node with a quarter of the site's workers
            elif f["kind"] == "capacity":
                out *= 0.5
        return out

    if sig == "step_time":
        for r in range(n):
            t = r * step
            values.append(periodic(c, t) * drift(c, t) * math.exp(rng.gauss(0, c["noise"])) / factor(t))
    elif sig == "throughput":
        for r in range(n):
            t = r * step
            lam = c["workers"] * c["rate_per_worker"] * periodic(c, t) * drift(c, t) * factor(t) * step / 60.0
            values.append(float(poisson(rng, lam)))
    elif sig == "queue_length":
        q = 0.0
        for r in range(n):
            t = r * step
            q = max(0.0, q + poisson(rng, c["load"] * c["capacity"] * periodic(c, t) * step) - c["capacity"] * factor(t) * step)
            values.append(q)
    elif sig == "heartbeat_gap":
        stalls = [(f["t"], f["t"] + max(f["duration_s"], STALL_HARM_S + 60)) for f in faults]
        last, nxt = 0.0, 1.0
        for r in range(n):
            t = r * step
            while nxt <= t:
                if not any(a <= nxt < b for a, b in stalls):
                    last = nxt
                late = rng.uniform(2, 4) if rng.random() < c.get("pause_prob", 0) else 0.0
                nxt += max(0.2, 1.0 + c["noise"] * rng.gauss(0, 1)) + late
            values.append(round(t - last, 3))
        for f, (a, b) in zip(faults, stalls):
            f["duration_s"] = b - a
    else:
        sys.exit(f"unknown signal {sig!r}")

    for f in faults:  # harm: when the lost work reaches the slack (a stall: Parsl notices)
        if sig == "heartbeat_gap":
            f["harm_t"] = f["t"] + STALL_HARM_S
            continue
        if sig == "queue_length":
            rows = [r for r in range(f["row"], n) if values[r] >= QUEUE_HARM_S * c["capacity"]]
            f["harm_t"] = rows[0] * step if rows else None
            continue
        slack = SLACK_TASK_S if sig == "step_time" else SLACK_SITE_S
        lost, t, f["harm_t"] = 0.0, f["t"], None
        while t < f["t"] + f["duration_s"]:
            lost += (1.0 - factor(t)) * 1.0
            t += 1.0
            if lost >= slack:
                f["harm_t"] = t
                break
    return values, faults


def peer_share(c: dict, i: int, values: list[float]) -> list[float]:
    """A site's throughput `values` (series i of configuration c) as its share of two sites'
    total: the peer is a site of the same configuration (the same cycle, in phase: the
    workflow's load), its own noise (seed + 7919) and no fault. Where neither site finished
    anything in a step, the share before it."""
    peer, _ = trace(dict(c, seed=c["seed"] + 7919), i, clean=True)
    out, last = [], 0.5
    for a, b in zip(values, peer):
        last = a / (a + b) if a + b > 0 else last
        out.append(last)
    return out


def stamp(t: float) -> str:
    return (START + dt.timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S")


def generate(configs: list[dict], root: Path, share: bool = False) -> dict:
    """Writes root/<config>/<config>-<i>.csv and root/labels/combined_windows.json; returns
    the truth: per series, its faults with onset, harm and window. `share`: a site's
    throughput is written as its share of two sites' total (peer_share), the truth as is."""
    windows, truth = {}, {}
    for c in configs:
        (root / c["name"]).mkdir(parents=True, exist_ok=True)
        for i in range(c["traces"]):
            values, faults = trace(c, i, clean=i >= c["traces"] - c["clean_traces"])
            if share and c["signal"] == "throughput":
                values = peer_share(c, i, values)
            rel = f"{c['name']}/{c['name']}-{i}.csv"
            n, step = len(values), c["dt_s"]
            with open(root / rel, "w") as out:
                out.write("timestamp,value\n")
                for r, v in enumerate(values):
                    out.write(f"{stamp(r * step)},{v:.6g}\n")
            width = int(0.1 * n / len(faults)) if faults else 0
            wins = []
            for f in faults:
                a, b = max(0, f["row"] - width // 2), min(n - 1, f["row"] + width // 2)
                wins.append([stamp(a * step), stamp(b * step)])
                f["window_start_t"] = a * step
            windows[rel] = wins
            truth[rel] = {"config": c["name"], "dt_s": step, "faults": faults}
    (root / "labels").mkdir(exist_ok=True)
    (root / "labels" / "combined_windows.json").write_text(json.dumps(windows, indent=1))
    return truth


def run_nab(build: str, data: Path, out: Path, side: str, nab_config: str | None) -> None:
    """diaspora-nab over one configuration's series as the policy engine sees them: --online
    (a live signal, no range or length beforehand), a score counted only on `side`."""
    cmd = [str(Path(build) / "bin" / "diaspora-nab"), "--online", "--bad-side", side,
           "--data", str(data), "--out", str(out)]
    if nab_config:
        cmd += ["--config", nab_config]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"diaspora-nab failed: {p.stderr.strip()}")


def scores_of(path: Path) -> list[float]:
    with open(path) as f:
        next(f)
        return [float(line.rsplit(",", 1)[1]) for line in f]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--scorer", default=str(REPO.parent / "shared" / "tools" / "nab"))
    ap.add_argument("--configs", default=str(REPO / "bench" / "nab" / "workflow_configs.json"))
    ap.add_argument("--work", default="/tmp/diaspora-traces")
    ap.add_argument("--nab-config", help="diaspora-nab --config file (default: the shipped defaults)")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--fresh", nargs="?", const=str(REPO / "bench" / "nab" / "workflow_fresh.json"),
                    help="also score a second held-out set (default bench/nab/workflow_fresh.json): "
                         "its own rule, in the file, is to be scored once per candidate")
    ap.add_argument("--one-threshold", action="store_true",
                    help="one threshold for every signal (before 2026-12-07 the default; now one per signal)")
    ap.add_argument("--both-sides", action="store_true",
                    help="count scores on both sides of the forecast (NAB's way; before 2026-12-07 the default)")
    a = ap.parse_args(argv)
    sys.path.insert(0, a.scorer)
    try:
        import nab_score as ns
    except ImportError:
        sys.exit(f"no nab_score.py in {a.scorer} (--scorer)")
    extra = json.loads(Path(a.fresh).read_text())["configs"] if a.fresh else []
    configs = json.loads(Path(a.configs).read_text())["configs"] + extra
    fresh = {c["name"] for c in extra}
    work = Path(a.work)
    data, out = work / "data", work / "scores"
    truth = generate(configs, data)
    for c in configs:
        run_nab(a.build, data / c["name"], out / c["name"], "both" if a.both_sides else BAD_SIDE[c["signal"]],
                a.nab_config)
    windows = ns.load_labels([str(data / "labels" / "combined_windows.json")])
    rels = sorted(truth)
    series = {s.rel: s for s in ns.load_detector(str(out), "x", rels, windows, str(data))}
    cm = ns.PROFILES["standard"]
    held = {c["name"] for c in configs if c.get("heldout")}
    signal_of = {c["name"]: c["signal"] for c in configs}
    tuning = [r for r in rels if truth[r]["config"] not in held]
    set_of = {c["name"]: "fresh" if c["name"] in fresh else "held-out" if c["name"] in held else "tuning" for c in configs}

    def swept(rs: list[str]) -> float:  # the NAB-best threshold over these series
        return ns.Corpus([series[r] for r in rs]).sweep(cm)[0]

    one = swept(tuning)  # every signal's, with --one-threshold or no tuning configuration of its own
    thr_of = {sig: one for sig in BAD_SIDE}
    for sig in ([] if a.one_threshold else BAD_SIDE):
        if mine := [r for r in tuning if signal_of[truth[r]["config"]] == sig]:
            thr_of[sig] = swept(mine)

    rows, all_leads = [], {"tuning": [], "held-out": [], "fresh": []}
    for c in configs:
        mine = [r for r in rels if truth[r]["config"] == c["name"]]
        ss = [series[r] for r in mine]
        thr = thr_of[c["signal"]]  # this configuration's signal's
        raw = sum(ns.score_at(s, thr, cm)["raw"] for s in ss)
        n_win = sum(s.n_windows for s in ss)
        score = ns.normalise(raw, ns.null_baseline(ss, cm), cm["tpWeight"] * n_win)
        leads, missed, late, fps, hours = [], 0, 0, 0, 0.0
        for r in mine:
            sc, step = scores_of(out / r), truth[r]["dt_s"]
            faults = truth[r]["faults"]
            if not faults:
                start = int(0.15 * len(sc))
                fps += sum(1 for x in sc[start:] if x >= thr)
                hours += (len(sc) - start) * step / 3600
            for f in faults:
                lo, hi = int(f["window_start_t"] / step), int((f["t"] + f["duration_s"]) / step)
                hit = next((k for k in range(lo, min(hi, len(sc))) if sc[k] >= thr), None)
                if hit is None:
                    missed += 1
                elif f["harm_t"] is not None:
                    lead = f["harm_t"] - hit * step
                    leads.append(lead)
                    late += lead < 0
        kind = set_of[c["name"]]
        all_leads[kind] += leads
        rows.append({"config": c["name"], "set": kind, "signal": c["signal"], "series": len(mine), "windows": n_win,
                     "score": score, "faults": sum(len(truth[r]["faults"]) for r in mine), "missed": missed,
                     "median_lead_s": statistics.median(leads) if leads else None, "after_harm": late,
                     "false_alarms_per_clean_hour": fps / hours if hours else None})

    thresholds = f"{one:.4f}" if a.one_threshold else ", ".join(f"{k} {v:.4f}" for k, v in thr_of.items())
    print(f"{sum(len(truth[r]['faults']) for r in rels)} faults in {len(rels)} series, {len(configs)} configurations "
          f"({len(held)} held out); threshold {thresholds} (swept on the tuning configurations only)\n")
    print("| configuration | set | signal | NAB score | faults | missed | median lead before harm | detected after harm "
          "| false alarms / clean hour |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for x in rows:
        sc = "n/a" if x["score"] is None else f"{x['score']:.1f}"
        lead = "—" if x["median_lead_s"] is None else f"{x['median_lead_s']:.0f} s"
        fpr = "—" if x["false_alarms_per_clean_hour"] is None else f"{x['false_alarms_per_clean_hour']:.2f}"
        print(f"| {x['config']} | {x['set']} | {x['signal']} | {sc} | {x['faults']} | {x['missed']} | {lead} | "
              f"{x['after_harm']} | {fpr} |")
    for kind in ("tuning", "held-out", "fresh") if fresh else ("tuning", "held-out"):
        rs = [r for r in rels if set_of[truth[r]["config"]] == kind]
        ss = [series[r] for r in rs]
        raw = sum(ns.score_at(series[r], thr_of[signal_of[truth[r]["config"]]], cm)["raw"] for r in rs)
        score = ns.normalise(raw, ns.null_baseline(ss, cm), cm["tpWeight"] * sum(s.n_windows for s in ss))
        lead = statistics.median(all_leads[kind]) if all_leads[kind] else float("nan")
        print(f"\n{kind}: NAB score {score:.1f}, median lead {lead:.0f} s over {len(all_leads[kind])} detected faults",
              end="")
    print()
    if a.json:
        Path(a.json).write_text(json.dumps({"thresholds": thr_of, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
