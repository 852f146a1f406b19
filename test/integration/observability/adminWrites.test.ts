import { afterAll, beforeAll, describe, expect, test } from '@jest/globals';
import { UnrecoverableError, Worker } from 'bullmq';
import type { Express } from 'express';
import request from 'supertest';
import { credentialId, sha256Hex } from '../../../src/shared/crypto.js';
import { JOB, QUEUE_NAME } from '../../../src/shared/jobs.js';
import { ALLOWED_BOARD_WRITES, boardRouteKey, classifyBoardRoute, readBoardRoutes } from '../../../src/routes/admin.js';
import type { OpsQueue } from '../../../src/api/queue.js';
import { createHarness, type Harness } from '../../helpers/apiHarness.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { enqueue } from '../../helpers/queueOps.js';

/**
 * Bull Board writes, over the real Bull Board routes inside createApp on a real
 * redis-server: an operator key may only retry a failed job or remove a failed job; every other
 * state-changing call Bull Board offers is refused with 403 {detail, code} and changes nothing; each
 * allowed call is audited with principal, action, job id and body digest.
 */
const OPERATOR = 'op-key-writes-0123456789';
const base = '/admin/queues';

/**
 * Every write route of Bull Board's route table, as opsgate reviewed it: refused, except the two
 * of ALLOWED_BOARD_WRITES. A Bull Board that serves another write fails the first test below
 * until someone has decided what opsgate does with it (refused unless added to the allowed set)
 * and listed it here.
 */
const REVIEWED_WRITES = [
  'PUT /api/queues/pause',
  'PUT /api/queues/resume',
  'POST /api/queues/:queueName/add',
  'PUT /api/queues/:queueName/retry/:queueStatus',
  'PUT /api/queues/:queueName/promote',
  'PUT /api/queues/:queueName/clean/:queueStatus',
  'PUT /api/queues/:queueName/pause',
  'PUT /api/queues/:queueName/resume',
  'PUT /api/queues/:queueName/concurrency',
  'PUT /api/queues/:queueName/rate-limit',
  'PUT /api/queues/:queueName/rate-limit/release',
  'PUT /api/queues/:queueName/empty',
  'PUT /api/queues/:queueName/obliterate',
  'PUT /api/queues/:queueName/job-schedulers/:schedulerId/remove',
  'PATCH /api/queues/:queueName/job-schedulers/:schedulerId',
  'PUT /api/queues/:queueName/job-schedulers/:schedulerId/run',
  'PUT /api/queues/:queueName/:jobId/retry',
  'PUT /api/queues/:queueName/:jobId/clean',
  'PUT /api/queues/:queueName/:jobId/promote',
  'PATCH /api/queues/:queueName/:jobId/update-data',
  'PATCH /api/queues/:queueName/:jobId/delay',
  'PATCH /api/queues/:queueName/:jobId/priority',
  'PUT /api/queues/:queueName/:jobId/remove-unprocessed-children',
];

describe("Bull Board's route table", () => {
  test('every write route Bull Board serves is one opsgate has reviewed', () => {
    const writes = readBoardRoutes()
      .filter((r) => classifyBoardRoute(r).write)
      .map(boardRouteKey);
    expect(writes.filter((w) => !REVIEWED_WRITES.includes(w))).toEqual([]);
    expect(REVIEWED_WRITES.filter((w) => !writes.includes(w))).toEqual([]);
  });

  test('every route that is not a GET is a write; only the allowed retry and removal are let through', () => {
    const table = readBoardRoutes();
    expect(table.some((r) => r.method === 'GET')).toBe(true);
    for (const r of table) expect({ r, write: classifyBoardRoute(r).write }).toEqual({ r, write: r.method !== 'GET' });
    const allowed = table.filter((r) => {
      const c = classifyBoardRoute(r);
      return c.write && c.allowed !== undefined;
    });
    expect(allowed.map(boardRouteKey).sort()).toEqual(Object.keys(ALLOWED_BOARD_WRITES).sort());
  });
});

describe('Bull Board: only retry/removal of failed jobs', () => {
  let redisServer: RedisServer;
  let app: Express;
  let queue: OpsQueue;
  let h: Harness;
  const ids = { failed: '', failed2: '', completed: '', delayed: '', waiting: '' };
  const data = (alertname: string) => ({ alertname, annotations: {}, audit_id: `a-${alertname}`, requested_by: 'webhook:alerts' });

  beforeAll(async () => {
    redisServer = await startRedis();
    h = await createHarness(redisServer.url, {
      env: { OPS_API_KEY_ROLES: `${OPERATOR}:operator`, ADMIN_UI_ENABLED: 'true', JOB_ATTEMPTS: '1', JOB_BACKOFF_MS: '0' },
    });
    ({ app, queue } = h);

    await queue.bull.waitUntilReady();
    // A real worker makes two dead-lettered jobs and one completed job, then stops.
    let settled = 0;
    const worker = new Worker(
      QUEUE_NAME,
      async (job) => {
        if ((job.data as { alertname: string }).alertname.startsWith('fail')) throw new UnrecoverableError('endpoint answered 400');
        return { ok: true };
      },
      { connection: { url: redisServer.url, maxRetriesPerRequest: null } },
    );
    const done = new Promise<void>((resolve) => {
      const count = () => ++settled === 3 && resolve();
      worker.on('failed', count);
      worker.on('completed', count);
    });
    ids.failed = await enqueue(queue, JOB.notifyOncall, data('fail-1'));
    ids.failed2 = await enqueue(queue, JOB.notifyOncall, data('fail-2'));
    ids.completed = await enqueue(queue, JOB.notifyOncall, data('ok-1'));
    await done;
    await worker.close();
    ids.delayed = String((await queue.bull.add(JOB.notifyOncall, data('later'), { delay: 3_600_000 })).id);
    ids.waiting = String((await queue.bull.add(JOB.notifyOncall, data('waiting'))).id);
  });

  afterAll(async () => {
    await h?.close();
    await redisServer?.destroy();
  });

  const snapshot = async () => ({
    counts: await queue.bull.getJobCounts('waiting', 'delayed', 'failed', 'completed', 'active', 'prioritized'),
    paused: await queue.bull.isPaused(),
    failedData: (await queue.bull.getJob(ids.failed))?.data as unknown,
    states: await Promise.all(Object.values(ids).map(async (id) => (await queue.bull.getJob(id))?.getState())),
  });

  test('every other state-changing Bull Board call -> 403 {detail, code}, nothing changes', async () => {
    const before = await snapshot();
    expect(before.states).toEqual(['failed', 'failed', 'completed', 'delayed', 'waiting']);
    const calls: Array<[string, string, object?]> = [
      [
        'post',
        `/api/queues/ops/add`,
        { name: JOB.restartService, data: { host: 'web-1', service: 'x', audit_id: 'fake', requested_by: 'someone-else' } },
      ],
      ['patch', `/api/queues/ops/${ids.failed}/update-data`, { data: { alertname: 'rewritten' } }],
      ['put', `/api/queues/ops/obliterate`, {}],
      ['put', `/api/queues/ops/empty`],
      ['put', `/api/queues/ops/clean/failed`],
      ['put', `/api/queues/ops/clean/completed`],
      ['put', `/api/queues/ops/pause`],
      ['put', `/api/queues/pause`],
      ['put', `/api/queues/ops/resume`],
      ['put', `/api/queues/resume`],
      ['put', `/api/queues/ops/promote`],
      ['put', `/api/queues/ops/${ids.delayed}/promote`],
      ['put', `/api/queues/ops/retry/failed`],
      ['put', `/api/queues/ops/retry/completed`],
      ['put', `/api/queues/ops/${ids.completed}/retry`],
      ['put', `/api/queues/ops/${ids.delayed}/retry`],
      ['put', `/api/queues/ops/${ids.waiting}/clean`],
      ['put', `/api/queues/ops/${ids.delayed}/clean`],
      ['put', `/api/queues/ops/${ids.completed}/clean`],
      ['put', `/api/queues/ops/clean/retry`], // "clean" read as a job id: still refused
      ['put', `/api/queues/ops/concurrency`, { concurrency: 1 }],
      ['put', `/api/queues/ops/rate-limit`, { max: 1, duration: 1000 }],
      ['patch', `/api/queues/ops/${ids.delayed}/delay`, { delay: 1 }],
      ['patch', `/api/queues/ops/${ids.delayed}/priority`, { priority: 5 }],
      ['put', `/api/queues/ops/${ids.failed}/remove-unprocessed-children`],
      ['delete', `/api/queues/ops/${ids.failed}`],
      ['post', `/api/metrics/history/purge`, {}],
    ];
    for (const [method, path, body] of calls) {
      const agent = request(app);
      const req = agent[method as 'put'](base + path).set({ 'X-API-Key': OPERATOR });
      const res = await (body ? req.send(body) : req);
      expect({ method, path, status: res.status }).toEqual({ method, path, status: 403 });
      expect(typeof res.body.detail).toBe('string');
      expect(res.body.detail).toMatch(/refused/);
      expect(res.body.code).toBe('admin_action_refused');
    }
    expect(await snapshot()).toEqual(before);
    // every refusal is an audit line (403) naming the operator key id, never the key
    const refused = h.logs().filter((l) => l.audit === true && l.status === 403);
    expect(refused).toHaveLength(calls.length);
    for (const l of refused) expect(l.who).toBe(`key:${credentialId(OPERATOR)}`);
  });

  test('every refused write route of the table, as Bull Board routes it -> 403 {detail, code}, nothing changes', async () => {
    const before = await snapshot();
    const refused = readBoardRoutes().filter((r) => {
      const c = classifyBoardRoute(r);
      return c.write && c.allowed === undefined;
    });
    expect(refused.length).toBeGreaterThan(0);
    const params: Record<string, string> = { queueName: 'ops', jobId: ids.failed, queueStatus: 'failed', schedulerId: 'nightly' };
    for (const r of refused) {
      const path = r.path.replace(/:(\w+)/g, (_m, name: string) => encodeURIComponent(params[name] ?? name));
      const method = r.method.toLowerCase() as 'put' | 'patch' | 'post';
      const agent = request(app);
      const res = await agent[method](base + path)
        .set({ 'X-API-Key': OPERATOR })
        .send({});
      expect({ route: boardRouteKey(r), status: res.status }).toEqual({ route: boardRouteKey(r), status: 403 });
      expect(res.body).toEqual({ detail: expect.stringMatching(/^refused/), code: 'admin_action_refused' });
    }
    expect(await snapshot()).toEqual(before);
  });

  test('unknown queue or job -> 404 {detail, code}', async () => {
    for (const [path, code] of [
      [`/api/queues/nope/${ids.failed}/retry`, 'queue_not_found'],
      [`/api/queues/ops/no-such-job/clean`, 'job_not_found'],
    ]) {
      const res = await request(app)
        .put(base + path)
        .set({ 'X-API-Key': OPERATOR });
      expect(res.status).toBe(404);
      expect(res.body).toEqual({ detail: expect.any(String), code });
    }
  });

  test('retry of a failed job is allowed and audited with principal, action, job id and body digest', async () => {
    const body = '{"note":"endpoint fixed"}';
    const res = await request(app)
      .put(`${base}/api/queues/ops/${ids.failed}/retry`)
      .set({ 'X-API-Key': OPERATOR, 'Content-Type': 'application/json' })
      .send(body);
    expect(res.status).toBe(204);
    expect(await (await queue.bull.getJob(ids.failed))!.getState()).toBe('waiting');
    const audit = h.logs().filter((l) => l.audit === true && l.action === 'retry' && l.status === 204);
    expect(audit).toHaveLength(1);
    expect(audit[0]).toMatchObject({
      who: `key:${credentialId(OPERATOR)}`,
      action: 'retry',
      queue: 'ops',
      job_id: ids.failed,
      job_name: JOB.notifyOncall,
      body_sha256: sha256Hex(body),
      status: 204,
      method: 'PUT',
    });
  });

  test('removal of a failed job is allowed and audited', async () => {
    const res = await request(app).put(`${base}/api/queues/ops/${ids.failed2}/clean`).set({ 'X-API-Key': OPERATOR });
    expect(res.status).toBe(204);
    expect(await queue.bull.getJob(ids.failed2)).toBeUndefined();
    const audit = h.logs().filter((l) => l.audit === true && l.action === 'remove' && l.status === 204);
    expect(audit).toHaveLength(1);
    expect(audit[0]).toMatchObject({
      who: `key:${credentialId(OPERATOR)}`,
      job_id: ids.failed2,
      body_sha256: sha256Hex(''),
      status: 204,
    });
    expect(JSON.stringify(h.logs())).not.toContain(OPERATOR);
  });
});
