import { describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { startRedis } from '../../helpers/redis.js';
import { JOB } from '../../../src/shared/jobs.js';
import { containsSecret, createHarness, eventually, SCM_SECRET, useHarness } from '../../helpers/apiHarness.js';
import { dedupKey, stateKeys } from '../../helpers/queueOps.js';

/** POST /webhook/scm as the contract describes it, rule after rule in its order, on a real Redis with the real BullMQ queue. */
const ctx = useHarness();

const push = (sha = 'a1b2c3', overrides: Record<string, unknown> = {}) => ({
  object_kind: 'push',
  ref: 'refs/heads/main',
  checkout_sha: sha,
  project: { path_with_namespace: 'group/app' },
  ...overrides,
});

const post = (body: unknown, headers: Record<string, string> = {}) => {
  let req = request(ctx.h.app).post('/webhook/scm').set('Content-Type', 'application/json');
  for (const [k, v] of Object.entries({ 'X-Scm-Token': SCM_SECRET, 'X-Scm-Event': 'Push Hook', ...headers })) {
    if (v !== '') req = req.set(k, v);
  }
  return req.send(typeof body === 'string' ? body : JSON.stringify(body));
};

const jobsInQueue = async () => ctx.h.queue.bull.getJobs(['waiting', 'delayed', 'active', 'completed', 'failed', 'prioritized']);

describe('the token is verified first (403)', () => {
  it('missing token -> 403 {detail, code}', async () => {
    const res = await post(push(), { 'X-Scm-Token': '' });
    expect(res.status).toBe(403);
    expect(res.body).toEqual({ detail: 'missing X-Scm-Token header', code: 'missing_webhook_token' });
  });
  it('wrong token -> 403, and nothing recorded or queued', async () => {
    const res = await post(push(), { 'X-Scm-Token': SCM_SECRET + 'x' });
    expect(res.status).toBe(403);
    expect(res.body).toEqual({ detail: 'invalid X-Scm-Token', code: 'invalid_webhook_token' });
    expect(await stateKeys(ctx.h.inspect)).toEqual([]);
  });
  it('bad token with an invalid JSON body -> 403, not 400 (token before parsing)', async () => {
    const res = await post('{not json', { 'X-Scm-Token': 'nope' });
    expect(res.status).toBe(403);
  });
  it('bad token with a body over BODY_LIMIT -> 403, not 413 (body not read before verification)', async () => {
    const res = await post('x'.repeat(2 * 1024 * 1024), { 'X-Scm-Token': 'nope' });
    expect(res.status).toBe(403);
  });
  it('a refused delivery is audited: source scm, who anonymous, the presented token only as its id', async () => {
    await post(push(), { 'X-Scm-Token': 'wrong-token-777' }).set('X-Request-Id', 'scm-denied-1');
    const line = ctx.h.audits().find((a) => a.caller_request_id === 'scm-denied-1');
    expect(line).toMatchObject({ who: 'anonymous', source: 'scm', status: 403, path: '/webhook/scm' });
    expect(line!.presented_credential).toMatch(/^scm_token:[0-9a-f]{12}$/);
    expect(ctx.h.lines.join('\n')).not.toContain('wrong-token-777');
  });
  it('secret not configured -> 403 for any token', async () => {
    const other = await createHarness(ctx.srv.url, { env: { SCM_WEBHOOK_SECRET: '' } });
    try {
      const res = await request(other.app).post('/webhook/scm').set('X-Scm-Token', '').set('X-Scm-Event', 'Push Hook').send(push());
      expect(res.status).toBe(403);
      const res2 = await request(other.app).post('/webhook/scm').set('X-Scm-Token', 'anything').send(push());
      expect(res2.status).toBe(403);
    } finally {
      await other.close();
    }
  });
  it('counts the failure in opsgate_auth_failures_total{scheme="scm_token"}', async () => {
    await post(push(), { 'X-Scm-Token': 'wrong' });
    const text = await ctx.h.metrics.registry.getSingleMetricAsString('opsgate_auth_failures_total');
    expect(text).toMatch(/scheme="scm_token",reason="invalid"} [1-9]/);
  });
});

describe('the body is parsed as JSON after verification', () => {
  it('valid token + invalid JSON -> 400 {detail, code}', async () => {
    const res = await post('{not json');
    expect(res.status).toBe(400);
    expect(res.body.detail).toMatch(/JSON/);
    expect(res.body.code).toBe('invalid_json');
  });
  it('valid token + empty body -> 400', async () => {
    const res = await request(ctx.h.app).post('/webhook/scm').set('X-Scm-Token', SCM_SECRET).set('X-Scm-Event', 'Push Hook');
    expect(res.status).toBe(400);
  });
  it('valid token + body over BODY_LIMIT -> 413 {detail, code}', async () => {
    const res = await post(JSON.stringify({ ref: 'refs/heads/main', pad: 'x'.repeat(1024 * 1024 + 10) }));
    expect(res.status).toBe(413);
    expect(res.body).toEqual({ detail: expect.any(String), code: 'payload_too_large' });
  });
  it('invalid JSON with a non-push event header -> 400 (parse comes before the event check)', async () => {
    const res = await post('[1,', { 'X-Scm-Event': 'Tag Push Hook' });
    expect(res.status).toBe(400);
  });
});

describe('the event header must be exactly "Push Hook"', () => {
  it.each([['Tag Push Hook'], ['push hook'], ['Push  Hook'], ['PUSH HOOK'], ['']])('X-Scm-Event %j -> 202 ignored', async (event) => {
    const res = await post(push(), { 'X-Scm-Event': event });
    expect(res.status).toBe(202);
    expect(res.body.ignored).toBe(true);
    expect(res.body.reason).toMatch(/not a push/);
    expect(await jobsInQueue()).toHaveLength(0);
  });
  it('event check comes before the ref and sha checks', async () => {
    const res = await post({ ref: 'refs/heads/dev' }, { 'X-Scm-Event': 'Merge Request Hook' });
    expect(res.status).toBe(202);
    expect(res.body.reason).toMatch(/not a push/);
  });
});

describe('the ref must be exactly refs/heads/main', () => {
  it('another ref -> 202 ignored, the reason names the ref', async () => {
    const res = await post(push('abc', { ref: 'refs/heads/feature-x' }));
    expect(res.status).toBe(202);
    expect(res.body).toEqual({ ignored: true, reason: expect.stringContaining('refs/heads/feature-x') });
  });
  it('absent ref (default "") -> 202 ignored, before the checkout_sha check', async () => {
    const res = await post({ project: { path_with_namespace: 'g/p' } });
    expect(res.status).toBe(202);
    expect(res.body.ignored).toBe(true);
  });
  it('ref check precedes the sha check (other ref and no sha -> ignored, not 422)', async () => {
    const res = await post({ ref: 'refs/tags/v1' });
    expect(res.status).toBe(202);
    expect(res.body.reason).toContain('refs/tags/v1');
  });
});

describe('checkout_sha is required (422)', () => {
  it.each([[undefined], [''], [null]])('checkout_sha %j -> 422 {detail, code}', async (sha) => {
    const body: Record<string, unknown> = { ref: 'refs/heads/main', project: { path_with_namespace: 'g/p' } };
    if (sha !== undefined) body.checkout_sha = sha;
    const res = await post(body);
    expect(res.status).toBe(422);
    expect(res.body.detail).toMatch(/checkout_sha/);
    expect(res.body.code).toBe('missing_commit');
    expect(await stateKeys(ctx.h.inspect)).toEqual([]);
  });
  it('a JSON body that is not an object -> 422', async () => {
    const res = await post('[1,2]');
    expect(res.status).toBe(422);
  });
});

describe('event_id, seen record for 24 h, one job, duplicates', () => {
  it('accepts, records the event for 24 h and enqueues exactly one run_deploy_pipeline job', async () => {
    const res = await post(push('deadbeef'));
    expect(res.status).toBe(202);
    expect(res.body).toEqual({
      accepted: true,
      duplicate: false,
      project: 'group/app',
      event_id: 'scm:group/app:refs/heads/main:deadbeef',
      job_id: expect.any(String),
    });
    const ttl = await ctx.h.inspect.ttl(dedupKey(ctx.h.queue, 'scm:group/app:refs/heads/main:deadbeef'));
    expect(ttl).toBeGreaterThan(86400 - 10);
    expect(ttl).toBeLessThanOrEqual(86400);
    const jobs = await jobsInQueue();
    expect(jobs).toHaveLength(1);
    expect(jobs[0]!.name).toBe(JOB.runDeployPipeline);
    expect(jobs[0]!.data).toMatchObject({
      project: 'group/app',
      ref: 'refs/heads/main',
      event_id: 'scm:group/app:refs/heads/main:deadbeef',
      requested_by: 'webhook:scm',
    });
    expect(jobs[0]!.data.audit_id).toBe(res.headers['x-request-id']);
    expect(jobs[0]!.opts.attempts).toBe(ctx.h.config.JOB_ATTEMPTS);
    expect(jobs[0]!.id).toBe(res.body.job_id);
    expect(jobs[0]!.data.sha).toBe('deadbeef');
  });

  it('second delivery of the same event -> 202 duplicate:true, still exactly one job', async () => {
    const first = await post(push('cafe01'));
    const second = await post(push('cafe01'));
    expect(first.body.accepted).toBe(true);
    expect(second.status).toBe(202);
    expect(second.body).toEqual({
      accepted: false,
      duplicate: true,
      project: 'group/app',
      event_id: 'scm:group/app:refs/heads/main:cafe01',
      // A duplicate carries the original job's id.
      job_id: first.body.job_id,
    });
    expect(await jobsInQueue()).toHaveLength(1);
    expect((await jobsInQueue())[0]!.id).toBe(first.body.job_id);
  });

  it('concurrent deliveries of one event -> exactly one accepted, one job', async () => {
    const results = await Promise.all(Array.from({ length: 8 }, () => post(push('race01'))));
    expect(results.map((r) => r.status)).toEqual(Array(8).fill(202));
    expect(results.filter((r) => r.body.accepted === true)).toHaveLength(1);
    expect(results.filter((r) => r.body.duplicate === true)).toHaveLength(7);
    expect(await jobsInQueue()).toHaveLength(1);
    expect(new Set(results.map((r) => r.body.job_id))).toEqual(new Set([(await jobsInQueue())[0]!.id]));
  });

  it('project defaults to "unknown" when absent', async () => {
    const res = await post({ ref: 'refs/heads/main', checkout_sha: 'f00' });
    expect(res.status).toBe(202);
    expect(res.body).toMatchObject({ accepted: true, project: 'unknown', event_id: 'scm:unknown:refs/heads/main:f00' });
  });

  it('different shas are different events', async () => {
    await post(push('s1'));
    const res = await post(push('s2'));
    expect(res.body.accepted).toBe(true);
    expect(await jobsInQueue()).toHaveLength(2);
  });

  it('counts outcomes in opsgate_webhook_events_total and jobs in opsgate_jobs_enqueued_total', async () => {
    await post(push('m1'));
    await post(push('m1'));
    const events = await ctx.h.metrics.registry.getSingleMetricAsString('opsgate_webhook_events_total');
    expect(events).toMatch(/source="scm",outcome="accepted"} [1-9]/);
    expect(events).toMatch(/source="scm",outcome="duplicate"} [1-9]/);
    const enq = await ctx.h.metrics.registry.getSingleMetricAsString('opsgate_jobs_enqueued_total');
    expect(enq).toMatch(/name="ops_worker.run_deploy_pipeline"} [1-9]/);
  });

  it('writes one audit line per delivery with source, body sha256, status and request id; no secret in logs', async () => {
    const body = JSON.stringify(push('audit1'));
    const res = await post(body).set('X-Request-Id', 'req-scm-audit-1');
    expect(res.headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/); // ours, never the caller's
    const lines = ctx.h.audits().filter((a) => a.caller_request_id === 'req-scm-audit-1');
    expect(lines).toHaveLength(1);
    const { createHash } = await import('node:crypto');
    expect(lines[0]).toMatchObject({
      request_id: res.headers['x-request-id'],
      who: 'webhook:scm',
      method: 'POST',
      path: '/webhook/scm',
      status: 202,
      body_sha256: createHash('sha256').update(body).digest('hex'),
    });
    expect(containsSecret(ctx.h.lines.join('\n'))).toBeUndefined();
  });
});

describe('a failed enqueue leaves no seen record, and Redis failures: 503 + Retry-After, never lost', () => {
  it('enqueue fails (queue Redis down) -> nothing recorded, 503 with Retry-After; retry accepted once the queue is back', async () => {
    const queueSrv = await startRedis();
    const split = await createHarness(ctx.srv.url, { queueUrl: queueSrv.url });
    try {
      await split.queue.bull.waitUntilReady();
      await queueSrv.stop();
      const res = await request(split.app)
        .post('/webhook/scm')
        .set('X-Scm-Token', SCM_SECRET)
        .set('X-Scm-Event', 'Push Hook')
        .send(push('rule9'));
      expect(res.status).toBe(503);
      expect(res.headers['retry-after']).toMatch(/^\d+$/);
      expect(res.body).toEqual({ detail: expect.any(String), code: 'queue_unavailable' });
      // Nothing was recorded (the record is written with the job or not at all): the sender's retry is delivered.

      await queueSrv.start();
      let retry: request.Response | undefined;
      await eventually(async () => {
        retry = await request(split.app)
          .post('/webhook/scm')
          .set('X-Scm-Token', SCM_SECRET)
          .set('X-Scm-Event', 'Push Hook')
          .send(push('rule9'));
        return retry.status === 202;
      });
      expect(retry!.body).toMatchObject({ accepted: true, duplicate: false });
      const jobs = await split.queue.bull.getJobs(['waiting']);
      expect(jobs.map((j) => j.data.event_id)).toEqual(['scm:group/app:refs/heads/main:rule9']);
      const failed = await split.metrics.registry.getSingleMetricAsString('opsgate_webhook_events_total');
      expect(failed).toMatch(/source="scm",outcome="failed"} [1-9]/);
    } finally {
      await split.close();
      await queueSrv.destroy();
    }
  });

  it('Redis stopped -> 503 + Retry-After quickly (no hang); after Redis is back the same event is accepted', async () => {
    const own = await startRedis();
    const hh = await createHarness(own.url);
    try {
      await own.stop();
      const started = Date.now();
      const res = await request(hh.app)
        .post('/webhook/scm')
        .set('X-Scm-Token', SCM_SECRET)
        .set('X-Scm-Event', 'Push Hook')
        .send(push('down1'));
      expect(res.status).toBe(503);
      expect(Number(res.headers['retry-after'])).toBeGreaterThan(0);
      expect(Date.now() - started).toBeLessThan(10000);
      expect(JSON.stringify(res.body)).not.toMatch(/at .*\.ts|ECONNREFUSED|stack/);

      await own.start();
      let retry: request.Response | undefined;
      await eventually(async () => {
        retry = await request(hh.app)
          .post('/webhook/scm')
          .set('X-Scm-Token', SCM_SECRET)
          .set('X-Scm-Event', 'Push Hook')
          .send(push('down1'));
        return retry.status === 202;
      });
      expect(retry!.body).toMatchObject({ accepted: true, duplicate: false, event_id: 'scm:group/app:refs/heads/main:down1' });
      expect(await hh.queue.bull.getJobs(['waiting'])).toHaveLength(1);
    } finally {
      await hh.close();
      await own.destroy();
    }
  });
});

describe('method handling', () => {
  it('GET /webhook/scm -> 405 JSON with Allow: POST', async () => {
    const res = await request(ctx.h.app).get('/webhook/scm');
    expect(res.status).toBe(405);
    expect(res.headers.allow).toBe('POST');
    expect(res.headers['content-type']).toMatch(/application\/json/);
  });
  it('unknown source /webhook/nonesuch -> 404 JSON', async () => {
    const res = await request(ctx.h.app).post('/webhook/nonesuch').send('{}');
    expect(res.status).toBe(404);
    expect(res.body).toEqual({ detail: 'not found', code: 'not_found' });
  });
});
