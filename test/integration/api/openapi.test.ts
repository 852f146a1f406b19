import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Validator } from '@seriousme/openapi-schema-validator';
import type { Express } from 'express';
import request from 'supertest';
import { createRateLimiter } from '../../../src/middleware/rateLimit.js';
import { documentedStatuses, errorSchemaFor, responseCodes } from '../../../src/openapi/document.js';
import { ERROR_CODES, ERROR_CODE_LIST, type ErrorCode } from '../../../src/shared/errors.js';
import { API_ROUTES } from '../../../src/openapi/routes.js';
import { IDEMPOTENCY_TTL_SECONDS, JOB } from '../../../src/shared/jobs.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { BEARER, createHarness, OP_KEY, OP_KEY_2, RO_KEY, runWorkerUntil, useHarness, type Harness } from '../../helpers/apiHarness.js';
import { enqueue } from '../../helpers/queueOps.js';
import { harnessSecretOf, pushHeaders, pushSources } from '../../helpers/senders.js';
import { SOURCES, type PushSource, type Source } from '../../../src/sources/index.js';
import { waitFor } from '../../helpers/waitFor.js';
import { GUARDED_INVENTORY_YAML, decide, restartAs } from '../../helpers/guards.js';
import { createDeployHistory } from '../../../src/changes/deployOrder/history.js';

/**
 * GET /openapi.json:
 * - the document is OpenAPI 3.1 and names every auth scheme;
 * - every route the Express app serves is in it (the app's router stack is walked), and nothing
 *   is documented that the app does not serve;
 * - every documented status of every operation is produced here by a real request (a table of
 *   producers, one per "METHOD path status"; a documented status without one, or one that answers
 *   something else, fails), and 2xx bodies match the documented (zod) answer schema;
 * - the error codes: the document lists every code of the catalog (src/shared/errors.ts), each
 *   error answer documents codes of its own status only, and every error produced here carries a
 *   code its operation documents for that status.
 */
// A keys file with a key scoped to web-1, for the answers of a target outside a scope.
const keysDir = mkdtempSync(join(tmpdir(), 'opsgate-openapi-'));
const SCOPED_KEY = 'scoped-key-0301-abcdef';
writeFileSync(join(keysDir, 'keys.yaml'), `- {id: scoped, role: readonly, key: ${SCOPED_KEY}, scope: {hosts: [web-1]}}\n`);
const ctx = useHarness({ env: { ADMIN_UI_ENABLED: 'true', OPS_API_KEYS_FILE: join(keysDir, 'keys.yaml') } }); // the admin UI is part of what is documented
const ALERTS_TOKEN = 'alerts-token-0006-openapi';

let limited: Harness; // RATE_LIMIT 1 per minute: the second request of a client is 429
let guarded: Harness; // the inventory with policies of guarded changes (test/helpers/guards.ts)
let tokened: Harness; // ALERTS_WEBHOOK_TOKEN set
let down: Harness; // its Redis stopped
let downSrv: RedisServer;

beforeAll(async () => {
  limited = await createHarness(ctx.srv.url, {
    rateLimit: (d) => createRateLimiter({ ...d, rps: 1, windowMs: 60_000, keyPrefix: 'opsgate:rl-openapi:' }),
  });
  tokened = await createHarness(ctx.srv.url, { env: { ALERTS_WEBHOOK_TOKEN: ALERTS_TOKEN } });
  guarded = await createHarness(ctx.srv.url, { inventoryYaml: GUARDED_INVENTORY_YAML, env: { DRY_RUN_TIMEOUT_MS: '200' } });
  downSrv = await startRedis();
  down = await createHarness(downSrv.url);
  await downSrv.stop();
  const deadline = Date.now() + 10_000;
  while ((down.redis.status === 'ready' || down.queue.isReady()) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
});
afterAll(async () => {
  await limited?.close();
  await tokened?.close();
  await guarded?.close();
  await down?.close();
  await downSrv?.destroy();
  rmSync(keysDir, { recursive: true, force: true });
});

// ---------------------------------------------------------------------------------------------
// the router walk

interface Layer {
  route?: { path: string; methods: Record<string, boolean> };
  handle?: { stack?: Layer[] };
  rawPath?: unknown;
  slash?: boolean;
}

/** "METHOD /path/{param}" of every route of the app; a router mounted under a path (Bull Board) counts as GET of its mount path. */
function servedRoutes(app: Express): string[] {
  const out: string[] = [];
  const walk = (stack: Layer[], prefix: string) => {
    for (const layer of stack) {
      if (layer.route) {
        for (const m of Object.keys(layer.route.methods).filter((k) => k !== '_all')) {
          out.push(`${m.toUpperCase()} ${prefix}${layer.route.path.replace(/:(\w+)/g, '{$1}')}`);
        }
      } else if (layer.handle?.stack) {
        const mount = typeof layer.rawPath === 'string' && !layer.slash ? layer.rawPath : '';
        if (mount && mount !== '/') out.push(`GET ${prefix}${mount}`);
        else walk(layer.handle.stack, prefix);
      }
    }
  };
  walk((app as unknown as { router: { stack: Layer[] } }).router.stack, '');
  return [...new Set(out)].sort();
}

describe('the document', () => {
  it('GET /openapi.json (no auth) is OpenAPI 3.1 with every auth scheme, and names only known schemes', async () => {
    const res = await request(ctx.h.app).get('/openapi.json');
    expect(res.status).toBe(200);
    expect(res.headers['content-type']).toMatch(/^application\/json/);
    const doc = res.body;
    expect(doc.openapi).toBe('3.1.0');
    expect(doc.info).toMatchObject({ title: 'opsgate', version: '9.9.9-test' });
    const schemes = doc.components.securitySchemes;
    expect(schemes.apiKey).toMatchObject({ type: 'apiKey', in: 'header', name: 'X-API-Key' });
    expect(schemes.bearer).toMatchObject({ type: 'http', scheme: 'bearer' });
    expect(schemes.scmWebhook).toMatchObject({ type: 'apiKey', in: 'header', name: 'X-Scm-Token' });
    expect(schemes.githubWebhook).toMatchObject({ type: 'apiKey', in: 'header', name: 'X-Hub-Signature-256' });
    expect(schemes.gitlabWebhook).toMatchObject({ type: 'apiKey', in: 'header', name: 'X-Gitlab-Token' });
    const ids = new Set<string>();
    for (const [path, ops] of Object.entries<Record<string, any>>(doc.paths)) {
      for (const [method, op] of Object.entries<any>(ops)) {
        for (const req of op.security) for (const name of Object.keys(req)) expect(schemes[name]).toBeDefined();
        expect(ids.has(op.operationId)).toBe(false);
        ids.add(op.operationId);
        for (const [status, r] of Object.entries<any>(op.responses)) {
          // explicit statuses only: a `default` answer would make every status conform
          expect(status).toMatch(/^[1-5]\d\d$/);
          if (Number(status) >= 400) {
            const schema = r.content['application/json'].schema;
            expect(schema.required).toEqual(['detail', 'code']);
            // only codes of the catalog, each answered with this status
            for (const code of schema.properties.code.enum as ErrorCode[]) {
              expect([`${method} ${path} ${status}`, code, ERROR_CODES[code]?.status]).toEqual([
                `${method} ${path} ${status}`,
                code,
                Number(status),
              ]);
            }
          }
        }
        expect(`${method} ${path}`).toMatch(/^(get|post|delete) \//);
      }
    }
    // the request schemas are the validating zod schemas: constraints show up
    const restart = doc.paths['/ops/restart'].post;
    expect(restart.parameters).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ name: 'host', in: 'query', required: true }),
        expect.objectContaining({
          name: 'Idempotency-Key',
          in: 'header',
          required: false,
          schema: expect.objectContaining({ pattern: expect.any(String) }),
        }),
      ]),
    );
    // the Idempotency-Key's lifetime as the code keeps it (IDEMPOTENCY_TTL_SECONDS)
    const idem = restart.parameters.find((p: any) => p.name === 'Idempotency-Key');
    expect(JSON.stringify(idem)).toContain(`remembered ${IDEMPOTENCY_TTL_SECONDS / 3600} h`);
    const list = doc.paths['/ops/jobs'].get.parameters;
    expect(list.find((p: any) => p.name === 'limit')).toMatchObject({
      required: false,
      schema: { type: 'integer', minimum: 1, maximum: 100, default: 20 },
    });
    const answers = doc.paths['/ops/restart'].post.responses['200'].content['application/json'].schema.anyOf;
    expect(answers[0].required).toContain('coalesced');
    expect(answers[1].required).toEqual(expect.arrayContaining(['dry_run', 'verdicts', 'kubernetes']));
    expect(restart.parameters.map((p: any) => p.name)).toEqual(expect.arrayContaining(['dry_run', 'override', 'reason']));
  });

  it('lists every code of the error catalog, with its status and meaning', async () => {
    const doc = (await request(ctx.h.app).get('/openapi.json')).body;
    const error = doc.components.schemas.Error;
    expect(error.required).toEqual(['detail', 'code']);
    expect(error.properties.code.enum).toEqual(ERROR_CODE_LIST);
    for (const code of ERROR_CODE_LIST) {
      expect(error.properties.code.description).toContain(`\`${code}\` (${ERROR_CODES[code].status}): ${ERROR_CODES[code].meaning}`);
    }
    // every code of the catalog is one some operation documents, save those of another listener
    // (the HTTP parser's, the metrics port's, the worker's), of any path (404, 405, 500), and these:
    // Bull Board's writes (its board is documented as its page), the client certificate of
    // /webhook/alerts (TLS only) and a Content-Encoding the API does not read (any body)
    const documented = new Set<string>();
    for (const ops of Object.values<Record<string, any>>(doc.paths))
      for (const op of Object.values<any>(ops))
        for (const [status, r] of Object.entries<any>(op.responses))
          if (Number(status) >= 400) for (const c of r.content['application/json'].schema.properties.code.enum) documented.add(c);
    const elsewhere = ['request_timeout', 'headers_too_large', 'method_not_allowed', 'not_found', 'internal_error', 'event_loop_blocked'];
    const undocumented = ERROR_CODE_LIST.filter((c) => !documented.has(c) && !elsewhere.includes(c)).sort();
    expect(undocumented).toEqual(
      [
        'admin_action_refused',
        'cross_site_request',
        'queue_not_found',
        'client_certificate_required',
        'untrusted_client_certificate',
        'client_certificate_not_allowed',
        'unsupported_encoding',
      ].sort(),
    );
  });

  it('/admin/queues is documented as HTML, and only where the admin UI is mounted', async () => {
    const on = (await request(ctx.h.app).get('/openapi.json')).body;
    expect(Object.keys(on.paths['/admin/queues'].get.responses['200'].content)).toEqual(['text/html']);
    const off = (await request(tokened.app).get('/openapi.json')).body; // ADMIN_UI_ENABLED unset
    expect(tokened.config.ADMIN_UI_ENABLED).toBe(false);
    expect(Object.keys(off.paths).filter((p) => p.startsWith('/admin'))).toEqual([]);
    expect((await request(tokened.app).get('/admin/queues').set('X-API-Key', OP_KEY)).status).toBe(404);
  });

  it('the form-encoded GitHub body is documented as payload=<JSON text>, the JSON one as the push fields', async () => {
    const content = (await request(ctx.h.app).get('/openapi.json')).body.paths['/webhook/github'].post.requestBody.content;
    expect(content['application/x-www-form-urlencoded'].schema).toMatchObject({
      type: 'object',
      required: ['payload'],
      properties: { payload: { type: 'string' } },
    });
    expect(content['application/json'].schema.required).toEqual(['after']);
  });

  it("is valid against the OpenAPI 3.1 specification's JSON schema", async () => {
    const doc = (await request(ctx.h.app).get('/openapi.json')).body;
    const validator = new Validator();
    const result = await validator.validate(doc);
    expect(result.errors ?? []).toEqual([]);
    expect(result.valid).toBe(true);
    expect(validator.version).toBe('3.1');
    // and the validator does fail a broken one
    expect((await new Validator().validate({ ...doc, paths: { '/x': { get: { responses: { 200: {} } } } } })).valid).toBe(false);
  });

  it('documents exactly the routes the Express app serves (walks the router stack)', () => {
    const served = servedRoutes(ctx.h.app);
    const documented = API_ROUTES.map((r) => `${r.method.toUpperCase()} ${r.path}`).sort();
    expect(served.length).toBeGreaterThan(10);
    expect(served.filter((r) => !documented.includes(r))).toEqual([]); // served, not documented
    expect(documented.filter((r) => !served.includes(r))).toEqual([]); // documented, not served
  });
});

// ---------------------------------------------------------------------------------------------
// every documented status, produced

type Res = request.Response;
const big = 'x'.repeat(1024 * 1024 + 10);
const alerts = JSON.stringify({ alerts: [{ status: 'firing', fingerprint: 'fp-openapi', labels: { alertname: 'X' } }] });

/** A /webhook/scm push to `branch` as recorded in the deliveries log: its id. */
async function recordedDelivery(branch: string): Promise<string> {
  const source = SOURCES.find((x) => x.name === 'scm')!;
  const body = JSON.stringify({
    ref: `refs/heads/${branch}`,
    checkout_sha: `sha-${branch}-${Date.now()}`,
    project: { path_with_namespace: 'group/app' },
  });
  const res = await request(ctx.h.app)
    .post('/webhook/scm')
    .set(pushHeaders(source as PushSource, harnessSecretOf(source, ctx.h.config), body))
    .send(body);
  const sha = JSON.parse(body).checkout_sha as string;
  return waitFor('the push in the deliveries log', async () => {
    expect(res.status).toBe(202);
    const list = await request(ctx.h.app).get('/ops/deliveries?source=scm&limit=200').set('X-API-Key', RO_KEY);
    const found = (list.body.deliveries as Array<{ id: string; event: { sha: string } | null; detail: string | null }>).find(
      (d) => d.event?.sha === sha || (d.detail ?? '').includes(`refs/heads/${branch}`),
    );
    return found?.id ?? false;
  });
}

/** A dead letter made by the real worker processor (a restart of a host not in the inventory). */
async function deadLetter(h: Harness): Promise<string> {
  const id = await enqueue(h.queue, JOB.restartService, { host: 'gone', service: 'api', audit_id: 'a', requested_by: 'b' });
  await runWorkerUntil(ctx.srv.url, async () => (await h.queue.jobs.get(id))?.state === 'failed');
  return id;
}

const sourceOf = (path: string): Source | undefined => SOURCES.find((s) => path === `/webhook/${s.name}`);

/**
 * Credentials for a route (by its first scheme). A signing sender's proof is over `body`, or of
 * the right form only (enough for what is refused before the signature is checked: 413, 429).
 */
function authed(r: request.Test, path: string, body = ''): request.Test {
  if (path === '/ops/restart') return r.set('Authorization', `Bearer ${BEARER}`);
  const source = sourceOf(path);
  if (source?.kind === 'alerts') return r;
  if (source) return r.set(pushHeaders(source, harnessSecretOf(source, ctx.h.config), body));
  return r.set('X-API-Key', OP_KEY);
}

const call = (app: Express, method: string, path: string) => {
  const agent = request(app);
  return method === 'GET' ? agent.get(path) : method === 'POST' ? agent.post(path) : agent.delete(path);
};

/** The request path of a documented path (parameters filled in with something that exists when needed). */
const concrete = (path: string) =>
  path
    .replace('{host}', 'web-1')
    .replace('{project}', 'group%2Fapp')
    .replace('{id}', path.startsWith('/ops/deliveries/') ? 'scm.1-0' : 'some-job');

/** Producers for the statuses every route of a kind shares. */
function generic(method: string, path: string, status: number): (() => Promise<Res>) | undefined {
  const p = concrete(path);
  switch (status) {
    case 429:
      return async () => {
        await call(limited.app, method, p);
        return call(limited.app, method, p);
      };
    case 401:
      return path === '/webhook/alerts'
        ? () => request(tokened.app).post(p).set('Content-Type', 'application/json').send(alerts)
        : () => call(ctx.h.app, method, p);
    case 413:
      return () =>
        authed(call(ctx.h.app, method, p), path)
          .set('Content-Type', 'application/json')
          .send(big);
    case 503:
      return () => {
        const source = sourceOf(path);
        const body = source?.kind === 'push' ? JSON.stringify(source.example) : alerts;
        const req = authed(call(down.app, method, path === '/ops/restart' ? '/ops/restart?host=web-1&service=checkout' : p), path, body);
        if (path.endsWith('/retry') || path.endsWith('/replay')) return req.set('Content-Type', 'application/json').send('{"reason":"r"}');
        if (source) return req.set('Content-Type', 'application/json').send(body);
        return req;
      };
    default:
      return undefined;
  }
}

const json = (r: request.Test, body: string) => r.set('Content-Type', 'application/json').send(body);
const FULL_SHA = 'e1c5b7a0f9d3c2b1a0e9d8c7b6a5f4e3d2c1b0a9';
const deployAs = (app: Express, body: Record<string, unknown>, key = OP_KEY) =>
  json(request(app).post('/ops/deploys').set('X-API-Key', key), JSON.stringify(body));
const rollbackAs = (app: Express, body: Record<string, unknown>, key = OP_KEY) =>
  json(request(app).post('/ops/deploys/rollback').set('X-API-Key', key), JSON.stringify(body));

/** A pending approval of a restart (pay-1's policy asks for one), asked for by a person's key (OP_KEY_2): its id. */
async function pending(): Promise<string> {
  return (await restartAs(guarded.app, '?host=pay-1&service=ledger', { 'X-API-Key': OP_KEY_2 })).body.approval_id as string;
}
const freeze = (h: Harness, body: Record<string, unknown>) =>
  json(request(h.app).post('/ops/freezes').set('X-API-Key', OP_KEY), JSON.stringify(body));
const lift = (h: Harness, id: string, key = OP_KEY) =>
  json(request(h.app).delete(`/ops/freezes/${id}`).set('X-API-Key', key), '{"reason":"r"}');

const PRODUCERS: Record<string, () => Promise<Res>> = {
  'GET /health 200': () => request(ctx.h.app).get('/health'),
  'GET /ready 200': () => request(ctx.h.app).get('/ready'),
  'GET /version 200': () => request(ctx.h.app).get('/version'),
  'GET /openapi.json 200': () => request(ctx.h.app).get('/openapi.json'),
  'GET /ops/hosts 200': () => request(ctx.h.app).get('/ops/hosts').set('X-API-Key', RO_KEY),
  'GET /ops/hosts/{host} 200': () =>
    createHarness(ctx.srv.url, {
      hostStatus: {
        deployments: async (_ns, names) =>
          names.map((name) => ({ name, found: true, replicas: 1, ready: 1, updated: 1, available: 1, restarted_at: null })),
      },
    }).then(async (h) => {
      try {
        return await request(h.app).get('/ops/hosts/web-1').set('X-API-Key', RO_KEY);
      } finally {
        await h.close();
      }
    }),
  'GET /ops/hosts/{host} 403': () => request(ctx.h.app).get('/ops/hosts/db-1').set('X-API-Key', SCOPED_KEY),
  'GET /ops/hosts/{host} 404': () => request(ctx.h.app).get('/ops/hosts/nope').set('X-API-Key', RO_KEY),
  'GET /ops/hosts/{host} 503': () => request(ctx.h.app).get('/ops/hosts/web-1').set('X-API-Key', RO_KEY), // no cluster configured
  'POST /ops/restart 200': () =>
    request(ctx.h.app).post('/ops/restart?host=web-1&service=checkout').set('Authorization', `Bearer ${BEARER}`),
  'POST /ops/restart 400': () =>
    request(ctx.h.app)
      .post('/ops/restart?host=web-1&service=checkout')
      .set('Authorization', `Bearer ${BEARER}`)
      .set('Idempotency-Key', 'k'.repeat(300)),
  'POST /ops/restart 404': () =>
    request(ctx.h.app).post('/ops/restart?host=nope&service=checkout').set('Authorization', `Bearer ${BEARER}`),
  'POST /ops/restart 422': () => request(ctx.h.app).post('/ops/restart?host=web-1').set('Authorization', `Bearer ${BEARER}`),
  'DELETE /ops/cache 200': () => request(ctx.h.app).delete('/ops/cache').set('X-API-Key', OP_KEY),
  'DELETE /ops/cache 403': () => request(ctx.h.app).delete('/ops/cache').set('X-API-Key', RO_KEY),
  'POST /ops/deploys 202': () => deployAs(ctx.h.app, { project: 'group/ci', ref: 'refs/heads/main', sha: FULL_SHA }),
  'POST /ops/deploys 400': () => json(request(ctx.h.app).post('/ops/deploys').set('X-API-Key', OP_KEY), '{nope'),
  'POST /ops/deploys 403': () => deployAs(ctx.h.app, { project: 'group/ci', ref: 'refs/heads/main', sha: FULL_SHA }, RO_KEY),
  'POST /ops/deploys 404': () => deployAs(ctx.h.app, { project: 'group/nope', ref: 'refs/heads/main', sha: FULL_SHA }),
  'POST /ops/deploys 409': () => deployAs(ctx.h.app, { project: 'group/app', ref: 'refs/heads/main', sha: FULL_SHA }),
  'POST /ops/deploys 422': () => deployAs(ctx.h.app, { project: 'group/ci', ref: 'refs/heads/main' }),
  'POST /ops/deploys 503': () => deployAs(down.app, { project: 'group/ci', ref: 'refs/heads/main', sha: FULL_SHA }),
  'POST /ops/deploys/rollback 202': async () => {
    // A succeeded deploy in the history to go back to (its step as the worker writes it).
    await createDeployHistory(ctx.h.redis, 100).record({
      id: 'deploy-openapi-1',
      accepted: Date.now() - 1000,
      first: {
        project: 'group/app',
        ref: 'refs/heads/main',
        commit: FULL_SHA,
        group: 'group/app:refs/heads/main',
        origin: 'push',
        owner: null,
        queue_job: 'deploy-openapi-1',
      },
      step: { state: 'succeeded', finished_at: Date.now() },
    });
    return rollbackAs(ctx.h.app, { project: 'group/app', ref: 'refs/heads/main', to: FULL_SHA, reason: 'r' });
  },
  'POST /ops/deploys/rollback 400': () => json(request(ctx.h.app).post('/ops/deploys/rollback').set('X-API-Key', OP_KEY), '{nope'),
  'POST /ops/deploys/rollback 403': () => rollbackAs(ctx.h.app, { project: 'group/app', ref: 'refs/heads/main', reason: 'r' }, RO_KEY),
  'POST /ops/deploys/rollback 404': () => rollbackAs(ctx.h.app, { project: 'group/nope', ref: 'refs/heads/main', reason: 'r' }),
  'POST /ops/deploys/rollback 409': () => rollbackAs(ctx.h.app, { project: 'group/app', ref: 'refs/heads/main', reason: 'r' }),
  'POST /ops/deploys/rollback 422': () => rollbackAs(ctx.h.app, { project: 'group/app', ref: 'refs/heads/main' }),
  'POST /ops/deploys/rollback 503': () => rollbackAs(down.app, { project: 'group/app', ref: 'refs/heads/main', reason: 'r' }),
  'GET /ops/keys 200': () => request(ctx.h.app).get('/ops/keys').set('X-API-Key', OP_KEY),
  'GET /ops/keys 403': () => request(ctx.h.app).get('/ops/keys').set('X-API-Key', RO_KEY),
  'GET /ops/keys 422': () => request(ctx.h.app).get('/ops/keys?limit=0').set('X-API-Key', OP_KEY),
  'GET /ops/approvals 422': () => request(ctx.h.app).get('/ops/approvals?cursor=nope').set('X-API-Key', RO_KEY),
  'GET /ops/freezes 422': () => request(ctx.h.app).get('/ops/freezes?limit=501').set('X-API-Key', RO_KEY),
  'GET /ops/holds 422': () => request(ctx.h.app).get('/ops/holds?limit=1&limit=2').set('X-API-Key', RO_KEY),
  'GET /ops/remediations 200': () => request(ctx.h.app).get('/ops/remediations?limit=10').set('X-API-Key', RO_KEY),
  'GET /ops/remediations 422': () => request(ctx.h.app).get('/ops/remediations?limit=501').set('X-API-Key', RO_KEY),
  'POST /ops/approvals/{id}/approve 202': async () => {
    // vault-1 asks for two approvals: the first is recorded, the change still waits
    const id = (await restartAs(guarded.app, '?host=vault-1&service=core')).body.approval_id as string;
    return decide(guarded.app, id, 'approve', OP_KEY);
  },
  'POST /ops/deliveries/{id}/replay 202': async () => {
    // group/guarded asks for an approval: the replay joins the pending one
    const source = SOURCES.find((x) => x.name === 'scm') as PushSource;
    const body = JSON.stringify({
      ref: 'refs/heads/main',
      checkout_sha: `guarded-${Date.now()}`,
      project: { path_with_namespace: 'group/guarded' },
    });
    const pushed = await request(guarded.app)
      .post('/webhook/scm')
      .set(pushHeaders(source, harnessSecretOf(source, guarded.config), body))
      .send(body);
    expect(pushed.body.status).toBe('pending_approval');
    const id = await waitFor('the guarded push in the deliveries log', async () => {
      const list = await request(guarded.app).get('/ops/deliveries?source=scm&verdict=queued').set('X-API-Key', RO_KEY);
      return (list.body.deliveries as Array<{ id: string; job_id: string | null }>).find((d) => d.job_id === pushed.body.job_id)?.id;
    });
    return json(request(guarded.app).post(`/ops/deliveries/${id}/replay`).set('X-API-Key', OP_KEY), '{"reason":"r"}');
  },
  'GET /ops/jobs 200': async () => {
    await deadLetter(ctx.h);
    return request(ctx.h.app).get('/ops/jobs?state=failed').set('X-API-Key', RO_KEY);
  },
  'GET /ops/jobs 422': () => request(ctx.h.app).get('/ops/jobs?state=nope').set('X-API-Key', RO_KEY),
  'GET /ops/jobs/{id} 200': async () =>
    request(ctx.h.app)
      .get(`/ops/jobs/${await deadLetter(ctx.h)}`)
      .set('X-API-Key', RO_KEY),
  'GET /ops/jobs/{id} 404': () => request(ctx.h.app).get('/ops/jobs/nope').set('X-API-Key', RO_KEY),
  'POST /ops/jobs/{id}/retry 200': async () =>
    json(
      request(ctx.h.app)
        .post(`/ops/jobs/${await deadLetter(ctx.h)}/retry`)
        .set('X-API-Key', OP_KEY),
      '{"reason":"fixed"}',
    ),
  'POST /ops/jobs/{id}/retry 400': () => json(request(ctx.h.app).post('/ops/jobs/x/retry').set('X-API-Key', OP_KEY), '{nope'),
  'POST /ops/jobs/{id}/retry 403': () => json(request(ctx.h.app).post('/ops/jobs/x/retry').set('X-API-Key', RO_KEY), '{"reason":"r"}'),
  'POST /ops/jobs/{id}/retry 404': () => json(request(ctx.h.app).post('/ops/jobs/nope/retry').set('X-API-Key', OP_KEY), '{"reason":"r"}'),
  'POST /ops/jobs/{id}/retry 409': async () => {
    const id = await enqueue(ctx.h.queue, JOB.notifyOncall, { alertname: 'x', annotations: {}, audit_id: 'a', requested_by: 'b' });
    return json(request(ctx.h.app).post(`/ops/jobs/${id}/retry`).set('X-API-Key', OP_KEY), '{"reason":"r"}');
  },
  'POST /ops/jobs/{id}/retry 422': () => json(request(ctx.h.app).post('/ops/jobs/x/retry').set('X-API-Key', OP_KEY), '{}'),
  'GET /ops/deliveries 200': () => request(ctx.h.app).get('/ops/deliveries').set('X-API-Key', RO_KEY),
  'GET /ops/deliveries 422': () => request(ctx.h.app).get('/ops/deliveries?verdict=nope').set('X-API-Key', RO_KEY),
  'GET /ops/deliveries/{id} 200': async () =>
    request(ctx.h.app)
      .get(`/ops/deliveries/${await recordedDelivery('main')}`)
      .set('X-API-Key', RO_KEY),
  'GET /ops/deliveries/{id} 404': () => request(ctx.h.app).get('/ops/deliveries/scm.1-0').set('X-API-Key', RO_KEY),
  'POST /ops/deliveries/{id}/replay 200': async () =>
    json(
      request(ctx.h.app)
        .post(`/ops/deliveries/${await recordedDelivery('main')}/replay`)
        .set('X-API-Key', OP_KEY),
      '{"reason":"r"}',
    ),
  'POST /ops/deliveries/{id}/replay 400': () =>
    json(request(ctx.h.app).post('/ops/deliveries/scm.1-0/replay').set('X-API-Key', OP_KEY), '{nope'),
  'POST /ops/deliveries/{id}/replay 403': () =>
    json(request(ctx.h.app).post('/ops/deliveries/scm.1-0/replay').set('X-API-Key', RO_KEY), '{"reason":"r"}'),
  'POST /ops/deliveries/{id}/replay 404': () =>
    json(request(ctx.h.app).post('/ops/deliveries/scm.1-0/replay').set('X-API-Key', OP_KEY), '{"reason":"r"}'),
  'POST /ops/deliveries/{id}/replay 409': async () =>
    json(
      request(ctx.h.app)
        .post(`/ops/deliveries/${await recordedDelivery('dev')}/replay`)
        .set('X-API-Key', OP_KEY),
      '{"reason":"r"}',
    ),
  'POST /ops/deliveries/{id}/replay 422': () =>
    json(request(ctx.h.app).post('/ops/deliveries/scm.1-0/replay').set('X-API-Key', OP_KEY), '{}'),
  ...Object.fromEntries(
    pushSources().flatMap((source) => {
      const path = `/webhook/${source.name}`;
      const send = (body: string, headers: Record<string, string>) => request(ctx.h.app).post(path).set(headers).send(body);
      const signed = (body: string) => send(body, pushHeaders(source, harnessSecretOf(source, ctx.h.config), body));
      const example = JSON.stringify(source.example);
      return [
        [`POST ${path} 202`, () => signed(example)],
        [`POST ${path} 400`, () => signed('{nope')],
        [`POST ${path} 403`, () => send(example, { 'Content-Type': 'application/json', [source.event.header]: source.event.push })],
        [`POST ${path} 422`, () => signed('[1]')],
      ];
    }),
  ),
  'POST /webhook/alerts 202': () => json(request(ctx.h.app).post('/webhook/alerts'), alerts),
  'POST /webhook/alerts 400': () => json(request(ctx.h.app).post('/webhook/alerts'), '{nope'),
  'POST /webhook/alerts 422': () => json(request(ctx.h.app).post('/webhook/alerts'), '{"alerts":{}}'),
  'POST /ops/restart 202': () => restartAs(guarded.app, '?host=pay-1&service=api'),
  'POST /ops/restart 403': () => request(ctx.h.app).post('/ops/restart?host=web-1&service=checkout').set('X-API-Key', RO_KEY),
  'POST /ops/restart 409': async () => {
    await freeze(guarded, { scope: 'namespace', namespace: 'shop', reason: 'r', duration: '1h' });
    return restartAs(guarded.app, '?host=web-1&service=frontend');
  },
  'GET /ops/approvals 200': async () => {
    await pending();
    return request(guarded.app).get('/ops/approvals').set('X-API-Key', RO_KEY);
  },
  'GET /ops/approvals/{id} 200': async () =>
    request(guarded.app)
      .get(`/ops/approvals/${await pending()}`)
      .set('X-API-Key', RO_KEY),
  'GET /ops/approvals/{id} 404': () => request(guarded.app).get('/ops/approvals/apr-00000000000000000000').set('X-API-Key', RO_KEY),
  'GET /ops/approvals/{id} 503': () => request(down.app).get('/ops/approvals/apr-00000000000000000000').set('X-API-Key', RO_KEY),
  ...Object.fromEntries(
    (['approve', 'reject'] as const).flatMap((action) => {
      const path = `POST /ops/approvals/{id}/${action}`;
      return [
        [`${path} 200`, async () => decide(guarded.app, await pending(), action, OP_KEY)],
        [
          `${path} 400`,
          () => json(request(guarded.app).post(`/ops/approvals/apr-00000000000000000000/${action}`).set('X-API-Key', OP_KEY), '{nope'),
        ],
        [`${path} 403`, async () => decide(guarded.app, await pending(), action, RO_KEY)],
        [`${path} 404`, () => decide(guarded.app, 'apr-00000000000000000000', action, OP_KEY)],
        [
          `${path} 409`,
          async () => {
            const id = await pending();
            await decide(guarded.app, id, action, OP_KEY);
            return decide(guarded.app, id, action, OP_KEY);
          },
        ],
        [`${path} 422`, async () => decide(guarded.app, await pending(), action, OP_KEY, {})],
        [`${path} 503`, () => decide(down.app, 'apr-00000000000000000000', action, OP_KEY)],
      ];
    }),
  ),
  'GET /ops/freezes 200': () => request(guarded.app).get('/ops/freezes').set('X-API-Key', RO_KEY),
  'POST /ops/freezes 201': () => freeze(guarded, { scope: 'all', reason: 'r', duration: '1h' }),
  'POST /ops/freezes 400': () => json(request(guarded.app).post('/ops/freezes').set('X-API-Key', OP_KEY), '{nope'),
  'POST /ops/freezes 403': () => json(request(guarded.app).post('/ops/freezes').set('X-API-Key', RO_KEY), '{}'),
  'POST /ops/freezes 422': () => freeze(guarded, { scope: 'all', reason: 'r' }),
  'POST /ops/freezes 503': () => freeze(down, { scope: 'all', reason: 'r', duration: '1h' }),
  'GET /ops/freezes/{id} 200': async () =>
    request(guarded.app)
      .get(`/ops/freezes/${(await freeze(guarded, { scope: 'all', reason: 'r', duration: '1h' })).body.id}`)
      .set('X-API-Key', RO_KEY),
  'GET /ops/freezes/{id} 404': () => request(guarded.app).get('/ops/freezes/frz-0000000000000000').set('X-API-Key', RO_KEY),
  'GET /ops/freezes/{id} 503': () => request(down.app).get('/ops/freezes/frz-0000000000000000').set('X-API-Key', RO_KEY),
  'DELETE /ops/freezes/{id} 200': async () => lift(guarded, (await freeze(guarded, { scope: 'all', reason: 'r', duration: '1h' })).body.id),
  'DELETE /ops/freezes/{id} 400': () =>
    json(request(guarded.app).delete('/ops/freezes/frz-0000000000000000').set('X-API-Key', OP_KEY), '{nope'),
  'DELETE /ops/freezes/{id} 403': () => lift(guarded, 'frz-0000000000000000', RO_KEY),
  'DELETE /ops/freezes/{id} 404': () => lift(guarded, 'frz-0000000000000000'),
  'DELETE /ops/freezes/{id} 422': () =>
    json(request(guarded.app).delete('/ops/freezes/frz-0000000000000000').set('X-API-Key', OP_KEY), '{}'),
  'DELETE /ops/freezes/{id} 503': () => lift(down, 'frz-0000000000000000'),
  'GET /ops/holds 200': async () => {
    await freeze(guarded, { scope: 'project', project: 'group/app', reason: 'r', duration: '1h' });
    const body = JSON.stringify({ ref: 'refs/heads/main', checkout_sha: 'held', project: { path_with_namespace: 'group/app' } });
    await request(guarded.app)
      .post('/webhook/scm')
      .set(
        pushHeaders(
          SOURCES.find((x) => x.name === 'scm') as PushSource,
          harnessSecretOf(
            SOURCES.find((x) => x.name === 'scm')!,
            guarded.config,
          ),
          body,
        ),
      )
      .send(body);
    return request(guarded.app).get('/ops/holds').set('X-API-Key', RO_KEY);
  },
  'GET /ops/deploys 200': async () => {
    await deployAs(ctx.h.app, { project: 'group/ci', ref: 'refs/heads/main', sha: FULL_SHA });
    return request(ctx.h.app).get('/ops/deploys?project=group%2Fci').set('X-API-Key', RO_KEY);
  },
  'GET /ops/deploys 422': () => request(ctx.h.app).get('/ops/deploys?state=nope').set('X-API-Key', RO_KEY),
  'GET /ops/deploys/{id} 200': async () => {
    const id = (await deployAs(ctx.h.app, { project: 'group/ci', ref: 'refs/heads/main', sha: FULL_SHA })).body.job_id as string;
    return request(ctx.h.app).get(`/ops/deploys/${id}`).set('X-API-Key', RO_KEY);
  },
  'GET /ops/deploys/{id} 404': () => request(ctx.h.app).get('/ops/deploys/nope').set('X-API-Key', RO_KEY),
  'GET /ops/projects/{project} 200': () => request(ctx.h.app).get('/ops/projects/group%2Fapp').set('X-API-Key', RO_KEY),
  'GET /ops/projects/{project} 403': () => request(ctx.h.app).get('/ops/projects/group%2Fapp').set('X-API-Key', SCOPED_KEY),
  'GET /ops/projects/{project} 404': () => request(ctx.h.app).get('/ops/projects/group%2Fnope').set('X-API-Key', RO_KEY),
  'GET /admin/queues 200': () => request(ctx.h.app).get('/admin/queues').set('X-API-Key', OP_KEY),
  'GET /admin/queues 403': () => request(ctx.h.app).get('/admin/queues').set('X-API-Key', RO_KEY),
};

function producerFor(key: string): (() => Promise<Res>) | undefined {
  if (PRODUCERS[key]) return PRODUCERS[key];
  const [method, path, status] = key.split(' ') as [string, string, string];
  return generic(method, path, Number(status));
}

const KEYS = documentedStatuses(API_ROUTES);

describe('every documented status is produced by a real request', () => {
  it('every documented status has a producer, and every producer a documented status', () => {
    expect(KEYS.filter((k) => !producerFor(k))).toEqual([]);
    expect(Object.keys(PRODUCERS).filter((k) => !KEYS.includes(k))).toEqual([]);
  });

  it.each(KEYS)('%s', async (key) => {
    const [method, path, statusText] = key.split(' ') as [string, string, string];
    const status = Number(statusText);
    const res = await producerFor(key)!();
    expect(res.status).toBe(status);
    const doc = API_ROUTES.find((r) => r.method.toUpperCase() === method && r.path === path)!.responses[status]!;
    if (status >= 400) {
      const codes = responseCodes(status, doc);
      expect({ key, body: res.body, conforms: errorSchemaFor(codes).strict().safeParse(res.body).success }).toEqual({
        key,
        body: res.body,
        conforms: true,
      });
    } else if (doc.contentType) {
      expect(res.headers['content-type']).toMatch(new RegExp(`^${doc.contentType}`));
    } else if (doc.schema && res.headers['content-type']?.startsWith('application/json')) {
      const parsed = doc.schema.safeParse(res.body);
      expect(parsed.error?.issues ?? []).toEqual([]);
    }
    for (const h of Object.keys(doc.headers ?? {})) expect(res.headers[h.toLowerCase()]).toBeDefined();
  });
});
