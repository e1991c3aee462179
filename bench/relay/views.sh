#!/usr/bin/env bash
# The relay's views: (1) what they cost the relay at its full acked publish rate: the same
# workload (task heartbeats on <x>.events, 4 producers, 1 subscriber, fsync always) with the
# views on and off, alternated ROUNDS times in this run, medians and their ratio (target:
# on >= 0.90 x off) and whether the views kept up (their backlog when the run ended); (2) bench_views: building them from a log of 100,000 task instances
# and the query latency (target: <= 50 ms).
#   bench/relay/views.sh [BUILD_DIR]        QUICK=1 for a short run
set -euo pipefail
# The project's Python (.venv from scripts/install-deps.sh), unless DIASPORA_PYTHON names another.
PY="${DIASPORA_PYTHON:-$(cd "$(dirname "$0")/../.." && pwd)/.venv/bin/python}"
BUILD_DIR=${1:-build}
BIN="$BUILD_DIR/bin"
EVENTS=${EVENTS:-1000000}
ROUNDS=${ROUNDS:-3}
[ "${QUICK:-0}" = 1 ] && EVENTS=200000 && ROUNDS=2
results=$(mktemp "${TMPDIR:-/tmp}/diaspora-views.XXXXXX")
trap 'rm -f "$results"' EXIT
for round in $(seq 1 "$ROUNDS"); do
  for views in true false; do
    r=$("$BIN/diaspora" bench relay --json --task-events --views "$views" --producers 4 --subscribers 1 \
        --events "$EVENTS" --size 256 --batch 500 --window 16 --fsync always)
    printf '{"views": %s, "round": %d, "run": %s}\n' "$views" "$round" "$r" >> "$results"
  done
done
$PY - "$results" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(v, k): return statistics.median(r["run"][k] for r in rows if r["views"] == v)
on, off = med(True, "events_per_s"), med(False, "events_per_s")
print("| relay, task heartbeats on <x>.events, 4 producers x 1 subscriber, 256 B, fsync always | acked events/s (median) | p50 µs | p99 µs |")
print("|---|---:|---:|---:|")
for v, label in ((True, "views on"), (False, "views off")):
    print(f"| {label} ({sum(r['views'] == v for r in rows)} runs, alternated) | {med(v, 'events_per_s'):.0f} | "
          f"{med(v, 'p50_us'):.0f} | {med(v, 'p99_us'):.0f} |")
print(f"| **ratio on / off** | **{on / off:.3f}×** (target ≥ 0.90) | | |")
ons = [r["run"] for r in rows if r["views"]]
print(f"views on: records not yet read when the last event was delivered: max {max(r['views_backlog'] for r in ons)} "
      f"(of {ons[0]['events']}); read {max(r['views_catch_up_s'] for r in ons) * 1e3:.1f} ms later at most")
PYEOF
echo
"$BIN/bench_views" --instances "${INSTANCES:-100000}"
