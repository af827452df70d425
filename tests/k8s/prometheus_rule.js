#!/usr/bin/env node
// The PrometheusRule of deploy/k8s/components/prometheus-operator-alerts is
// the alert rules of deploy/prometheus/alerts.yml wrapped in the Prometheus
// Operator's CRD. kustomize cannot read a file outside the component's
// directory, so the component keeps a generated copy; this program writes
// it, or checks that it still carries exactly the groups of alerts.yml.
//
//   node tests/k8s/prometheus_rule.js --write   after editing alerts.yml
//   node tests/k8s/prometheus_rule.js --check   (//tests/k8s:manifests_test)
//
// Options: --alerts FILE, --rule FILE (default: those of the repository
// holding this script), --modules DIR (the node_modules holding yaml).
// Exit codes: 0 written or identical, 1 the copy differs from alerts.yml,
// 2 usage error or missing node_modules.
'use strict';

const fs = require('fs');
const path = require('path');
const util = require('util');
const {requireFrom} = require('./manifest_files');

const PROGRAM = 'prometheus_rule';
const ROOT = path.resolve(__dirname, '..', '..');
const HEADER = `# GENERATED from deploy/prometheus/alerts.yml by
#   node tests/k8s/prometheus_rule.js --write
# Do not edit: edit alerts.yml and regenerate (//tests/k8s:manifests_test
# fails while the two differ). Your Prometheus selects rules by label
# (ruleSelector); add the label it expects in your overlay.
`;

function usage(message) {
  process.stderr.write(`${PROGRAM}: ${message}\nusage: node prometheus_rule.js ` +
      '--write|--check [--alerts FILE] [--rule FILE] [--modules DIR]\n');
  process.exit(2);
}

function parseArgs(argv) {
  const options = {
    mode: null,
    alerts: path.join(ROOT, 'deploy', 'prometheus', 'alerts.yml'),
    rule: path.join(ROOT, 'deploy', 'k8s', 'components', 'prometheus-operator-alerts',
        'prometheusrule.yaml'),
    modules: path.join(ROOT, 'tools', 'k8s-validate', 'node_modules'),
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--write' || arg === '--check') {
      options.mode = arg.slice(2);
    } else if (['--alerts', '--rule', '--modules'].includes(arg)) {
      if (i + 1 >= argv.length) usage(`${arg} needs a value`);
      options[arg.slice(2)] = path.resolve(argv[++i]);
    } else {
      usage(`unknown argument ${arg}`);
    }
  }
  if (options.mode === null) usage('give --write or --check');
  return options;
}

function readYaml(YAML, file) {
  try {
    return YAML.parse(fs.readFileSync(file, 'utf8'));
  } catch (e) {
    process.stderr.write(`${PROGRAM}: cannot read ${file}: ${e.message.split('\n')[0]}\n`);
    process.exit(1);
  }
}

// The PrometheusRule object for the groups of alerts.yml.
function ruleObject(groups) {
  return {
    apiVersion: 'monitoring.coreos.com/v1',
    kind: 'PrometheusRule',
    metadata: {name: 'pipetrain', labels: {'app.kubernetes.io/component': 'alerts'}},
    spec: {groups},
  };
}

// The first difference between two group lists, e.g. 'group "pipetrain" rule
// 3 (PipetrainJobStalled): differs', or null when they are equal.
function firstDifference(want, got) {
  if (!Array.isArray(got)) return 'spec.groups is missing';
  for (let g = 0; g < Math.max(want.length, got.length); g++) {
    const w = want[g] || {};
    const o = got[g] || {};
    const where = `group ${g + 1} ("${w.name || o.name}")`;
    if (!want[g] || !got[g]) return `${where} is only in ${want[g] ? 'alerts.yml' : 'the copy'}`;
    const wRules = w.rules || [];
    const oRules = o.rules || [];
    for (let r = 0; r < Math.max(wRules.length, oRules.length); r++) {
      if (!util.isDeepStrictEqual(wRules[r], oRules[r])) {
        const name = (wRules[r] || oRules[r]).alert || (wRules[r] || oRules[r]).record;
        return `${where} rule ${r + 1} (${name}) differs`;
      }
    }
    if (!util.isDeepStrictEqual(w, o)) return `${where} differs outside its rules`;
  }
  return null;
}

function main() {
  const options = parseArgs(process.argv.slice(2));
  const YAML = requireFrom(PROGRAM, options.modules, 'yaml');
  const alerts = readYaml(YAML, options.alerts);
  const groups = alerts && alerts.groups;
  if (!Array.isArray(groups)) {
    process.stderr.write(`${PROGRAM}: ${options.alerts} has no groups list\n`);
    process.exit(1);
  }
  if (options.mode === 'write') {
    const text = HEADER + YAML.stringify(ruleObject(groups), {lineWidth: 0});
    fs.writeFileSync(options.rule, text);
    console.log(`wrote ${options.rule}: ${groups.length} groups, ` +
        `${groups.reduce((n, g) => n + (g.rules || []).length, 0)} rules`);
    return;
  }
  const rule = readYaml(YAML, options.rule);
  const problem = rule && rule.kind === 'PrometheusRule' ?
      firstDifference(groups, rule.spec && rule.spec.groups) : 'it is not a PrometheusRule';
  if (problem) {
    console.log(`DIFFERS: ${options.rule} is not the rules of ${options.alerts}: ${problem}; ` +
        'regenerate it with: node tests/k8s/prometheus_rule.js --write');
    process.exit(1);
  }
  console.log(`identical: ${groups.length} groups, ` +
      `${groups.reduce((n, g) => n + (g.rules || []).length, 0)} rules`);
}

main();
