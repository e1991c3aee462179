#!/usr/bin/env python3
"""Whether a lost node under a cycle is hidden from the detectors or from the threshold
(docs/anomaly.md, "Choosing an ensemble threshold"): over every throughput configuration of
the given files that is not held out, a downward CUSUM (k = 0.5, input clipped at 4) of the
residuals of the ensemble's level model (seasonal_bound.py's: an exponentially weighted
level, alpha 0.05, the residual scaled by 1.25 x the recent mean absolute error), after the
150-observation warm-up. Printed: the heights the CUSUM passes once in 1,000 and once in 10,000 normal
values (clean series, and faulty ones before their fault), and how many faults reach each
before their harm (a quarter of a site's capacity lost for 20 minutes). The ensemble turns
the CUSUM's height S into 2kS = S nats; its alert level is 11.5 nats (a score of 0.5).

Then the bound on any detector of these residuals: a level that learns alpha of each
residual leaves d (1 - alpha)^n of a step of d sigmas in the n-th residual after it, so the
evidence an ideal detector (the log-likelihood ratio of that known shape) expects to hold
by the harm, N values after the onset, is d^2 / 2 * sum_{n <= N} (1 - alpha)^(2n); for a
quarter of the capacity lost, d = 0.25 * mu / sqrt(mu) with mu the Poisson mean at the
onset (the noise alone: the level's lag only adds to sigma, so this is optimistic).
Printed: how many lost nodes expect to reach the alert level (11.5 nats) and 6.9 nats (a
policy threshold of 0.3) that way.

Usage: .venv/bin/python bench/nab/cusum_bound.py [--configs bench/nab/workflow_configs.json bench/nab/workflow_dev.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import workflow_traces as wt  # noqa: E402  (the generator)
from seasonal_bound import residuals_holt  # noqa: E402  (the level model's residuals)

WARMUP = 150
ALPHA = 0.05  # the level model's smoothing (SeasonalForecaster::Config::alpha)


def cusum_down(values: list[float]) -> list[float]:
    """The downward CUSUM after each value of the level model's residuals (0 during the warm-up)."""
    s, out = 0.0, []
    for t, z in enumerate(residuals_holt(values, ALPHA, 0.0)):
        s = max(0.0, s - max(-4.0, min(4.0, z)) - 0.5)
        out.append(s if t >= WARMUP else 0.0)
    return out


def ideal_evidence(c: dict, onset_t: float, rows: int) -> float:
    """The log-likelihood ratio a detector that knew the residuals' shape after a lost
    quarter of the capacity expects to hold `rows` values after its onset (module doc)."""
    mu = c["workers"] * c["rate_per_worker"] * wt.periodic(c, onset_t) * wt.drift(c, onset_t) * c["dt_s"] / 60.0
    d = 0.25 * math.sqrt(mu)
    return d * d / 2 * sum((1 - ALPHA) ** (2 * n) for n in range(rows + 1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+",
                    default=[str(HERE / "workflow_configs.json"), str(HERE / "workflow_dev.json")])
    a = ap.parse_args(argv)
    configs = [c for f in a.configs for c in json.loads(Path(f).read_text())["configs"]
               if c["signal"] == "throughput" and not c.get("heldout")]
    if not configs:
        sys.exit("no throughput configuration that is not held out")
    normal, reached, expected = [], [], []
    for c in configs:
        for i in range(c["traces"]):
            values, faults = wt.trace(c, i, clean=i >= c["traces"] - c["clean_traces"])
            s = cusum_down(values)
            start = int(0.15 * len(values))
            if not faults:
                normal += s[start:]
                continue
            f = faults[0]
            if f["harm_t"] is None:
                continue
            onset, harm = f["row"], int(f["harm_t"] / c["dt_s"])
            normal += s[start:onset]
            reached.append(max(s[onset:harm + 1]))
            if f["kind"] == "death":
                expected.append(ideal_evidence(c, f["t"], harm - onset))
    normal.sort(reverse=True)
    print(f"{len(configs)} throughput configurations, {len(reached)} faults with a harm, {len(normal)} normal values")
    for rate in (1e-3, 1e-4):
        height = normal[int(rate * len(normal))]
        print(f"passed once in {1 / rate:,.0f} normal values: {height:.1f} nats; "
              f"faults reaching it before their harm: {sum(x >= height for x in reached)} of {len(reached)}")
    print(f"faults reaching the alert level (11.5 nats) before their harm: {sum(x >= 11.5 for x in reached)} of {len(reached)}")
    expected.sort()
    print(f"lost nodes: {len(expected)}; the evidence an ideal detector of the level's residuals expects by the harm: "
          f"{expected[0]:.1f} to {expected[-1]:.1f} nats (median {expected[len(expected) // 2]:.1f}); "
          f"expected to reach 11.5 nats: {sum(x >= 11.5 for x in expected)}, 6.9 nats: {sum(x >= 6.9 for x in expected)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
