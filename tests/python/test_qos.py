"""Quality of service on a relay connection (docs/streaming.md#quality-of-service): a
subscriber's frames are written by class, control first. Measured from the relay's own
timestamps (each record's append time to its frame handed to the socket, the
diaspora_relay_delivery_lag_seconds histogram), the same flood with QoS on and off."""
from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time

import pytest

from relay_harness import DIASPORA, Credentials, RelayProcess, connect, event, https_get, request, run, session


@pytest.fixture(scope="module")
def creds(tmp_path_factory):
    return Credentials(tmp_path_factory.mktemp("creds"))


def admin(creds):
    return creds.token("admin")


FLOOD = 20_000      # telemetry events waiting for the subscriber (about 10 MB)
PER_FRAME = 100     # events per delivery frame (limits.delivery_batch_events)


def lag_of(metrics: str, cls: str) -> tuple[float, int]:
    """The delivery-lag histogram's sum (s) and count for a class."""
    s = re.search(r'^diaspora_relay_delivery_lag_seconds_sum\{class="%s"\} (\S+)$' % cls, metrics, re.M)
    c = re.search(r'^diaspora_relay_delivery_lag_seconds_count\{class="%s"\} (\S+)$' % cls, metrics, re.M)
    assert s and c, metrics
    return float(s.group(1)), int(c.group(1))


def flood_then_act(creds, tmp_path, enabled: bool) -> tuple[float, int, int]:
    """A telemetry backlog for a subscriber that reads one frame every 20 ms; an action is
    appended on the control topic while the subscriber works through it. Returns the
    action's delivery lag by the relay's clock, the telemetry frames the subscriber read
    before the action, and the telemetry frames it read in all."""
    relay = RelayProcess(creds, tmp_path / ("qos" if enabled else "fifo"), config={
        "qos": {"enabled": enabled, "report_interval": "1s", "congested_wait_ms": 200},
        "limits": {"delivery_batch_events": PER_FRAME}}).start()
    try:
        async def go():
            pub = await session(relay, admin(creds))
            pad = "x" * 400
            for b in range(FLOOD // 1000):
                batch = [event(f"m{b}-{i}", type_="org.example.metric", data={"v": i, "pad": pad}) for i in range(1000)]
                assert (await request(pub, {"op": "publish", "topic": "wf.telemetry", "seq": b, "events": batch}))["op"] == "ack"
            # max_queue=1: the test's client buffers one frame; the relay's queues hold the rest.
            sub = await session(relay, admin(creds), max_queue=1)
            for sid, topic in (("t", "wf.telemetry"), ("c", "wf.control.engine-1")):
                await sub.send(json.dumps({"op": "subscribe", "id": sid, "topic": topic, "from": "earliest"}))
            frames = before = 0
            acted = False
            while True:
                m = json.loads(await asyncio.wait_for(sub.recv(), 30))
                if m["op"] != "events":
                    continue
                if m["id"] == "c":
                    assert [e["event"]["id"] for e in m["events"]] == ["act-1"], m
                    before = frames
                    break
                frames += 1
                if frames == 5 and not acted:  # the flood is under way: an operator acts
                    acted = True
                    action = event("act-1", type_="org.example.action")
                    assert (await request(pub, {"op": "publish", "topic": "wf.control.engine-1", "seq": 0,
                                                "events": [action]}))["op"] == "ack"
                await asyncio.sleep(0.02)
            while frames < FLOOD // PER_FRAME:  # the rest of the flood still arrives
                m = json.loads(await asyncio.wait_for(sub.recv(), 30))
                frames += m["op"] == "events"
            # Congestion as a signal: the subscriber's connection was said degraded while
            # its telemetry waited (read at 50 frames/s, 32 queued), then up once it cleared.
            mon = await session(relay, admin(creds))
            await mon.send(json.dumps({"op": "subscribe", "id": "r", "topic": "relay.events", "from": "earliest"}))
            states = []
            while "up" not in [st for st, _ in states]:
                m = json.loads(await asyncio.wait_for(mon.recv(), 15))
                for e in m.get("events", []):
                    d = e["event"]["data"]
                    assert e["event"]["type"] == "org.diaspora.resource.status" and d["kind"] == "link", e
                    if d["resource_id"].startswith("connection/pytest@"):
                        states.append((d["state"], d["metrics"]))
            degraded = [mt for st, mt in states if st == "degraded"]
            assert degraded and states[-1][0] == "up", states
            assert max(mt["wait_max_s_telemetry"] for mt in degraded) > 0.2, degraded
            return before, frames
        before, frames = run(go())
        # The views hold it as a resource of the workflow "relay" (the console's resources).
        deadline = time.monotonic() + 15
        while True:
            items = json.loads(https_get(relay, "/api/v1/views/resources?workflow=relay", admin(creds)))["items"]
            mine = [r for r in items if r["resource_id"].startswith("connection/pytest@")]
            if (mine and mine[0]["state"] == "up") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert mine and mine[0]["kind"] == "link" and mine[0]["state"] == "up", items
        assert "wait_max_s_telemetry" in mine[0]["metrics"], mine
        lag, count = lag_of(https_get(relay, "/metrics", admin(creds)), "control")
        assert count == 1, count  # the action, once
        return lag, before, frames
    finally:
        relay.stop_cleanly()


def test_a_telemetry_flood_does_not_delay_a_control_action(creds, tmp_path):
    fifo_lag, fifo_before, fifo_frames = flood_then_act(creds, tmp_path, enabled=False)
    qos_lag, qos_before, qos_frames = flood_then_act(creds, tmp_path, enabled=True)
    print(f"action's delivery lag: one FIFO {fifo_lag * 1e3:.0f} ms ({fifo_before} telemetry frames read first), "
          f"by class {qos_lag * 1e3:.0f} ms ({qos_before} first)")
    assert fifo_frames == qos_frames == FLOOD // PER_FRAME  # nothing dropped either way
    # One FIFO: the action waits behind every frame queued ahead of it, the relay's queue
    # (limits.subscriber_queue_frames, 32) and what the sockets hold: the flood congested it.
    assert fifo_before >= 32, fifo_before
    # By class: it waits for the frame being written (and what the sockets hold) only.
    assert qos_lag * 3 < fifo_lag, (qos_lag, fifo_lag)
    assert qos_before * 2 < fifo_before, (qos_before, fifo_before)


def test_a_bad_qos_configuration_is_refused_with_its_line(tmp_path):
    cfg = tmp_path / "relay.yaml"
    cfg.write_text("listen: 127.0.0.1:0\nqos:\n  classes:\n    - {topics: 'beam.*', class: urgent}\n"
                   "  weights: {bulk: 0}\n  notsent_lowat: lots\n")
    p = subprocess.run([str(DIASPORA.parent / "diaspora-relay"), "--config", str(cfg)], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 2, p.stderr
    assert f"{cfg}:4:" in p.stderr and "must be control, lifecycle, telemetry or bulk" in p.stderr, p.stderr
    assert f"{cfg}:5:" in p.stderr and "qos.weights.bulk: must be >= 1" in p.stderr, p.stderr
    assert f"{cfg}:6:" in p.stderr and "qos.notsent_lowat: must be a size" in p.stderr, p.stderr


def test_bulk_is_paced_to_the_rate_a_subscriber_asks_for_and_nothing_else_is(creds, tmp_path):
    """hello's bulk_rate (bytes/s): a site on a slow link has bulk frames paced to a share of
    it. 6 MiB of chunks at 3 MB/s take about 2 s to arrive (pacing only adds time, so this
    holds on a loaded machine), while an event on a lifecycle topic put in the middle of them
    arrives before the bulk that was queued ahead of it."""
    from data_items import decode_delivered, put_item
    relay = RelayProcess(creds, tmp_path / "paced").start()
    try:
        async def go():
            pub = await session(relay, admin(creds))
            data = bytes(range(256)) * (6 * 4096)  # 6 MiB
            assert (await put_item(pub, "wf.data", 0, data, "scan-1", chunk=64 * 1024))["op"] == "ack"
            bad = await connect(relay, admin(creds))
            m = await request(bad, {"op": "hello", "client_id": "slow-site", "bulk_rate": -1})
            assert m["op"] == "error" and m["code"] == "bad_request" and "bulk_rate" in m["message"], m
            sub = await connect(relay, admin(creds))
            assert (await request(sub, {"op": "hello", "client_id": "slow-site", "bulk_rate": 3e6}))["op"] == "welcome"
            for sid, topic in (("d", "wf.data"), ("e", "wf.events")):
                await sub.send(json.dumps({"op": "subscribe", "id": sid, "topic": topic, "from": "earliest"}))
            loop = asyncio.get_running_loop()
            t0, chunks, event_after = loop.time(), 0, None
            while chunks < 96 or event_after is None:
                frame = await asyncio.wait_for(sub.recv(), 30)
                if isinstance(frame, bytes):
                    assert decode_delivered(frame)["index"] == chunks
                    chunks += 1
                    if chunks == 8:  # the pace holds the rest back: a lifecycle event goes ahead of them
                        assert (await request(pub, {"op": "publish", "topic": "wf.events", "seq": 1,
                                                    "events": [event("started")]}))["op"] == "ack"
                    continue
                m = json.loads(frame)
                if m["op"] == "events" and m["id"] == "e":
                    event_after = chunks
            return loop.time() - t0, event_after
        took, event_after = run(go())
        print(f"paced: {took:.2f} s, the event after chunk {event_after}")
        assert took >= 1.6, took  # 6.3 MB at 3 MB/s, less the first burst
        assert event_after < 40, event_after  # not behind the 88 chunks still to come
    finally:
        relay.stop_cleanly()
