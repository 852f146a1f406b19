/**
 * What the claim protocol (src/domain/claim.ts) relies on from BullMQ's own deduplication,
 * checked on a real redis-server with a real Worker:
 * - with a ttl, the deduplication key survives the job's completion AND the removal of the
 *   completed job by the retention policy, for the whole ttl: an add with the same deduplication
 *   id answers the first job's id and makes no job;
 * - without a ttl it is removed at completion (so BullMQ's deduplication alone, in its simple
 *   mode, would let a redelivery after the job finished deploy again);
 * - so a seen record left "p:<id>" (a crash after the add, a lost reply) is completed by a
 *   re-add that can never make a second job, even when the job itself is long gone.
 */
import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { Queue, Worker } from 'bullmq';
import { Redis } from 'ioredis';
import { claimAndEnqueue, PENDING, QUEUED } from '../../../src/domain/claim.js';
import { JOB } from '../../../src/shared/jobs.js';
import { silentLogger } from '../../../src/shared/logger.js';
import { createOpsQueue, type OpsQueue } from '../../../src/shared/queue.js';
import { createRedis } from '../../../src/shared/redis.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';

let server: RedisServer;
let admin: Redis;

beforeAll(async () => {
  server = await startRedis();
  admin = new Redis(server.url);
});
beforeEach(async () => {
  await admin.flushall();
});
afterAll(async () => {
  admin?.disconnect();
  await server?.destroy();
});

async function waitFor(cond: () => Promise<boolean>, ms = 20_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** Runs one queue + worker that completes every job and removes it at once (retention count 0). */
async function withQueue(fn: (q: Queue) => Promise<void>): Promise<void> {
  const connection = new Redis(server.url, { maxRetriesPerRequest: null });
  const q = new Queue('dedup-probe', { connection, defaultJobOptions: { removeOnComplete: true } });
  const workerConnection = new Redis(server.url, { maxRetriesPerRequest: null });
  const w = new Worker('dedup-probe', async () => 'done', { connection: workerConnection });
  try {
    await fn(q);
  } finally {
    await w.close();
    await q.close();
    connection.disconnect();
    workerConnection.disconnect();
  }
}

describe("BullMQ's deduplication key", () => {
  it('with a ttl: survives completion and retention removal of the job for the whole window', async () => {
    await withQueue(async (q) => {
      const ttl = 86_400_000;
      const first = await q.add('x', {}, { jobId: 'first', deduplication: { id: 'scm:p:main:abc', ttl } });
      await waitFor(async () => (await admin.exists('bull:dedup-probe:first')) === 0); // completed and removed
      expect(await admin.get('bull:dedup-probe:de:scm:p:main:abc')).toBe('first');
      expect(await admin.pttl('bull:dedup-probe:de:scm:p:main:abc')).toBeGreaterThan(ttl - 60_000);
      const again = await q.add('x', {}, { jobId: 'second', deduplication: { id: 'scm:p:main:abc', ttl } });
      expect(again.id).toBe(first.id);
      expect(await admin.exists('bull:dedup-probe:second')).toBe(0);
    });
  });

  it('without a ttl: removed when the job completes (simple mode alone would not cover the 24 h window)', async () => {
    await withQueue(async (q) => {
      await q.add('x', {}, { jobId: 'a', deduplication: { id: 'simple' } });
      await waitFor(async () => (await admin.exists('bull:dedup-probe:a')) === 0);
      expect(await admin.exists('bull:dedup-probe:de:simple')).toBe(0);
      const again = await q.add('x', {}, { jobId: 'b', deduplication: { id: 'simple' } });
      expect(again.id).toBe('b');
    });
  });
});

describe('claim protocol on top of it', () => {
  let redis: Redis;
  let queue: OpsQueue;
  beforeAll(async () => {
    redis = createRedis(server.url, 'request', 'dedup-claim');
    queue = createOpsQueue({ url: server.url, policy: { attempts: 1, backoffMs: 10 }, logger: silentLogger });
    await queue.bull.waitUntilReady();
  });
  afterAll(async () => {
    await queue?.close();
    redis?.disconnect();
  });
  const key = 'opsgate:seen:scm:team/app:refs/heads/main:d1';
  const claim = () =>
    claimAndEnqueue(
      { redis, queue, logger: silentLogger },
      {
        key,
        ttlSeconds: 86400,
        name: JOB.runDeployPipeline,
        data: { project: 'team/app', ref: 'refs/heads/main', audit_id: 'a', requested_by: 'webhook:scm' },
        what: 'd1',
      },
    );

  it('a record left pending after its job was added, completed and removed gets no second job', async () => {
    const first = await claim();
    expect(first.accepted).toBe(true);
    expect(await admin.get(key)).toBe(QUEUED + first.jobId);
    // The job ran and was removed by retention long ago; the record says "p:" (its mark was lost).
    await admin.del(`bull:ops:${first.jobId}`);
    await admin.lrem('bull:ops:wait', 0, first.jobId!);
    await admin.set(key, PENDING + first.jobId, 'KEEPTTL');
    const out = await claim();
    expect(out).toMatchObject({ accepted: false, duplicate: true, jobId: first.jobId, completedClaim: true });
    expect(await admin.exists(`bull:ops:${first.jobId}`)).toBe(0);
    expect(await queue.bull.getJobCountByTypes('waiting', 'active', 'completed')).toBe(0);
    expect(await admin.get(key)).toBe(QUEUED + first.jobId);
  });

  it('a reply lost after the add (record released, sender retries under a new claim) answers the first job, no second one', async () => {
    const first = await claim();
    await admin.del(key); // what rule 9 does when the add's reply never came back
    const retry = await claim();
    expect(retry).toMatchObject({ accepted: false, duplicate: true, jobId: first.jobId });
    expect(await queue.bull.getJobCountByTypes('waiting')).toBe(1);
    expect(await admin.get(key)).toBe(QUEUED + first.jobId);
  });
});
