#!/usr/bin/env bash
# Two builds side by side (e.g. before and after a refactor that must not change the
# figures): the relay's acked-publish rate and latency (`diaspora bench relay`), the
# plugin's hook cost and end-to-end rate (bench_plugin) and `diaspora run`'s (bench/run:
# no-op tasks/s, the runner's CPU per task, the recovery reaction time), each run
# alternately with one build then the other, RUNS times, so the machine's drift falls on
# both alike. Prints the median of each figure per build and their ratio (new / old).
#   bench/compare_builds.sh OLD_BIN_DIR NEW_BIN_DIR      RUNS=3 by default; ONLY=relay,plugin,run
set -euo pipefail
old=${1:?usage: compare_builds.sh OLD_BIN_DIR NEW_BIN_DIR}
new=${2:?usage: compare_builds.sh OLD_BIN_DIR NEW_BIN_DIR}
runs=${RUNS:-3}
only=${ONLY:-relay,plugin,run}
here=$(cd "$(dirname "$0")" && pwd)
# The project's Python (.venv from scripts/install-deps.sh), unless DIASPORA_PYTHON names another.
PY="${DIASPORA_PYTHON:-$here/../.venv/bin/python}"
out=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$out"' EXIT
[ -n "${KEEP:-}" ] && echo "raw results in $out" >&2
for b in "$old" "$new"; do
  for p in diaspora bench_plugin; do
    [ -x "$b/$p" ] || { echo "$b/$p: not built (configure with -DDIASPORA_BUILD_BENCH=ON)" >&2; exit 2; }
  done
done

relay() {  # BIN TAG
  "$1/diaspora" bench relay --json --events 400000 --producers 2 --subscribers 1 --batch 500 >> "$out/relay.$2"
  "$1/diaspora" bench relay --json --events 60000 --rate 20000 --producers 1 --subscribers 1 >> "$out/latency.$2"
}
plugin() {  # BIN TAG
  "$1/bench_plugin" --e2e-only --e2e-events=400000 --e2e-rates=0 --e2e-validate=on 2>&1 |
    grep -E '^(plugin|direct)' >> "$out/e2e.$2" || true
  "$1/bench_plugin" --hook-only --benchmark_min_time=0.3 2>&1 |
    grep -E '^diaspora_task_heartbeat,' >> "$out/hook.$2" || true
}
run() {  # BIN TAG: bench/run's figures of this build (run_bench.py --json)
  "$PY" "$here/run/run_bench.py" --build "$(cd "$1/.." && pwd)" --json >> "$out/run.$2"
}
for i in $(seq 1 "$runs"); do
  if [ $((i % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for tag in $order; do
    bin=$old; [ "$tag" = new ] && bin=$new
    echo "run $i: $tag ($bin)" >&2
    [[ ,$only, == *,relay,* ]] && relay "$bin" "$tag"
    [[ ,$only, == *,plugin,* ]] && plugin "$bin" "$tag"
    [[ ,$only, == *,run,* ]] && run "$bin" "$tag"
  done
done
for f in relay latency e2e hook run; do touch "$out/$f.old" "$out/$f.new"; done

"$PY" - "$out" <<'PY'
import json, re, statistics, sys
from pathlib import Path
d = Path(sys.argv[1])
def med(xs): return statistics.median(xs) if xs else float("nan")
def jfield(name, key):
    vals = lambda t: [json.loads(l).get(key) for l in (d / f"{name}.{t}").read_text().splitlines() if l.strip()]
    return {t: [v for v in vals(t) if v is not None] for t in ("old", "new")}
rows = [("relay acked events/s (2 producers, 1 subscriber)", jfield("relay", "events_per_s")),
        ("relay p99 latency us at 20k events/s", jfield("latency", "p99_us")),
        ("relay p50 latency us at 20k events/s", jfield("latency", "p50_us")),
        ("run: no-op tasks/s (2000 tasks, 2 workers)", jfield("run", "tasks_per_s")),
        ("run: runner CPU us per task", jfield("run", "runner_cpu_us_per_task")),
        ("run: recovery reaction s (mean of the faults)", jfield("run", "recovery_reaction_mean_s"))]
rows = [(label, v) for label, v in rows if v["old"] and v["new"]]
def lines(name):
    return {t: (d / f"{name}.{t}").read_text().splitlines() for t in ("old", "new")}
e2e = lines("e2e")  # "<label, 52 wide> <events/s> ..."
for label in sorted({l[:52].strip() for l in e2e["old"]}):
    vals = {t: [float(l[52:].split()[0]) for l in e2e[t] if l[:52].strip() == label] for t in e2e}
    rows.append((f"e2e {label} (events/s)", vals))
hook = lines("hook")  # "<label, 34 wide> <median ns> <p99 ns>"
for label in sorted({l[:34].strip() for l in hook["old"]}):
    vals = {t: [float(l[34:].split()[0]) for l in hook[t] if l[:34].strip() == label] for t in hook}
    rows.append((f"hook {label}: median ns", vals))
print(f"{'figure':60s} {'old':>12s} {'new':>12s} {'new/old':>8s}")
for label, v in rows:
    o, n = med(v["old"]), med(v["new"])
    print(f"{label:60s} {o:12.1f} {n:12.1f} {n / o if o else float('nan'):8.3f}")
PY
