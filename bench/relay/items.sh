#!/usr/bin/env bash
# Data items (docs/streaming.md): bulk throughput through the relay on loopback (its log,
# fsync before each ack; and the relay storing on JetStream) against the same items'
# chunks through NATS JetStream directly, one nats-server (Debian's) on 127.0.0.1, one run.
#   bench/relay/items.sh [BUILD_DIR]        ITEMS=32 SIZE_MIB=16 CHUNK_KIB=256; QUICK=1 for a short run
set -euo pipefail
PY="${DIASPORA_PYTHON:-$(cd "$(dirname "$0")/../.." && pwd)/.venv/bin/python}"
BUILD_DIR=${1:-build}
ITEMS=${ITEMS:-32}
[ "${QUICK:-0}" = 1 ] && ITEMS=8
work=$(mktemp -d "${TMPDIR:-/tmp}/diaspora-itemsbench.XXXXXX")
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
port=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
nats-server -a 127.0.0.1 -p "$port" -js -sd "$work/js" > "$work/nats.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q "Server is ready" "$work/nats.log" 2>/dev/null && break; sleep 0.1; done
"$BUILD_DIR/bin/bench_items" --items "$ITEMS" --size "${SIZE_MIB:-16}" --chunk "${CHUNK_KIB:-256}" --nats "nats://127.0.0.1:$port"
