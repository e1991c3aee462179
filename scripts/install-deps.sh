#!/usr/bin/env bash
# Installs every Debian, npm and PyPI package Diaspora needs to build, test and run.
# Idempotent and non-interactive: when everything is present it only checks and exits
# in a second or two. Run as root (CI and the dev machines are root) or with sudo.
set -euo pipefail
cd "$(dirname "$0")/.."

# `install-deps.sh --fuzz` also installs what `make fuzz` needs (FUZZ_PACKAGES below).
WITH_FUZZ=0
[ "${1:-}" = "--fuzz" ] && WITH_FUZZ=1

# One package a line, grouped by what needs it. Keep in sync with docs/building.md.
DEB_PACKAGES=(
  # toolchain
  g++ cmake ninja-build ccache pkg-config make git
  # core: Boost.JSON / Asio / Beast, OpenSSL 3, YAML, logging, CLI
  libboost1.81-all-dev libboost-json1.81-dev libssl-dev openssl
  libyaml-cpp-dev libspdlog-dev libcli11-dev
  # tests and benchmarks; gdb prints the threads of a relay a test cannot stop
  libgtest-dev libgmock-dev libbenchmark-dev gdb
  # Python: the interpreter and venv; the packages come from PyPI (requirements.lock, below)
  python3 python3-venv
  # the Slurm SPANK adapter and its tests: a one-node Slurm the test starts itself
  slurm-wlm munge libslurm-dev
  # relay tests and benchmarks: curl for HTTPS checks, NATS JetStream as the peer;
  # libfaketime steps a producer's wall clock in the fault tests (tests/chaos/); iproute2
  # makes their network namespace and veth pair
  curl nats-server libnats-dev libfaketime iproute2
  # rehearsal (DIASPORA_WITH_TORCH): LibTorch 1.13 CPU with c10d, Gloo headers for
  # ProcessGroupGloo, and the Fashion-MNIST data set (gzipped IDX under /usr/share/datasets,
  # read in place with zlib)
  libtorch-dev libgloo-dev dataset-fashion-mnist zlib1g-dev
  # the admin console's browser tests: Debian's Chromium (driven by npm playwright-core;
  # never a downloaded browser) and a font
  chromium fonts-dejavu-core
)

# `make fuzz` only (scripts/fuzz.sh): clang and libFuzzer (the fuzz targets' coverage-guided
# runs); `make test` replays the same targets with g++ and needs neither. clang 15: clang 14
# lacks the __builtin_source_location that libstdc++ 12's std::source_location needs.
FUZZ_PACKAGES=(clang-15 libfuzzer-15-dev)
[ "$WITH_FUZZ" = 1 ] && DEB_PACKAGES+=("${FUZZ_PACKAGES[@]}")

# The admin console (console/): the locked npm packages, installed with `npm ci` when
# console/package-lock.json changed since the last install (a checksum in node_modules).
console_deps() {
  local lock=console/package-lock.json stamp=console/node_modules/.diaspora-lock.sha256 want
  [ -f "$lock" ] || return 0
  want=$(sha256sum "$lock" | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "install-deps: console npm packages present"
    return 0
  fi
  echo "install-deps: npm ci in console/"
  (cd console && npm ci --no-audit --no-fund --loglevel=error)
  echo "$want" > "$stamp"
}

# The Python side (tests, benchmarks, the engines Diaspora plugs into: Parsl, Globus Compute,
# Dask, Ray): requirements.lock (pinned, with hashes) in the project's virtual environment
# .venv/, installed again only when the lock changed since the last install (a checksum in
# .venv/), so a machine that has it needs no network. The Diaspora package itself is installed
# editable (engine-adapters/python/pyproject.toml), so `import diaspora` works in .venv.
python_deps() {
  local venv=.venv lock=requirements.lock stamp=.venv/.diaspora-lock.sha256 want
  want=$( { cat "$lock"; cat engine-adapters/python/pyproject.toml 2>/dev/null || true; } | sha256sum | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c '' 2>/dev/null; then
    echo "install-deps: Python packages present ($venv)"
    return 0
  fi
  "$venv/bin/python" -c '' 2>/dev/null || { rm -rf "$venv"; /usr/bin/python3 -m venv "$venv"; }
  echo "install-deps: pip install -r $lock into $venv"
  PIP_FIND_LINKS= "$venv/bin/pip" install --quiet --disable-pip-version-check --require-hashes --no-deps -r "$lock"
  if [ -f engine-adapters/python/pyproject.toml ]; then
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
      --no-index -e engine-adapters/python
  fi
  "$venv/bin/pip" check --disable-pip-version-check >/dev/null
  echo "$want" > "$stamp"
}

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  case "$p" in \#*) continue ;; esac
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# Node and npm for the console's build: Debian's, unless a node (with its npm) is on PATH.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#DEB_PACKAGES[@]} Debian packages present"
  console_deps
  python_deps
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-deps: missing packages (${missing[*]}) and not root; run as root" >&2
    exit 1
  fi
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Refresh the package lists once if they are absent or older than a day.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | head -n1)" ]; then
  $SUDO apt-get update -q
fi
if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"; then
  # A stale list is the usual cause: refresh and try once more.
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
console_deps
python_deps
echo "install-deps: done"
