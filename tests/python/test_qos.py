"""Quality of service on a relay connection (docs/streaming.md#quality-of-service): a
subscriber's frames are written by class, control first. Measured from the relay's own
timestamps (each event's append time, `stamps` on the subscription, to its arrival on the
same clock), the same flood with QoS on and off."""
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
                await sub.send(json.dumps({"op": "subscribe", "id": sid, "topic": topic, "from": "earliest", "stamps": True}))
            frames = before = 0
            acted = False
            while True:
                m = json.loads(await asyncio.wait_for(sub.recv(), 30))
                if m["op"] != "events":
                    continue
                if m["id"] == "c":
                    assert [e["event"]["id"] for e in m["events"]] == ["act-1"], m
                    before = frames
                    reached = time.time() - m["events"][0]["appended_us"] / 1e6  # by the relay's stamp, same clock
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
            if not enabled:
                return before, frames, reached
            # Congestion as a signal: the subscriber's connection was said degraded while
            # its telemetry waited (read at 50 frames/s, 32 queued), then up once it cleared.
            # (Over one FIFO the kernel's socket buffers hold much of the backlog, out of the
            # relay's sight: TCP_NOTSENT_LOWAT keeps it in the relay's queues.)
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
            return before, frames, reached
        before, frames, reached = run(go())
        # The views hold it as a resource of the workflow "relay" (the console's resources).
        deadline = time.monotonic() + 15
        while enabled:
            items = json.loads(https_get(relay, "/api/v1/views/resources?workflow=relay", admin(creds)))["items"]
            mine = [r for r in items if r["resource_id"].startswith("connection/pytest@")]
            if (mine and mine[0]["state"] == "up") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if enabled:
            assert mine and mine[0]["kind"] == "link" and mine[0]["state"] == "up", items
            assert "wait_max_s_telemetry" in mine[0]["metrics"], mine
        lag, count = lag_of(https_get(relay, "/metrics", admin(creds)), "control")
        assert count == 1, count  # the action, once
        return lag, reached, before, frames
    finally:
        relay.stop_cleanly()


def test_a_telemetry_flood_does_not_delay_a_control_action(creds, tmp_path):
    fifo_lag, fifo_reached, fifo_before, fifo_frames = flood_then_act(creds, tmp_path, enabled=False)
    qos_lag, qos_reached, qos_before, qos_frames = flood_then_act(creds, tmp_path, enabled=True)
    print(f"the action reached the subscriber {fifo_reached * 1e3:.0f} ms after the relay appended it over one FIFO "
          f"({fifo_before} telemetry frames read first; in the relay's queue {fifo_lag * 1e3:.0f} ms), by class "
          f"{qos_reached * 1e3:.0f} ms ({qos_before} first; {qos_lag * 1e3:.0f} ms)")
    assert fifo_frames == qos_frames == FLOOD // PER_FRAME  # nothing dropped either way
    # One FIFO: the action waits behind every frame queued ahead of it, the relay's queue
    # (limits.subscriber_queue_frames, 32) and what the sockets hold: the flood congested it.
    assert fifo_before >= 32, fifo_before
    # By class: it waits for the frame being written and what the sockets hold only. From the
    # relay's append (its stamp) to the subscriber, and in frames read before it:
    assert qos_reached * 2 < fifo_reached, (qos_reached, fifo_reached)
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
            bad = await connect(relay, admin(creds))
            m = await request(bad, {"op": "hello", "client_id": "slow-site", "task": "t" * 257})
            assert m["op"] == "error" and m["code"] == "bad_request" and "task" in m["message"], m
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


def test_a_late_item_is_dropped_where_its_class_says_so_and_kept_elsewhere(creds, tmp_path):
    """qos.drop_late: [bulk]: an item on a bulk topic stored past its itemdeadline is nacked
    'late' and nothing of it is stored (a frame nobody can use any more); on a lifecycle
    topic the same item is stored and its ack says late."""
    from data_items import put_item
    relay = RelayProcess(creds, tmp_path / "late", config={"qos": {"drop_late": ["bulk"]}}).start()
    try:
        async def go():
            ws = await session(relay, admin(creds), producer_id="det")
            past = "2020-01-01T00:00:00Z"
            dropped = await put_item(ws, "beam.data", 1, b"x" * 70000, "f1", chunk=32768, itemdeadline=past)
            assert dropped["op"] == "nack" and dropped["code"] == "late" and "drop_late" in dropped["message"], dropped
            kept = await put_item(ws, "beam.events", 2, b"x" * 70000, "f2", chunk=32768, itemdeadline=past)
            assert kept["op"] == "ack" and kept["late"] is True, kept
            on_time = await put_item(ws, "beam.data", 3, b"y" * 10, "f3", itemdeadline="2100-01-01T00:00:00Z")
            assert on_time["op"] == "ack" and on_time["first_offset"] == 0, on_time  # nothing of f1 before it
        run(go())
        metrics = https_get(relay, "/metrics", admin(creds))
        assert "diaspora_relay_items_dropped_late_total 1" in metrics and "diaspora_relay_items_late_total 1" in metrics
    finally:
        relay.stop_cleanly()


def test_a_workflow_spec_declares_the_embedded_relays_classes(tmp_path):
    """relay.qos in a workflow spec: the embedded relay's classes (diaspora run hands them to
    it); a relay at a wss:// URL, or a site's relay, takes its classes from its relay.yaml,
    and the spec says so with the line."""
    spec = tmp_path / "wf.yaml"
    body = ("version: 1\nname: qs\nrelay:\n  url: {url}\n  qos:\n    classes:\n      - {{topics: 'qs.frames', class: {cls}}}\n"
            "    drop_late: [bulk]\nsites:\n  - {{name: a, engine: local}}\ntasks:\n  - {{name: t, kind: sleep}}\n")
    validate = lambda: subprocess.run([str(DIASPORA), "validate", str(spec)], capture_output=True, text=True, timeout=30)  # noqa: E731
    spec.write_text(body.format(url="embedded", cls="bulk"))
    p = validate()
    assert p.returncode == 0, p.stdout + p.stderr
    spec.write_text(body.format(url="embedded", cls="urgent"))
    p = validate()
    assert p.returncode != 0 and f"{spec}:7:" in p.stderr and "must be control, lifecycle, telemetry or bulk" in p.stderr, p.stderr
    spec.write_text(body.format(url="wss://relay.example.org:7443", cls="bulk"))
    p = validate()
    assert p.returncode != 0 and f"{spec}:6:" in p.stderr and "qos is for the embedded relay" in p.stderr, p.stderr
    spec.write_text(body.format(url="embedded", cls="bulk").replace("    drop_late: [bulk]\n",
                                                                     "    drop_late: [bulk]\n    report_interval: 500ms\n"))
    p = validate()
    assert p.returncode != 0 and "relay.qos.report_interval: must be whole seconds from 1s to 1h" in p.stderr, p.stderr


def test_a_backlog_on_one_subscription_does_not_starve_another_of_the_same_class(creds, tmp_path):
    """Two subscriptions of one connection, the same class: the first (in the relay's order)
    has 200 frames waiting; an event on the second gets the next free slot of the queue in
    turn (round robin), not after the whole backlog."""
    relay = RelayProcess(creds, tmp_path / "fair", config={"limits": {"delivery_batch_events": PER_FRAME}}).start()
    try:
        async def go():
            pub = await session(relay, admin(creds))
            for b in range(FLOOD // 1000):
                batch = [event(f"a{b}-{i}", data={"pad": "x" * 400}) for i in range(1000)]
                assert (await request(pub, {"op": "publish", "topic": "aa.backlog", "seq": b, "events": batch}))["op"] == "ack"
            sub = await session(relay, admin(creds), max_queue=1)
            for topic in ("aa.backlog", "bb.quiet"):
                await sub.send(json.dumps({"op": "subscribe", "id": topic, "topic": topic, "from": "earliest"}))
            frames = 0
            while True:
                m = json.loads(await asyncio.wait_for(sub.recv(), 30))
                if m["op"] != "events":
                    continue
                if m["id"] == "bb.quiet":
                    return frames
                frames += 1
                if frames == 5:
                    assert (await request(pub, {"op": "publish", "topic": "bb.quiet", "seq": 0,
                                                "events": [event("started")]}))["op"] == "ack"
                await asyncio.sleep(0.02)
        before = run(go())
        print(f"the quiet subscription's event came after {before} frames of the backlog")
        assert before < 120, before  # the whole backlog is 200 frames
    finally:
        relay.stop_cleanly()


def samples_ahead_of_a_task_event(creds, tmp_path, coalesce: str) -> tuple[int, int, int]:
    """An engine reports through the plugin to a relay that stops taking its batches
    (SIGSTOP: the window of 2 unacked batches stays full), then 20,000 samples of 10 metric
    series and a task event, then the relay goes on. Returns the metric events stored ahead
    of the task event, the samples they stand for in all (their counts), and the plugin's
    metrics_coalesced."""
    import signal
    import sys
    from pathlib import Path
    from relay_harness import REPO, relay_events, write_spec
    sys.path.insert(0, str(REPO / "engine-adapters" / "python"))
    import diaspora

    tmp = tmp_path / coalesce
    tmp.mkdir()
    relay = RelayProcess(creds, tmp / "relay").start()
    token = creds.token("publish:*", "subscribe:*")
    (tmp / "token").write_text(token + "\n")
    spec = write_spec(tmp, creds, tmp / "token", relay.port, max_inflight=2, coalesce=coalesce,
                      batch={"max_events": 100})
    try:
        with diaspora.Plugin.open(spec) as p:
            p.submitted("t1", site="local")
            assert p.wait_acked(30)
            relay.proc.send_signal(signal.SIGSTOP)
            try:
                for i in range(1000):  # two batches fill the window; the rest waits in the queue
                    p.metric("site", "local", "fill", i)
                time.sleep(0.3)  # the window has been full for over 50 ms: congested
                for i in range(20_000):
                    p.metric("site", "local", f"load{i % 10}", i)
                p.started("t1", site="local", worker="w0")
                coalesced = p.stats()["metrics_coalesced"]
            finally:
                relay.proc.send_signal(signal.SIGCONT)
            assert p.wait_acked(60), (p.stats(), p.last_error())
        events = relay_events(relay, token, 2)
    finally:
        relay.stop_cleanly()
    started = next(i for i, e in enumerate(events) if e["type"] == "org.diaspora.task.started")
    ahead = sum(1 for e in events[:started] if e["type"] == "org.diaspora.metric")
    represented = sum(e["data"].get("count", 1) for e in events if e["type"] == "org.diaspora.metric")
    return ahead, represented, coalesced


def test_samples_flooding_a_congested_link_are_coalesced_not_queued_ahead_of_task_events(creds, tmp_path):
    """plugin.coalesce (docs/plugin.md): while the window of unacked batches is full a
    metric sample takes its series' coalescing slot (the newest value wins, counted) instead
    of a place in the queue, so a task event reported after a flood of samples is not stored
    behind them; with queue_full (every sample queued while there is room) it is. Nothing is
    lost either way: the stored samples' counts add up to every sample reported."""
    fifo_ahead, fifo_all, fifo_coalesced = samples_ahead_of_a_task_event(creds, tmp_path, "queue_full")
    ahead, represented, coalesced = samples_ahead_of_a_task_event(creds, tmp_path, "congested")
    print(f"metric events stored ahead of the task event: {fifo_ahead} with queue_full, {ahead} congested "
          f"({coalesced} samples coalesced)")
    assert fifo_all == represented == 21_000
    assert fifo_coalesced == 0 and fifo_ahead == 21_000
    assert coalesced >= 19_000 and ahead <= 1_000 + 10 + 20_000 - coalesced, (ahead, coalesced)


SLOW_CONSUMER = r'''
"""A consumer of the run's relay that falls behind: it names its task in hello, puts a
backlog of 10,000 telemetry events on <prefix>.telemetry and subscribes to it without
reading (its first attempt only: moved, it reads and ends)."""
import asyncio, json, os, ssl, sys, time
import websockets

async def main():
    if os.environ["DIASPORA_ATTEMPT"] != "1":
        return
    token = open(os.environ["DIASPORA_RELAY_TOKEN_FILE"]).read().strip()
    ctx = ssl.create_default_context(cafile=os.environ["DIASPORA_RELAY_CA"])
    async def session(**kw):
        ws = await websockets.connect(os.environ["DIASPORA_RELAY_URL"] + "/v1", ssl=ctx, subprotocols=["diaspora.v1"],
                                      max_size=2**26, **kw)
        await ws.send(json.dumps({"op": "hello", "client_id": "slow-consumer", "token": token,
                                  "site": os.environ["DIASPORA_SITE"], "task": os.environ["DIASPORA_TASK_ID"]}))
        assert json.loads(await ws.recv())["op"] == "welcome"
        return ws
    pub = await session()
    pad = "x" * 1000
    for b in range(10):
        events = [{"specversion": "1.0", "id": f"m{b}-{i}", "source": "/slow", "type": "org.example.metric",
                   "data": {"pad": pad}} for i in range(1000)]
        await pub.send(json.dumps({"op": "publish", "topic": "cq.telemetry", "seq": b, "events": events}))
        assert json.loads(await pub.recv())["op"] == "ack"
    sub = await session(max_queue=1, read_limit=2**12)
    await sub.send(json.dumps({"op": "subscribe", "id": "t", "topic": "cq.telemetry", "from": "earliest"}))
    await asyncio.sleep(120)  # never reads: the relay's queues for it fill

asyncio.run(main())
'''


def test_a_congested_consumer_is_a_policy_signal_that_moves_it(tmp_path):
    """task.link_wait (docs/run.md, "Congested consumers"): the embedded relay reports a
    consumer that stopped reading (its client named its task in hello) on <prefix>.links;
    the run turns it into that task's link_wait and a policy migrates the task."""
    import sys
    import run_harness as rn
    script = tmp_path / "slow_consumer.py"
    script.write_text(SLOW_CONSUMER)
    spec = rn.write_spec(tmp_path, f"""version: 1
name: cq
defaults: off
relay: {{url: embedded, qos: {{report_interval: 1s}}}}
sites:
  - {{name: a, engine: local, workers: 1}}
  - {{name: b, engine: local, workers: 1}}
tasks:
  - name: consume
    command: "{sys.executable} {script}"
    preferred_sites: [a]
policies:
  - name: move-slow-consumer
    signal: task.link_wait
    detector: threshold
    threshold: 0.5
    for: 1
    action: migrate
    targets: [consume]
    to_sites: [b]
    max_attempts: 1
""")
    out = tmp_path / "out"
    p = rn.run(spec, out, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = rn.report(out)
    inst = rn.instance(rep, "consume.0")
    assert inst["state"] == "completed" and [a["site"] for a in inst["attempts"]] == ["a", "b"], inst["attempts"]
    moved = rn.actions(rep, "migrate")
    assert moved and moved[0]["task"] == "consume.0" and moved[0]["outcome"] == "done", rep["actions"]
    links = [e["data"] for e in rn.stored_events(out, "cq.links", None) if e["type"] == "org.diaspora.resource.status"]
    congested = [d for d in links if d["state"] == "degraded"]
    assert congested and congested[0]["task_id"].startswith("consume.0") and congested[0]["site"] == "a", links
    assert congested[0]["metrics"]["paused"] == 1 or congested[0]["metrics"]["wait_max_s_telemetry"] > 0.5, congested[0]
