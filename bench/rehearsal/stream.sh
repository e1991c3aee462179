#!/usr/bin/env bash
# The longer ptycho-sim stream (rehearsal/configs/ptycho-sim-10.yaml, 10 scans): for each seed
# in SEEDS (default 0-4), scratch on one core while the shipped rehearsal job and then an
# incremental job run on the other (so the rehearsal job and scratch see the same host); then
# bench/rehearsal/stream.py prints rehearsal's runtime as a multiple of scratch's (target
# <= 0.5) and its first-scan error as a multiple of scratch's (target <= 1.1) seed by seed,
# and draws the training time per scan of the three (OUT/stream-runtime.svg). Then (unless
# SWAP=0) scratch and the rehearsal job run once more with the cores swapped
# (*-swapped-seedS): the two cores of this VM differ by a few percent, and the runtime ratio
# printed is the geometric mean of the two pairs', so which core a job had cancels out.
# About 4.5 min a seed on this 2-core machine (2.5 with SWAP=0). Finished jobs are not run again.
#
#   bash bench/rehearsal/stream.sh [BUILD_DIR]
#   SEEDS="0 1" OUT=/tmp/st bash bench/rehearsal/stream.sh build
#   SWAP=0 bash bench/rehearsal/stream.sh build   # one pair a seed, scratch on the first core
set -euo pipefail
BUILD_DIR=${1:-build}
cd "$(dirname "$0")/../.."
OUT=$(realpath -m -- "${OUT:-/tmp/diaspora-bench-stream}")
CONFIG=${CONFIG:-rehearsal/configs/ptycho-sim-10.yaml}
read -r -a SEED_LIST <<<"${SEEDS:-0 1 2 3 4}"
for s in "${SEED_LIST[@]}"; do
  [[ "$s" =~ ^[0-9]+$ ]] || { echo "SEEDS takes non-negative integers, not '$s'"; exit 2; }
done
SWAP=${SWAP:-1}
[[ "$SWAP" =~ ^[01]$ ]] || { echo "SWAP must be 0 or 1, not '$SWAP'"; exit 2; }
TRAIN="$BUILD_DIR/bin/diaspora-train"
[ -x "$TRAIN" ] || { echo "no $TRAIN (configure with -DDIASPORA_WITH_TORCH=ON)"; exit 1; }
read -r -a CPUS < <(/usr/bin/python3 -c 'import os; print(*sorted(os.sched_getaffinity(0))[:2])')
PIN=(taskset -c)
if [ "${#CPUS[@]}" -lt 2 ] || ! command -v taskset >/dev/null; then
  echo "no two CPUs or no taskset: the jobs run unpinned, at the same time"; PIN=(); CPUS=("" "")
fi
PIDS=""
trap 'for p in $PIDS; do kill "$p" 2>/dev/null; done' EXIT
trap 'exit 130' INT TERM
job() {  # CPU NAME STRATEGY: one job unless its summary is there; fails the script on failure
  local cpu=$1 name=$2 strategy=$3
  [ -f "$OUT/$name/summary.json" ] && return
  rm -rf "${OUT:?}/$name"
  echo "  $name${cpu:+ (cpu $cpu)}" >&2
  if ! ${PIN[@]:+"${PIN[@]}" "$cpu"} "$TRAIN" --config "$CONFIG" --out "$OUT/$name" --set strategy="$strategy" \
       --set seed="${name##*seed}" >"$OUT/$name.log" 2>&1; then
    echo "FAILED: $name (log: $OUT/$name.log)"; tail -5 "$OUT/$name.log"; return 1
  fi
}
mkdir -p "$OUT"
cp "$CONFIG" "$OUT/config.yaml"
for seed in "${SEED_LIST[@]}"; do
  job "${CPUS[0]}" "scratch-seed$seed" scratch & PIDS=$!
  reh=$(sed -n 's/^strategy: *//p' "$CONFIG")
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
/usr/bin/python3 bench/rehearsal/stream.py "$OUT"
