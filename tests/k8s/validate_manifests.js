#!/usr/bin/env node
// Validates Kubernetes manifests against the Kubernetes OpenAPI schemas
// (npm package kubernetes-models; the Prometheus Operator kinds with
// @kubernetes-models/prometheus-operator), e.g. the output of
// `kubectl kustomize`.
//
//   node validate_manifests.js [--modules DIR] FILE...   (FILE "-" = stdin)
//
// Each FILE may hold several YAML documents. Every object is built with the
// model class of its apiVersion and kind, and validated; a field its schema
// does not list (a misspelling such as spec.replica) is reported too.
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

// --- Unknown fields ------------------------------------------------------------
//
// The generated validators accept properties their schema does not list
// (Kubernetes schemas do not say additionalProperties: false), so a
// misspelled field (`spec.replica: 3`, `containers[0].resource`) passes them,
// and the API server would drop it or refuse it (kubectl apply's strict field
// validation). kubernetes-models ships its schemas only as compiled ajv code
// (_schemas/*.js), not as JSON, so the property lists are read from that code
// as it runs: for every object it validates, a generated validator reads
// each property its schema lists (`data.replicas === undefined`, also when
// absent) and enumerates the keys (`for (key in data)`) only of maps
// (additionalProperties: labels, data, resources.limits, ...). Validating
// through Proxies that record those reads gives, for each object of the
// manifest, the properties its schema lists; every other key is unknown.
// An object whose schema says nothing about it (free-form, e.g.
// x-kubernetes-preserve-unknown-fields) is neither read nor enumerated and
// is not judged.

// What the validator did with each object: object -> {read: Set, enumerated}.
function traceAccess(root) {
  const access = new WeakMap();
  const proxies = new WeakMap();
  const record = (target) => {
    if (!access.has(target)) access.set(target, {read: new Set(), enumerated: false});
    return access.get(target);
  };
  const wrap = (value) => {
    if (value === null || typeof value !== 'object') return value;
    if (!proxies.has(value)) {
      proxies.set(value, new Proxy(value, {
        get(target, key, receiver) {
          if (typeof key === 'string' && !Array.isArray(target)) record(target).read.add(key);
          return wrap(Reflect.get(target, key, receiver));
        },
        has(target, key) {
          if (typeof key === 'string' && !Array.isArray(target)) record(target).read.add(key);
          return Reflect.has(target, key);
        },
        ownKeys(target) {
          record(target).enumerated = true;
          return Reflect.ownKeys(target);
        },
      }));
    }
    return proxies.get(value);
  };
  return {proxy: wrap(root), access};
}

// "/json/pointer: unknown field" for every key of `object` (a plain copy of
// the manifest) that the traced validation did not read where it walked.
function unknownFields(object, access, path = '') {
  if (object === null || typeof object !== 'object') return [];
  if (Array.isArray(object)) {
    return object.flatMap((item, i) => unknownFields(item, access, `${path}/${i}`));
  }
  const seen = access.get(object);
  const problems = [];
  for (const [key, value] of Object.entries(object)) {
    const where = `${path}/${key.replace(/~/g, '~0').replace(/\//g, '~1')}`;
    // Judged only where the schema lists properties (something was read)
    // and is not a map (its keys were not enumerated).
    if (seen && !seen.enumerated && seen.read.size > 0 && !seen.read.has(key)) {
      problems.push(`${where}: unknown field (not in the schema)`);
      continue;  // nothing below an unknown field has a schema
    }
    problems.push(...unknownFields(value, access, where));
  }
  return problems;
}

// Unknown fields of `object` against the schema of Model.
function strictProblems(Model, object) {
  const copy = JSON.parse(JSON.stringify(object));  // YAML aliases: one node per place
  const {proxy, access} = traceAccess(copy);
  try {
    // Model.prototype.validate runs the schema's validator on `this`; called
    // on the proxy (new Model() would copy the data out of it). Its errors
    // were reported by checkObject already.
    Model.prototype.validate.call(proxy);
  } catch (e) {
    // Type errors: reported by checkObject.
  }
  return unknownFields(copy, access);
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
  const problems = [];
  try {
    new Model(object).validate();
  } catch (e) {
    problems.push(describe(e));
  }
  problems.push(...strictProblems(Model, object));
  return problems;
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
