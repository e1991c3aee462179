"""The admin console in a real browser: Debian's Chromium driven by npm playwright-core
(tests/console/drive.mjs) against a real relay serving the built console. Sign-in refused
with a bad or an expired token; an event published after the page opened in the live tail
within 1 s; event fields with markup rendered as text; an operator action refused (403) to
a token without control scope and, with one, carried to a real engine (the plugin through
the Python binding) whose acknowledgement appears; a `diaspora run` workflow with a fault
showing its tasks, the anomaly and the migration on the timeline; the page surviving a
relay restart; a site drained and undrained from the Sites page (nothing new starts on it in
between); a training job's evaluations on the Training page; a topic browsed from a time;
screenshots of every page at 1280x800 and 390 px, light and dark; nothing requested from
another origin.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import run_harness as rn
from relay_harness import (BIN, Credentials, RelayProcess, clock_env, event, free_port, https_get, publish_events, request,
                           run, session, wait_until, write_spec)

ROOT = Path(__file__).resolve().parents[2]
DRIVE = ROOT / "tests" / "console" / "drive.mjs"
CHROMIUM = os.environ.get("DIASPORA_CHROMIUM", "/usr/bin/chromium")
CONSOLE = BIN.parent / "console" / "dist"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: scripts/install-deps.sh installs Debian's chromium"
    assert shutil.which("node"), "node is missing: scripts/install-deps.sh installs it"
    assert (CONSOLE / "index.html").exists(), f"{CONSOLE} was not built (console/node_modules: scripts/install-deps.sh)"
    tmp = tmp_path_factory.mktemp("console")
    creds = Credentials(tmp / "creds")
    relay = RelayProcess(creds, tmp / "data", port=free_port(), config={"console_dir": str(CONSOLE)}).start()
    yield creds, relay, tmp
    relay.stop()


def drive(scenario: str, relay, token: str, on_line=None, **args) -> dict:
    """Runs one drive.mjs scenario; its last JSON line. on_line(dict) sees the others."""
    p = subprocess.Popen(["node", str(DRIVE), scenario, json.dumps({"base": f"https://127.0.0.1:{relay.port}",
                                                                    "token": token, **args})],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    last = None
    for line in p.stdout:
        if not line.startswith("{"):
            continue
        msg = json.loads(line)
        if on_line and "ready" in msg:
            on_line(msg)
        last = msg
    p.wait(timeout=120)
    assert last is not None, p.stderr.read()
    assert "error" not in last, f"{last['error']}\n{json.dumps(last)[:3000]}"
    assert last["requests_elsewhere"] == [], last["requests_elsewhere"]  # nothing leaves the relay's origin
    return last


def task_events(wf: str, engine: str = "edge", task: str = "r.0", end: str = "", **end_data) -> list[dict]:
    """Task `task` of workflow `wf` submitted and started on site a; then ended (`end`:
    completed, failed...) with `end_data` when asked."""
    src = f"/diaspora/{wf}/{engine}"
    evs = [
        event(f"{wf}-s0", source=src, type_="org.diaspora.task.submitted", data={"task_id": task, "name": task.split(".")[0]}),
        event(f"{wf}-s1", source=src, type_="org.diaspora.task.started", data={"task_id": task, "site": "a", "attempt": 1}),
    ]
    if end:
        evs.append(event(f"{wf}-s2", source=src, type_=f"org.diaspora.task.{end}",
                         data={"task_id": task, "site": "a", "attempt": 1, **end_data}))
    return evs


def test_sign_in_is_refused_with_a_bad_or_expired_token(env):
    creds, relay, _ = env
    bad = drive("signin", relay, "not.a.token")
    assert "refused this token" in bad["refused"], bad
    expired = drive("signin", relay, creds.forge({"sub": "x", "scope": ["admin"], "exp": int(time.time()) - 3600}))
    assert "refused this token" in expired["refused"] and "expired" in expired["refused"], expired
    good = drive("signin", relay, creds.token("admin"))
    assert good.get("page") == "signed-in" and good["console_errors"] == [], good


def test_an_event_published_after_the_page_opened_is_in_the_live_tail_within_1s(env):
    creds, relay, _ = env
    pub = creds.token("publish:*", "subscribe:*")
    publish_events(relay, pub, "tail.events", [event("first", type_="org.example.first")])
    marker = f"org.example.late{int(time.time())}"
    cmd = [sys.executable, str(ROOT / "tests" / "console" / "publish.py"), relay.url, str(creds.ca), pub, "tail.events",
           json.dumps([event("late", type_=marker)])]
    r = drive("tail", relay, creds.token("admin"), topic="tail.events", publish=cmd, expect=marker)
    assert r["publish_status"] == 0, r["publish_stderr"]
    assert r["seen_after_publish_ms"] < 1000, r


def test_event_fields_with_markup_render_as_text(env):
    creds, relay, _ = env
    pub = creds.token("publish:*", "subscribe:*")
    nasty = '<script>window.__xss=1</script><img src=x onerror="window.__xss=1">'
    publish_events(relay, pub, "xss.events", [event("x1", source="/evil" + nasty.replace(" ", ""), type_="org.example.markup",
                                                    data={"note": nasty})])
    r = drive("detail", relay, creds.token("admin"), topic="xss.events", expect="org.example.markup")
    assert json.loads(r["detail"])["data"]["note"] == nasty and "<script>" in r["cells"], r  # shown as text
    assert r["injected_ran"] is False and r["img_elements"] == 0, r


class Engine:
    """A real engine: the plugin (through the Python binding) reporting a running task and
    acknowledging the actions it receives, as an executor would."""

    def __init__(self, spec: Path):
        sys.path.insert(0, str(ROOT / "engine-adapters" / "python"))
        from diaspora import Plugin
        self.plugin = Plugin.open(spec)
        self.plugin.submitted("r.0", name="r")
        self.plugin.started("r.0", site="a", worker="a/w0", attempt=1)
        self.received = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while not self.stop.is_set():
            a = self.plugin.poll_action()
            if a is None:
                time.sleep(0.05)
                continue
            self.received.append(a)
            a.done(f"restarted {a.task_id} (console test)")

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.plugin.close()


def test_operator_actions_need_control_scope_and_reach_the_engine(env):
    creds, relay, tmp = env
    tok = tmp / "engine-token"
    tok.write_text(creds.token("publish:ops.*", "subscribe:ops.*") + "\n")
    spec = write_spec(tmp, creds, tok, relay.port, name="ops", engine_id="edge")
    engine = Engine(spec)
    try:
        admin = creds.token("admin")
        wait_until(lambda: json.loads(https_get(relay, "/api/v1/views/tasks?workflow=ops", admin))["total"] >= 1, 20,
                   "the engine's task in the views")
        wait_until(lambda: engine.plugin.stats()["control_connected"] == 1, 20, "the engine's control subscription")
        refused = drive("act", relay, creds.token("subscribe:*", subject="viewer"), workflow="ops", task="r.0")
        assert "403" in refused["result"] and "control:ops" in refused["result"], refused
        assert engine.received == []
        done = drive("act", relay, creds.token("subscribe:*", "control:ops", subject="operator"), workflow="ops",
                     task="r.0", wait_outcome="done")
        assert done["result"].startswith("Sent: op-"), done
        assert done["readers_warning"] is None, done  # its engine reads the control topic
        assert done["outcome"] == "done" and "restarted r.0 (console test)" in done["outcome_row"], done
        assert [a.kind for a in engine.received] == ["restart"]
    finally:
        engine.close()


def run_spec(env, name: str, body: str) -> Path:
    """A `diaspora run` spec for workflow `name` on the test's relay (its own token file)."""
    creds, relay, tmp = env
    tok = tmp / f"{name}-token"
    tok.write_text(creds.token(f"publish:{name}.*", f"subscribe:{name}.*") + "\n")
    return rn.write_spec(tmp, f"""version: 1
name: {name}
relay: {{url: "wss://127.0.0.1:{relay.port}", ca_file: "{creds.ca}", token_file: "{tok}"}}
""" + body, name=f"{name}.yaml")


def test_an_action_on_a_finished_task_of_an_ended_run_is_warned_about_before_and_after(env):
    creds, relay, _ = env
    pub = creds.token("publish:*", "subscribe:*")
    stats = {"engine": "edge", **{k: 0 for k in ("events_accepted", "events_acked", "events_spilled", "metrics_coalesced",
                                                  "events_lost", "spool_records", "spool_bytes", "reconnects",
                                                  "invalid_transitions", "actions_received")}, "connected": True}
    publish_events(relay, pub, "fin.events", task_events("fin", end="completed") + [
        event("fin-close", source="/diaspora/fin/edge", type_="org.diaspora.plugin.stats", data={**stats, "closing": True})])
    r = drive("act", relay, creds.token("admin"), workflow="fin", task="r.0")
    assert r["warning"] and "r.0 has completed" in r["warning"], r
    # The run ended (its engine closed its plugin): the page says so and keeps the last state.
    assert r["ended_banner"] and "The run of fin ended at" in r["ended_banner"], r
    assert r["ended_warning"] and "no engine of it reads its control topic now" in r["ended_warning"], r
    assert "but no engine is subscribed to fin.control.edge" in r["result"], r


def test_alarms_name_failed_tasks_and_spent_policy_budgets(env):
    creds, relay, _ = env
    pub = creds.token("publish:*", "subscribe:*")
    src = "/diaspora/bud/edge"
    publish_events(relay, pub, "bud.events", task_events("bud", task="w.0", end="failed", reason="exit code 2") + [
        event("b3", source=src, type_="org.diaspora.action.requested",
              data={"action_id": "bud-a1", "action": "alert", "task_id": "w.0", "site": "a", "policy": "default-retry",
                    "attempt": 0, "reason": "task.failures (1); restart budget spent (max_attempts 3): not acting again"})])
    r = drive("alarms", relay, creds.token("admin"), expect="policy budget spent")
    assert any("bud: 1 failed task instance" in a for a in r["alarms"]), r
    (spent,) = [a for a in r["alarms"] if "1 policy budget spent, nothing more will be done for it" in a]
    assert "bud/w.0 (default-retry)" in spent, r
    # An action to it: no engine reads its control topic (killed, never closed): said before sending.
    r = drive("act", relay, creds.token("admin"), workflow="bud", task="w.0", readers_warning=True)
    assert "no engine is subscribed to bud.control.edge now (none since the relay started)" in r["readers_warning"], r


def test_a_site_its_engine_calls_up_while_everything_there_fails_is_shown_failing(env):
    creds, relay, _ = env
    pub = creds.token("publish:*", "subscribe:*")
    src = "/diaspora/sick/edge"
    # Site a is called up, site b degraded; everything on both fails.
    evs = [event(f"s-{site}", source=src, type_="org.diaspora.resource.status",
                 data={"resource_id": site, "kind": "site", "state": state, "site": site})
           for site, state in (("a", "up"), ("b", "degraded"))]
    for i in range(24):
        site = "ab"[i % 2]
        evs += [event(f"s{i}", source=src, type_="org.diaspora.task.started", data={"task_id": f"t.{i}", "site": site, "attempt": 1}),
                event(f"f{i}", source=src, type_="org.diaspora.task.failed",
                      data={"task_id": f"t.{i}", "site": site, "attempt": 1, "reason": "segfault"})]
    publish_events(relay, pub, "sick.events", evs)
    def sick_sites():
        return {s["site"]: s["state"] for s in json.loads(https_get(relay, "/api/v1/views/sites?workflow=sick",
                                                                    creds.token("admin")))["items"] if s["health"] < 0.3}
    wait_until(lambda: sick_sites() == {"a": "up", "b": "degraded"}, 20, "both sites' health falling")
    r = drive("sites", relay, creds.token("admin"), workflow="sick")
    for site, reported in (("a", "up"), ("b", "degraded")):  # what the engine said, and what the views measure
        (badge,) = [b for b in r["badges"] if b["heading"].startswith(f"sick / {site}") and "health" in b["title"]]
        assert badge["text"] == "failing" and f"reported {reported}" in badge["title"], r["badges"]


def test_a_sites_silence_is_a_gap_in_its_health_line_not_a_held_value(env, tmp_path):
    # A relay of its own, on a wall clock the test steps (libfaketime): two minutes without
    # an event about site a, then events again.
    creds, _, _ = env
    stamp = tmp_path / "faketime"
    stamp.write_text("+0\n")
    relay = RelayProcess(creds, tmp_path / "data", port=free_port(), config={"console_dir": str(CONSOLE)})
    relay.env = clock_env(stamp)
    relay.start()
    pub, admin = creds.token("publish:*", "subscribe:*"), creds.token("admin")

    def history():
        items = json.loads(https_get(relay, "/api/v1/views/sites?workflow=quiet", admin))["items"]
        return [p["t_us"] for p in items[0]["history"]] if items else []
    try:
        publish_events(relay, pub, "quiet.events", task_events("quiet", task="q.0", end="completed"))
        wait_until(lambda: len(history()) >= 1, 20, "the site's first health point")
        stamp.write_text("+2m\n")
        publish_events(relay, pub, "quiet.events", [
            event("quiet-late", source="/diaspora/quiet/edge", type_="org.diaspora.task.started",
                  data={"task_id": "q.1", "site": "a", "attempt": 1})])
        wait_until(lambda: len(history()) >= 2 and history()[-1] - history()[-2] > 100e6, 20, "a point after the silence")
        r = drive("sites", relay, admin, workflow="quiet")
        (chart,) = r["gaps"]
        assert chart["gaps"] == 1 and "no event about the site for over 30 s" in chart["note"], r["gaps"]
        # Events every few seconds are no silence: a point each 10 s at most apart, no gap.
        assert all(g["gaps"] == 0 for g in drive("sites", env[1], admin, workflow="sick")["gaps"])
    finally:
        relay.stop_cleanly()


def test_an_admin_resets_a_consumer_group_from_the_consumers_page(env):
    creds, relay, _ = env
    pub = creds.token("publish:*", "subscribe:*")
    publish_events(relay, pub, "cg.events", [event(f"c{i}") for i in range(8)])

    async def commit():
        ws = await session(relay, pub)
        await request(ws, {"op": "commit", "group": "readers", "topic": "cg.events", "offset": 8})
    run(commit())
    r = drive("reset", relay, creds.token("admin"), group="readers", topic="cg.events", offset=3)
    assert r["result"] == "readers now reads cg.events from offset 3 (was 8)", r
    groups = json.loads(https_get(relay, "/api/v1/topics/cg.events", creds.token("admin")))["groups"]
    assert groups == [{"group": "readers", "offset": 3, "lag": 5}], groups


def test_connections_the_relay_said_congested_are_listed_with_their_waits(env):
    """The relay's congestion events (resource.status, kind link, on relay.events:
    docs/streaming.md) as the Consumers page shows them: state, the longest wait and what is
    queued per class, the bulk pace."""
    creds, relay, _ = env
    link = "connection/site-b@10.0.0.2:5555"
    publish_events(relay, creds.token("publish:*"), "relay.events", [{
        **event("cong-1", source="/diaspora-relay/127.0.0.1:7443", type_="org.diaspora.resource.status", data={
            "resource_id": link, "kind": "link", "state": "degraded",
            "metrics": {"wait_max_s_control": 0.002, "wait_max_s_lifecycle": 1.5, "wait_max_s_telemetry": 2.25,
                        "wait_max_s_bulk": 9.0, "queue_frames_control": 0, "queue_frames_lifecycle": 3,
                        "queue_frames_telemetry": 32, "queue_frames_bulk": 32, "paused": 1, "bulk_rate": 11600000}})}])
    r = drive("links", relay, creds.token("admin"), expect=link)
    row = next(x for x in r["rows"] if x[0] == link)
    assert row[1] == "degraded (paused)", row
    assert row[2:6] == ["2 ms (0)", "1,500 ms (3)", "2,250 ms (32)", "9,000 ms (32)"], row
    assert row[6] == "11.6 MB/s", row


def test_a_task_opens_in_a_panel_with_its_attempts_incident_and_events(env):
    creds, relay, _ = env
    pub = creds.token("publish:*", "subscribe:*")
    src = "/diaspora/det/edge"

    def e(i, kind, **data):
        return {**event(f"d{i}", source=src, type_=f"org.diaspora.{kind}", data={"task_id": "r.0", **data}), "subject": "r.0"}
    publish_events(relay, pub, "det.events", [
        e(0, "task.submitted", name="r"),
        e(1, "task.started", site="a", worker="a/w0", attempt=1),
        e(2, "task.failed", site="a", attempt=1, reason="worker a/w0 died (killed by signal 9)", retryable=True),
        e(3, "action.requested", action_id="A1", action="restart", reason="default-revive: the attempt was lost",
          policy="default-revive"),
        e(4, "action.done", action_id="A1", action="restart", status="done", message="restarted on b"),
        e(5, "task.started", site="b", worker="b/w0", attempt=2),
        e(6, "task.completed", site="b", attempt=2)])
    r = drive("task", relay, creds.token("admin"), workflow="det", task="r.0")
    for seen in (r["from_list"], r["from_url"]):
        rows = [(a[0], a[1], a[5], a[6]) for a in seen["attempts"]]
        assert rows == [("1", "a", "failed", "worker a/w0 died (killed by signal 9)"), ("2", "b", "completed", "")], seen
        assert len(seen["incident"]) == 1 and "restart by policy default-revive: done (restarted on b)" in seen["incident"][0], seen
        assert "subject=r.0" in seen["events_link"] and "topic=det.events" in seen["events_link"], seen
    assert r["from_list"]["focused"], r
    assert "task=r.0" in r["url"], r["url"]
    assert r["events_offsets"] == list(range(7)), r  # every event of the task, from the start


def test_a_run_with_a_fault_shows_its_tasks_anomaly_and_migration_on_the_timeline(env):
    creds, relay, tmp = env
    spec = run_spec(env, "mig", f"""sites:
  - {{name: a, engine: local, workers: 1}}
  - {{name: b, engine: local, workers: 1}}
tasks:
  - {{name: burn, kind: cpu-burn, args: {{seconds: 10, step: 0.1}}, count: 1, preferred_sites: [a]}}
{rn.MOVE_OFF}
faults:
  - {{at: 4s, kind: slow-site, site: a, factor: 8, for: 30s}}
""")
    p = rn.run(spec, tmp / "mig-out", timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    r = drive("timeline", relay, creds.token("admin"), workflow="mig")
    assert r["lanes"] == ["a", "b"], r
    assert len(r["ticks"]) == 5 and "(+" in r["ticks"][-1], r["ticks"]  # a time axis under the lanes
    assert any(f.startswith("fault slow_site_factor on a: degraded (8") for f in r["faults"]), r["faults"]  # the injected fault
    # A migration stops the running attempt and reports it failed (retryable), the next
    # attempt queued by the action (runner/src/actions.cpp): never "cancelled".
    assert any("burn.0 attempt 1: failed" in b for b in r["bars"]), r["bars"]
    assert any("burn.0 attempt 2: completed" in b for b in r["bars"]), r["bars"]
    assert r["anomalies"], r  # the step-time prediction that moved it
    assert any(t.startswith("migrate burn.0 (policy)") for t in r["actions"]), r["actions"]
    # The incident: burn.0's evidence (the step time the policy saw), its migration, how it ended.
    assert [i["id"] for i in r["incidents"]] == ["burn.0"], r["incidents"]
    evidence, decisions, outcome = r["incidents"][0]["cells"][1:]
    assert "task.step_time of task burn.0" in evidence, evidence
    assert "migrate → b" in decisions and "done" in decisions, decisions
    assert outcome == "completed on b", outcome


def test_the_page_survives_a_relay_restart(env):
    creds, relay, tmp = env
    pub = creds.token("publish:*", "subscribe:*")
    publish_events(relay, pub, "rs.events", task_events("rs"))

    def restart(_):
        relay.stop()
        time.sleep(1.0)
        relay.start()
        publish_events(relay, pub, "rs.events", [event("s9", source="/diaspora/rs/edge", type_="org.diaspora.task.submitted",
                                                       data={"task_id": "r.9", "name": "r"})])

    r = drive("reconnect", relay, creds.token("admin"), on_line=restart, workflow="rs", expect="r.9")
    assert r["before"] == ["r.0"] and r["after"] == ["r.0", "r.9"], r
    # While the relay was away the page said so and kept the last state it saw.
    assert r["banner"] and "The relay cannot be reached since" in r["banner"], r
    assert r["during"] == ["r.0"] and not r["banner_after"], r


def test_a_site_drained_in_the_page_starts_nothing_new_until_undrained(env):
    creds, relay, tmp = env
    spec = run_spec(env, "dr", """sites:
  - {name: a, engine: local, workers: 1}
  - {name: b, engine: local, workers: 1}
tasks:
  - {name: nap, kind: sleep, args: {seconds: 0.5}, rate: 4, duration: 16s}
""")
    out = tmp / "dr-out"
    p = subprocess.Popen([str(rn.DIASPORA), "run", str(spec), "--out", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        admin = creds.token("admin")
        sites = lambda: json.loads(https_get(relay, "/api/v1/views/sites?workflow=dr", admin))["items"]  # noqa: E731
        wait_until(lambda: any(s["site"] == "a" and s["started"] > 0 for s in sites()), 60, "an attempt on site a")
        op = creds.token("subscribe:dr.*", "control:dr", subject="operator")
        r = drive("drain", relay, op, site="a")
        assert r["result"].startswith("Sent: op-") and r["drained"], r
        time.sleep(3)
        r = drive("drain", relay, op, site="a", undrain=True)
        assert r["result"].startswith("Sent: op-") and not r["drained"], r
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0
    rn.assert_no_sanitizer_report(out, err)
    rep = rn.report(out)
    (drain,), (undrain,) = rn.actions(rep, "drain"), rn.actions(rep, "undrain")
    assert drain["outcome"] == "done" and "drained: nothing new starts there" in drain["message"], drain
    starts = [(a["start_s"], a["site"]) for i in rep["instances"] for a in i["attempts"] if a.get("start_s", -1) >= 0]
    during = [s for t, s in starts if drain["received_s"] < t < undrain["received_s"]]
    assert during and set(during) == {"b"}, starts  # four a second wanted, site a idle all the same
    assert "a" in [s for t, s in starts if t > undrain["received_s"] + 0.5], starts


def test_training_page_shows_a_jobs_evaluations(env):
    creds, relay, _ = env
    pub = creds.token("publish:*", "subscribe:*")
    src = "/diaspora/tr/edge"
    evs = [event("t0", source=src, type_="org.diaspora.task.submitted", data={"task_id": "learn.0", "name": "learn"}),
           event("t1", source=src, type_="org.diaspora.task.started", data={"task_id": "learn.0", "site": "edge"})]
    for k in range(3):
        evs.append(event(f"h{k}", source=src, type_="org.diaspora.task.progress",
                         data={"task_id": "learn.0", "progress": (k + 1) / 3, "step": 10 * k,
                               "metrics": {"loss": 1.0 / (k + 1), "buffer_fill": 20.0 * k}}))
        m = {"eval_after_task": k, "average_accuracy": 0.9}
        m.update({f"accuracy.t{j}": 0.9 - 0.01 * (k - j) for j in range(k + 1)})
        evs.append(event(f"v{k}", source=src, type_="org.diaspora.task.heartbeat", data={"task_id": "learn.0", "metrics": m}))
    publish_events(relay, pub, "tr.events", evs)
    r = drive("evals", relay, creds.token("admin"))
    assert r["headers"] == ["After task", "accuracy.t0", "accuracy.t1", "accuracy.t2", "average_accuracy"], r
    assert [row[0] for row in r["rows"]] == ["0", "1", "2"] and r["rows"][2][1] == "0.88" and r["rows"][0][2] == "", r


def test_topics_are_browsed_from_a_time(env):
    creds, relay, _ = env
    pub = creds.token("publish:*", "subscribe:*")
    publish_events(relay, pub, "bt.events", [event(f"early{i}", type_="org.example.early") for i in range(3)])
    cut = int(time.time()) + 1  # the page's time field has whole seconds
    time.sleep(cut - time.time() + 0.3)
    publish_events(relay, pub, "bt.events", [event(f"late{i}", type_="org.example.late") for i in range(2)])
    r = drive("from_time", relay, creds.token("admin"), topic="bt.events", time_ms=cut * 1000, expect="org.example.late")
    assert sorted(r["offsets"]) == [3, 4], r


def test_a_topic_is_browsed_from_its_start_searched_over_all_of_it_and_exported(env):
    """From the start shows offset 0 first; a search by id finds an event beyond the first
    500 (the relay scans the whole topic); the search lives in the URL across a reload; the
    selection downloads as CSV; the detail opens in sight."""
    creds, relay, _ = env
    pub = creds.token("publish:*", "subscribe:*")
    publish_events(relay, pub, "br.events", [event(f"b{i}", type_="org.example.b") for i in range(1200)])
    r = drive("browse", relay, creds.token("admin"), topic="br.events", id="b1000", republish_to="br.again")
    assert r["start_offsets"] == list(range(100)) and "Scanned offsets 0–99 (100 records): 100 found" in r["start_status"], r
    assert r["newer_first"] == 100, r
    assert r["search_offsets"] == [1000] and "1 found" in r["search_status"], r
    assert "id=b1000" in r["url"] and "topic=br.events" in r["url"], r["url"]
    assert r["reload_offsets"] == [1000], r
    lines = r["download_text"].splitlines()
    assert r["download_name"].startswith("br.events-") and r["download_name"].endswith(".csv"), r["download_name"]
    assert lines[0].startswith("offset,appended,time,id") and lines[1].startswith("1000,") and len(lines) == 2, lines
    assert r["detail_in_view"], r
    assert r["refused"] == [], r["refused"]
    # The event opened, published again from its detail under a new id.
    assert r["republish"].startswith("Published again as ") and "offset 0 of br.again" in r["republish"], r
    copy = json.loads(https_get(relay, "/api/v1/topics/br.again/events?from=0", creds.token("admin")))["events"][0]["event"]
    assert copy["originalid"] == "b1000" and copy["republishedfrom"] == "br.events/1000", copy


def test_a_workflow_token_sees_its_own_topics_and_nothing_it_was_refused_is_asked_again(env):
    creds, relay, _ = env
    pub = creds.token("publish:*", "subscribe:*")
    publish_events(relay, pub, "mine.events", [event("m0")])
    publish_events(relay, pub, "theirs.events", [event("t0")])
    r = drive("browse", relay, creds.token("subscribe:mine.*", "control:mine", subject="mine-run"))
    assert "mine.events" in r["topics"] and "theirs.events" not in r["topics"], r["topics"]
    assert r["refused"] == [], r["refused"]


def test_screenshots_of_every_page_at_both_sizes_and_keyboard_reach(env):
    creds, relay, tmp = env
    shots = Path(os.environ.get("DIASPORA_CONSOLE_SHOTS", tmp / "shots"))
    shots.mkdir(parents=True, exist_ok=True)
    r = drive("shots", relay, creds.token("admin", subject="operator"), dir=str(shots), workflow="mig")
    names = sorted(p.name for p in shots.glob("*.png"))
    assert len(names) == 9 * 2 * 2, names  # 7 pages, a browse and a task's detail; 2 sizes, 2 themes
    assert all((shots / n).stat().st_size > 5000 for n in names)
    assert r["console_errors"] == [], r["console_errors"]
    assert {"Overview", "Topics", "Workflows & tasks", "Sites", "Actions"} <= set(r["tab_stops"]), r["tab_stops"]
