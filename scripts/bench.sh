#!/usr/bin/env bash
# `make bench`: the core micro-benchmarks, then the relay against NATS JetStream.
set -euo pipefail
BUILD_DIR=${1:-build}
cd "$(dirname "$0")/.."
# The project's Python (.venv from scripts/install-deps.sh), unless DIASPORA_PYTHON names another.
PY="${DIASPORA_PYTHON:-$PWD/.venv/bin/python}"
if [ ! -x "$BUILD_DIR/bin/bench_core" ]; then
  echo "no benchmarks were built (configure with -DDIASPORA_BUILD_BENCH=ON)"
  exit 1
fi
echo "== bench_core"
"$BUILD_DIR/bin/bench_core" --benchmark_min_time=0.2
echo
echo "== relay vs NATS JetStream (bench/relay/compare.sh)"
bash bench/relay/compare.sh "$BUILD_DIR"
echo
echo "== relay on a 3-node JetStream cluster: embedded relay, 1-3 relays on the cluster, JetStream directly (bench/relay/jetstream.sh)"
bash bench/relay/jetstream.sh "$BUILD_DIR"
echo
echo "== data items: bulk MiB/s through the relay, the relay on JetStream and JetStream directly (bench/relay/items.sh)"
bash bench/relay/items.sh "$BUILD_DIR"
echo
echo "== quality of service: a 100 Mbit/s link saturated by bulk data, lifecycle and control latency by class vs one FIFO (bench/qos; root)"
if [ "$(id -u)" = 0 ]; then
  DIASPORA_BIN_DIR="$(cd "$BUILD_DIR" && pwd)/bin" "$PY" bench/qos/qos_bench.py --build "$BUILD_DIR"
else
  echo "skipped: bench/qos makes network namespaces and shapes their link with tc (run make bench as root)"
fi
echo
echo "== relay views: cost at the full publish rate (on vs off), build rate and query latency (bench/relay/views.sh)"
bash bench/relay/views.sh "$BUILD_DIR"
echo
echo "== relay limits: memory with 10,000 idle sessions, 1,000 topics, a subscriber that never reads (bench/relay/limits.py)"
DIASPORA_BIN_DIR="$(cd "$BUILD_DIR" && pwd)/bin" "$PY" bench/relay/limits.py
echo
echo "== admin console: first load, raw and compressed (bench/console/size.sh)"
bash bench/console/size.sh "$BUILD_DIR"
echo
echo "== engine plugin: hook cost and end to end (bench/plugin)"
"$BUILD_DIR/bin/bench_plugin" --benchmark_min_time=0.5
echo
echo "== resilience engine: observations/s and memory per series (bench/resilience)"
"$BUILD_DIR/bin/bench_resilience" --benchmark_min_time=0.5
echo
echo "== anomaly detection on workflow signals at a policy's default threshold (bench/nab/policy_threshold.py; tuning and development traces)"
"$PY" bench/nab/policy_threshold.py --build "$BUILD_DIR" --configs bench/nab/workflow_configs.json bench/nab/workflow_dev.json
echo
if [ -f ../shared/tools/nab/nab_score.py ]; then
  echo "== the workflow traces scored with NAB's scorer as the policies use the ensemble (bench/nab/workflow_traces.py; tuning and first held-out set)"
  "$PY" bench/nab/workflow_traces.py --build "$BUILD_DIR" --nab-config bench/nab/policy.cfg
else
  echo "== the workflow traces with NAB's scorer: skipped (no ../shared/tools/nab/nab_score.py)"
fi
echo
echo "== diaspora run: policies vs the retry-after=120s baseline, and throughput vs Dask (bench/run)"
"$PY" bench/run/run_bench.py --build "$BUILD_DIR"
echo
echo "== the workflow corpus: 27 specs x 2 seeds, as written and as the retry-after=120s baseline (bench/run/corpus; about an hour)"
"$PY" bench/run/corpus/corpus.py --build "$BUILD_DIR"
echo
echo "== the quick corpus on real Parsl: every site an engine: parsl HTEX (bench/run/corpus --engine parsl; about 12 minutes)"
"$PY" bench/run/corpus/corpus.py --build "$BUILD_DIR" --quick --engine parsl
echo
echo "== engine adapters: Python hook cost, Dask with and without the plugins (bench/adapters)"
"$PY" bench/adapters/bench_adapters.py --build "$BUILD_DIR"
echo
echo "== Parsl: Diaspora beside plain Parsl (retries 0 and 3) and Ray under faults, no-op throughput (bench/parsl; about 15 minutes)"
"$PY" bench/parsl/bench_parsl.py --build "$BUILD_DIR"
echo
if [ -x "$BUILD_DIR/bin/diaspora-train" ]; then
  echo "== continual learning: strategies x buffers x ranks (bench/rehearsal/run.sh; QUICK=1 for a short run)"
  bash bench/rehearsal/run.sh "$BUILD_DIR"
  echo
  echo "== continual learning on the longer ptycho-sim stream: rehearsal vs scratch, 5 seeds (bench/rehearsal/stream.sh)"
  bash bench/rehearsal/stream.sh "$BUILD_DIR"
fi
