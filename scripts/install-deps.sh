#!/usr/bin/env bash
# Installs every Debian (and, later, npm) package Diaspora needs to build, test and run.
# Idempotent and non-interactive: when everything is present it only checks and exits
# in a second or two. Run as root (CI and the dev machines are root) or with sudo.
set -euo pipefail

# One package a line, grouped by what needs it. Keep in sync with docs/building.md.
DEB_PACKAGES=(
  # toolchain
  g++ cmake ninja-build ccache pkg-config make git
  # core: Boost.JSON / Asio / Beast, OpenSSL 3, YAML, logging, CLI
  libboost1.81-all-dev libboost-json1.81-dev libssl-dev openssl
  libyaml-cpp-dev libspdlog-dev libcli11-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # Python side of the tests (visible to /usr/bin/python3 only)
  python3 python3-pytest python3-jsonschema python3-yaml python3-websockets
  # bench/run: the Dask LocalCluster peer (and the Dask adapters)
  python3-distributed
  # the Slurm SPANK adapter and its tests: a one-node Slurm the test starts itself
  slurm-wlm munge libslurm-dev
  # relay tests and benchmarks: curl for HTTPS checks, NATS JetStream as the peer
  curl nats-server libnats-dev
  # rehearsal (DIASPORA_WITH_TORCH): LibTorch 1.13 CPU with c10d, Gloo headers for
  # ProcessGroupGloo, and the Fashion-MNIST data set (gzipped IDX under /usr/share/datasets,
  # read in place with zlib)
  libtorch-dev libgloo-dev dataset-fashion-mnist zlib1g-dev
)

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  case "$p" in \#*) continue ;; esac
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#DEB_PACKAGES[@]} Debian packages present"
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
echo "install-deps: done"
