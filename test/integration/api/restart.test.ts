import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import request from 'supertest';
import { idempotencyScope } from '../../../src/changes/restart.js';
import { idempotencyRecordKey } from '../../../src/shared/keys.js';
import { credentialId } from '../../../src/shared/crypto.js';
import { IDEMPOTENCY_TTL_SECONDS, JOB } from '../../../src/shared/jobs.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { BEARER, createHarness, eventually, runWorkerUntil, useHarness, type Harness } from '../../helpers/apiHarness.js';

/**
 * POST /ops/restart: Idempotency-Key and coalescing of identical restarts, on real redis-servers; the paused-Redis case with SIGSTOP.
 */
const ctx = useHarness();

const restart = (app: Harness['app'], qs: string, key?: string) => {
  const req = request(app).post(`/ops/restart${qs}`).set('Authorization', `Bearer ${BEARER}`);
  return key === undefined ? req : req.set('Idempotency-Key', key);
};

async function restartJobs(h: Harness): Promise<Array<{ id: string; data: Record<string, unknown> }>> {
  const jobs = await h.queue.bull.getJobs(['waiting', 'active', 'delayed', 'completed', 'failed', 'prioritized']);
  return jobs.filter((j) => j.name === JOB.restartService).map((j) => ({ id: String(j.id), data: j.data as Record<string, unknown> }));
}

describe('Idempotency-Key', () => {
  it('a repeat with the same key answers with the original job_id and queues nothing', async () => {
    const first = await restart(ctx.h.app, '?host=web-1&service=checkout', 'order-42');
    expect(first.status).toBe(200);
    expect(first.body).toEqual({ host: 'web-1', service: 'checkout', status: 'submitted', job_id: expect.any(String), coalesced: false });
    const again = await restart(ctx.h.app, '?host=web-1&service=checkout', 'order-42');
    expect(again.status).toBe(200);
    expect(again.body).toEqual(first.body);
    expect((await restartJobs(ctx.h)).map((j) => j.id)).toEqual([first.body.job_id]);
  });

  it('the job id is scoped to the principal: sha256 of principal and key, never the key itself', async () => {
    const res = await restart(ctx.h.app, '?host=web-1&service=frontend', 'client-chosen-key');
    const principal = `bearer:${credentialId(BEARER)}`;
    expect(res.body.job_id).toBe(`restart-${idempotencyScope(principal, 'client-chosen-key')}`);
    expect(res.body.job_id).not.toContain('client-chosen-key');
    // Another principal with the same key gets another id: it can neither collide with nor probe this one.
    expect(idempotencyScope('key:0123456789ab', 'client-chosen-key')).not.toBe(idempotencyScope(principal, 'client-chosen-key'));
    const stored = await ctx.h.inspect.get(idempotencyRecordKey(idempotencyScope(principal, 'client-chosen-key')));
    expect(JSON.parse(stored!)).toEqual({ host: 'web-1', service: 'frontend', job_id: res.body.job_id, coalesced: false });
    const ttl = await ctx.h.inspect.ttl(idempotencyRecordKey(idempotencyScope(principal, 'client-chosen-key')));
    expect(ttl).toBeGreaterThan(IDEMPOTENCY_TTL_SECONDS - 60);
    expect(ttl).toBeLessThanOrEqual(IDEMPOTENCY_TTL_SECONDS);
  });

  it('the same key for another target -> 422, nothing queued', async () => {
    await restart(ctx.h.app, '?host=web-1&service=checkout', 'reused');
    const res = await restart(ctx.h.app, '?host=db-1&service=postgres-exporter', 'reused');
    expect(res.status).toBe(422);
    expect(res.body.detail).toMatch(/Idempotency-Key was already used/);
    expect(await restartJobs(ctx.h)).toHaveLength(1);
  });

  it.each([
    ['too long', 'k'.repeat(256)],
    ['blank', '   '],
  ])('a %s key -> 400 {detail}, nothing queued', async (_name, key) => {
    const res = await restart(ctx.h.app, '?host=web-1&service=checkout', key);
    expect(res.status).toBe(400);
    expect(res.body).toEqual({
      detail: 'Idempotency-Key header must be 1-255 printable ASCII characters',
      code: 'invalid_idempotency_key',
    });
    expect(await restartJobs(ctx.h)).toHaveLength(0);
  });

  it('without a key nothing is derived: each call is its own request (the second joins the first)', async () => {
    const a = await restart(ctx.h.app, '?host=web-1&service=checkout');
    const b = await restart(ctx.h.app, '?host=web-1&service=checkout');
    expect(a.body.job_id).toMatch(/^restart-[0-9a-f-]{36}$/);
    expect(b.body).toEqual({ ...a.body, coalesced: true });
    expect(await ctx.h.inspect.keys('opsgate:idem:*')).toEqual([]);
  });
});

describe('coalescing identical restarts', () => {
  it('a restart of a Deployment whose restart is still waiting joins it: same job_id, coalesced: true', async () => {
    const first = await restart(ctx.h.app, '?host=web-1&service=checkout');
    const second = await restart(ctx.h.app, '?host=web-1&service=checkout', 'double-click');
    expect(second.status).toBe(200);
    expect(second.body).toEqual({ ...first.body, coalesced: true });
    // Its repeat answers the same way (the answer is remembered, not recomputed).
    expect((await restart(ctx.h.app, '?host=web-1&service=checkout', 'double-click')).body).toEqual(second.body);
    // Another Deployment is another restart.
    const other = await restart(ctx.h.app, '?host=web-1&service=frontend');
    expect(other.body.coalesced).toBe(false);
    expect(other.body.job_id).not.toBe(first.body.job_id);
    expect((await restartJobs(ctx.h)).map((j) => j.id).sort()).toEqual([first.body.job_id, other.body.job_id].sort());
    const audit = ctx.h
      .audits()
      .filter((a) => a.path === '/ops/restart')
      .at(-3);
    expect(audit).toMatchObject({ job_id: first.body.job_id, coalesced: true });
  });

  it('parallel requests (an alert storm, with and without keys) make exactly one job', async () => {
    const results = await Promise.all(
      Array.from({ length: 24 }, (_, i) => restart(ctx.h.app, '?host=db-1&service=postgres-exporter', i % 2 ? `storm-${i}` : undefined)),
    );
    expect(results.map((r) => r.status)).toEqual(Array(24).fill(200));
    const ids = new Set(results.map((r) => r.body.job_id));
    expect(ids.size).toBe(1);
    expect(results.filter((r) => r.body.coalesced === false)).toHaveLength(1);
    expect(await restartJobs(ctx.h)).toHaveLength(1);
  });

  it('once the restart has finished (here: dead-lettered by the real worker processor), the next request is a new restart', async () => {
    const first = await restart(ctx.h.app, '?host=web-1&service=checkout');
    await runWorkerUntil(ctx.srv.url, async () => (await ctx.h.queue.jobs.get(first.body.job_id))?.state === 'failed');
    const next = await restart(ctx.h.app, '?host=web-1&service=checkout');
    expect(next.body.coalesced).toBe(false);
    expect(next.body.job_id).not.toBe(first.body.job_id);
  });
});

describe('a 503 whose enqueue may still land, on one Redis (CLIENT PAUSE WRITE: reads answer, the add waits)', () => {
  it('3 s of paused writes: 503 "may still be queued", the add lands when writes resume, the retry with the same key answers that job', async () => {
    await ctx.h.inspect.call('CLIENT', 'PAUSE', '3000', 'WRITE');
    const paused = await restart(ctx.h.app, '?host=web-1&service=checkout', 'one-redis');
    expect(paused.status).toBe(503);
    expect(paused.body.detail).toMatch(/may still be queued.*same Idempotency-Key/);
    const expectedId = `restart-${idempotencyScope(`bearer:${credentialId(BEARER)}`, 'one-redis')}`;
    await eventually(async () => (await ctx.h.queue.bull.getJob(expectedId)) !== undefined);
    const retry = await restart(ctx.h.app, '?host=web-1&service=checkout', 'one-redis');
    expect(retry.body).toEqual({ host: 'web-1', service: 'checkout', status: 'submitted', job_id: expectedId, coalesced: false });
    expect((await restartJobs(ctx.h)).map((j) => j.id)).toEqual([expectedId]);
  });
});

describe('a 503 whose enqueue may still land (Redis paused with SIGSTOP)', () => {
  /** Queue on its own redis-server, so SIGSTOP hangs the add while the Idempotency-Key lookup (on the other one) answers. */
  let queueSrv: RedisServer;
  let h: Harness;
  let pid: number;
  beforeAll(async () => {
    queueSrv = await startRedis();
    h = await createHarness(ctx.srv.url, { queueUrl: queueSrv.url });
    await h.queue.bull.waitUntilReady();
    const admin = new Redis(queueSrv.url);
    pid = Number(/process_id:(\d+)/.exec(await admin.info('server'))![1]);
    admin.disconnect();
  });
  afterAll(async () => {
    try {
      process.kill(pid, 'SIGCONT');
    } catch {
      // already gone
    }
    await h?.close();
    await queueSrv?.destroy();
  });

  it('503 says the restart may still be queued; after Redis resumes, the retry with the same key answers that job: exactly one job', async () => {
    process.kill(pid, 'SIGSTOP');
    let paused;
    try {
      paused = await restart(h.app, '?host=web-1&service=checkout', 'retry-me');
    } finally {
      process.kill(pid, 'SIGCONT');
    }
    expect(paused.status).toBe(503);
    expect(paused.headers['retry-after']).toBe('5');
    expect(paused.body.detail).toMatch(/may still be queued/);
    expect(paused.body.detail).toMatch(/same Idempotency-Key/);
    // The add that timed out runs when Redis answers again: the job exists though the call got 503.
    const expectedId = `restart-${idempotencyScope(`bearer:${credentialId(BEARER)}`, 'retry-me')}`;
    await eventually(async () => h.queue.isReady() && (await h.queue.bull.getJob(expectedId)) !== undefined);

    const retry = await restart(h.app, '?host=web-1&service=checkout', 'retry-me');
    expect(retry.status).toBe(200);
    expect(retry.body).toEqual({ host: 'web-1', service: 'checkout', status: 'submitted', job_id: expectedId, coalesced: false });
    expect((await restartJobs(h)).map((j) => j.id)).toEqual([expectedId]);
  });

  it('without a key the 503 says the restart may still be queued and how to avoid a double restart', async () => {
    await h.queue.bull.obliterate({ force: true });
    process.kill(pid, 'SIGSTOP');
    let paused;
    try {
      paused = await restart(h.app, '?host=web-1&service=frontend');
    } finally {
      process.kill(pid, 'SIGCONT');
    }
    expect(paused.status).toBe(503);
    expect(paused.body.detail).toMatch(/may still be queued.*Idempotency-Key/);
    await eventually(async () => h.queue.isReady() && (await restartJobs(h)).length === 1);
  });

  it('Redis not connected at all: 503 says nothing was queued', async () => {
    await queueSrv.stop();
    try {
      await eventually(async () => !h.queue.isReady());
      const res = await restart(h.app, '?host=web-1&service=frontend', 'down');
      expect(res.status).toBe(503);
      expect(res.body.detail).toBe('job queue unavailable; nothing was queued; retry later');
    } finally {
      await queueSrv.start();
    }
  });
});
