/**
 * src/domain/claim.ts on a real redis-server and the real BullMQ producer: the seen record and
 * its job are written in one script, so nothing can separate them. The crash itself is exercised
 * with real processes in faults.test.ts (API SIGKILLed under load); here each state is set up
 * exactly, and a Redis that refuses writes midway is a real one out of memory.
 */
import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { Worker } from 'bullmq';
import { claimAndEnqueue, claimAndEnqueueMany, QUEUED } from '../../../src/domain/claim.js';
import { QueueUnavailableError } from '../../../src/shared/errors.js';
import { JOB } from '../../../src/shared/jobs.js';
import { silentLogger } from '../../../src/shared/logger.js';
import { createOpsQueue, type OpsQueue } from '../../../src/shared/queue.js';
import { createRedis } from '../../../src/shared/redis.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { waitFor } from '../../helpers/waitFor.js';

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
const key = (sha: string) => `{opsgate}:seen:scm:team/app:refs/heads/main:${sha}`;
const deliveryKey = (id: string) => `{opsgate}:seen:delivery:gitlab:${id}`;
const event = (sha: string, delivery?: string) => ({
  key: key(sha),
  ttlSeconds: 86400,
  ...(delivery ? { alsoKeys: [{ key: deliveryKey(delivery), ttlSeconds: 604800 }] } : {}),
  name: JOB.runDeployPipeline,
  data: data(sha),
  what: sha,
});
const claim = (sha: string, delivery?: string) => claimAndEnqueue({ redis, queue, logger: silentLogger }, event(sha, delivery));
const alert = (fp: string) => ({
  key: `{opsgate}:seen:alert:${fp}`,
  ttlSeconds: 300,
  name: JOB.notifyOncall,
  data: { alertname: 'Storm', annotations: {}, fingerprint: fp, audit_id: 'req-2', requested_by: 'webhook:alerts' },
  what: fp,
});

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
  it('first delivery: accepted, one job, its record names that job with the full TTL', async () => {
    const out = await claim('a1');
    expect(out).toMatchObject({ accepted: true, duplicate: false, keys: [key('a1')] });
    expect(await admin.get(key('a1'))).toBe(QUEUED + out.jobId);
    expect(await admin.ttl(key('a1'))).toBeGreaterThan(86000);
    expect(await queue.bull.getJobCountByTypes('waiting')).toBe(1);
    expect((await queue.bull.getJob(out.jobId!))?.data.event_id).toBe(data('a1').event_id);
  });

  it('the job is stored as Queue#add stores it: the same fields and options, taken and completed by a plain BullMQ worker', async () => {
    const out = await claim('a2');
    await queue.bull.add(JOB.runDeployPipeline, data('a2'), { jobId: 'via-add' });
    const ours = await admin.hgetall(`bull:ops:${out.jobId}`);
    const theirs = await admin.hgetall('bull:ops:via-add');
    expect(Object.keys(ours).sort()).toEqual(Object.keys(theirs).sort());
    const options = (o: string | undefined) => ({ ...(JSON.parse(o ?? '{}') as object), jobId: undefined });
    expect(options(ours.opts)).toEqual(options(theirs.opts));
    expect(ours.name).toBe(theirs.name);
    expect(ours.data).toBe(theirs.data);
    expect(Math.abs(Number(ours.timestamp) - Number(theirs.timestamp))).toBeLessThan(60_000);
    const done: string[] = [];
    const connection = new Redis(server.url, { maxRetriesPerRequest: null });
    const worker = new Worker('ops', async (job) => void done.push(String(job.id)), { connection, prefix: 'bull' });
    try {
      await waitFor('the worker to complete both jobs', () => done.length === 2);
      expect(done.sort()).toEqual([out.jobId, 'via-add'].sort());
    } finally {
      await worker.close();
      connection.disconnect();
    }
  });

  it('second delivery: duplicate of the first job, no second job', async () => {
    const first = await claim('a3');
    const out = await claim('a3');
    expect(out).toEqual({ accepted: false, duplicate: true, jobId: first.jobId });
    expect(await queue.bull.getJobCountByTypes('waiting')).toBe(1);
  });

  it("a redelivery found by its delivery key alone is a duplicate, and the event's key learns the job", async () => {
    const first = await claim('a4', 'dlv-1');
    expect(await admin.get(deliveryKey('dlv-1'))).toBe(QUEUED + first.jobId);
    expect(await admin.ttl(deliveryKey('dlv-1'))).toBeGreaterThan(600000);
    await admin.del(key('a4')); // the event's 24 h window is over; the delivery's week is not
    const out = await claim('a4', 'dlv-1');
    expect(out).toEqual({ accepted: false, duplicate: true, jobId: first.jobId });
    expect(await admin.get(key('a4'))).toBe(QUEUED + first.jobId);
    expect(await queue.bull.getJobCountByTypes('waiting')).toBe(1);
  });

  describe('a pending record of version 0.1.0 ("p:<job id>": claimed, add not confirmed) during a rolling upgrade', () => {
    it('whose API died before the add: the job is added under its id, the record names it', async () => {
      const orphan = '6f1e5c1c-0000-4000-8000-00000000dead';
      await admin.set(key('p1'), `p:${orphan}`, 'EX', 86400);
      expect(await claim('p1')).toEqual({ accepted: false, duplicate: true, jobId: orphan });
      expect((await queue.bull.getJob(orphan))?.data.event_id).toBe(data('p1').event_id);
      expect(await admin.get(key('p1'))).toBe(QUEUED + orphan);
      expect(await admin.ttl(key('p1'))).toBeGreaterThan(86000);
      expect(await claim('p1')).toEqual({ accepted: false, duplicate: true, jobId: orphan });
      expect(await queue.bull.getJobCountByTypes('waiting')).toBe(1);
    });

    it('whose job was added: no second job', async () => {
      await queue.bull.add(JOB.runDeployPipeline, data('p2'), { jobId: 'added-by-0.1.0' });
      await admin.set(key('p2'), 'p:added-by-0.1.0', 'EX', 86400);
      expect(await claim('p2')).toEqual({ accepted: false, duplicate: true, jobId: 'added-by-0.1.0' });
      expect(await queue.bull.getJobCountByTypes('waiting')).toBe(1);
    });

    it("whose job ran and was removed: BullMQ's deduplication key of the event answers it, no second job", async () => {
      await admin.set(`bull:ops:de:scm:team/app:refs/heads/main:p3`, 'gone-job', 'PX', 86_400_000);
      await admin.set(key('p3'), 'p:gone-job', 'EX', 86400);
      expect(await claim('p3')).toEqual({ accepted: false, duplicate: true, jobId: 'gone-job' });
      expect(await queue.bull.getJobCountByTypes('waiting', 'active', 'completed')).toBe(0);
      expect(await admin.get(key('p3'))).toBe(QUEUED + 'gone-job');
    });
  });

  it('racing deliveries of one event: exactly one accepted, exactly one job, every answer names it', async () => {
    const outs = await Promise.all(Array.from({ length: 20 }, () => claim('a5')));
    const accepted = outs.filter((o) => o.accepted);
    expect(accepted).toHaveLength(1);
    expect(new Set(outs.map((o) => o.jobId))).toEqual(new Set([accepted[0]!.jobId]));
    expect(await queue.bull.getJobCountByTypes('waiting')).toBe(1);
  });

  it('records from older versions (any other value) count as duplicates', async () => {
    await admin.set(key('a6'), 'req-legacy', 'EX', 100);
    expect(await claim('a6')).toEqual({ accepted: false, duplicate: true });
    expect(await queue.bull.getJobCountByTypes('waiting')).toBe(0);
  });

  it('a batch of 600 events (three script calls) with duplicates inside: one job per new event, in order', async () => {
    await claim('pre'); // not an alert: a different key space
    const first = await claimAndEnqueueMany({ redis, queue, logger: silentLogger }, [alert('f-0'), alert('f-1')]);
    const batch = Array.from({ length: 600 }, (_, i) => alert(`f-${i}`));
    const outs = await claimAndEnqueueMany({ redis, queue, logger: silentLogger }, batch);
    expect(outs[0]).toEqual({ accepted: false, duplicate: true, jobId: first[0]!.jobId });
    expect(outs[1]).toEqual({ accepted: false, duplicate: true, jobId: first[1]!.jobId });
    expect(outs.filter((o) => o.accepted)).toHaveLength(598);
    for (const i of [2, 249, 250, 499, 500, 599]) {
      expect((await queue.bull.getJob(outs[i]!.jobId!))?.data.fingerprint).toBe(`f-${i}`);
      expect(await admin.get(`{opsgate}:seen:alert:f-${i}`)).toBe(QUEUED + outs[i]!.jobId);
    }
    expect(await queue.bull.getJobCountByTypes('waiting')).toBe(1 + 600);
  });

  it('Redis out of memory: 503, and no record is left without its job; the retry is taken in once', async () => {
    await admin.config('SET', 'maxmemory-policy', 'noeviction');
    await admin.config('SET', 'maxmemory', '1');
    try {
      await expect(claim('oom')).rejects.toBeInstanceOf(QueueUnavailableError);
      expect(await admin.exists(key('oom'))).toBe(0);
      expect(await queue.bull.getJobCountByTypes('waiting')).toBe(0);
    } finally {
      await admin.config('SET', 'maxmemory', '0');
    }
    const out = await claim('oom');
    expect(out.accepted).toBe(true);
    expect(await queue.bull.getJobCountByTypes('waiting')).toBe(1);
  });
});
