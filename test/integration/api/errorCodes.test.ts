import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import request from 'supertest';
import { jsonClientErrors } from '../../../src/middleware/clientError.js';
import { createRateLimiter } from '../../../src/middleware/rateLimit.js';
import { ERROR_CODES, ERROR_CODE_LIST, type ErrorCode } from '../../../src/shared/errors.js';
import { JOB } from '../../../src/shared/jobs.js';
import { SOURCES, type PushSource } from '../../../src/sources/index.js';
import { BEARER, OP_KEY, OP_KEY_2, RO_KEY, createHarness, useHarness, type Harness } from '../../helpers/apiHarness.js';
import { GUARDED_INVENTORY_YAML, decide, restartAs } from '../../helpers/guards.js';
import { enqueue } from '../../helpers/queueOps.js';
import { rawRequest } from '../../helpers/rawHttp.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { harnessSecretOf, proofHeaders, pushHeaders, wrongProofHeaders } from '../../helpers/senders.js';
import { waitFor } from '../../helpers/waitFor.js';

/**
 * One request per condition of the error catalog (src/shared/errors.ts), on a real Redis: each
 * answers its status and its code, and its body is exactly `{detail, code}`. Every code of the
 * catalog is produced here, or named below with where it is produced (a listener of its own, a
 * fault another test injects) or why it is not yet.
 */
const ctx = useHarness({ env: { ADMIN_UI_ENABLED: 'true', ALERTS_MAX_PER_REQUEST: '2' } });
let clock = Date.now(); // moved forward to expire an approval
let guarded: Harness; // the inventory with the policies of guarded changes, on a clock of this test
let bare: Harness; // no bearer token, no GitHub secret
let limited: Harness; // 1 request per minute per client
let broken: Harness; // its host-status provider throws
let down: Harness; // its Redis stopped
let downSrv: RedisServer;
let server: Server; // the guarded app behind Node's HTTP parser, as src/server.ts serves it
let scoped: Harness; // a keys file whose key is scoped to web-1
let keysDir: string;
const SCOPED_KEY = 'scoped-key-0201-abcdef';
const FULL_SHA = 'e1c5b7a0f9d3c2b1a0e9d8c7b6a5f4e3d2c1b0a9';
let port = 0;

beforeAll(async () => {
  guarded = await createHarness(ctx.srv.url, { inventoryYaml: GUARDED_INVENTORY_YAML, now: () => clock });
  bare = await createHarness(ctx.srv.url, { env: { OPS_BEARER_TOKEN: '', GITHUB_WEBHOOK_SECRET: '' } });
  keysDir = mkdtempSync(join(tmpdir(), 'opsgate-codes-'));
  writeFileSync(join(keysDir, 'keys.yaml'), `- {id: scoped, role: operator, key: ${SCOPED_KEY}, scope: {hosts: [web-1]}}\n`);
  scoped = await createHarness(ctx.srv.url, { env: { OPS_API_KEYS_FILE: join(keysDir, 'keys.yaml') } });
  limited = await createHarness(ctx.srv.url, {
    rateLimit: (d) => createRateLimiter({ ...d, rps: 1, windowMs: 60_000, keyPrefix: 'opsgate:rl-codes:' }),
  });
  broken = await createHarness(ctx.srv.url, {
    hostStatus: {
      deployments: async () => {
        throw new Error('boom');
      },
    },
  });
  downSrv = await startRedis();
  down = await createHarness(downSrv.url);
  await downSrv.stop();
  await waitFor('the stopped Redis noticed', () => down.redis.status !== 'ready' && !down.queue.isReady(), 10_000, 20);
  server = createServer({ connectionsCheckingInterval: 50, headersTimeout: 300, requestTimeout: 300 }, ctx.h.app);
  jsonClientErrors(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  port = (server.address() as AddressInfo).port;
});
afterAll(async () => {
  await new Promise((resolve) => server?.close(resolve));
  for (const h of [guarded, bare, limited, broken, down, scoped]) await h?.close();
  if (keysDir) rmSync(keysDir, { recursive: true, force: true });
  await downSrv?.destroy();
});

type Answer = { status: number; body: unknown; headers: Record<string, string | undefined> };
const source = (name: string) => SOURCES.find((s) => s.name === name)!;
const json = (r: request.Test, body: string) => r.set('Content-Type', 'application/json').send(body);
const signed = (h: Harness, name: string, body: string, extra: Record<string, string> = {}) => {
  const s = source(name) as PushSource;
  return request(h.app)
    .post(`/webhook/${name}`)
    .set({ ...pushHeaders(s, harnessSecretOf(s, h.config), body), ...extra })
    .send(body);
};
const deployAs = (app: Harness['app'], auth: Record<string, string>, body: Record<string, unknown>) =>
  json(request(app).post('/ops/deploys').set(auth), JSON.stringify(body));
const basic = (password: string) => `Basic ${Buffer.from(`someone:${password}`).toString('base64')}`;
const push = (ref: string, sha = `sha-${ref}`) => JSON.stringify({ ref, checkout_sha: sha, project: { path_with_namespace: 'group/app' } });
const raw = async (bytes: string): Promise<Answer> => {
  const r = await rawRequest(port, Buffer.from(bytes, 'latin1'), 10_000);
  return { status: r.status, body: JSON.parse(r.body), headers: r.headers };
};

/** The pending approval of a restart of `host` (its policy asks for approvals): its id. */
const pending = async (host: string, service: string, auth?: Record<string, string>) =>
  (await restartAs(guarded.app, `?host=${host}&service=${service}`, auth)).body.approval_id as string;

/**
 * Condition -> its request. The code is the one the answer carries; throw sites in the guarded
 * change pipeline (src/domain/restart.ts, deploy.ts, approvals.ts) that name no condition yet
 * answer the generic code of their class, and their row says which code their condition has.
 */
const CASES: Array<{ condition: string; status: number; code: ErrorCode; send: () => PromiseLike<Answer> }> = [
  // 400
  {
    condition: 'a body that is not JSON',
    status: 400,
    code: 'invalid_json',
    send: () => json(request(ctx.h.app).post('/ops/jobs/x/retry').set('X-API-Key', OP_KEY), '{nope'),
  },
  {
    condition: 'a request line the HTTP parser refuses',
    status: 400,
    code: 'malformed_request',
    send: () => raw('GET /ops/hosts HTTP/1.1 extra\r\n\r\n'),
  },
  {
    condition: 'a malformed Idempotency-Key',
    status: 400,
    code: 'invalid_idempotency_key',
    send: () =>
      request(ctx.h.app)
        .post('/ops/restart?host=web-1&service=checkout')
        .set('Authorization', `Bearer ${BEARER}`)
        .set('Idempotency-Key', 'k'.repeat(300)),
  },
  // 401
  { condition: 'no X-API-Key', status: 401, code: 'missing_api_key', send: () => request(ctx.h.app).get('/ops/hosts') },
  {
    condition: 'an unknown X-API-Key',
    status: 401,
    code: 'invalid_api_key',
    send: () => request(ctx.h.app).get('/ops/hosts').set('X-API-Key', 'nope'),
  },
  {
    condition: 'no bearer credentials',
    status: 401,
    code: 'missing_credentials',
    send: () => request(ctx.h.app).post('/ops/restart?host=web-1&service=checkout'),
  },
  {
    condition: 'another scheme than Bearer',
    status: 401,
    code: 'unsupported_auth_scheme',
    send: () => request(ctx.h.app).post('/ops/restart?host=web-1&service=checkout').set('Authorization', `Basic ${BEARER}`),
  },
  {
    condition: 'a wrong bearer token',
    status: 401,
    code: 'invalid_bearer_token',
    send: () => request(ctx.h.app).post('/ops/restart?host=web-1&service=checkout').set('Authorization', 'Bearer wrong'),
  },
  {
    condition: 'no bearer token configured',
    status: 401,
    code: 'bearer_not_configured',
    send: () => request(bare.app).post('/ops/restart?host=web-1&service=checkout').set('Authorization', `Bearer ${BEARER}`),
  },
  {
    condition: 'Bull Board: an Authorization that is not Basic',
    status: 401,
    code: 'malformed_credentials',
    send: () => request(ctx.h.app).get('/admin/queues').set('Authorization', `Bearer ${OP_KEY}`),
  },
  {
    condition: 'Bull Board: an unknown key as password',
    status: 401,
    code: 'invalid_credentials',
    send: () => request(ctx.h.app).get('/admin/queues').set('Authorization', basic('nope')),
  },
  // 403
  {
    condition: 'a readonly key on an operator route',
    status: 403,
    code: 'operator_role_required',
    send: () => request(ctx.h.app).delete('/ops/cache').set('X-API-Key', RO_KEY),
  },
  {
    condition: 'Bull Board: a write from another site',
    status: 403,
    code: 'cross_site_request',
    send: () =>
      request(ctx.h.app)
        .put('/admin/queues/api/queues/ops/pause')
        .set('Authorization', basic(OP_KEY))
        .set('Origin', 'https://evil.example'),
  },
  {
    condition: 'Bull Board: a write it is not let to make',
    status: 403,
    code: 'admin_action_refused',
    send: () => request(ctx.h.app).put('/admin/queues/api/queues/ops/pause').set('X-API-Key', OP_KEY),
  },
  {
    condition: "a sender's secret not configured",
    status: 403,
    code: 'webhook_secret_not_configured',
    send: () => request(bare.app).post('/webhook/github').set('X-GitHub-Event', 'push').send('{}'),
  },
  {
    condition: "a sender's token missing",
    status: 403,
    code: 'missing_webhook_token',
    send: () => request(ctx.h.app).post('/webhook/scm').set('X-Scm-Event', 'Push Hook').send(push('refs/heads/main')),
  },
  {
    condition: "a sender's token wrong",
    status: 403,
    code: 'invalid_webhook_token',
    send: () => request(ctx.h.app).post('/webhook/scm').set('X-Scm-Token', 'wrong').send(push('refs/heads/main')),
  },
  {
    condition: 'a signature missing',
    status: 403,
    code: 'missing_signature',
    send: () => request(ctx.h.app).post('/webhook/github').set('X-GitHub-Event', 'push').send('{}'),
  },
  {
    condition: 'a signature without its prefix',
    status: 403,
    code: 'malformed_signature',
    send: () => request(ctx.h.app).post('/webhook/github').set('X-Hub-Signature-256', 'md5=00').send('{}'),
  },
  {
    condition: 'a signature that does not match',
    status: 403,
    code: 'invalid_signature',
    send: () =>
      request(ctx.h.app)
        .post('/webhook/github')
        .set(wrongProofHeaders(source('github'), '{}'))
        .send('{}'),
  },
  {
    condition: 'a timestamped signature 10 minutes old',
    status: 403,
    code: 'stale_signature',
    send: () => {
      const body = JSON.stringify({ project: 'group/app', ref: 'refs/heads/main', sha: 'stale' });
      const s = source('generic');
      return request(ctx.h.app)
        .post('/webhook/generic')
        .set(proofHeaders(s, harnessSecretOf(s, ctx.h.config), body, Date.now() - 600_000))
        .send(body);
    },
  },
  {
    condition: 'a timestamped signature used twice',
    status: 403,
    code: 'replayed_signature',
    send: async () => {
      const body = JSON.stringify({ project: 'group/app', ref: 'refs/heads/main', sha: 'twice' });
      const s = source('generic');
      const headers = { ...pushHeaders(s as PushSource, harnessSecretOf(s, ctx.h.config), body) };
      expect((await request(ctx.h.app).post('/webhook/generic').set(headers).send(body)).status).toBe(202);
      return request(ctx.h.app).post('/webhook/generic').set(headers).send(body);
    },
  },
  {
    condition: 'the requester approving their own change',
    status: 403,
    code: 'self_approval',
    send: async () => decide(guarded.app, await pending('pay-1', 'api', { 'X-API-Key': OP_KEY }), 'approve', OP_KEY),
  },
  {
    condition: 'a host outside the scope of a keys-file key',
    status: 403,
    code: 'out_of_scope',
    send: () => request(scoped.app).post('/ops/restart?host=db-1&service=postgres-exporter').set('X-API-Key', SCOPED_KEY),
  },
  {
    condition: 'override=true from the shared bearer token',
    status: 403,
    code: 'override_not_allowed',
    send: () => restartAs(ctx.h.app, '?host=web-1&service=frontend&override=true&reason=x'),
  },
  {
    condition: 'the shared bearer token on POST /ops/deploys',
    status: 403,
    code: 'bearer_token_not_accepted',
    send: () => deployAs(ctx.h.app, { Authorization: `Bearer ${BEARER}` }, { project: 'group/ci', ref: 'refs/heads/main', sha: FULL_SHA }),
  },
  // 404
  { condition: 'no route', status: 404, code: 'not_found', send: () => request(ctx.h.app).get('/nope') },
  {
    condition: 'a host not in the inventory',
    status: 404,
    code: 'unknown_host',
    send: () => request(ctx.h.app).get('/ops/hosts/nope').set('X-API-Key', RO_KEY),
  },
  {
    condition: 'a service not of that host',
    status: 404,
    code: 'unknown_service',
    send: () => request(ctx.h.app).post('/ops/restart?host=web-1&service=nope').set('Authorization', `Bearer ${BEARER}`),
  },
  {
    condition: 'a deploy of a project not in the inventory',
    status: 404,
    code: 'unknown_project',
    send: () => deployAs(ctx.h.app, { 'X-API-Key': OP_KEY }, { project: 'group/nope', ref: 'refs/heads/main', sha: FULL_SHA }),
  },
  {
    condition: 'an unknown job',
    status: 404,
    code: 'job_not_found',
    send: () => request(ctx.h.app).get('/ops/jobs/nope').set('X-API-Key', RO_KEY),
  },
  {
    condition: 'an unknown approval',
    status: 404,
    code: 'approval_not_found',
    send: () => request(guarded.app).get('/ops/approvals/apr-00000000000000000000').set('X-API-Key', RO_KEY),
  },
  {
    condition: 'an unknown delivery',
    status: 404,
    code: 'delivery_not_found',
    send: () => request(ctx.h.app).get('/ops/deliveries/scm.1-0').set('X-API-Key', RO_KEY),
  },
  {
    condition: 'an unknown freeze',
    status: 404,
    code: 'freeze_not_found',
    send: () => request(guarded.app).get('/ops/freezes/frz-0000000000000000').set('X-API-Key', RO_KEY),
  },
  {
    condition: 'an unknown deploy',
    status: 404,
    code: 'deploy_not_found',
    send: () => request(ctx.h.app).get('/ops/deploys/no-such-deploy').set('X-API-Key', RO_KEY),
  },
  {
    condition: 'a project neither the inventory nor the history knows',
    status: 404,
    code: 'project_not_found',
    send: () => request(ctx.h.app).get('/ops/projects/group%2Fnope').set('X-API-Key', RO_KEY),
  },
  {
    condition: 'Bull Board: an unknown queue',
    status: 404,
    code: 'queue_not_found',
    send: () => request(ctx.h.app).put('/admin/queues/api/queues/nope/1/retry').set('X-API-Key', OP_KEY),
  },
  // 405, 408
  {
    condition: 'a method the path does not serve',
    status: 405,
    code: 'method_not_allowed',
    send: () => request(ctx.h.app).put('/ops/hosts').set('X-API-Key', RO_KEY),
  },
  {
    condition: 'a request whose headers never end',
    status: 408,
    code: 'request_timeout',
    send: () => raw('GET /ops/hosts HTTP/1.1\r\nHost: x\r\n'),
  },
  // 409
  {
    condition: 'a restart refused by a freeze',
    status: 409,
    code: 'change_refused',
    send: async () => {
      const f = await json(
        request(guarded.app).post('/ops/freezes').set('X-API-Key', OP_KEY),
        JSON.stringify({ scope: 'namespace', namespace: 'shop', reason: 'r', duration: '1h' }),
      );
      expect([f.status, f.body]).toEqual([201, expect.objectContaining({ in_force: true })]);
      try {
        return await restartAs(guarded.app, '?host=web-1&service=frontend');
      } finally {
        await json(request(guarded.app).delete(`/ops/freezes/${f.body.id}`).set('X-API-Key', OP_KEY), '{"reason":"done"}');
      }
    },
  },
  {
    condition: 'an approval already decided',
    status: 409,
    code: 'approval_decided',
    send: async () => {
      const id = await pending('pay-1', 'ledger', { 'X-API-Key': OP_KEY_2 });
      await decide(guarded.app, id, 'approve', OP_KEY);
      return decide(guarded.app, id, 'approve', OP_KEY);
    },
  },
  {
    condition: 'an approval expired',
    status: 409,
    code: 'approval_expired',
    send: async () => {
      const id = await pending('pay-1', 'ledger');
      clock += 2 * 3600_000;
      return decide(guarded.app, id, 'approve', OP_KEY);
    },
  },
  {
    condition: 'the same operator approving twice',
    status: 409,
    code: 'duplicate_approval',
    send: async () => {
      const id = await pending('vault-1', 'core');
      await decide(guarded.app, id, 'approve', OP_KEY);
      return decide(guarded.app, id, 'approve', OP_KEY);
    },
  },
  {
    condition: 'a retry of a job that is not failed',
    status: 409,
    code: 'job_not_failed',
    send: async () => {
      const id = await enqueue(ctx.h.queue, JOB.notifyOncall, { alertname: 'x', annotations: {}, audit_id: 'a', requested_by: 'b' });
      return json(request(ctx.h.app).post(`/ops/jobs/${id}/retry`).set('X-API-Key', OP_KEY), '{"reason":"r"}');
    },
  },
  {
    condition: 'a replay of a delivery that reached no push',
    status: 409,
    code: 'delivery_not_replayable',
    send: async () => {
      expect(
        (
          await request(ctx.h.app)
            .post('/webhook/scm')
            .set('X-Scm-Token', ctx.h.config.SCM_WEBHOOK_SECRET as string)
            .set('X-Scm-Event', 'Tag Push Hook')
            .send(push('refs/heads/main'))
        ).status,
      ).toBe(202);
      const id = await waitFor(
        'the ignored delivery',
        async () =>
          (await request(ctx.h.app).get('/ops/deliveries?verdict=not_a_push').set('X-API-Key', RO_KEY)).body.deliveries[0]?.id as
            string | undefined,
      );
      return json(request(ctx.h.app).post(`/ops/deliveries/${id}/replay`).set('X-API-Key', OP_KEY), '{"reason":"r"}');
    },
  },
  {
    condition: 'a CI deploy of a project that deploys from pushes',
    status: 409,
    code: 'deploy_source_refused',
    send: () => deployAs(ctx.h.app, { 'X-API-Key': OP_KEY }, { project: 'group/app', ref: 'refs/heads/main', sha: FULL_SHA }),
  },
  {
    condition: 'a rollback to a commit that never succeeded in the history',
    status: 409,
    code: 'rollback_target_unknown',
    send: () =>
      json(
        request(ctx.h.app).post('/ops/deploys/rollback').set('X-API-Key', OP_KEY),
        JSON.stringify({ project: 'group/app', ref: 'refs/heads/main', to: FULL_SHA, reason: 'r' }),
      ),
  },
  // 413, 415
  {
    condition: 'a body over BODY_LIMIT',
    status: 413,
    code: 'payload_too_large',
    send: () => json(request(ctx.h.app).post('/webhook/alerts'), 'x'.repeat(1024 * 1024 + 10)),
  },
  {
    condition: 'more alerts than ALERTS_MAX_PER_REQUEST',
    status: 413,
    code: 'too_many_alerts',
    send: () => json(request(ctx.h.app).post('/webhook/alerts'), JSON.stringify({ alerts: [{}, {}, {}] })),
  },
  {
    condition: 'a Content-Encoding not read',
    status: 415,
    code: 'unsupported_encoding',
    send: () => request(ctx.h.app).post('/webhook/alerts').set('Content-Encoding', 'br-unknown').send('{"alerts":[]}'),
  },
  // 422
  {
    condition: 'a bad query parameter',
    status: 422,
    code: 'invalid_query',
    send: () => request(ctx.h.app).get('/ops/jobs?state=nope').set('X-API-Key', RO_KEY),
  },
  {
    condition: 'a bad body field',
    status: 422,
    code: 'invalid_body',
    send: () => json(request(ctx.h.app).post('/ops/jobs/x/retry').set('X-API-Key', OP_KEY), '{}'),
  },
  {
    condition: 'a cursor not of this list',
    status: 422,
    code: 'invalid_cursor',
    send: () => request(ctx.h.app).get('/ops/jobs?cursor=nope').set('X-API-Key', RO_KEY),
  },
  {
    condition: "a payload not of the sender's shape",
    status: 422,
    code: 'invalid_payload',
    send: () => signed(ctx.h, 'bitbucket', JSON.stringify({ push: { changes: {} } })),
  },
  {
    condition: 'a push without its commit',
    status: 422,
    code: 'missing_commit',
    send: () => signed(ctx.h, 'scm', JSON.stringify({ ref: 'refs/heads/main' })),
  },
  {
    condition: 'a delivery id too long',
    status: 422,
    code: 'invalid_delivery_id',
    send: () => signed(ctx.h, 'github', JSON.stringify((source('github') as PushSource).example), { 'X-GitHub-Delivery': 'd'.repeat(200) }),
  },
  {
    condition: 'an alert payload without an alerts array',
    status: 422,
    code: 'invalid_alerts',
    send: () => json(request(ctx.h.app).post('/webhook/alerts'), '{"alerts":{}}'),
  },
  {
    condition: 'JSON nested too deep',
    status: 422,
    code: 'payload_too_deep',
    send: () => json(request(ctx.h.app).post('/webhook/alerts'), '['.repeat(100) + ']'.repeat(100)),
  },
  {
    condition: 'an Idempotency-Key used for another target',
    status: 422,
    code: 'idempotency_key_reused',
    send: async () => {
      const r = (service: string) =>
        request(ctx.h.app)
          .post(`/ops/restart?host=web-1&service=${service}`)
          .set('Authorization', `Bearer ${BEARER}`)
          .set('Idempotency-Key', 'chg-1');
      expect((await r('frontend')).status).toBe(200);
      return r('checkout');
    },
  },
  {
    condition: 'a CI deploy of a ref the project does not deploy',
    status: 422,
    code: 'ref_not_deployable',
    send: () => deployAs(ctx.h.app, { 'X-API-Key': OP_KEY }, { project: 'group/ci', ref: 'refs/heads/dev', sha: FULL_SHA }),
  },
  // 429
  {
    condition: 'over the rate limit',
    status: 429,
    code: 'rate_limited',
    send: async () => {
      await request(limited.app).get('/version');
      return request(limited.app).get('/version');
    },
  },
  {
    condition: "the namespace's restart budget spent",
    status: 429,
    code: 'budget_exhausted',
    send: async () => {
      for (const service of ['reports', 'exports', 'imports'])
        expect((await restartAs(guarded.app, `?host=batch-1&service=${service}`)).status).toBe(200);
      return restartAs(guarded.app, '?host=batch-1&service=sync');
    },
  },
  // 431, 500, 503
  {
    condition: 'headers over the HTTP parser limit',
    status: 431,
    code: 'headers_too_large',
    send: () => raw(`GET /ops/hosts HTTP/1.1\r\nX-Big: ${'x'.repeat(20_000)}\r\n\r\n`),
  },
  {
    condition: 'an unexpected error',
    status: 500,
    code: 'internal_error',
    send: () => request(broken.app).get('/ops/hosts/web-1').set('X-API-Key', RO_KEY),
  },
  {
    condition: 'Redis unreachable',
    status: 503,
    code: 'redis_unavailable',
    send: () => request(down.app).get('/ops/approvals').set('X-API-Key', RO_KEY),
  },
  {
    condition: 'the queue unreachable',
    status: 503,
    code: 'queue_unavailable',
    send: () => request(down.app).get('/ops/jobs').set('X-API-Key', RO_KEY),
  },
  {
    condition: 'no Kubernetes cluster',
    status: 503,
    code: 'cluster_unavailable',
    send: () => request(ctx.h.app).get('/ops/hosts/web-1').set('X-API-Key', RO_KEY),
  },
];

/** Codes no row here produces, and where they are. */
const ELSEWHERE: Partial<Record<ErrorCode, string>> = {
  bad_request:
    "Bull Board's own 400 answers, and a router's 400 with no condition of its own (src/routes/admin.ts, src/middleware/errors.ts)",
  conflict: "Bull Board's own 409 answers (src/routes/admin.ts)",
  unprocessable: "Bull Board's own 422 answers, the class default for a condition not yet named (src/shared/errors.ts)",
  api_key_expired: 'test/integration/api/keyLifetime.test.ts (a keys file with an expiry)',
  invalid_commit: 'test/integration/api/commitIds.test.ts (a vendor push whose commit is not hex)',
  client_certificate_required: 'test/integration/api/tls.test.ts (HTTPS with TLS_CLIENT_CA_FILE)',
  untrusted_client_certificate: 'test/integration/api/tls.test.ts',
  client_certificate_not_allowed: 'an allow-list of client certificate names (src/middleware/clientCert.ts)',
  restart_in_progress: 'test/integration/observability/adminRetryRule.test.ts (a dead-lettered restart whose Deployment is busy)',
  superseded: 'test/e2e/controlplane/deployOrder.test.ts (a retry, a replay and the last approval of a deploy after a newer one started)',
  queue_unconfirmed: 'test/integration/api/unavailableWording.test.ts (a paused Redis)',
  not_replicated: 'test/integration/api/replicaAck.test.ts (REDIS_MIN_REPLICAS_ACK without replicas)',
  event_loop_blocked: "test/integration/worker/livez.test.ts (the worker's /livez)",
  request_aborted: 'the client is gone before the answer',
  content_length_mismatch: 'the client is gone before the answer',
  guards_unavailable: 'an app built without guards (createApp always has them)',
  approval_changed: 'a pending approval decided between its join and its read (a race)',
  nothing_to_decide: 'an approval script verdict no request makes',
  invalid_job_data: 'job data the route schemas already refuse',
  invalid_oidc_token: 'test/integration/api/oidc.test.ts (tokens of an issuer the test runs)',
  oidc_no_matching_rule: 'test/integration/api/oidc.test.ts',
  oidc_token_lifetime_exceeded: 'test/integration/api/oidc.test.ts (a token valid for longer than its issuer allows)',
  deploy_not_bound_to_token: 'test/integration/api/oidc.test.ts (a deploy body disagreeing with the token)',
  oidc_issuer_unavailable: 'test/integration/api/oidc.test.ts (a listed issuer that cannot be reached)',
};

describe('every condition answers its status and code, body exactly {detail, code}', () => {
  it.each(CASES.map((c) => [c.condition, c] as const))('%s', async (_name, c) => {
    const res = await c.send();
    expect({ status: res.status, body: res.body }).toEqual({ status: c.status, body: { detail: expect.any(String), code: c.code } });
    expect(ERROR_CODES[c.code].status).toBe(c.status);
  });

  it('covers the catalog: each code is a row here, or named with where it is produced', () => {
    const here = new Set<ErrorCode>(CASES.map((c) => c.code));
    const missing = ERROR_CODE_LIST.filter((c) => !here.has(c) && ELSEWHERE[c] === undefined);
    expect(missing).toEqual([]);
    // and nothing is said to be elsewhere that a row produces
    expect(Object.keys(ELSEWHERE).filter((c) => here.has(c as ErrorCode))).toEqual([]);
  });
});
