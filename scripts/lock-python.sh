#!/usr/bin/env bash
# Regenerates requirements.lock from requirements.in (pip-tools in a throwaway virtual
# environment): every package pinned, with the hashes of every file PyPI serves for it.
# Run it after changing requirements.in, then `make deps` installs the new lock.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q pip-tools
# No --find-links in the lock: a machine's local wheel folder (PIP_FIND_LINKS) is not CI's.
PIP_FIND_LINKS= "$tmp/venv/bin/pip-compile" --quiet --generate-hashes --allow-unsafe --strip-extras \
  --no-emit-find-links --output-file requirements.lock requirements.in
echo "lock-python: requirements.lock has $(grep -c '^[A-Za-z0-9].*==' requirements.lock) pins"
