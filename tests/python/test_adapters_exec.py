"""`diaspora exec` with a real relay on 127.0.0.1 (TLS): exit statuses and signals passed
through, signals forwarded, the progress channel, a hung child detected and restarted by
the policy, checkpoint and cancel actions from an operator, bad input."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).parent))
from relay_harness import (DIASPORA, publish_action, relay_events,  # noqa: E402
                           wait_subscribed, write_spec)

SITES = [{"name": "a", "engine": "local"}]


def spec_of(relay, token, tmp_path, **extra) -> Path:
    return write_spec(tmp_path, relay.creds, token[1], relay.port, name="ex", sites=SITES, extra=extra)


def dexec(spec: Path, task: str, *cmd: str, opts=(), timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(DIASPORA), "exec", "--spec", str(spec), "--task", task, *opts, "--", *cmd],
                          capture_output=True, text=True, timeout=timeout, **kw)


def task_events(relay, token, task: str, n: int = 1) -> list[dict]:
    evs = relay_events(relay, token[0], n, topic="ex.events",
                       counted=lambda e: e["type"] in ("org.diaspora.task.completed", "org.diaspora.task.failed",
                                                       "org.diaspora.task.cancelled")
                       and e["data"]["task_id"] == task)
    return [e for e in evs if e["type"].startswith("org.diaspora.task.") and e["data"]["task_id"] == task]


def kinds(evs) -> list[str]:
    return [e["type"].rsplit(".", 1)[1] for e in evs if not e["type"].endswith(".heartbeat")]


def test_exit_statuses_and_signals_pass_through(relay, token, tmp_path):
    spec = spec_of(relay, token, tmp_path)
    ok = dexec(spec, "ok", "sh", "-c", "echo out; echo err >&2")
    assert ok.returncode == 0 and ok.stdout == "out\n" and "err" in ok.stderr, ok
    three = dexec(spec, "three", "sh", "-c", "exit 3")
    assert three.returncode == 3
    killed = dexec(spec, "killed", "sh", "-c", "kill -9 $$")
    assert killed.returncode == 128 + 9
    assert dexec(spec, "missing", "no-such-command-here").returncode == 127
    assert dexec(spec, "notexec", str(spec)).returncode == 126
    evs = task_events(relay, token, "ok")
    assert kinds(evs) == ["submitted", "started", "completed"]
    assert evs[1]["data"]["worker"].split(":")[-1].isdigit()
    final = [e["data"]["metrics"] for e in evs if e["type"].endswith(".heartbeat")][-1]
    assert "cpu_s" in final and "max_rss_mib" in final, final
    (f3,) = [e["data"] for e in task_events(relay, token, "three") if e["type"].endswith(".failed")]
    assert f3["exit_code"] == 3 and f3["reason"] == "exit status 3"
    assert f3["failure"] == "error"  # its own: the default protection does not retry it
    (fk,) = [e["data"] for e in task_events(relay, token, "killed") if e["type"].endswith(".failed")]
    assert fk["reason"] == "killed by signal 9 (SIGKILL)" and fk["exit_code"] == 137
    assert fk["failure"] == "lost"  # killed from outside (a node, the OOM killer): retried
    (fm,) = [e["data"] for e in task_events(relay, token, "missing") if e["type"].endswith(".failed")]
    assert "command not found" in fm["reason"]


def test_signals_are_forwarded_to_the_command(relay, token, tmp_path):
    spec = spec_of(relay, token, tmp_path)
    p = subprocess.Popen([str(DIASPORA), "exec", "--spec", str(spec), "--task", "trap", "--", "sh", "-c",
                          'trap "echo got-usr1" USR1; trap "echo got-term; exit 42" TERM; echo ready; '
                          'while true; do sleep 0.1; done'], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        p.send_signal(signal.SIGUSR1)
        assert p.stdout.readline() == "got-usr1\n"
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 42 and "got-term" in out, (out, err)


def test_the_progress_channel_reaches_the_relay(relay, token, tmp_path):
    spec = spec_of(relay, token, tmp_path)
    r = dexec(spec, "prog", "sh", "-c", 'echo "progress 0.5 3" >&$DIASPORA_PROGRESS_FD; '
              'echo "metric rows 7" >&$DIASPORA_PROGRESS_FD; echo "nonsense" >&$DIASPORA_PROGRESS_FD; '
              'echo "$DIASPORA_TASK_ID $DIASPORA_ATTEMPT"', opts=("--attempt", "2"))
    assert r.returncode == 0 and r.stdout == "prog 2\n", r
    evs = task_events(relay, token, "prog")
    prog = [e["data"] for e in evs if e["type"].endswith(".progress")]
    assert prog and prog[0]["progress"] == 0.5 and prog[0]["step"] == 3, prog
    assert any(e["data"].get("metrics", {}).get("rows") == 7 for e in evs if e["type"].endswith(".heartbeat"))
    assert evs[0]["data"]["attempt"] == 2


def test_a_hung_command_is_detected_and_restarted_by_the_policy(relay, token, tmp_path):
    spec = spec_of(relay, token, tmp_path, policies=[
        {"name": "restart-silent", "signal": "task.heartbeat_gap", "detector": "phi-accrual", "threshold": 8,
         "action": "restart"}])
    t0 = time.monotonic()
    r = dexec(spec, "hang", "sh", "-c", 'if [ "$DIASPORA_ATTEMPT" = 1 ]; then sleep 60; fi; echo finished',
              opts=("--heartbeat", "200ms", "--hang-after", "1s", "--grace", "2s"), timeout=90)
    took = time.monotonic() - t0
    assert r.returncode == 0 and r.stdout == "finished\n", r
    assert "looks hung" in r.stderr and took < 40, (took, r.stderr)
    evs = task_events(relay, token, "hang")
    assert kinds(evs) == ["submitted", "started", "failed", "submitted", "started", "completed"], kinds(evs)
    failed = next(e["data"] for e in evs if e["type"].endswith(".failed"))
    assert failed["retryable"] is True and "stopped for restart" in failed["reason"]


def test_checkpoint_and_cancel_actions_from_an_operator(relay, token, tmp_path):
    spec = spec_of(relay, token, tmp_path)
    p = subprocess.Popen([str(DIASPORA), "exec", "--spec", str(spec), "--task", "op", "--grace", "5s", "--", "sh", "-c",
                          'trap "echo checkpoint" USR1; echo ready; while true; do sleep 0.1; done'],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        wait_subscribed(relay, "ex.control.exec-op")  # the operator acts once the wrapper listens
        publish_action(relay, token[0], {"action_id": "op-1", "action": "checkpoint", "task_id": "op",
                                         "reason": "before maintenance"}, topic="ex.control.exec-op")
        assert p.stdout.readline() == "checkpoint\n"
        publish_action(relay, token[0], {"action_id": "op-2", "action": "cancel", "task_id": "op",
                                         "reason": "operator"}, topic="ex.control.exec-op")
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 128 + signal.SIGTERM, (out, err)
    evs = task_events(relay, token, "op")
    assert kinds(evs)[-1] == "cancelled"
    all_evs = relay_events(relay, token[0], 0, topic="ex.events", counted=lambda e: False)
    done = {e["data"]["action_id"]: e["data"] for e in all_evs if e["type"] == "org.diaspora.action.done"}
    assert done["op-1"]["status"] == "done" and "SIGUSR1" in done["op-1"]["message"]
    assert done["op-2"]["status"] == "done"


def test_bad_input_is_refused_unless_optional(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: ex\nsites:\n  - {name: a, engine: lokal}\n")
    r = subprocess.run([str(DIASPORA), "exec", "--spec", str(bad), "--task", "t", "--", "sh", "-c", "exit 5"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 125 and f"{bad}:4:" in r.stderr, r.stderr
    r = subprocess.run([str(DIASPORA), "exec", "--optional", "--spec", str(bad), "--task", "t", "--", "sh", "-c", "exit 5"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 5 and "running without the plugin" in r.stderr
    r = subprocess.run([str(DIASPORA), "exec", "--spec", str(bad), "--task", "t", "--heartbeat", "soon", "--", "true"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 125 and "--heartbeat 'soon'" in r.stderr
