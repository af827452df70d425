// Reading Kubernetes manifests for the checks in this directory
// (validate_manifests.js, check_policy.js): loading their npm packages from
// tools/k8s-validate/node_modules and splitting YAML files into objects.
'use strict';

const fs = require('fs');
const path = require('path');

// tools/k8s-validate/node_modules of the repository holding this script.
// __dirname is the script's real directory (node resolves the symlinks of
// modules), also when it runs from Bazel runfiles.
function defaultModules() {
  return path.resolve(__dirname, '..', '..', 'tools', 'k8s-validate', 'node_modules');
}

// Prints `message` and the usage line, exits 2.
function usageExit(program, usage, message) {
  process.stderr.write(`${program}: ${message}\nusage: ${usage}\n`);
  process.exit(2);
}

// Loads a package from `modules`; a missing install is a setup problem, not
// an invalid manifest, so it exits 2 saying how to fix it.
function requireFrom(program, modules, name) {
  try {
    return require(require.resolve(name, {paths: [modules]}));
  } catch (e) {
    process.stderr.write(
        `${program}: cannot load npm package "${name}" from ${modules} ` +
        `(${e.code || e.message}); run scripts/setup.sh, which runs ` +
        '`npm ci` in tools/k8s-validate\n');
    process.exit(2);
  }
}

// "[--modules DIR] FILE..." -> {modules, files}; exits 2 on a usage error.
function parseArgs(program, usage, argv) {
  let modules = defaultModules();
  const files = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--modules') {
      if (i + 1 >= argv.length) usageExit(program, usage, '--modules needs a directory');
      modules = path.resolve(argv[++i]);
    } else {
      files.push(argv[i]);
    }
  }
  if (files.length === 0) usageExit(program, usage, 'no manifest files given');
  return {modules, files};
}

// The YAML documents of `file` ("-": stdin) as a list of
// {where: "FILE, document N", object} or {where, yamlErrors}; empty documents
// are left out. Exits 2 when the file cannot be read.
function readDocuments(program, usage, YAML, file) {
  let text;
  try {
    text = fs.readFileSync(file === '-' ? 0 : file, 'utf8');
  } catch (e) {
    usageExit(program, usage, `cannot read ${file}: ${e.message}`);
  }
  const result = [];
  YAML.parseAllDocuments(text).forEach((doc, index) => {
    const where = `${file === '-' ? 'stdin' : file}, document ${index + 1}`;
    if (doc.errors.length > 0) {
      result.push({where, yamlErrors: doc.errors.map((e) => e.message.split('\n')[0])});
      return;
    }
    const object = doc.toJS();
    if (object !== null && object !== undefined) result.push({where, object});
  });
  return result;
}

// "Kind/name" of a parsed object, for messages.
function objectId(object) {
  const name = object && object.metadata && object.metadata.name;
  return `${object && object.kind}/${name === undefined ? '(no name)' : name}`;
}

module.exports = {parseArgs, readDocuments, requireFrom, objectId};
