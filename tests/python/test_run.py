"""`diaspora run`: what a user sees of the main job, with real processes and a real relay.

Input checks (bad specs, bad --set, what local sites cannot run: refused before anything
starts), command tasks (the progress channel, a command that does not exist), streams
and deadlines, the ptycho-reconstruct kind's output and its data-arrival event, memory
limits, SIGINT, and the report. Faults and actions are in test_run_faults.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import run_harness as rn

SITE = "sites:\n  - {name: a, engine: local, workers: 2}\n"


def test_bad_spec_is_refused_before_anything_starts(tmp_path):
    spec = rn.write_spec(tmp_path, "version: 1\nname: bad\n" + SITE + "tasks:\n  - {name: t, kind: sleep, cout: 3}\n")
    out = tmp_path / "out"
    p = rn.run(spec, out)
    assert p.returncode == 2, p.stderr
    assert f"{spec}:6:28:" in p.stderr and "unknown key 'cout'; did you mean 'count'?" in p.stderr, p.stderr
    assert "nothing was started" in p.stderr
    assert not out.exists()


def test_what_local_sites_cannot_run_is_refused_with_its_place(tmp_path):
    spec = rn.write_spec(tmp_path, """version: 1
name: refused
sites:
  - {name: a, engine: local}
  - {name: d, engine: globus-compute, endpoint: "ep"}
tasks:
  - name: t
    kind: sleep
    args: {secs: 1}
  - name: big
    command: "true"
    resources: {cpus: 4096}
""")
    p = rn.run(spec, tmp_path / "out")
    assert p.returncode == 2
    assert f"{spec}:5:23: error: sites[1].engine: 'globus-compute' sites are driven by the engine adapters" in p.stderr, p.stderr
    assert f"{spec}:9:" in p.stderr and "args.secs: unknown argument of 'sleep' (known: seconds, step)" in p.stderr
    assert "tasks[1].resources.cpus: needs 4096" in p.stderr and "CPUs but this host has" in p.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("setting, message", [
    ("tasks.nope.count=2", "--set tasks.nope.count=2: error: no item named 'nope' in tasks"),
    ("sites[0].workers=0", "--set sites[0].workers=0: error: sites[0].workers:"),
    ("tasks.t.count", "--set tasks.t.count: error: expected KEY=VALUE"),
    ("sites[5].workers=2", "--set sites[5].workers=2: error: index 5 is out of range (sites has 1 items)"),
    ("tasks.t.deadline=soon", "--set tasks.t.deadline=soon: error: tasks[0].deadline: must be a duration"),
])
def test_bad_set_is_refused_before_anything_starts(tmp_path, setting, message):
    spec = rn.write_spec(tmp_path, "version: 1\nname: s\nsites:\n  - {name: a, engine: local}\n"
                                   "tasks:\n  - {name: t, kind: sleep, args: {seconds: 0.2}}\n")
    p = rn.run(spec, tmp_path / "out", "--set", setting)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_bad_baseline_option_is_a_usage_error(tmp_path):
    spec = rn.write_spec(tmp_path, "version: 1\nname: s\n" + SITE)
    p = rn.run(spec, tmp_path / "out", "--baseline", "120s")
    assert p.returncode == 2 and "expected retry-after=DURATION" in p.stderr


def test_commands_report_progress_and_a_missing_command_fails_alone(tmp_path):
    spec = rn.write_spec(tmp_path, """version: 1
name: cmds
sites:
  - {name: a, engine: local, workers: 2}
tasks:
  - name: steps
    command: 'for i in 1 2 3 4; do echo "progress 0.$((i*2)) $i" >&$DIASPORA_PROGRESS_FD; echo "metric rows $i" >&$DIASPORA_PROGRESS_FD; sleep 0.3; done; echo "$DIASPORA_TASK_ID" > "$DIASPORA_DATA_DIR/$DIASPORA_TASK_ID.txt"'
  - name: missing
    command: no-such-command-for-diaspora-test --flag
  - name: after
    kind: sleep
    args: {seconds: 0.5}
    count: 3
""")
    out = tmp_path / "out"
    p = rn.run(spec, out)
    assert p.returncode == 1, p.stdout + p.stderr  # one instance failed for good
    rep = rn.report(out)
    assert rn.instance(rep, "steps.0")["state"] == "completed"
    assert (out / "data" / "steps" / "steps.0.txt").read_text().strip() == "steps.0"
    bad = rn.instance(rep, "missing.0")
    assert bad["state"] == "failed"
    assert "exit status 127" in bad["reason"] and "not found" in bad["reason"], bad
    assert all(rn.instance(rep, f"after.{k}")["state"] == "completed" for k in range(3))
    assert rep["summary"]["completed"] == 4 and rep["summary"]["failed"] == 1
    # The progress lines became progress events on the relay, with their metric.
    n = rep["plugin"]["stats"]["events_acked"]
    events = rn.stored_events(out, "cmds.events", n)
    steps = [e for e in events if e.get("subject") == "steps.0"]
    progress = [e["data"] for e in steps if e["type"] == "org.diaspora.task.progress"]
    assert [d["progress"] for d in progress] == [0.2, 0.4, 0.6, 0.8], progress
    assert any(e["type"] == "org.diaspora.task.heartbeat" and e["data"].get("metrics", {}).get("rows") == 4
               for e in steps), steps
    types = [e["type"] for e in events if e.get("subject") == "missing.0" and e["type"].startswith("org.diaspora.task.")]
    assert types == ["org.diaspora.task.submitted", "org.diaspora.task.started", "org.diaspora.task.failed"], types


def test_stream_and_deadlines(tmp_path):
    spec = rn.write_spec(tmp_path, """version: 1
name: stream
sites:
  - {name: a, engine: local, workers: 2}
tasks:
  - name: tick
    kind: sleep
    args: {seconds: 0.3, step: 0.1}
    rate: 4
    duration: 2s
    deadline: 5s
  - name: late
    kind: sleep
    args: {seconds: 1.5}
    deadline: 500ms
""")
    out = tmp_path / "out"
    p = rn.run(spec, out)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = rn.report(out)
    ticks = [i for i in rep["instances"] if i["task"] == "tick"]
    assert len(ticks) == 8
    starts = sorted(i["submitted_s"] for i in ticks)
    # 4 per second over 2 s: the k-th never before k/4 s after the first (a stream is never ahead
    # of its rate), and the 8 within 4 s (not stalled; a loaded machine may run late)
    assert all(t - starts[0] >= k * 0.25 - 0.02 for k, t in enumerate(starts)), starts
    assert starts[-1] - starts[0] <= 4.0, starts
    assert all(i["deadline_met"] for i in ticks)
    late = rn.instance(rep, "late.0")
    assert late["state"] == "completed" and late["deadline_met"] is False
    assert rep["summary"]["deadline_misses"] == 1 and rep["summary"]["with_deadline"] == 9


def test_ptycho_reconstruct_writes_and_announces_its_result(tmp_path):
    spec = rn.write_spec(tmp_path, """version: 1
name: ptycho
sites:
  - {name: a, engine: local, workers: 2}
tasks:
  - name: rec
    kind: ptycho-reconstruct
    args: {iterations: 40, object_size: 64, probe_size: 16, scan_step: 4, probe_modes: 2}
    count: 2
""")
    out = tmp_path / "out"
    p = rn.run(spec, out)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = rn.report(out)
    for k in range(2):
        res = rn.instance(rep, f"rec.{k}")["result"]
        f = Path(res["file"])
        assert res["positions"] >= 169
        n, P = 16, res["positions"]  # the scan file: header, corners, patterns, probe, object, CRC
        assert f.is_file() and f.stat().st_size == 24 + P * 8 + P * n * n * 4 + n * n * 4 + 64 * 64 * 8 + 4 == res["bytes"]
        assert f.read_bytes()[:8] == b"DSPSCAN1"
        # A real reconstruction: the object found matches the simulated one far better than
        # the flat start (error 1 - |mean| ~ 0.4 for this object), and the data fits.
        assert res["object_error"] < 0.25, res
        assert res["fourier_error"] < 0.1, res
    events = rn.stored_events(out, "ptycho.events", rep["plugin"]["stats"]["events_acked"])
    arrived = [e for e in events if e["type"] == "org.diaspora.data.arrived"]
    assert sorted(e["data"]["seq"] for e in arrived) == [0, 1]
    assert all(e["data"]["uri"].startswith("file://") and e["data"]["checksum"].startswith("crc32c:") for e in arrived)
    steps = [e for e in events if e["type"] == "org.diaspora.task.progress" and e["subject"] == "rec.0"]
    assert len(steps) == 40 and all(e["data"]["metrics"]["step_time_s"] > 0 for e in steps)


def test_memory_limit_is_enforced(tmp_path):
    spec = rn.write_spec(tmp_path, """version: 1
name: mem
sites:
  - {name: a, engine: local}
tasks:
  - name: hog
    command: /usr/bin/python3 -c "x = bytearray(600 * 2**20)"
    resources: {memory: 200MiB}
""")
    out = tmp_path / "out"
    p = rn.run(spec, out)
    assert p.returncode == 1
    hog = rn.instance(rn.report(out), "hog.0")
    assert hog["state"] == "failed" and "MemoryError" in hog["reason"], hog


def test_sigint_stops_writes_the_report_and_leaves_no_worker(tmp_path):
    spec = rn.write_spec(tmp_path, "version: 1\nname: int\n" + SITE +
                         "tasks:\n  - {name: long, kind: sleep, args: {seconds: 60}, count: 3}\n")
    out = tmp_path / "out"
    p = subprocess.Popen([str(rn.DIASPORA), "run", str(spec), "--out", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(rn.worker_processes(p.pid)) < 2:  # the pool is up
        time.sleep(0.1)
    workers = rn.worker_processes(p.pid)
    assert len(workers) == 2
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=30)
    assert p.returncode == 1, stdout + stderr
    rn.assert_no_sanitizer_report(out, stderr)
    rep = rn.report(out)
    assert rep["interrupted"] == "interrupted by a signal"
    assert {i["state"] for i in rep["instances"]} == {"cancelled"}
    assert rep["plugin"]["stats"]["close_status"] == "DIASPORA_OK"  # every event reached the relay
    time.sleep(0.5)
    assert rn.worker_processes() & workers == set()


def test_report_html_is_self_contained(tmp_path):
    spec = rn.write_spec(tmp_path, "version: 1\nname: html\n" + SITE +
                         "tasks:\n  - {name: t, kind: sleep, args: {seconds: 0.2}, count: 2}\n")
    out = tmp_path / "out"
    assert rn.run(spec, out).returncode == 0
    html = (out / "report.html").read_text()
    assert "<svg" in html and "t.0 attempt 1" in html
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html
    png = (out / "timeline.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png[12:16] == b"IHDR"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width >= 640 and 40 + 2 * 16 < height < 400


def test_resume_after_the_runner_is_killed_skips_finished_instances(tmp_path):
    spec = rn.write_spec(tmp_path, """version: 1
name: resume
sites:
  - {name: a, engine: local, workers: 2}
tasks:
  - name: burn
    kind: cpu-burn
    args: {seconds: 1.5, step: 0.25}
    count: 6
""")
    out = tmp_path / "out"
    p = subprocess.Popen([str(rn.DIASPORA), "run", str(spec), "--out", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    done = 0
    deadline = time.monotonic() + 60
    for line in p.stdout:  # kill it once two instances are done and others are running
        done += " done burn." in line
        if done >= 2 and " start burn." in line or time.monotonic() > deadline:
            break
    time.sleep(0.3)  # the plugin publishes within its batch delay (what it had not sent dies with it)
    p.kill()
    p.wait(timeout=10)
    assert not (out / "report.json").exists()
    r = subprocess.run([str(rn.DIASPORA), "run", str(spec), "--resume", str(out)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rn.assert_no_sanitizer_report(out, r.stderr)
    rep = rn.report(out)
    restored = [i for i in rep["instances"] if i.get("restored")]
    rerun = [i for i in rep["instances"] if not i.get("restored")]
    assert len(restored) >= 1 and len(restored) + len(rerun) == 6
    assert all(i["attempts"] == [] and i["state"] == "completed" for i in restored)
    assert all(i["state"] == "completed" and i["attempts"] for i in rerun)
    # The log holds one completion per instance: nothing finished was run again.
    events = rn.stored_events(out, "resume.events", None)  # all of them: a second completion could be anywhere
    completed = [e["subject"] for e in events if e["type"] == "org.diaspora.task.completed"]
    assert sorted(completed) == sorted(f"burn.{k}" for k in range(6)), completed


def test_resume_needs_a_run_folder(tmp_path):
    spec = rn.write_spec(tmp_path, "version: 1\nname: s\n" + SITE)
    p = subprocess.run([str(rn.DIASPORA), "run", str(spec), "--resume", str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 2 and "not the output folder of a run" in p.stderr


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's zombie waits for init)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def test_a_sigkilled_runner_takes_its_workers_and_commands_with_it(tmp_path):
    # A built-in kind busy on a local worker, and a command whose work runs in grandchildren
    # of the runner (a pipeline: the shell forks both sides). Without the parent-death
    # signal and the group guard, each went on computing after the runner died, so a
    # `--resume` at once ran an instance twice at the same time.
    marker = f"600.{os.getpid()}{time.monotonic_ns() % 100000}"  # sleep's argument, unique to this test
    spec = rn.write_spec(tmp_path, "version: 1\nname: orphans\n" + SITE +
                         "tasks:\n  - {name: long, kind: cpu-burn, args: {seconds: 60}, count: 1}\n"
                         f"  - {{name: pipe, command: 'sleep {marker} | cat', count: 1}}\n")
    out = tmp_path / "out"
    p = subprocess.Popen([str(rn.DIASPORA), "run", str(spec), "--out", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        def sleepers():
            return {pid for pid, cmd in rn.process_cmdlines() if marker.encode() in cmd}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (len(rn.worker_processes(p.pid)) < 2 or not sleepers()):
            time.sleep(0.1)
        workers, work = rn.worker_processes(p.pid), sleepers()
        assert len(workers) == 2 and work, (workers, work)
        p.kill()
        p.wait(timeout=10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(x) for x in workers | work):
            time.sleep(0.05)
        assert not [x for x in workers | work if _alive(x)], "processes outlived their runner"
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=10)
        for pid, cmd in rn.process_cmdlines():
            if marker.encode() in cmd:
                os.kill(pid, signal.SIGKILL)


def test_the_report_is_held_to_its_schema(tmp_path):
    import copy
    import json
    import jsonschema
    spec = rn.write_spec(tmp_path, "version: 1\nname: schema\n" + SITE +
                         "tasks:\n  - {name: t, kind: sleep, args: {seconds: 0.2}, count: 2, deadline: 30s}\n")
    out = tmp_path / "out"
    assert rn.run(spec, out).returncode == 0
    rep = rn.report(out)  # valid (rn.report checks every report it reads)
    v = jsonschema.Draft202012Validator(json.loads(rn.REPORT_SCHEMA.read_text()))
    bad = []
    for mutate in (lambda r: r.__setitem__("interrupted", True),
                   lambda r: r["instances"][0]["attempts"][0].__setitem__("outcome", "vanished"),
                   lambda r: r["summary"].pop("deadline_misses"),
                   lambda r: r["instances"][0].__setitem__("state", "pending"),
                   lambda r: r.__setitem__("extra", 1)):
        r = copy.deepcopy(rep)
        mutate(r)
        bad.append(not v.is_valid(r))
    assert bad == [True] * 5


def _signalled_run(tmp_path, marker: str):
    """A run of a command that ignores SIGTERM and SIGINT (its stop takes the grace before
    the kill), started and waited for until its command runs."""
    spec = rn.write_spec(tmp_path, "version: 1\nname: sig\n" + SITE +
                         f"tasks:\n  - {{name: stubborn, command: \"trap '' TERM INT; sleep {marker}; true\", count: 1}}\n")
    out = tmp_path / "out"
    p = subprocess.Popen([str(rn.DIASPORA), "run", str(spec), "--out", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not [x for x, cmd in rn.process_cmdlines() if marker.encode() in cmd]:
        time.sleep(0.1)
    return p, out


def test_sigterm_stops_as_sigint_does(tmp_path):
    marker = f"601.{os.getpid()}{time.monotonic_ns() % 100000}"
    p, out = _signalled_run(tmp_path, marker)
    try:
        p.send_signal(signal.SIGTERM)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 1, stdout + stderr
    rn.assert_no_sanitizer_report(out, stderr)
    rep = rn.report(out)
    assert rep["interrupted"] == "interrupted by a signal"
    assert rn.instance(rep, "stubborn.0")["state"] == "cancelled"
    assert not [x for x, cmd in rn.process_cmdlines() if marker.encode() in cmd]  # its command was killed


def test_a_second_signal_kills_every_process_group_at_once_and_exits_130(tmp_path):
    # docs/run.md, "Signals": the first signal stops the command with a grace (it ignores
    # SIGTERM, so the stop waits); a second one does not wait.
    marker = f"602.{os.getpid()}{time.monotonic_ns() % 100000}"
    p, out = _signalled_run(tmp_path, marker)
    try:
        p.send_signal(signal.SIGINT)
        time.sleep(0.3)
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        stdout, stderr = p.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        for pid, cmd in rn.process_cmdlines():
            if marker.encode() in cmd:
                os.kill(pid, signal.SIGKILL)
    assert p.returncode == 130, stdout + stderr
    assert took < 5, took
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and [x for x, cmd in rn.process_cmdlines() if marker.encode() in cmd]:
        time.sleep(0.05)
    assert not [x for x, cmd in rn.process_cmdlines() if marker.encode() in cmd], "the command outlived the runner"


def test_failure_grace_bounds_the_wait_for_a_policy(tmp_path):
    # A failed attempt whose task a policy could restart waits --failure-grace for it, then
    # the instance fails for good, saying so (docs/run.md). Here the one policy that could
    # act never fires (the defaults are off); the command dies of a signal, which a retry
    # could fix.
    spec = rn.write_spec(tmp_path, "version: 1\nname: grace\ndefaults: off\n" + SITE +
                         "tasks:\n  - {name: flaky, command: 'kill -KILL $$', count: 1}\n"
                         "policies:\n  - {name: never, signal: task.step_time, detector: threshold, threshold: 1000000,"
                         " action: restart, targets: [flaky]}\n")
    timings = {}
    for grace in ("1s", "3s"):
        out = tmp_path / f"out-{grace}"
        p = rn.run(spec, out, "--failure-grace", grace)
        assert p.returncode == 1, p.stdout + p.stderr
        inst = rn.instance(rn.report(out), "flaky.0")
        assert inst["state"] == "failed" and len(inst["attempts"]) == 1, inst
        assert f"(no policy restarted it within {grace[:-1]} s)" in inst["reason"], inst["reason"]
        timings[grace] = inst["end_s"] - inst["attempts"][-1]["end_s"]
    assert 0.9 <= timings["1s"] < 2.5 and 2.9 <= timings["3s"] < 4.5, timings
    bad = subprocess.run([str(rn.DIASPORA), "run", str(spec), "--out", str(tmp_path / "o2"), "--failure-grace", "soon"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "--failure-grace 'soon'" in bad.stderr, bad.stderr


def test_a_resumed_stream_goes_on_from_the_next_instance_at_its_rate(tmp_path):
    # docs/run.md, "--resume": a stream's instances submitted before the kill are not made
    # again; the stream goes on from the next one, at its rate (4 a second here).
    spec = rn.write_spec(tmp_path, "version: 1\nname: rstream\n" + SITE +
                         "tasks:\n  - {name: tick, kind: sleep, args: {seconds: 0.05}, rate: 4, duration: 6s}\n")
    out = tmp_path / "out"
    p = subprocess.Popen([str(rn.DIASPORA), "run", str(spec), "--out", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    done = 0
    deadline = time.monotonic() + 60
    for line in p.stdout:  # kill it once eight instances are done
        done += " done tick." in line
        if done >= 8 or time.monotonic() > deadline:
            break
    time.sleep(0.3)
    p.kill()
    p.wait(timeout=10)
    r = subprocess.run([str(rn.DIASPORA), "run", str(spec), "--resume", str(out)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rn.assert_no_sanitizer_report(out, r.stderr)
    rep = rn.report(out)
    ids = sorted(int(i["id"].split(".")[1]) for i in rep["instances"])
    assert ids == list(range(24)), ids  # 6 s at 4 a second: each instance once, none made twice
    restored = [i for i in rep["instances"] if i.get("restored")]
    new = sorted(i["submitted_s"] for i in rep["instances"] if not i.get("restored"))
    assert len(restored) >= 8 and len(new) >= 4, (len(restored), new)
    # Those submitted before the kill but not finished are submitted again at once; the
    # stream's next ones then come at its rate.
    later = [t for t in new if t > new[0] + 0.1]
    gaps = [b - a for a, b in zip(later, later[1:])]
    assert len(later) >= 3 and all(0.2 <= g <= 0.35 for g in gaps), (new, gaps)
