/**
 * REDIS_MIN_REPLICAS_ACK (src/domain/replication.ts) on a real redis-server, first without a
 * replica (WAIT can never be satisfied), then with one real replica attached.
 * - Not acknowledged in time: 503 {detail, code} + Retry-After, and what the request wrote is taken
 *   back as after a failed enqueue: no seen record, no job, so the sender's retry is delivered again.
 * - Acknowledged: the usual answers, and the seen record and the job are on the replica at the
 *   moment the answer arrives (that is the guarantee).
 * - POST /ops/jobs/{id}/retry: 200 only once the re-queued job is on the replica; not in time
 *   (no replica, or the replica paused with SIGSTOP): 503 + Retry-After, nothing taken back (the
 *   retry stays in effect on the primary), and repeating it is safe: 409 "job is waiting".
 */
import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { Worker } from 'bullmq';
import request from 'supertest';
import { deliveryKey } from '../../../src/shared/keys.js';
import { JOB } from '../../../src/shared/jobs.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { startReplica, until } from '../../helpers/redisTopology.js';
import { BEARER, createHarness, OP_KEY, runWorkerUntil, SCM_SECRET, type Harness } from '../../helpers/apiHarness.js';
import { dedupKey, enqueue } from '../../helpers/queueOps.js';

let srv: RedisServer;
let h: Harness;

beforeAll(async () => {
  srv = await startRedis();
  h = await createHarness(srv.url, { env: { REDIS_MIN_REPLICAS_ACK: '1', REDIS_ACK_TIMEOUT_MS: '200' } });
});
afterAll(async () => {
  await h?.close();
  await srv?.destroy();
});
beforeEach(async () => {
  await h.inspect.flushall();
});

const scm = (sha: string) =>
  request(h.app)
    .post('/webhook/scm')
    .set('Content-Type', 'application/json')
    .set('X-Scm-Token', SCM_SECRET)
    .set('X-Scm-Event', 'Push Hook')
    .send(JSON.stringify({ ref: 'refs/heads/main', checkout_sha: sha, project: { path_with_namespace: 'group/app' } }));
const alerts = (...fps: string[]) =>
  request(h.app)
    .post('/webhook/alerts')
    .set('Content-Type', 'application/json')
    .send(JSON.stringify({ alerts: fps.map((fingerprint) => ({ status: 'firing', fingerprint, labels: { alertname: 'A' } })) }));
const restart = () => request(h.app).post('/ops/restart?host=web-1&service=frontend').set('Authorization', `Bearer ${BEARER}`);
const jobs = () => h.queue.bull.getJobs(['waiting', 'delayed', 'active', 'completed', 'failed', 'prioritized']);
const retry = (id: string) =>
  request(h.app)
    .post(`/ops/jobs/${id}/retry`)
    .set('X-API-Key', OP_KEY)
    .set('Content-Type', 'application/json')
    .send(JSON.stringify({ reason: 'replica test' }));
/** A dead letter made by the real worker processor (a host not in the inventory). */
async function deadLetter(host: string): Promise<string> {
  const id = await enqueue(h.queue, JOB.restartService, { host, service: 'api', audit_id: `a-${host}`, requested_by: 'key:000000000000' });
  await runWorkerUntil(srv.url, async () => (await h.queue.jobs.get(id))?.state === 'failed');
  return id;
}
const RETRY_503 = /^retry not acknowledged by 1 Redis replica in time; it may still take effect; repeating it is safe/;
const scmKey = (sha: string) => dedupKey(h.queue, `scm:group/app:refs/heads/main:${sha}`);

describe('REDIS_MIN_REPLICAS_ACK=1 without a replica: nothing is acknowledged', () => {
  it('scm push -> 503 + Retry-After; seen record and job taken back; the retry is accepted again (not a duplicate)', async () => {
    const res = await scm('n0rep1ica');
    expect(res.status).toBe(503);
    expect(res.headers['retry-after']).toMatch(/^\d+$/);
    expect(res.body.detail).toMatch(/not acknowledged by 1 Redis replica/);
    expect(await h.inspect.exists(scmKey('n0rep1ica'))).toBe(0);
    expect(await jobs()).toHaveLength(0);
    const again = await scm('n0rep1ica');
    expect(again.status).toBe(503); // still no replica: taken back again, never "duplicate"
    expect(await h.inspect.exists(scmKey('n0rep1ica'))).toBe(0);
    expect(await jobs()).toHaveLength(0);
  });
  it('alerts -> 503; every fingerprint of the batch taken back', async () => {
    const res = await alerts('fp-a', 'fp-b');
    expect(res.status).toBe(503);
    expect(res.headers['retry-after']).toMatch(/^\d+$/);
    expect(await h.inspect.exists(dedupKey(h.queue, 'alert:fp-a'), dedupKey(h.queue, 'alert:fp-b'))).toBe(0);
    expect(await jobs()).toHaveLength(0);
  });
  it('restart -> 503; the restart job taken back', async () => {
    const res = await restart();
    expect(res.status).toBe(503);
    expect(res.headers['retry-after']).toMatch(/^\d+$/);
    expect(await jobs()).toHaveLength(0);
  });
  it('gitlab push with a delivery id -> 503; deduplication record and delivery alias taken back, so the retry is a new job', async () => {
    const gitlab = (app: Harness['app']) =>
      request(app)
        .post('/webhook/gitlab')
        .set('Content-Type', 'application/json')
        .set('X-Gitlab-Token', SCM_SECRET)
        .set('X-Gitlab-Event', 'Push Hook')
        .set('X-Gitlab-Event-UUID', 'uuid-take-back-1')
        .send(JSON.stringify({ ref: 'refs/heads/main', checkout_sha: 'de11e7e1', project: { path_with_namespace: 'group/app' } }));
    const res = await gitlab(h.app);
    expect(res.status).toBe(503);
    expect(res.body.detail).toMatch(/not acknowledged by 1 Redis replica/);
    expect(await h.inspect.exists(scmKey('de11e7e1'))).toBe(0);
    expect(await h.inspect.exists(deliveryKey('gitlab', 'uuid-take-back-1'))).toBe(0);
    // No BullMQ deduplication key is left either, that could answer the retry with the removed job.
    expect(await h.inspect.keys(dedupKey(h.queue, '*'))).toEqual([]);
    expect(await jobs()).toHaveLength(0);
    // The sender's retry, answered by an API that does not wait for replicas: a new job, not a duplicate.
    const plain = await createHarness(srv.url);
    try {
      const again = await gitlab(plain.app);
      expect(again.status).toBe(202);
      expect(again.body).toMatchObject({ accepted: true, duplicate: false });
      expect(await jobs()).toHaveLength(1);
    } finally {
      await plain.close();
    }
  });
  it('restart with an Idempotency-Key -> 503; its recorded answer taken back with the job, so the retry queues the restart', async () => {
    const withKey = (app: Harness['app']) =>
      request(app)
        .post('/ops/restart?host=web-1&service=frontend')
        .set('Authorization', `Bearer ${BEARER}`)
        .set('Idempotency-Key', 'take-back-1');
    const res = await withKey(h.app);
    expect(res.status).toBe(503);
    expect(await h.inspect.keys('opsgate:idem:*')).toEqual([]);
    expect(await jobs()).toHaveLength(0);
    const plain = await createHarness(srv.url);
    try {
      const again = await withKey(plain.app);
      expect(again.status).toBe(200);
      expect(again.body).toMatchObject({ status: 'submitted', coalesced: false });
      expect(await jobs()).toHaveLength(1);
      expect(await h.inspect.keys('opsgate:idem:*')).toHaveLength(1);
    } finally {
      await plain.close();
    }
  });
  it('job retry -> 503 + Retry-After; the retry stays in effect (not taken back); repeating it answers 409 "job is waiting"', async () => {
    const id = await deadLetter('gone-norep');
    const res = await retry(id);
    expect(res.status).toBe(503);
    expect(res.headers['retry-after']).toMatch(/^\d+$/);
    expect(res.body).toEqual({ detail: expect.stringMatching(RETRY_503), code: 'not_replicated' });
    // A restart's retry is a new change, <id>.retry; the dead letter is gone once it is queued.
    expect((await h.queue.jobs.get(`${id}.retry`))?.state).toBe('waiting');
    const again = await retry(id);
    expect(again.status).toBe(409);
    expect(again.body).toEqual({ detail: 'job is waiting; only a failed (dead-lettered) job can be retried', code: 'job_not_failed' });
    expect(await jobs()).toHaveLength(1);
  });
  it('taking back spares a job a worker already took or finished (it counts as accepted)', async () => {
    await h.queue.bull.add(
      'ops_worker.notify_oncall',
      { alertname: 'x', annotations: {}, audit_id: 'a', requested_by: 'r' },
      { jobId: 'taken-1' },
    );
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    const w = new Worker('ops', async () => held, { connection: { url: srv.url }, prefix: 'bull' });
    try {
      const deadline = Date.now() + 10_000;
      while ((await h.queue.bull.getJobState('taken-1')) !== 'active') {
        if (Date.now() > deadline) throw new Error('job not taken by the worker');
        await new Promise((r) => setTimeout(r, 50));
      }
      expect(await h.queue.producer.remove('taken-1')).toBe(false);
      expect(await h.queue.bull.getJobState('taken-1')).toBe('active');
      release();
      const deadline2 = Date.now() + 10_000;
      while ((await h.queue.bull.getJobState('taken-1')) !== 'completed') {
        if (Date.now() > deadline2) throw new Error('job not completed');
        await new Promise((r) => setTimeout(r, 50));
      }
      expect(await h.queue.producer.remove('taken-1')).toBe(false);
      expect(await h.queue.bull.getJobState('taken-1')).toBe('completed');
    } finally {
      release();
      await w.close();
    }
    await h.queue.bull.add(
      'ops_worker.notify_oncall',
      { alertname: 'y', annotations: {}, audit_id: 'a', requested_by: 'r' },
      { jobId: 'waiting-1', delay: 60_000 },
    );
    expect(await h.queue.producer.remove('waiting-1')).toBe(true);
    expect(await h.queue.bull.getJobState('waiting-1')).toBe('unknown');
    expect(await h.queue.producer.remove('no-such-job')).toBe(true);
  });
});

describe('REDIS_MIN_REPLICAS_ACK=1 with one real replica', () => {
  let replica: Awaited<ReturnType<typeof startReplica>>;
  beforeAll(async () => {
    replica = await startReplica(srv.port);
    // The cases above want WAIT to give up fast (200 ms, no replica). Here the replica must ack in
    // time on a loaded 2-core machine too: the largest timeout the config allows.
    await h.close();
    h = await createHarness(srv.url, { env: { REDIS_MIN_REPLICAS_ACK: '1', REDIS_ACK_TIMEOUT_MS: '1500' } });
  });
  afterAll(async () => {
    await replica?.destroy();
  });

  it('scm: 202 accepted, and at that moment the seen record and the job are on the replica; duplicate 202', async () => {
    const res = await scm('r3plicated');
    expect(res.status).toBe(202);
    expect(res.body).toMatchObject({ accepted: true, duplicate: false });
    const onReplica = replica.client();
    try {
      expect(await onReplica.get(scmKey('r3plicated'))).toBe(res.body.job_id);
      expect(await onReplica.exists(`bull:ops:${res.body.job_id}`)).toBe(1);
    } finally {
      onReplica.disconnect();
    }
    const dup = await scm('r3plicated');
    expect(dup.status).toBe(202);
    expect(dup.body).toMatchObject({ accepted: false, duplicate: true });
    expect(await jobs()).toHaveLength(1);
  });
  it('job retry: 200, and at that moment the re-queued job is in the wait list on the replica', async () => {
    const id = await deadLetter('gone-rep');
    const onReplica = replica.client();
    try {
      const res = await retry(id);
      expect(res.status).toBe(200);
      expect(res.body).toMatchObject({ retried: true, job: { id: `${id}.retry`, state: 'waiting' } });
      expect(await onReplica.lrange('bull:ops:wait', 0, -1)).toContain(`${id}.retry`);
      expect(await onReplica.zscore('bull:ops:failed', id)).toBeNull();
    } finally {
      onReplica.disconnect();
    }
  });
  it('job retry with the replica paused (SIGSTOP) -> 503; after it resumes the retry is on the replica and repeating it answers 409', async () => {
    const id = await deadLetter('gone-paused');
    replica.proc.kill('SIGSTOP');
    let res;
    try {
      res = await retry(id);
    } finally {
      replica.proc.kill('SIGCONT');
    }
    expect(res.status).toBe(503);
    expect(res.headers['retry-after']).toMatch(/^\d+$/);
    expect(res.body).toEqual({ detail: expect.stringMatching(RETRY_503), code: 'not_replicated' });
    const onReplica = replica.client();
    try {
      await until(
        'the retry replicated after the replica resumed',
        async () => (await onReplica.lrange('bull:ops:wait', 0, -1)).includes(`${id}.retry`),
        10_000,
      );
    } finally {
      onReplica.disconnect();
    }
    const again = await retry(id);
    expect(again.status).toBe(409);
    expect(again.body.detail).toMatch(/^job is waiting/);
  });
  it('alerts and restart answer as usual', async () => {
    expect((await alerts('fp-r1', 'fp-r2')).status).toBe(202);
    const r = await restart();
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ status: 'submitted' });
    expect(await jobs()).toHaveLength(3);
  });
});
