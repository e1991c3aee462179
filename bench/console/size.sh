#!/usr/bin/env bash
# The admin console's first load: every file index.html pulls in (its stylesheets and
# scripts; the bundle has no lazy chunks), raw and gzip-compressed, against the 300 KB
# compressed budget of issue 23. Usage: bench/console/size.sh [BUILD_DIR]
set -euo pipefail
BUILD_DIR=${1:-build}
DIST="$BUILD_DIR/console/dist"
if [ ! -f "$DIST/index.html" ]; then
  echo "no console in $DIST (make build; console/node_modules from scripts/install-deps.sh)" >&2
  exit 1
fi
files=(index.html)
while read -r ref; do files+=("$ref"); done < <(grep -oE '(href|src)="[^":]+"' "$DIST/index.html" | sed -E 's/^(href|src)="(.*)"$/\2/')
raw_total=0
gz_total=0
printf '%-24s %10s %10s\n' file bytes gzip
for f in "${files[@]}"; do
  [ -f "$DIST/$f" ] || { echo "index.html names $f, which is not in $DIST" >&2; exit 1; }
  raw=$(stat -c %s "$DIST/$f")
  gz=$(gzip -9 -c "$DIST/$f" | wc -c)
  raw_total=$((raw_total + raw))
  gz_total=$((gz_total + gz))
  printf '%-24s %10d %10d\n' "$f" "$raw" "$gz"
done
printf '%-24s %10d %10d\n' total "$raw_total" "$gz_total"
awk -v g="$gz_total" -v r="$raw_total" 'BEGIN { printf "first load: %.1f KB compressed (%.2fx of the 300 KB budget), %.1f KB as served (the relay sends the files uncompressed)\n", g / 1000, g / 300000, r / 1000 }'
