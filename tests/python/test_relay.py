"""The relay end to end: real diaspora-relay processes on 127.0.0.1, real TLS, a client
written from docs/protocol.md with Python's websockets."""

from __future__ import annotations

import asyncio
import datetime
import json
import socket
import ssl
import time

import pytest
import websockets

from relay_harness import (DIASPORA, TIMEOUT, Credentials, RelayProcess, collect_all, connect, event, https_get,
                           https_post, https_status, metric, recv, request, run, session, sh, wait_until)


@pytest.fixture(scope="module")
def creds(tmp_path_factory):
    return Credentials(tmp_path_factory.mktemp("creds"))


@pytest.fixture()
def relay(creds, tmp_path):
    r = RelayProcess(creds, tmp_path / "data").start()
    yield r
    assert r.stop() == 0, r.log.read_text()


def flip(token: str) -> str:
    """The token with one signature character changed (not the last one, whose low bits are padding)."""
    i = len(token) - 10
    return token[:i] + ("B" if token[i] == "A" else "A") + token[i + 1:]


def admin(creds):
    return creds.token("admin")


async def publish(ws, topic, seq, events):
    return await request(ws, {"op": "publish", "topic": topic, "seq": seq, "events": events})


async def collect(ws, n, sub_id=None):
    """Receive `events` frames until n events arrived; returns [(topic, offset, event)]."""
    out = []
    while len(out) < n:
        m = await recv(ws)
        if m["op"] != "events" or (sub_id is not None and m["id"] != sub_id):
            continue
        out += [(m["topic"], e["offset"], e["event"]) for e in m["events"]]
    return out


# ---- publish, subscribe, replay ----------------------------------------------------------

def test_publish_ack_and_replay_from_each_start(relay, creds):
    async def go():
        ws = await session(relay, admin(creds), producer_id="p1")
        ack = await publish(ws, "jobs", 0, [event(i) for i in range(5)])
        assert ack == {"op": "ack", "seq": 0, "topic": "jobs", "first_offset": 0, "count": 5, "duplicates": 0}
        ack = await publish(ws, "jobs", 1, [event(i) for i in range(5, 8)])
        assert ack["first_offset"] == 5 and ack["count"] == 3

        sub = await connect(relay, admin(creds))
        await request(sub, {"op": "hello"})
        r = await request(sub, {"op": "subscribe", "id": "a", "topic": "jobs", "from": "earliest"})
        assert r["op"] == "subscribed" and r["offsets"] == {"jobs": 0}
        got = await collect(sub, 8)
        assert [o for _, o, _ in got] == list(range(8))
        assert [e["id"] for _, _, e in got] == [str(i) for i in range(8)]

        r = await request(sub, {"op": "subscribe", "id": "b", "topic": "jobs", "from": 6})
        assert r["offsets"] == {"jobs": 6}
        assert [o for _, o, _ in await collect(sub, 2, "b")] == [6, 7]

        r = await request(sub, {"op": "subscribe", "id": "c", "topic": "jobs", "from": "latest"})
        assert r["offsets"] == {"jobs": 8}
        await publish(ws, "jobs", 2, [event("late")])
        got = await collect(sub, 1, "c")
        assert got[0][1] == 8 and got[0][2]["id"] == "late"
        await ws.close()
        await sub.close()
    run(go())


def test_subscribe_from_a_time_starts_at_the_first_event_appended_then(relay, creds):
    async def go():
        ws = await session(relay, admin(creds), producer_id="pt")
        await publish(ws, "timed.a", 0, [event(f"early{i}") for i in range(4)])
        await publish(ws, "timed.b", 1, [event("b-early")])
        await asyncio.sleep(1.1)
        cut = datetime.datetime.now(datetime.timezone.utc)
        await asyncio.sleep(0.2)
        await publish(ws, "timed.a", 2, [event("late0"), event("late1")])
        sub = await session(relay, admin(creds))
        # Per topic of a pattern: timed.a from its first event after the cut, timed.b at its end.
        r = await request(sub, {"op": "subscribe", "id": "t", "topic": "timed.*",
                                "from": {"time": cut.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}})
        assert r["op"] == "subscribed" and r["offsets"] == {"timed.a": 4, "timed.b": 1}, r
        got = await collect(sub, 2, "t")
        assert [(t, o, e["id"]) for t, o, e in got] == [("timed.a", 4, "late0"), ("timed.a", 5, "late1")]
        r = await request(sub, {"op": "subscribe", "id": "u", "topic": "timed.a", "from": {"time": "2000-01-01T00:00:00Z"}})
        assert r["offsets"] == {"timed.a": 0}
        assert [o for _, o, _ in await collect(sub, 6, "u")] == list(range(6))
        for bad in ({"time": "yesterday"}, {"time": 5}, {"time": "2026-01-01T00:00:00Z", "x": 1}, {"offset": 3}):
            r = await request(sub, {"op": "subscribe", "id": "v", "topic": "timed.a", "from": bad})
            assert r["op"] == "error" and r["code"] == "bad_request" and "from" in r["message"], (bad, r)
        await ws.close()
        await sub.close()
    run(go())


def test_pattern_subscription_includes_topics_created_later(relay, creds):
    async def go():
        ws = await session(relay, admin(creds))
        await publish(ws, "task.a", 0, [event("a0")])
        await publish(ws, "other", 1, [event("x")])
        sub = await session(relay, creds.token("subscribe:task.*"))
        r = await request(sub, {"op": "subscribe", "id": 1, "topic": "task.*", "from": "earliest"})
        assert r["topics"] == ["task.a"]
        await publish(ws, "task.b", 2, [event("b0")])
        got = await collect(sub, 2)
        assert sorted((t, e["id"]) for t, _, e in got) == [("task.a", "a0"), ("task.b", "b0")]
        # other topics never arrive
        await publish(ws, "other", 3, [event("y")])
        await publish(ws, "task.a", 4, [event("a1")])
        got = await collect(sub, 1)
        assert got[0][2]["id"] == "a1"
    run(go())


def test_consumer_group_resumes_where_it_committed(relay, creds):
    async def go():
        ws = await session(relay, admin(creds))
        await publish(ws, "g", 0, [event(i) for i in range(10)])
        c1 = await session(relay, admin(creds))
        await request(c1, {"op": "subscribe", "id": "s", "topic": "g", "from": "earliest", "group": "console"})
        got = await collect(c1, 10)
        r = await request(c1, {"op": "commit", "group": "console", "topic": "g", "offset": got[3][1] + 1})
        assert r == {"op": "committed", "group": "console", "topic": "g", "offset": 4}
        await c1.close()
        c2 = await session(relay, admin(creds))
        r = await request(c2, {"op": "subscribe", "id": "s", "topic": "g", "from": "latest", "group": "console"})
        assert r["offsets"] == {"g": 4}  # the commit wins over from
        got = await collect(c2, 6)
        assert [o for _, o, _ in got] == list(range(4, 10))
        # The lag is visible to an admin.
        body = https_get(relay, "/api/v1/topics/g", admin(creds))
        assert json.loads(body)["groups"] == [{"group": "console", "offset": 4, "lag": 6}]
    run(go())


def test_an_admin_resets_a_consumer_group_to_an_offset_or_a_time(relay, creds):
    """POST /api/v1/groups/{group}/reset (admin): the group's next session starts where the
    reset put it; by time, at the first event appended then; refusals name what is wrong."""
    async def publish_two_batches():
        ws = await session(relay, admin(creds))
        await publish(ws, "rg", 0, [event(i) for i in range(6)])
        await asyncio.sleep(1.1)
        cut = time.time() - 0.5
        await publish(ws, "rg", 1, [event(i) for i in range(6, 10)])
        c1 = await session(relay, admin(creds))
        await request(c1, {"op": "subscribe", "id": "s", "topic": "rg", "from": "earliest", "group": "ops"})
        await collect(c1, 10)
        await request(c1, {"op": "commit", "group": "ops", "topic": "rg", "offset": 10})
        return cut
    cut = run(publish_two_batches())

    async def next_session_starts():
        c = await session(relay, admin(creds))
        r = await request(c, {"op": "subscribe", "id": "s", "topic": "rg", "from": "latest", "group": "ops"})
        return r["offsets"]["rg"], [o for _, o, _ in await collect(c, 1)][:1] if r["offsets"]["rg"] < 10 else []

    status, body = https_post(relay, "/api/v1/groups/ops/reset", {"topic": "rg", "offset": 2}, admin(creds))
    assert status == 200 and body == {"group": "ops", "topic": "rg", "offset": 2, "previous": 10}, body
    assert run(next_session_starts()) == (2, [2])
    stamp = datetime.datetime.fromtimestamp(cut, datetime.timezone.utc).isoformat().replace("+00:00", "Z")
    status, body = https_post(relay, "/api/v1/groups/ops/reset", {"topic": "rg", "time": stamp}, admin(creds))
    assert status == 200 and body["offset"] == 6 and body["previous"] == 2, body
    assert run(next_session_starts()) == (6, [6])
    assert https_post(relay, "/api/v1/groups/ops/reset", {"topic": "rg", "offset": "latest"}, admin(creds))[1]["offset"] == 10
    assert json.loads(https_get(relay, "/api/v1/topics/rg", admin(creds)))["groups"] == [{"group": "ops", "offset": 10, "lag": 0}]
    for body, status, says in (({"topic": "rg", "offset": 11}, 400, "outside what 'rg' holds: 0 to 10"),
                               ({"topic": "rg"}, 400, "one of 'offset' and 'time'"),
                               ({"topic": "rg", "offset": 1, "time": stamp}, 400, "one of 'offset' and 'time'"),
                               ({"topic": "rg", "time": "noon"}, 400, "'time' must be an RFC 3339 time"),
                               ({"topic": "rg", "offset": -1}, 400, "non-negative"),
                               ({"topic": "rg", "offset": 1, "colour": "red"}, 400, "unknown field 'colour'"),
                               ({"topic": "nope", "offset": 0}, 404, "no topic 'nope'")):
        got = https_post(relay, "/api/v1/groups/ops/reset", body, admin(creds))
        assert got[0] == status and says in got[1]["message"], (body, got)
    assert https_post(relay, "/api/v1/groups/ops/reset", {"topic": "rg", "offset": 0}, creds.token("subscribe:*"))[0] == 403
    assert https_post(relay, "/api/v1/groups/ops/reset", {"topic": "rg", "offset": 0}, None)[0] == 401


def test_an_event_is_republished_under_a_new_id_naming_who_asked(relay, creds):
    async def go():
        ws = await session(relay, admin(creds))
        await publish(ws, "rp.src", 0, [event(i, data={"n": i}) for i in range(3)])
    run(go())
    op = creds.token("publish:rp.dst", "subscribe:rp.src", subject="ops@site")
    status, body = https_post(relay, "/api/v1/topics/rp.dst/republish", {"from_topic": "rp.src", "offset": 1}, op)
    assert status == 202 and body["topic"] == "rp.dst" and body["offset"] == 0, body
    (copy,) = [e for _, e in run(collect_all(relay, admin(creds), "rp.dst", 1))]
    assert copy["id"] == body["id"] != "1" and copy["source"] == "/diaspora/console/ops_site", copy
    assert (copy["originalid"], copy["originalsource"], copy["republishedfrom"]) == ("1", "/pytest", "rp.src/1"), copy
    assert copy["data"] == {"n": 1} and copy["type"] == "org.example.test", copy
    # The same topic by default; refusals name what is missing.
    assert https_post(relay, "/api/v1/topics/rp.src/republish", {"offset": 0}, admin(creds))[0] == 202
    status, body = https_post(relay, "/api/v1/topics/rp.src/republish", {"offset": 0}, op)
    assert status == 403 and "publish:rp.src and subscribe:rp.src" in body["message"], body
    status, body = https_post(relay, "/api/v1/topics/rp.dst/republish", {"from_topic": "rp.src", "offset": 9}, op)
    assert status == 404 and "nothing is stored at offset 9 of 'rp.src' (it holds 0 to 4" in body["message"], body
    for bad, says in (({}, "'offset' is required"), ({"offset": 0, "to": "x"}, "unknown field 'to'"),
                      ({"offset": 0, "from_topic": "../etc"}, "'from_topic' must be a topic name")):
        status, body = https_post(relay, "/api/v1/topics/rp.dst/republish", bad, op)
        assert status == 400 and says in body["message"], (bad, body)


# ---- idempotence ------------------------------------------------------------------------

def test_duplicates_dropped_by_producer_seq_and_event_id_across_restart(relay, creds):
    async def go(expect_first):
        ws = await session(relay, admin(creds), producer_id="prod-7")
        ack = await publish(ws, "d", 0, [event("e0"), event("e1")])
        assert ack["count"] == expect_first
        again = await publish(ws, "d", 0, [event("e0"), event("e1")])
        assert again["count"] == 0 and again.get("duplicate_batch") is True
        mixed = await publish(ws, "d", 1 if expect_first else 2, [event("e1"), event("e2")])
        await ws.close()
        return mixed
    mixed = run(go(2))
    assert mixed["count"] == 1 and mixed["duplicates"] == 1
    relay.stop()
    relay.start()
    mixed = run(go(0))  # after a restart: the batch and the events are still known
    assert mixed["count"] == 0 and mixed["duplicates"] == 2
    async def count():
        sub = await session(relay, admin(creds))
        await request(sub, {"op": "subscribe", "id": 1, "topic": "d", "from": "earliest"})
        got = await collect(sub, 3)
        return [e["id"] for _, _, e in got]
    assert run(count()) == ["e0", "e1", "e2"]


# ---- bad input ----------------------------------------------------------------------------

def test_bad_frames_get_documented_errors_and_the_relay_keeps_serving(relay, creds):
    async def go():
        good = await session(relay, admin(creds), producer_id="good")
        assert (await publish(good, "safe", 0, [event("kept")]))["op"] == "ack"

        ws = await connect(relay, admin(creds))
        assert (await request(ws, {"op": "publish", "topic": "t", "seq": 0, "events": [event(1)]}))["code"] == "hello_required"
        await ws.send("{not json")
        assert (await recv(ws))["code"] == "bad_json"
        await ws.send(json.dumps({"op": "hello"}))
        assert (await recv(ws))["op"] == "welcome"
        assert (await request(ws, {"op": "frobnicate"}))["code"] == "unknown_op"
        await ws.send(b"\x00binary")
        assert (await recv(ws))["code"] == "bad_request"
        nack = await publish(ws, "t", 1, [event(1), {"specversion": "1.0", "id": "x", "type": "t"}])
        assert nack["op"] == "nack" and nack["code"] == "invalid_event" and nack["index"] == 1
        assert "source" in nack["message"]
        nack = await publish(ws, "t", 2, [event(2, data="y" * (1 << 20))])
        assert nack["code"] == "event_too_large"
        nack = await publish(ws, "bad topic!", 3, [event(3)])
        assert nack["code"] == "bad_topic"
        nack = await publish(ws, "t", 4, [event(4, type_="org.diaspora.task.started", data={"nope": 1})])
        assert nack["code"] == "invalid_event" and "task_id" in nack["message"]
        nack = await publish(ws, "t", 5, [])
        assert nack["code"] == "bad_request"
        # Nothing of a nacked batch was written.
        r = await request(ws, {"op": "subscribe", "id": 1, "topic": "t", "from": "earliest"})
        assert r["offsets"] == {"t": 0}
        # A frame over max_frame_bytes (16 MiB) closes the connection with 1009.
        await ws.send(json.dumps({"op": "ping", "pad": "z" * (17 << 20)}))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await recv(ws)
        assert closed.value.code == 1009

        # The good client is unaffected and its data is intact.
        assert (await publish(good, "safe", 1, [event("kept2")]))["count"] == 1
        sub = await session(relay, admin(creds))
        await request(sub, {"op": "subscribe", "id": 1, "topic": "safe", "from": "earliest"})
        assert [e["id"] for _, _, e in await collect(sub, 2)] == ["kept", "kept2"]
    run(go())


def test_tokens_missing_expired_tampered_and_wrong_scope(relay, creds):
    async def go():
        now = int(time.time())
        # No token anywhere: hello is refused, close 4001.
        ws = await connect(relay, None)
        r = await request(ws, {"op": "hello"})
        assert r["code"] == "unauthorized"
        with pytest.raises(websockets.ConnectionClosed) as c:
            await recv(ws)
        assert c.value.code == 4001
        # Expired / tampered / wrong key / alg none on the upgrade: HTTP 401.
        bad = {
            "expired": creds.forge({"sub": "x", "scope": ["admin"], "exp": now - 3600}),
            "tampered": flip(creds.token("subscribe:*")),
            "other key": creds.forge({"sub": "x", "scope": ["admin"], "exp": now + 3600}, secret=b"k" * 40),
            "alg none": creds.forge({"sub": "x", "scope": ["admin"], "exp": now + 3600}, header={"alg": "none"}),
        }
        for name, tok in bad.items():
            with pytest.raises(websockets.InvalidStatusCode) as e:
                await connect(relay, tok)
            assert e.value.status_code == 401, name
        # The same expired token in hello: token_expired.
        ws = await connect(relay, None)
        r = await request(ws, {"op": "hello", "token": bad["expired"]})
        assert r["code"] == "token_expired"
        # Wrong scope: forbidden, connection stays open.
        ws = await session(relay, creds.token("subscribe:task.*"))
        nack = await publish(ws, "task.x", 0, [event(1)])
        assert nack["code"] == "forbidden"
        r = await request(ws, {"op": "subscribe", "id": 1, "topic": "control.x"})
        assert r["code"] == "forbidden"
        r = await request(ws, {"op": "subscribe", "id": 2, "topic": "*"})
        assert r["code"] == "forbidden"
        assert (await request(ws, {"op": "ping", "id": 9})) == {"op": "pong", "id": 9}
    run(go())


def test_mutual_tls_refuses_a_client_without_a_trusted_certificate(creds, tmp_path):
    relay = RelayProcess(creds, tmp_path / "mtls", mtls=True).start()
    try:
        async def go():
            # Refused by the TLS handshake itself (the relay requires a client certificate):
            # a hang until a timeout does not count as a refusal.
            started = time.monotonic()
            with pytest.raises((ssl.SSLError, ConnectionError, EOFError, websockets.InvalidHandshake,
                                websockets.ConnectionClosed)):
                ws = await connect(relay, admin(creds))
                await request(ws, {"op": "hello"})
            assert time.monotonic() - started < TIMEOUT / 2
            ws = await session(relay, admin(creds), ssl_ctx=creds.client_ssl(with_cert=True))
            assert (await publish(ws, "m", 0, [event(1)]))["count"] == 1
        run(go())
        # An untrusted server certificate is refused by our own CLI client too.
        other = Credentials(tmp_path / "other")
        p = sh(DIASPORA, "publish", "--url", relay.url, "--ca", other.ca, "--token", admin(creds),
               "--topic", "m", "--count", "1", check=False)
        assert p.returncode == 1 and "TLS handshake" in p.stderr
    finally:
        assert relay.stop() == 0


# ---- cloudevents.json ----------------------------------------------------------------------

def test_cloudevents_binding_publish_and_listen(relay, creds):
    async def go():
        listener = await connect(relay, creds.token("subscribe:ce.*"), path="/ce/ce.demo",
                                 subprotocol="cloudevents.json")
        assert listener.subprotocol == "cloudevents.json"
        pub = await connect(relay, None, path=f"/ce/ce.demo?access_token={creds.token('publish:ce.*')}",
                            subprotocol="cloudevents.json")
        for i in range(3):
            await pub.send(json.dumps(event(f"ce{i}", source="/ce-client")))
        got = [json.loads(await asyncio.wait_for(listener.recv(), 20)) for _ in range(3)]
        assert [e["id"] for e in got] == ["ce0", "ce1", "ce2"]
        assert got[0]["source"] == "/ce-client" and got[0]["specversion"] == "1.0"
        # The events are in the log for diaspora.v1 clients too.
        sub = await session(relay, admin(creds))
        await request(sub, {"op": "subscribe", "id": 1, "topic": "ce.demo", "from": "earliest"})
        assert len(await collect(sub, 3)) == 3
        # An invalid event closes the publisher with 1007; a publisher without scope with 4003.
        await pub.send(json.dumps({"id": "no-source"}))
        with pytest.raises(websockets.ConnectionClosed) as c:
            await asyncio.wait_for(pub.recv(), 20)
        assert c.value.code == 1007
        await listener.send(json.dumps(event("x")))
        with pytest.raises(websockets.ConnectionClosed) as c:
            await asyncio.wait_for(listener.recv(), 20)
        assert c.value.code == 4003
        with pytest.raises(websockets.InvalidStatusCode) as e:
            await connect(relay, None, path="/ce/ce.demo", subprotocol="cloudevents.json")
        assert e.value.status_code == 401
        with pytest.raises(websockets.InvalidStatusCode) as e:
            await connect(relay, creds.token("subscribe:zzz"), path="/ce/ce.demo", subprotocol="cloudevents.json")
        assert e.value.status_code == 403
    run(go())


# ---- HTTPS ----------------------------------------------------------------------------------



def test_https_endpoints(relay, creds):
    async def go():
        ws = await session(relay, admin(creds))
        await publish(ws, "m.a", 0, [event(i) for i in range(4)])
    run(go())
    assert https_get(relay, "/healthz") == "ok\n"
    assert https_get(relay, "/readyz") == "ready\n"
    metrics = https_get(relay, "/metrics")
    assert 'diaspora_relay_events_in_total{topic="m.a"} 4' in metrics
    assert "diaspora_relay_fsync_seconds_count" in metrics
    assert "# TYPE diaspora_relay_fsync_seconds histogram" in metrics
    assert https_status(relay, "/api/v1/topics") == 401
    # Any token lists the topics it may subscribe to, and reads those only.
    assert [t["name"] for t in json.loads(https_get(relay, "/api/v1/topics", creds.token("subscribe:m.*")))["topics"]] == ["m.a"]
    assert json.loads(https_get(relay, "/api/v1/topics", creds.token("subscribe:other.*")))["topics"] == []
    assert https_status(relay, "/api/v1/topics/m.a", creds.token("subscribe:other.*")) == 403
    topics = json.loads(https_get(relay, "/api/v1/topics", admin(creds)))["topics"]
    assert {"name": "m.a", "first_offset": 0, "next_offset": 4} == {k: topics[0][k] for k in ("name", "first_offset", "next_offset")}
    assert https_status(relay, "/api/v1/topics/nope", admin(creds)) == 404
    assert https_status(relay, "/nothing") == 404
    assert (topics[0]["retention_bytes"], topics[0]["retention_age_s"]) == (0, 0)  # unlimited unless configured


def test_the_subscriptions_gauge_counts_open_subscriptions_per_topic_or_pattern(relay, creds):
    gauge = 'diaspora_relay_subscriptions{topic="%s"} %d'

    async def go():
        a = await session(relay, admin(creds))
        b = await session(relay, admin(creds))
        for ws, sid in ((a, 1), (b, 1), (b, 2)):
            r = await request(ws, {"op": "subscribe", "id": sid, "topic": "g.*" if sid == 1 else "g.one"})
            assert r["op"] == "subscribed", r
        m = https_get(relay, "/metrics")
        assert gauge % ("g.*", 2) in m and gauge % ("g.one", 1) in m, m
        assert (await request(b, {"op": "unsubscribe", "id": 2}))["op"] == "unsubscribed"
        m = https_get(relay, "/metrics")
        assert gauge % ("g.*", 2) in m and 'topic="g.one"' not in m.split("diaspora_relay_subscriptions", 1)[1]
        await b.close()
        wait_until(lambda: gauge % ("g.*", 1) in https_get(relay, "/metrics"), 10, "b's subscription to be gone")
        await a.close()
        wait_until(lambda: 'diaspora_relay_subscriptions{' not in https_get(relay, "/metrics"), 10, "every gone")
    run(go())


def test_topics_list_their_retention(creds, tmp_path):
    relay = RelayProcess(creds, tmp_path / "data", config={"log": {
        "retention_bytes": 8388608, "retention_age": "7d",
        "retention_by_topic": [{"topics": "*.data", "retention_bytes": "1GiB", "retention_age": "1d"}]}}).start()
    try:
        async def go():
            ws = await session(relay, admin(creds))
            await publish(ws, "kept", 0, [event(1)])
            await publish(ws, "wf.data", 0, [event(2)])
        run(go())
        t, d = sorted(json.loads(https_get(relay, "/api/v1/topics", admin(creds)))["topics"], key=lambda x: x["name"])
        assert (t["name"], t["retention_bytes"], t["retention_age_s"]) == ("kept", 8388608, 7 * 86400), t
        assert (d["name"], d["retention_bytes"], d["retention_age_s"]) == ("wf.data", 1 << 30, 86400), d
    finally:
        relay.stop()


# ---- the CLI against a real relay ---------------------------------------------------------

def test_cli_publish_and_tail(relay, creds, tmp_path):
    tok = admin(creds)
    p = sh(DIASPORA, "publish", "--url", relay.url, "--ca", creds.ca, "--token", tok, "--topic", "cli",
           "--count", "500", "--size", "300", "--batch", "64")
    assert p.stdout.startswith("acked 500 of 500 events"), p.stdout
    lines = tmp_path / "events.jsonl"
    lines.write_text("\n".join(json.dumps(event(f"f{i}", source="/file")) for i in range(3)) + "\n")
    p = sh(DIASPORA, "publish", "--url", relay.url, "--ca", creds.ca, "--token", tok, "--topic", "cli", "--file", lines)
    assert p.stdout.startswith("acked 3 of 3 events")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(event("ok")) + "\n" + '{"id":"x"}\n')
    p = sh(DIASPORA, "publish", "--url", relay.url, "--ca", creds.ca, "--token", tok, "--topic", "cli", "--file", bad,
           check=False)
    assert p.returncode == 2 and f"{bad}:2: error:" in p.stderr, (p.returncode, p.stderr)  # invalid input (docs/cli.md)
    assert "nothing was published" in p.stderr
    p = sh(DIASPORA, "tail", "--url", relay.url.replace("127.0.0.1", "localhost"), "--ca", creds.ca, "--token", tok,
           "--topic", "cli", "--from", "500", "--count", "3")
    assert [json.loads(l)["id"] for l in p.stdout.splitlines()] == ["f0", "f1", "f2"]
    # A group: two tails of 2 continue each other.
    tail = [DIASPORA, "tail", "--url", relay.url, "--ca", creds.ca, "--token", tok, "--topic", "cli",
            "--from", "earliest", "--count", "2", "--group", "g1", "--offsets"]
    first = [json.loads(l)["offset"] for l in sh(*tail).stdout.splitlines()]
    second = [json.loads(l)["offset"] for l in sh(*tail).stdout.splitlines()]
    assert first == [0, 1] and second == [2, 3]


# ---- shutdown and slow consumers ------------------------------------------------------------

def test_sigterm_drains_and_exits_zero(creds, tmp_path):
    relay = RelayProcess(creds, tmp_path / "term").start()
    async def go():
        ws = await session(relay, admin(creds), producer_id="t")
        for s in range(20):
            await ws.send(json.dumps({"op": "publish", "topic": "t", "seq": s, "events": [event(f"{s}-{i}") for i in range(50)]}))
        acks = 0
        while acks < 20:
            m = await recv(ws)
            acks += m["op"] == "ack"
        relay.proc.send_signal(15)
        with pytest.raises(websockets.ConnectionClosed) as c:
            await asyncio.wait_for(ws.recv(), 20)
        assert c.value.code == 1001
    run(go())
    assert relay.proc.wait(timeout=20) == 0
    assert "stopped cleanly" in relay.log.read_text()


def test_slow_subscriber_is_disconnected_with_4008(creds, tmp_path):
    relay = RelayProcess(creds, tmp_path / "slow", config={
        "limits": {"subscriber_queue_frames": 2, "slow_subscriber_timeout": "2s", "delivery_batch_events": 50}}).start()
    try:
        tok = admin(creds)
        sh(DIASPORA, "publish", "--url", relay.url, "--ca", creds.ca, "--token", tok, "--topic", "big",
           "--count", "20000", "--size", "2048", "--batch", "500")
        async def go():
            ws = await session(relay, tok, max_queue=1, read_limit=2**16, write_limit=2**16)
            await ws.send(json.dumps({"op": "subscribe", "id": 1, "topic": "big", "from": "earliest"}))
            await asyncio.sleep(6)  # never read: the relay's queue fills and stays full
            with pytest.raises(websockets.ConnectionClosed) as c:
                for _ in range(100000):
                    await asyncio.wait_for(ws.recv(), 20)
            assert c.value.code == 4008
            # Other clients are unaffected.
            ok = await session(relay, tok)
            assert (await request(ok, {"op": "ping", "id": 1}))["op"] == "pong"
        run(go())
        assert "diaspora_relay_slow_consumer_disconnects_total 1" in https_get(relay, "/metrics")
    finally:
        assert relay.stop() == 0


def test_consumer_groups_are_bounded_and_kept_across_a_restart(creds, tmp_path):
    """limits.max_consumer_groups: a commit that would add one more group is refused with
    too_many_groups (nothing else changes); existing groups still commit, also after a
    restart, which reloads the groups from disk and keeps counting them."""
    relay = RelayProcess(creds, tmp_path / "groups", config={"limits": {"max_consumer_groups": 2}}).start()
    try:
        async def commits(groups):
            ws = await session(relay, admin(creds))
            return [await request(ws, {"op": "commit", "group": g, "topic": "t", "offset": n})
                    for n, g in enumerate(groups)]
        r = run(commits(["a", "b", "c", "a"]))
        assert [m["op"] for m in r] == ["committed", "committed", "error", "committed"], r
        assert r[2]["code"] == "too_many_groups" and "max_consumer_groups" in r[2]["message"], r[2]
        assert (r[2]["group"], r[2]["topic"]) == ("c", "t"), r[2]
        assert relay.stop() == 0
        relay.start()
        r = run(commits(["d", "b"]))
        assert r[0]["code"] == "too_many_groups" and r[1]["op"] == "committed", r
        assert sorted(p.stem for p in (tmp_path / "groups" / "groups").glob("*.json")) == ["a", "b"]
    finally:
        assert relay.stop() == 0


def test_topics_are_bounded_in_number(creds, tmp_path):
    """limits.max_topics: a publish that would create one more topic is nacked with
    too_many_topics (on /ce/: closed 1011 naming it); existing topics take writes."""
    relay = RelayProcess(creds, tmp_path / "topics", config={"limits": {"max_topics": 2}}).start()
    try:
        async def go():
            ws = await session(relay, admin(creds))
            acks = [await publish(ws, t, n, [event(f"{t}-{n}")]) for n, t in enumerate(["t1", "t2", "t3", "t1"])]
            assert [a["op"] for a in acks] == ["ack", "ack", "nack", "ack"], acks
            assert acks[2]["code"] == "too_many_topics" and "max_topics" in acks[2]["message"], acks[2]
            ce = await connect(relay, admin(creds), path="/ce/t4", subprotocol="cloudevents.json")
            await ce.send(json.dumps(event("ce-1")))
            with pytest.raises(websockets.ConnectionClosed) as c:
                await asyncio.wait_for(ce.recv(), 20)
            assert c.value.code == 1011 and "too_many_topics" in c.value.reason, (c.value.code, c.value.reason)
            got = await collect_all(relay, admin(creds), "t1", 2)
            assert len(got) == 2
        run(go())
    finally:
        assert relay.stop() == 0


def test_idle_subscription_outlives_the_http_phase_deadlines(relay, creds):
    """A subscriber idle for longer than every HTTP/TLS-phase deadline (30 s) still gets
    events: long-lived connections are governed by WebSocket keep-alive pings only."""
    async def go():
        sub = await session(relay, admin(creds))
        await request(sub, {"op": "subscribe", "id": 1, "topic": "idle", "from": "latest"})
        await asyncio.sleep(35)
        pub = await session(relay, admin(creds))
        await publish(pub, "idle", 0, [event("after-idle")])
        got = await collect(sub, 1)
        assert got[0][2]["id"] == "after-idle"
    run(go())


def test_relay_refuses_bad_configuration_clearly(creds, tmp_path):
    cfg = tmp_path / "relay.yaml"
    cfg.write_text("listen: 127.0.0.1:0\nlog:\n  fsync: sometimes\nlimits:\n  max_batch_events: 0\nthreds: 2\n")
    p = sh(DIASPORA.parent / "diaspora-relay", "--config", cfg, check=False)
    assert p.returncode == 2
    assert f"{cfg}:3:10: error: log.fsync: must be always, never or interval:<ms>" in p.stderr
    assert f"{cfg}:5:21: error: limits.max_batch_events: must be >= 1" in p.stderr
    assert f"{cfg}:6:1: error: threds: unknown key 'threds'; did you mean 'threads'?" in p.stderr
    # Missing files are named.
    p = sh(DIASPORA.parent / "diaspora-relay", "--listen", "127.0.0.1:0", "--tls-cert", tmp_path / "nope.pem",
           "--tls-key", creds.certs / "server-key.pem", "--auth-secret-file", creds.secret_file, check=False)
    assert p.returncode == 2 and "--tls-cert" in p.stderr and "no such file" in p.stderr
    # A key that does not match the certificate is a TLS setup error, not a crash.
    p = sh(DIASPORA.parent / "diaspora-relay", "--listen", "127.0.0.1:0", "--data-dir", tmp_path / "d",
           "--tls-cert", creds.certs / "server.pem", "--tls-key", creds.certs / "client-key.pem",
           "--auth-secret-file", creds.secret_file, check=False)
    assert p.returncode == 2 and "TLS setup" in p.stderr  # a configuration that cannot be used (docs/relay.md)
    # A key file that does not parse, and a secret too short to sign with: configuration, 2.
    junk = tmp_path / "junk-key.pem"
    junk.write_text("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    p = sh(DIASPORA.parent / "diaspora-relay", "--listen", "127.0.0.1:0", "--data-dir", tmp_path / "d",
           "--tls-cert", creds.certs / "server.pem", "--tls-key", junk, "--auth-secret-file", creds.secret_file,
           check=False)
    assert p.returncode == 2 and "TLS setup" in p.stderr, (p.returncode, p.stderr)
    short = tmp_path / "short-secret"
    short.write_text("abc\n")
    p = sh(DIASPORA.parent / "diaspora-relay", "--listen", "127.0.0.1:0", "--data-dir", tmp_path / "d",
           "--tls-cert", creds.certs / "server.pem", "--tls-key", creds.certs / "server-key.pem",
           "--auth-secret-file", short, check=False)
    assert p.returncode == 2 and "--auth-secret-file" in p.stderr, (p.returncode, p.stderr)
    # A runtime failure: the address is taken by a listening socket -> 1.
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = sh(DIASPORA.parent / "diaspora-relay", "--listen", f"127.0.0.1:{port}", "--data-dir", tmp_path / "d",
               "--tls-cert", creds.certs / "server.pem", "--tls-key", creds.certs / "server-key.pem",
               "--auth-secret-file", creds.secret_file, check=False)
    assert p.returncode == 1 and "cannot listen" in p.stderr, (p.returncode, p.stderr)
    # An event limit the log cannot store (a record holds at most 16 MiB) is refused up front.
    cfg.write_text("listen: 127.0.0.1:0\nlimits:\n  max_frame_bytes: 67108864\n  max_event_bytes: 20971520\n")
    p = sh(DIASPORA.parent / "diaspora-relay", "--config", cfg, check=False)
    assert p.returncode == 2 and f"{cfg}:4:20: error: limits.max_event_bytes: must be <= 15728640" in p.stderr, p.stderr


def test_stored_event_is_the_validated_one_whatever_the_frame_spelling(relay, creds):
    """The relay stores the publisher's own event text, so a frame whose "events" key is
    duplicated or escaped must never let an unvalidated array reach the log."""
    async def go():
        ws = await session(relay, admin(creds))
        pretty = json.dumps(event("pretty", data={"k": [1, 2]}), indent=2)
        # Strings with escaped quotes, brackets and backslashes (one ends in a backslash)
        # must not end an event's text early.
        tricky_data = {"s": 'a"b\\', "t": '\\"}]', "u": "\\\\", "v": '{"nested": "[,]"}', "w": 'x"}'}
        tricky = json.dumps(event("tricky", data=tricky_data))
        await ws.send('{ "op" : "publish",\n "topic":"raw", "seq":0,\n "events" : [ ' + pretty + ' ,' + tricky + ']\n}')
        assert (await recv(ws))["count"] == 2
        bad = json.dumps({"id": "no-source-or-type"})
        good = json.dumps(event("good"))
        # Duplicate key: whatever Boost.JSON keeps is what is validated and stored.
        await ws.send('{"op":"publish","topic":"raw","seq":1,"events":[' + bad + '],"events":[' + good + ']}')
        r1 = await recv(ws)
        # Boost.JSON keeps the last of duplicate keys: the good array is validated and stored.
        assert r1["op"] == "ack" and r1["count"] == 1, r1
        await ws.send('{"op":"publish","topic":"raw","seq":2,"ev\\u0065nts":[' + good.replace('"good"', '"esc"') + ']}')
        r2 = await recv(ws)
        assert r2["op"] == "ack" and r2["count"] == 1, r2  # the escaped key is still "events"
        sub = await session(relay, admin(creds))
        await request(sub, {"op": "subscribe", "id": 1, "topic": "raw", "from": "earliest"})
        want = 4
        got = [e for _, _, e in await collect(sub, want)]
        assert got[0] == event("pretty", data={"k": [1, 2]})
        assert got[1] == event("tricky", data=tricky_data)
        # Stored byte for byte as sent (the indentation too), not serialised again.
        raw_sub = await session(relay, admin(creds))
        await raw_sub.send(json.dumps({"op": "subscribe", "id": 2, "topic": "raw", "from": "earliest"}))
        raw = ""
        while pretty not in raw:
            raw = await asyncio.wait_for(raw_sub.recv(), TIMEOUT)
        assert tricky in raw
        assert [e["id"] for e in got] == ["pretty", "tricky", "good", "esc"]  # never the invalid one
    run(go())


def test_sessions_end_when_their_token_expires(relay, creds):
    """A token valid only thanks to the 30 s clock-skew leeway expires about 10 s into the
    session (room for a slow connect on a busy machine): the relay closes idle and
    listen-only sessions too, with 4001."""
    async def go():
        now = int(time.time())
        short = creds.forge({"sub": "brief", "scope": ["admin"], "exp": now - 20})
        v1 = await session(relay, short)
        await request(v1, {"op": "subscribe", "id": 1, "topic": "exp", "from": "latest"})
        ce = await connect(relay, short, path="/ce/exp", subprotocol="cloudevents.json")
        m = await asyncio.wait_for(v1.recv(), 25)
        assert json.loads(m)["code"] == "token_expired"
        for ws in (v1, ce):
            with pytest.raises(websockets.ConnectionClosed) as c:
                await asyncio.wait_for(ws.recv(), 25)
            assert c.value.code == 4001
    run(go())
    assert metric(https_get(relay, "/metrics"), "diaspora_relay_token_expiries_total") == 2


def test_sighup_loads_a_renewed_certificate_and_keeps_the_old_on_a_bad_one(tmp_path):
    """A certificate renewed on disk is served to new connections after a SIGHUP, without a
    restart, and sessions opened before it go on; files that cannot be used (a key that
    does not match) are refused with a message and the relay keeps serving the previous
    certificate. /metrics carries the served certificate's expiry and the reloads."""
    creds = Credentials(tmp_path / "creds")
    first = creds.renew_server_cert(3600)
    relay = RelayProcess(creds, tmp_path / "data").start()

    def served_not_after() -> float:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=TIMEOUT) as raw:
            with creds.client_ssl().wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                return ssl.cert_time_to_seconds(tls.getpeercert()["notAfter"])

    def metrics(name):
        return metric(https_get(relay, "/metrics"), name)

    try:
        assert served_not_after() == first
        assert metrics("diaspora_relay_tls_certificate_expiry_seconds") == first
        assert metrics("diaspora_relay_tls_reloads_total") == 0

        async def go():
            ws = await session(relay, creds.token("admin"), producer_id="p")
            assert (await publish(ws, "t", 0, [event(0)]))["op"] == "ack"
            second = creds.renew_server_cert(7200)
            relay.reload()
            wait_until(lambda: metrics("diaspora_relay_tls_reloads_total") == 1, what="the reload")
            assert served_not_after() == second
            assert metrics("diaspora_relay_tls_certificate_expiry_seconds") == second
            assert (await publish(ws, "t", 1, [event(1)]))["op"] == "ack"  # the session opened before

            creds.renew_server_cert(9000, key_of=creds.certs / "client-key.pem")
            relay.reload()
            wait_until(lambda: "still serving the previous certificate" in relay.log.read_text(), what="the refusal")
            assert "key values mismatch" in relay.log.read_text()  # OpenSSL's words
            assert served_not_after() == second
            assert metrics("diaspora_relay_tls_reloads_total") == 1
            assert (await publish(ws, "t", 2, [event(2)]))["op"] == "ack"
        run(go())
    finally:
        relay.stop_cleanly()


# ---- limits on what one connection can make the relay hold ----------------------------------

def test_a_client_that_never_reads_its_replies_is_no_longer_read(relay, creds):
    """Replies queued unread are bounded (1 MiB): the relay then stops reading the
    connection, so a client that only sends stalls instead of growing the relay's memory.
    Without the bound, all 300,000 pings (about 90 MB of replies) would be accepted; with
    it, the client stalls once the kernel's socket buffers on both sides are full too
    (after 30-40 MB here)."""
    async def go():
        tok = admin(creds)
        ws = await session(relay, tok, max_queue=1, read_limit=2**16, write_limit=2**16)
        frame = json.dumps({"op": "ping", "id": "p" * 250})
        sent, stalled = 0, False
        while sent < 300000:
            try:
                await asyncio.wait_for(ws.send(frame), 3)
            except asyncio.TimeoutError:
                stalled = True
                break
            sent += 1
        assert stalled, f"the relay kept reading: {sent} pings sent without reading a reply"
        # The relay serves everyone else meanwhile.
        ok = await session(relay, tok)
        assert (await request(ok, {"op": "ping", "id": 1})) == {"op": "pong", "id": 1}
    run(go())


def test_request_limits_get_documented_errors(relay, creds):
    async def go():
        ws = await session(relay, admin(creds))
        r = await request(ws, {"op": "ping", "id": "i" * 300})
        assert r["code"] == "bad_request" and "ref" not in r
        r = await request(ws, {"op": "x" * 10000})
        assert r["code"] == "unknown_op" and len(r["message"]) < 200
        r = await request(ws, {"op": "subscribe", "id": 1, "topic": "a*" + "b" * 300})
        assert r["code"] == "bad_topic" and r["ref"] == 1 and len(r["message"]) < 300
        r = await request(ws, {"op": "subscribe", "id": 2, "topic": "bad pattern*"})
        assert r["code"] == "bad_topic"
        r = await request(ws, {"op": "subscribe", "id": "s" * 300, "topic": "t"})
        assert r["code"] == "bad_request" and "ref" not in r
        nack = await publish(ws, "t", "q" * 1000, [event(1)])
        assert nack["op"] == "nack" and nack["seq"] is None
        for i in range(256):
            await ws.send(json.dumps({"op": "subscribe", "id": i, "topic": f"t{i}"}))
        replies = [await recv(ws) for _ in range(256)]
        assert all(r["op"] == "subscribed" for r in replies)
        r = await request(ws, {"op": "subscribe", "id": 256, "topic": "one.more"})
        assert r["code"] == "bad_request" and "256 subscriptions" in r["message"]
        assert (await request(ws, {"op": "unsubscribe", "id": 0}))["op"] == "unsubscribed"
        assert (await request(ws, {"op": "subscribe", "id": 256, "topic": "one.more"}))["op"] == "subscribed"
        # cloudevents.json: ?from= must be earliest, latest or an offset.
        for bad in ("-1", "abc", "12x"):
            with pytest.raises(websockets.InvalidStatusCode) as e:
                await connect(relay, admin(creds), path=f"/ce/ce.from?from={bad}", subprotocol="cloudevents.json")
            assert e.value.status_code == 400, bad
        ce = await connect(relay, admin(creds), path="/ce/ce.from?from=0", subprotocol="cloudevents.json")
        await ce.send(b"\x00binary")
        with pytest.raises(websockets.ConnectionClosed) as c:
            await asyncio.wait_for(ce.recv(), 20)
        assert c.value.code == 1003
    run(go())


def test_a_connection_without_hello_is_closed_after_10_s(relay, creds):
    async def go():
        ws = await connect(relay, None)
        t0 = time.monotonic()
        m = json.loads(await asyncio.wait_for(ws.recv(), 20))
        assert m["code"] == "hello_required" and "10 s" in m["message"]
        with pytest.raises(websockets.ConnectionClosed) as c:
            await asyncio.wait_for(ws.recv(), 20)
        assert c.value.code == 4001
        # Not before the 10 s (measured from after the upgrade, which the relay's clock
        # starts at); the upper bound only catches a relay that never closes, with room for
        # a busy 2-core machine.
        assert 9 < time.monotonic() - t0 < 30
    run(go())


def test_a_latest_only_subscription_gets_the_newest_event_and_says_how_many_it_passed_over(creds, tmp_path):
    """For dashboards (docs/protocol.md, subscribe): each delivery is the newest record only,
    the frame saying how many older ones it passed over; later events still arrive."""
    relay = RelayProcess(creds, tmp_path / "data").start()
    try:
        async def go():
            ws = await session(relay, admin(creds))
            assert (await publish(ws, "dash", 0, [event(i) for i in range(150)]))["op"] == "ack"
            assert (await publish(ws, "dash", 1, [event(i) for i in range(150, 200)]))["op"] == "ack"
            sub = await session(relay, admin(creds))
            bad = await request(sub, {"op": "subscribe", "id": "x", "topic": "dash", "latest_only": "yes"})
            assert bad["op"] == "error" and bad["code"] == "bad_request", bad
            await sub.send(json.dumps({"op": "subscribe", "id": "d", "topic": "dash", "from": "earliest", "latest_only": True}))
            m = await recv(sub)
            while m["op"] != "events":
                m = await recv(sub)
            assert [e["offset"] for e in m["events"]] == [199] and m["skipped"] == 199 and m["next_offset"] == 200, m
            assert (await publish(ws, "dash", 2, [event("late")]))["op"] == "ack"
            m = await recv(sub)
            assert [e["event"]["id"] for e in m["events"]] == ["late"] and "skipped" not in m, m
        run(go())
    finally:
        relay.stop_cleanly()


def test_a_subscription_with_a_max_rate_is_paced_and_gets_everything(creds, tmp_path):
    """max_rate (records/s): 100 events waiting, a subscriber at 40/s gets at most its
    first delivery plus the rate in its first second (a loaded machine only delivers fewer),
    and every event in the end, in order."""
    relay = RelayProcess(creds, tmp_path / "data").start()
    try:
        async def go():
            ws = await session(relay, admin(creds))
            assert (await publish(ws, "paced", 0, [event(i) for i in range(100)]))["op"] == "ack"
            sub = await session(relay, admin(creds))
            bad = await request(sub, {"op": "subscribe", "id": "x", "topic": "paced", "max_rate": 0})
            assert bad["op"] == "error" and bad["code"] == "bad_request" and "max_rate" in bad["message"], bad
            await sub.send(json.dumps({"op": "subscribe", "id": "p", "topic": "paced", "from": "earliest", "max_rate": 40}))
            got, t0, first_second = [], asyncio.get_running_loop().time(), None
            while len(got) < 100:
                m = await recv(sub)
                if m["op"] == "events":
                    got += [e["offset"] for e in m["events"]]
                if first_second is None and asyncio.get_running_loop().time() - t0 >= 1.0:
                    first_second = len(got)
            return got, first_second, asyncio.get_running_loop().time() - t0
        got, first_second, took = run(go())
        assert got == list(range(100))
        assert first_second is not None and first_second <= 4 + 40 + 10, first_second  # first delivery + 1 s at 40/s (+slack)
        assert took >= 1.5, took  # 100 at 40/s: about 2.4 s, never much less
    finally:
        relay.stop_cleanly()
