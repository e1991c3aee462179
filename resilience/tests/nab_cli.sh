#!/usr/bin/env bash
# CTest resilience.nab_cli: diaspora-nab on a tiny generated NAB-layout tree.
#  1. two series under <category>/ -> OUT/<category>/<file>.csv with the same rows,
#     header timestamp,value,anomaly_score, scores in [0, 1], exit 0;
#  2. the same run twice gives identical files (determinism);
#  3. a malformed CSV -> exit 2 and a FILE:LINE: message naming the problem;
#  4. an unknown --config key -> exit 2 and FILE:LINE; a bad setting of a detector that
#     is off -> FILE:LINE too;
#  5. NAB's hints reach the resonance detector (--online runs score differently);
#  6. --bad-side counts a score only on the side a signal goes bad: the upward spike is
#     kept with up and dropped with down; a side that is none of up/down/both -> exit 2.
set -u
nab=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

mkdir -p "$work/data/catA" "$work/data/catB"
awk 'BEGIN { srand(1); print "timestamp,value";
  for (i = 0; i < 600; i++) { t = 1396310400 + 300 * i;
    v = 50 + 10 * sin(2 * 3.14159265 * (t % 86400) / 86400) + rand(); if (i == 450) v += 80;
    print strftime("%Y-%m-%d %H:%M:%S", t, 1) "," v } }' > "$work/data/catA/series_one.csv"
awk 'BEGIN { srand(2); print "timestamp,value";
  for (i = 0; i < 400; i++) { t = 1396310400 + 3600 * i; v = (i < 300 ? 5 : 9) + rand();
    print strftime("%Y-%m-%d %H:%M:%S", t, 1) "," v } }' > "$work/data/catB/series_two.csv"

"$nab" --data "$work/data" --out "$work/out" 2> "$work/err" || fail "exit $? on good input: $(cat "$work/err")"
for f in catA/series_one.csv catB/series_two.csv; do
  out="$work/out/$f"
  [[ -f $out ]] || fail "missing $out"
  [[ $(head -1 "$out") == "timestamp,value,anomaly_score" ]] || fail "bad header in $f: $(head -1 "$out")"
  [[ $(wc -l < "$out") == $(wc -l < "$work/data/$f") ]] || fail "row count differs in $f"
  cmp -s <(cut -d, -f1,2 "$out" | tail -n +2) <(tail -n +2 "$work/data/$f") || fail "timestamp,value not echoed in $f"
  awk -F, 'NR > 1 && !($3 >= 0 && $3 <= 1 && NF == 3) { bad = 1 } END { exit bad }' "$out" \
    || fail "score outside [0, 1] or wrong field count in $f"
done
awk -F, 'NR == 452 && $3 < 0.5 { exit 1 }' "$work/out/catA/series_one.csv" || fail "spike at row 452 not flagged"

"$nab" --data "$work/data" --out "$work/out2" 2> /dev/null || fail "second run failed"
diff -r "$work/out" "$work/out2" > /dev/null || fail "two runs differ"

mkdir -p "$work/bad/cat"
printf 'timestamp,value\n2014-04-01 00:00:00,1.5\n2014-04-01 00:05:00,abc\n' > "$work/bad/cat/broken.csv"
"$nab" --data "$work/bad" --out "$work/out3" 2> "$work/err"
rc=$?
[[ $rc == 2 ]] || fail "malformed CSV: exit $rc, want 2"
grep -q "bad/cat/broken.csv:3: bad value 'abc'" "$work/err" || fail "no FILE:LINE message: $(cat "$work/err")"

printf 'timestamp,value\n2014-04-01 00:00:00,1.5\n2014-13-01 00:05:00,2\n' > "$work/bad/cat/broken.csv"
"$nab" --data "$work/bad" --out "$work/out3" 2> "$work/err"
[[ $? == 2 ]] && grep -q "broken.csv:3: bad timestamp" "$work/err" || fail "bad timestamp: $(cat "$work/err")"

printf 'z_cap: 8\nno_such_key: 1\n' > "$work/cfg.yaml"
"$nab" --data "$work/data" --out "$work/out4" --config "$work/cfg.yaml" 2> "$work/err"
[[ $? == 2 ]] && grep -q "cfg.yaml:2: unknown key 'no_such_key'" "$work/err" || fail "bad config: $(cat "$work/err")"
# A bad setting of a detector that is off is still found, at its line.
printf 'z_cap: 8\nresonance.categories: 99\n' > "$work/cfg.yaml"
"$nab" --data "$work/data" --out "$work/out5" --config "$work/cfg.yaml" 2> "$work/err"
[[ $? == 2 ]] && grep -q "cfg.yaml:2: Resonance: categories is out of range" "$work/err" \
  || fail "bad resonance setting: $(cat "$work/err")"

# NAB's hints (each series' range and probation) reach the resonance detector; --online
# gives it none: with the detector on, the two runs score differently.
printf 'resonance_weight: 1.575\nresonance.probation: 16\n' > "$work/cfg.yaml"
"$nab" --data "$work/data" --out "$work/hints" --config "$work/cfg.yaml" 2> "$work/err" || fail "hints: $(cat "$work/err")"
"$nab" --online --data "$work/data" --out "$work/online" --config "$work/cfg.yaml" 2> "$work/err" || fail "online: $(cat "$work/err")"
! diff -r "$work/hints" "$work/online" > /dev/null || fail "--online made no difference to the resonance detector"
"$nab" --bad-side up --data "$work/data" --out "$work/up" 2> /dev/null || fail "--bad-side up failed"
"$nab" --bad-side down --data "$work/data" --out "$work/down" 2> /dev/null || fail "--bad-side down failed"
awk -F, 'NR == 452 && $3 < 0.5 { exit 1 }' "$work/up/catA/series_one.csv" || fail "--bad-side up dropped the upward spike"
awk -F, 'NR == 452 && $3 > 0 { exit 1 }' "$work/down/catA/series_one.csv" || fail "--bad-side down kept the upward spike"
"$nab" --bad-side sideways --data "$work/data" --out "$work/side" 2> "$work/err"
[[ $? == 2 ]] && grep -q "bad-side" "$work/err" || fail "bad --bad-side: $(cat "$work/err")"
echo "ok"
