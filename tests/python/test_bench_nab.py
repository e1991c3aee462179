"""Tests of bench/nab/policy_threshold.py (the workflow traces judged as a policy with the
default threshold runs the ensemble: docs/anomaly.md, "An anomaly must last") with the real
diaspora-nab, on a small heartbeat configuration written here: the policy engine's settings
catch every stall before its harm with no decision on the clean series, where the settings
before them (each value judged alone, everything learned as normal) miss a second stall
and decide on late beats; the quiet rule as the policy engine applies it (PolicyOptions::
quiet_*); a site's throughput as its share of two sites' total (--peer-share: a common cycle
cancels, a lost node stays); the tool's refusals."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("DIASPORA_BIN_DIR", REPO / "build" / "bin"))
TOOL = REPO / "bench" / "nab" / "policy_threshold.py"

# Four 4000-second heartbeat series (late beats of 2-4 s one beat in 125), two with two stalls.
HEARTBEAT = {"name": "t-heartbeat", "signal": "heartbeat_gap", "seed": 1234, "traces": 4, "clean_traces": 2,
             "points": 4000, "dt_s": 1, "noise": 0.2, "pause_prob": 0.008, "faults_per_trace": 2, "kinds": ["stall"]}


def run_tool(tmp_path: Path, configs: list[dict], *args: str) -> subprocess.CompletedProcess:
    cfg = tmp_path / "configs.json"
    cfg.write_text(json.dumps({"configs": configs}))
    return subprocess.run([sys.executable, str(TOOL), "--build", str(BIN.parent), "--configs", str(cfg),
                           "--work", str(tmp_path / "work"), *args], capture_output=True, text=True, timeout=120)


def row(out: str, name: str) -> dict:
    """The table row of one configuration, its numbers parsed."""
    line = next(ln for ln in out.splitlines() if ln.startswith(f"| {name} |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    caught, faults = map(int, re.fullmatch(r"(\d+) of (\d+)", cells[3]).groups())
    return {"decisions_per_hour": float(cells[2]), "caught": caught, "faults": faults}


def test_the_policy_settings_catch_every_stall_and_leave_late_beats_alone(tmp_path):
    now = run_tool(tmp_path, [HEARTBEAT])
    assert now.returncode == 0, now.stderr
    assert "threshold 0.5 (0.3 on a quiet series: at most 0.1 runs an hour over it, 2.0 h or older), cooldown 50 " \
        "observations" in now.stdout
    shipped = row(now.stdout, "t-heartbeat")
    assert shipped == {"decisions_per_hour": 0.0, "caught": 4, "faults": 4}, now.stdout

    before = run_tool(tmp_path, [HEARTBEAT], "--set", "sustain_s=0", "--set", "learn_sustained=1")
    assert before.returncode == 0, before.stderr
    old = row(before.stdout, "t-heartbeat")
    assert old["caught"] < 4, before.stdout  # a second stall hidden by the first
    assert old["decisions_per_hour"] > 1.0, before.stdout  # late beats taken for stalls


def test_held_out_configurations_need_asking_and_bad_settings_are_refused(tmp_path):
    held = dict(HEARTBEAT, name="t-held", heldout=True)
    p = run_tool(tmp_path, [held])
    assert p.returncode != 0
    assert "held-out ones need --heldout" in p.stderr
    p = run_tool(tmp_path, [held], "--heldout")
    assert p.returncode == 0, p.stderr
    assert row(p.stdout, "t-held")["faults"] == 4

    p = run_tool(tmp_path, [HEARTBEAT], "--set", "no_such_setting=1")
    assert p.returncode != 0
    assert "diaspora-nab failed" in p.stderr and "unknown key 'no_such_setting'" in p.stderr


def test_the_quiet_rule_lowers_the_threshold_only_on_a_series_with_a_quiet_record():
    sys.path.insert(0, str(TOOL.parent))
    import policy_threshold as pt  # noqa: PLC0415  (the tool's own rule, as it scores)

    # One value a minute for 3 hours, no score over 0.3: 0.5 for the first 2 hours, then 0.3.
    quiet = pt.thresholds([0.0] * 180, 60, 0.5, 0.3, 0.1, 2.0)
    assert quiet[:120] == [0.5] * 120 and quiet[120:] == [0.3] * 60
    # The same with a run over 0.3 every 20 minutes (3 an hour, the allowance 0.1): 0.5 throughout.
    noisy = [0.4 if k % 20 == 0 else 0.0 for k in range(180)]
    assert set(pt.thresholds(noisy, 60, 0.5, 0.3, 0.1, 2.0)) == {0.5}
    # One run early (the allowance 0.1 an hour has covered it by 10 hours), a run lasting many
    # values counts once; the rule off (quiet 0) keeps 0.5.
    once = [0.4] * 30 + [0.0] * 600
    th = pt.thresholds(once, 60, 0.5, 0.3, 0.1, 2.0)
    assert th[599] == 0.5 and th[600] == 0.3
    assert set(pt.thresholds(once, 60, 0.5, 0.0, 0.1, 2.0)) == {0.5}


def test_a_written_threshold_or_the_rule_off_judges_every_value_alike(tmp_path):
    off = run_tool(tmp_path, [HEARTBEAT], "--quiet-threshold", "0")
    assert off.returncode == 0, off.stderr
    assert "threshold 0.5, cooldown 50 observations" in off.stdout
    written = run_tool(tmp_path, [HEARTBEAT], "--threshold", "0.5")
    assert written.returncode == 0, written.stderr
    assert "threshold 0.5, cooldown 50 observations" in written.stdout
    assert row(off.stdout, "t-heartbeat") == row(written.stdout, "t-heartbeat")


# A site's throughput under a half-daily cycle of +/-40 %, a node lost (a quarter of the
# workers) in each faulty series: the weak spot of docs/anomaly.md "A site's share".
HALF_DAILY = {"name": "t-half-daily", "signal": "throughput", "seed": 601, "traces": 4, "clean_traces": 1,
              "points": 4000, "dt_s": 60, "workers": 12, "rate_per_worker": 3.0, "period_s": 43200,
              "amplitude": 0.4, "drift_per_h": 0.005, "faults_per_trace": 1, "kinds": ["death"]}


def test_a_common_cycle_cancels_in_a_sites_share_and_a_lost_node_stays(tmp_path):
    sys.path.insert(0, str(REPO / "bench" / "nab"))
    import workflow_traces as wt  # noqa: PLC0415  (the generator, as the tool uses it)

    def hourly(v: list[float]) -> list[float]:
        return [sum(v[k:k + 60]) / 60 for k in range(0, len(v) - 59, 60)]

    clean, _ = wt.trace(HALF_DAILY, 3, clean=True)
    raw, share = hourly(clean), hourly(wt.peer_share(HALF_DAILY, 3, clean))
    assert max(raw) > 1.8 * min(raw)  # the cycle: +/-40 % of the site's rate
    assert all(0.45 < s < 0.55 for s in share), share  # gone in the share: half of the total
    values, faults = wt.trace(HALF_DAILY, 0, clean=False)
    (f,) = faults
    lost = wt.peer_share(HALF_DAILY, 0, values)[f["row"]:f["row"] + int(f["duration_s"] / 60)]
    assert abs(sum(lost) / len(lost) - 0.75 / 1.75) < 0.03  # three quarters of one site against a whole one

    p = run_tool(tmp_path, [HALF_DAILY], "--peer-share")
    assert p.returncode == 0, p.stderr
    raw_row, share_row = row(p.stdout, "t-half-daily"), row(p.stdout, "t-half-daily (its share)")
    either = row(p.stdout, "t-half-daily (either)")
    assert raw_row["faults"] == share_row["faults"] == either["faults"] == 3
    assert max(raw_row["caught"], share_row["caught"]) <= either["caught"] <= raw_row["caught"] + share_row["caught"]
    assert either["decisions_per_hour"] == pytest.approx(raw_row["decisions_per_hour"] + share_row["decisions_per_hour"], abs=0.011)
    assert "(its share)" not in run_tool(tmp_path, [HALF_DAILY]).stdout  # asked for only
