#!/usr/bin/env bash
# The continual-learning benchmark of docs/rehearsal.md: split Fashion-MNIST (5 x 2 classes,
# class-incremental) with scratch, incremental, ER, DER, DER++ at buffers of 200, 500 and
# 2,000 samples in total, on 1 and 2 ranks; then ptycho-sim (5 scans) on the same
# grid. Prints one table (bench/rehearsal/table.py) and the issue's targets.
#
#   bash bench/rehearsal/run.sh [BUILD_DIR]        # full: over an hour on 2 cores (Fashion-MNIST
#                                # at 5 epochs a task: 26 min for 3 cells on 1 and 2 ranks)
#   QUICK=1 bash bench/rehearsal/run.sh build      # 1 rank, buffers 200 and 2000 only
#   SEED=1 OUT=/tmp/rb bash bench/rehearsal/run.sh
#   ONLY=ptycho bash bench/rehearsal/run.sh build  # one dataset: fashion-mnist or ptycho
#   ONLY=fashion-mnist RANKS=1 REPEAT=3 bash bench/rehearsal/run.sh build
#                                # 1 rank, each rehearsal/incremental pair run three times
#   OUT=/tmp/rb-r8 ONLY=ptycho SET="sampling.representatives=8 train.epochs=24" bash bench/rehearsal/run.sh build
#                                # every job with these --set overrides (use a fresh OUT)
#   ONLY=ptycho RANKS=1 STRATEGIES=er BUFFERS=2000 bash bench/rehearsal/run.sh build
#                                # one cell (with scratch and incremental); frontier.sh uses it
#   PAIRS=sequential bash bench/rehearsal/run.sh build
#                                # 1-rank pairs one after the other, as 2-rank pairs always are
set -euo pipefail
BUILD_DIR=${1:-build}
cd "$(dirname "$0")/../.."
# The project's Python (.venv from scripts/install-deps.sh), unless DIASPORA_PYTHON names another.
PY="${DIASPORA_PYTHON:-$PWD/.venv/bin/python}"
OUT=${OUT:-/tmp/diaspora-bench-rehearsal}
SEED=${SEED:-0}
TRAIN="$BUILD_DIR/bin/diaspora-train"
[ -x "$TRAIN" ] || { echo "no $TRAIN (configure with -DDIASPORA_WITH_TORCH=ON)"; exit 1; }
mkdir -p "$OUT"

# A rehearsal job and its incremental neighbour of the same config and ranks
# (OUT/pair/NAME): the table's "x incremental" divides by the neighbour's runtime. A 1-rank
# pair runs at the same time, each job pinned to a core of its own (swapped from pair to
# pair), so both see the same host: this VM's speed drifts by up to 1.7x within minutes,
# and jobs run one after the other measured the drift as much as the job (27 sequential
# 1-rank pairs gave 0.80x-1.56x; concurrent pairs of one cell agree within about 3 %). The
# rehearsal job's own threads (inserter, sampler, checkpoint writer) share its core.
# 2-rank pairs (two cores a job) and PAIRS=sequential run the incremental job right before.
# REPEAT=N runs each pair N times (the extra ones under OUT/repeat/K/): the table then gives
# the median of the N ratios and lists them.
PAIR_NO=${PAIR_START:-0}  # PAIR_START=1: the first pair's incremental job takes the second core
[[ "$PAIR_NO" =~ ^[01]$ ]] || { echo "PAIR_START must be 0 or 1, not '$PAIR_NO'"; exit 2; }
RUNNING=""  # pids of the jobs running now (killed if the script stops)
trap 'for p in $RUNNING; do kill "$p" 2>/dev/null; done' EXIT
trap 'exit 130' INT TERM
launch() {  # CPU NAME CONFIG ARGS...: one job in the background (pinned to CPU unless it is ""); LAUNCHED=its pid
  local cpu=$1 name=$2 config=$3
  shift 3
  rm -rf "${OUT:?}/$name"
  mkdir -p "$(dirname "$OUT/$name")"  # pair/ and repeat/K/pair/
  echo "  $name${cpu:+ (cpu $cpu)}" >&2
  ${cpu:+taskset -c "$cpu"} "$TRAIN" --config "$config" --out "$OUT/$name" --set seed="$SEED" "${EXTRA[@]}" "$@" \
    >"$OUT/$name.log" 2>&1 &
  LAUNCHED=$!
}
finish() {  # PID NAME: waits for a launched job; on failure the script stops (the trap kills the other)
  wait "$1" && return
  echo "FAILED: $2 (log: $OUT/$2.log)"; tail -5 "$OUT/$2.log"; exit 1
}
run() {  # NAME CONFIG ARGS...: one job, unpinned, unless its summary is already there
  [ -f "$OUT/$1/summary.json" ] && return
  launch "" "$@"
  RUNNING=$LAUNCHED
  finish "$LAUNCHED" "$1"
  RUNNING=""
}
pair_and_cell() {  # PREFIX NAME RANKS CONFIG ARGS...
  local prefix=$1 name=$2 ranks=$3 config=$4 p1 p2 first
  shift 4
  if [ "$ranks" = 1 ] && [ "$PAIRS" = concurrent ]; then
    # Done only when both jobs and the mark are there (an interrupted pair runs again whole).
    [ -f "$OUT/$prefix$name/summary.json" ] && [ -f "$OUT/${prefix}pair/$name/summary.json" ] &&
      [ -f "$OUT/${prefix}pair/$name.concurrent" ] && return
    rm -f "$OUT/${prefix}pair/$name.concurrent"
    first=$((PAIR_NO % 2))
    PAIR_NO=$((PAIR_NO + 1))
    launch "${CPUS[$first]}" "${prefix}pair/$name" "$config" "$@" --set strategy=incremental
    p1=$LAUNCHED
    launch "${CPUS[$((1 - first))]}" "$prefix$name" "$config" "$@"
    p2=$LAUNCHED
    RUNNING="$p1 $p2"
    finish "$p1" "${prefix}pair/$name"
    finish "$p2" "$prefix$name"
    RUNNING=""
    touch "$OUT/${prefix}pair/$name.concurrent"
  else
    [ -f "$OUT/$prefix$name/summary.json" ] && return
    rm -rf "${OUT:?}/${prefix}pair/$name" "${OUT:?}/${prefix}pair/$name.concurrent"
    run "${prefix}pair/$name" "$config" "$@" --set strategy=incremental
    run "$prefix$name" "$config" "$@"
  fi
}
singles() {  # PREFIX RANKS CONFIG: the scratch and incremental jobs; on 1 rank with concurrent
  # pairs both at the same time, each pinned to a core of its own (one intra-op thread a job)
  local prefix=$1 w=$2 config=$3 s name i=0 jobs=()
  if [ "$w" != 1 ] || [ "$PAIRS" != concurrent ]; then
    for s in scratch incremental; do run "$prefix-$s-w$w" "$config" --world-size "$w" --set strategy=$s; done
    return
  fi
  RUNNING=""
  for s in scratch incremental; do
    name="$prefix-$s-w$w"
    [ -f "$OUT/$name/summary.json" ] && continue
    launch "${CPUS[$i]}" "$name" "$config" --world-size 1 --set strategy=$s
    i=$((i + 1))
    jobs+=("$LAUNCHED:$name")
    RUNNING="$RUNNING $LAUNCHED"
  done
  for j in "${jobs[@]}"; do finish "${j%%:*}" "${j#*:}"; done
  RUNNING=""
}
cell() {  # NAME RANKS CONFIG ARGS...
  local k
  pair_and_cell "" "$@"
  for ((k = 2; k <= REPEAT; k++)); do
    pair_and_cell "repeat/$k/" "$@"
  done
}

EXTRA=()  # SET="key=value ...": one --set each, for every job (before the job's own)
for kv in ${SET:-}; do
  [[ "$kv" == *=* ]] || { echo "SET takes key=value words, not '$kv'"; exit 2; }
  EXTRA+=(--set "$kv")
done
REPEAT=${REPEAT:-1}
PAIRS=${PAIRS:-concurrent}
case "$PAIRS" in concurrent|sequential) ;; *) echo "PAIRS must be concurrent or sequential, not '$PAIRS'"; exit 2;; esac
CPUS=()
if [ "$PAIRS" = concurrent ]; then  # the first two CPUs this process may run on
  read -r -a CPUS < <("$PY" -c 'import os; print(*sorted(os.sched_getaffinity(0))[:2])')
  if [ "${#CPUS[@]}" -lt 2 ] || ! command -v taskset >/dev/null; then
    echo "concurrent pairs need two CPUs and taskset (util-linux): running them one after the other"
    PAIRS=sequential
  fi
fi
[[ "$REPEAT" =~ ^[1-9][0-9]*$ ]] || { echo "REPEAT must be a positive integer, not '$REPEAT'"; exit 2; }
if [ -n "${QUICK:-}" ]; then DEF_RANKS="1"; DEF_BUFFERS="200 2000"; else DEF_RANKS="1 2"; DEF_BUFFERS="200 500 2000"; fi
RANKS=${RANKS:-$DEF_RANKS}  # RANKS=1 or RANKS=2: one block of each dataset
BUFFERS=${BUFFERS:-$DEF_BUFFERS}  # BUFFERS="2000": those buffer sizes only
STRATEGIES=${STRATEGIES:-er der derpp}  # STRATEGIES="er": those rehearsal strategies only
read -r -a words <<<"$STRATEGIES"
[ "${#words[@]}" -gt 0 ] || { echo "STRATEGIES needs at least one of er, der and derpp"; exit 2; }
for s in "${words[@]}"; do
  case "$s" in er|der|derpp) ;; *) echo "STRATEGIES takes er, der and derpp, not '$s'"; exit 2;; esac
done
read -r -a words <<<"$BUFFERS"
[ "${#words[@]}" -gt 0 ] || { echo "BUFFERS needs at least one buffer size"; exit 2; }
for b in "${words[@]}"; do
  [[ "$b" =~ ^[1-9][0-9]*$ ]] || { echo "BUFFERS takes positive integers, not '$b'"; exit 2; }
done
FM=rehearsal/configs/fashion-mnist.yaml
PT=rehearsal/configs/ptycho-sim.yaml
ONLY=${ONLY:-}
case "$ONLY" in ""|fashion-mnist|ptycho) ;; *) echo "ONLY must be fashion-mnist or ptycho, not '$ONLY'"; exit 2;; esac
FM_RANKS=$RANKS PT_RANKS=$RANKS
[ "$ONLY" = ptycho ] && FM_RANKS=""
[ "$ONLY" = fashion-mnist ] && PT_RANKS=""
for w in $FM_RANKS; do
  singles fm "$w" "$FM"
  for b in $BUFFERS; do
    for s in $STRATEGIES; do cell "fm-$s-b$b-w$w" "$w" "$FM" --world-size "$w" --set strategy=$s --set buffer_size="$b"; done
  done
done
for w in $PT_RANKS; do  # the same grid on ptycho-sim
  singles pt "$w" "$PT"
  for b in $BUFFERS; do
    for s in $STRATEGIES; do cell "pt-$s-b$b-w$w" "$w" "$PT" --world-size "$w" --set strategy=$s --set buffer_size="$b"; done
  done
done
"$PY" bench/rehearsal/table.py "$OUT"
