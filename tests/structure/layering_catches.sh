#!/usr/bin/env bash
# cmake/CheckLayering.cmake refuses the crossings it exists for: a copy of the tree with one
# injected into it must fail the check, naming each.
set -euo pipefail
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for c in core client relay resilience plugin rehearsal engine-adapters runner cli tests; do cp -r "$src/$c" "$tmp/"; done
cmake -DSOURCE_DIR="$tmp" -P "$src/cmake/CheckLayering.cmake"  # the copy is clean
echo '#include "topic_log.hpp"' >> "$tmp/plugin/src/spool.cpp"
echo '#include "../../relay/src/log_record.hpp"' >> "$tmp/cli/src/exec.cpp"
echo '#include "diaspora/plugin.h"' >> "$tmp/relay/src/config.cpp"
echo '#include "diaspora/relay.hpp"' >> "$tmp/engine-adapters/exec/src/main.cpp"   # an adapter reaching the relay
echo '#include "diaspora/runner.hpp"' >> "$tmp/cli/src/main.cpp"                   # nothing depends on the runner
echo '#include "../../runner/src/placement.hpp"' >> "$tmp/engine-adapters/src/process.cpp"
if out=$(cmake -DSOURCE_DIR="$tmp" -P "$src/cmake/CheckLayering.cmake" 2>&1); then
  echo "the check passed a tree with six crossings"; exit 1
fi
for want in 'plugin/src/spool.cpp: includes "topic_log.hpp", which is not a file of plugin' \
            'cli/src/exec.cpp: includes relay/src/log_record.hpp, a private header of another component' \
            'relay/src/config.cpp: includes "diaspora/plugin.h" of plugin, which relay does not depend on' \
            'engine-adapters/exec/src/main.cpp: includes "diaspora/relay.hpp" of relay, which engine-adapters does not depend on' \
            'cli/src/main.cpp: includes "diaspora/runner.hpp" of runner, which cli does not depend on' \
            'engine-adapters/src/process.cpp: includes runner/src/placement.hpp, a private header of another component'; do
  grep -qF "$want" <<<"$out" || { echo "missing: $want"; echo "$out"; exit 1; }
done
echo "layering check: the six crossings were refused"
