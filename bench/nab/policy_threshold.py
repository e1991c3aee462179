#!/usr/bin/env python3
"""The ensemble judged as a policy with the default threshold runs it (docs/anomaly.md,
"An anomaly must last").

bench/nab/workflow_traces.py sweeps a threshold per signal with NAB's scorer; a policy's
author does not: `detector: ensemble` compares the score with 0.5 unless told otherwise,
re-alert suppression is off and a cooldown keeps a policy from deciding again at once.
This scores the workflow traces that way: the policy engine's ensemble settings
(--nab-config, default bench/nab/policy.cfg) with `suppress: 0` and `alert_score: 0`, as
PolicyOptions::ensemble has them; a decision when the score on the signal's bad side
reaches the threshold, then none for --cooldown observations (50). The threshold is a
policy's with none written: 0.5, or 0.3 on a quiet series (PolicyOptions::quiet_*: at
least --quiet-hours old, at most --quiet-rate runs of scores at or over --quiet-threshold an
hour since its first value; --quiet-threshold 0 turns it off); --threshold T is a written
threshold (no quiet rule). Per configuration:
decisions per clean hour (series without faults, after their first 15 %), faults caught
before their harm (a stall: 120 s), and the median and largest delay from the onset of the
first fault of a series and of a later one (a second stall after a first: the weak spot
the tail calibration had).

Usage (from the repository root, after `make build`):
    .venv/bin/python bench/nab/policy_threshold.py [--configs bench/nab/workflow_dev.json ...]
        [--nab-config bench/nab/policy.cfg] [--set KEY=VALUE ...] [--threshold T] [--cooldown 50]
        [--quiet-threshold 0.3] [--quiet-rate 0.1] [--quiet-hours 2] [--peer-share] [--heldout]

`--peer-share` scores each site throughput configuration twice more: the site's share of two
sites' total (a peer site under the same cycle with its own noise and no fault:
workflow_traces.peer_share), and caught by either policy (the raw one or the share's; their
decisions a clean hour added). A common cycle cancels in the share; a measurement for
docs/anomaly.md, "A site's share", no policy of the engine's.

Held-out configurations (`heldout: true`) are skipped unless --heldout is given: this is a
tool for choosing, and a held-out set is scored once per candidate, with its rule.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workflow_traces as wt  # noqa: E402  (the generator and its constants)


def thresholds(scores: list[float], step: float, normal: float, low: float, rate: float, min_hours: float) -> list[float]:
    """The threshold each value of a series is compared with, as the policy engine's quiet
    rule has it (PolicyOptions::quiet_*; low 0: `normal` throughout): `low` while the series
    is at least min_hours old and its scores have reached `low` in at most rate runs an hour
    since its first value (counted before the value is judged), else `normal`."""
    out, runs, over = [], 0, False
    for k, x in enumerate(scores):
        hours = k * step / 3600
        out.append(low if low and hours >= min_hours and runs <= rate * hours else normal)
        if low:
            runs += x >= low and not over
            over = x >= low
    return out


@dataclass
class Judged:
    """One configuration's series judged at a policy's threshold."""
    decisions: int  # on its clean series, after their first 15 %
    hours: float    # of those
    caught: set     # (series, fault) caught before their harm
    faults: int
    delays: tuple = ((), ())  # onset to decision of caught faults: first of a series, later

    def row(self, c: dict, name: str) -> str:
        def spread(v) -> str:
            return f"{statistics.median(v):.0f} / {max(v):.0f} s" if v else "—"

        rate = f"{self.decisions / self.hours:.2f}" if self.hours else "—"
        return (f"| {name} | {c['signal']} | {rate} | {len(self.caught)} of {self.faults} | {spread(self.delays[0])} "
                f"| {spread(self.delays[1])} |")


def judge(truth: dict, c: dict, scores: Path, normal: float, low: float, a) -> Judged:
    """Configuration c's series (scores under `scores`) judged as a policy with `normal`
    (and `low` on a quiet series) and a.cooldown judges them."""
    decisions, hours, caught, faults, delays = 0, 0.0, set(), 0, ([], [])
    for rel, tr in truth.items():
        if tr["config"] != c["name"]:
            continue
        sc, step = wt.scores_of(scores / Path(rel).name), tr["dt_s"]
        th = thresholds(sc, step, normal, low, a.quiet_rate, a.quiet_hours)
        if not tr["faults"]:
            start, quiet_until = int(0.15 * len(sc)), -1
            for k in range(start, len(sc)):
                if sc[k] >= th[k] and k > quiet_until:
                    decisions, quiet_until = decisions + 1, k + a.cooldown
            hours += (len(sc) - start) * step / 3600
        for j, f in enumerate(tr["faults"]):
            faults += 1
            end = f["harm_t"] if f["harm_t"] is not None else f["t"] + f["duration_s"]
            lo, hi = int(f["t"] / step), min(len(sc), int(end / step) + 1)
            hit = next((k for k in range(lo, hi) if sc[k] >= th[k]), None)
            if hit is not None:
                caught.add((rel, j))
                delays[j > 0].append(hit * step - f["t"])
    return Judged(decisions, hours, caught, faults, delays)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(wt.REPO / "build"))
    ap.add_argument("--configs", nargs="+", default=[str(wt.REPO / "bench" / "nab" / "workflow_dev.json")])
    ap.add_argument("--nab-config", default=str(wt.REPO / "bench" / "nab" / "policy.cfg"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a setting over --nab-config")
    ap.add_argument("--threshold", type=float, default=None, help="a written threshold (default: none written: 0.5 "
                    "or the quiet threshold)")
    ap.add_argument("--quiet-threshold", type=float, default=0.3, help="PolicyOptions::quiet_threshold (0: off)")
    ap.add_argument("--quiet-rate", type=float, default=0.1, help="PolicyOptions::quiet_rate_per_hour")
    ap.add_argument("--quiet-hours", type=float, default=2.0, help="PolicyOptions::quiet_min_hours")
    ap.add_argument("--cooldown", type=int, default=50, help="observations without a decision after one")
    ap.add_argument("--work", default="/tmp/diaspora-policy-threshold")
    ap.add_argument("--peer-share", action="store_true", help="a site's throughput also as its share of two sites' "
                    "total (a peer under the same cycle, no fault), and caught by either policy")
    ap.add_argument("--heldout", action="store_true", help="score the held-out configurations too (once per candidate)")
    a = ap.parse_args(argv)
    configs = [c for f in a.configs for c in json.loads(Path(f).read_text())["configs"] if a.heldout or not c.get("heldout")]
    if not configs:
        sys.exit("no configuration to score (held-out ones need --heldout)")
    work = Path(a.work)
    truth = wt.generate(configs, work / "data")
    share_truth = (wt.generate([c for c in configs if c["signal"] == "throughput"], work / "share-data", share=True)
                   if a.peer_share else None)
    cfg = work / "policy.cfg"
    extra = ["suppress: 0", "alert_score: 0"] + [s.replace("=", ": ", 1) for s in a.set]
    cfg.write_text(Path(a.nab_config).read_text() + "\n" + "\n".join(extra) + "\n")

    written = a.threshold is not None
    normal = a.threshold if written else 0.5
    low = 0.0 if written or not 0 < a.quiet_threshold < normal else a.quiet_threshold
    quiet = f" ({low} on a quiet series: at most {a.quiet_rate} runs an hour over it, {a.quiet_hours} h or older)" if low else ""
    print(f"threshold {normal}{quiet}, cooldown {a.cooldown} observations, {a.nab_config} + {', '.join(extra)}\n")
    print("| configuration | signal | decisions / clean hour | caught before harm | first fault: median / max delay "
          "| later fault: median / max delay |")
    print("|---|---|---:|---:|---:|---:|")
    for c in configs:
        out = work / "scores" / c["name"]
        wt.run_nab(a.build, work / "data" / c["name"], out, wt.BAD_SIDE[c["signal"]], str(cfg))
        raw = judge(truth, c, out, normal, low, a)
        print(raw.row(c, c["name"]))
        if share_truth is not None and c["signal"] == "throughput":
            out = work / "share-scores" / c["name"]
            wt.run_nab(a.build, work / "share-data" / c["name"], out, "down", str(cfg))
            share = judge(share_truth, c, out, normal, low, a)
            print(share.row(c, c["name"] + " (its share)"))
            either = Judged(raw.decisions + share.decisions, raw.hours, raw.caught | share.caught, raw.faults)
            print(either.row(c, c["name"] + " (either)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
