#!/usr/bin/env bash
# The longer ptycho-sim stream (rehearsal/configs/ptycho-sim-10.yaml, 10 scans): for each seed
# in SEEDS (default 0-4), the scratch job and the shipped rehearsal job, then an incremental
# job; then bench/rehearsal/stream.py prints rehearsal's cost as a multiple of scratch's
# (target <= 0.5) and its first-scan error as a multiple of scratch's (target <= 1.1) seed by
# seed, and draws the training time per scan of the three (OUT/stream-runtime.svg).
#
# MODE=shared (default): scratch and rehearsal run at the same time on ONE core, rehearsal
# at nice NICE (default 3: about a third of the core, so the two end at about the same time),
# and each is charged its own CPU time (summary cpu_s). The kernel switches between them
# every few milliseconds, so both see the same host: on this VM the same job alone on the
# same core took 67.5 s and then 81.5 s (2026-12-03), and a ratio of two wall times taken
# minutes apart measured that drift as much as the jobs. The two cores take a seed each.
# MODE=pairs: scratch on one core while rehearsal and then incremental run on the other,
# charged their wall runtime; then (unless SWAP=0) scratch and rehearsal once more with the
# cores swapped (*-swapped-seedS), and the ratio is the geometric mean of the two pairs'.
# About 2.5 min a seed (shared: two seeds at a time, ~4 min a round; pairs: 4.5 min a seed).
# Finished jobs are not run again.
#
#   bash bench/rehearsal/stream.sh [BUILD_DIR]
#   SEEDS="0 1" OUT=/tmp/st bash bench/rehearsal/stream.sh build
#   MODE=pairs SWAP=0 bash bench/rehearsal/stream.sh build   # one pair a seed, wall runtimes
set -euo pipefail
BUILD_DIR=${1:-build}
cd "$(dirname "$0")/../.."
# The project's Python (.venv from scripts/install-deps.sh), unless DIASPORA_PYTHON names another.
PY="${DIASPORA_PYTHON:-$PWD/.venv/bin/python}"
OUT=$(realpath -m -- "${OUT:-/tmp/diaspora-bench-stream}")
CONFIG=${CONFIG:-rehearsal/configs/ptycho-sim-10.yaml}
read -r -a SEED_LIST <<<"${SEEDS:-0 1 2 3 4}"
for s in "${SEED_LIST[@]}"; do
  [[ "$s" =~ ^[0-9]+$ ]] || { echo "SEEDS takes non-negative integers, not '$s'"; exit 2; }
done
SWAP=${SWAP:-1}
[[ "$SWAP" =~ ^[01]$ ]] || { echo "SWAP must be 0 or 1, not '$SWAP'"; exit 2; }
MODE=${MODE:-shared}
[[ "$MODE" =~ ^(shared|pairs)$ ]] || { echo "MODE must be shared or pairs, not '$MODE'"; exit 2; }
NICE=${NICE:-3}
[[ "$NICE" =~ ^[0-9]+$ ]] && [ "$NICE" -le 19 ] || { echo "NICE takes 0-19, not '$NICE'"; exit 2; }
TRAIN="$BUILD_DIR/bin/diaspora-train"
[ -x "$TRAIN" ] || { echo "no $TRAIN (configure with -DDIASPORA_WITH_TORCH=ON)"; exit 1; }
read -r -a CPUS < <("$PY" -c 'import os; print(*sorted(os.sched_getaffinity(0))[:2])')
PIN=(taskset -c)
if [ "${#CPUS[@]}" -lt 2 ] || ! command -v taskset >/dev/null; then
  echo "no two CPUs or no taskset: the jobs run unpinned, at the same time"; PIN=(); CPUS=("" "")
fi
PIDS=""
trap 'for p in $PIDS; do kill "$p" 2>/dev/null; done' EXIT
trap 'exit 130' INT TERM
job() {  # CPU NAME STRATEGY [NICE]: one job unless its summary is there; fails the script on failure
  local cpu=$1 name=$2 strategy=$3 niceness=${4:-0}
  [ -f "$OUT/$name/summary.json" ] && return
  rm -rf "${OUT:?}/$name"
  echo "  $name${cpu:+ (cpu $cpu)}${4:+ (nice $niceness)}" >&2
  if ! nice -n "$niceness" ${PIN[@]:+"${PIN[@]}" "$cpu"} "$TRAIN" --config "$CONFIG" --out "$OUT/$name" --set strategy="$strategy" \
       --set seed="${name##*seed}" >"$OUT/$name.log" 2>&1; then
    echo "FAILED: $name (log: $OUT/$name.log)"; tail -5 "$OUT/$name.log"; return 1
  fi
}
mkdir -p "$OUT"
cp "$CONFIG" "$OUT/config.yaml"
reh=$(sed -n 's/^strategy: *//p' "$CONFIG")
if [ -f "$OUT/mode" ] && [ "$(cat "$OUT/mode")" != "$MODE" ]; then
  echo "$OUT holds MODE=$(cat "$OUT/mode") runs: use another OUT for MODE=$MODE"; exit 2
fi
echo "$MODE" >"$OUT/mode"
if [ "$MODE" = shared ]; then
  core() {  # CPU SEED...: on one core, each seed's scratch and rehearsal together, then incremental
    local cpu=$1 seed pids
    shift
    for seed in "$@"; do
      job "$cpu" "scratch-seed$seed" scratch & pids=$!
      job "$cpu" "rehearsal-seed$seed" "$reh" "$NICE" & pids="$pids $!"
      for p in $pids; do wait "$p" || return 1; done
      job "$cpu" "incremental-seed$seed" incremental || return 1
    done
  }
  even=() odd=()
  for i in "${!SEED_LIST[@]}"; do
    if (( i % 2 == 0 )); then even+=("${SEED_LIST[$i]}"); else odd+=("${SEED_LIST[$i]}"); fi
  done
  core "${CPUS[0]}" "${even[@]}" & PIDS=$!
  if [ "${#odd[@]}" -gt 0 ]; then core "${CPUS[1]}" "${odd[@]}" & PIDS="$PIDS $!"; fi
  status=0
  for p in $PIDS; do wait "$p" || status=1; done
  PIDS=""
  [ "$status" = 0 ] || exit 1
  "$PY" bench/rehearsal/stream.py "$OUT"
  exit
fi
for seed in "${SEED_LIST[@]}"; do
  job "${CPUS[0]}" "scratch-seed$seed" scratch & PIDS=$!
  (job "${CPUS[1]}" "rehearsal-seed$seed" "$reh" && job "${CPUS[1]}" "incremental-seed$seed" incremental) & PIDS="$PIDS $!"
  for p in $PIDS; do wait "$p"; done
  PIDS=""
  if [ "$SWAP" = 1 ]; then
    job "${CPUS[1]}" "scratch-swapped-seed$seed" scratch & PIDS=$!
    job "${CPUS[0]}" "rehearsal-swapped-seed$seed" "$reh" & PIDS="$PIDS $!"
    for p in $PIDS; do wait "$p"; done
    PIDS=""
  fi
done
"$PY" bench/rehearsal/stream.py "$OUT"
