#!/usr/bin/env bash
# Side by side in one run: the Diaspora relay (embedded by `diaspora bench relay`, fsync
# before every ack) and NATS JetStream (nats-server from Debian, file storage, defaults)
# on the same workloads, with the ratio. Prints a Markdown table.
#   bench/relay/compare.sh [BUILD_DIR]        QUICK=1 for a short run
set -euo pipefail
# The project's Python (.venv from scripts/install-deps.sh), unless DIASPORA_PYTHON names another.
PY="${DIASPORA_PYTHON:-$(cd "$(dirname "$0")/../.." && pwd)/.venv/bin/python}"
BUILD_DIR=${1:-build}
BIN="$BUILD_DIR/bin"
EVENTS=${EVENTS:-400000}
[ "${QUICK:-0}" = 1 ] && EVENTS=100000 && EVENTS_256=100000
work=$(mktemp -d "${TMPDIR:-/tmp}/diaspora-compare.XXXXXX")
nats_pid=""
cleanup() { [ -n "$nats_pid" ] && kill "$nats_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port); mon=$(free_port)
nats-server -a 127.0.0.1 -p "$port" -m "$mon" -js -sd "$work/nats" > "$work/nats.log" 2>&1 &
nats_pid=$!
for _ in $(seq 1 100); do
  if $PY - "$mon" <<'PYEOF' 2>/dev/null; then break; fi
import sys, urllib.request
sys.exit(0 if b"ok" in urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/healthz", timeout=1).read() else 1)
PYEOF
  sleep 0.1
done

# name | producers | subscribers | size | batch | rate | events | relay fsync
# The 256 B row runs 2,000,000 events: 400,000 (about a second) is mostly warm-up (the
# de-dupe table growing from empty, the first segment, connections starting).
workloads=(
  "throughput 256 B|4|1|256|500|0|${EVENTS_256:-2000000}|always"
  "throughput 2 KiB|4|1|2048|100|0|$EVENTS|always"
  "latency at 20k/s|1|1|256|500|20000|100000|always"
  "latency at 20k/s|1|1|256|500|20000|100000|interval:5"
)
results="$work/results.jsonl"
peer_latency=""
for w in "${workloads[@]}"; do
  IFS='|' read -r name producers subscribers size batch rate events fsync <<< "$w"
  window_events=$(( 16 * batch ))
  probe=0
  [ "$rate" != 0 ] && probe=2000   # the disk's own fdatasync latency, measured right after
  ours=$("$BIN/diaspora" bench relay --json --producers "$producers" --subscribers "$subscribers" \
         --events "$events" --size "$size" --batch "$batch" --window 16 --rate "$rate" --fsync "$fsync" \
         --disk-probe "$probe")
  if [ "$rate" != 0 ] && [ -n "$peer_latency" ]; then
    peer=$peer_latency   # JetStream's latency run is the same workload: measured once
  else
    peer=$("$BIN/bench_jetstream" --json --url "nats://127.0.0.1:$port" --producers "$producers" \
           --subscribers "$subscribers" --events "$events" --size "$size" --window "$window_events" --rate "$rate")
    [ "$rate" != 0 ] && peer_latency=$peer
  fi
  printf '{"workload": "%s", "fsync": "%s", "ours": %s, "peer": %s}\n' "$name" "$fsync" "$ours" "$peer" >> "$results"
done

$PY - "$results" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| workload | system | acked events/s | MB/s | p50 µs | p99 µs | p99.9 µs |")
print("|---|---|---:|---:|---:|---:|---:|")
for r in rows:
    for key, label in (("ours", f"diaspora-relay (fsync {r['fsync']})"), ("peer", "NATS JetStream (file, defaults)")):
        m = r[key]
        print(f"| {r['workload']} | {label} | {m['events_per_s']:.0f} | {m['mb_per_s']:.1f} | "
              f"{m['p50_us']:.0f} | {m['p99_us']:.0f} | {m['p999_us']:.0f} |")
    o, p = r["ours"], r["peer"]
    print(f"| {r['workload']} | **ratio relay / JetStream** | **{o['events_per_s'] / p['events_per_s']:.2f}×** | | "
          f"{o['p50_us'] / max(p['p50_us'], 1):.2f}× | {o['p99_us'] / max(p['p99_us'], 1):.2f}× | |")
disk = [r["ours"] for r in rows if r["ours"].get("disk_fdatasync_samples")]
for m in disk:
    print(f"\nDisk floor after a latency run: 4 KiB append + fdatasync p50 {m['disk_fdatasync_p50_us']:.0f} µs, "
          f"p99 {m['disk_fdatasync_p99_us']:.0f} µs ({m['disk_fdatasync_samples']} samples).")
PYEOF
