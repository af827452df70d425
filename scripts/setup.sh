#!/usr/bin/env bash
# Installs every Debian 12 package pipetrain needs to build and test.
# Idempotent: packages already installed are skipped, and apt is not touched
# at all when nothing is missing. Safe to run as root or with sudo available.
# The prometheus and etcd-server packages start their services and enable
# them at boot (Prometheus on every interface, without authentication);
# only their commands are needed, so a fresh install stops and disables
# them again. PIPETRAIN_SETUP_BUILD_ONLY=1 (scripts/demo.sh, the images'
# Dockerfiles) skips the tools below (tests and docs only) and the tests'
# npm packages, which come from the npm registry, not Debian.
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
  sqlite3                  # its shell: tests/openapi locks the state database
  etcd-server              # etcd 3.4: the etcd store's tests start one on loopback
  openssl                  # test certificates (tests/tls_cluster_test)
  prometheus               # promtool, to lint /metrics in tests (also ships the server)
  clang-14 libclang-rt-14-dev  # libFuzzer, ASan, UBSan: the fuzz targets (scripts/fuzz.sh)
  llvm-14                  # llvm-symbolizer, for readable stacks in sanitizer reports
  procps                   # pgrep, pkill: cli/cluster_cli_test.sh finds leftover processes
)

# Tools wanted as commands, not as particular packages: a machine may already
# have them from elsewhere (e.g. a kubectl or Node.js from another vendor),
# whose files would conflict with Debian's packages. command:package.
TOOLS=(
  kubectl:kubernetes-client  # kubectl kustomize renders deploy/k8s (tests/k8s)
  node:nodejs                # schema check of the rendered manifests (tests/k8s)
  npm:npm                    # installs that check's pinned npm packages
  curl:curl                  # the README's REST and /metrics examples
  jq:jq                      # the README's `jobs --json | jq` example
  clang-format:clang-format  # the code's format (README, "Format")
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ "${PIPETRAIN_SETUP_BUILD_ONLY:-0}" = 1 ]; then TOOLS=(); fi
for t in "${TOOLS[@]}"; do
  if ! command -v "${t%%:*}" >/dev/null 2>&1; then missing+=("${t#*:}"); fi
done

# npm packages of tests/k8s/validate_manifests.js (tools/k8s-validate),
# tests/dashboard_schema_test.sh (tools/grafana-schema-check) and
# tests/proto/buf_test.sh (tools/openapi-check), each pinned by its
# package-lock.json; installed again only when the lock file is missing from
# the install or newer than it.
npm_ci() {
  local dir
  if [ "${PIPETRAIN_SETUP_BUILD_ONLY:-0}" = 1 ]; then return 0; fi
  for dir in k8s-validate grafana-schema-check openapi-check; do
    dir="$(dirname "$0")/../tools/$dir"
    local installed="$dir/node_modules/.package-lock.json"
    if [ ! -f "$installed" ] || [ "$dir/package-lock.json" -nt "$installed" ]; then
      # Only the tests that use them need these: without the registry
      # they fail, each saying what is missing, and the rest still runs.
      (cd "$dir" && npm ci --no-audit --no-fund) ||
        echo "setup: WARNING: npm ci failed in tools/${dir##*/} (is the npm registry" \
          "reachable?), so the tests that use its packages will fail" >&2
    fi
  done
}

# Debian 12's kubernetes-client is kubectl 1.20 (kustomize 2.0.3), too old
# to render deploy/k8s: only a warning, as the build and the demo do without.
check_kubectl() {
  local version major minor
  if [ "${PIPETRAIN_SETUP_BUILD_ONLY:-0}" = 1 ]; then return 0; fi
  version=$(kubectl version --client 2>/dev/null | grep -o 'v[0-9][0-9]*\.[0-9][0-9]*' | head -n 1 || true)
  major=${version#v} minor=${version#*.}
  major=${major%%.*}
  if [ -z "$version" ]; then
    echo "setup: WARNING: cannot read kubectl's version (kubectl version --client)," >&2
  elif [ "$major" -eq 1 ] && [ "$minor" -lt 25 ]; then
    echo "setup: WARNING: kubectl $version is older than 1.25," >&2
  else
    return 0
  fi
  echo "  so //tests/k8s:manifests_test will fail: it runs \`kubectl kustomize\`, which needs" \
    "kubectl 1.25 or later; a standalone kustomize 4.5.5+ renders deploy/k8s by hand" \
    "(docs/operations.md)" >&2
}

# openapi-backend (tools/openapi-check) is pinned to a release whose
# dependencies Debian 12's Node.js 18 can require() (later ones need 20.19):
# a node that cannot load it is only a warning, as for kubectl.
check_node() {
  local dir
  if [ "${PIPETRAIN_SETUP_BUILD_ONLY:-0}" = 1 ]; then return 0; fi
  dir="$(dirname "$0")/../tools/openapi-check/node_modules/openapi-backend"
  if node -e "require(process.argv[1])" "$(cd "$(dirname "$dir")" && pwd)/openapi-backend" \
    >/dev/null 2>&1; then
    return 0
  fi
  echo "setup: WARNING: node $(node --version 2>/dev/null) cannot load openapi-backend," \
    "so //tests/openapi:openapi_conformance_test will fail (tools/openapi-check's" \
    "packages are pinned to releases Node.js 18 loads; run npm ci there)" >&2
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages and ${#TOOLS[@]} tools present"
  npm_ci
  check_kubectl
  check_node
  exit 0
fi

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Stops and disables the services that packages installed now started. On
# exit, so that an install that fails (or is interrupted) after
# prometheus's postinst still does it: a later run finds the packages
# installed and no longer touches them.
quiet_services() {
  local p service
  for p in "${missing[@]}"; do
    case "$p" in
      prometheus | etcd-server)
        service="${p%-server}"
        if [ -d /run/systemd/system ]; then
          $SUDO systemctl disable --now "$service.service" >/dev/null 2>&1 || true
        elif command -v invoke-rc.d >/dev/null 2>&1; then  # sysvinit: its init.d script
          $SUDO invoke-rc.d "$service" stop >/dev/null 2>&1 || true
          $SUDO update-rc.d "$service" disable >/dev/null 2>&1 || true
        fi
        ;;
    esac
  done
}
trap quiet_services EXIT
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
quiet_services
trap - EXIT
npm_ci
check_kubectl
check_node
echo "setup: done"
