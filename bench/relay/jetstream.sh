#!/usr/bin/env bash
# The relay on a NATS JetStream cluster (relay.yaml `storage: jetstream`), side by side in one
# run with the embedded relay and with JetStream used directly, on the same workload: a
# three-node cluster (nats-server from Debian) on 127.0.0.1, three copies of every stream.
# Rows: the embedded relay (its log, fsync always); 1, 2 and 3 relays on the cluster
# (`diaspora bench relay --jetstream ... --relays N`: the relays in the benchmark's process,
# producers and subscribers spread over them in turn); JetStream directly (bench_jetstream,
# asynchronous publish with acks, the same window). Prints a Markdown table and the ratios
# docs/performance.md reports.
#   bench/relay/jetstream.sh [BUILD_DIR]        QUICK=1 for a short run
set -euo pipefail
PY="${DIASPORA_PYTHON:-$(cd "$(dirname "$0")/../.." && pwd)/.venv/bin/python}"
BUILD_DIR=${1:-build}
BIN="$BUILD_DIR/bin"
EVENTS=${EVENTS:-300000}
[ "${QUICK:-0}" = 1 ] && EVENTS=60000
PRODUCERS=${PRODUCERS:-6}  # a multiple of 1, 2 and 3: each relay gets as many
work=$(mktemp -d "${TMPDIR:-/tmp}/diaspora-jsbench.XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ports=() cports=()
for i in 0 1 2; do ports+=("$(free_port)"); cports+=("$(free_port)"); done
for i in 0 1 2; do
  routes=$(for j in 0 1 2; do [ "$j" = "$i" ] || printf 'nats://127.0.0.1:%s,' "${cports[$j]}"; done)
  nats-server -a 127.0.0.1 -p "${ports[$i]}" -js -sd "$work/n$i" -n "n$i" --cluster_name bench \
    --cluster "nats://127.0.0.1:${cports[$i]}" --routes "${routes%,}" > "$work/n$i.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 1 300); do
  grep -q "JetStream cluster new metadata leader" "$work"/n*.log 2>/dev/null && break
  sleep 0.1
done
grep -q "JetStream cluster new metadata leader" "$work"/n*.log || { echo "the cluster elected no leader" >&2; tail "$work"/n*.log >&2; exit 1; }
urls="nats://127.0.0.1:${ports[0]},nats://127.0.0.1:${ports[1]},nats://127.0.0.1:${ports[2]}"

common=(--json --producers "$PRODUCERS" --subscribers 1 --events "$EVENTS" --size 256 --batch 500 --window 16)
results="$work/results.jsonl"
row() {  # LABEL JSON: a run that printed no figures stops the script (its error is above)
  if [ -z "$2" ]; then echo "jetstream.sh: the run \"$1\" failed (a loaded machine: see its error above)" >&2; exit 1; fi
  printf '{"label": "%s", "m": %s}\n' "$1" "$2" >> "$results"
}
row "embedded relay (its log, fsync always)" "$("$BIN/diaspora" bench relay "${common[@]}")"
for n in 1 2 3; do
  row "$n relay(s) on the cluster" "$("$BIN/diaspora" bench relay "${common[@]}" --jetstream "$urls" --replicas 3 --relays "$n")"
done
row "JetStream directly" "$("$BIN/bench_jetstream" --json --url "nats://127.0.0.1:${ports[0]}" --producers "$PRODUCERS" \
  --subscribers 1 --events "$EVENTS" --size 256 --window 8000 --replicas 3)"

$PY - "$results" "$EVENTS" "$PRODUCERS" "$(nproc)" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{sys.argv[2]} events of 256 B, {sys.argv[3]} producers (batches of 500, 16 in flight each), 1 subscriber, "
      f"three nodes, 3 replicas, {sys.argv[4]} cores")
print("| system | acked events/s | MB/s | p50 µs | p99 µs |")
print("|---|---:|---:|---:|---:|")
for r in rows:
    m = r["m"]
    print(f"| {r['label']} | {m['events_per_s']:.0f} | {m['mb_per_s']:.1f} | {m['p50_us']:.0f} | {m['p99_us']:.0f} |")
by = {r["label"]: r["m"]["events_per_s"] for r in rows}
one = by["1 relay(s) on the cluster"]
print(f"\nrelay on JetStream / JetStream directly: {one / by['JetStream directly']:.2f}x; "
      f"2 relays / 1: {by['2 relay(s) on the cluster'] / one:.2f}x; 3 relays / 1: {by['3 relay(s) on the cluster'] / one:.2f}x; "
      f"embedded relay / relay on JetStream: {by['embedded relay (its log, fsync always)'] / one:.2f}x")
PYEOF
