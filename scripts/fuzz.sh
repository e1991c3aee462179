#!/usr/bin/env bash
# `make fuzz`: the fuzz targets of tests/fuzz/ built with clang, libFuzzer, ASan and UBSan
# (every Diaspora target instrumented for coverage) into build-fuzz/, each run for
# FUZZ_SECONDS seconds (default 60) on its seed corpus, then a table of what each did.
#
#   make fuzz                         every target, 60 s each
#   FUZZ_SECONDS=600 FUZZ_TARGETS="frame token" make fuzz
#   FUZZ_NO_BUILD=1 FUZZ_TARGETS=views make fuzz   # no build: beside another run
#   FUZZ_TIMEOUT=30 ...   # seconds an input may take (default 10; more on a machine busy with other work)
#
# New inputs that reach new code are kept in build-fuzz/corpus/<target>/ (the next run
# starts from them). A crash, hang (10 s), leak, sanitizer report or broken invariant stops
# that target and leaves its input in build-fuzz/findings/<target>-*: replay it with
# build/fuzz/fuzz_<target> FILE (the g++ build) or build-fuzz/fuzz/fuzz_<target> FILE, fix
# it, and add the input to tests/fuzz/regressions/<target>/ (docs/reliability.md).
set -uo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${FUZZ_SECONDS:-60}
OUT=build-fuzz
ALL="event frame token spec relay_config http log spool views lines scan jetstream items"
TARGETS=${FUZZ_TARGETS:-$ALL}

if [ -z "${FUZZ_NO_BUILD:-}" ]; then  # FUZZ_NO_BUILD=1: run what build-fuzz/ holds (two runs side by side)
  bash scripts/install-deps.sh --fuzz || exit 1
  cmake -S . -B $OUT -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang-15 -DCMAKE_CXX_COMPILER=clang++-15 \
    -DDIASPORA_FUZZ=ON -DDIASPORA_SANITIZE=address,undefined \
    -DDIASPORA_BUILD_TESTS=OFF -DDIASPORA_BUILD_BENCH=OFF -DDIASPORA_WITH_TORCH=OFF >/dev/null || exit 1
  cmake --build $OUT -j "$(nproc)" --target $(for t in $TARGETS; do printf 'fuzz_%s ' "$t"; done) || exit 1
fi

mkdir -p $OUT/findings
export PATH=/usr/lib/llvm-15/bin:$PATH  # llvm-symbolizer: reports name files and lines
# malloc_context_size=0: no stack is unwound at each allocation (about 2x the executions
# for the allocation-heavy spec target); a report then lacks where the memory was
# allocated: replay the saved input (build/fuzz/fuzz_<target> FILE) for the full report.
export ASAN_OPTIONS=${FUZZ_ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1:malloc_context_size=0}
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# The targets that open a store per input (log, spool, views, http, relay_config) write
# their scratch files under TMPDIR: a tmpfs makes them several times faster.
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi
failed=0
rows=()
for t in $TARGETS; do
  mkdir -p $OUT/corpus/$t
  mapfile -t seeds < $OUT/fuzz/$t.seeds
  log=$OUT/findings/$t.log
  echo "== fuzz_$t: ${SECONDS_EACH} s"
  # -rss_limit_mb: the log and views targets open a store per input; 2 GiB is ample.
  (cd $OUT && ./fuzz/fuzz_$t -max_total_time="$SECONDS_EACH" -timeout="${FUZZ_TIMEOUT:-10}" -rss_limit_mb=2048 \
      -artifact_prefix=findings/$t- -print_final_stats=1 corpus/$t "${seeds[@]}") >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  files=$(find $OUT/corpus/$t -type f | wc -l)
  if [ $rc -eq 0 ]; then verdict="no finding"; else verdict="FINDING (rc $rc): $log"; failed=1; fi
  rows+=("$(printf '%-13s %12s %10s %8s %8s  %s' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "$files" "$verdict")")
  [ $rc -eq 0 ] || grep -E "ERROR|runtime error|invariant|Timeout|leak|Test unit written" "$log" | head -5
done
echo
printf '%-13s %12s %10s %8s %8s  %s\n' target executions exec/s edges corpus verdict
printf '%s\n' "${rows[@]}"
exit $failed
