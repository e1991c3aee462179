#!/usr/bin/env python3
"""A console reload while the relay is saturated: does it delay publish acks?

One diaspora-relay (views on, one I/O thread, fsync always) takes the relay benchmark's
full acked publish load of task events (4 producers x 1 subscriber, `diaspora bench relay
--url ... --task-events`), ROUNDS times without and ROUNDS times with a console reloading
its pages in a loop (each reload asks what the console's first page asks: workflows, tasks,
sites and actions, 100 items each, over HTTPS with a token), alternated, in this run. It
prints the publish ack latency (each publish from sent to its ack) and the acked rate,
medians of the rounds, and their ratio. Target: the p99 ack latency with the reloads is
within 10 % of without (issue 37).

    .venv/bin/python bench/relay/console_load.py [BUILD_DIR]    ROUNDS=3 EVENTS=400000 PAUSE=0.1
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BUILD = Path(sys.argv[1] if len(sys.argv) > 1 else "build").resolve()
BIN = BUILD / "bin"
ROUNDS = int(os.environ.get("ROUNDS", "3"))
EVENTS = int(os.environ.get("EVENTS", "400000"))
PAUSE = float(os.environ.get("PAUSE", "0.1"))  # seconds between two reloads
PAGES = ["workflows", "tasks?limit=100", "sites?limit=100", "actions?limit=100"]


def sh(*args) -> str:
    return subprocess.run([str(a) for a in args], check=True, capture_output=True, text=True).stdout


def reload_loop(port: int, ca: Path, token: str, stop: threading.Event, counts: list[int]) -> None:
    ctx = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
    while not stop.is_set():
        for page in PAGES:
            conn.request("GET", "/api/v1/views/" + page, headers={"Authorization": "Bearer " + token})
            r = conn.getresponse()
            body = r.read()
            if r.status != 200:
                raise SystemExit(f"GET {page}: {r.status} {body[:200]!r}")
        counts[0] += 1
        stop.wait(PAUSE)
    conn.close()


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="diaspora-console-load-") as tmp:
        t = Path(tmp)
        sh(BIN / "diaspora", "certs", "init", t / "certs")
        sh(BIN / "diaspora", "token", "secret", t / "secret")
        token = sh(BIN / "diaspora", "token", "issue", "--secret-file", t / "secret", "--subject", "bench",
                   "--scope", "publish:*", "--scope", "subscribe:*", "--scope", "admin").strip()
        port_file = t / "port"
        (t / "relay.yaml").write_text(json.dumps({"threads": 1, "views": True}))  # JSON is YAML
        relay = subprocess.Popen([str(BIN / "diaspora-relay"), "--config", str(t / "relay.yaml"),
                                  "--listen", "127.0.0.1:0", "--data-dir", str(t / "data"),
                                  "--tls-cert", str(t / "certs" / "server.pem"), "--tls-key", str(t / "certs" / "server-key.pem"),
                                  "--auth-secret-file", str(t / "secret"), "--port-file", str(port_file), "--fsync", "always"],
                                 stdout=subprocess.DEVNULL, stderr=open(t / "relay.log", "wb"))
        try:
            for _ in range(200):
                if port_file.exists() and port_file.read_text().strip():
                    break
                time.sleep(0.05)
            port = int(port_file.read_text())
            rows = []
            for rnd in range(ROUNDS):
                for reloading in (False, True):
                    stop, counts = threading.Event(), [0]
                    loop = threading.Thread(target=reload_loop, args=(port, t / "certs" / "ca.pem", token, stop, counts))
                    if reloading:
                        loop.start()
                    t0 = time.monotonic()
                    out = sh(BIN / "diaspora", "bench", "relay", "--json", "--url", f"wss://127.0.0.1:{port}",
                             "--ca", t / "certs" / "ca.pem", "--token", token, "--task-events", "--producers", "4",
                             "--subscribers", "1", "--events", EVENTS, "--size", "256", "--batch", "500", "--window", "16")
                    took = time.monotonic() - t0
                    stop.set()
                    if reloading:
                        loop.join()
                    r = json.loads(out)
                    r["reloading"], r["reloads_per_s"] = reloading, counts[0] / took
                    rows.append(r)
                    print(f"round {rnd + 1} {'with' if reloading else 'without'} reloads: ack p99 {r['ack_p99_us']:.0f} µs, "
                          f"{r['events_per_s']:.0f} events/s, {r['reloads_per_s']:.1f} reloads/s", file=sys.stderr)
        finally:
            relay.terminate()
            relay.wait(timeout=30)
    med = lambda on, k: statistics.median(r[k] for r in rows if r["reloading"] == on)
    print("| relay under full acked load (task events, 4 producers x 1 subscriber, 256 B, fsync always, 1 I/O thread) "
          "| ack p50 µs | ack p99 µs | acked events/s | console reloads/s |")
    print("|---|---:|---:|---:|---:|")
    for on, label in ((False, "no console"), (True, f"console reloading (4 pages each, every {PAUSE:g} s)")):
        print(f"| {label}, median of {ROUNDS} | {med(on, 'ack_p50_us'):.0f} | {med(on, 'ack_p99_us'):.0f} | "
              f"{med(on, 'events_per_s'):.0f} | {med(on, 'reloads_per_s'):.1f} |")
    ratio = med(True, "ack_p99_us") / med(False, "ack_p99_us")
    print(f"| **p99 ratio with / without** | | **{ratio:.3f}x** (target <= 1.10) | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
