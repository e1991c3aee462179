"""Browsing a topic from a point through a real relay (GET /api/v1/topics/{topic}/events,
docs/protocol.md): from an offset, a time, either end, forward and backward, with filters
the relay applies over the whole topic, bounded scans that say what they looked at,
exports as JSON lines and CSV; and the topics a token sees are those it may subscribe to.
Each test runs on both stores: the embedded log and a NATS JetStream server
(relay.yaml `storage: jetstream`, a real nats-server)."""

from __future__ import annotations

import csv
import io
import json
import time
import urllib.parse

import pytest

from relay_harness import Credentials, NatsServer, RelayProcess, event, https_request, run, session
from relay_harness import request as ask


@pytest.fixture(scope="module", params=["embedded", "jetstream"])
def world(tmp_path_factory, request):
    """A relay holding wf.events (1,200 events in two batches of appends a moment apart)
    and other.events (3); the time between the two batches."""
    root = tmp_path_factory.mktemp("browse")
    creds = Credentials(root / "creds")
    nats = None
    store = request.param
    if store == "jetstream":
        nats = NatsServer(root / "nats").start()
        relay = RelayProcess(creds, root / "data", config={
            "storage": "jetstream", "jetstream": {"urls": [nats.url], "replicas": 1, "timeout": "3s"}}).start()
    else:
        relay = RelayProcess(creds, root / "data").start()
    admin = creds.token("admin")

    def ev(i):
        kind = "org.example.action.requested" if i % 100 == 7 else "org.example.task.completed"
        data = {"task_id": f"t{i}", "nested": {"note": "the Needle Text here" if i == 1111 else "hay"}}
        e = event(f"e-{i}", source="/wf/engine", type_=kind, data=data)
        e["subject"] = "a, \"quoted\" task" if i == 3 else f"t{i}"
        return e

    async def go():
        ws = await session(relay, admin, producer_id="p")
        seq = 0
        for lo in range(0, 600, 100):
            assert (await ask(ws, {"op": "publish", "topic": "wf.events", "seq": seq,
                                       "events": [ev(i) for i in range(lo, lo + 100)]}))["op"] == "ack"
            seq += 1
        await __import__("asyncio").sleep(1.2)
        between = time.time() - 0.6
        for lo in range(600, 1200, 100):
            assert (await ask(ws, {"op": "publish", "topic": "wf.events", "seq": seq,
                                       "events": [ev(i) for i in range(lo, lo + 100)]}))["op"] == "ack"
            seq += 1
        assert (await ask(ws, {"op": "publish", "topic": "other.events", "seq": seq,
                                   "events": [event(f"o-{i}") for i in range(3)]}))["op"] == "ack"
        return between
    between = run(go())
    yield relay, creds, admin, between
    try:
        relay.stop_cleanly()
    finally:
        if nats:
            nats.stop()


def get(relay, token, path, **params):
    q = urllib.parse.urlencode(params)
    status, headers, body = https_request(relay, "GET", path + ("?" + q if q else ""), token)
    return status, headers, (json.loads(body) if headers.get("Content-Type", "").startswith("application/json") else body)


def offsets(page):
    return [e["offset"] for e in page["events"]]


def test_a_workflow_token_sees_and_reads_the_topics_it_may_subscribe_to(world):
    relay, creds, admin, _ = world
    wf = creds.token("subscribe:wf.*", subject="wf-run")
    status, _, body = get(relay, wf, "/api/v1/topics")
    assert status == 200 and [t["name"] for t in body["topics"]] == ["wf.events"]
    assert sorted(t["name"] for t in get(relay, admin, "/api/v1/topics")[2]["topics"]) == ["other.events", "wf.events"]
    assert get(relay, wf, "/api/v1/topics/wf.events")[0] == 200
    assert get(relay, wf, "/api/v1/topics/wf.events/events", limit=1)[0] == 200
    status, _, body = get(relay, wf, "/api/v1/topics/other.events/events")
    assert status == 403 and "may not subscribe to 'other.events'" in body["message"]
    assert get(relay, None, "/api/v1/topics")[0] == 401
    assert get(relay, admin, "/api/v1/topics/nope.events/events")[0] == 404


def test_from_a_point_shows_that_point_first_and_pages_both_ways(world):
    relay, _, admin, between = world
    path = "/api/v1/topics/wf.events/events"
    page = get(relay, admin, path, **{"from": 0, "limit": 100})[2]
    assert offsets(page) == list(range(100)) and page["next"] == 100 and not page["reached_end"]
    assert page["events"][0]["event"]["id"] == "e-0" and page["scanned"] == {"records": 100, "low": 0, "high": 99}
    page = get(relay, admin, path, **{"from": page["next"], "limit": 100})[2]
    assert offsets(page) == list(range(100, 200))
    # Without a start: the newest first; then on, backward.
    newest = get(relay, admin, path, limit=100)[2]
    assert newest["direction"] == "backward" and offsets(newest) == list(range(1199, 1099, -1)) and newest["next"] == 1099
    older = get(relay, admin, path, **{"from": newest["next"], "direction": "backward", "limit": 100})[2]
    assert offsets(older) == list(range(1099, 999, -1))
    first = get(relay, admin, path, **{"from": 50, "direction": "backward", "limit": 100})[2]
    assert offsets(first) == list(range(50, -1, -1)) and first["reached_end"] and first["next"] is None
    # From a time: the first event appended at or after it; backward, the last before it.
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(between)) + f".{int(between % 1 * 1e6):06d}Z"
    assert offsets(get(relay, admin, path, from_time=stamp, limit=3)[2]) == [600, 601, 602]
    assert offsets(get(relay, admin, path, from_time=stamp, direction="backward", limit=2)[2]) == [599, 598]
    tail = get(relay, admin, path, **{"from": "latest", "direction": "forward"})[2]
    assert tail["events"] == [] and tail["next"] == 1200 and tail["reached_end"]


def test_filters_run_over_the_whole_topic_and_say_what_they_scanned(world):
    relay, _, admin, _ = world
    path = "/api/v1/topics/wf.events/events"
    found = get(relay, admin, path, id="e-1000")[2]  # beyond the newest 500 and the oldest 500
    assert offsets(found) == [1000] and found["scanned"]["records"] == 1200 and found["reached_end"]
    actions = get(relay, admin, path, **{"from": 0, "type": "ACTION"})[2]  # no regard to case
    assert offsets(actions) == [i for i in range(1200) if i % 100 == 7]
    assert offsets(get(relay, admin, path, q="needle text")[2]) == [1111]  # inside the data
    assert offsets(get(relay, admin, path, subject="QUOTED")[2]) == [3]
    assert offsets(get(relay, admin, path, source="/wf/", type="completed", id="e-8")[2]) == [8]
    bounded = get(relay, admin, path, **{"from": 0, "id": "nowhere", "max_scan": 50})[2]
    assert bounded["events"] == [] and bounded["limited_by_scan"] and bounded["next"] == 50
    assert bounded["scanned"] == {"records": 50, "low": 0, "high": 49}


def test_exports_as_json_lines_and_csv(world):
    relay, _, admin, _ = world
    path = "/api/v1/topics/wf.events/events"
    status, headers, body = get(relay, admin, path, **{"from": 0, "limit": 5, "format": "jsonl"})
    assert status == 200 and headers["Content-Type"] == "application/x-ndjson"
    assert 'filename="wf.events-0-4.jsonl"' in headers["Content-Disposition"] and headers["X-Diaspora-Next"] == "5"
    assert [json.loads(line)["id"] for line in body.splitlines()] == [f"e-{i}" for i in range(5)]
    status, headers, body = get(relay, admin, path, **{"from": 0, "limit": 5, "format": "csv"})
    assert headers["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(body)))
    assert [r["id"] for r in rows] == [f"e-{i}" for i in range(5)]
    assert rows[3]["subject"] == 'a, "quoted" task' and json.loads(rows[0]["data"])["task_id"] == "t0"
    assert rows[0]["offset"] == "0" and rows[0]["appended"].endswith("Z")


@pytest.mark.parametrize("params, says", [
    ({"limit": "0"}, "'limit' must be a whole number from 1 to 10000"),
    ({"from": "abc"}, "'from' must be a whole number"),
    ({"from_time": "yesterday"}, "'from_time' must be an RFC 3339 time"),
    ({"from": "0", "from_time": "2026-01-01T00:00:00Z"}, "not both"),
    ({"direction": "sideways"}, "'direction' must be forward or backward"),
    ({"format": "xml"}, "'format' must be json, jsonl or csv"),
    ({"colour": "red"}, "unknown parameter 'colour'"),
])
def test_bad_parameters_are_refused_naming_them(world, params, says):
    relay, _, admin, _ = world
    status, _, body = get(relay, admin, "/api/v1/topics/wf.events/events", **params)
    assert status == 400 and body["error"] == "bad_request" and says in body["message"], body
