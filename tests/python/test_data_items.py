"""Data items through the relay (docs/streaming.md), against a real relay on 127.0.0.1 with
real TLS: items of 1 B to 64 MiB round-trip with their checksums, in offset order with the
events around them; refusals (checksum, order, size, backlog, an unknown version) write
nothing; a consumer resumes in the middle of an item after the relay is SIGKILLed; an item
stored after its deadline is said late; the same on a relay whose store is NATS JetStream."""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random

import pytest

from data_items import CHUNK, ItemReader, answer, item_event, put_chunk, put_item, send_item
from relay_harness import (DIASPORA, Credentials, NatsServer, RelayProcess, event, https_get, metric, recv, request,
                           run, session, sh, stop_all)

SANITIZED = bool(os.environ.get("DIASPORA_SANITIZED"))


def write_lines(path, events) -> str:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return str(path)


def blob(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


@pytest.fixture
def relay(tmp_path):
    creds = Credentials(tmp_path / "creds")
    r = RelayProcess(creds, tmp_path / "data", config={"limits": {"max_item_bytes": 80 << 20,
                                                                  "max_pending_item_bytes": 160 << 20}}).start()
    yield r
    stop_all([r], [])


def next_offset(relay, token, topic) -> int:
    return json.loads(https_get(relay, f"/api/v1/topics/{topic}", token))["next_offset"]


def test_items_of_1_byte_to_64_mib_round_trip_in_order_with_the_events_around_them(relay):
    token = relay.creds.token("admin")
    sizes = [1, 1000, CHUNK, CHUNK + 1, 5 * CHUNK - 7, 0] + ([16 << 20] if SANITIZED else [64 << 20])
    datas = [blob(n, i) for i, n in enumerate(sizes)]

    async def main():
        ws = await session(relay, token, producer_id="detector-0")
        seq = 0
        offsets = []
        for i, d in enumerate(datas):
            # An event before each item: the order of offsets holds across both.
            ack = await request(ws, {"op": "publish", "topic": "beam.data", "seq": seq, "events": [event(f"before-{i}")]})
            assert ack["op"] == "ack", ack
            seq += 1
            ack = await put_item(ws, "beam.data", seq, d, f"frame-{i}")
            assert ack["op"] == "ack" and ack["count"] == 1 + (len(d) + CHUNK - 1) // CHUNK, ack
            offsets.append(ack["first_offset"])
            seq += 1
        reader = ItemReader(await session(relay, token))
        await reader.ws.send(json.dumps({"op": "subscribe", "id": "r", "topic": "beam.data", "from": "earliest"}))
        items = await reader.until(len(datas), timeout=60)
        assert [it["data"] for it in items] == datas
        assert [it["offset"] for it in items] == offsets
        assert [e["id"] for _, e in reader.events] == [x for i in range(len(datas)) for x in (f"before-{i}", f"frame-{i}")]
        # A resend of the same put (a producer that lost its ack) writes nothing again.
        ack = await put_item(ws, "beam.data", seq - 1, datas[0], f"frame-{len(datas) - 1}")
        assert ack["op"] == "ack" and ack.get("duplicate_batch") is True and ack["count"] == 0, ack
        return reader.next_offset

    end = run(main())
    assert next_offset(relay, token, "beam.data") == end
    # The relay counts them; the browse API and the views pass the chunks over.
    assert metric(https_get(relay, "/metrics"), "diaspora_relay_items_total") == len(datas)
    page = json.loads(https_get(relay, "/api/v1/topics/beam.data/events?from=earliest&limit=100", token))
    assert [e["event"]["id"] for e in page["events"]][:4] == ["before-0", "frame-0", "before-1", "frame-1"]


def test_refused_items_write_nothing_and_say_why(relay):
    token = relay.creds.token("admin")
    d = blob(3 * CHUNK, 7)

    async def main():
        ws = await session(relay, token, producer_id="p")
        # A checksum that does not match the bytes.
        ev = item_event("bad-sum", d)
        ev["itemsha256"] = hashlib.sha256(b"other").hexdigest()
        await send_item(ws, "t.data", 1, ev, d)
        m = await answer(ws, 1)
        assert (m["op"], m["code"]) == ("nack", "checksum_mismatch"), m
        # Chunks out of order.
        ev = item_event("order", d)
        await ws.send(json.dumps({"op": "put", "topic": "t.data", "seq": 2, "event": ev}))
        await ws.send(put_chunk(2, 1, 3, d[CHUNK:2 * CHUNK]))
        m = await answer(ws, 2)
        assert (m["op"], m["code"]) == ("nack", "bad_item") and "chunk 0 was due" in m["message"], m
        # A chunk of an item never announced (or already refused).
        await ws.send(put_chunk(2, 2, 3, d[2 * CHUNK:]))
        m = await answer(ws, 2)
        assert (m["op"], m["code"]) == ("nack", "unknown_item"), m
        # More bytes than announced.
        ev = item_event("long", d[:CHUNK])
        await ws.send(json.dumps({"op": "put", "topic": "t.data", "seq": 3, "event": ev}))
        await ws.send(put_chunk(3, 0, 1, d[:CHUNK + 1]))
        m = await answer(ws, 3)
        assert (m["op"], m["code"]) == ("nack", "bad_item") and "does not fit" in m["message"], m
        # A frame of another version of the format names both versions.
        await ws.send(put_chunk(4, 0, 1, b"x", version=2))
        m = await recv(ws)
        assert m["op"] == "error" and m["code"] == "bad_request" and "version 2" in m["message"] and "version 1" in m["message"], m
        # Over the relay's max_item_bytes, and announced items beyond the backlog bound.
        m = await request(ws, {"op": "put", "topic": "t.data", "seq": 5, "event": item_event("huge", b"")
                               | {"itemsize": (80 << 20) + 1, "itemchunks": 400}})
        assert (m["op"], m["code"]) == ("nack", "item_too_large"), m
        big = {"itemsize": 80 << 20, "itemchunks": 320}
        for s in (6, 7):
            await ws.send(json.dumps({"op": "put", "topic": "t.data", "seq": s, "event": item_event(f"b{s}", b"") | big}))
        m = await request(ws, {"op": "put", "topic": "t.data", "seq": 8, "event": item_event("b8", b"") | big})
        assert (m["op"], m["code"]) == ("nack", "item_backlog"), m
        # Fields missing or wrong.
        ev = item_event("nosum", d)
        del ev["itemsha256"]
        m = await request(ws, {"op": "put", "topic": "t.data", "seq": 9, "event": ev})
        assert (m["op"], m["code"]) == ("nack", "bad_request") and "itemsha256" in m["message"], m
        m = await request(ws, {"op": "put", "topic": "t.data", "seq": 10, "event": item_event("few", d) | {"itemchunks": 0}})
        assert (m["op"], m["code"]) == ("nack", "bad_request") and "itemchunks" in m["message"], m
        # The connection still works: an item after all that is stored whole.
        ws2 = await session(relay, token, producer_id="q")
        ack = await put_item(ws2, "t.data", 1, d, "fine")
        assert ack["op"] == "ack" and ack["first_offset"] == 0, ack

    run(main())
    assert next_offset(relay, token, "t.data") == 4  # the one item that was whole: its event and 3 chunks


def test_a_consumer_resumes_in_the_middle_of_an_item_after_the_relay_is_sigkilled(relay):
    token = relay.creds.token("admin")
    d = blob(32 * CHUNK + 5, 11)

    async def main():
        ws = await session(relay, token, producer_id="p")
        ack = await put_item(ws, "scan.data", 1, d, "scan-1")
        assert ack["op"] == "ack", ack
        await ws.close()
        sub = await session(relay, token)
        await sub.send(json.dumps({"op": "subscribe", "id": 7, "topic": "scan.data", "from": "earliest"}))
        reader = ItemReader(sub)
        while reader.chunks < 10:
            await reader.read()
        got = list(reader._open["parts"])
        resume = reader.next_offset  # the next chunk's offset
        relay.kill()
        relay.start()
        sub = await session(relay, token)
        await sub.send(json.dumps({"op": "subscribe", "id": 8, "topic": "scan.data", "from": resume}))
        rest = ItemReader(sub)
        rest._open = {"offset": resume - 1 - len(got), "event": reader._open["event"], "parts": got}
        items = await rest.until(1)
        assert items[0]["data"] == d and rest.chunks == 33 - 10

    run(main())


def test_an_item_stored_after_its_deadline_is_said_late(relay):
    token = relay.creds.token("admin")

    async def main():
        ws = await session(relay, token)
        ack = await put_item(ws, "t.data", 1, b"abc", "old", itemdeadline="2020-01-01T00:00:00Z")
        assert ack["op"] == "ack" and ack.get("late") is True, ack
        ack = await put_item(ws, "t.data", 2, b"abc", "new", itemdeadline="2100-01-01T00:00:00Z")
        assert ack["op"] == "ack" and "late" not in ack, ack
        m = await request(ws, {"op": "put", "topic": "t.data", "seq": 3, "event": item_event("x", b"a") | {"itemdeadline": "soon"}})
        assert (m["op"], m["code"]) == ("nack", "bad_request") and "itemdeadline" in m["message"], m

    run(main())
    assert metric(https_get(relay, "/metrics"), "diaspora_relay_items_late_total") == 1


def test_items_through_a_relay_on_nats_jetstream(tmp_path):
    creds = Credentials(tmp_path / "creds")
    node = NatsServer(tmp_path / "nats").start()
    relay = RelayProcess(creds, tmp_path / "data", config={"storage": "jetstream", "jetstream": {
        "urls": [node.url], "replicas": 1}}).start()
    token = creds.token("admin")
    datas = [blob(n, n) for n in (1, CHUNK + 3, 4 << 20)]
    try:
        async def main():
            ws = await session(relay, token, producer_id="p")
            for i, d in enumerate(datas):
                ack = await put_item(ws, "js.data", i + 1, d, f"i{i}")
                assert ack["op"] == "ack", ack
            reader = ItemReader(await session(relay, token))
            await reader.ws.send(json.dumps({"op": "subscribe", "id": "r", "topic": "js.data", "from": "earliest"}))
            return [it["data"] for it in await reader.until(len(datas), timeout=60)]

        assert run(main()) == datas
    finally:
        stop_all([relay], [node])


def test_diaspora_put_and_get_move_a_file_through_the_relay(relay, tmp_path):
    """The CLI: `diaspora put` a file, `diaspora get` it back by the offset put printed,
    checked; what is at an offset that holds no item is named; a put the relay refuses
    says why."""
    token = relay.creds.token("admin")
    conn = ["--url", relay.url, "--ca", relay.creds.ca, "--token", token]
    src = tmp_path / "scan.bin"
    src.write_bytes(blob(3 * CHUNK + 17, 5))
    p = sh(DIASPORA, "put", *conn, "--topic", "cli.data", "--id", "scan-1", "--chunk-bytes", 100000, src)
    out = json.loads(p.stdout)
    assert out == {"topic": "cli.data", "offset": 0, "size": src.stat().st_size, "chunks": 8,
                   "sha256": hashlib.sha256(src.read_bytes()).hexdigest(), "uri": "diaspora://cli.data/0"}, out
    p = sh(DIASPORA, "get", *conn, out["uri"], "-o", tmp_path / "by-uri.bin")
    assert (tmp_path / "by-uri.bin").read_bytes() == src.read_bytes()
    p = sh(DIASPORA, "get", *conn, "diaspora://cli.data/x", "-o", tmp_path / "bad.bin", check=False)
    assert p.returncode == 2 and "not a data item's URI" in p.stderr, p.stderr
    # Put again with the same id (a retry after a lost ack): not written twice.
    p = sh(DIASPORA, "put", *conn, "--topic", "cli.data", "--id", "scan-1", "--chunk-bytes", 100000, src)
    assert json.loads(p.stdout).get("duplicate") is True, p.stdout
    sh(DIASPORA, "publish", *conn, "--topic", "cli.data", "--count", 1)  # an event after it, at offset 9
    back = tmp_path / "back.bin"
    p = sh(DIASPORA, "get", *conn, "--topic", "cli.data", "--offset", 0, "-o", back)
    assert back.read_bytes() == src.read_bytes()
    assert json.loads(p.stdout)["id"] == "scan-1"
    p = sh(DIASPORA, "get", *conn, "--topic", "cli.data", "--offset", 9, "-o", tmp_path / "no.bin", check=False)
    assert p.returncode == 2 and "announces no data item" in p.stderr, (p.returncode, p.stderr)
    assert not (tmp_path / "no.bin").exists()
    # `diaspora tail` on a topic with items prints its events and passes the chunks over.
    p = sh(DIASPORA, "tail", *conn, "--topic", "cli.data", "--from", "earliest", "--count", 2)
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    assert len(lines) == 2 and lines[0]["id"] == "scan-1" and "itemsize" not in lines[1], p.stdout
    # An item's event with no chunks after it (a put cut short and never completed, or one
    # published as a plain event): incomplete, not returned in part.
    forged = item_event("forged", b"abcdef", chunk=3)
    sh(DIASPORA, "publish", *conn, "--topic", "cli.data", "--file", write_lines(tmp_path / "forged.jsonl", [forged, event("x")]))
    p = sh(DIASPORA, "get", *conn, "--topic", "cli.data", "--offset", 10, "-o", tmp_path / "f.bin", check=False)
    assert p.returncode == 1 and "incomplete: 0 of its 2 chunks" in p.stderr, (p.returncode, p.stderr)
    p = sh(DIASPORA, "put", *conn, "--topic", "cli.data", "--deadline", "tomorrow", src, check=False)
    assert p.returncode == 2 and "--deadline" in p.stderr, (p.returncode, p.stderr)
    small = relay.creds.token("publish:other")
    p = sh(DIASPORA, "put", "--url", relay.url, "--ca", relay.creds.ca, "--token", small, "--topic", "cli.data", src,
           check=False)
    assert p.returncode == 1 and "forbidden" in p.stderr, (p.returncode, p.stderr)


def test_items_put_while_the_relay_is_sigkilled_are_each_stored_once_and_whole(tmp_path):
    """A producer puts 40 items of 1 to 3 MiB, one at a time, while the relay is SIGKILLed
    three times; after each reconnect it puts again, with the same seq, the item whose ack
    it did not get (as the plugin does). Afterwards every item is stored once, whole, in
    the producer's order: nothing acked lost, nothing twice (a put cut by a kill is
    completed by its resend)."""
    import websockets

    creds = Credentials(tmp_path / "creds")
    relay = RelayProcess(creds, tmp_path / "data").start()
    relay.listen_port = relay.port  # the same port after each restart
    token = creds.token("admin")
    rng = random.Random(20261207)
    datas = [blob(rng.randint(1 << 20, 3 << 20), 100 + i) for i in range(40)]
    kills = 0

    async def killer(done: asyncio.Event):
        nonlocal kills
        while kills < 3 and not done.is_set():
            await asyncio.sleep(rng.uniform(0.2, 0.6))
            if done.is_set():
                return
            relay.kill()
            kills += 1
            await asyncio.sleep(rng.uniform(0.0, 0.3))
            relay.start()

    async def producer(done: asyncio.Event):
        i, reconnects = 0, 0
        while i < len(datas):
            try:
                ws = await session(relay, token, producer_id="crash-items")
                while i < len(datas):
                    ack = await put_item(ws, "crash.data", i + 1, datas[i], f"item-{i}")
                    assert ack["op"] == "ack", ack
                    i += 1
                    await asyncio.sleep(0.06)  # a steady stream, so the kills land mid-stream
            except (websockets.ConnectionClosed, OSError, asyncio.TimeoutError, websockets.InvalidHandshake,
                    ConnectionError):
                reconnects += 1
                assert reconnects < 100
                await asyncio.sleep(0.05)
        done.set()
        return reconnects

    async def go():
        done = asyncio.Event()
        k = asyncio.create_task(killer(done))
        reconnects = await producer(done)
        await k
        reader = ItemReader(await session(relay, token))
        await reader.ws.send(json.dumps({"op": "subscribe", "id": "r", "topic": "crash.data", "from": "earliest"}))
        items = await reader.until(len(datas), timeout=60)
        return reconnects, items, reader

    try:
        reconnects, items, reader = run(go())
    finally:
        stop_all([relay], [])
    assert kills == 3 and reconnects >= 3, (kills, reconnects)
    assert [it["event"]["id"] for it in items] == [f"item-{i}" for i in range(len(datas))]
    assert [it["data"] for it in items] == datas
    print(f"{kills} kills, {reconnects} reconnects, {len(datas)} items stored once each")
