import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { QueueUnavailableError, RestartNotConfirmedError } from '../../../src/shared/errors.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { createHarness, eventually, OP_KEY, RO_KEY, useHarness, type Harness } from '../../helpers/apiHarness.js';

/**
 * A 503 from the queue says what the operation was: a read (GET /ops/jobs...) submitted nothing,
 * so it never says "did not confirm the submission" or "may still be queued". The queue runs on its
 * own redis-server, frozen with SIGSTOP (commands time out: the fate of a write would be unknown)
 * or stopped (nothing is sent).
 */
const ctx = useHarness();

describe('503 wording by operation', () => {
  let queueSrv: RedisServer;
  let h: Harness;
  beforeAll(async () => {
    queueSrv = await startRedis();
    h = await createHarness(ctx.srv.url, { queueUrl: queueSrv.url });
    await h.queue.bull.waitUntilReady();
  });
  afterAll(async () => {
    queueSrv?.resume?.();
    await h?.close();
    await queueSrv?.destroy();
  });

  const reads = () => [
    request(h.app).get('/ops/jobs?state=failed').set('X-API-Key', RO_KEY),
    request(h.app).get('/ops/jobs/some-job').set('X-API-Key', RO_KEY),
  ];

  it('reads while the queue Redis is frozen: 503 "did not answer in time; nothing was changed", never a submission', async () => {
    queueSrv.pause();
    let answers;
    try {
      answers = await Promise.all(reads());
    } finally {
      queueSrv.resume();
    }
    for (const res of answers) {
      expect(res.status).toBe(503);
      expect(res.headers['retry-after']).toBe('5');
      expect(res.body).toEqual({ detail: 'job queue did not answer in time; nothing was changed; retry later', code: 'queue_unavailable' });
    }
  });

  it('reads while the queue Redis is down: 503 "nothing was read or changed"', async () => {
    await queueSrv.stop();
    try {
      await eventually(async () => !h.queue.isReady());
      for (const res of await Promise.all(reads())) {
        expect(res.status).toBe(503);
        expect(res.body.detail).toBe('job queue unavailable; nothing was read or changed; retry later');
      }
      const retry = await request(h.app)
        .post('/ops/jobs/some-job/retry')
        .set('X-API-Key', OP_KEY)
        .set('Content-Type', 'application/json')
        .send('{"reason":"r"}');
      expect(retry.status).toBe(503);
      expect(retry.body.detail).not.toMatch(/submission|queued/);
    } finally {
      await queueSrv.start();
    }
  });

  it('the catalog words each kind of operation, in its one place', () => {
    expect(new QueueUnavailableError('read', true).detail).toBe('job queue did not answer in time; nothing was changed; retry later');
    expect(new QueueUnavailableError('submit', true).detail).toMatch(/did not confirm the submission in time; it may still be queued/);
    expect(new QueueUnavailableError('submit').detail).toBe('job queue unavailable; nothing was queued; retry later');
    expect(new QueueUnavailableError('retry', true).detail).toMatch(
      /did not confirm the retry in time; it may still take effect.*repeating it is safe/,
    );
    expect(new RestartNotConfirmedError(true).detail).toMatch(/same Idempotency-Key/);
  });
});
