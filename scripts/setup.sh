#!/usr/bin/env bash
# Installs every Debian 12 package pipetrain needs to build and test.
# Idempotent: packages already installed are skipped, and apt is not touched
# at all when nothing is missing. Safe to run as root or with sudo available.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap          # Bazel 4.2.3 (offline, WORKSPACE mode)
  g++ make pkg-config
  libopenblas-dev          # cblas_sgemm for kernels/cpu
  libabsl-dev              # absl::Status, StatusOr, flags, synchronization
  libprotobuf-dev protobuf-compiler
  libgrpc++-dev protobuf-compiler-grpc
  libgtest-dev libgmock-dev
  libbenchmark-dev
  nlohmann-json3-dev       # JSON (safetensors headers, profiles, logs)
  libyaml-cpp-dev          # YAML job specs (pipetrain submit)
  prometheus-cpp-dev       # /metrics (service issue)
  libcpp-httplib-dev       # REST (service issue)
  libsqlite3-dev           # coordinator store (service issue)
  openssl                  # test certificates (tests/tls_cluster_test)
  prometheus               # promtool, to lint /metrics in tests (also ships the server)
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
