"""The relay's views over HTTPS (/api/v1/views/...), against a real diaspora-relay: built from
the events topics it stores, filtered and paged, limited to what the token may subscribe
to, and the same after a graceful restart and after SIGKILL (snapshot + the log)."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import jsonschema
import pytest

from relay_harness import (Credentials, RelayProcess, clock_env, event, https_get, https_post, https_status, publish_events,
                           relay_events, request, run, session, wait_until)

VIEWS = ("workflows", "tasks", "sites", "resources", "actions", "consumers")
SCHEMA = jsonschema.Draft202012Validator(json.loads((Path(__file__).parents[2] / "schemas" / "views.schema.json").read_text()))


@pytest.fixture
def creds(tmp_path):
    return Credentials(tmp_path / "creds")


def ev(n: int, type_: str, **data) -> dict:
    return event(f"e{n}", source="/engine", type_=f"org.diaspora.{type_}", data=data)


def workflow_events(base: int) -> list[dict]:
    return [
        ev(base + 0, "task.submitted", task_id="r.0", name="r", attempt=1),
        ev(base + 1, "task.submitted", task_id="r.1", name="r", attempt=1),
        ev(base + 2, "task.started", task_id="r.0", site="a", worker="a/w0", attempt=1),
        ev(base + 3, "task.started", task_id="r.1", site="b", worker="b/w0", attempt=1),
        ev(base + 4, "task.failed", task_id="r.1", site="b", attempt=1, reason="worker died <img src=x onerror=alert(1)>"),
        ev(base + 5, "anomaly.predicted", series="task.step_time", score=0.8, detector="ewma", task_id="r.1", site="b",
           explanation="slow"),
        ev(base + 6, "action.requested", action_id="a1", action="restart", reason="failed", task_id="r.1"),
        ev(base + 7, "task.started", task_id="r.1", site="a", worker="a/w1", attempt=2),
        ev(base + 8, "action.done", action_id="a1", status="done", message="attempt 2 running"),
        ev(base + 9, "task.completed", task_id="r.0", site="a", attempt=1),
        ev(base + 10, "resource.status", resource_id="b", kind="site", state="degraded", site="b"),
    ]


def get(relay, view: str, token: str, query: str = "") -> dict:
    return json.loads(https_get(relay, f"/api/v1/views/{view}{query}", token))


def answers(relay, token: str) -> dict:
    """Every view's first page, each checked against schemas/views.schema.json."""
    out = {v: get(relay, v, token) for v in VIEWS}
    for page in out.values():
        SCHEMA.validate(page)
    return out


def test_views_answer_filter_page_and_survive_restarts_and_sigkill(tmp_path, creds):
    relay = RelayProcess(creds, tmp_path / "data").start()
    admin = creds.token("admin")
    pub = creds.token("publish:*", "subscribe:*")
    try:
        publish_events(relay, pub, "beam.events", workflow_events(0))
        publish_events(relay, pub, "beam.control.engine",
                       [ev(100, "action.requested", action_id="op1", action="cancel", reason="operator", task_id="r.1")])
        publish_events(relay, pub, "other.events", [ev(200, "task.submitted", task_id="x.0", name="x")])
        publish_events(relay, pub, "not-views", [ev(300, "task.submitted", task_id="y.0")])
        wait_until(lambda: get(relay, "workflows", admin)["total"] == 2 and
                   get(relay, "workflows", admin, "?workflow=beam")["items"][0]["events"] == 12, 20, "the views")

        tasks = get(relay, "tasks", admin, "?workflow=beam")
        assert tasks["total"] == 2
        r0, r1 = tasks["items"]
        assert (r0["task_id"], r0["state"], r0["site"]) == ("r.0", "completed", "a")
        assert (r1["state"], r1["attempt"], r1["site"], r1["anomaly_score"]) == ("running", 2, "a", 0.8)
        assert [(a["site"], a["outcome"]) for a in r1["attempts"]] == [("b", "failed"), ("a", "running")]
        assert r1["attempts"][0]["reason"] == "worker died <img src=x onerror=alert(1)>"  # data, kept as text
        sites = {s["site"]: s for s in get(relay, "sites", admin, "?workflow=beam")["items"]}
        assert sites["b"]["failed"] == 1 and sites["b"]["state"] == "degraded" and sites["b"]["health"] < 0.5
        assert sites["a"]["completed"] == 1 and sites["a"]["running"] == 1
        actions = {a["action_id"]: a for a in get(relay, "actions", admin)["items"]}
        assert actions["a1"]["status"] == "done" and actions["a1"]["origin"] == "policy"
        assert actions["op1"]["status"] == "pending" and actions["op1"]["origin"] == "operator"
        assert get(relay, "tasks", admin, "?state=pending")["total"] == 1  # x.0 of "other"
        page = get(relay, "tasks", admin, "?limit=2")
        assert len(page["items"]) == 2 and page["next"]
        rest = get(relay, "tasks", admin, "?limit=2&after=" + urllib.parse.quote(page["next"]))
        assert [t["task_id"] for t in rest["items"]] == ["x.0"] and rest["next"] is None

        # A token sees the workflows whose events it may subscribe to; none is refused.
        beam_only = creds.token("subscribe:beam.*")
        assert [w["workflow"] for w in get(relay, "workflows", beam_only)["items"]] == ["beam"]
        assert get(relay, "tasks", creds.token("subscribe:elsewhere.*"))["total"] == 0
        assert https_status(relay, "/api/v1/views/tasks") == 401
        expired = creds.forge({"sub": "x", "scope": ["admin"], "exp": int(time.time()) - 3600})
        assert https_status(relay, "/api/v1/views/tasks", expired) == 401
        with pytest.raises(urllib.error.HTTPError) as bad:
            https_get(relay, "/api/v1/views/tasks?limit=5000", admin)
        assert bad.value.code == 400 and "limit must be a whole number from 1 to 1000" in bad.value.read().decode()
        assert https_status(relay, "/api/v1/views/nope", admin) == 404

        # Consumer groups and their lag, from the log's committed offsets.
        async def commit():
            ws = await session(relay, pub)
            r = await request(ws, {"op": "commit", "group": "console", "topic": "beam.events", "offset": 4})
            assert r["op"] == "committed", r
        run(commit())
        (grp,) = get(relay, "consumers", admin)["items"]
        assert (grp["group"], grp["topic"], grp["offset"], grp["end"], grp["lag"]) == ("console", "beam.events", 4, 11, 7)
        assert get(relay, "consumers", beam_only, "?workflow=other")["total"] == 0

        # Graceful restart: the snapshot. SIGKILL after more events: snapshot + the log.
        before = answers(relay, admin)
        relay.stop()
        relay.start()
        assert answers(relay, admin) == before
        publish_events(relay, pub, "beam.events", [ev(400, "task.completed", task_id="r.1", site="a", attempt=2)])
        wait_until(lambda: get(relay, "tasks", admin, "?state=completed")["total"] == 2, 20, "the completion")
        before = answers(relay, admin)
        relay.kill()
        relay.start()
        wait_until(lambda: get(relay, "workflows", admin, "?workflow=beam")["items"][0]["events"] == 13, 20,
                   "the views after SIGKILL")
        after = answers(relay, admin)
        for v in VIEWS:  # the change counter restarts from the snapshot's; the answers do not
            before[v].pop("version")
            after[v].pop("version")
        assert after == before
    finally:
        relay.stop()


def test_a_relay_without_views_says_so(tmp_path, creds):
    relay = RelayProcess(creds, tmp_path / "data", config={"views": False}).start()
    try:
        with pytest.raises(urllib.error.HTTPError) as off:
            https_get(relay, "/api/v1/views/tasks", creds.token("admin"))
        assert off.value.code == 404 and "views: false" in off.value.read().decode()
        assert not (tmp_path / "data" / "views").exists()
    finally:
        relay.stop()


def test_live_changes_stream_as_server_sent_events(tmp_path, creds):
    relay = RelayProcess(creds, tmp_path / "data").start()
    pub = creds.token("publish:*", "subscribe:*")
    try:
        assert https_status(relay, "/api/v1/views/stream") == 401
        conn = http.client.HTTPSConnection("127.0.0.1", relay.port, context=creds.client_ssl(), timeout=10)
        conn.request("GET", "/api/v1/views/stream", headers={"Authorization": f"Bearer {creds.token('subscribe:beam.*')}"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"

        def changes(until, deadline):
            """The change events read until `until(data)` holds (or the deadline)."""
            seen, event = [], None
            while time.monotonic() < deadline:
                line = resp.fp.readline().decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event == "change":
                    seen.append(json.loads(line[6:]))
                    if until(seen[-1]):
                        return seen
            raise AssertionError(f"no such change within the time; saw {seen}")

        publish_events(relay, pub, "other.events", [ev(1, "task.submitted", task_id="hidden.0")])
        publish_events(relay, pub, "beam.events", [ev(2, "task.submitted", task_id="live.0", name="live")])
        acked = time.monotonic()  # the publish returned: the relay acknowledged (stored) the event
        seen = changes(lambda d: d["view"] == "tasks" and d["id"] == "live.0", acked + 5)
        assert time.monotonic() - acked < 1.0, "a change reached the stream more than 1 s after its publish was acked"
        assert all(d["workflow"] == "beam" for d in seen), seen  # other's changes are not for this token
        # The item changed is what the API answers for it.
        page = get(relay, "tasks", creds.token("admin"), "?workflow=beam&q=live.0")
        assert page["items"][0]["state"] == "pending" and page["version"] >= seen[-1]["version"]
        conn.close()
    finally:
        relay.stop()


def _sse(relay, token, path="/api/v1/views/stream", headers=None):
    """An open server-sent-event stream and a reader of its next (event, data) pairs."""
    conn = http.client.HTTPSConnection("127.0.0.1", relay.port, context=relay.creds.client_ssl(), timeout=10)
    conn.request("GET", path, headers={"Authorization": f"Bearer {token}", **(headers or {})})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()

    def next_events(n: int, deadline_s: float = 10):
        out, event, end = [], None, time.monotonic() + deadline_s
        while len(out) < n and time.monotonic() < end:
            line = resp.fp.readline().decode()
            if not line:
                break  # the stream ended
            line = line.rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event:
                out.append((event, json.loads(line[6:])))
                event = None
        return out
    return conn, next_events


def test_live_changes_resume_from_a_version_reset_when_too_old_and_end_at_expiry(tmp_path, creds):
    # docs/console.md, "Live changes": since= and Last-Event-ID resume after a version;
    # a version older than the 65,536 changes kept gets `event: reset` first; the stream
    # ends with `event: expired` when its token expires.
    relay = RelayProcess(creds, tmp_path / "data").start()
    pub, admin = creds.token("publish:*", "subscribe:*"), creds.token("admin")
    try:
        publish_events(relay, pub, "beam.events", [ev(k, "task.submitted", task_id=f"t.{k}", name="t") for k in range(5)])
        wait_until(lambda: get(relay, "tasks", admin, "?workflow=beam")["total"] == 5, 10, "the views to apply 5 events")
        version = get(relay, "tasks", admin, "?workflow=beam")["version"]
        # From version 0: the five changes already made come at once, in order, no reset.
        conn, read = _sse(relay, admin, "/api/v1/views/stream?since=0")
        got = read(5)
        conn.close()
        assert [e for e, _ in got] == ["change"] * 5 and [d["id"] for _, d in got] == [f"t.{k}" for k in range(5)], got
        # Last-Event-ID (what EventSource sends on reconnecting): only what came after it.
        after = got[2][1]["version"]
        conn, read = _sse(relay, admin, headers={"Last-Event-ID": str(after)})
        got = read(2)
        conn.close()
        assert [d["id"] for _, d in got] == ["t.3", "t.4"] and all(d["version"] > after for _, d in got), got
        assert got[-1][1]["version"] <= version
        # Without since: from now on only.
        conn, read = _sse(relay, admin)
        publish_events(relay, pub, "beam.events", [ev(5, "task.submitted", task_id="t.5", name="t")])
        got = read(1)
        conn.close()
        assert [d["id"] for _, d in got] == ["t.5"], got
        # More changes than are kept: a client that asks from version 1 is told to reload.
        for b in range(7):
            publish_events(relay, pub, "bulk.events", [ev(1000 + b * 10_000 + k, "task.submitted", task_id=f"b.{b}.{k}")
                                                       for k in range(10_000)])
        wait_until(lambda: get(relay, "tasks", admin, "?workflow=bulk")["total"] == 70_000, 60, "70,000 tasks")
        conn, read = _sse(relay, admin, "/api/v1/views/stream?since=1")
        got = read(2)
        conn.close()
        assert got[0][0] == "reset" and got[1][0] == "change", got[:2]
        # A token that expires: the stream ends with `event: expired`.
        short = creds.token("subscribe:beam.*", ttl="2s")
        conn, read = _sse(relay, short)
        t0 = time.monotonic()
        got = read(1, deadline_s=40)
        conn.close()
        assert got and got[0][0] == "expired", got
        assert time.monotonic() - t0 < 35, time.monotonic() - t0
        bad = https_status(relay, "/api/v1/views/stream?since=yesterday", admin)
        assert bad == 400
    finally:
        relay.stop_cleanly()


def test_operator_actions_go_to_the_engines_control_topic_with_scopes_checked(tmp_path, creds):
    relay = RelayProcess(creds, tmp_path / "data").start()
    pub = creds.token("publish:*", "subscribe:*")
    admin = creds.token("admin")
    try:
        # The task's engine is known from its events' source.
        publish_events(relay, pub, "beam.events", [
            {**ev(1, "task.submitted", task_id="r.0", name="r"), "source": "/diaspora/beam/edge"},
            {**ev(2, "task.started", task_id="r.0", site="a"), "source": "/diaspora/beam/edge"}])
        wait_until(lambda: get(relay, "tasks", admin)["total"] == 1, 20, "the views")
        assert get(relay, "tasks", admin)["items"][0]["engine"] == "edge"
        act = {"workflow": "beam", "action": "restart", "task_id": "r.0", "reason": "operator: <b>stuck</b>"}
        # Refused by the relay, not only hidden by a page: no token, an expired one, one
        # without admin or control:beam (403 names the scope), bad bodies (400 names the field).
        assert https_post(relay, "/api/v1/actions", act, None)[0] == 401
        expired = creds.forge({"sub": "x", "scope": ["admin"], "exp": int(time.time()) - 3600})
        assert https_post(relay, "/api/v1/actions", act, expired)[0] == 401
        status, body = https_post(relay, "/api/v1/actions", act, creds.token("subscribe:*", "publish:beam.*", subject="viewer"))
        assert status == 403 and "control:beam" in body["message"] and "viewer" in body["message"], body
        assert https_post(relay, "/api/v1/actions", act, creds.token("control:other*"))[0] == 403
        for bad, field in (({**act, "action": "explode"}, "'action'"), ({**act, "reason": ""}, "'reason'"),
                           ({k: v for k, v in act.items() if k != "reason"}, "'reason' is required"),
                           ({**act, "colour": "red"}, "unknown field 'colour'"),
                           ({**act, "action": "migrate"}, "target_site"), (b"{not json", "JSON object")):
            status, body = https_post(relay, "/api/v1/actions", bad, admin)
            assert status == 400 and field in body["message"], (bad, body)
        status, body = https_post(relay, "/api/v1/actions", {**act, "task_id": "ghost"}, admin)
        assert status == 404 and "no engine is known for task 'ghost'" in body["message"]
        # Accepted with control:beam: durable on beam.control.edge, naming who asked.
        status, body = https_post(relay, "/api/v1/actions", act, creds.token("control:beam", subject="alice@site"))
        assert status == 202 and body["topic"] == "beam.control.edge" and body["action_id"].startswith("op-"), body
        (stored,) = relay_events(relay, pub, 1, topic="beam.control.edge", counted=lambda e: True)
        assert stored["type"] == "org.diaspora.action.requested" and stored["source"] == "/diaspora/console/alice_site"
        assert stored["data"] == {"action_id": body["action_id"], "action": "restart", "reason": "operator: <b>stuck</b>",
                                  "task_id": "r.0"}
        wait_until(lambda: get(relay, "actions", admin)["total"] == 1, 20, "the action in the views")
        (a,) = get(relay, "actions", admin)["items"]
        assert (a["origin"], a["status"], a["task_id"]) == ("operator", "pending", "r.0")
        # A site's drain goes to the engine that reports tasks on it; its done marks the site.
        drain = {"workflow": "beam", "action": "drain", "reason": "maintenance"}
        status, body = https_post(relay, "/api/v1/actions", drain, admin)
        assert status == 400 and "a drain needs 'site'" in body["message"], body
        status, body = https_post(relay, "/api/v1/actions", {**drain, "site": "nowhere"}, admin)
        assert status == 404 and "no engine is known for site 'nowhere'" in body["message"], body
        status, body = https_post(relay, "/api/v1/actions", {**drain, "site": "a"}, admin)
        assert status == 202 and body["topic"] == "beam.control.edge", body
        publish_events(relay, pub, "beam.events", [{**ev(3, "action.done", action_id=body["action_id"], status="done",
                                                         action="drain", message="site 'a' drained"),
                                                    "source": "/diaspora/beam/edge"}])
        wait_until(lambda: get(relay, "sites", admin)["items"][0]["drained"], 20, "the drained site in the views")
        (site,) = get(relay, "sites", admin)["items"]
        assert site["engine"] == "edge" and SCHEMA.is_valid(get(relay, "sites", admin)), site
    finally:
        relay.stop()


def test_an_action_nobody_reads_is_said_so_when_sent_and_shown_expired_after_a_minute(tmp_path, creds):
    """POST /api/v1/actions says how many read the engine's control topic, and warns when
    none does (the run ended); the actions view shows an action unanswered for 60 s (on
    the relay's clock, stepped here with libfaketime) as expired with the likely reason,
    and an answer that comes later still counts."""
    stamp = tmp_path / "faketime"
    stamp.write_text("+0\n")
    relay = RelayProcess(creds, tmp_path / "data")
    relay.env = clock_env(stamp)
    relay.start()
    pub, admin = creds.token("publish:*", "subscribe:*"), creds.token("admin")
    try:
        publish_events(relay, pub, "gone.events", [{**ev(1, "task.submitted", task_id="r.0", name="r"),
                                                   "source": "/diaspora/gone/edge"}])
        wait_until(lambda: get(relay, "tasks", admin)["total"] == 1, 20, "the views")
        act = {"workflow": "gone", "action": "restart", "task_id": "r.0", "reason": "late"}
        # Asked before sending (dry_run): checked like the real one, answered, nothing appended.
        status, dry = https_post(relay, "/api/v1/actions", {**act, "dry_run": True}, admin)
        assert status == 200 and dry["dry_run"] is True and dry["subscribers"] == 0 and "action_id" not in dry, dry
        assert "no engine is subscribed to gone.control.edge now (none since the relay started)" in dry["warning"], dry
        assert https_post(relay, "/api/v1/actions", {**act, "dry_run": "yes"}, admin)[0] == 400
        assert https_post(relay, "/api/v1/actions", {**act, "dry_run": True}, creds.token("subscribe:*"))[0] == 403
        status, body = https_post(relay, "/api/v1/actions", act, admin)
        assert status == 202 and body["subscribers"] == 0, body
        assert "no engine is subscribed to gone.control.edge" in body["warning"], body

        async def with_engine():  # an engine reading its control topic: no warning
            ws = await session(relay, pub)
            await request(ws, {"op": "subscribe", "id": "c", "topic": "gone.control.edge", "from": "latest"})
            return https_post(relay, "/api/v1/actions", {**act, "reason": "read"}, admin)
        status, read = run(with_engine())
        assert status == 202 and read["subscribers"] == 1 and "warning" not in read, read
        # The engine gone: when its subscription ended is said.
        wait_until(lambda: https_post(relay, "/api/v1/actions", {**act, "dry_run": True}, admin)[1]["subscribers"] == 0,
                   20, "the engine's subscription closed")
        dry = https_post(relay, "/api/v1/actions", {**act, "dry_run": True}, admin)[1]
        assert "now (the last subscription ended at 20" in dry["warning"] and dry["last_subscribed_us"] > 0, dry

        # A policy's alerts (published for people, answered by no engine): raised, never
        # expired; the one saying its budget is spent (attempt 0) is marked and found so.
        publish_events(relay, pub, "gone.events", [
            {**ev(3, "action.requested", action_id="al.1", action="alert", task_id="r.0", policy="slow",
                  reason="step time high; cannot migrate: no other site; attempt 2 of 3", attempt=2),
             "source": "/diaspora/gone/edge"},
            {**ev(4, "action.requested", action_id="al.2", action="alert", task_id="r.0", policy="slow",
                  reason="step time high; migrate budget spent (max_attempts 3): not acting again", attempt=0),
             "source": "/diaspora/gone/edge"}])
        wait_until(lambda: get(relay, "actions", admin)["total"] == 4, 20, "the actions in the views")
        assert {a["action_id"]: a["status"] for a in get(relay, "actions", admin)["items"]} == {
            body["action_id"]: "pending", read["action_id"]: "pending", "al.1": "raised", "al.2": "raised"}
        spent = get(relay, "actions", admin, "?budget_spent=true")
        assert [(a["action_id"], a["attempt"], a["policy"]) for a in spent["items"]] == [("al.2", 0, "slow")], spent
        assert SCHEMA.is_valid(spent), list(SCHEMA.iter_errors(spent))[:2]
        stamp.write_text("+2m\n")  # the relay's wall clock two minutes on
        items = {a["action_id"]: a for a in get(relay, "actions", admin)["items"]}
        assert items[body["action_id"]]["status"] == "expired", items
        assert "no engine answered it within 60 s" in items[body["action_id"]]["message"], items
        assert items["al.1"]["status"] == items["al.2"]["status"] == "raised", items
        assert [a["action_id"] for a in get(relay, "actions", admin, "?status=expired")["items"]] == sorted(
            [body["action_id"], read["action_id"]]), items
        publish_events(relay, pub, "gone.events", [{**ev(2, "action.done", action_id=read["action_id"], status="done",
                                                         action="restart", message="restarted"),
                                                    "source": "/diaspora/gone/edge"}])
        wait_until(lambda: {a["action_id"]: a["status"] for a in get(relay, "actions", admin)["items"]}
                   == {body["action_id"]: "expired", read["action_id"]: "done", "al.1": "raised", "al.2": "raised"},
                   20, "the late answer")
    finally:
        relay.stop_cleanly()


def test_a_task_whose_restart_or_migration_is_under_way_is_recovering_not_failed(tmp_path, creds):
    relay = RelayProcess(creds, tmp_path / "data").start()
    pub, admin = creds.token("publish:*", "subscribe:*"), creds.token("admin")

    def state(task):
        return {t["task_id"]: t["state"] for t in get(relay, "tasks", admin)["items"]}.get(task)

    def send(n, kind, **data):
        publish_events(relay, pub, "rec.events", [ev(n, kind, **data)])

    try:
        # A migration: the attempt stopped (failed, retryable), the move reported, then the
        # new attempt (diaspora run's order).
        send(1, "task.submitted", task_id="m.0", name="m")
        send(2, "task.started", task_id="m.0", site="a", attempt=1)
        send(3, "task.failed", task_id="m.0", site="a", attempt=1, reason="migrated off a", retryable=True)
        wait_until(lambda: state("m.0") == "failed", 20, "the failure")
        send(4, "task.migrated", task_id="m.0", from_site="a", to_site="b", reason="slow site")
        wait_until(lambda: state("m.0") == "recovering", 20, "recovering after the move")
        assert SCHEMA.is_valid(get(relay, "tasks", admin)), list(SCHEMA.iter_errors(get(relay, "tasks", admin)))[:2]
        send(5, "task.started", task_id="m.0", site="b", attempt=2)
        wait_until(lambda: state("m.0") == "running", 20, "the new attempt")
        # A restart reported while the attempt still runs, then its failure: recovering.
        send(6, "task.restarted", task_id="m.0", reason="hung", attempt=3)
        send(7, "task.failed", task_id="m.0", site="b", attempt=2, reason="stopped for a restart", retryable=True)
        wait_until(lambda: state("m.0") == "recovering", 20, "recovering after the restart")
        # diaspora run's order: the lost attempt's failure, then the policy's restart (an
        # action naming the task), its outcome, the next attempt.
        send(10, "task.started", task_id="k.0", site="a", attempt=1)
        send(11, "task.failed", task_id="k.0", site="a", attempt=1, reason="worker died", retryable=True)
        wait_until(lambda: state("k.0") == "failed", 20, "the lost attempt")
        send(12, "action.requested", action_id="P1", action="restart", task_id="k.0", reason="default-revive",
             policy="default-revive")
        wait_until(lambda: state("k.0") == "recovering", 20, "recovering on the policy's restart")
        send(13, "action.done", action_id="P1", action="restart", task_id="k.0", status="done", message="restarted")
        send(14, "task.started", task_id="k.0", site="b", attempt=2)
        wait_until(lambda: state("k.0") == "running", 20, "the restarted attempt")
        send(15, "task.failed", task_id="k.0", site="b", attempt=2, reason="lost again", retryable=True)
        send(16, "action.requested", action_id="P2", action="migrate", task_id="k.0", target_site="c", reason="r")
        wait_until(lambda: state("k.0") == "recovering", 20, "recovering on the migration")
        send(17, "action.done", action_id="P2", action="migrate", task_id="k.0", status="failed", message="no site c")
        wait_until(lambda: state("k.0") == "failed", 20, "failed once its migration failed")
        # A duplicate declined as not needed is skipped, not failed, and ends no recovery.
        send(18, "action.requested", action_id="P3", action="restart", task_id="k.0", reason="again", policy="default-revive")
        send(19, "action.done", action_id="P3", action="restart", task_id="k.0", status="failed",
             message="not needed: a new attempt of k.0 is already waiting for a worker")
        wait_until(lambda: {a["action_id"]: a["status"] for a in get(relay, "actions", admin)["items"]}.get("P3") == "skipped",
                   20, "the duplicate skipped")
        assert state("k.0") == "recovering"
        # A failure nobody recovers (not retryable, or no recovery reported) stays failed.
        send(8, "task.started", task_id="m.0", site="b", attempt=3)
        send(9, "task.failed", task_id="m.0", site="b", attempt=3, reason="its own error")
        wait_until(lambda: state("m.0") == "failed", 20, "the final failure")
        workflows = get(relay, "workflows", admin)["items"]
        assert workflows[0]["states"] == {"failed": 1, "recovering": 1}, workflows
    finally:
        relay.stop_cleanly()


def test_faults_reported_on_a_site_are_kept_for_its_timeline(tmp_path, creds):
    relay = RelayProcess(creds, tmp_path / "data").start()
    pub, admin = creds.token("publish:*", "subscribe:*"), creds.token("admin")
    try:
        publish_events(relay, pub, "flt.events", [
            ev(1, "resource.status", resource_id="a", kind="site", state="degraded", site="a",
               metrics={"fault_slow_site_factor": 4}),
            ev(2, "resource.status", resource_id="a/w1", kind="worker", state="down", site="a",
               metrics={"fault_kill_worker": 1, "rss_mib": 12}),
            ev(3, "resource.status", resource_id="a", kind="site", state="up", site="a", metrics={"fault_slow_site_factor": 1})])
        site = wait_until(lambda: [s for s in get(relay, "sites", admin)["items"] if len(s["faults"]) == 3], 20, "the faults")[0]
        assert [(f["fault"], f["resource"], f["state"], f["value"]) for f in site["faults"]] == [
            ("slow_site_factor", "a", "degraded", 4), ("kill_worker", "a/w1", "down", 1), ("slow_site_factor", "a", "up", 1)]
        assert SCHEMA.is_valid(get(relay, "sites", admin)), list(SCHEMA.iter_errors(get(relay, "sites", admin)))[:2]
    finally:
        relay.stop_cleanly()


def test_console_assets_are_served_with_a_strict_policy(tmp_path, creds):
    assets = tmp_path / "console"
    (assets / "assets").mkdir(parents=True)
    (assets / "index.html").write_text("<!doctype html><title>Diaspora</title><script src=assets/app.js></script>")
    (assets / "assets" / "app.js").write_text("console.log('hi')")
    (tmp_path / "secret.txt").write_text("not for you")
    relay = RelayProcess(creds, tmp_path / "data", config={"console_dir": str(assets)}).start()
    try:
        req = urllib.request.Request(f"https://127.0.0.1:{relay.port}/console/")
        with urllib.request.urlopen(req, context=creds.client_ssl(), timeout=20) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
            csp = r.headers["Content-Security-Policy"]
            assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp
            assert r.headers["X-Content-Type-Options"] == "nosniff" and "Diaspora" in r.read().decode()
        assert https_get(relay, "/console/assets/app.js") == "console.log('hi')"
        for path in ("/console/../secret.txt", "/console/%2e%2e/secret.txt", "/console/assets/../../secret.txt",
                     "/console/.hidden", "/console/nope.js"):
            assert https_status(relay, path) == 404, path
    finally:
        relay.stop()
    # A console_dir without the built assets is a configuration error, said at start.
    bad = RelayProcess(creds, tmp_path / "data2", config={"console_dir": str(tmp_path / "empty")})
    with pytest.raises(AssertionError, match="no index.html"):
        bad.start()


def test_a_run_has_ended_when_every_engine_closed_its_plugin_and_a_new_run_opens_it_again(tmp_path, creds):
    relay = RelayProcess(creds, tmp_path / "data").start()
    pub, admin = creds.token("publish:*", "subscribe:*"), creds.token("admin")
    counters = {k: 0 for k in ("events_accepted", "events_acked", "events_spilled", "metrics_coalesced", "events_lost",
                               "spool_records", "spool_bytes", "reconnects", "invalid_transitions", "actions_received")}

    def stats(n, engine, **more):
        return ev(n, "plugin.stats", engine=engine, connected=True, **counters, **more)

    def ended():
        return get(relay, "workflows", admin)["items"][0]["ended_us"]
    try:
        publish_events(relay, pub, "end.events", [ev(1, "task.submitted", task_id="r.0", name="r"),
                                                  stats(2, "dask"), stats(3, "slurm")])
        wait_until(lambda: get(relay, "workflows", admin)["total"] == 1 and
                   len(get(relay, "workflows", admin)["items"][0]["engines"]) == 2, 20, "the engines")
        assert ended() == 0
        publish_events(relay, pub, "end.events", [stats(4, "dask", closing=True)])
        wait_until(lambda: get(relay, "workflows", admin)["items"][0]["engines"]["dask"].get("closing"), 20, "dask closed")
        assert ended() == 0  # slurm's engine still runs
        publish_events(relay, pub, "end.events", [stats(5, "slurm", closing=True)])
        wait_until(lambda: ended() > 0, 20, "the run's end")
        wfs = get(relay, "workflows", admin)
        assert SCHEMA.is_valid(wfs), list(SCHEMA.iter_errors(wfs))[:2]
        publish_events(relay, pub, "end.events", [ev(6, "task.submitted", task_id="r.1", name="r")])  # a new run
        wait_until(lambda: ended() == 0, 20, "the new run")
    finally:
        relay.stop_cleanly()
