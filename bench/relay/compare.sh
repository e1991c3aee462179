#!/usr/bin/env bash
# Side by side in one run: the Diaspora relay (embedded by `diaspora bench relay`, fsync
# before every ack) and NATS JetStream (nats-server from Debian, file storage, defaults)
# on the same workloads, with the ratio. Prints a Markdown table.
#   bench/relay/compare.sh [BUILD_DIR]        QUICK=1 for a short run
set -euo pipefail
BUILD_DIR=${1:-build}
BIN="$BUILD_DIR/bin"
PY=/usr/bin/python3
EVENTS=${EVENTS:-400000}
[ "${QUICK:-0}" = 1 ] && EVENTS=100000
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

# name | producers | subscribers | size | batch | rate
workloads=(
  "throughput 256 B|4|1|256|500|0"
  "throughput 2 KiB|4|1|2048|100|0"
  "latency at 20k/s|1|1|256|500|20000"
)
results="$work/results.jsonl"
for w in "${workloads[@]}"; do
  IFS='|' read -r name producers subscribers size batch rate <<< "$w"
  events=$EVENTS
  [ "$rate" != 0 ] && events=$(( rate * 5 ))   # five seconds at the target rate
  window_events=$(( 16 * batch ))
  ours=$("$BIN/diaspora" bench relay --json --producers "$producers" --subscribers "$subscribers" \
         --events "$events" --size "$size" --batch "$batch" --window 16 --rate "$rate")
  peer=$("$BIN/bench_jetstream" --json --url "nats://127.0.0.1:$port" --producers "$producers" \
         --subscribers "$subscribers" --events "$events" --size "$size" --window "$window_events" --rate "$rate")
  printf '{"workload": "%s", "ours": %s, "peer": %s}\n' "$name" "$ours" "$peer" >> "$results"
done

$PY - "$results" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| workload | system | acked events/s | MB/s | p50 µs | p99 µs | p99.9 µs |")
print("|---|---|---:|---:|---:|---:|---:|")
for r in rows:
    for key, label in (("ours", "diaspora-relay (fsync always)"), ("peer", "NATS JetStream (file, defaults)")):
        m = r[key]
        print(f"| {r['workload']} | {label} | {m['events_per_s']:.0f} | {m['mb_per_s']:.1f} | "
              f"{m['p50_us']:.0f} | {m['p99_us']:.0f} | {m['p999_us']:.0f} |")
    o, p = r["ours"], r["peer"]
    print(f"| {r['workload']} | **ratio relay / JetStream** | **{o['events_per_s'] / p['events_per_s']:.2f}×** | | "
          f"{o['p50_us'] / max(p['p50_us'], 1):.2f}× | {o['p99_us'] / max(p['p99_us'], 1):.2f}× | |")
PYEOF
