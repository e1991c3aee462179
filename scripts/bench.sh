#!/usr/bin/env bash
# `make bench`: runs every benchmark binary the build produced (build/bin/bench_*).
set -euo pipefail
BUILD_DIR=${1:-build}
shopt -s nullglob
benches=("$BUILD_DIR"/bin/bench_*)
if [ ${#benches[@]} -eq 0 ]; then
  echo "no benchmarks were built (configure with -DDIASPORA_BUILD_BENCH=ON)"
  exit 1
fi
for b in "${benches[@]}"; do
  echo "== $(basename "$b")"
  "$b" --benchmark_min_time=0.2
done
