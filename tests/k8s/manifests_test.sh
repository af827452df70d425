#!/usr/bin/env bash
# deploy/k8s: `kubectl kustomize` renders every overlay offline, every
# rendered object validates against the Kubernetes schemas
# (validate_manifests.js, npm kubernetes-models), and a deliberately broken
# manifest is rejected with the expected errors, so the check cannot pass
# vacuously. Runs under Bazel (//tests/k8s:manifests_test) or directly:
#   tests/k8s/manifests_test.sh
set -u

if [ -n "${TEST_SRCDIR:-}" ]; then
  R="$TEST_SRCDIR/$TEST_WORKSPACE"
  T="$TEST_TMPDIR"
  # node_modules is not a Bazel input (thousands of files, installed by
  # scripts/setup.sh): find it next to the real package.json.
  VALIDATE_DIR="$(dirname "$(readlink -f "$R/tools/k8s-validate/package.json")")"
else
  R="$(cd "$(dirname "$0")/../.." && pwd)"
  T="$(mktemp -d)"
  trap 'rm -rf "$T"' EXIT
  VALIDATE_DIR="$R/tools/k8s-validate"
fi
MODULES="$VALIDATE_DIR/node_modules"
VALIDATE="$R/tests/k8s/validate_manifests.js"
OVERLAYS="cpu-demo gpu"

missing=""
command -v kubectl > /dev/null || missing="$missing kubectl (Debian package kubernetes-client)"
command -v node > /dev/null || missing="$missing node (Debian package nodejs)"
for package in kubernetes-models yaml; do
  [ -f "$MODULES/$package/package.json" ] || missing="$missing $MODULES/$package"
done
if [ -n "$missing" ]; then
  echo "FAIL: missing:$missing"
  echo "Run scripts/setup.sh (installs kubectl and node, and runs npm ci in tools/k8s-validate)."
  exit 1
fi

pass=0 fail=0
check() {
  local name=$1; shift
  if "$@" > "$T/out.txt" 2>&1; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1)); echo "FAIL: $name"; cat "$T/out.txt"
  fi
}
fails() { ! "$@"; }
# Renders overlay $1 to $2; stderr (deprecation warnings of newer kubectl
# versions) goes to the check's output. No -o: kubectl 1.20 lacks it.
render() { kubectl kustomize "$T/k8s/overlays/$1" > "$2"; }
# Succeeds when FILE contains the fixed string TEXT.
has() { grep -qF -- "$2" "$1"; }

# kustomize refuses files whose real path leaves the kustomization root, and
# Bazel's runfiles are symlinks into the source tree: render a real copy.
mkdir -p "$T/k8s"
cp -RL "$R/deploy/k8s/base" "$R/deploy/k8s/overlays" "$T/k8s/"

for overlay in $OVERLAYS; do
  out="$T/$overlay.yaml"
  check "kubectl kustomize overlays/$overlay" render "$overlay" "$out"
  check "overlay $overlay validates" node "$VALIDATE" --modules "$MODULES" "$out"
  cp "$T/out.txt" "$T/$overlay.validation.txt"
  echo "$overlay: $(tail -n 1 "$T/$overlay.validation.txt")"
  check "overlay $overlay: coordinator, workers, Secret, submit Job" \
    has "$T/$overlay.validation.txt" "valid: ConfigMap 2, Job 1, Secret 1, Service 2, StatefulSet 2"
done
# What distinguishes the overlays.
check "cpu-demo runs 4 workers" has "$T/cpu-demo.yaml" "replicas: 4"
check "cpu-demo requests no GPU" fails has "$T/cpu-demo.yaml" "nvidia.com/gpu"
check "gpu workers request a GPU" has "$T/gpu.yaml" "nvidia.com/gpu: 1"

# The broken manifest: a string for replicas and a container without a name.
BROKEN="$R/tests/k8s/testdata/broken_deployment.yaml"
node "$VALIDATE" --modules "$MODULES" "$BROKEN" > "$T/broken.txt" 2>&1
code=$?
echo "broken manifest (exit $code):"; cat "$T/broken.txt"
check "broken manifest exits 1" test "$code" -eq 1
check "broken manifest: replicas type" has "$T/broken.txt" \
  "INVALID Deployment/broken (${BROKEN}, document 2): /spec/replicas: must be integer"
check "broken manifest: container name" has "$T/broken.txt" \
  '/spec/template/spec/containers/0: must have required property "name"'
check "broken manifest: the valid ConfigMap is not reported" fails has "$T/broken.txt" "ConfigMap/fine"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
