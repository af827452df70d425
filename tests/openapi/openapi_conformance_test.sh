#!/usr/bin/env bash
# docs/openapi.yaml against a running coordinator and worker
# (conformance.js): every documented path, method and status exercised,
# every request and response validated against the schemas (strictly: no
# undocumented fields), the documented examples submitted, and two renamed
# fields (one as a server would send it, one in a copy of the document)
# shown to be rejected. Runs under Bazel (//tests/openapi:openapi_conformance_test)
# or directly, after bazel build //coordinator:pipetrain-coordinator
# //worker:pipetrain-worker:
#   tests/openapi/openapi_conformance_test.sh
set -u

if [ -n "${TEST_SRCDIR:-}" ]; then
  R="$TEST_SRCDIR/$TEST_WORKSPACE"
  T="$TEST_TMPDIR"
  COORDINATOR="$R/coordinator/pipetrain-coordinator"
  WORKER="$R/worker/pipetrain-worker"
else
  R="$(cd "$(dirname "$0")/../.." && pwd)"
  T="$(mktemp -d)"
  trap 'rm -rf "$T"' EXIT
  COORDINATOR="$R/bazel-bin/coordinator/pipetrain-coordinator"
  WORKER="$R/bazel-bin/worker/pipetrain-worker"
fi
# node_modules is not a Bazel input (installed by scripts/setup.sh): find it
# in the source tree the runfiles link to.
SRC="$(cd "$(dirname "$(readlink -f "$R/tests/openapi/conformance.js")")/../.." && pwd)"
MODULES="$SRC/tools/openapi-check/node_modules"

missing=""
command -v node > /dev/null || missing="$missing node (Debian package nodejs)"
for package in openapi-backend ajv-formats yaml; do
  [ -f "$MODULES/$package/package.json" ] || missing="$missing $MODULES/$package"
done
if [ -n "$missing" ]; then
  echo "FAIL: missing:$missing"
  echo "Run scripts/setup.sh (installs node and runs npm ci in tools/openapi-check)."
  exit 1
fi

# As Debian 12's Node.js 18 does: a newer node that would require() an ES
# module must not hide a package update that needs it.
node_flags=()
if node --no-experimental-require-module -e '' 2>/dev/null; then
  node_flags=(--no-experimental-require-module)
fi
node "${node_flags[@]}" "$R/tests/openapi/conformance.js" --modules "$MODULES" --spec "$R/docs/openapi.yaml" \
  --coordinator "$COORDINATOR" --worker "$WORKER" --tmp "$T"
code=$?
if [ $code -ne 0 ]; then
  echo "--- coordinator log (tail)"; tail -n 20 "$T/coordinator.log" 2>/dev/null
  echo "--- worker log (tail)"; tail -n 20 "$T/worker.log" 2>/dev/null
fi
exit $code
