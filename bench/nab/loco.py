#!/usr/bin/env python3
"""Leave-one-category-out tuning protocol for the anomaly ensemble on the visible NAB subset
(issue 24; docs/anomaly.md, "Tuning protocol").

For every candidate setting (the cartesian product of a grid file, the shipped defaults
among them) diaspora-nab scores every visible series once, online. Then for each of the
four visible categories in turn, the setting and the NAB threshold are chosen on the
other three (the best standard-profile score, threshold swept as NAB does) and the
held-out category is scored with them, at that fixed threshold. Every series is thus
scored by settings chosen without its category; pooling those four held-out scorings
and normalising them once over all 24 series (null 0, perfect 100) gives the
cross-validated visible score. Run with one candidate alone (only its threshold chosen per
fold) it says what that setting is worth; run over the whole grid (setting and threshold
chosen per fold) it says what tuning on the visible series is worth. Rule: a default
changes only to a candidate whose own cross-validated score is higher than the current
defaults'.

Usage (from the repository root, after `make build`):
    .venv/bin/python bench/nab/loco.py [--build build] [--data ../shared/data/nab]
        [--scorer ../shared/tools/nab] [--grid bench/nab/grid.json] [--work /tmp/diaspora-loco]
        [--json OUT.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROFILE = "standard"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "nab"))
    ap.add_argument("--scorer", default=str(REPO.parent / "shared" / "tools" / "nab"),
                    help="folder holding nab_score.py")
    ap.add_argument("--grid", default=str(REPO / "bench" / "nab" / "grid.json"))
    ap.add_argument("--work", default="/tmp/diaspora-loco")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--json", help="write every figure here")
    return ap.parse_args(argv)


def candidates(grid_file: Path) -> list[dict]:
    grid = {k: v for k, v in json.loads(grid_file.read_text()).items() if not k.startswith("_")}
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            sys.exit(f"{grid_file}: '{k}' must be a non-empty list of values")
    keys = sorted(grid)
    return [dict(zip(keys, vals)) for vals in itertools.product(*(grid[k] for k in keys))]


def label(c: dict) -> str:
    return " ".join(f"{k}={v:g}" for k, v in sorted(c.items())) or "defaults"


def run_detector(nab: Path, data: Path, out: Path, c: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cfg = out / "config.yaml"
    cfg.write_text("".join(f"{k}: {v}\n" for k, v in sorted(c.items())))
    p = subprocess.run([str(nab), "--data", str(data), "--out", str(out / "scores"), "--config", str(cfg)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"diaspora-nab failed ({label(c)}): {p.stderr.strip()}")


def main(argv=None) -> int:
    a = parse_args(argv)
    sys.path.insert(0, a.scorer)
    try:
        import nab_score as ns
    except ImportError:
        sys.exit(f"no nab_score.py in {a.scorer} (--scorer)")
    nab = Path(a.build) / "bin" / "diaspora-nab"
    if not nab.exists():
        sys.exit(f"{nab} is missing: make build")
    data = Path(a.data)
    windows = ns.load_labels([str(data / "labels" / "combined_windows.json")])
    rels = sorted(r for r in windows if (data / r).is_file())
    cats = sorted({r.split("/", 1)[0] for r in rels})
    cm = ns.PROFILES[PROFILE]
    cands = candidates(Path(a.grid))

    # The shipped defaults: what diaspora-nab does with an empty config.
    default = {}
    t0 = time.monotonic()
    work = Path(a.work)
    runs = [default] + cands
    with ThreadPoolExecutor(a.jobs) as pool:
        list(pool.map(lambda ic: run_detector(nab, data, work / f"c{ic[0]}", ic[1]), enumerate(runs)))
    series = [{s.rel: s for s in ns.load_detector(str(work / f"c{i}" / "scores"), "x", rels, windows, str(data))}
              for i in range(len(runs))]
    print(f"{len(cands)} candidates + the defaults over {len(rels)} series in {len(cats)} categories "
          f"({time.monotonic() - t0:.1f} s)\n")

    def of(i: int, cat_in=None, cat_out=None) -> list:
        return [series[i][r] for r in rels
                if (cat_in is None or r.startswith(cat_in + "/")) and (cat_out is None or not r.startswith(cat_out + "/"))]

    def best_on(idx: list[int], train_out: str | None):
        """The candidate (index into runs) and threshold with the best score on every
        category but train_out."""
        best = None
        for i in idx:
            ss = of(i, cat_out=train_out)
            thr, raw, _ = ns.Corpus(ss).sweep(cm)
            score = ns.normalise(raw, ns.null_baseline(ss, cm), cm["tpWeight"] * sum(s.n_windows for s in ss))
            if best is None or score > best[2] + 1e-9:
                best = (i, thr, score)
        return best

    def protocol(idx: list[int], name: str) -> dict:
        folds, pooled_raw = [], 0.0
        for cat in cats:
            i, thr, train_score = best_on(idx, cat)
            held = of(i, cat_in=cat)
            raw = sum(ns.score_at(s, thr, cm)["raw"] for s in held)
            pooled_raw += raw
            n_win = sum(s.n_windows for s in held)
            norm = ns.normalise(raw, ns.null_baseline(held, cm), cm["tpWeight"] * n_win)
            folds.append({"held_out": cat, "chosen": label(runs[i]), "threshold": thr, "train_score": train_score,
                          "held_out_score": norm, "held_out_raw": raw, "windows": n_win})
        allser = of(0)  # every series (the same windows whichever candidate scored them)
        null = ns.null_baseline(allser, cm)
        perfect = cm["tpWeight"] * sum(s.n_windows for s in allser)
        defined = [f["held_out_score"] for f in folds if f["held_out_score"] is not None]
        out = {"name": name, "folds": folds, "cv_score": ns.normalise(pooled_raw, null, perfect),
               "mean_of_folds": sum(defined) / len(defined)}
        i, thr, score = best_on(idx, None)
        out["ship"] = {"setting": label(runs[i]), "threshold": thr, "visible_score": score}
        return out

    results = [protocol([0], "shipped defaults (threshold chosen per fold)"),
               protocol(list(range(len(runs))), f"grid of {len(cands)} candidates + defaults")]
    for r in results:
        print(f"== {r['name']}")
        print(f"{'held out':<24} {'score':>7} {'raw':>8}  {'train':>6}  {'threshold':>9}  chosen on the other three")
        for f in r["folds"]:
            sc = "n/a" if f["held_out_score"] is None else f"{f['held_out_score']:.1f}"
            print(f"{f['held_out']:<24} {sc:>7} {f['held_out_raw']:8.2f}  {f['train_score']:6.1f}  "
                  f"{f['threshold']:9.5f}  {f['chosen']}")
        print(f"cross-validated visible score (pooled, normalised over all {len(rels)} series): {r['cv_score']:.1f}; "
              f"mean of the folds with windows: {r['mean_of_folds']:.1f}")
        print(f"what it would ship: {r['ship']['setting']} (visible score {r['ship']['visible_score']:.1f}, "
              f"threshold {r['ship']['threshold']:.5f})\n")
    print("== each candidate alone (only its threshold chosen per fold)")
    alone = []
    for i in range(1, len(runs)):
        r = protocol([i], label(runs[i]))
        alone.append({"setting": r["name"], "cv_score": r["cv_score"], "visible_score": r["ship"]["visible_score"]})
    for x in sorted(alone, key=lambda x: -x["cv_score"])[:10]:
        print(f"  cross-validated {x['cv_score']:5.1f}  visible {x['visible_score']:5.1f}  {x['setting']}")
    print()
    base = results[0]
    best = max(alone, key=lambda x: x["cv_score"])
    verdict = ("keep the defaults" if best["cv_score"] <= base["cv_score"] + 1e-9
               else f"change the defaults to {best['setting']}")
    print(f"rule: a default changes only to a setting whose own cross-validated score is higher: best "
          f"{best['cv_score']:.1f} ({best['setting']}) vs the defaults' {base['cv_score']:.1f} -> {verdict}")
    if a.json:
        Path(a.json).write_text(json.dumps({"candidates": len(cands), "results": results, "alone": alone,
                                            "verdict": verdict}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
