#!/usr/bin/env bash
# deploy/k8s: `kubectl kustomize` renders every overlay offline; every
# rendered object validates against the Kubernetes (and Prometheus Operator)
# schemas (validate_manifests.js); every rendered pod passes Pod Security
# "restricted", read-only root filesystems, no API token, no token on any
# command line, the app.kubernetes.io labels and instance-scoped selectors
# (check_policy.js); the PrometheusRule carries exactly the groups of
# deploy/prometheus/alerts.yml (prometheus_rule.js); with
# components/shared-checkpoints (testdata/shared_checkpoints, and the gpu
# overlay with the component's one line added) the coordinator's --output-dir
# and every worker's --checkpoint-root lie on one ReadWriteMany claim, and
# --state-dir on the coordinator's own volume, outside --output-dir
# (storage_paths); every $(VAR) in a container's args is set by its env or a
# rendered ConfigMap it reads (unset_vars); each StatefulSet's
# terminationGracePeriodSeconds outlasts the shutdown its flags allow
# (grace_periods); every probe is an HTTP one (the kubelet's gRPC probes
# cannot do TLS); each StatefulSet reads a flags ConfigMap of its own, so a
# changed coordinator flag rolls only the coordinator and a changed worker
# flag only the workers, and neither changes the submit Job. Broken copies are
# rejected with the expected messages on every run, so no check can pass
# vacuously: a schema-invalid manifest (misspelled fields included), pod
# templates breaking each restricted control, selectors without the component
# or with no labels at all, tokens on command lines (also through a Secret the
# set does not render and through env vars), a broken copy of the cpu-demo
# overlay rendered by kustomize, a coordinator reading the workers' ConfigMap,
# shutdowns longer than the grace periods (a 20 s coordinator delay, a 120 s
# worker drain), a second install that reuses the instance label, and a broken
# use of the shared-checkpoints component. Two installs with the Prometheus
# Operator (the gpu overlay and a second install with
# components/prometheus-operator-servicemonitors, or one built on the gpu
# overlay that deletes its copy of the rule) each have ServiceMonitors that
# select their own Services, and the PrometheusRule appears once; the
# component listed in an overlay built on the second install is rejected.
# Runs under Bazel (//tests/k8s:manifests_test) or directly:
#   tests/k8s/manifests_test.sh
set -u

if [ -n "${TEST_SRCDIR:-}" ]; then
  R="$TEST_SRCDIR/$TEST_WORKSPACE"
  T="$TEST_TMPDIR"
else
  R="$(cd "$(dirname "$0")/../.." && pwd)"
  T="$(mktemp -d)"
  trap 'rm -rf "$T"' EXIT
fi
# node_modules is not a Bazel input (thousands of files, installed by
# scripts/setup.sh), and alerts.yml is not visible to this package: find both
# in the source tree the runfiles link to.
SRC="$(cd "$(dirname "$(readlink -f "$R/tests/k8s/check_policy.js")")/../.." && pwd)"
MODULES="$SRC/tools/k8s-validate/node_modules"
ALERTS="$R/deploy/prometheus/alerts.yml"
[ -f "$ALERTS" ] || ALERTS="$SRC/deploy/prometheus/alerts.yml"
VALIDATE="$R/tests/k8s/validate_manifests.js"
POLICY="$R/tests/k8s/check_policy.js"
TESTDATA="$R/tests/k8s/testdata"
# shared-checkpoints and gpu-shared: copies made below, with the component.
OVERLAYS="cpu-demo gpu shared-checkpoints gpu-shared"

missing=""
command -v kubectl > /dev/null || missing="$missing kubectl"
command -v node > /dev/null || missing="$missing node (Debian package nodejs)"
for package in kubernetes-models @kubernetes-models/prometheus-operator yaml; do
  [ -f "$MODULES/$package/package.json" ] || missing="$missing $MODULES/$package"
done
if [ -n "$missing" ]; then
  echo "FAIL: missing:$missing"
  echo "Run scripts/setup.sh (installs node and runs npm ci in tools/k8s-validate);"
  echo "kubectl 1.25 or later (kustomize 4.5.5+) renders the manifests."
  exit 1
fi

source "$R/tests/check_lib.sh"  # check, fails, has, report
# Renders overlay $1 to $2; stderr goes to the check's output.
render() {
  kubectl kustomize "$T/k8s/overlays/$1" > "$2" && return 0
  echo "kubectl kustomize failed; the manifests need kustomize 4.5.5 or later" \
    "(kubectl 1.25+; labels with includeTemplates): $(kubectl version --client 2>&1 | tr '\n' ' ')"
  return 1
}
# Runs "node ARGS..." with its output in $T/run.txt, its exit code in $T/run.code.
run_node() { node "$@" > "$T/run.txt" 2>&1; echo $? > "$T/run.code"; }
# One check per LINE: FILE has it as a whole line. Usage: expect_lines FILE LINE...
expect_lines() {
  local file=$1; shift
  for line in "$@"; do check "$(basename "$file"): $line" grep -qxF -- "$line" "$file"; done
}
# The probes of each container, "container probe kind port[ service]".
probes() {
  node -e '
    const YAML = require(require.resolve("yaml", {paths: [process.argv[1]]}));
    const text = require("fs").readFileSync(process.argv[2], "utf8");
    for (const doc of YAML.parseAllDocuments(text)) {
      const o = doc.toJS();
      const spec = o && o.spec && o.spec.template && o.spec.template.spec;
      for (const c of (spec && spec.containers) || []) {
        for (const p of ["startupProbe", "livenessProbe", "readinessProbe"]) {
          if (!c[p]) continue;
          const kind = Object.keys(c[p]).find((k) => ["grpc", "httpGet", "tcpSocket", "exec"].includes(k));
          const a = c[p][kind] || {};
          console.log([c.name, p, kind, a.port, a.path || a.service || ""].join(" ").trim());
        }
      }
    }' "$MODULES" "$1"
}
# The ingress rules of each NetworkPolicy, "policy: port <- peer peer...".
ingress() {
  node -e '
    const YAML = require(require.resolve("yaml", {paths: [process.argv[1]]}));
    const text = require("fs").readFileSync(process.argv[2], "utf8");
    const c = "app.kubernetes.io/component";
    for (const doc of YAML.parseAllDocuments(text)) {
      const o = doc.toJS();
      if (!o || o.kind !== "NetworkPolicy") continue;
      const rules = o.spec.ingress || [];
      if (rules.length === 0) console.log(`${o.metadata.name}: no ingress`);
      for (const r of rules) {
        const peers = (r.from || []).map((f) => f.namespaceSelector ?
            `namespace(${f.namespaceSelector.matchLabels["kubernetes.io/metadata.name"]})` :
            `pods(${f.podSelector.matchLabels[c]},${f.podSelector.matchLabels["app.kubernetes.io/instance"]})`);
        for (const p of r.ports || []) console.log(`${o.metadata.name}: ${p.port} <- ${peers.join(" ")}`);
      }
    }' "$MODULES" "$1"
}

# Where each StatefulSet container's directory flags land, one line per
# flag: "container --flag PATH on WHAT", WHAT the volume whose mount holds
# PATH (the longest mountPath above it): "claim NAME (MODES, SIZE)" for a
# PersistentVolumeClaim (rendered in the same file), "volumeClaimTemplate
# NAME (MODES, SIZE)", another volume type, or "the root filesystem"; then
# "container: --state-dir S lies inside --output-dir O" (or the other way
# round), which the coordinator refuses at start.
storage_paths() {
  node -e '
    const YAML = require(require.resolve("yaml", {paths: [process.argv[1]]}));
    const text = require("fs").readFileSync(process.argv[2], "utf8");
    const objects = YAML.parseAllDocuments(text).map((d) => d.toJS()).filter(Boolean);
    const claim = (s) => `${(s.accessModes || []).join(",")}, ${s.resources.requests.storage}`;
    const claims = new Map(objects.filter((o) => o.kind === "PersistentVolumeClaim")
        .map((o) => [o.metadata.name, claim(o.spec)]));
    const under = (path, dir) => path === dir || path.startsWith(dir.replace(/\/$/, "") + "/");
    for (const o of objects.filter((o) => o.kind === "StatefulSet")) {
      const spec = o.spec.template.spec;
      const templates = o.spec.volumeClaimTemplates || [];
      for (const c of spec.containers || []) {
        const dirs = {};
        for (const arg of c.args || []) {
          const m = /^--(output-dir|checkpoint-root|state-dir)=(.*)$/.exec(arg);
          if (!m) continue;
          const [, flag, path] = m;
          dirs[flag] = path;
          const mount = (c.volumeMounts || []).filter((v) => under(path, v.mountPath))
              .sort((a, b) => b.mountPath.length - a.mountPath.length)[0];
          let on = "the root filesystem";
          if (mount) {
            const volume = (spec.volumes || []).find((v) => v.name === mount.name);
            const template = templates.find((t) => t.metadata.name === mount.name);
            if (volume && volume.persistentVolumeClaim) {
              const name = volume.persistentVolumeClaim.claimName;
              on = `claim ${name} (${claims.get(name) || "not rendered"})`;
            } else if (template) {
              on = `volumeClaimTemplate ${mount.name} (${claim(template.spec)})`;
            } else {
              const type = volume ? Object.keys(volume).find((k) => k !== "name") : "missing";
              on = `${type} volume ${mount.name}`;
            }
            if (mount.readOnly) on += " read-only";
          }
          console.log(`${c.name} --${flag} ${path} on ${on}`);
        }
        const [s, out] = [dirs["state-dir"], dirs["output-dir"]];
        if (s && out && under(s, out)) console.log(`${c.name}: --state-dir ${s} lies inside --output-dir ${out}`);
        if (s && out && under(out, s)) console.log(`${c.name}: --output-dir ${out} lies inside --state-dir ${s}`);
      }
    }' "$MODULES" "$1"
}

# What each ServiceMonitor in FILES scrapes, one line each: "NAME: PORTS of
# SERVICES", SERVICES the rendered Services its selector picks ("no
# Service" when none does).
servicemonitors() {
  node -e '
    const YAML = require(require.resolve("yaml", {paths: [process.argv[1]]}));
    const objects = process.argv.slice(2).flatMap((file) => YAML.parseAllDocuments(
        require("fs").readFileSync(file, "utf8")).map((d) => d.toJS()).filter(Boolean));
    const services = objects.filter((o) => o.kind === "Service");
    for (const m of objects.filter((o) => o.kind === "ServiceMonitor")) {
      const want = Object.entries((m.spec.selector && m.spec.selector.matchLabels) || {});
      const picked = services.filter((s) => want.every(([k, v]) => (s.metadata.labels || {})[k] === v));
      const ports = (m.spec.endpoints || []).map((e) => e.port).join(",");
      console.log(`${m.metadata.name}: ${ports} of ${picked.map((s) => s.metadata.name).join(" ") || "no Service"}`);
    }' "$MODULES" "$@"
}

# Every $(VAR) reference in a container's args (and command) that nothing
# the container reads sets, one line each: "Kind/name container "c": args[i]
# $(VAR) ...". Set are its env[] names and, with their envFrom prefix, the
# keys of the rendered ConfigMaps it reads (a Secret's keys are not
# rendered: they set nothing known here). The kubelet leaves such a
# reference as it is, so the binary would get the literal text.
unset_vars() {
  node -e '
    const YAML = require(require.resolve("yaml", {paths: [process.argv[1]]}));
    const text = require("fs").readFileSync(process.argv[2], "utf8");
    const objects = YAML.parseAllDocuments(text).map((d) => d.toJS()).filter(Boolean);
    const configMaps = new Map(objects.filter((o) => o.kind === "ConfigMap").map((o) =>
        [o.metadata.name, Object.keys({...(o.data || {}), ...(o.binaryData || {})})]));
    for (const o of objects) {
      const spec = o.spec && o.spec.template && o.spec.template.spec;
      if (!spec) continue;
      for (const c of [...(spec.initContainers || []), ...(spec.containers || [])]) {
        const set = new Set((c.env || []).map((e) => e.name));
        for (const from of c.envFrom || []) {
          const ref = from.configMapRef;
          for (const key of (ref && configMaps.get(ref.name)) || []) set.add((from.prefix || "") + key);
        }
        for (const field of ["command", "args"]) {
          (c[field] || []).forEach((arg, i) => {
            // $$ is the escape of a literal $.
            for (const m of String(arg).matchAll(/\$(\$|\(([-._a-zA-Z][-._a-zA-Z0-9]*)\))/g)) {
              if (m[2] && !set.has(m[2])) {
                console.log(`${o.kind}/${o.metadata.name} container "${c.name}": ${field}[${i}] ` +
                    `$(${m[2]}) is set by no env entry and no rendered ConfigMap it reads`);
              }
            }
          });
        }
      }
    }' "$MODULES" "$1"
}

# Each StatefulSet's terminationGracePeriodSeconds against the longest
# shutdown its container's flags allow, with the values of the rendered args
# and of the env and ConfigMaps they read, one line per container:
# "NAME: TERMS = S s < grace G", or "NAME: TERMS = S s >= grace G: too short"
# when the kubelet's SIGKILL would come first (cutting off the coordinator's
# last saves, a worker's drain). The coordinator (coordinator/main.cc):
# "delay" (--shutdown-delay-seconds), 5 s for open calls (kShutdownGrace),
# "stop" (--stop-timeout-seconds). A worker (worker/main.cc, worker.yaml):
# 2 x 10 s for its drain ask (an RPC of WorkerAgentOptions' rpc_timeout,
# sent once more to a new leader), "delay", "drain"
# (--drain-timeout-seconds), 2 x 10 s by which the last ask may end past
# it, 2 s to deregister (kDeregisterTimeout), "stop". An absent flag counts
# with the binary's default. Exits 1 when a grace period is too short or a
# value cannot be read.
grace_periods() {
  node -e '
    const YAML = require(require.resolve("yaml", {paths: [process.argv[1]]}));
    const text = require("fs").readFileSync(process.argv[2], "utf8");
    const objects = YAML.parseAllDocuments(text).map((d) => d.toJS()).filter(Boolean);
    const configMaps = new Map(objects.filter((o) => o.kind === "ConfigMap")
        .map((o) => [o.metadata.name, o.data || {}]));
    // Per container name: each flag with the binary default, and the terms
    // of its shutdown, [shown, seconds].
    const shutdowns = {
      coordinator: {
        flags: {"shutdown-delay-seconds": 0, "stop-timeout-seconds": 30},
        terms: (f) => [[`delay ${f["shutdown-delay-seconds"]}`, f["shutdown-delay-seconds"]],
                       ["5", 5], [`stop ${f["stop-timeout-seconds"]}`, f["stop-timeout-seconds"]]],
      },
      worker: {
        flags: {"shutdown-delay-seconds": 0, "drain-timeout-seconds": 60,
                "stop-timeout-seconds": 20},
        terms: (f) => [["2 x 10", 20],
                       [`delay ${f["shutdown-delay-seconds"]}`, f["shutdown-delay-seconds"]],
                       [`drain ${f["drain-timeout-seconds"]}`, f["drain-timeout-seconds"]],
                       ["2 x 10", 20], ["2", 2],
                       [`stop ${f["stop-timeout-seconds"]}`, f["stop-timeout-seconds"]]],
      },
    };
    let failed = false;
    for (const o of objects.filter((o) => o.kind === "StatefulSet")) {
      const spec = o.spec.template.spec;
      const grace = spec.terminationGracePeriodSeconds ?? 30;  // the Kubernetes default
      for (const c of spec.containers || []) {
        const shutdown = shutdowns[c.name];
        if (!shutdown) continue;
        const vars = new Map((c.env || []).filter((e) => "value" in e)
            .map((e) => [e.name, e.value]));
        for (const from of c.envFrom || []) {
          const data = (from.configMapRef && configMaps.get(from.configMapRef.name)) || {};
          for (const [k, v] of Object.entries(data)) vars.set((from.prefix || "") + k, v);
        }
        const flags = {...shutdown.flags};
        const args = (c.args || []).map((a) => String(a).replace(/\$(\$|\(([^)]*)\))/g,
            (m, d, name) => (name === undefined ? "$" : vars.has(name) ? vars.get(name) : m)));
        args.forEach((arg, i) => {
          const m = /^--([a-z-]+)(?:=(.*))?$/.exec(arg);
          if (m && m[1] in flags) flags[m[1]] = Number(m[2] !== undefined ? m[2] : args[i + 1]);
        });
        const terms = shutdown.terms(flags);
        const sum = terms.reduce((total, [, seconds]) => total + seconds, 0);
        const shown = `${o.metadata.name}: ${terms.map(([t]) => t).join(" + ")}`;
        if (Number.isNaN(sum)) {
          console.log(`${shown}: a value is not a number`);
          failed = true;
        } else if (sum < grace) {
          console.log(`${shown} = ${sum} s < grace ${grace}`);
        } else {
          console.log(`${shown} = ${sum} s >= grace ${grace}: too short`);
          failed = true;
        }
      }
    }
    process.exit(failed ? 1 : 0);' "$MODULES" "$1"
}

# kustomize refuses files whose real path leaves the kustomization root, and
# Bazel's runfiles are symlinks into the source tree: render a real copy.
mkdir -p "$T/k8s"
cp -RL "$R/deploy/k8s/base" "$R/deploy/k8s/components" "$R/deploy/k8s/overlays" "$T/k8s/"
# components/shared-checkpoints: in an overlay of cpu-demo (testdata), and
# added to the gpu overlay with the one line an operator would add.
cp -RL "$TESTDATA/shared_checkpoints" "$T/k8s/overlays/shared-checkpoints"
cp -RL "$T/k8s/overlays/gpu" "$T/k8s/overlays/gpu-shared"
sed -i 's|^  - ../../components/prometheus-operator$|&\n  - ../../components/shared-checkpoints|' \
  "$T/k8s/overlays/gpu-shared/kustomization.yaml"
check "gpu-shared: the component's line added" grep -qxF -- "  - ../../components/shared-checkpoints" \
  "$T/k8s/overlays/gpu-shared/kustomization.yaml"

# Current kustomize syntax only.
check "no deprecated kustomize fields" fails grep -nE \
  '^(bases|patchesStrategicMerge|patchesJson6902|commonLabels|vars):' \
  "$T/k8s/base/kustomization.yaml" "$T"/k8s/components/*/kustomization.yaml \
  "$T"/k8s/overlays/*/kustomization.yaml

declare -A KINDS=(
  [cpu-demo]="valid: ConfigMap 4, Job 1, NetworkPolicy 3, PodDisruptionBudget 2, Service 2, ServiceAccount 1, StatefulSet 2"
  [gpu]="valid: ConfigMap 4, Job 1, NetworkPolicy 3, PodDisruptionBudget 2, PrometheusRule 1, Service 2, ServiceAccount 1, ServiceMonitor 2, StatefulSet 2"
  [shared-checkpoints]="valid: ConfigMap 4, Job 1, NetworkPolicy 3, PersistentVolumeClaim 1, PodDisruptionBudget 2, Service 2, ServiceAccount 1, StatefulSet 2"
  [gpu-shared]="valid: ConfigMap 4, Job 1, NetworkPolicy 3, PersistentVolumeClaim 1, PodDisruptionBudget 2, PrometheusRule 1, Service 2, ServiceAccount 1, ServiceMonitor 2, StatefulSet 2"
)
for overlay in $OVERLAYS; do
  out="$T/$overlay.yaml"
  check "kubectl kustomize overlays/$overlay" render "$overlay" "$out"
  check "overlay $overlay validates" node "$VALIDATE" --modules "$MODULES" "$out"
  cp "$T/out.txt" "$T/$overlay.validation.txt"
  echo "$overlay schemas: $(tail -n 1 "$T/$overlay.validation.txt")"
  check "overlay $overlay: the expected objects" has "$T/$overlay.validation.txt" "${KINDS[$overlay]}"
  check "overlay $overlay passes the policy check" node "$POLICY" --modules "$MODULES" "$out"
  cp "$T/out.txt" "$T/$overlay.policy.txt"
  echo "$overlay policy: $(tail -n 1 "$T/$overlay.policy.txt")"
  check "overlay $overlay: 3 pod templates, 0 violations" has "$T/$overlay.policy.txt" \
    "pod templates, 0 violations"
  # Tokens: created by the operator, never rendered, never on a command line.
  check "overlay $overlay renders no Secret" fails grep -qx 'kind: Secret' "$out"
  check "overlay $overlay has no placeholder token" fails has "$out" "REPLACE-ME"
  check "overlay $overlay passes tokens as files" has "$out" \
    "--join-token-file=/etc/pipetrain/tokens/join-token"
  check "overlay $overlay: the sample submit retries with a request id" has "$out" \
    '/v1/jobs?requestId=sample-$SUBMIT_ID'
  check "overlay $overlay: the request id from the label every version sets" has "$out" \
    "fieldPath: metadata.labels['controller-uid']"
  check "overlay $overlay: no submit without a request id" has "$out" '[ -n "$SUBMIT_ID" ] ||'
  check "overlay $overlay gives workers their container's memory limit" has "$out" \
    "--memory-limit=\$(PIPETRAIN_MEMORY_LIMIT)"
  check "overlay $overlay: the limit from the worker container's resources" has "$out" \
    "resource: limits.memory"
  check "overlay $overlay keeps the mailbox and an eighth out of the workers' plans" has "$out" \
    "--memory-reserve=\$(PIPETRAIN_MEMORY_RESERVE)"
  unset_vars "$out" > "$T/$overlay.vars.txt"
  check "overlay $overlay: every \$(VAR) in args is set by the container's env or ConfigMaps" \
    diff /dev/null "$T/$overlay.vars.txt"
  # HTTP probes only: the kubelet's gRPC probes cannot do TLS, which
  # --tls-cert (coordinator) and --data-tls-* (workers) put on those ports.
  probes "$out" > "$T/$overlay.probes.txt"
  expect_lines "$T/$overlay.probes.txt" \
    "coordinator startupProbe httpGet http /readyz" \
    "coordinator livenessProbe httpGet http /healthz" \
    "coordinator readinessProbe httpGet http /readyz" \
    "worker startupProbe httpGet metrics /healthz" "worker livenessProbe httpGet metrics /healthz" \
    "worker readinessProbe httpGet metrics /readyz"
  check "overlay $overlay: no gRPC probe" fails grep -q " grpc " "$T/$overlay.probes.txt"
  check "overlay $overlay: each terminationGracePeriodSeconds outlasts its shutdown" \
    grace_periods "$out"
  cp "$T/out.txt" "$T/$overlay.grace.txt"
  check "overlay $overlay: the shutdowns as the flags set them" diff <(printf '%s\n' \
    "pipetrain-coordinator: delay 5 + 5 + stop 20 = 30 s < grace 40" \
    "pipetrain-worker: 2 x 10 + delay 5 + drain 60 + 2 x 10 + 2 + stop 20 = 127 s < grace 130") \
    "$T/$overlay.grace.txt"
  ingress "$out" > "$T/$overlay.ingress.txt"
  check "overlay $overlay: 5 ingress rules" test "$(wc -l < "$T/$overlay.ingress.txt")" -eq 5
  expect_lines "$T/$overlay.ingress.txt" \
    "pipetrain-worker: data <- pods(worker,pipetrain) pods(coordinator,pipetrain)" \
    "pipetrain-worker: metrics <- namespace(monitoring)" \
    "pipetrain-coordinator: grpc <- pods(worker,pipetrain)" \
    "pipetrain-coordinator: http <- pods(submit-sample-job,pipetrain) namespace(monitoring)" \
    "pipetrain-submit-sample: no ingress"
done
# What distinguishes the overlays.
check "cpu-demo runs 4 workers" has "$T/cpu-demo.yaml" "replicas: 4"
check "cpu-demo requests no GPU" fails has "$T/cpu-demo.yaml" "nvidia.com/gpu"
check "gpu workers request a GPU" has "$T/gpu.yaml" "nvidia.com/gpu: 1"
check "gpu workers tolerate the GPU taint" has "$T/gpu.yaml" "key: nvidia.com/gpu"
check "gpu overlay sizes the coordinator's volume" has "$T/gpu.yaml" "storage: 100Gi"
# Checkpoints: without the component the coordinator writes under its own
# (ReadWriteOnce) volume and the workers have no --checkpoint-root; with it,
# --output-dir and every worker's --checkpoint-root are one path on one
# ReadWriteMany claim, and the state stays on the coordinator's volume.
for overlay in $OVERLAYS; do
  storage_paths "$T/$overlay.yaml" > "$T/$overlay.paths.txt"
  size=1Gi; case $overlay in gpu*) size=100Gi ;; esac
  expected=(
    "coordinator --output-dir /var/lib/pipetrain/out on volumeClaimTemplate data (ReadWriteOnce, $size)"
    "coordinator --state-dir /var/lib/pipetrain/state on volumeClaimTemplate data (ReadWriteOnce, $size)"
  )
  case $overlay in *shared*) expected=(
    "coordinator --output-dir /var/lib/pipetrain/shared on claim pipetrain-shared (ReadWriteMany, 100Gi)"
    "coordinator --state-dir /var/lib/pipetrain/state on volumeClaimTemplate data (ReadWriteOnce, $size)"
    "worker --checkpoint-root /var/lib/pipetrain/shared on claim pipetrain-shared (ReadWriteMany, 100Gi)"
  ) ;; esac
  check "overlay $overlay: where the output, state and checkpoints lie" \
    diff <(printf '%s\n' "${expected[@]}") "$T/$overlay.paths.txt"
done
check "shared-checkpoints: the claim leaves storageClassName to the overlay" \
  fails has "$T/shared-checkpoints.yaml" "storageClassName"
check "shared-checkpoints: fsGroup changes only on a root mismatch" test \
  "$(grep -c 'fsGroupChangePolicy: OnRootMismatch' "$T/shared-checkpoints.yaml")" -eq 2
# Images: pipetrain's own are local names (or an overlay's registry), never
# a bare name a public registry would resolve.
for overlay in $OVERLAYS; do
  grep -o 'image: [^ ]*pipetrain/[a-z]*:[^ ]*' "$T/$overlay.yaml" | sort -u > "$T/$overlay.images.txt"
  expect_lines "$T/$overlay.images.txt" "image: localhost/pipetrain/coordinator:0.1.0" \
    "image: localhost/pipetrain/worker:0.1.0"
  check "overlay $overlay: only local pipetrain images" test "$(wc -l < "$T/$overlay.images.txt")" -eq 2
  # Any other image (the sample job's curl) runs with a token mounted: it
  # must be pinned by digest, which a registry cannot re-point as it can a tag.
  grep -oE 'image: [^ ]+' "$T/$overlay.yaml" | grep -v 'image: localhost/pipetrain/' | sort -u \
    > "$T/$overlay.other_images.txt"
  check "overlay $overlay: other images are pinned by digest" \
    fails grep -vE '@sha256:[0-9a-f]{64}$' "$T/$overlay.other_images.txt"
  check "overlay $overlay: the other images were read" test -s "$T/$overlay.other_images.txt"
done
# Each StatefulSet reads a flags ConfigMap of its own (base/kustomization.yaml):
# a changed coordinator flag renames pipetrain-coordinator-flags and so
# rolls the coordinator alone, leaving the workers' pod template as it was;
# a changed worker flag renames pipetrain-worker-flags and rolls the
# workers alone. Neither touches the submit Job's pod template (immutable on
# a live Job), so the apply goes through.
# The pod template of object KIND/NAME in FILE, as JSON. Usage: pod_template FILE KIND NAME
pod_template() {
  node -e '
    const YAML = require(require.resolve("yaml", {paths: [process.argv[1]]}));
    for (const doc of YAML.parseAllDocuments(require("fs").readFileSync(process.argv[2], "utf8"))) {
      const o = doc.toJS();
      if (o && o.kind === process.argv[3] && o.metadata.name === process.argv[4]) {
        console.log(JSON.stringify(o.spec.template));
      }
    }' "$MODULES" "$1" "$2" "$3"
}
job_template() { pod_template "$1" Job pipetrain-submit-sample; }
# The generated (hashed) names of ConfigMap NAME in FILE. Usage: generated FILE NAME
generated() { grep -o "$2-[a-z0-9]\+" "$1" | sort -u; }
# A coordinator-only value (the planning hint --network), merged into the
# coordinator's ConfigMap; a worker-only value (--mailbox-limit) changed in
# the workers' merge.
cp -RL "$T/k8s/overlays/cpu-demo" "$T/k8s/overlays/coordinator-flagged"
sed -i 's|^  - name: pipetrain-sample-job$|  - name: pipetrain-coordinator-flags\n    behavior: merge\n    literals:\n      - PIPETRAIN_NETWORK=25Gbit,20us\n&|' \
  "$T/k8s/overlays/coordinator-flagged/kustomization.yaml"
cp -RL "$T/k8s/overlays/cpu-demo" "$T/k8s/overlays/worker-flagged"
sed -i 's|PIPETRAIN_MAILBOX_LIMIT=256M|PIPETRAIN_MAILBOX_LIMIT=128M|' \
  "$T/k8s/overlays/worker-flagged/kustomization.yaml"
for changed in coordinator worker; do
  other=worker; [ "$changed" = worker ] && other=coordinator
  new="$T/$changed-flagged.yaml"
  check "kubectl kustomize cpu-demo with a changed $changed flag" render "$changed-flagged" "$new"
  check "a changed $changed flag renamed pipetrain-$changed-flags" fails cmp -s \
    <(generated "$T/cpu-demo.yaml" "pipetrain-$changed-flags") <(generated "$new" "pipetrain-$changed-flags")
  check "a changed $changed flag rolls pipetrain-$changed" fails cmp -s \
    <(pod_template "$T/cpu-demo.yaml" StatefulSet "pipetrain-$changed") \
    <(pod_template "$new" StatefulSet "pipetrain-$changed")
  check "a changed $changed flag left the name of pipetrain-$other-flags" cmp -s \
    <(generated "$T/cpu-demo.yaml" "pipetrain-$other-flags") <(generated "$new" "pipetrain-$other-flags")
  check "a changed $changed flag left pipetrain-$other's pod template unchanged" cmp -s \
    <(pod_template "$T/cpu-demo.yaml" StatefulSet "pipetrain-$other") \
    <(pod_template "$new" StatefulSet "pipetrain-$other")
  check "a changed $changed flag left the submit Job's pod template unchanged" cmp -s \
    <(job_template "$T/cpu-demo.yaml") <(job_template "$new")
  check "pipetrain-$changed-flags: one generated name was read" \
    test "$(generated "$T/cpu-demo.yaml" "pipetrain-$changed-flags" | wc -l)" -eq 1
  check "pipetrain-$changed's pod template was read" \
    test -n "$(pod_template "$T/cpu-demo.yaml" StatefulSet "pipetrain-$changed")"
done
check "the changed coordinator flag is in the coordinator's ConfigMap" \
  has "$T/coordinator-flagged.yaml" "PIPETRAIN_NETWORK: 25Gbit,20us"
check "the changed worker flag is in the workers' ConfigMap" \
  has "$T/worker-flagged.yaml" "PIPETRAIN_MAILBOX_LIMIT: 128M"
check "the submit Job's pod template was read" test -n "$(job_template "$T/cpu-demo.yaml")"
check "PrometheusRule carries the groups of alerts.yml" node "$R/tests/k8s/prometheus_rule.js" \
  --check --modules "$MODULES" --alerts "$ALERTS" \
  --rule "$T/k8s/components/prometheus-operator-alerts/prometheusrule.yaml"
echo "prometheus rule: $(tail -n 1 "$T/out.txt")"

# A schema-invalid manifest: a string for replicas, a container without a
# name, and fields the schema does not list (spec.replica, the container's
# resource), which the generated validators alone let through.
BROKEN="$TESTDATA/broken_deployment.yaml"
node "$VALIDATE" --modules "$MODULES" "$BROKEN" > "$T/broken.txt" 2>&1
code=$?
echo "schema-invalid manifest (exit $code):"; cat "$T/broken.txt"
check "broken manifest exits 1" test "$code" -eq 1
check "broken manifest: replicas type" has "$T/broken.txt" \
  "INVALID Deployment/broken (${BROKEN}, document 2): /spec/replicas: must be integer"
check "broken manifest: container name" has "$T/broken.txt" \
  '/spec/template/spec/containers/0: must have required property "name"'
check "broken manifest: unknown field spec.replica" has "$T/broken.txt" \
  "/spec/replica: unknown field (not in the schema)"
check "broken manifest: unknown field containers[0].resource" has "$T/broken.txt" \
  "/spec/template/spec/containers/0/resource: unknown field (not in the schema)"
check "broken manifest: the valid ConfigMap is not reported" fails has "$T/broken.txt" "ConfigMap/fine"

# Pod templates that break each restricted control; a compliant Pod beside them.
V="$TESTDATA/restricted_violations.yaml"
run_node "$POLICY" --modules "$MODULES" "$V"
echo "restricted violations (exit $(cat "$T/run.code")): $(tail -n 1 "$T/run.txt")"
check "restricted violations exit 1" test "$(cat "$T/run.code")" -eq 1
D="VIOLATION Deployment/escalating ($V, document 1):"
S="VIOLATION DaemonSet/node-reader ($V, document 2):"
expect_lines "$T/run.txt" \
  "$D pod: host namespaces: hostNetwork must be unset or false" \
  "$D pod: host namespaces: hostPID must be unset or false" \
  "$D pod: sysctls: sysctl kernel.msgmax is not a safe sysctl" \
  "$D pod: AppArmor: annotation container.apparmor.security.beta.kubernetes.io/app is \"unconfined\"; must be runtime/default or localhost/*" \
  "$D pod: running as non-root user: securityContext.runAsUser must not be 0" \
  "$D pod: seccomp: securityContext.seccompProfile.type is Unconfined; must be RuntimeDefault or Localhost" \
  "$D container \"app\": privileged: securityContext.privileged must be unset or false" \
  "$D container \"app\": /proc mount type: securityContext.procMount is Unmasked; must be Default" \
  "$D container \"app\": privilege escalation: securityContext.allowPrivilegeEscalation must be false" \
  "$D container \"app\": capabilities: securityContext.capabilities.drop must include ALL" \
  "$D container \"app\": running as non-root: runAsNonRoot must be true in the pod or container securityContext" \
  "$D container \"app\": host ports: port 8080 has hostPort 8080" \
  "$D container \"app\": SELinux: securityContext.seLinuxOptions.type spc_t is not allowed" \
  "$D container \"app\": read-only root filesystem: securityContext.readOnlyRootFilesystem must be true" \
  "$D init container \"setup\": capabilities: securityContext.capabilities.add may hold only NET_BIND_SERVICE, not SYS_ADMIN" \
  "$S pod: volume types: volume \"host\" has type hostPath; allowed: configMap, csi, downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, projected, secret" \
  "$S pod: service account token: automountServiceAccountToken must be false (pipetrain never calls the Kubernetes API)" \
  "3 objects, 3 pod templates, 17 violations"
check "the compliant Pod is not reported" fails has "$T/run.txt" "Pod/compliant"

# Selectors that would pick other components' or other installs' pods:
# without the component, empty, or with matchExpressions only. This file
# and token_via_env.yaml are otherwise valid, so a misspelling in them
# cannot hide what they show.
check "selector and env testdata validate" node "$VALIDATE" --modules "$MODULES" \
  "$TESTDATA/selector_violations.yaml" "$TESTDATA/token_via_env.yaml"
V="$TESTDATA/selector_violations.yaml"
run_node "$POLICY" --modules "$MODULES" "$V"
echo "selector violations (exit $(cat "$T/run.code")): $(tail -n 1 "$T/run.txt")"
check "selector violations exit 1" test "$(cat "$T/run.code")" -eq 1
ALL="lacks app.kubernetes.io/name, app.kubernetes.io/instance, app.kubernetes.io/component, so it would also pick the"
N="VIOLATION NetworkPolicy/wide-open ($V, document 4):"
expect_lines "$T/run.txt" \
  "VIOLATION Deployment/expressions ($V, document 1): spec.selector.matchLabels: selector: $ALL pods of a second install in the namespace" \
  "VIOLATION Service/no-component ($V, document 2): spec.selector: selector: lacks app.kubernetes.io/component, so it would also pick the pods of other components" \
  "VIOLATION PodDisruptionBudget/everything ($V, document 3): spec.selector.matchLabels: selector: $ALL pods of a second install in the namespace" \
  "$N spec.podSelector.matchLabels: selector: $ALL pods of a second install in the namespace" \
  "$N spec.ingress[0].from[0].podSelector.matchLabels: selector: $ALL pods of a second install in the namespace" \
  "$N spec.egress[0].to[0].podSelector.matchLabels: selector: $ALL pods of a second install in the namespace" \
  "VIOLATION ServiceMonitor/all-services ($V, document 5): spec.selector.matchLabels: selector: $ALL Services of a second install in the namespace" \
  "5 objects, 1 pod templates, 7 violations"
check "the peer in another namespace (Prometheus) is not reported" fails has "$T/run.txt" "from[1]"

# Tokens on command lines, and a committed placeholder Secret.
V="$TESTDATA/token_in_args.yaml"
run_node "$POLICY" --modules "$MODULES" "$V"
echo "tokens in args (exit $(cat "$T/run.code")): $(tail -n 1 "$T/run.txt")"
check "tokens in args exit 1" test "$(cat "$T/run.code")" -eq 1
J="VIOLATION Job/leaky ($V, document 2):"
expect_lines "$T/run.txt" \
  "VIOLATION Secret/committed-tokens ($V, document 1): data.join-token: placeholder token: holds REPLACE-ME; create the Secret outside the manifests (docs/operations.md)" \
  "$J container \"expanded\": token on the command line: args[1] passes USER_TOKEN, which comes from a Secret" \
  "$J container \"shell\": token on the command line: args[0] passes TOKEN, which comes from a Secret" \
  "$J container \"literal\": token on the command line: args[0] passes a value with --join-token (use a -file flag and a mounted Secret)" \
  "$J container \"literal\": token on the command line: args[1] passes a value with --user-token (use a -file flag and a mounted Secret)" \
  "$J container \"literal\": token on the command line: args[3] passes a literal Bearer token" \
  "$J container \"literal\": token on the command line: args[4] holds the value of Secret/committed-tokens key user-token" \
  "$J container \"literal\": token on the command line: args[5] holds the placeholder REPLACE-ME" \
  "$J container \"prefixed\": token on the command line: args[0] passes T_join-token, which comes from a Secret" \
  "2 objects, 1 pod templates, 9 violations"
check "the -file flag is not reported" fails has "$T/run.txt" "args[6]"

# Secret values that reach a command line with no Secret rendered: envFrom
# of the operator's Secret, and env vars that pass a Secret's value on.
V="$TESTDATA/token_via_env.yaml"
run_node "$POLICY" --modules "$MODULES" "$V"
echo "tokens through env (exit $(cat "$T/run.code")): $(tail -n 1 "$T/run.txt")"
check "tokens through env exit 1" test "$(cat "$T/run.code")" -eq 1
J="VIOLATION Job/indirect ($V, document 2):"
expect_lines "$T/run.txt" \
  "$J container \"unrendered\": token on the command line: args[1] passes USER_TOKEN, which comes from a Secret" \
  "$J container \"chained\": token on the command line: args[1] passes HEADER, which comes from a Secret" \
  "$J container \"prefixed-chain\": token on the command line: args[0] passes WRAPPED, which comes from a Secret" \
  "2 objects, 1 pod templates, 3 violations"
check "a ConfigMap's or a fieldRef's variable is not reported" \
  fails grep -qE 'args\[(0|2)\] passes (COORDINATOR|POD_NAME)' "$T/run.txt"
check "a variable without the envFrom prefix is not reported" fails has "$T/run.txt" "OTHER"

# A broken copy of cpu-demo, rendered by kustomize like the real overlays.
cp -RL "$TESTDATA/broken_overlay" "$T/k8s/overlays/broken"
check "kubectl kustomize the broken copy" render broken "$T/broken-overlay.yaml"
B="$T/broken-overlay.yaml"
run_node "$POLICY" --modules "$MODULES" "$B"
echo "broken copy of cpu-demo (exit $(cat "$T/run.code")):"; cat "$T/run.txt"
check "broken copy exits 1" test "$(cat "$T/run.code")" -eq 1
C="VIOLATION StatefulSet/pipetrain-coordinator ($B, document 8):"
W="VIOLATION StatefulSet/pipetrain-worker ($B, document 9):"
expect_lines "$T/run.txt" \
  "$C pod: host namespaces: hostNetwork must be unset or false" \
  "$C container \"coordinator\": seccomp: seccompProfile.type must be RuntimeDefault or Localhost in the pod or container securityContext" \
  "$C container \"coordinator\": read-only root filesystem: securityContext.readOnlyRootFilesystem must be true" \
  "$W container \"worker\": privileged: securityContext.privileged must be unset or false" \
  "$W container \"worker\": privilege escalation: securityContext.allowPrivilegeEscalation must be false" \
  "$W container \"worker\": token on the command line: args[13] passes JOIN_TOKEN, which comes from a Secret" \
  "15 objects, 3 pod templates, 6 violations"

# A coordinator that reads the workers' ConfigMap: unset_vars names each of
# its flags that ConfigMap does not set (the shutdown delay it does).
cp -RL "$TESTDATA/swapped_flags" "$T/k8s/overlays/swapped"
check "kubectl kustomize the coordinator reading the workers' flags" render swapped "$T/swapped.yaml"
unset_vars "$T/swapped.yaml" > "$T/swapped.vars.txt"
echo "coordinator reading the workers' flags:"; cat "$T/swapped.vars.txt"
U="StatefulSet/pipetrain-coordinator container \"coordinator\":"
N="is set by no env entry and no rendered ConfigMap it reads"
check "swapped flags: 3 unset references" test "$(wc -l < "$T/swapped.vars.txt")" -eq 3
expect_lines "$T/swapped.vars.txt" \
  "$U args[6] \$(PIPETRAIN_LEASE_SECONDS) $N" \
  "$U args[7] \$(PIPETRAIN_HEARTBEAT_SECONDS) $N" \
  "$U args[9] \$(PIPETRAIN_NETWORK) $N"

# Shutdowns longer than the grace periods: a coordinator delay of 20 s and a
# worker drain timeout of 120 s, merged into the flags ConfigMaps as their
# comments invite. grace_periods must name both.
cp -RL "$TESTDATA/grace_too_short" "$T/k8s/overlays/grace-short"
check "kubectl kustomize longer shutdowns" render grace-short "$T/grace-short.yaml"
grace_periods "$T/grace-short.yaml" > "$T/run.txt" 2>&1; echo $? > "$T/run.code"
echo "longer shutdowns (exit $(cat "$T/run.code")):"; cat "$T/run.txt"
check "longer shutdowns exit 1" test "$(cat "$T/run.code")" -eq 1
G="too short"
expect_lines "$T/run.txt" \
  "pipetrain-coordinator: delay 20 + 5 + stop 20 = 45 s >= grace 40: $G" \
  "pipetrain-worker: 2 x 10 + delay 5 + drain 120 + 2 x 10 + 2 + stop 20 = 187 s >= grace 130: $G"

# Two installs in one namespace: with their own instance label they share
# nothing; with the same one, every selector picks both installs' pods.
cp -RL "$TESTDATA/second_install" "$T/k8s/overlays/second"
cp -RL "$TESTDATA/same_instance_install" "$T/k8s/overlays/same"
check "kubectl kustomize a second install" render second "$T/second.yaml"
check "kubectl kustomize a second install with the same instance" render same "$T/same.yaml"
unset_vars "$T/second.yaml" > "$T/second.vars.txt"
check "second install: every \$(VAR) in args is set by the container's env or ConfigMaps" \
  diff /dev/null "$T/second.vars.txt"
check "second install: its workers dial its own coordinator" \
  has "$T/second.yaml" "PIPETRAIN_COORDINATOR: second-pipetrain-coordinator:7070"
run_node "$POLICY" --modules "$MODULES" "$T/cpu-demo.yaml" "$T/second.yaml"
echo "cpu-demo + a second install: $(tail -n 1 "$T/run.txt")"
check "two installs share a namespace" test "$(cat "$T/run.code")" -eq 0
check "two installs: 0 violations" has "$T/run.txt" "30 objects, 6 pod templates, 0 violations"
run_node "$POLICY" --modules "$MODULES" "$T/cpu-demo.yaml" "$T/same.yaml"
echo "cpu-demo + an install with the same instance (exit $(cat "$T/run.code")): $(tail -n 1 "$T/run.txt")"
check "same instance label exits 1" test "$(cat "$T/run.code")" -eq 1
expect_lines "$T/run.txt" \
  "VIOLATION StatefulSet/pipetrain-worker ($T/cpu-demo.yaml, document 9): spec.selector.matchLabels: selector: picks the worker pods of StatefulSet/pipetrain-worker ($T/cpu-demo.yaml, document 9) and StatefulSet/other-pipetrain-worker ($T/same.yaml, document 9)" \
  "VIOLATION Service/other-pipetrain-coordinator ($T/same.yaml, document 6): spec.selector: selector: picks the coordinator pods of StatefulSet/pipetrain-coordinator ($T/cpu-demo.yaml, document 8) and StatefulSet/other-pipetrain-coordinator ($T/same.yaml, document 8)"

# Two installs with the Prometheus Operator: every install needs
# ServiceMonitors of its own (each selects its own install's Services), and
# the PrometheusRule, whose rules match every install's jobs, is needed
# once. The first install is the gpu overlay (components/prometheus-operator:
# both); the second is the install above with
# components/prometheus-operator-servicemonitors
# (testdata/second_install_monitored), or one built on the gpu overlay that
# deletes its copy of the rule (testdata/second_install_gpu).
cp -RL "$TESTDATA/second_install_monitored" "$T/k8s/overlays/second-monitored"
cp -RL "$TESTDATA/second_install_gpu" "$T/k8s/overlays/second-gpu"
check "gpu: its ServiceMonitors scrape its Services" diff \
  <(printf '%s\n' "pipetrain-coordinator: http of pipetrain-coordinator" \
      "pipetrain-worker: metrics of pipetrain-worker") <(servicemonitors "$T/gpu.yaml")
for second in second-monitored second-gpu; do
  out="$T/$second.yaml"
  check "kubectl kustomize $second" render "$second" "$out"
  check "$second validates" node "$VALIDATE" --modules "$MODULES" "$out"
  cp "$T/out.txt" "$T/$second.validation.txt"
  check "$second: ServiceMonitors, no PrometheusRule" has "$T/$second.validation.txt" \
    "valid: ConfigMap 4, Job 1, NetworkPolicy 3, PodDisruptionBudget 2, Service 2, ServiceAccount 1, ServiceMonitor 2, StatefulSet 2"
  unset_vars "$out" > "$T/$second.vars.txt"
  check "$second: every \$(VAR) in args is set by the container's env or ConfigMaps" \
    diff /dev/null "$T/$second.vars.txt"
  run_node "$POLICY" --modules "$MODULES" "$T/gpu.yaml" "$out"
  echo "gpu + $second: $(tail -n 1 "$T/run.txt")"
  check "gpu + $second: 0 violations" has "$T/run.txt" "35 objects, 6 pod templates, 0 violations"
  check "gpu + $second: one PrometheusRule in all" \
    test "$(cat "$T/gpu.yaml" "$out" | grep -c '^kind: PrometheusRule$')" -eq 1
  servicemonitors "$T/gpu.yaml" "$out" > "$T/$second.monitors.txt"
  check "gpu + $second: each install's ServiceMonitors scrape its own Services" diff \
    <(printf '%s\n' "pipetrain-coordinator: http of pipetrain-coordinator" \
        "pipetrain-worker: metrics of pipetrain-worker" \
        "second-pipetrain-coordinator: http of second-pipetrain-coordinator" \
        "second-pipetrain-worker: metrics of second-pipetrain-worker") \
    "$T/$second.monitors.txt"
done
# The component listed in an overlay built on the second install: its
# ServiceMonitors miss the install's prefix and instance label.
cp -RL "$TESTDATA/servicemonitors_too_late" "$T/k8s/overlays/second-late"
check "kubectl kustomize the ServiceMonitors listed too late" render second-late "$T/second-late.yaml"
run_node "$POLICY" --modules "$MODULES" "$T/gpu.yaml" "$T/second-late.yaml"
echo "gpu + ServiceMonitors listed too late (exit $(cat "$T/run.code")):"; cat "$T/run.txt"
check "ServiceMonitors listed too late exit 1" test "$(cat "$T/run.code")" -eq 1
expect_lines "$T/run.txt" \
  "VIOLATION ServiceMonitor/pipetrain-coordinator ($T/second-late.yaml, document 13): metadata.name: names: collides with $T/gpu.yaml, document 14" \
  "VIOLATION ServiceMonitor/pipetrain-worker ($T/second-late.yaml, document 14): metadata.name: names: collides with $T/gpu.yaml, document 15" \
  "35 objects, 6 pod templates, 2 violations"
servicemonitors "$T/second-late.yaml" > "$T/second-late.monitors.txt"
check "ServiceMonitors listed too late: none selects the second install's Services" diff \
  <(printf '%s\n' "pipetrain-coordinator: http of no Service" "pipetrain-worker: metrics of no Service") \
  "$T/second-late.monitors.txt"

# A second install with the shared-checkpoints component gets a claim of its
# own (kustomize renames the claim and the pods' references to it).
cp -RL "$TESTDATA/second_install" "$T/k8s/overlays/second-shared"
sed -i 's|^  - ../cpu-demo$|  - ../shared-checkpoints|' "$T/k8s/overlays/second-shared/kustomization.yaml"
check "kubectl kustomize a second install with shared checkpoints" render second-shared \
  "$T/second-shared.yaml"
run_node "$POLICY" --modules "$MODULES" "$T/shared-checkpoints.yaml" "$T/second-shared.yaml"
echo "shared-checkpoints + a second install: $(tail -n 1 "$T/run.txt")"
check "two installs with shared checkpoints: 0 violations" has "$T/run.txt" \
  "32 objects, 6 pod templates, 0 violations"
storage_paths "$T/second-shared.yaml" > "$T/second-shared.paths.txt"
expect_lines "$T/second-shared.paths.txt" \
  "coordinator --output-dir /var/lib/pipetrain/shared on claim second-pipetrain-shared (ReadWriteMany, 100Gi)" \
  "worker --checkpoint-root /var/lib/pipetrain/shared on claim second-pipetrain-shared (ReadWriteMany, 100Gi)"

# A broken use of the component: the workers' mount removed, the state moved
# into --output-dir. storage_paths must report both.
cp -RL "$TESTDATA/shared_checkpoints_broken" "$T/k8s/overlays/shared-broken"
check "kubectl kustomize the broken use of shared-checkpoints" render shared-broken \
  "$T/shared-broken.yaml"
storage_paths "$T/shared-broken.yaml" > "$T/shared-broken.paths.txt"
echo "broken use of shared-checkpoints:"; cat "$T/shared-broken.paths.txt"
expect_lines "$T/shared-broken.paths.txt" \
  "worker --checkpoint-root /var/lib/pipetrain/shared on the root filesystem" \
  "coordinator --state-dir /var/lib/pipetrain/shared/state on claim pipetrain-shared (ReadWriteMany, 100Gi)" \
  "coordinator: --state-dir /var/lib/pipetrain/shared/state lies inside --output-dir /var/lib/pipetrain/shared"

report
