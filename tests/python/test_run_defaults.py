"""Protection on by default (docs/anomaly.md, "Default protection"), with real processes:
specs written as a new user writes them (no policies, or the natural one-line policy) on
two local sites; the plugin's default set decides, the runner carries it out.

Timing margins are wide on purpose (2 shared cores, sanitizer builds, tests in parallel).
"""

from __future__ import annotations

import json
import ssl
from datetime import datetime
import urllib.request

import run_harness as rn

TWO_SITES = """version: 1
name: defaults
sites:
  - {name: near, engine: local, workers: 2}
  - {name: far, engine: local, workers: 2}
"""


def run_ok(tmp_path, text: str, out_name: str = "out", *args: str, name: str = "wf.yaml"):
    """Writes the spec, runs it to a successful end; (the run, its report, its --out)."""
    out = tmp_path / out_name
    p = rn.run(rn.write_spec(tmp_path, text, name), out, *args)
    assert p.returncode == 0, p.stdout + p.stderr
    return p, rn.report(out), out


def burn(seconds: float, count: int, step: float = 0.25) -> str:
    return ("tasks:\n  - name: burn\n    kind: cpu-burn\n"
            f"    args: {{seconds: {seconds}, step: {step}}}\n    count: {count}\n    preferred_sites: [near]\n")


def test_with_no_policy_a_killed_worker_is_retried_off_its_site_and_a_slowed_site_is_left(tmp_path):
    # The second scenario, with the defaults instead of hand-written policies (far
    # has a worker to spare: a retry moves to a site with room, not to a queue).
    p, rep, _ = run_ok(tmp_path, TWO_SITES.replace("{name: far, engine: local, workers: 2}",
                                                   "{name: far, engine: local, workers: 3}") + burn(5, 4) + """faults:
  - {at: 1s, kind: kill-worker, site: near, task: burn}
  - {at: 3s, kind: slow-site, site: near, factor: 4, for: 60s}
""")
    assert rep["summary"]["completed"] == 4, rep["summary"]
    kill = rep["faults"][0]
    killed = rn.instance(rep, kill["hit"][0]["instance"])
    assert "died (killed by signal 9 (SIGKILL))" in killed["attempts"][0]["reason"], killed
    # default-retry: the next attempt runs off the site that just lost it.
    assert killed["attempts"][1]["site"] == "far", killed
    retry = [a for a in rep["actions"] if a["task"] == killed["id"] and a["reason"].startswith("default-retry")]
    assert retry, p.stdout
    assert retry[0]["kind"] == "migrate" and "restart off suspect site near" in retry[0]["reason"], rep["actions"]
    # default-slow: what still ran on near once it slowed moved to far.
    slow = [a for a in rep["actions"] if a["reason"].startswith("default-slow")]
    assert slow and all(a["kind"] == "migrate" and a["target_site"] == "far" for a in slow), rep["actions"]
    assert any(a["outcome"] == "done" for a in slow), slow
    assert "the task's normal" in slow[0]["reason"], slow[0]
    # Nothing went back onto the slowed site by a policy's choice.
    for a in rep["actions"]:
        assert a["target_site"] != "near", a
    # Each stopped attempt is the action's consequence: no action was refused as not needed.
    assert all(a["outcome"] == "done" for a in rep["actions"]), rep["actions"]


def test_the_natural_step_time_policy_moves_a_slowed_sites_work_within_seconds(tmp_path):
    # The first scenario, shortened: one policy written the natural way (default
    # detector, no threshold), near slowed 4x; far would otherwise sit idle.
    p, rep, _ = run_ok(tmp_path, TWO_SITES + burn(8, 4) + """policies:
  - {name: leave, signal: task.step_time, action: migrate, to_sites: [far]}
faults:
  - {at: 3s, kind: slow-site, site: near, factor: 4, for: 60s}
""")
    assert rep["summary"]["completed"] == 4
    moves = rn.actions(rep, "migrate")
    assert moves and all(a["reason"].startswith("leave: task.step_time") for a in moves), rep["actions"]
    assert "the task's normal" in moves[0]["reason"], moves[0]
    moved = {a["task"] for a in moves if a["outcome"] == "done"}
    assert len(moved) == 2, rep["actions"]  # the two instances near ran
    for iid in moved:
        assert rn.instance(rep, iid)["attempts"][-1]["site"] == "far"
    # reaction: the fault to the recovering attempt running (a 0.25 s step takes 1 s slowed)
    assert 0 < rep["faults"][0]["hit"][0]["reaction_s"] < 15, rep["faults"]


def test_a_straggler_is_copied_where_a_worker_is_free_and_the_copy_wins(tmp_path):
    # One attempt slows 4x (a bad node) while its neighbour on near keeps its pace and far
    # has a free worker: LATE's rule, a copy there rather than a move; the first to finish
    # wins. Slowed alone it would take 2 + 6 x 4 = 26 s.
    p, rep, out = run_ok(tmp_path, TWO_SITES + burn(8, 3) + """faults:
  - {at: 2s, kind: slow-task, site: near, task: burn, factor: 4}
""")
    assert rep["summary"]["completed"] == 3, rep["summary"]
    fault = rep["faults"][0]
    assert fault["kind"] == "slow-task" and fault["target"].endswith(" on near/worker-0"), fault
    hit = fault["hit"][0]["instance"]
    acts = [a for a in rep["actions"] if a["reason"].startswith("default-slow")]
    assert len(acts) == 1, rep["actions"]
    assert acts[0]["kind"] == "speculate" and acts[0]["task"] == hit and acts[0]["target_site"] == "far", acts
    assert "a straggler: the other attempts on near run at their normal pace" in acts[0]["reason"], acts[0]
    assert not rn.actions(rep, "migrate"), rep["actions"]  # the neighbour was left alone
    inst = rn.instance(rep, hit)
    won = [a for a in inst["attempts"] if a["outcome"] == "completed"]
    assert len(won) == 1 and won[0]["site"] == "far", inst["attempts"]
    # The fault ended with its attempt (stopped when the copy won), not at the run's end.
    assert fault["end_s"] is not None and fault["end_s"] <= rep["duration_s"], fault
    assert fault["hit"][0]["reaction_s"] is not None and fault["hit"][0]["reaction_s"] < 15, fault
    # The report groups the incident: the fault, the anomaly seen, the decision, the outcome.
    assert [i["instance"] for i in rep["incidents"]] == [hit], rep["incidents"]
    inc = rep["incidents"][0]
    assert inc["faults"][0]["kind"] == "slow-task"
    assert [(d["kind"], d["policy"]) for d in inc["decisions"]] == [("speculate", "default-slow")], inc
    assert any("task.step_time" in e["what"] for e in inc["evidence"]), inc
    assert inc["state"] == "completed" and inc["recovering_site"] == "far", inc
    assert "<h2>Incidents</h2>" in (out / "report.html").read_text()


def test_what_a_run_learned_seeds_the_next_so_a_site_slow_from_the_start_is_seen(tmp_path):
    # Run 1, fault-free: burn's normal step time on near is kept in OUT/normals.json.
    _, _, first = run_ok(tmp_path, TWO_SITES + burn(3, 2), "first")
    kept = json.loads((first / "normals.json").read_text())
    assert kept["workflow"] == "defaults" and kept["families"]["burn"]["task.step_time"][0]["site"] == "near", kept
    # Run 2: near is 4x slower from the start and both instances run there (far idles).
    # Alone, its slow steps would be its normal; started from run 1's, they are seen.
    slow_text = TWO_SITES + burn(6, 2) + """faults:
  - {at: 0s, kind: slow-site, site: near, factor: 4}
"""
    p, rep, _ = run_ok(tmp_path, slow_text, "second", "--learn-from", str(first), name="slow.yaml")
    assert f"normals: the policies start from what {first / 'normals.json'} kept" in p.stdout, p.stdout
    moves = [a for a in rep["actions"] if a["reason"].startswith("default-slow")]
    assert {a["task"] for a in moves} == {"burn.0", "burn.1"}, rep["actions"]
    assert all(a["kind"] == "migrate" and a["target_site"] == "far" for a in moves), moves
    assert "task's normal" in moves[0]["reason"] and "on near" in moves[0]["reason"], moves[0]
    # A file that is not one is refused before anything starts, saying what is wrong.
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1, "workflow": "another", "families": {}}')
    p = rn.run(tmp_path / "slow.yaml", tmp_path / "third", "--learn-from", str(bad))
    assert p.returncode == 2, p.stdout + p.stderr
    assert "learned by workflow 'another', not 'defaults'" in p.stderr, p.stderr
    assert not (tmp_path / "third").exists()


def test_exit_127_is_not_retried_and_a_noisy_fault_free_run_takes_no_action(tmp_path):
    # Step times anywhere between 0.1 and 0.9 s, reported as a command's metric.
    noisy = ("for i in $(seq 12); do s=0.$((RANDOM % 9 + 1)); sleep $s; "
             "echo \"metric step_time_s $s\" >&$DIASPORA_PROGRESS_FD; done")
    spec = rn.write_spec(tmp_path, TWO_SITES + f"""tasks:
  - name: noisy
    command: '{noisy}'
    count: 4
  - name: missing
    command: no-such-command-for-diaspora-test
""")
    out = tmp_path / "out"
    p = rn.run(spec, out)
    assert p.returncode == 1, p.stdout + p.stderr  # the missing command failed for good
    rep = rn.report(out)
    assert all(rn.instance(rep, f"noisy.{k}")["state"] == "completed" for k in range(4))
    missing = rn.instance(rep, "missing.0")
    assert missing["state"] == "failed" and len(missing["attempts"]) == 1, missing
    assert "exit status 127" in missing["reason"] and "no policy restarted it" not in missing["reason"], missing
    assert rep["actions"] == [], rep["actions"]  # no retry of the exit 127, nothing on the noise
    # The one decision about it is an alert saying why it is not retried.
    events = rn.stored_events(out, "defaults.events", rep["plugin"]["stats"]["events_acked"])
    told = [e["data"] for e in events if e["type"] == "org.diaspora.anomaly.predicted"]
    assert len(told) == 1 and told[0]["task_id"] == "missing.0", told
    assert "a retry cannot fix" in str(told[0]) or told[0].get("policy") == "default-retry", told
    # Its action.requested names the policy and, being no attempt of its budget, no attempt.
    (asked,) = [e["data"] for e in events if e["type"] == "org.diaspora.action.requested"]
    assert asked["action"] == "alert" and asked["policy"] == "default-retry" and "attempt" not in asked, asked


def test_a_spent_budget_is_one_alert_that_says_so_in_its_event_and_the_report(tmp_path):
    # Every attempt reports a step time over the threshold: the first is restarted, the
    # policy's budget (1) is then spent, said once, and the task finishes where it is.
    slow = "for i in 1 2 3 4; do echo \"metric step_time_s 5\" >&$DIASPORA_PROGRESS_FD; sleep 0.5; done"
    _, rep, out = run_ok(tmp_path, TWO_SITES + f"""tasks:
  - name: slow
    command: '{slow}'
policies:
  - {{name: too-slow, signal: task.step_time, detector: threshold, threshold: 1, action: restart, max_attempts: 1, cooldown: 0.2s}}
""")
    assert [a["kind"] for a in rep["actions"] if a["task"] == "slow.0"] == ["restart"], rep["actions"]
    (inc,) = [i for i in rep["incidents"] if i["instance"] == "slow.0"]
    assert inc["budget_spent"] is True and inc["state"] == "completed", inc
    events = rn.stored_events(out, "defaults.events", rep["plugin"]["stats"]["events_acked"])
    asked = [(e["data"]["action"], e["data"].get("policy"), e["data"].get("attempt"))
             for e in events if e["type"] == "org.diaspora.action.requested"]
    assert asked == [("restart", "too-slow", 1), ("alert", "too-slow", 0)], asked


def test_with_no_policy_a_hung_attempt_is_restarted_within_seconds(tmp_path):
    # default-revive: the hung attempt's heartbeats stop; it is restarted (once), and the
    # attempt the restart stopped is not taken for a new failure.
    _, rep, _ = run_ok(tmp_path, TWO_SITES + burn(5, 2) + """faults:
  - {at: 2s, kind: hang-task, site: near, task: burn}
""")
    assert rep["summary"]["completed"] == 2, rep["summary"]
    hang = rep["faults"][0]
    hung = rn.instance(rep, hang["hit"][0]["instance"])
    assert hung["attempts"][0]["outcome"] == "stopped", hung
    revive = [a for a in rep["actions"] if a["task"] == hung["id"]]
    assert len(revive) == 1 and revive[0]["reason"].startswith("default-revive: task.heartbeat_gap"), rep["actions"]
    assert revive[0]["kind"] in ("restart", "migrate") and revive[0]["outcome"] == "done", revive
    assert 0 < hang["hit"][0]["reaction_s"] < 15, hang  # the corpus measures it: 3.5 s median held out
    (inc,) = [i for i in rep["incidents"] if i["instance"] == hung["id"]]
    assert inc["faults"][0]["kind"] == "hang-task" and inc["state"] == "completed", inc


def test_defaults_off_leaves_a_lost_worker_lost(tmp_path):
    spec = rn.write_spec(tmp_path, TWO_SITES + "defaults: off\n" + burn(3, 1) + """faults:
  - {at: 1s, kind: kill-worker, site: near, task: burn}
""")
    out = tmp_path / "out"
    p = rn.run(spec, out)
    assert p.returncode == 1, p.stdout + p.stderr
    rep = rn.report(out)
    inst = rn.instance(rep, "burn.0")
    assert inst["state"] == "failed" and len(inst["attempts"]) == 1 and rep["actions"] == [], inst


def test_a_finished_run_is_served_again_and_tail_stops_at_the_end(tmp_path):
    import re
    import signal
    import subprocess
    spec = rn.write_spec(tmp_path, TWO_SITES + burn(0.5, 2))
    out = tmp_path / "out"
    p = rn.run(spec, out)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"after the run: diaspora run --serve {out}" in p.stdout, p.stdout  # where to watch it
    srv = subprocess.Popen([str(rn.DIASPORA), "run", "--serve", str(out)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        lines = [srv.stdout.readline() for _ in range(5)]
        url = re.search(r"events:\s+(wss://127\.0\.0\.1:\d+)", "".join(lines))
        assert url, lines
        assert any("console: https://127.0.0.1:" in line for line in lines), lines
        t = subprocess.run([str(rn.DIASPORA), "tail", "--url", url.group(1), "--ca", str(out / "relay" / "certs" / "ca.pem"),
                            "--token-file", str(out / "relay" / "token"), "--topic", "defaults.events",
                            "--from", "earliest", "--idle", "2"], capture_output=True, text=True, timeout=60)
        assert t.returncode == 0, t.stderr  # it stopped by itself, at the end of the log
        types = [json.loads(line)["type"] for line in t.stdout.splitlines()]
        assert types.count("org.diaspora.task.completed") == 2, types
        # The views say when the run ended: its plugin's closing counters, the log's last event.
        closing = json.loads(t.stdout.splitlines()[-1])
        assert closing["type"] == "org.diaspora.plugin.stats" and closing["data"]["closing"] is True, closing
        ctx = ssl.create_default_context(cafile=str(out / "relay" / "certs" / "ca.pem"))
        req = urllib.request.Request(url.group(1).replace("wss://", "https://") + "/api/v1/views/workflows",
                                     headers={"Authorization": "Bearer " + (out / "relay" / "token").read_text().strip()})
        (wf,) = json.loads(urllib.request.urlopen(req, context=ctx, timeout=20).read())["items"]
        assert wf["workflow"] == "defaults" and wf["ended_us"] > 0, wf
        # The time the relay stored it (the views' clock), seconds at most after the plugin stamped it.
        closed_us = datetime.fromisoformat(closing["time"].replace("Z", "+00:00")).timestamp() * 1e6
        assert wf["ended_us"] == wf["last_us"] and 0 <= wf["ended_us"] - closed_us < 5e6, (wf, closing)
    finally:
        srv.send_signal(signal.SIGINT)
        assert srv.wait(timeout=30) == 0
    bad = subprocess.run([str(rn.DIASPORA), "run", "--serve", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "no embedded relay log" in bad.stderr, bad.stderr


def test_the_workflow_corpus_is_whole_and_every_spec_loads():
    """bench/run/corpus (run by make bench, not here): what the issue asks of it."""
    import subprocess
    from pathlib import Path
    root = Path(__file__).resolve().parents[2] / "bench" / "run" / "corpus"
    index = json.loads((root / "corpus.json").read_text())["specs"]
    files = sorted(p.stem for p in (root / "specs").glob("*.yaml"))
    assert sorted(s["name"] for s in index) == files  # every spec indexed, every index entry a file
    assert len(index) >= 24
    held = [s for s in index if s["set"] == "heldout"]
    assert len(index) / 3 - 1 <= len(held) <= len(index) / 2, len(held)  # about a third held out
    kinds = {k for s in index for k in s["faults"]}
    assert kinds == {"kill-worker", "hang-task", "slow-site", "slow-task", "stop-relay"}
    assert any(not s["faults"] for s in index) and any(not s["faults"] for s in held)
    assert any(s.get("long") for s in index) and any(s.get("quick") for s in index)
    for s in index:
        p = subprocess.run([str(rn.DIASPORA), "validate", str(root / "specs" / f"{s['name']}.yaml")],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, (s["name"], p.stdout + p.stderr)
        text = (root / "specs" / f"{s['name']}.yaml").read_text()
        sites = text.split("sites:")[1].split("tasks:")[0].count("{name:")
        assert 1 <= sites <= 4, s["name"]
