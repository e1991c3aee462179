"""Quality of service under congestion (docs/streaming.md#quality-of-service, issue 42).

A site joined to the centre by a veth link shaped to 100 Mbit/s each way (`tc tbf`, in a
network namespace this bench makes; root), and 20 ms of round trip added by a delaying proxy
at the site end of the link (this kernel has no netem). The relay runs at the centre; one
subscriber at the site reads, over one connection through the proxy, a workflow's lifecycle
events (`wf.events`, 50/s), its telemetry (`wf.telemetry`, 200/s), the operator's actions
(`wf.control.site`, 5/s) and a bulk stream of data items (`wf.data`, 4 MiB items in 64 KiB
chunks, put a little faster than the link carries them). Each event carries its publish
time; the subscriber measures each one's latency on the same clock.

Each way in the same run: the relay writing each connection's frames by class (qos.enabled,
the default) and in one FIFO (qos.enabled: false, the relay before QoS). For each: lifecycle
and control latency on the idle link (no bulk) and saturated, bulk goodput as a share of the
link, events lost. Then the producer's side: metric samples coalesced by the plugin while its
window of unacked batches is full (plugin.coalesce), counted, against every sample queued.

    .venv/bin/python bench/qos/qos_bench.py [--build build] [--idle 8] [--load 20]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))

LINK_BPS = 100e6        # the shaped link, bits/s
ONE_WAY_S = 0.010       # the proxy's delay each way (20 ms round trip)
CHUNK = int(os.environ.get("QOS_CHUNK_KIB", "64")) * 1024  # bulk chunks: 64 KiB is 5 ms of this link
ITEM = 4 * 2**20
# The link's buffer: one round trip of it (the rule of thumb for a router's buffer). With a
# shallow one (QOS_TBF_LATENCY=4ms) bursts overflow it: losses, and their recovery, add to the tail.
TBF_LATENCY = os.environ.get("QOS_TBF_LATENCY", "20ms")
BULK_SHARE = float(os.environ.get("QOS_BULK_SHARE", "0.93"))  # of the link, for bulk frames
RATES = {"wf.events": 50, "wf.telemetry": 200, "wf.control.site": 5}  # events/s


# ---- the delaying proxy (runs in the site's namespace) ----

async def delay_pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Forwards what `reader` gives to `writer`, each read `delay` seconds after it arrived
    (a delay line: it never holds more than `delay` worth of the link, and stops reading
    while 16 MiB wait)."""
    q: asyncio.Queue = asyncio.Queue()
    held = 0
    room = asyncio.Event()
    room.set()

    async def pump_in():
        nonlocal held
        while True:
            await room.wait()
            data = await reader.read(65536)
            q.put_nowait((time.monotonic() + delay, data))
            if not data:
                return
            held += len(data)
            if held > 16 * 2**20:
                room.clear()

    async def pump_out():
        nonlocal held
        while True:
            due, data = await q.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()
            held -= len(data)
            if held <= 16 * 2**20:
                room.set()

    try:
        await asyncio.gather(pump_in(), pump_out())
    except (ConnectionError, OSError):
        writer.close()


async def proxy(listen_port_file: Path, target_host: str, target_port: int) -> None:
    async def handle(cr, cw):
        sr, sw = await asyncio.open_connection(target_host, target_port)
        for w in (cw, sw):
            w.get_extra_info("socket").setsockopt(6, 1, 1)  # TCP_NODELAY
        await asyncio.gather(delay_pipe(cr, sw, ONE_WAY_S), delay_pipe(sr, cw, ONE_WAY_S), return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    listen_port_file.write_text(str(server.sockets[0].getsockname()[1]))
    async with server:
        await server.serve_forever()


# ---- the subscriber (runs in the site's namespace) ----

async def consume(url: str, ca: str, token: str, out: Path, seconds: float, split: bool) -> None:
    """Subscribes to the four topics over one connection, or (`split`) the data topic over a
    connection of its own: a connection per class group, the other way to keep bulk apart."""
    import websockets
    from data_items import decode_delivered
    ctx = ssl.create_default_context(cafile=ca)

    async def connect(topics: list[str]):
        ws = await websockets.connect(url, ssl=ctx, subprotocols=["diaspora.v1"], max_size=64 * 2**20,
                                      extra_headers={"Authorization": f"Bearer {token}"}, max_queue=64)
        # The site knows its link: bulk paced to a share of it (hello's bulk_rate, bytes/s).
        await ws.send(json.dumps({"op": "hello", "client_id": "qos-site", "bulk_rate": BULK_SHARE * LINK_BPS / 8}))
        for topic in topics:
            await ws.send(json.dumps({"op": "subscribe", "id": topic, "topic": topic, "from": "earliest"}))
        return ws

    events = ["wf.control.site", "wf.events", "wf.telemetry"]
    conns = [await connect(events), await connect(["wf.data"])] if split else [await connect(events + ["wf.data"])]
    latencies: list[tuple[str, str, float]] = []  # topic, phase, seconds
    bulk: list[tuple[float, int]] = []             # receipt time, chunk payload bytes
    ends = set()
    deadline = time.time() + seconds

    async def read(ws):
        while len(ends) < 3 and time.time() < deadline:
            try:
                frame = await asyncio.wait_for(ws.recv(), max(0.1, deadline - time.time()))
            except asyncio.TimeoutError:
                return
            now = time.time()
            if isinstance(frame, bytes):
                bulk.append((now, len(decode_delivered(frame)["payload"])))
                continue
            m = json.loads(frame)
            if m.get("op") != "events":
                continue
            for e in m["events"]:
                d = e["event"].get("data") or {}
                if "t" not in d:
                    continue  # a data item's own event
                if d.get("phase") == "end":
                    ends.add(m["topic"])
                    continue
                latencies.append((m["topic"], d["phase"], now - d["t"]))

    readers = [asyncio.create_task(read(ws)) for ws in conns]
    await readers[0]  # the events' connection: until every end marker came
    for r in readers[1:]:
        r.cancel()
    out.write_text(json.dumps({"latencies": latencies, "bulk": bulk}))
    for ws in conns:
        await ws.close()


# ---- the centre: relay, producers, measurement ----

def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


async def produce(relay, token: str, idle_s: float, load_s: float) -> dict:
    """Events at RATES through an idle phase and a loaded one (bulk items put in parallel),
    then an end marker on each topic. Returns what was sent per topic and phase, and the
    loaded phase's bounds."""
    from relay_harness import connect
    from data_items import put_item
    ws = await connect(relay, token)
    await ws.send(json.dumps({"op": "hello", "client_id": "qos-centre", "producer_id": "qos-centre"}))
    await ws.recv()
    sent: dict[str, int] = {}
    seqs = {t: 0 for t in RATES}
    acks = asyncio.Queue()

    async def reader():
        while True:
            m = json.loads(await ws.recv())
            if m["op"] != "ack":
                raise AssertionError(f"the relay refused an event: {m}")
            acks.put_nowait(m)

    async def stream(topic: str, rate: float, phase: str, until: float):
        n = 0
        start = time.monotonic()
        while time.monotonic() < until:
            ev = {"specversion": "1.0", "id": f"{phase}-{n}", "source": "/bench/qos", "type": "org.example.qos",
                  "data": {"t": time.time(), "phase": phase}}
            await ws.send(json.dumps({"op": "publish", "topic": topic, "seq": seqs[topic], "events": [ev]}))
            seqs[topic] += 1
            n += 1
            sent[f"{topic}/{phase}"] = n
            await asyncio.sleep(max(0.0, start + n / rate - time.monotonic()))

    async def bulk(until: float):
        bws = await connect(relay, token)
        await bws.send(json.dumps({"op": "hello", "client_id": "qos-bulk", "producer_id": "qos-bulk"}))
        await bws.recv()
        data = os.urandom(ITEM)
        seq = 0
        start = time.monotonic()
        while time.monotonic() < until:  # 10 % over the link's rate: it stays saturated
            r = await put_item(bws, "wf.data", seq, data, f"item-{seq}", chunk=CHUNK)
            assert r["op"] == "ack", r
            seq += 1
            await asyncio.sleep(max(0.0, start + seq * ITEM * 8 / (LINK_BPS * 1.1) - time.monotonic()))
        await bws.close()
        return seq

    rd = asyncio.create_task(reader())
    t0 = time.monotonic()
    await asyncio.gather(*(stream(t, r, "idle", t0 + idle_s) for t, r in RATES.items()))
    t1 = time.monotonic()
    load_start = time.time()
    results = await asyncio.gather(bulk(t1 + load_s), *(stream(t, r, "load", t1 + load_s) for t, r in RATES.items()))
    load_end = time.time()
    for topic in RATES:
        ev = {"specversion": "1.0", "id": "end", "source": "/bench/qos", "type": "org.example.qos",
              "data": {"t": time.time(), "phase": "end"}}
        await ws.send(json.dumps({"op": "publish", "topic": topic, "seq": seqs[topic], "events": [ev]}))
    await asyncio.sleep(0.5)
    rd.cancel()
    await ws.close()
    return {"sent": sent, "items": results[0], "load": [load_start, load_end]}


def shape(ns, rate: str, latency: str) -> None:
    for cmd in (["tc", "qdisc", "add", "dev", ns.host_if, "root", "tbf", "rate", rate, "burst", "16kb", "latency", latency],
                ns.inside("tc", "qdisc", "add", "dev", ns.ns_if, "root", "tbf", "rate", rate, "burst", "16kb",
                          "latency", latency)):
        subprocess.run(cmd, check=True)


def one_way(build: Path, creds, ns, work: Path, mode: str, idle_s: float, load_s: float) -> dict:
    from relay_harness import RelayProcess
    name, qos, split = mode, mode == "classes", mode == "split"
    relay = RelayProcess(creds, work / name, host=ns.host_ip, fsync="never",
                         config={"qos": {"enabled": qos, "notsent_lowat": os.environ.get("QOS_LOWAT", "64KiB")}, "views": False}).start()
    token = creds.token("admin")
    port_file, out = work / f"{name}.proxy.port", work / f"{name}.site.json"
    py = sys.executable
    rt = ["chrt", "-f", "10"] if os.environ.get("QOS_RT", "1") == "1" else []  # the harness's jitter is not the relay's
    px = subprocess.Popen(ns.inside(*rt, py, __file__, "proxy", str(port_file), ns.host_ip, str(relay.port)))
    site = None
    try:
        for _ in range(100):
            if port_file.exists() and port_file.read_text():
                break
            time.sleep(0.05)
        url = f"wss://127.0.0.1:{port_file.read_text()}/v1"
        site = subprocess.Popen(ns.inside(*rt, py, __file__, "consume", url, str(creds.ca), token, str(out),
                                          str(idle_s + load_s + 60), "split" if split else "one"))
        time.sleep(1.5)  # connected and subscribed
        retrans0 = retransmitted()
        sent = asyncio.run(produce(relay, token, idle_s, load_s))
        site.wait(timeout=idle_s + load_s + 90)
        from relay_harness import https_get
        relay_lag = lag_p99(https_get(relay, "/metrics", token))
        retrans = retransmitted() - retrans0
    finally:
        for p in (site, px):
            if p and p.poll() is None:
                p.kill()
        relay.stop_cleanly()
    got = json.loads(out.read_text())
    lat: dict[str, list[float]] = {}
    for topic, phase, s in got["latencies"]:
        lat.setdefault(f"{topic}/{phase}", []).append(s)
    a, b = sent["load"]
    a += 3  # the link is saturated from a few seconds in
    window = [n for t, n in got["bulk"] if a <= t <= b]
    goodput = sum(window) * 8 / (b - a) / LINK_BPS if b > a else float("nan")
    lost = {k: n - len(lat.get(k, [])) for k, n in sent["sent"].items()}
    return {"lat": lat, "goodput": goodput, "lost": lost, "items": sent["items"], "relay_lag": relay_lag, "retrans": retrans}


def retransmitted() -> int:
    """TCP segments retransmitted in this namespace so far (losses on the shaped link)."""
    for line in Path("/proc/net/snmp").read_text().splitlines():
        if line.startswith("Tcp:") and "RetransSegs" not in line:
            header = next(h for h in Path("/proc/net/snmp").read_text().splitlines() if h.startswith("Tcp:"))
            return int(line.split()[header.split().index("RetransSegs")])
    return 0


def lag_p99(metrics: str) -> dict[str, float]:
    """Per class, the upper bound of the relay's delivery-lag bucket that holds the 99th
    percentile (diaspora_relay_delivery_lag_seconds)."""
    import re
    out = {}
    for cls in ("control", "lifecycle", "telemetry", "bulk"):
        rows = [(float("inf") if le == "+Inf" else float(le), int(n)) for le, n in re.findall(
            r'^diaspora_relay_delivery_lag_seconds_bucket\{class="%s",le="([^"]+)"\} (\d+)$' % cls, metrics, re.M)]
        total = rows[-1][1] if rows else 0
        out[cls] = next((le for le, n in rows if total and n >= 0.99 * total), float("nan"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", nargs="?", default="run")
    ap.add_argument("rest", nargs="*")
    ap.add_argument("--build", default="build")
    ap.add_argument("--idle", type=float, default=8)
    ap.add_argument("--load", type=float, default=20)
    args = ap.parse_args()
    if args.role == "proxy":
        asyncio.run(proxy(Path(args.rest[0]), args.rest[1], int(args.rest[2])))
        return 0
    if args.role == "consume":
        url, ca, token, out, seconds, conns = args.rest
        asyncio.run(consume(url, ca, token, Path(out), float(seconds), conns == "split"))
        return 0
    if os.geteuid() != 0:
        print("bench/qos needs root (network namespaces, tc)", file=sys.stderr)
        return 2
    os.environ.setdefault("DIASPORA_BIN_DIR", str((ROOT / args.build / "bin").resolve()))
    from relay_harness import Credentials, Netns
    with tempfile.TemporaryDirectory(prefix="diaspora-qosbench.") as tmp:
        work = Path(tmp)
        creds = Credentials(work / "creds")
        ns = Netns("q")
        creds.renew_server_cert(86400, ips=(ns.host_ip,))  # the producers reach the relay on the link's address
        try:
            shape(ns, "100mbit", TBF_LATENCY)
            rows = {mode: one_way(ROOT / args.build, creds, ns, work, mode, args.idle, args.load)
                    for mode in ("fifo", "split", "classes")}
        finally:
            ns.close()
        # The producer's side: an engine's plugin whose relay takes no batches for a while
        # (the same measurement as tests/python/test_qos.py), each way.
        from test_qos import samples_ahead_of_a_task_event
        coalescing = {mode: samples_ahead_of_a_task_event(creds, work, mode) for mode in ("queue_full", "congested")}
    print(f"100 Mbit/s each way (tc tbf, {TBF_LATENCY} of buffer), 20 ms round trip (a delaying proxy at the site); "
          f"events: lifecycle 50/s, telemetry 200/s, control 5/s; bulk: {ITEM >> 20} MiB items in "
          f"{CHUNK >> 10} KiB chunks, 1.1x the link, paced by class to {BULK_SHARE:.0%} of it (hello's bulk_rate); "
          f"one subscriber at the site; idle {args.idle:g} s, saturated {args.load:g} s")
    print("| relay | lifecycle p50 / p99 idle (ms) | lifecycle p50 / p99 saturated | control p99 / max saturated "
          "| telemetry p99 saturated | bulk goodput (of 100 Mbit/s) | events lost |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode, r in rows.items():
        L = r["lat"]
        ms = lambda k, p: pct(L.get(k, []), p) * 1e3
        label = {"fifo": "one FIFO, one connection (qos.enabled: false)",
                 "split": "one FIFO each, a connection for bulk and one for the rest",
                 "classes": "by class, one connection (default)"}[mode]
        print(f"| {label} "
              f"| {ms('wf.events/idle', 50):.1f} / {ms('wf.events/idle', 99):.1f} "
              f"| {ms('wf.events/load', 50):.1f} / {ms('wf.events/load', 99):.1f} "
              f"| {ms('wf.control.site/load', 99):.1f} / {ms('wf.control.site/load', 100):.1f} "
              f"| {ms('wf.telemetry/load', 99):.1f} | {r['goodput'] * 100:.1f} % | {sum(r['lost'].values())} |")
    for mode, r in rows.items():
        print(f"{mode}: the relay's delivery lag p99 (bucket bound): " +
              ", ".join(f"{k} <= {v * 1e3:g} ms" for k, v in r["relay_lag"].items()))
        print("  TCP retransmitted segments at the centre:", r["retrans"])
    for mode, (ahead, represented, merged) in coalescing.items():
        print(f"plugin.coalesce: {mode}: 20,000 samples of 10 series then a task event, the relay taking no batches: "
              f"{ahead} metric events stored ahead of the task event, {merged} samples coalesced (counted), "
              f"{represented} samples represented in all")
    c = rows["classes"]["lat"]
    idle99, load99 = pct(c.get("wf.events/idle", []), 99), pct(c.get("wf.events/load", []), 99)
    print(f"by class: lifecycle p99 saturated / idle = {load99 / idle99:.2f}x (target <= 2x); "
          f"control max {pct(c.get('wf.control.site/load', []), 100) * 1e3:.1f} ms (target <= 100 ms); "
          f"bulk goodput {rows['classes']['goodput'] * 100:.1f} % (target >= 90 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
