#!/usr/bin/env node
// Validates Kubernetes manifests against the Kubernetes OpenAPI schemas
// (npm package kubernetes-models; the Prometheus Operator kinds with
// @kubernetes-models/prometheus-operator), e.g. the output of
// `kubectl kustomize`.
//
//   node validate_manifests.js [--modules DIR] FILE...   (FILE "-" = stdin)
//
// Each FILE may hold several YAML documents. Every object is built with the
// model class of its apiVersion and kind, and validated.
// --modules: the node_modules holding those packages and yaml (default:
// tools/k8s-validate/node_modules of the repository holding this script;
// scripts/setup.sh installs it with npm ci).
//
// Prints one line per invalid object, "INVALID Kind/name (FILE, document N):
// /json/path message; ...", then a summary line. Exit codes: 0 all objects
// valid, 1 some object invalid (or a YAML error, or an apiVersion/kind no
// model package knows), 2 usage error or missing node_modules.
'use strict';

const {parseArgs, readDocuments, requireFrom, objectId} = require('./manifest_files');

const PROGRAM = 'validate_manifests';
const USAGE = 'node validate_manifests.js [--modules DIR] FILE...';

// Model packages for apiVersion groups kubernetes-models does not cover.
const CRD_PACKAGES = {
  'monitoring.coreos.com': '@kubernetes-models/prometheus-operator',
};

// "apps/v1" -> kubernetes-models/apps/v1, "v1" -> kubernetes-models/v1,
// "monitoring.coreos.com/v1" -> @kubernetes-models/prometheus-operator/...
// Returns the model class, or null when no package has one.
function modelClass(modules, apiVersion, kind) {
  if (typeof apiVersion !== 'string' || !/^[a-z0-9.-]+(\/[a-z0-9]+)?$/.test(apiVersion)) {
    return null;
  }
  const group = apiVersion.includes('/') ? apiVersion.split('/')[0] : '';
  const modelPackage = CRD_PACKAGES[group] || 'kubernetes-models';
  let models;
  try {
    models = require(require.resolve(`${modelPackage}/${apiVersion}`, {paths: [modules]}));
  } catch (e) {
    return null;
  }
  return typeof kind === 'string' && typeof models[kind] === 'function' ? models[kind] : null;
}

// The validation error as "/path message" items (ajv errors when present).
function describe(error) {
  if (Array.isArray(error.errors) && error.errors.length > 0) {
    return error.errors.map((e) => {
      const where = e.instancePath || '/';
      const missing = e.params && e.params.missingProperty;
      return missing ? `${where}: must have required property "${missing}"`
                     : `${where}: ${e.message}`;
    }).join('; ');
  }
  return String(error.message || error);
}

// Problems of one parsed object; an empty list when it is valid.
function checkObject(modules, object) {
  if (object === null || typeof object !== 'object' || Array.isArray(object)) {
    return ['not a Kubernetes object (expected a mapping with apiVersion and kind)'];
  }
  const Model = modelClass(modules, object.apiVersion, object.kind);
  if (Model === null) {
    return [`no schema for apiVersion "${object.apiVersion}" kind "${object.kind}" ` +
            'in kubernetes-models or @kubernetes-models/prometheus-operator'];
  }
  try {
    new Model(object).validate();
    return [];
  } catch (e) {
    return [describe(e)];
  }
}

function main() {
  const {modules, files} = parseArgs(PROGRAM, USAGE, process.argv.slice(2));
  const YAML = requireFrom(PROGRAM, modules, 'yaml');
  requireFrom(PROGRAM, modules, 'kubernetes-models');
  requireFrom(PROGRAM, modules, '@kubernetes-models/prometheus-operator');
  const kinds = new Map();
  let total = 0;
  let invalid = 0;
  for (const file of files) {
    for (const {where, object, yamlErrors} of readDocuments(PROGRAM, USAGE, YAML, file)) {
      if (yamlErrors) {
        invalid++;
        console.log(`INVALID YAML (${where}): ${yamlErrors.join('; ')}`);
        continue;
      }
      total++;
      const problems = checkObject(modules, object);
      if (problems.length > 0) {
        invalid++;
        console.log(`INVALID ${objectId(object)} (${where}): ${problems.join('; ')}`);
      } else {
        kinds.set(object.kind, (kinds.get(object.kind) || 0) + 1);
      }
    }
  }
  const counts = [...kinds.entries()].sort().map(([k, n]) => `${k} ${n}`).join(', ');
  console.log(`${total} objects, ${invalid} invalid` + (counts ? `; valid: ${counts}` : ''));
  process.exit(invalid === 0 && total > 0 ? 0 : 1);
}

main();
