#!/usr/bin/env bash
# `make demo`: what runs today, and a plain statement of what is not built yet.
set -euo pipefail
BUILD_DIR=${1:-build}
BIN="$BUILD_DIR/bin"
cd "$(dirname "$0")/.."
# The project's Python (.venv from scripts/install-deps.sh), unless DIASPORA_PYTHON names another.
PY="${DIASPORA_PYTHON:-$PWD/.venv/bin/python}"

echo "== Diaspora demo =="
echo
echo "-- the main job: a ptychography stream on two local sites, a 4x slow-down of one"
echo "   site and a 5 s relay outage injected; the plugin's policies migrate the"
echo "   reconstructions off the slow site, and a continual-learning job (diaspora-train)"
echo "   learns from each scan as it is reconstructed (about 80 s)"
run_dir="runs/demo-$(date +%Y%m%d-%H%M%S)"
# DIASPORA_DEMO_QUICK=1 (the test of this script in sanitizer builds, where the
# reconstructions run tens of times slower) makes each reconstruction smaller.
quick=()
if [ "${DIASPORA_DEMO_QUICK:-0}" = 1 ]; then
  quick=(--set tasks.reconstruct.args.object_size=64 --set tasks.reconstruct.args.probe_size=16
         --set tasks.reconstruct.args.scan_step=8 --set tasks.reconstruct.args.iterations=40
         --set tasks.reconstruct.deadline=60s)
fi
"$BIN/diaspora" run examples/workflows/ptycho-stream.yaml --out "$run_dir" "${quick[@]}"
"$PY" - "$run_dir/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
s = r["summary"]
scans = [i for i in r["instances"] if "rehearsal" not in i]
print(f"\n{sum(i['state'] == 'completed' for i in scans)} of {len(scans)} scans reconstructed, "
      f"{s['deadline_misses']} deadline misses, {s['actions']} actions, "
      f"plugin events lost: {r['plugin']['stats']['events_lost']}")
for j in (i for i in r["instances"] if "rehearsal" in i):
    res = j.get("result", {})
    print(f"  rehearsal job {j['task']}: {j['state']}"
          + (f", trained on {res['tasks']} scans, final average error {res['average_error']:.4f} (in {j['rehearsal']})"
             if "average_error" in res else ""))
for f in r["faults"]:
    for h in f["hit"]:
        if h["reaction_s"] is not None:
            print(f"  {f['kind']}: {h['instance']} running again elsewhere {h['reaction_s']:.2f} s after the fault")
# The demo checks what it shows: every scan done, the slow-down acted on, nothing lost.
ok = s["failed"] == 0 and any(a["kind"] == "migrate" and a["outcome"] == "done" for a in r["actions"]) \
     and r["plugin"]["stats"]["events_lost"] == 0
sys.exit(0 if ok else 1)
PY
echo "report: $run_dir/report.html (and report.json; the relay's log in $run_dir/relay/data)"
echo
echo "-- a spec with mistakes, to show the error format (FILE:LINE:COL: error: PATH: MESSAGE)"
"$BIN/diaspora" validate tests/data/specs/bad/multiple-schema-errors.yaml || true
echo
demo_dir=$(mktemp -d "${TMPDIR:-/tmp}/diaspora-demo.XXXXXX")
trap 'rm -rf "$demo_dir"' EXIT
echo "-- development certificates and a token (in $demo_dir)"
"$BIN/diaspora" certs init "$demo_dir/certs"
"$BIN/diaspora" certs check --ca "$demo_dir/certs/ca.pem" --host 127.0.0.1 "$demo_dir/certs/server.pem"
"$BIN/diaspora" token secret "$demo_dir/auth-secret"
token=$("$BIN/diaspora" token issue --secret-file "$demo_dir/auth-secret" --subject demo \
        --scope 'publish:task.*' --scope 'subscribe:*' --ttl 10m)
echo "token: ${token:0:40}..."
"$BIN/diaspora" token verify --secret-file "$demo_dir/auth-secret" --action publish --topic task.started "$token"
echo
echo "-- the relay: a durable, authenticated event log over TLS WebSockets"
"$BIN/diaspora-relay" --listen 127.0.0.1:0 --data-dir "$demo_dir/relay" \
    --tls-cert "$demo_dir/certs/server.pem" --tls-key "$demo_dir/certs/server-key.pem" \
    --auth-secret-file "$demo_dir/auth-secret" --port-file "$demo_dir/port" 2> "$demo_dir/relay.log" &
relay_pid=$!
trap 'kill $relay_pid 2>/dev/null || true; rm -rf "$demo_dir"' EXIT
for _ in $(seq 1 100); do [ -s "$demo_dir/port" ] && break; sleep 0.05; done
url="wss://127.0.0.1:$(cat "$demo_dir/port")"
echo "relay listening at $url"
"$BIN/diaspora" publish --url "$url" --ca "$demo_dir/certs/ca.pem" --token "$token" --topic task.demo --count 10000 --size 256
echo "the first three events back, with their offsets:"
"$BIN/diaspora" tail --url "$url" --ca "$demo_dir/certs/ca.pem" --token "$token" --topic 'task.*' \
    --from earliest --count 3 --offsets | cut -c1-120
echo
echo "-- the engine plugin: a C engine loads libdiaspora_plugin.so with dlopen and reports tasks"
plugin_token=$("$BIN/diaspora" token issue --secret-file "$demo_dir/auth-secret" --subject engine \
        --scope 'publish:demo.*' --scope 'subscribe:demo.*' --ttl 10m)
echo "$plugin_token" > "$demo_dir/engine-token"
cat > "$demo_dir/engine.yaml" <<SPEC
version: 1
name: demo
relay: {url: '$url', ca_file: '$demo_dir/certs/ca.pem', token_file: '$demo_dir/engine-token'}
plugin: {spool_dir: '$demo_dir/spool', engine_id: minimal}
sites: [{name: local, engine: local}]
SPEC
"$BIN/diaspora-plugin-minimal" "$BUILD_DIR/lib/libdiaspora_plugin.so" "$demo_dir/engine.yaml" 3
echo "task events on the relay (topic demo.events):"
"$BIN/diaspora" tail --url "$url" --ca "$demo_dir/certs/ca.pem" --token "$plugin_token" --topic demo.events \
    --from earliest --count 4 | cut -c1-150
kill -TERM "$relay_pid"; wait "$relay_pid" && echo "relay stopped cleanly on SIGTERM"
echo
echo "-- anomaly detection: the default ensemble over a synthetic series with a level shift"
nab_dir="$demo_dir/nab/synthetic"
mkdir -p "$nab_dir"
"$PY" - "$nab_dir/shift.csv" <<'PY'
import math, random, sys
random.seed(1)
with open(sys.argv[1], "w") as f:
    f.write("timestamp,value\n")
    for i in range(2000):
        v = 10 + math.sin(i / 20) + random.gauss(0, 0.3) + (6 if i >= 1500 else 0)
        f.write(f"2026-01-01 {i // 60 // 60:02d}:{i // 60 % 60:02d}:{i % 60:02d},{v:.4f}\n")
PY
"$BIN/diaspora-nab" --data "$demo_dir/nab" --out "$demo_dir/nab-out"
echo "rows scoring >= 0.5 (the shift starts at row 1501):"
awk -F, 'NR > 1 && $3 >= 0.5 { print "  row " NR - 1 ": value " $2 ", score " $3 }' "$demo_dir/nab-out/synthetic/shift.csv"
# The demo checks what it shows: an alarm within 60 rows of the shift, and none before it.
first_alarm=$(awk -F, 'NR > 1 && $3 >= 0.5 { print NR - 1; exit }' "$demo_dir/nab-out/synthetic/shift.csv")
if [ -z "$first_alarm" ] || [ "$first_alarm" -lt 1501 ] || [ "$first_alarm" -gt 1560 ]; then
  echo "demo: expected the first alarm between rows 1501 and 1560, got '${first_alarm:-none}'" >&2
  exit 1
fi
echo "first alarm at row $first_alarm: the shift was detected, nothing before it scored >= 0.5"
echo
echo "-- continual learning: DER++ on split Fashion-MNIST (2 tasks of 5 classes, a slice of each), stopped and resumed"
cat > "$demo_dir/train.yaml" <<'YAML'
strategy: derpp
buffer_size: 200
dataset: {tasks: 2, classes_per_task: 5, train_per_task: 3000, test_per_task: 500}
train: {batch_size: 32}
sampling: {representatives: 16}
YAML
if [ -x "$BIN/diaspora-train" ]; then
  status=0
  "$BIN/diaspora-train" --config "$demo_dir/train.yaml" --out "$demo_dir/train-a" --stop-after 60 || status=$?
  echo "diaspora-train stopped with status $status (3: checkpointed on request)"
  [ "$status" -eq 3 ] || exit 1
  "$BIN/diaspora-train" --config "$demo_dir/train.yaml" --out "$demo_dir/train-b" --resume "$demo_dir/train-a"
  echo "summary: $(cut -c1-200 "$demo_dir/train-b/summary.json")"
  echo "plot: $demo_dir/train-b/curves.png"
else
  echo "(skipped: built without LibTorch, -DDIASPORA_WITH_TORCH=OFF)"
fi
echo
echo "== demo done: the run's report is $run_dir/report.html =="
