#!/usr/bin/env node
// Validates Kubernetes manifests against the Kubernetes OpenAPI schemas
// (npm package kubernetes-models), e.g. the output of `kubectl kustomize`.
//
//   node validate_manifests.js [--modules DIR] FILE...   (FILE "-" = stdin)
//
// Each FILE may hold several YAML documents. Every object is built with the
// kubernetes-models class of its apiVersion and kind, and validated.
// --modules: the node_modules holding kubernetes-models and yaml (default:
// tools/k8s-validate/node_modules of the repository holding this script;
// scripts/setup.sh installs it with npm ci).
//
// Prints one line per invalid object, "INVALID Kind/name (FILE, document N):
// /json/path message; ...", then a summary line. Exit codes: 0 all objects
// valid, 1 some object invalid (or a YAML error, or an apiVersion/kind
// kubernetes-models does not know), 2 usage error or missing node_modules.
'use strict';

const fs = require('fs');
const path = require('path');

function usage(message) {
  process.stderr.write(`validate_manifests: ${message}\n` +
      'usage: node validate_manifests.js [--modules DIR] FILE...\n');
  process.exit(2);
}

function parseArgs(argv) {
  // __dirname is the script's real directory (node resolves the symlinks of
  // the main module), also when it runs from Bazel runfiles.
  let modules = path.resolve(__dirname, '..', '..', 'tools', 'k8s-validate', 'node_modules');
  const files = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--modules') {
      if (i + 1 >= argv.length) usage('--modules needs a directory');
      modules = path.resolve(argv[++i]);
    } else {
      files.push(argv[i]);
    }
  }
  if (files.length === 0) usage('no manifest files given');
  return {modules, files};
}

// Loads a package from `modules`; a missing install is a setup problem, not
// an invalid manifest, so it exits 2 saying how to fix it.
function requireFrom(modules, name) {
  try {
    return require(require.resolve(name, {paths: [modules]}));
  } catch (e) {
    process.stderr.write(
        `validate_manifests: cannot load npm package "${name}" from ${modules} ` +
        `(${e.code || e.message}); run scripts/setup.sh, which runs ` +
        '`npm ci` in tools/k8s-validate\n');
    process.exit(2);
  }
}

// "apps/v1" -> kubernetes-models/apps/v1, "v1" -> kubernetes-models/v1.
// Returns the model class, or null when kubernetes-models has none.
function modelClass(modules, apiVersion, kind) {
  if (typeof apiVersion !== 'string' || !/^[a-z0-9.-]+(\/[a-z0-9]+)?$/.test(apiVersion)) {
    return null;
  }
  let group;
  try {
    group = require(require.resolve(`kubernetes-models/${apiVersion}`, {paths: [modules]}));
  } catch (e) {
    return null;
  }
  return typeof kind === 'string' && typeof group[kind] === 'function' ? group[kind] : null;
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
            'in kubernetes-models'];
  }
  try {
    new Model(object).validate();
    return [];
  } catch (e) {
    return [describe(e)];
  }
}

function readInput(file) {
  try {
    return fs.readFileSync(file === '-' ? 0 : file, 'utf8');
  } catch (e) {
    usage(`cannot read ${file}: ${e.message}`);
  }
}

function main() {
  const {modules, files} = parseArgs(process.argv.slice(2));
  const YAML = requireFrom(modules, 'yaml');
  requireFrom(modules, 'kubernetes-models');
  const kinds = new Map();
  let total = 0;
  let invalid = 0;
  for (const file of files) {
    const documents = YAML.parseAllDocuments(readInput(file));
    documents.forEach((doc, index) => {
      const where = `${file === '-' ? 'stdin' : file}, document ${index + 1}`;
      if (doc.errors.length > 0) {
        invalid++;
        const messages = doc.errors.map((e) => e.message.split('\n')[0]);
        console.log(`INVALID YAML (${where}): ${messages.join('; ')}`);
        return;
      }
      const object = doc.toJS();
      if (object === null || object === undefined) return;  // empty document
      total++;
      const name = object && object.metadata && object.metadata.name;
      const id = `${object && object.kind}/${name === undefined ? '(no name)' : name}`;
      const problems = checkObject(modules, object);
      if (problems.length > 0) {
        invalid++;
        console.log(`INVALID ${id} (${where}): ${problems.join('; ')}`);
      } else {
        kinds.set(object.kind, (kinds.get(object.kind) || 0) + 1);
      }
    });
  }
  const counts = [...kinds.entries()].sort().map(([k, n]) => `${k} ${n}`).join(', ');
  console.log(`${total} objects, ${invalid} invalid` + (counts ? `; valid: ${counts}` : ''));
  process.exit(invalid === 0 && total > 0 ? 0 : 1);
}

main();
