import { afterAll, beforeAll, describe, expect, test } from '@jest/globals';
import { QueueEvents, Worker, UnrecoverableError } from 'bullmq';
import type { Express } from 'express';
import request from 'supertest';
import { credentialId } from '../../../src/shared/crypto.js';
import { JOB, QUEUE_NAME } from '../../../src/shared/jobs.js';
import type { OpsQueue } from '../../../src/api/queue.js';
import { createApp } from '../../../src/app.js';
import { createKubeHostStatusProvider } from '../../../src/domain/kubeHostStatus.js';
import { NoKubeConfigError } from '../../../src/shared/kubeconfig.js';
import { createLogger } from '../../../src/shared/logger.js';
import { createMetrics } from '../../../src/shared/metrics.js';
import { createHarness, type Harness } from '../../helpers/apiHarness.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { enqueue } from '../../helpers/queueOps.js';

/**
 * Bull Board at /admin/queues inside the real API app (createApp) on a real redis-server:
 * operator-only access (X-API-Key or HTTP Basic with the key as password), a dead-lettered job
 * listed with its reason, a retry through the board's API that really re-runs the job, and the
 * audit line of that retry.
 */
const OPERATOR = 'op-key-0123456789abcdef';
const READONLY = 'ro-key-0123456789abcdef';
const basic = (user: string, pass: string) => 'Basic ' + Buffer.from(`${user}:${pass}`).toString('base64');

describe('Bull Board /admin/queues', () => {
  let redisServer: RedisServer;
  let app: Express;
  let queue: OpsQueue;
  let redis: Harness['redis'];
  let worker: Worker;
  let events: QueueEvents;
  let h: Harness;
  let failUntilFlipped = true;
  let deadJobId = '';

  beforeAll(async () => {
    redisServer = await startRedis();
    h = await createHarness(redisServer.url, {
      env: {
        OPS_API_KEY_ROLES: `${OPERATOR}:operator,${READONLY}:readonly`,
        ADMIN_UI_ENABLED: 'true',
        JOB_ATTEMPTS: '1',
        JOB_BACKOFF_MS: '0',
      },
    });
    ({ app, queue, redis } = h);

    // A real BullMQ worker on the same queue: the job fails (unrecoverably -> dead-lettered) until the flag flips.
    worker = new Worker(
      QUEUE_NAME,
      async () => {
        if (failUntilFlipped) throw new UnrecoverableError('notify endpoint answered 400 Bad Request');
        return { delivered: true };
      },
      { connection: { url: redisServer.url, maxRetriesPerRequest: null } },
    );
    events = new QueueEvents(QUEUE_NAME, { connection: { url: redisServer.url } });
    await events.waitUntilReady();
    const failed = new Promise<void>((resolve) => worker.once('failed', () => resolve()));
    deadJobId = await enqueue(queue, JOB.notifyOncall, {
      alertname: 'DiskFull',
      annotations: { summary: 'disk full' },
      audit_id: 'req-1',
      requested_by: 'webhook:alerts',
    });
    await failed;
  });

  afterAll(async () => {
    await worker?.close();
    await events?.close();
    await h?.close();
    await redisServer?.destroy();
  });

  test('no credentials -> 401 JSON with a Basic challenge so a browser prompts', async () => {
    const res = await request(app).get('/admin/queues');
    expect(res.status).toBe(401);
    expect(res.headers['www-authenticate']).toMatch(/^Basic realm="opsgate"/);
    expect(res.headers['content-type']).toMatch(/application\/json/);
    expect(res.body.detail).toMatch(/authentication required/);
  });

  test.each([
    ['wrong Basic password', { Authorization: basic('admin', 'nope-nope-nope') }],
    ['malformed Basic', { Authorization: 'Basic %%%' }],
    ['Bearer is not accepted here', { Authorization: `Bearer ${OPERATOR}` }],
    ['unknown X-API-Key', { 'X-API-Key': 'unknown-key-value' }],
  ])('%s -> 401 {detail, code}, never echoing the secret', async (_name, headers) => {
    const res = await request(app).get('/admin/queues/api/queues').set(headers);
    expect(res.status).toBe(401);
    expect(res.headers['www-authenticate']).toMatch(/^Basic realm="opsgate"/);
    expect(typeof res.body.detail).toBe('string');
    expect(['malformed_credentials', 'invalid_credentials']).toContain(res.body.code);
    expect(res.text).not.toContain(OPERATOR);
  });

  test('readonly key -> 403 (X-API-Key or Basic)', async () => {
    for (const headers of [{ 'X-API-Key': READONLY }, { Authorization: basic('alice', READONLY) }]) {
      const res = await request(app).get('/admin/queues').set(headers);
      expect(res.status).toBe(403);
      expect(res.body).toEqual({ detail: 'operator role required', code: 'operator_role_required' });
    }
  });

  test('operator via HTTP Basic (any user name) gets the board page', async () => {
    const res = await request(app)
      .get('/admin/queues')
      .set({ Authorization: basic('whoever', OPERATOR) });
    expect(res.status).toBe(200);
    expect(res.headers['content-type']).toMatch(/text\/html/);
    expect(res.text).toContain('<base href="/admin/queues/"');
    expect(res.text).toMatch(/<script defer src="static\/js\/main\.[0-9a-f]+\.js"><\/script>/);
    const js = /src="(static\/js\/main\.[0-9a-f]+\.js)"/.exec(res.text)![1];
    const asset = await request(app)
      .get(`/admin/queues/${js}`)
      .set({ Authorization: basic('whoever', OPERATOR) });
    expect(asset.status).toBe(200);
    expect(asset.headers['content-type']).toMatch(/javascript/);
    // assets are behind the same gate
    expect((await request(app).get(`/admin/queues/${js}`)).status).toBe(401);
  });

  test("Bull Board's own error answers keep the fields its page reads and add detail and code", async () => {
    const res = await request(app).get('/admin/queues/api/queues/nope/1').set({ 'X-API-Key': OPERATOR });
    expect(res.status).toBe(404);
    expect(res.body).toEqual({ error: { key: 'ERRORS.QUEUE_NOT_FOUND' }, detail: 'Bull Board: queue not found', code: 'queue_not_found' });
    const job = await request(app).get('/admin/queues/api/queues/ops/no-such-job').set({ 'X-API-Key': OPERATOR });
    expect(job.status).toBe(404);
    expect(job.body).toMatchObject({ detail: 'Bull Board: job not found', code: 'job_not_found' });
  });

  test('the dead-lettered job is listed in the failed set with its reason', async () => {
    const res = await request(app).get('/admin/queues/api/queues?activeQueue=ops&status=failed&page=1').set({ 'X-API-Key': OPERATOR });
    expect(res.status).toBe(200);
    const ops = (
      res.body.queues as { name: string; counts: Record<string, number>; jobs: { id: string; failedReason: string; name: string }[] }[]
    ).find((q) => q.name === 'ops');
    expect(ops).toBeDefined();
    expect(ops!.counts.failed).toBe(1);
    const job = ops!.jobs.find((j) => j.id === deadJobId);
    expect(job?.name).toBe(JOB.notifyOncall);
    expect(job?.failedReason).toBe('notify endpoint answered 400 Bad Request');
  });

  test('readonly cannot retry (403, audited); operator retry re-runs the job and is audited', async () => {
    const denied = await request(app).put(`/admin/queues/api/queues/ops/${deadJobId}/retry`).set({ 'X-API-Key': READONLY });
    expect(denied.status).toBe(403);
    expect(await queue.jobs.get(deadJobId)).toMatchObject({ state: 'failed' });

    failUntilFlipped = false;
    const completed = new Promise<void>((resolve) => worker.once('completed', () => resolve()));
    const res = await request(app)
      .put(`/admin/queues/api/queues/ops/${deadJobId}/retry`)
      .set({ Authorization: basic('ops-person', OPERATOR), 'X-Request-Id': 'retry-req-42' });
    expect(res.status).toBe(204);
    await completed;
    expect(await queue.jobs.get(deadJobId)).toMatchObject({ state: 'completed' });

    const audit = h.logs().filter((l) => l.audit === true && l.method === 'PUT');
    const ok = audit.filter((l) => l.caller_request_id === 'retry-req-42');
    expect(ok).toHaveLength(1); // exactly one audit line per call
    expect(ok[0]).toMatchObject({
      msg: 'audit',
      role: 'operator',
      status: 204,
      method: 'PUT',
      path: `/admin/queues/api/queues/ops/${deadJobId}/retry`,
    });
    expect(ok[0]!.who).toBe(`key:${credentialId(OPERATOR)}`);
    const refused = audit.filter((l) => l.status === 403);
    expect(refused).toHaveLength(1);
    expect(refused[0]).toMatchObject({
      who: `key:${credentialId(READONLY)}`,
      role: 'readonly',
      path: `/admin/queues/api/queues/ops/${deadJobId}/retry`,
    });
    // secrets never reach a log line
    expect(JSON.stringify(h.logs())).not.toContain(OPERATOR);
    expect(JSON.stringify(h.logs())).not.toContain(READONLY);
  });

  test('a cross-site state-changing call riding on Basic credentials is refused (CSRF), same-origin is fine', async () => {
    for (const headers of [{ 'Sec-Fetch-Site': 'cross-site' }, { Origin: 'https://evil.example' }, { Origin: 'null' }]) {
      const res = await request(app)
        .put(`/admin/queues/api/queues/ops/${deadJobId}/clean`)
        .set({ Authorization: basic('ops-person', OPERATOR), ...headers });
      expect(res.status).toBe(403);
      expect(res.body).toEqual({ detail: 'cross-site request refused', code: 'cross_site_request' });
    }
    expect(await queue.jobs.get(deadJobId)).toBeDefined(); // not cleaned
    const page = await request(app)
      .get('/admin/queues')
      .set({ Authorization: basic('x', OPERATOR), 'Sec-Fetch-Site': 'cross-site' });
    expect(page.status).toBe(200); // reading (a top-level navigation) stays possible
    expect(page.headers['x-frame-options']).toBe('DENY');
    expect(page.headers['content-security-policy']).toContain("frame-ancestors 'none'");
  });

  test('ADMIN_UI_ENABLED=false: no board at all (404 JSON)', async () => {
    const off = createApp({
      config: { ...h.config, ADMIN_UI_ENABLED: false },
      redis,
      queue,
      inventory: h.inventory,
      logger: createLogger({ write: () => {} }),
      metrics: createMetrics('api', 'test', { defaults: false }),
      hostStatus: createKubeHostStatusProvider(() => {
        throw new NoKubeConfigError('none in this test');
      }),
    });
    for (const path of ['/admin/queues', '/admin/queues/api/queues']) {
      const res = await request(off).get(path).set({ 'X-API-Key': OPERATOR });
      expect(res.status).toBe(404);
      expect(typeof res.body.detail).toBe('string');
    }
  });

  test('auth failures are counted by scheme and reason', async () => {
    const text = await h.metrics.registry.metrics();
    expect(text).toMatch(/opsgate_auth_failures_total\{scheme="basic",reason="missing"\} [1-9]/);
    expect(text).toMatch(/opsgate_auth_failures_total\{scheme="basic",reason="invalid"\} [1-9]/);
    expect(text).toMatch(/opsgate_auth_failures_total\{scheme="api_key",reason="forbidden_role"\} [1-9]/);
    expect(text).toMatch(/opsgate_admin_actions_total\{method="PUT",status="204"\} 1/);
  });
});
