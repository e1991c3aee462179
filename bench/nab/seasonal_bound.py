#!/usr/bin/env python3
"""Why a site's lost workers hide under strong seasonality (docs/anomaly.md, "Workflow
traces"): for each faulty series of one throughput configuration of
bench/nab/workflow_configs.json, the mean standardised residual over the 20 minutes after
the fault's onset, against the 5th percentile of that mean over the normal 20-minute
windows before it, for three forecasts: the generator's own mean (an oracle that knows
the cycle), an exponentially weighted level (the ensemble's level model, alpha 0.05) and
Holt's level and slope (alpha 0.05, beta 0.01). A fault a forecast can separate has its
"after" well below its "p5"; residuals are scaled as the ensemble scales them (1.25 x the
recent mean absolute error; the oracle: Poisson's sqrt(mean)).

Usage: .venv/bin/python bench/nab/seasonal_bound.py [--config throughput-seasonal]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import workflow_traces as wt  # noqa: E402  (the generator)

WINDOW = 20  # observations (minutes) after the onset


def residuals_holt(values: list[float], alpha: float, beta: float) -> list[float]:
    level, slope, err, zs = values[0], 0.0, 1.0, []
    for k, x in enumerate(values):
        p = level + slope
        r = x - p
        s = 1.25 * err
        zs.append(r / s if k > 3 else 0.0)
        err += 0.01 * (min(abs(r), 8 * s) - err)
        new = p + alpha * r
        slope += beta * ((new - level) - slope)
        level = new
    return zs


def separation(zs: list[float], onset: int) -> tuple[float, float]:
    """(5th percentile of the 20-observation mean before the onset, the mean after it)."""
    means = sorted(statistics.mean(zs[k:k + WINDOW]) for k in range(600, onset - WINDOW, WINDOW))
    return means[len(means) // 20], statistics.mean(zs[onset:onset + WINDOW])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=str(HERE / "workflow_configs.json"))
    ap.add_argument("--config", default="throughput-seasonal")
    a = ap.parse_args(argv)
    c = next((c for c in json.loads(Path(a.configs).read_text())["configs"] if c["name"] == a.config), None)
    if c is None or c["signal"] != "throughput":
        sys.exit(f"{a.configs}: no throughput configuration named {a.config!r}")
    print(f"| {a.config} series | fault | onset (h) | oracle p5 / after | level p5 / after | Holt p5 / after |")
    print("|---|---|---:|---:|---:|---:|")
    for i in range(c["traces"] - c["clean_traces"]):
        values, faults = wt.trace(c, i, clean=False)
        f = faults[0]
        mean = [c["workers"] * c["rate_per_worker"] * wt.periodic(c, k * c["dt_s"]) * wt.drift(c, k * c["dt_s"])
                * c["dt_s"] / 60.0 for k in range(len(values))]
        oracle = [(x - m) / math.sqrt(m) for x, m in zip(values, mean)]
        cells = [separation(zs, f["row"]) for zs in (oracle, residuals_holt(values, 0.05, 0.0),
                                                     residuals_holt(values, 0.05, 0.01))]
        print(f"| {i} | {f['kind']} | {f['t'] / 3600:.1f} | " + " | ".join(f"{p:+.2f} / {m:+.2f}" for p, m in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
