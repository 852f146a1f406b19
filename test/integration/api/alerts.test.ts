import { describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { startRedis } from '../../helpers/redis.js';
import { JOB } from '../../../src/shared/jobs.js';
import { createHarness, eventually, useHarness } from '../../helpers/apiHarness.js';
import { dedupKey } from '../../helpers/queueOps.js';

/** POST /webhook/alerts as the contract describes it (+ optional ALERTS_WEBHOOK_TOKEN) on a real Redis and BullMQ queue. */
const ctx = useHarness();

const alert = (fp: string | undefined, status = 'firing', extra: Record<string, unknown> = {}) => ({
  status,
  labels: { alertname: `Alert-${fp}`, severity: 'page' },
  annotations: { summary: `summary of ${fp}` },
  ...(fp !== undefined ? { fingerprint: fp } : {}),
  ...extra,
});

const post = (body: unknown) =>
  request(ctx.h.app)
    .post('/webhook/alerts')
    .set('Content-Type', 'application/json')
    .send(typeof body === 'string' ? body : JSON.stringify(body));

const waiting = () => ctx.h.queue.bull.getJobs(['waiting']);

describe('payload shape: an object with an "alerts" array, else 422', () => {
  it('invalid JSON -> 400', async () => {
    const res = await post('{"alerts": [');
    expect(res.status).toBe(400);
  });
  it.each([['[]'], ['"text"'], ['42'], ['null'], ['{}'], ['{"alerts": {}}'], ['{"alerts": "x"}']])(
    '%s -> 422 {detail, code: invalid_alerts}',
    async (body) => {
      const res = await post(body);
      expect(res.status).toBe(422);
      expect(res.body).toEqual({ detail: expect.any(String), code: 'invalid_alerts' });
    },
  );
  it('empty alerts array -> 202 {received:0, firing:0}', async () => {
    const res = await post({ alerts: [] });
    expect(res.status).toBe(202);
    expect(res.body).toEqual({ received: 0, firing: 0, job_ids: [] });
  });
});

describe('firing alerts with a fingerprint are deduplicated (300 s) and queued; the counts are answered', () => {
  it('counts received and firing; queues one notify_oncall per firing alert with a fingerprint', async () => {
    const res = await post({
      version: '4',
      status: 'firing',
      alerts: [alert('fp1'), alert('fp2', 'resolved'), alert(undefined), alert('fp3'), 'not-an-object'],
    });
    expect(res.status).toBe(202);
    expect(res.body).toEqual({ received: 5, firing: 3, job_ids: [expect.any(String), expect.any(String)] });
    const jobs = await waiting();
    expect(jobs.map((j) => j.data.fingerprint).sort()).toEqual(['fp1', 'fp3']);
    // The answer names the jobs it queued, in payload order.
    expect(res.body.job_ids).toEqual(['fp1', 'fp3'].map((fp) => jobs.find((j) => j.data.fingerprint === fp)!.id));
    for (const j of jobs) {
      expect(j.name).toBe(JOB.notifyOncall);
      expect(j.data).toMatchObject({ requested_by: 'webhook:alerts', alertname: `Alert-${j.data.fingerprint}` });
      expect(j.data.annotations).toEqual({ summary: `summary of ${j.data.fingerprint}` });
    }
    const ttl = await ctx.h.inspect.ttl(dedupKey(ctx.h.queue, 'alert:fp1'));
    expect(ttl).toBeGreaterThan(290);
    expect(ttl).toBeLessThanOrEqual(300);
    expect(await ctx.h.inspect.exists(dedupKey(ctx.h.queue, 'alert:fp2'))).toBe(0);
  });
  it('defaults: alertname "unknown", annotations {}', async () => {
    await post({ alerts: [{ status: 'firing', fingerprint: 'bare' }] });
    const [job] = await waiting();
    expect(job!.data).toMatchObject({ alertname: 'unknown', annotations: {}, fingerprint: 'bare' });
  });
  it('a repeated fingerprint within 300 s is not queued again; the counts are still returned', async () => {
    await post({ alerts: [alert('dup')] });
    const res = await post({ alerts: [alert('dup'), alert('new')] });
    expect(res.status).toBe(202);
    expect(res.body).toEqual({ received: 2, firing: 2, job_ids: [expect.any(String)] });
    const jobs = await waiting();
    expect(jobs.map((j) => j.data.fingerprint).sort()).toEqual(['dup', 'new']);
    expect(res.body.job_ids).toEqual([jobs.find((j) => j.data.fingerprint === 'new')!.id]);
  });
  it('the same fingerprint twice in one payload is queued once', async () => {
    await post({ alerts: [alert('twice'), alert('twice')] });
    expect(await waiting()).toHaveLength(1);
  });
  it('each delivery gets an audit line (who webhook:alerts)', async () => {
    await post({ alerts: [] }).set('X-Request-Id', 'alerts-audit-1');
    expect(ctx.h.audits().find((a) => a.caller_request_id === 'alerts-audit-1')).toMatchObject({ who: 'webhook:alerts', status: 202 });
  });
});

describe('enqueue failure: 503 + Retry-After, the failed alert is retried, none queued twice', () => {
  it('queue Redis down -> 503, nothing recorded; Alertmanager retry queues each alert once', async () => {
    const queueSrv = await startRedis();
    const split = await createHarness(ctx.srv.url, { queueUrl: queueSrv.url });
    try {
      await split.queue.bull.waitUntilReady();
      await queueSrv.stop();
      const body = { alerts: [alert('q1'), alert('q2')] };
      const res = await request(split.app).post('/webhook/alerts').send(body);
      expect(res.status).toBe(503);
      expect(res.headers['retry-after']).toMatch(/^\d+$/);
      await queueSrv.start();
      await eventually(async () => (await request(split.app).post('/webhook/alerts').send(body)).status === 202);
      const jobs = await split.queue.bull.getJobs(['waiting']);
      expect(jobs.map((j) => j.data.fingerprint).sort()).toEqual(['q1', 'q2']);
    } finally {
      await split.close();
      await queueSrv.destroy();
    }
  });
  it('Redis down -> 503 + Retry-After', async () => {
    const own = await startRedis();
    const hh = await createHarness(own.url);
    try {
      await own.stop();
      const res = await request(hh.app)
        .post('/webhook/alerts')
        .send({ alerts: [alert('x')] });
      expect(res.status).toBe(503);
      expect(res.headers['retry-after']).toBeDefined();
    } finally {
      await hh.close();
      await own.destroy();
    }
  });
});

describe('ALERTS_WEBHOOK_TOKEN', () => {
  it('unset: a warning is logged when the app is built', () => {
    expect(ctx.h.logs().some((l) => l.level === 'warn' && String(l.msg).includes('ALERTS_WEBHOOK_TOKEN'))).toBe(true);
  });
  it('set: Bearer required (401 + WWW-Authenticate without or with a wrong token; 202 with it, scheme case-insensitive)', async () => {
    const token = 'alerts-token-0099';
    const t = await createHarness(ctx.srv.url, { env: { ALERTS_WEBHOOK_TOKEN: token } });
    try {
      expect(t.logs().some((l) => String(l.msg).includes('ALERTS_WEBHOOK_TOKEN'))).toBe(false);
      const none = await request(t.app).post('/webhook/alerts').send({ alerts: [] });
      expect(none.status).toBe(401);
      expect(none.headers['www-authenticate']).toMatch(/^Bearer/);
      const wrong = await request(t.app).post('/webhook/alerts').set('Authorization', 'Bearer nope').send({ alerts: [] });
      expect(wrong.status).toBe(401);
      const bad = await request(t.app).post('/webhook/alerts').set('Authorization', 'Bearer nope').send('{bad json');
      expect(bad.status).toBe(401);
      const ok = await request(t.app).post('/webhook/alerts').set('Authorization', `bEaReR ${token}`).send({ alerts: [] });
      expect(ok.status).toBe(202);
      expect(t.lines.join('\n')).not.toContain(token);
    } finally {
      await t.close();
    }
  });
});
