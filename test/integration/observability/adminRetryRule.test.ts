import { afterAll, beforeAll, describe, expect, test } from '@jest/globals';
import { UnrecoverableError, Worker } from 'bullmq';
import type { Express } from 'express';
import request from 'supertest';
import { coalesceId } from '../../../src/changes/restart.js';
import { JOB, QUEUE_NAME } from '../../../src/shared/jobs.js';
import { restartedAtKey } from '../../../src/shared/keys.js';
import type { OpsQueue } from '../../../src/api/queue.js';
import { createHarness, type Harness } from '../../helpers/apiHarness.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { enqueue } from '../../helpers/queueOps.js';

/**
 * A retry from Bull Board follows the same domain rule as POST /ops/jobs/{id}/retry, over the real
 * Bull Board HTTP API (PUT /admin/queues/api/queues/ops/<id>/retry) inside createApp on a real
 * redis-server: restart R1 of shop/storefront is dead-lettered while restart R2 of the same
 * Deployment waits -> both retries are refused (409) and R1 stays failed; once nothing else holds
 * the Deployment, the board's retry re-queues R1 with the API's bookkeeping (the Deployment's
 * coalescing slot taken by R1, its restartedAt record dropped).
 */
const OPERATOR = 'op-key-retry-rule-0123456789';
const board = (id: string) => `/admin/queues/api/queues/ops/${id}/retry`;
const data = (n: string) => ({ host: 'web-1', service: 'storefront', audit_id: `a-${n}`, requested_by: 'key:test' });
const slot = coalesceId('shop', 'storefront');

describe('Bull Board retry goes through the API retry rule', () => {
  let redisServer: RedisServer;
  let app: Express;
  let queue: OpsQueue;
  let redis: Harness['redis'];
  let h: Harness;

  const restart = (id: string) => enqueue(queue, JOB.restartService, data(id), { jobId: id, deduplication: { id: slot } });
  const state = async (id: string) => (await queue.bull.getJob(id))?.getState();
  const holder = () => redis.get(`${queue.bull.toKey('de')}:${slot}`);

  beforeAll(async () => {
    redisServer = await startRedis();
    h = await createHarness(redisServer.url, {
      env: { OPS_API_KEY_ROLES: `${OPERATOR}:operator`, ADMIN_UI_ENABLED: 'true', JOB_ATTEMPTS: '1', JOB_BACKOFF_MS: '0' },
    });
    ({ app, queue, redis } = h);

    // R1 is dead-lettered by a real worker (which stops before R2 is queued, so R2 stays waiting).
    const worker = new Worker(
      QUEUE_NAME,
      async () => {
        throw new UnrecoverableError('rollout failed');
      },
      { connection: { url: redisServer.url, maxRetriesPerRequest: null } },
    );
    const failed = new Promise<void>((resolve) => worker.once('failed', () => resolve()));
    await restart('R1');
    await failed;
    await worker.close();
    await redis.set(restartedAtKey('R1'), '2026-01-01T00:00:00Z');
    expect(await restart('R2')).toBe('R2');
    expect(await state('R1')).toBe('failed');
    expect(await state('R2')).toBe('waiting');
  });

  afterAll(async () => {
    await h?.close();
    await redisServer?.destroy();
  });

  test('R2 waiting for the same Deployment: the board refuses to retry R1 (409 {detail, code}), like the API', async () => {
    const api = await request(app)
      .post('/ops/jobs/R1/retry')
      .set('X-API-Key', OPERATOR)
      .set('Content-Type', 'application/json')
      .send('{"reason":"r"}');
    expect(api.status).toBe(409);
    expect(api.body.code).toBe('restart_in_progress');
    const res = await request(app).put(board('R1')).set('X-API-Key', OPERATOR);
    expect(res.status).toBe(409);
    expect(res.body.code).toBe('restart_in_progress');
    expect(res.body.detail).toMatch(/another restart of this Deployment is waiting or rolling out \(job R2\)/);
    expect(await state('R1')).toBe('failed');
    expect(await holder()).toBe('R2');
    expect(await redis.get(restartedAtKey('R1'))).not.toBeNull();
    const audit = h.logs().filter((l) => l.msg === 'audit' && l.path === board('R1'));
    expect(audit).toHaveLength(1);
    expect(audit[0]).toMatchObject({ status: 409, action: 'retry', job_id: 'R1' });
  });

  test('nothing else holds the Deployment: the board retries R1 with the same bookkeeping as the API (204)', async () => {
    await queue.bull.remove('R2');
    expect(await holder()).toBeNull(); // BullMQ drops a removed job's record with it
    const res = await request(app).put(board('R1')).set('X-API-Key', OPERATOR);
    expect(res.status).toBe(204);
    // R1 is replaced by its retry, R1.retry, which holds the Deployment's coalescing record: a new
    // restart joins it instead of queuing a second one
    expect(await state('R1')).toBeUndefined();
    expect(await state('R1.retry')).toBe('waiting');
    expect(await holder()).toBe('R1.retry');
    expect(await restart('R3')).toBe('R1.retry');
    // and R1's restartedAt record is dropped, so its next run restarts the Deployment anew
    expect(await redis.get(restartedAtKey('R1'))).toBeNull();
    expect(h.logs().some((l) => l.msg === 'dead-lettered job retried' && l.job_id === 'R1')).toBe(true);
  });
});
