/**
 * src/domain/claim.ts on a real redis-server and the real BullMQ producer: the seen record and
 * the enqueue cannot be separated by a crash any more. The crash itself is exercised with real
 * processes in faults.test.ts (API SIGKILLed under load); here each state is set up exactly.
 */
import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { claimAndEnqueue, PENDING, QUEUED } from '../../../src/domain/claim.js';
import { JOB } from '../../../src/shared/jobs.js';
import { silentLogger } from '../../../src/shared/logger.js';
import { createOpsQueue, type OpsQueue } from '../../../src/shared/queue.js';
import { createRedis } from '../../../src/shared/redis.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';

let server: RedisServer;
let redis: Redis;
let admin: Redis;
let queue: OpsQueue;

const data = (sha: string) => ({
  project: 'team/app',
  ref: 'refs/heads/main',
  event_id: `scm:team/app:refs/heads/main:${sha}`,
  audit_id: 'req-1',
  requested_by: 'webhook:scm',
});
const claim = (sha: string) =>
  claimAndEnqueue(
    { redis, queue, logger: silentLogger },
    { key: `opsgate:seen:scm:team/app:refs/heads/main:${sha}`, ttlSeconds: 86400, name: JOB.runDeployPipeline, data: data(sha), what: sha },
  );
const key = (sha: string) => `opsgate:seen:scm:team/app:refs/heads/main:${sha}`;

beforeAll(async () => {
  server = await startRedis();
  redis = createRedis(server.url, 'request', 'claim-test');
  admin = new Redis(server.url);
  queue = createOpsQueue({ url: server.url, policy: { attempts: 1, backoffMs: 10 }, logger: silentLogger });
  await new Promise((r) => (redis.status === 'ready' ? r(null) : redis.once('ready', r)));
  await queue.bull.waitUntilReady();
});
beforeEach(async () => {
  await admin.flushall();
});
afterAll(async () => {
  await queue?.close();
  redis?.disconnect();
  admin?.disconnect();
  await server?.destroy();
});

describe('claimAndEnqueue', () => {
  it('first delivery: accepted, one job, record marked queued with that job id and the full TTL', async () => {
    const out = await claim('a1');
    expect(out).toMatchObject({ accepted: true, duplicate: false });
    expect(await admin.get(key('a1'))).toBe(QUEUED + out.jobId);
    expect(await admin.ttl(key('a1'))).toBeGreaterThan(86000);
    expect(await queue.bull.getJobCountByTypes('waiting')).toBe(1);
    expect((await queue.bull.getJob(out.jobId!))?.data.event_id).toBe(data('a1').event_id);
  });

  it('second delivery: duplicate, no second job', async () => {
    await claim('a2');
    const out = await claim('a2');
    expect(out).toMatchObject({ accepted: false, duplicate: true });
    expect(out.completedClaim).toBeUndefined();
    expect(await queue.bull.getJobCountByTypes('waiting')).toBe(1);
  });

  it('a claim left pending by a crashed API (record written, job never added) is completed by the retry', async () => {
    const orphan = '6f1e5c1c-0000-4000-8000-00000000dead';
    await admin.set(key('a3'), PENDING + orphan, 'EX', 86400);
    expect(await queue.bull.getJobCountByTypes('waiting')).toBe(0);
    const out = await claim('a3');
    expect(out).toMatchObject({ accepted: false, duplicate: true, jobId: orphan, completedClaim: true });
    expect((await queue.bull.getJob(orphan))?.data.event_id).toBe(data('a3').event_id);
    expect(await admin.get(key('a3'))).toBe(QUEUED + orphan);
    // And from then on it is an ordinary duplicate.
    expect(await claim('a3')).toMatchObject({ accepted: false, duplicate: true });
    expect(await queue.bull.getJobCountByTypes('waiting')).toBe(1);
  });

  it('a pending claim whose job was in fact added (crash after the add) gets no second job', async () => {
    const first = await claim('a4');
    await admin.set(key('a4'), PENDING + first.jobId, 'KEEPTTL'); // as if the "q:" mark never happened
    const out = await claim('a4');
    expect(out).toMatchObject({ duplicate: true, jobId: first.jobId, completedClaim: true });
    expect(await queue.bull.getJobCountByTypes('waiting')).toBe(1);
  });

  it('racing deliveries of one event: exactly one accepted, exactly one job', async () => {
    const outs = await Promise.all(Array.from({ length: 20 }, () => claim('a5')));
    expect(outs.filter((o) => o.accepted)).toHaveLength(1);
    expect(await queue.bull.getJobCountByTypes('waiting')).toBe(1);
  });

  it('records from older versions (any other value) count as duplicates', async () => {
    await admin.set(key('a6'), 'req-legacy', 'EX', 100);
    expect(await claim('a6')).toMatchObject({ accepted: false, duplicate: true });
    expect(await queue.bull.getJobCountByTypes('waiting')).toBe(0);
  });
});
