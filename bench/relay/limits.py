"""The relay's memory under many idle connections, many topics and a subscriber that never
reads (docs/reliability.md, "Limits"). A real diaspora-relay (build/bin) on 127.0.0.1 with
TLS; its resident memory (VmRSS of /proc/PID/status) is read after each step.

    .venv/bin/python bench/relay/limits.py [--connections 10000] [--topics 1000] [--stream-mb 64]

Steps: (1) open CONNECTIONS diaspora.v1 sessions (TLS, token, hello) and leave them idle
(the client answers the relay's pings, so none is closed for idleness); (2) publish one
event to each of TOPICS topics; (3) subscribe to a topic, never read, and publish
STREAM_MB of events to it: the relay pauses that subscriber after subscriber_queue_frames
frames and closes it after slow_subscriber_timeout, so its memory must not follow the
volume published. Prints a table of the relay's memory after each step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))
import relay_harness as rh  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def open_idle(relay, token: str, n: int, parallel: int = 64) -> list:
    conns, sem = [], asyncio.Semaphore(parallel)

    async def one(i):
        async with sem:
            ws = await rh.connect(relay, token)
            await ws.send(json.dumps({"op": "hello", "client_id": f"idle-{i}"}))
            assert json.loads(await ws.recv())["op"] == "welcome"
            conns.append(ws)
    await asyncio.gather(*(one(i) for i in range(n)))
    return conns


async def publish(relay, token: str, topic: str, events: list[dict], seq: int = 0) -> None:
    ws = await rh.session(relay, token)
    await ws.send(json.dumps({"op": "publish", "topic": topic, "seq": seq, "events": events}))
    assert json.loads(await ws.recv())["op"] == "ack"
    await ws.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=10_000)
    ap.add_argument("--topics", type=int, default=1_000)
    ap.add_argument("--stream-mb", type=int, default=64)
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < a.connections + 100:
        print(f"the open-file limit ({hard}) is below {a.connections} connections", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="diaspora-limits-"))
    creds = rh.Credentials(root / "creds")
    relay = rh.RelayProcess(creds, root / "data", config={"limits": {"slow_subscriber_timeout": "10s"}},
                            fsync="never").start()
    pid = relay.proc.pid
    token = creds.token("admin")
    rows = []

    def row(step: str, note: str = "") -> None:
        rows.append((step, rss_mib(pid), note))
        print(f"  {step}: {rows[-1][1]:.1f} MiB {note}", file=sys.stderr, flush=True)

    async def run():
        row("started")
        t0 = time.monotonic()
        conns = await open_idle(relay, token, a.connections)
        took = time.monotonic() - t0
        await asyncio.sleep(2)
        row(f"{a.connections:,} idle sessions", f"(opened in {took:.0f} s)")
        await asyncio.sleep(10)
        alive = sum(1 for ws in conns if ws.open)
        row(f"{a.connections:,} idle sessions, 10 s later", f"({alive:,} still open)")
        for k in range(a.topics):
            await publish(relay, token, f"limits.t{k}", [rh.event(f"t{k}", source="/limits")])
        row(f"+ {a.topics:,} topics, one event each")
        # A subscriber that never reads, on a topic that takes STREAM_MB.
        lazy = await rh.session(relay, token, max_queue=1)  # the client library buffers 1 frame, not 32
        await lazy.send(json.dumps({"op": "subscribe", "id": "lazy", "topic": "limits.stream", "from": "earliest"}))
        payload = "x" * 900
        per_batch, sent, seq = 1000, 0, 0
        pub = await rh.session(relay, token, producer_id="stream")
        peak = rss_mib(pid)
        while sent < a.stream_mb << 20:
            evs = [rh.event(f"s{seq}-{i}", source="/limits", data={"pad": payload}) for i in range(per_batch)]
            await pub.send(json.dumps({"op": "publish", "topic": "limits.stream", "seq": seq, "events": evs}))
            assert json.loads(await pub.recv())["op"] == "ack"
            sent += per_batch * 1000
            seq += 1
            peak = max(peak, rss_mib(pid))
        row(f"+ a subscriber that never reads, {a.stream_mb} MiB published to it", f"(peak {peak:.1f} MiB)")
        await asyncio.sleep(12)
        metrics = rh.https_get(relay, "/metrics")
        closed = next(int(line.split()[-1]) for line in metrics.splitlines()
                      if line.startswith("diaspora_relay_slow_consumer_disconnects_total"))
        row("  ... after slow_subscriber_timeout (10 s)", f"({closed} subscriber closed as too slow)")
        for ws in conns:
            await ws.close()
        await pub.close()
        await asyncio.sleep(2)
        row("idle sessions closed")

    try:
        asyncio.run(run())
    finally:
        relay.stop_cleanly()
    base = rows[0][1]
    print(f"| step | relay RSS MiB | over start | note |\n|---|---|---|---|")
    for step, mib, note in rows:
        print(f"| {step} | {mib:.1f} | {mib - base:+.1f} | {note} |")
    per_conn = (rows[1][1] - base) * 1024 / max(1, a.connections)
    print(f"\nper idle session: {per_conn:.1f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
