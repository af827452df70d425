#!/usr/bin/env node
// Checks rendered Kubernetes manifests (e.g. `kubectl kustomize` output)
// against the policies pipetrain's manifests promise:
//
//   - Pod Security Standards "restricted" (which includes "baseline"), as
//     the Kubernetes documentation defines them, on every pod template of a
//     Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job or CronJob;
//   - readOnlyRootFilesystem on every container and no mounted API token
//     (automountServiceAccountToken: false), beyond "restricted";
//   - no token on a command line: no container's command or args pass a
//     Secret-sourced variable ($(VAR), $VAR, ${VAR}), a --*-token=VALUE
//     flag, a literal "Bearer ...", the value of a rendered Secret or the
//     placeholder REPLACE-ME;
//   - the app.kubernetes.io labels on every object and pod template, and
//     selectors that pick one install's pods only (name, instance and
//     component in every selector, an empty or matchExpressions-only one
//     included; no selector matches another install's pods; no two objects
//     share a kind and name).
//
//   node check_policy.js [--modules DIR] FILE...   (FILE "-" = stdin)
//
// All FILEs are checked as one set (pass two renders to check that two
// installs can share a namespace). Prints one line per violation,
// "VIOLATION Kind/name (FILE, document N): where: rule: message", then a
// summary line. Exit codes: 0 no violation, 1 violations (or a YAML error,
// or no pod template at all), 2 usage error or missing node_modules.
'use strict';

const {parseArgs, readDocuments, requireFrom, objectId} = require('./manifest_files');

const PROGRAM = 'check_policy';
const USAGE = 'node check_policy.js [--modules DIR] FILE...';

// --- Pod Security Standards --------------------------------------------------

// Volume types "restricted" allows (every other type, hostPath included, is
// refused).
const ALLOWED_VOLUME_TYPES = new Set([
  'configMap', 'csi', 'downwardAPI', 'emptyDir', 'ephemeral', 'persistentVolumeClaim',
  'projected', 'secret',
]);
// Sysctls "baseline" allows.
const SAFE_SYSCTLS = new Set([
  'kernel.shm_rmid_forced', 'net.ipv4.ip_local_port_range', 'net.ipv4.ip_unprivileged_port_start',
  'net.ipv4.tcp_syncookies', 'net.ipv4.ping_group_range', 'net.ipv4.ip_local_reserved_ports',
  'net.ipv4.tcp_keepalive_time', 'net.ipv4.tcp_fin_timeout', 'net.ipv4.tcp_keepalive_intvl',
  'net.ipv4.tcp_keepalive_probes',
]);
const ALLOWED_SELINUX_TYPES = new Set(
    ['', 'container_t', 'container_init_t', 'container_kvm_t', 'container_engine_t']);
const ALLOWED_SECCOMP = new Set(['RuntimeDefault', 'Localhost']);
const ALLOWED_APPARMOR = new Set(['RuntimeDefault', 'Localhost']);
const VOLUME_META_FIELDS = new Set(['name']);

// Every container of a pod spec with its kind of list, e.g.
// {container, where: 'container "worker"'}.
function allContainers(spec) {
  const lists = [['containers', 'container'], ['initContainers', 'init container'],
    ['ephemeralContainers', 'ephemeral container']];
  const result = [];
  for (const [field, label] of lists) {
    for (const container of spec[field] || []) {
      result.push({container, where: `${label} "${container.name}"`});
    }
  }
  return result;
}

// Host namespaces, host process, sysctls, volumes: the pod-level controls.
function podLevelProblems(spec, meta) {
  const problems = [];
  const add = (rule, message) => problems.push(`pod: ${rule}: ${message}`);
  for (const field of ['hostNetwork', 'hostPID', 'hostIPC']) {
    if (spec[field]) add('host namespaces', `${field} must be unset or false`);
  }
  const sc = spec.securityContext || {};
  if (sc.windowsOptions && sc.windowsOptions.hostProcess) {
    add('host process', 'securityContext.windowsOptions.hostProcess must be unset or false');
  }
  for (const sysctl of sc.sysctls || []) {
    if (!SAFE_SYSCTLS.has(sysctl.name)) add('sysctls', `sysctl ${sysctl.name} is not a safe sysctl`);
  }
  for (const volume of spec.volumes || []) {
    const types = Object.keys(volume).filter((k) => !VOLUME_META_FIELDS.has(k));
    for (const type of types) {
      if (!ALLOWED_VOLUME_TYPES.has(type)) {
        add('volume types', `volume "${volume.name}" has type ${type}; allowed: ` +
            [...ALLOWED_VOLUME_TYPES].join(', '));
      }
    }
  }
  const annotations = (meta && meta.annotations) || {};
  for (const [key, value] of Object.entries(annotations)) {
    if (key.startsWith('container.apparmor.security.beta.kubernetes.io/') &&
        value !== 'runtime/default' && !String(value).startsWith('localhost/')) {
      add('AppArmor', `annotation ${key} is "${value}"; must be runtime/default or localhost/*`);
    }
  }
  problems.push(...securityContextProblems(sc, 'pod', 'securityContext'));
  if (sc.runAsNonRoot === false) {
    add('running as non-root', 'securityContext.runAsNonRoot must not be false');
  }
  return problems;
}

// Controls a pod and a container securityContext share: runAsUser, seccomp,
// SELinux, AppArmor (only the values set are checked here; the "must be
// set" rules look at pod and container together).
function securityContextProblems(sc, who, path) {
  const problems = [];
  const add = (rule, message) => problems.push(`${who}: ${rule}: ${message}`);
  if (sc.runAsUser === 0) add('running as non-root user', `${path}.runAsUser must not be 0`);
  if (sc.seccompProfile && !ALLOWED_SECCOMP.has(sc.seccompProfile.type)) {
    add('seccomp', `${path}.seccompProfile.type is ${sc.seccompProfile.type}; ` +
        'must be RuntimeDefault or Localhost');
  }
  if (sc.appArmorProfile && !ALLOWED_APPARMOR.has(sc.appArmorProfile.type)) {
    add('AppArmor', `${path}.appArmorProfile.type is ${sc.appArmorProfile.type}; ` +
        'must be RuntimeDefault or Localhost');
  }
  const se = sc.seLinuxOptions;
  if (se) {
    if (!ALLOWED_SELINUX_TYPES.has(se.type || '')) {
      add('SELinux', `${path}.seLinuxOptions.type ${se.type} is not allowed`);
    }
    if (se.user || se.role) add('SELinux', `${path}.seLinuxOptions.user and role must be unset`);
  }
  return problems;
}

// The container-level controls, and the rules that need pod and container
// together (runAsNonRoot and seccompProfile may be set on either).
function containerProblems(container, where, podSc) {
  const problems = [];
  const add = (rule, message) => problems.push(`${where}: ${rule}: ${message}`);
  const sc = container.securityContext || {};
  if (sc.privileged) add('privileged', 'securityContext.privileged must be unset or false');
  if (sc.windowsOptions && sc.windowsOptions.hostProcess) {
    add('host process', 'securityContext.windowsOptions.hostProcess must be unset or false');
  }
  if (sc.procMount && sc.procMount !== 'Default') {
    add('/proc mount type', `securityContext.procMount is ${sc.procMount}; must be Default`);
  }
  if (sc.allowPrivilegeEscalation !== false) {
    add('privilege escalation', 'securityContext.allowPrivilegeEscalation must be false');
  }
  const caps = sc.capabilities || {};
  if (!(caps.drop || []).includes('ALL')) {
    add('capabilities', 'securityContext.capabilities.drop must include ALL');
  }
  for (const cap of caps.add || []) {
    if (cap !== 'NET_BIND_SERVICE') {
      add('capabilities', `securityContext.capabilities.add may hold only NET_BIND_SERVICE, not ${cap}`);
    }
  }
  if (sc.runAsNonRoot === false) {
    add('running as non-root', 'securityContext.runAsNonRoot must not be false');
  } else if (sc.runAsNonRoot !== true && podSc.runAsNonRoot !== true) {
    add('running as non-root', 'runAsNonRoot must be true in the pod or container securityContext');
  }
  if (!sc.seccompProfile && !(podSc.seccompProfile && podSc.seccompProfile.type)) {
    add('seccomp', 'seccompProfile.type must be RuntimeDefault or Localhost in the pod or ' +
        'container securityContext');
  }
  for (const port of container.ports || []) {
    if (port.hostPort) add('host ports', `port ${port.containerPort} has hostPort ${port.hostPort}`);
  }
  problems.push(...securityContextProblems(sc, where, 'securityContext'));
  // Beyond "restricted".
  if (sc.readOnlyRootFilesystem !== true) {
    add('read-only root filesystem', 'securityContext.readOnlyRootFilesystem must be true');
  }
  return problems;
}

// Pod Security "restricted" and the extra container rules for one pod
// template (its spec and metadata).
function podSecurityProblems(spec, meta) {
  const problems = podLevelProblems(spec, meta);
  const podSc = spec.securityContext || {};
  for (const {container, where} of allContainers(spec)) {
    problems.push(...containerProblems(container, where, podSc));
  }
  if (spec.automountServiceAccountToken !== false) {
    problems.push('pod: service account token: automountServiceAccountToken must be false ' +
        '(pipetrain never calls the Kubernetes API)');
  }
  return problems;
}

// --- Tokens on command lines -------------------------------------------------

const PLACEHOLDER = 'REPLACE-ME';

// The names of the $(NAME) references in `text` that the kubelet expands
// (in command, args and env[].value): "$$" is an escaped "$", and a "$("
// without its ")" is left as it is.
function envReferences(text) {
  const names = [];
  for (let i = 0; i < text.length; i++) {
    if (text[i] !== '$') continue;
    if (text[i + 1] === '$') {
      i++;
    } else if (text[i + 1] === '(') {
      const close = text.indexOf(')', i + 2);
      if (close < 0) break;
      names.push(text.slice(i + 2, close));
      i = close;
    }
  }
  return names;
}

// Names of the environment variables of a container that may hold a
// Secret's value, worked out the way the kubelet builds the environment:
// first envFrom in order (a later source overrides an earlier one), then
// env[] in order, each value expanding $(NAME) from what is defined before
// it; command and args expand from the result.
//
//   - env[].valueFrom.secretKeyRef is a Secret's value;
//   - envFrom secretRef of a Secret rendered in the set: its keys (with the
//     prefix);
//   - envFrom secretRef of a Secret that is not rendered (the usual case:
//     the operator creates Secrets, overlays render none): its keys are
//     unknown, so any name with its prefix that no later source is known to
//     define may come from it: every $(NAME) in command or args that env[]
//     does not define and no rendered ConfigMap (or Secret) of a later
//     envFrom entry holds. A ConfigMap that is not rendered may or may not
//     hold the name, so it does not clear it;
//   - an env[] value that references such a variable ("Bearer $(TOK)")
//     carries the Secret too, and so on down the chain.
//
// The $VAR and ${VAR} a shell expands are checked (tokenInWord) for the
// names found here; a shell reference to a key of a Secret that is not
// rendered cannot be told from the shell's own variables and is not
// guessed at.
function secretEnvNames(container, secrets, configMaps) {
  const sources = (container.envFrom || []).map((from) => {
    const secret = Boolean(from.secretRef);
    const ref = from.secretRef || from.configMapRef || {};
    const data = (secret ? secrets : configMaps).get(ref.name);
    return {secret, prefix: from.prefix || '', keys: data ? new Set(Object.keys(data)) : null};
  });
  // Whether `name`, as envFrom leaves it, may hold a Secret's value: the
  // last source known or suspected to define it decides.
  const fromEnvFrom = (name) => {
    for (const source of [...sources].reverse()) {
      if (!name.startsWith(source.prefix)) continue;
      if (source.keys) {
        if (source.keys.has(name.slice(source.prefix.length))) return source.secret;
      } else if (source.secret) {
        return true;
      }
    }
    return false;
  };
  const defined = new Map();  // env[] name -> may hold a Secret's value
  const isSecret = (name) => (defined.has(name) ? defined.get(name) : fromEnvFrom(name));
  for (const env of container.env || []) {
    if (!env || typeof env.name !== 'string') continue;
    const secret = env.valueFrom ? Boolean(env.valueFrom.secretKeyRef) :
        envReferences(String(env.value === undefined ? '' : env.value)).some(isSecret);
    defined.set(env.name, secret);
  }
  const candidates = new Set(defined.keys());
  for (const source of sources) {
    for (const key of source.keys || []) candidates.add(`${source.prefix}${key}`);
  }
  for (const word of [...(container.command || []), ...(container.args || [])]) {
    for (const name of envReferences(String(word))) candidates.add(name);
  }
  return new Set([...candidates].filter(isSecret));
}

function escapeRegExp(text) {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

// Why `word` (one element of command or args) carries a token, or null.
function tokenInWord(word, secretNames, secretValues) {
  for (const name of secretNames) {
    const n = escapeRegExp(name);
    if (new RegExp(`\\$\\(${n}\\)|\\$\\{${n}\\}|\\$${n}(?![A-Za-z0-9_])`).test(word)) {
      return `passes ${name}, which comes from a Secret`;
    }
  }
  const flag = /(?:^|\s)(--?[A-Za-z0-9-]*(?:token|password|secret))(?:=|\s+[^-\s])/i.exec(word);
  if (flag) return `passes a value with ${flag[1]} (use a -file flag and a mounted Secret)`;
  if (/Bearer\s+[A-Za-z0-9._~+/$-]/.test(word)) return 'passes a literal Bearer token';
  if (word.includes(PLACEHOLDER)) return `holds the placeholder ${PLACEHOLDER}`;
  for (const [id, value] of secretValues) {
    if (word.includes(value)) return `holds the value of ${id}`;
  }
  return null;
}

// "container "x": token on the command line: args[2] passes ..." for each
// word of command and args that carries a token. A flag and its value may
// be two words ("--join-token", "abc"): pairs are checked too.
function tokenProblems(spec, secrets, secretValues, configMaps = new Map()) {
  const problems = [];
  for (const {container, where} of allContainers(spec)) {
    const names = secretEnvNames(container, secrets, configMaps);
    for (const field of ['command', 'args']) {
      const words = container[field] || [];
      words.forEach((word, i) => {
        const next = i + 1 < words.length ? ` ${words[i + 1]}` : '';
        const why = tokenInWord(String(word), names, secretValues) ||
            (next && /^--?[A-Za-z0-9-]*(token|password|secret)$/i.test(word) &&
             tokenInWord(`${word}${next}`, names, secretValues));
        if (why) problems.push(`${where}: token on the command line: ${field}[${i}] ${why}`);
      });
    }
  }
  return problems;
}

// Secrets of the rendered set: name -> {key: value}, and the values
// themselves (at least 4 characters) as [["Secret/name key k", value]].
function collectSecrets(objects) {
  const secrets = new Map();
  const values = [];
  for (const {object} of objects) {
    if (object.kind !== 'Secret' || !object.metadata) continue;
    const data = {};
    for (const [key, value] of Object.entries(object.data || {})) {
      data[key] = Buffer.from(String(value), 'base64').toString('utf8');
    }
    Object.assign(data, object.stringData || {});
    secrets.set(object.metadata.name, data);
    for (const [key, value] of Object.entries(data)) {
      const trimmed = String(value).trim();
      if (trimmed.length >= 4) values.push([`Secret/${object.metadata.name} key ${key}`, trimmed]);
    }
  }
  return {secrets, values};
}

// ConfigMaps of the rendered set: name -> {key: value} (data and binaryData:
// envFrom takes the keys of both).
function collectConfigMaps(objects) {
  const configMaps = new Map();
  for (const {object} of objects) {
    if (object.kind !== 'ConfigMap' || !object.metadata) continue;
    configMaps.set(object.metadata.name, {...(object.binaryData || {}), ...(object.data || {})});
  }
  return configMaps;
}

// A committed Secret must not hold the placeholder (the coordinator refuses it).
function secretProblems(object) {
  const problems = [];
  const data = collectSecrets([{object}]).secrets.get(object.metadata.name) || {};
  for (const [key, value] of Object.entries(data)) {
    if (String(value).includes(PLACEHOLDER)) {
      problems.push(`data.${key}: placeholder token: holds ${PLACEHOLDER}; create the Secret ` +
          'outside the manifests (docs/operations.md)');
    }
  }
  return problems;
}

// --- Labels and selectors ----------------------------------------------------

const INSTANCE = 'app.kubernetes.io/instance';
const NAME = 'app.kubernetes.io/name';
const COMPONENT = 'app.kubernetes.io/component';
// On every object; objects of one component (those with a pod template or a
// selector) carry app.kubernetes.io/component too.
const OBJECT_LABELS = [NAME, INSTANCE, 'app.kubernetes.io/part-of', 'app.kubernetes.io/managed-by',
  'app.kubernetes.io/version'];
const TEMPLATE_LABELS = [NAME, INSTANCE, COMPONENT, 'app.kubernetes.io/part-of'];

// Where the pod template of a workload kind is: object -> {spec, metadata}.
const POD_TEMPLATES = {
  Pod: (o) => o,
  Deployment: (o) => o.spec && o.spec.template,
  StatefulSet: (o) => o.spec && o.spec.template,
  DaemonSet: (o) => o.spec && o.spec.template,
  ReplicaSet: (o) => o.spec && o.spec.template,
  Job: (o) => o.spec && o.spec.template,
  CronJob: (o) => o.spec && o.spec.jobTemplate && o.spec.jobTemplate.spec &&
      o.spec.jobTemplate.spec.template,
};

function missingLabels(labels, required) {
  return required.filter((key) => !(labels && typeof labels[key] === 'string' && labels[key]));
}

// The label selectors of an object, as [{path, matchLabels, pods}] where
// `pods` says whether it selects pods (not Services). Every selector that is
// present is listed, with `matchLabels || {}`: an empty selector
// (`podSelector: {}`, `selector: {}`) picks every pod (or Service) of the
// namespace, and one with matchExpressions only names no label this check
// can compare, so both must show up as lacking the labels rather than be
// skipped. A Service's selector is its map of labels itself.
function selectorsOf(object) {
  const spec = object.spec || {};
  const result = [];
  const isMap = (value) => value !== null && typeof value === 'object' && !Array.isArray(value);
  const push = (path, selector, pods = true) => {
    if (isMap(selector)) result.push({path, matchLabels: selector, pods});
  };
  // A label selector ({matchLabels, matchExpressions}) when it is present.
  const pushLabelSelector = (path, selector, pods = true) => {
    if (!isMap(selector)) return;
    push(`${path}.matchLabels`, isMap(selector.matchLabels) ? selector.matchLabels : {}, pods);
  };
  if (object.kind === 'Service') push('spec.selector', spec.selector);
  if (object.kind in POD_TEMPLATES && object.kind !== 'Pod' && object.kind !== 'CronJob') {
    pushLabelSelector('spec.selector', spec.selector);
  }
  if (object.kind === 'PodDisruptionBudget') pushLabelSelector('spec.selector', spec.selector);
  if (object.kind === 'NetworkPolicy') {
    pushLabelSelector('spec.podSelector', spec.podSelector);
    // Peers in this namespace: a podSelector without a namespaceSelector.
    // A peer with a namespaceSelector picks pods of other namespaces (the
    // manifests let Prometheus in from the namespace "monitoring" that way),
    // which are not pipetrain's pods and carry no labels of this install, so
    // neither it nor a podSelector beside it (another app's pods there) is
    // held to these labels. ipBlock peers have no selector.
    for (const [direction, peers] of [['ingress', 'from'], ['egress', 'to']]) {
      (spec[direction] || []).forEach((rule, i) => (rule[peers] || []).forEach((peer, j) => {
        if (peer && !peer.namespaceSelector && peer.podSelector) {
          pushLabelSelector(`spec.${direction}[${i}].${peers}[${j}].podSelector`, peer.podSelector);
        }
      }));
    }
  }
  if (object.kind === 'ServiceMonitor') pushLabelSelector('spec.selector', spec.selector, false);
  return result;
}

function matches(matchLabels, labels) {
  return Object.entries(matchLabels).every(([k, v]) => labels && labels[k] === v);
}

// Labels on every object and pod template; name, instance and component in
// every selector (docs/operations.md, "Labels": without the component a
// selector would pick the coordinator's and the workers' pods alike); no
// selector picks another install's pods or Services, nor those of two
// objects with one component (two installs with one instance label); every
// workload's selector picks its own pod template.
function labelProblems(objects) {
  const problems = [];
  const templates = [];  // {owner, labels}
  const services = [];
  for (const entry of objects) {
    const {object} = entry;
    const template = POD_TEMPLATES[object.kind] && POD_TEMPLATES[object.kind](object);
    const required = template || selectorsOf(object).length > 0 ?
        [...OBJECT_LABELS, COMPONENT] : OBJECT_LABELS;
    const missing = missingLabels(object.metadata && object.metadata.labels, required);
    if (missing.length > 0) {
      problems.push({entry, message: `metadata.labels: labels: missing ${missing.join(', ')}`});
    }
    if (template && object.kind !== 'Pod') {
      const lacking = missingLabels(template.metadata && template.metadata.labels, TEMPLATE_LABELS);
      if (lacking.length > 0) {
        problems.push({entry, message: `pod template: labels: missing ${lacking.join(', ')}`});
      }
    }
    if (template) templates.push({owner: entry, labels: (template.metadata || {}).labels || {}});
    if (object.kind === 'Service') services.push({owner: entry, labels: object.metadata.labels || {}});
  }
  for (const entry of objects) {
    const {object} = entry;
    const instance = object.metadata && object.metadata.labels && object.metadata.labels[INSTANCE];
    for (const {path, matchLabels, pods} of selectorsOf(object)) {
      const lacking = [NAME, INSTANCE, COMPONENT].filter((key) => !(key in matchLabels));
      if (lacking.length > 0) {
        const what = pods ? 'pods' : 'Services';
        const also = lacking.some((key) => key !== COMPONENT) ?
            `the ${what} of a second install in the namespace` : `the ${what} of other components`;
        problems.push({entry, message: `${path}: selector: lacks ${lacking.join(', ')}, so ` +
            `it would also pick ${also}`});
        continue;
      }
      const byComponent = new Map();  // component -> owners picked
      for (const target of pods ? templates : services) {
        if (!matches(matchLabels, target.labels)) continue;
        const other = target.labels[INSTANCE];
        if (other !== instance) {
          problems.push({entry, message: `${path}: selector: also picks ` +
              `${objectId(target.owner.object)} of instance ${other}`});
        }
        const component = target.labels[COMPONENT];
        byComponent.set(component, [...(byComponent.get(component) || []), target.owner]);
      }
      for (const [component, owners] of byComponent) {
        if (owners.length > 1) {
          problems.push({entry, message: `${path}: selector: picks the ${component} pods of ` +
              `${owners.map((o) => `${objectId(o.object)} (${o.where})`).join(' and ')}`});
        }
      }
    }
    const template = POD_TEMPLATES[object.kind] && object.kind !== 'Pod' &&
        POD_TEMPLATES[object.kind](object);
    const own = object.spec && object.spec.selector && object.spec.selector.matchLabels;
    if (template && own && !matches(own, (template.metadata || {}).labels)) {
      problems.push({entry, message: 'spec.selector: selector: does not pick its own pod template'});
    }
  }
  return problems;
}

// Two objects of one kind, namespace and name: the second install would
// overwrite the first's.
function duplicateProblems(objects) {
  const seen = new Map();
  const problems = [];
  for (const entry of objects) {
    const meta = entry.object.metadata || {};
    const key = `${entry.object.kind}/${meta.namespace || ''}/${meta.name}`;
    if (seen.has(key)) {
      problems.push({entry, message: `metadata.name: names: collides with ${seen.get(key).where}`});
    } else {
      seen.set(key, entry);
    }
  }
  return problems;
}

// --- The whole set -----------------------------------------------------------

// Every violation of the set of parsed objects, as [{entry, message}], and
// the number of pod templates checked.
function checkAll(objects) {
  const {secrets, values} = collectSecrets(objects);
  const configMaps = collectConfigMaps(objects);
  const problems = [];
  let podTemplates = 0;
  for (const entry of objects) {
    const {object} = entry;
    const template = POD_TEMPLATES[object.kind] && POD_TEMPLATES[object.kind](object);
    if (template) {
      podTemplates++;
      const spec = template.spec || {};
      for (const message of [...podSecurityProblems(spec, template.metadata),
        ...tokenProblems(spec, secrets, values, configMaps)]) {
        problems.push({entry, message});
      }
    }
    if (object.kind === 'Secret') {
      for (const message of secretProblems(object)) problems.push({entry, message});
    }
  }
  problems.push(...labelProblems(objects), ...duplicateProblems(objects));
  return {problems, podTemplates};
}

function main() {
  const {modules, files} = parseArgs(PROGRAM, USAGE, process.argv.slice(2));
  const YAML = requireFrom(PROGRAM, modules, 'yaml');
  const objects = [];
  let yamlErrors = 0;
  for (const file of files) {
    for (const entry of readDocuments(PROGRAM, USAGE, YAML, file)) {
      if (entry.yamlErrors) {
        yamlErrors++;
        console.log(`INVALID YAML (${entry.where}): ${entry.yamlErrors.join('; ')}`);
      } else if (entry.object && typeof entry.object === 'object' && entry.object.kind) {
        objects.push(entry);
      }
    }
  }
  const {problems, podTemplates} = checkAll(objects);
  for (const {entry, message} of problems) {
    console.log(`VIOLATION ${objectId(entry.object)} (${entry.where}): ${message}`);
  }
  console.log(`${objects.length} objects, ${podTemplates} pod templates, ` +
      `${problems.length} violations`);
  process.exit(problems.length === 0 && yamlErrors === 0 && podTemplates > 0 ? 0 : 1);
}

if (require.main === module) main();

module.exports = {checkAll, podSecurityProblems, tokenProblems};
