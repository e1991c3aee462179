"""Crash test: a producer streams 100,000 events while the relay is SIGKILLed at random
moments and restarted. Afterwards every acknowledged event is in the log exactly once,
the producer's order holds, and every record's CRC32C verifies (checked here by reading
the segment files directly, with an independent CRC implementation)."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest
import websockets

from relay_harness import Credentials, RelayProcess, collect_all, event, read_segments, recv, run, session

TOTAL = 100_000
BATCH = 500
WINDOW = 8
KILLS = 4
SEED = 20261130
PACE = 0.02  # seconds per acked batch: about 25,000 events/s


def test_sigkill_during_streaming_loses_no_acked_event(tmp_path):
    creds = Credentials(tmp_path / "creds")
    relay = RelayProcess(creds, tmp_path / "data").start()
    token = creds.token("admin")
    rng = random.Random(SEED)
    batches = {s: [event(f"c-{s * BATCH + i}", source="/crash") for i in range(BATCH)] for s in range(TOTAL // BATCH)}
    acked: set[int] = set()
    kills = 0

    async def killer():
        nonlocal kills
        while kills < KILLS:
            await asyncio.sleep(rng.uniform(0.15, 0.8))
            if len(acked) == len(batches):
                return
            relay.kill()
            kills += 1
            await asyncio.sleep(rng.uniform(0.0, 0.3))
            relay.start()

    async def producer():
        next_seq = 0
        reconnects = 0
        while len(acked) < len(batches):
            try:
                ws = await session(relay, token, producer_id="crash-producer")
                # Resend every unacked batch already sent, in order, with its sequence number.
                pending = sorted(s for s in range(next_seq) if s not in acked)
                inflight = set()
                queue = pending + list(range(next_seq, len(batches)))
                while len(acked) < len(batches):
                    while queue and len(inflight) < WINDOW:
                        s = queue.pop(0)
                        await ws.send(json.dumps({"op": "publish", "topic": "crash", "seq": s, "events": batches[s]}))
                        inflight.add(s)
                        next_seq = max(next_seq, s + 1)
                    m = await recv(ws)
                    assert m["op"] == "ack", m
                    acked.add(m["seq"])
                    inflight.discard(m["seq"])
                    await asyncio.sleep(PACE)  # a steady stream, so the kills land mid-stream
                await ws.close()
            except (websockets.ConnectionClosed, OSError, asyncio.TimeoutError, websockets.InvalidHandshake,
                    ConnectionError):
                reconnects += 1
                assert reconnects < 200
                await asyncio.sleep(0.05)
        return reconnects

    async def go():
        k = asyncio.create_task(killer())
        reconnects = await producer()
        await k
        return reconnects

    reconnects = run(go())
    assert kills == KILLS and reconnects >= KILLS
    assert relay.stop() == 0

    # Restart (recovery) and read everything back through the protocol.
    relay.start()
    try:
        got = run(collect_all(relay, token, "crash", TOTAL))
    finally:
        assert relay.stop() == 0
    ids = [int(e["id"].split("-")[1]) for _, e in got]
    assert len(ids) == TOTAL, f"{len(ids)} events, expected {TOTAL}"
    assert ids == sorted(ids), "the producer's order was not kept"
    assert len(set(ids)) == TOTAL, "an event is stored twice"

    # And directly on disk: every record's CRC verifies, offsets increase, nothing twice.
    records = read_segments(tmp_path / "data" / "topics" / "crash")
    offsets = [o for o, _ in records]
    assert offsets == sorted(set(offsets))
    assert sorted(int(e["id"].split("-")[1]) for _, e in records) == list(range(TOTAL))
