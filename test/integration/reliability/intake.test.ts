/**
 * src/domain/intake.ts on a real redis-server and the real BullMQ producer: each event's
 * deduplication record and its job are written by one BullMQ add, so nothing can separate them.
 * The crash itself is exercised with real processes in faults.test.ts (API SIGKILLed under load);
 * here each state is set up exactly, and a Redis that refuses writes is a real one out of memory.
 */
import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { Worker } from 'bullmq';
import { createIntake, LEGACY_WINDOW_MS, QUEUED, type Intake } from '../../../src/domain/intake.js';
import { QueueUnavailableError } from '../../../src/shared/errors.js';
import { JOB } from '../../../src/shared/jobs.js';
import { INTAKE_SINCE_KEY, deliveryKey, legacySeenKey } from '../../../src/shared/keys.js';
import { silentLogger } from '../../../src/shared/logger.js';
import { createOpsQueue, type OpsQueue } from '../../../src/api/queue.js';
import { createRedis } from '../../../src/shared/redis.js';
import { dedupKey } from '../../helpers/queueOps.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { waitFor } from '../../helpers/waitFor.js';

let server: RedisServer;
let redis: Redis;
let admin: Redis;
let queue: OpsQueue;
let intake: Intake;

const eventId = (sha: string) => `scm:team/app:refs/heads/main:${sha}`;
const data = (sha: string) => ({
  project: 'team/app',
  ref: 'refs/heads/main',
  event_id: eventId(sha),
  audit_id: 'req-1',
  requested_by: 'webhook:scm',
});
const push = (sha: string, deliveryId?: string, on: Intake = intake) =>
  on.push({
    source: 'gitlab',
    eventId: eventId(sha),
    ...(deliveryId ? { deliveryId } : {}),
    job: { name: JOB.runDeployPipeline, data: data(sha) },
  });
const alert = (fp: string) => ({
  fingerprint: fp,
  data: { alertname: 'Storm', annotations: {}, fingerprint: fp, audit_id: 'req-2', requested_by: 'webhook:alerts' },
});
const waiting = () => queue.bull.getJobCountByTypes('waiting');

beforeAll(async () => {
  server = await startRedis();
  redis = createRedis(server.url, 'request', 'intake-test');
  admin = new Redis(server.url);
  queue = createOpsQueue({ url: server.url, policy: { attempts: 1, backoffMs: 10 }, logger: silentLogger });
  await new Promise((r) => (redis.status === 'ready' ? r(null) : redis.once('ready', r)));
  await queue.bull.waitUntilReady();
});
beforeEach(async () => {
  await admin.flushall();
  intake = createIntake({ producer: queue.producer, jobs: queue.jobs, redis, logger: silentLogger });
});
afterAll(async () => {
  await queue?.close();
  redis?.disconnect();
  admin?.disconnect();
  await server?.destroy();
});

describe('pushes', () => {
  it('first delivery: accepted, one job; its deduplication record names the job for 24 h', async () => {
    const out = await push('a1');
    expect(out).toMatchObject({ accepted: true, duplicate: false, written: { jobId: out.jobId } });
    expect(await queue.bull.getDeduplicationJobId(eventId('a1'))).toBe(out.jobId);
    expect(await admin.pttl(dedupKey(queue, eventId('a1')))).toBeGreaterThan(86_000_000);
    expect(await waiting()).toBe(1);
    expect((await queue.bull.getJob(out.jobId))?.data.event_id).toBe(eventId('a1'));
  });

  it('the job is a plain BullMQ job: a plain BullMQ worker takes and completes it', async () => {
    const out = await push('a2');
    const done: string[] = [];
    const connection = new Redis(server.url, { maxRetriesPerRequest: null });
    const worker = new Worker('ops', async (job) => void done.push(String(job.id)), { connection, prefix: 'bull' });
    try {
      await waitFor('the worker to complete the job', () => done.length === 1);
      expect(done).toEqual([out.jobId]);
    } finally {
      await worker.close();
      connection.disconnect();
    }
    // The record outlives its job: the same event after the job finished is still a duplicate.
    expect(await push('a2')).toEqual({ accepted: false, duplicate: true, jobId: out.jobId });
  });

  it('second delivery: duplicate of the first job, no second job', async () => {
    const first = await push('a3');
    expect(await push('a3')).toEqual({ accepted: false, duplicate: true, jobId: first.jobId });
    expect(await waiting()).toBe(1);
  });

  it('a delivery id is remembered 30 days as "q:<job>": its replay after the 24 h is a duplicate', async () => {
    const first = await push('a4', 'dlv-1');
    expect(first.written).toEqual({ jobId: first.jobId, keys: [deliveryKey('gitlab', 'dlv-1')] });
    expect(await admin.get(deliveryKey('gitlab', 'dlv-1'))).toBe(QUEUED + first.jobId);
    expect(await admin.ttl(deliveryKey('gitlab', 'dlv-1'))).toBeGreaterThan(29 * 86400);
    await admin.del(dedupKey(queue, eventId('a4'))); // the event's 24 h are over; the delivery's 30 days are not
    expect(await push('a4', 'dlv-1')).toEqual({ accepted: false, duplicate: true, jobId: first.jobId });
    expect(await waiting()).toBe(1);
    // Without its delivery id the same push after the 24 h is a new event.
    expect((await push('a4')).accepted).toBe(true);
  });

  it('a duplicate by its event under a new delivery id records that id for the original job', async () => {
    const first = await push('a5', 'dlv-a');
    expect(await push('a5', 'dlv-b')).toEqual({ accepted: false, duplicate: true, jobId: first.jobId });
    expect(await admin.get(deliveryKey('gitlab', 'dlv-b'))).toBe(QUEUED + first.jobId);
  });

  it('racing deliveries of one event: exactly one accepted, exactly one job, every answer names it', async () => {
    const outs = await Promise.all(Array.from({ length: 20 }, () => push('a6')));
    const accepted = outs.filter((o) => o.accepted);
    expect(accepted).toHaveLength(1);
    expect(new Set(outs.map((o) => o.jobId))).toEqual(new Set([accepted[0]!.jobId]));
    expect(await waiting()).toBe(1);
  });

  it('Redis out of memory: 503, no record without its job; the retry is taken in once', async () => {
    await admin.config('SET', 'maxmemory-policy', 'noeviction');
    await admin.config('SET', 'maxmemory', '1');
    try {
      await expect(push('oom')).rejects.toBeInstanceOf(QueueUnavailableError);
      expect(await queue.bull.getDeduplicationJobId(eventId('oom'))).toBeNull();
      expect(await waiting()).toBe(0);
    } finally {
      await admin.config('SET', 'maxmemory', '0');
    }
    expect((await push('oom')).accepted).toBe(true);
    expect(await waiting()).toBe(1);
  });
});

describe('alerts', () => {
  it('one payload with duplicates inside and across payloads: one job per new fingerprint, in order, each deduplicated 300 s', async () => {
    const first = await intake.alerts([alert('f-0'), alert('f-1')]);
    const batch = Array.from({ length: 600 }, (_, i) => alert(`f-${i}`));
    const outs = await intake.alerts(batch);
    expect(outs[0]).toEqual({ accepted: false, duplicate: true, jobId: first[0]!.jobId });
    expect(outs[1]).toEqual({ accepted: false, duplicate: true, jobId: first[1]!.jobId });
    expect(outs.filter((o) => o.accepted)).toHaveLength(598);
    for (const i of [2, 299, 599]) {
      expect((await queue.bull.getJob(outs[i]!.jobId))?.data.fingerprint).toBe(`f-${i}`);
      expect(await queue.bull.getDeduplicationJobId(`alert:f-${i}`)).toBe(outs[i]!.jobId);
    }
    const ttl = await admin.pttl(dedupKey(queue, 'alert:f-7'));
    expect(ttl).toBeGreaterThan(290_000);
    expect(ttl).toBeLessThanOrEqual(300_000);
    expect(await waiting()).toBe(600);
  });
});

describe("version 0.1's records, read during an upgrade", () => {
  // An upgrade: the queue held jobs when this version first ran.
  beforeEach(async () => {
    await queue.bull.add(JOB.notifyOncall, { alertname: 'before-upgrade', annotations: {}, audit_id: 'a', requested_by: 'b' });
  });
  it('"q:<job>" of an event is a duplicate of that job; "p:<job>" (a claim whose add may be missing) adds the job under that id once', async () => {
    await admin.set(legacySeenKey(eventId('l1')), 'q:job-of-0.1', 'EX', 86400);
    expect(await push('l1')).toEqual({ accepted: false, duplicate: true, jobId: 'job-of-0.1' });
    const orphan = '6f1e5c1c-0000-4000-8000-00000000dead';
    await admin.set(legacySeenKey(eventId('l2')), `p:${orphan}`, 'EX', 86400);
    expect(await push('l2')).toEqual({ accepted: false, duplicate: true, jobId: orphan });
    expect((await queue.bull.getJob(orphan))?.data.event_id).toBe(eventId('l2'));
    expect(await admin.get(legacySeenKey(eventId('l2')))).toBe(`q:${orphan}`);
    expect(await admin.ttl(legacySeenKey(eventId('l2')))).toBeGreaterThan(86000);
    expect(await push('l2')).toEqual({ accepted: false, duplicate: true, jobId: orphan });
    // A claim whose job was added by version 0.1: no second job.
    await queue.bull.add(JOB.runDeployPipeline, data('l3'), { jobId: 'added-by-0.1' });
    await admin.set(legacySeenKey(eventId('l3')), 'p:added-by-0.1', 'EX', 86400);
    expect(await push('l3')).toEqual({ accepted: false, duplicate: true, jobId: 'added-by-0.1' });
    expect(await waiting()).toBe(3);
  });

  it('an alert\'s "q:<job>" is a duplicate; a 0.1 delivery record keeps working (same key and value)', async () => {
    await admin.set(legacySeenKey('alert:old-fp'), 'q:alert-job-0.1', 'EX', 300);
    const [out] = await intake.alerts([alert('old-fp')]);
    expect(out).toEqual({ accepted: false, duplicate: true, jobId: 'alert-job-0.1' });
    await admin.set(deliveryKey('gitlab', 'dlv-0.1'), 'q:deploy-job-0.1', 'EX', 86400);
    expect(await push('l5', 'dlv-0.1')).toEqual({ accepted: false, duplicate: true, jobId: 'deploy-job-0.1' });
    expect(await waiting()).toBe(1);
  });

  it('a new installation (no job in the queue at the first run) never reads them', async () => {
    await queue.bull.obliterate({ force: true });
    await admin.set(legacySeenKey(eventId('l6')), 'q:job-of-0.1', 'EX', 86400);
    expect((await push('l6')).accepted).toBe(true);
  });

  it('the records are read only while they can exist: after the window from the first run they are ignored', async () => {
    let now = Date.now();
    const clocked = createIntake({ producer: queue.producer, jobs: queue.jobs, redis, logger: silentLogger, now: () => now });
    await admin.set(legacySeenKey(eventId('l4')), 'q:job-of-0.1', 'EX', 86400);
    expect((await push('l4', undefined, clocked)).duplicate).toBe(true);
    expect(Number(await admin.get(INTAKE_SINCE_KEY))).toBeLessThanOrEqual(now);
    now += LEGACY_WINDOW_MS + 1;
    expect((await push('l4', undefined, clocked)).accepted).toBe(true);
  });
});
