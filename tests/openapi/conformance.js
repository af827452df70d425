#!/usr/bin/env node
// docs/openapi.yaml against a running coordinator (and one worker): every
// documented path, method and response status is exercised, each request
// and response is validated against the document's schemas (openapi-backend,
// which also checks the document itself), and the documented examples are
// sent. Response schemas are read strictly: an object may carry only the
// properties the document lists, so a field the server renames (or adds)
// is a failure.
//
// Then it shows that the check can fail: (1) a recorded Job response with
// "state" renamed to "status" (as a server that renamed the field would
// send) is rejected, and (2) the same recordings checked against a copy of
// the document in which Job.state is renamed are rejected.
//
//   node conformance.js --modules DIR --spec FILE --coordinator BIN --worker BIN --tmp DIR
//
// Exit codes: 0 conformant (and both mutations rejected), 1 a violation,
// 2 usage error or missing node_modules.
'use strict';

const childProcess = require('child_process');
const fs = require('fs');
const path = require('path');

function usage(message) {
  console.error(`conformance.js: ${message}`);
  process.exit(2);
}

const args = {};
for (let i = 2; i < process.argv.length; i += 2) {
  if (!process.argv[i].startsWith('--') || i + 1 >= process.argv.length) usage('bad arguments');
  args[process.argv[i].slice(2)] = process.argv[i + 1];
}
for (const name of ['modules', 'spec', 'coordinator', 'worker', 'tmp']) {
  if (!args[name]) usage(`--${name} is required`);
}
let OpenAPIBackend, YAML, addFormats;
try {
  ({ OpenAPIBackend } = require(path.resolve(args.modules, 'openapi-backend')));
  YAML = require(path.resolve(args.modules, 'yaml'));
  addFormats = require(path.resolve(args.modules, 'ajv-formats'));
} catch (e) {
  usage(`cannot load openapi-backend and yaml from ${args.modules} (run scripts/setup.sh): ${e.message}`);
}

const TOKEN = 'conformance-user-token';
const failures = [];
function fail(message) {
  failures.push(message);
  console.log(`FAIL ${message}`);
}

// ---- the document, strict -------------------------------------------------

function strict(node) {
  if (Array.isArray(node)) return node.forEach(strict);
  if (node === null || typeof node !== 'object') return;
  if (node.type === 'object' && node.properties && !('additionalProperties' in node)) {
    node.additionalProperties = false;
  }
  Object.values(node).forEach(strict);
}

async function backendFor(document) {
  const definition = JSON.parse(JSON.stringify(document));
  strict(definition);
  const api = new OpenAPIBackend({
    definition,
    strict: true,
    validate: true,
    quick: false,
    customizeAjv: (ajv) => {
      addFormats(ajv);  // date-time, int32, int64, float, double, ...
      ajv.addFormat('uint64', /^[0-9]+$/);
      return ajv;
    },
  });
  await api.init();
  return api;
}

// ---- processes ------------------------------------------------------------

const children = [];
process.on('exit', () => children.forEach((c) => { try { c.kill('SIGKILL'); } catch (e) {} }));

async function until(what, timeoutMs, probe) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));  // polling a remote state
  }
}

// Runs `fn` while another process (the sqlite3 shell) holds the write lock
// of the coordinator's state database, so its saves fail (busy) as with a
// store that cannot commit; the lock goes when `fn` is done. The shell waits
// its turn (.timeout) while the coordinator itself writes, and stops at an
// error (-bail) so that the flag means the lock is held.
async function whileStateLocked(fn) {
  const flag = path.join(args.tmp, 'state.locked');
  fs.rmSync(flag, { force: true });  // a former call's would pass for this one's lock
  const shell = childProcess.spawn('sqlite3',
                                   ['-bail', path.join(args.tmp, 'state', 'coordinator.db')],
                                   { stdio: ['pipe', 'ignore', 'inherit'] });
  children.push(shell);  // killed at exit if it never got the lock
  let shellExit = null;
  const exited = new Promise((resolve) => shell.on('exit', (code) => {
    shellExit = code;
    resolve(code);
  }));
  shell.stdin.write(`.timeout 30000\nBEGIN EXCLUSIVE;\n.shell touch ${flag}\n`);
  await until('the state database to be locked', 40000, async () => {
    if (fs.existsSync(flag)) return true;
    if (shellExit !== null) throw new Error(`sqlite3 could not lock the state database (exit ${shellExit})`);
    return false;
  });
  try {
    return await fn();
  } finally {
    shell.stdin.end('COMMIT;\n');
    await exited;
  }
}

function spawn(binary, argv, log) {
  const out = fs.openSync(log, 'w');
  const child = childProcess.spawn(binary, argv, { stdio: ['ignore', out, out] });
  children.push(child);
  return child;
}

function readPorts(file) {
  try { return JSON.parse(fs.readFileSync(file, 'utf8')); } catch (e) { return null; }
}

// ---- calls, recorded ------------------------------------------------------

let base = '';
const recordings = [];  // {request, status, headers, body, json}

async function call(method, url, { body, token = TOKEN, expect } = {}) {
  const headers = {};
  if (token) headers.authorization = `Bearer ${token}`;
  if (body !== undefined) headers['content-type'] = 'application/json';
  const response = await fetch(base + url, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  const parsed = new URL(base + url);
  const query = Object.fromEntries(parsed.searchParams.entries());
  const record = {
    request: { method: method.toLowerCase(), path: parsed.pathname, query, headers, body },
    status: response.status,
    headers: Object.fromEntries(response.headers.entries()),
    text,
  };
  try { record.json = JSON.parse(text); } catch (e) { record.json = undefined; }
  recordings.push(record);
  if (expect !== undefined && response.status !== expect) {
    fail(`${method} ${url}: status ${response.status}, expected ${expect}: ${text.slice(0, 300)}`);
  }
  return record;
}

// ---- the scenario ---------------------------------------------------------

function specExamples(document) {
  const examples = [];
  const op = document.paths['/v1/jobs'].post;
  const media = op.requestBody.content['application/json'];
  if (media.example) examples.push(media.example);
  for (const e of Object.values(media.examples || {})) examples.push(e.value);
  if (document.components.schemas.JobSpec.example) {
    examples.push(document.components.schemas.JobSpec.example);
  }
  return examples;
}

async function scenario(document, coordinator, workerId) {
  // Probes and metrics need no token.
  await call('GET', '/healthz', { token: '', expect: 200 });
  await call('GET', '/readyz', { token: '', expect: 200 });
  await call('GET', '/metrics', { token: '', expect: 200 });

  // Every operation without the token: 401.
  for (const [p, item] of Object.entries(document.paths)) {
    for (const method of ['get', 'post']) {
      const op = item[method];
      if (!op || (op.security && op.security.length === 0)) continue;
      const url = p.replace('{id}', p.includes('workers') ? workerId : 'job-none');
      await call(method.toUpperCase(), url, { token: '', body: method === 'post' ? {} : undefined,
                                             expect: 401 });
    }
  }

  // The documented examples are accepted as they stand.
  const examples = specExamples(document);
  if (examples.length === 0) fail('docs/openapi.yaml has no JobSpec example to run');
  let exampleJob = null;
  for (const example of examples) {
    const r = await call('POST', '/v1/jobs', { body: example, expect: 200 });
    if (r.status === 200) exampleJob = exampleJob || r.json.id;
  }
  await call('POST', '/v1/jobs', { body: { model: { nLayer: 2 } }, expect: 400 });
  // Over the planning budget (64 Bi-Partition stages of 194 units): 429.
  await call('POST', '/v1/jobs', { expect: 429, body: {
    model: { nLayer: 96, nHead: 1, dModel: 8 }, training: { seqLen: 4, batchSize: 64, steps: '1' },
    parallelism: { stages: 64, solver: 'bipartition' } } });
  // One the state store cannot record: 503, and nothing submitted.
  const before = (await call('GET', '/v1/jobs?pageSize=1000', { expect: 200 })).json.jobs.length;
  await whileStateLocked(() => call('POST', '/v1/jobs', { expect: 503, body: {
    name: 'unrecorded', model: { nLayer: 1, nHead: 1, dModel: 8 },
    training: { seqLen: 4, batchSize: 1, steps: '1' }, parallelism: { stages: 1 } } }));
  const after = (await call('GET', '/v1/jobs?pageSize=1000', { expect: 200 })).json.jobs.length;
  if (after !== before) fail(`a submit answered 503 left a job behind (${before} jobs, then ${after})`);

  // A repeated requestId: the same job; with another spec, 409; malformed, 400.
  const retried = { name: 'retried', model: { nLayer: 2, nHead: 2, dModel: 16 },
    training: { seqLen: 8, batchSize: 4, steps: '10' }, parallelism: { stages: 2 } };
  const once = await call('POST', '/v1/jobs?requestId=conformance-1', { expect: 200, body: retried });
  const twice = await call('POST', '/v1/jobs?requestId=conformance-1', { expect: 200, body: retried });
  if (once.json && twice.json && once.json.id !== twice.json.id) {
    fail(`a repeated requestId made a second job: ${once.json.id}, then ${twice.json.id}`);
  }
  await call('POST', '/v1/jobs?requestId=conformance-1', { expect: 409,
    body: { ...retried, name: 'another' } });
  await call('POST', '/v1/jobs?requestId=not%2Fallowed', { expect: 400, body: retried });
  if (once.json) await call('POST', `/v1/jobs/${once.json.id}:cancel`, { expect: 200 });

  // A job that keeps the one worker busy, and one that cannot be placed.
  const busy = await call('POST', '/v1/jobs', { expect: 200, body: {
    name: 'busy', model: { nLayer: 1, nHead: 1, dModel: 8 },
    training: { seqLen: 4, batchSize: 1, steps: '1000000' }, parallelism: { stages: 1 } } });
  const unplaced = await call('POST', '/v1/jobs', { expect: 200, body: {
    name: 'two-stages', model: { nLayer: 2, nHead: 2, dModel: 16 },
    training: { seqLen: 8, batchSize: 4, steps: '10' }, parallelism: { stages: 2 } } });

  // Lists: pages, views, bad parameters.
  const first = await call('GET', '/v1/jobs?pageSize=1', { expect: 200 });
  if (!first.json || !first.json.nextPageToken) fail('GET /v1/jobs?pageSize=1: no nextPageToken');
  else await call('GET', `/v1/jobs?pageSize=1&pageToken=${encodeURIComponent(first.json.nextPageToken)}`, { expect: 200 });
  await call('GET', '/v1/jobs?view=JOB_VIEW_FULL', { expect: 200 });
  await call('GET', '/v1/jobs?pageSize=-1', { expect: 400 });
  await call('GET', '/v1/workers', { expect: 200 });
  await call('GET', '/v1/workers?pageSize=-1', { expect: 400 });

  // One job: found, views, unknown.
  await call('GET', `/v1/jobs/${exampleJob}`, { expect: 200 });
  await call('GET', `/v1/jobs/${exampleJob}?view=JOB_VIEW_FULL`, { expect: 200 });
  await call('GET', `/v1/jobs/${exampleJob}?view=SOME`, { expect: 400 });
  await call('GET', '/v1/jobs/job-none', { expect: 404 });

  // Plans: of the busy job once it runs; of the unplaced one (400); unknown.
  const busyId = busy.json && busy.json.id;
  await until('the busy job to run', 120000, async () => {
    const r = await fetch(`${base}/v1/jobs/${busyId}`, { headers: { authorization: `Bearer ${TOKEN}` } });
    return (await r.json()).state === 'JOB_STATE_RUNNING';
  });
  // Its plan with a measured step (the 11th), so the measured fields are
  // validated too.
  await until('a measured step of the busy job', 120000, async () => {
    const r = await fetch(`${base}/v1/jobs/${busyId}/measured-timeline.svg`,
                          { headers: { authorization: `Bearer ${TOKEN}` } });
    return r.status === 200;
  });
  const plan = await call('GET', `/v1/jobs/${busyId}/plan`, { expect: 200 });
  if (!plan.json || !plan.json.measuredTimelineSvg) fail('the busy job\'s plan has no measured timeline');
  await call('GET', `/v1/jobs/${busyId}/timeline.svg`, { expect: 200 });
  await call('GET', `/v1/jobs/${busyId}/measured-timeline.svg`, { expect: 200 });
  const unplacedId = unplaced.json && unplaced.json.id;
  await call('GET', `/v1/jobs/${unplacedId}/plan`, { expect: 400 });
  await call('GET', `/v1/jobs/${unplacedId}/timeline.svg`, { expect: 400 });
  await call('GET', `/v1/jobs/${unplacedId}/measured-timeline.svg`, { expect: 400 });
  await call('GET', '/v1/jobs/job-none/plan', { expect: 404 });
  await call('GET', '/v1/jobs/job-none/timeline.svg', { expect: 404 });
  await call('GET', '/v1/jobs/job-none/measured-timeline.svg', { expect: 404 });

  // Drains: refused while its job has no checkpoints; unknown; then idle.
  await call('POST', `/v1/workers/${workerId}:drain`, { expect: 400 });
  await call('POST', '/v1/workers/w-none:drain', { expect: 404 });

  // Cancels: one the state store cannot record (503), the same once it can
  // (200, as a first cancel), a job, the same again (200: a repeat), one
  // that failed (400: it ended otherwise), unknown.
  await whileStateLocked(() => call('POST', `/v1/jobs/${busyId}:cancel`, { expect: 503 }));
  await call('POST', `/v1/jobs/${busyId}:cancel`, { expect: 200 });
  await call('POST', `/v1/jobs/${unplacedId}:cancel`, { expect: 200 });
  await call('POST', `/v1/jobs/${unplacedId}:cancel`, { expect: 200 });
  const doomed = await call('POST', '/v1/jobs', { expect: 200, body: {
    name: 'doomed', model: { nLayer: 2, nHead: 2, dModel: 16 },
    training: { seqLen: 8, batchSize: 4, steps: '10' }, parallelism: { stages: 2 },
    scheduling: { queueTimeout: '1s' } } });
  const doomedId = doomed.json && doomed.json.id;
  await until('the unplaceable job to fail its queue timeout', 60000, async () => {
    const r = await fetch(`${base}/v1/jobs/${doomedId}`, { headers: { authorization: `Bearer ${TOKEN}` } });
    return (await r.json()).state === 'JOB_STATE_FAILED';
  });
  await call('POST', `/v1/jobs/${doomedId}:cancel`, { expect: 400 });
  await call('POST', '/v1/jobs/job-none:cancel', { expect: 404 });
  await until('the worker to be free', 60000, async () => {
    const r = await fetch(`${base}/v1/workers`, { headers: { authorization: `Bearer ${TOKEN}` } });
    const w = ((await r.json()).workers || []).find((x) => x.id === workerId);
    return w && w.state === 'WORKER_STATE_READY';
  });
  // A drain the state store cannot record (503: draining all the same), then
  // again once it can (200, recorded).
  await whileStateLocked(() => call('POST', `/v1/workers/${workerId}:drain`, { expect: 503 }));
  await call('POST', `/v1/workers/${workerId}:drain`, { expect: 200 });

  // A known path with a method it does not take: 405 naming the others.
  const wrong = await call('DELETE', `/v1/jobs/${exampleJob}`, { expect: 405 });
  if (wrong.headers.allow !== 'GET, HEAD') fail(`405 Allow header "${wrong.headers.allow}"`);
  recordings.pop();  // undocumented by design: not validated below

  // Draining: /readyz 503 while the coordinator still serves.
  coordinator.kill('SIGTERM');
  await until('/readyz to say 503', 30000, async () => (await fetch(`${base}/readyz`)).status === 503);
  await call('GET', '/readyz', { token: '', expect: 503 });
}

// ---- validation -----------------------------------------------------------

function describe(errors) {
  return (errors || []).map((e) => `${e.instancePath || '/'} ${e.message}` +
    (e.params && e.params.additionalProperty ? ` (${e.params.additionalProperty})` : '')).join('; ');
}

// Violations of `api` by the recordings, and the (operationId, status) pairs seen.
function validate(api, records) {
  const violations = [];
  const seen = new Set();
  for (const r of records) {
    const where = `${r.request.method.toUpperCase()} ${r.request.path} -> ${r.status}`;
    const op = api.matchOperation(r.request);
    if (!op) { violations.push(`${where}: not a documented path and method`); continue; }
    if (!op.responses[String(r.status)]) {
      violations.push(`${where}: status ${r.status} is not documented for ${op.operationId}`);
      continue;
    }
    seen.add(`${op.operationId} ${r.status}`);
    if (r.status < 400 && r.request.headers.authorization !== undefined) {
      const request = api.validateRequest(r.request, op);
      if (!request.valid) violations.push(`${where}: request: ${describe(request.errors)}`);
    }
    const media = Object.keys(op.responses[String(r.status)].content || {});
    const type = (r.headers['content-type'] || '').split(';')[0];
    if (!media.some((m) => m.split(';')[0] === type)) {
      violations.push(`${where}: Content-Type ${type} is not documented (${media.join(', ')})`);
      continue;
    }
    if (type !== 'application/json') continue;
    const response = api.validateResponse(r.json, op, r.status);
    if (!response.valid) violations.push(`${where}: response: ${describe(response.errors)}`);
  }
  return { violations, seen };
}

function documentedPairs(document) {
  const pairs = [];
  for (const item of Object.values(document.paths)) {
    for (const method of ['get', 'post', 'put', 'delete', 'patch']) {
      if (!item[method]) continue;
      for (const status of Object.keys(item[method].responses)) {
        pairs.push(`${item[method].operationId} ${status}`);
      }
    }
  }
  return pairs;
}

async function main() {
  const document = YAML.parse(fs.readFileSync(args.spec, 'utf8'));
  const api = await backendFor(document);  // also validates the document itself

  fs.writeFileSync(path.join(args.tmp, 'user.token'), TOKEN, { mode: 0o600 });
  fs.writeFileSync(path.join(args.tmp, 'join.token'), 'conformance-join-token', { mode: 0o600 });
  fs.mkdirSync(path.join(args.tmp, 'out'), { recursive: true });
  const coordinatorPorts = path.join(args.tmp, 'coordinator.ports');
  const coordinator = spawn(args.coordinator, [
    '--grpc-address=127.0.0.1:0', '--http-address=127.0.0.1:0', `--ports-file=${coordinatorPorts}`,
    `--user-token-file=${path.join(args.tmp, 'user.token')}`,
    `--join-token-file=${path.join(args.tmp, 'join.token')}`,
    `--output-dir=${path.join(args.tmp, 'out')}`, '--shutdown-delay-seconds=60',
    `--state-dir=${path.join(args.tmp, 'state')}`,
  ], path.join(args.tmp, 'coordinator.log'));
  const ports = await until('the coordinator ports', 30000,
                            async () => { const p = readPorts(coordinatorPorts); return p && p.http_port && p; });
  base = `http://127.0.0.1:${ports.http_port}`;
  spawn(args.worker, [
    `--coordinator=127.0.0.1:${ports.grpc_port}`, '--listen=127.0.0.1:0', '--metrics-address=127.0.0.1:0',
    `--join-token-file=${path.join(args.tmp, 'join.token')}`, `--checkpoint-root=${path.join(args.tmp, 'out')}`,
    `--ports-file=${path.join(args.tmp, 'worker.ports')}`, '--drain-timeout-seconds=0',
  ], path.join(args.tmp, 'worker.log'));
  const workerId = await until('the worker to register', 60000, async () => {
    const r = await fetch(`${base}/v1/workers`, { headers: { authorization: `Bearer ${TOKEN}` } });
    const w = ((await r.json()).workers || []).find((x) => x.state === 'WORKER_STATE_READY');
    return w && w.id;
  });

  await scenario(document, coordinator, workerId);
  coordinator.kill('SIGTERM');  // the second signal: stop now

  const { violations, seen } = validate(api, recordings);
  violations.forEach(fail);
  const missing = documentedPairs(document).filter((p) => !seen.has(p));
  if (missing.length > 0) fail(`documented but not exercised: ${missing.join(', ')}`);
  console.log(`checked ${recordings.length} calls: ${seen.size} documented operation/status pairs, ` +
              `${violations.length} violations`);

  // (1) A server that renamed Job.state to Job.status.
  const job = recordings.find((r) => r.status === 200 && r.json && r.json.state && r.request.path.match(/^\/v1\/jobs\/[^/:]+$/));
  const renamed = JSON.parse(JSON.stringify(job));
  renamed.json.status = renamed.json.state;
  delete renamed.json.state;
  const served = validate(api, [renamed]).violations;
  if (served.length === 0) fail('a Job response with "state" renamed to "status" was accepted');
  else console.log(`rejected as expected (server renamed state -> status): ${served[0]}`);

  // (2) A document that renamed Job.state (the server still sends "state").
  const drifted = JSON.parse(JSON.stringify(document));
  const props = drifted.components.schemas.Job.properties;
  props.status = props.state;
  delete props.state;
  const documented = validate(await backendFor(drifted), recordings).violations;
  if (documented.length === 0) fail('recordings passed a document with Job.state renamed to status');
  else console.log(`rejected as expected (document renamed state -> status): ${documented.length} violations, e.g. ${documented[0]}`);

  console.log(failures.length === 0 ? 'OK: the coordinator conforms to docs/openapi.yaml'
                                    : `FAILED: ${failures.length} problems`);
  process.exit(failures.length === 0 ? 0 : 1);
}

main().catch((e) => {
  console.log(`FAIL ${e.stack || e}`);
  process.exit(1);
});
