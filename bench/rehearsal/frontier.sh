#!/usr/bin/env bash
# The ptycho-sim trade-off between rehearsal's runtime and the first scan's error (the target:
# within 10 % of scratch's; the runtime is judged by the machinery's overhead, docs/rehearsal.md
# "The targets"), over several seeds: for each number
# R of representatives a step (sampling.representatives) and each seed, one run.sh cell on
# RANKS ranks (default 1: the rehearsal job and its incremental neighbour at the same time,
# each pinned to a core; 2: one after the other) plus scratch; then bench/rehearsal/frontier.py prints, per R, the runtime ratio and
# the first-scan error as a multiple of scratch's on every seed. See docs/rehearsal.md
# (Benchmark, "The ptycho-sim frontier").
#
#   bash bench/rehearsal/frontier.sh [BUILD_DIR]     # R = 2 4 8 16, seeds 0-4, ER at 2,000
#   REPS="4 16" SEEDS="0 1" STRATEGIES="er derpp" BUFFERS="200 2000" OUT=/tmp/fr bash bench/rehearsal/frontier.sh build
#   RANKS=2 REPS="4 24" SEEDS="0 1 2" OUT=/tmp/fr-w2 bash bench/rehearsal/frontier.sh build
#   SET="train.ema=0.99" OUT=/tmp/fr-ema bash bench/rehearsal/frontier.sh build
#                        # every job (scratch too) with these --set overrides; an OUT keeps
#                        # the SET of its first call (OUT/SET) and refuses another
#
# Scratch and incremental do not draw representatives, so they run once a seed (in the first
# R folder that has them finished, else in the first R of REPS) and the other R folders link
# to them. A finished cell is not run
# again: rerunning the script after an interruption, or with more REPS, runs only what is missing.
set -euo pipefail
BUILD_DIR=${1:-build}  # as for run.sh: relative to the repository root
HERE="$(cd "$(dirname "$0")" && pwd)"
# The project's Python (.venv from scripts/install-deps.sh), unless DIASPORA_PYTHON names another.
PY="${DIASPORA_PYTHON:-$HERE/../../.venv/bin/python}"
OUT=$(realpath -m -- "${OUT:-/tmp/diaspora-bench-frontier}")  # run.sh works from the repository root
read -r -a R_LIST <<<"${REPS:-2 4 8 16}"
read -r -a SEED_LIST <<<"${SEEDS:-0 1 2 3 4}"
STRATEGIES=${STRATEGIES:-er}  # checked by run.sh
BUFFERS=${BUFFERS:-2000}
RANKS=${RANKS:-1}  # RANKS=2: 2-rank jobs (two cores a job, so each pair runs one job after the other)
[[ "$RANKS" =~ ^[12]$ ]] || { echo "RANKS must be 1 or 2, not '$RANKS'"; exit 2; }
for r in "${R_LIST[@]}"; do
  [[ "$r" =~ ^[1-9][0-9]*$ ]] || { echo "REPS takes positive integers, not '$r'"; exit 2; }
done
for s in "${SEED_LIST[@]}"; do
  [[ "$s" =~ ^[0-9]+$ ]] || { echo "SEEDS takes non-negative integers, not '$s'"; exit 2; }
done
[ "${#R_LIST[@]}" -gt 0 ] && [ "${#SEED_LIST[@]}" -gt 0 ] || { echo "REPS and SEEDS need at least one value each"; exit 2; }
# Every job of an OUT runs with the same SET: a later call with another one is refused.
mkdir -p "$OUT"
if [ -f "$OUT/SET" ]; then
  was=$(cat "$OUT/SET")
  [ "$was" = "${SET:-}" ] || { echo "$OUT was measured with SET='$was', not SET='${SET:-}': use another OUT"; exit 2; }
else
  printf '%s' "${SET:-}" >"$OUT/SET"
fi
for si in "${!SEED_LIST[@]}"; do
  s=${SEED_LIST[$si]}
  home=""  # the R folder of this seed whose finished scratch and incremental jobs the others link to
  for d in "$OUT/seed$s"/r*/pt-scratch-w"$RANKS"; do
    if [ ! -L "$d" ] && [ -f "$d/summary.json" ] && [ -f "$(dirname "$d")/pt-incremental-w$RANKS/summary.json" ]; then
      home=$(basename "$(dirname "$d")")
      break
    fi
  done
  for ri in "${!R_LIST[@]}"; do
    r=${R_LIST[$ri]}
    dir="$OUT/seed$s/r$r"
    mkdir -p "$dir"
    if [ -z "$home" ]; then
      home="r$r"  # runs them now, before the other R of this seed
    elif [ "$home" != "r$r" ]; then
      for base in pt-scratch-w"$RANKS" pt-incremental-w"$RANKS"; do
        if [ -L "$dir/$base" ] && [ ! -e "$dir/$base" ]; then rm -f "$dir/$base"; fi  # dangling
        [ -e "$dir/$base" ] || ln -s "../$home/$base" "$dir/$base"
      done
    fi
    echo "seed $s, R = $r" >&2
    # Which core takes the incremental job alternates over seeds and R alike, so that a
    # difference between the cores averages out of each R's median.
    if ! PAIR_START=$(((si + ri) % 2)) OUT="$dir" SEED="$s" STRATEGIES="$STRATEGIES" BUFFERS="$BUFFERS" ONLY=ptycho \
      RANKS="$RANKS" REPEAT=1 PAIRS=concurrent SET="${SET:-} sampling.representatives=$r" \
      bash "$HERE/run.sh" "$BUILD_DIR" >"$dir/table.md"; then
      cat "$dir/table.md" >&2
      echo "frontier: seed $s, R = $r failed (run.sh's output above)" >&2
      exit 1
    fi
  done
done
"$PY" "$HERE/frontier.py" "$OUT"
