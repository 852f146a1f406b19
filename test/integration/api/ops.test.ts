import { describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { startRedis } from '../../helpers/redis.js';
import { credentialId } from '../../../src/shared/crypto.js';
import { JOB } from '../../../src/shared/jobs.js';
import { BEARER, BEARER_OWNER, containsSecret, createHarness, OP_KEY, OP_KEY_2, RO_KEY, useHarness } from '../../helpers/apiHarness.js';
import { enqueue } from '../../helpers/queueOps.js';

/**
 * /ops/hosts, /ops/restart, /ops/cache, /ops/jobs/:id with the contract's auth: X-API-Key (missing
 * or unknown 401, a readonly key on an operator endpoint 403) and the bearer token (401).
 */
const ctx = useHarness();

describe('GET /ops/hosts (any valid X-API-Key)', () => {
  it('readonly key -> 200 host names from the inventory', async () => {
    const res = await request(ctx.h.app).get('/ops/hosts').set('X-API-Key', RO_KEY);
    expect(res.status).toBe(200);
    expect(res.body).toEqual({ hosts: ['db-1', 'web-1'] });
  });
  it('operator keys (several, for rotation) -> 200', async () => {
    for (const key of [OP_KEY, OP_KEY_2]) {
      const res = await request(ctx.h.app).get('/ops/hosts').set('X-API-Key', key);
      expect(res.status).toBe(200);
    }
  });
  it.each([
    ['missing', undefined],
    ['empty', ''],
    ['unknown', 'not-a-key'],
    ['prefix of a key', RO_KEY.slice(0, -1)],
    ['key plus role suffix', `${RO_KEY}:readonly`],
  ])('%s key -> 401 {detail, code}', async (_name, key) => {
    let req = request(ctx.h.app).get('/ops/hosts');
    if (key !== undefined) req = req.set('X-API-Key', key);
    const res = await req;
    expect(res.status).toBe(401);
    expect(res.body).toEqual({ detail: expect.any(String), code: key ? 'invalid_api_key' : 'missing_api_key' });
  });
  it('counts api_key failures by reason', async () => {
    await request(ctx.h.app).get('/ops/hosts');
    await request(ctx.h.app).get('/ops/hosts').set('X-API-Key', 'nope');
    const text = await ctx.h.metrics.registry.getSingleMetricAsString('opsgate_auth_failures_total');
    expect(text).toMatch(/scheme="api_key",reason="missing"} [1-9]/);
    expect(text).toMatch(/scheme="api_key",reason="invalid"} [1-9]/);
  });
  it('POST /ops/hosts -> 405 with Allow', async () => {
    const res = await request(ctx.h.app).post('/ops/hosts').set('X-API-Key', OP_KEY);
    expect(res.status).toBe(405);
    expect(res.headers.allow).toContain('GET');
  });
});

describe('POST /ops/restart (bearer)', () => {
  /** auth null: no Authorization header at all. */
  const restart = (qs: string, auth: string | null = `Bearer ${BEARER}`) => {
    const req = request(ctx.h.app).post(`/ops/restart${qs}`);
    return auth === null ? req : req.set('Authorization', auth);
  };

  it('valid bearer, inventory host and service -> 200 ack + job_id; one restart_service job', async () => {
    const res = await restart('?host=web-1&service=checkout').set('X-Request-Id', 'restart-1');
    expect(res.status).toBe(200);
    expect(res.body).toEqual({ host: 'web-1', service: 'checkout', status: 'submitted', job_id: expect.any(String), coalesced: false });
    const job = await ctx.h.queue.bull.getJob(res.body.job_id);
    expect(job?.name).toBe(JOB.restartService);
    expect(job?.data).toEqual({
      host: 'web-1',
      service: 'checkout',
      audit_id: res.headers['x-request-id'], // our id, never the caller's X-Request-Id
      requested_by: `bearer:${credentialId(BEARER)}`,
      requested_owner: BEARER_OWNER,
      requested_credential: credentialId(BEARER),
    });
  });
  it.each([['bearer'], ['BEARER'], ['BeArEr']])('scheme %s is accepted (case-insensitive)', async (scheme) => {
    const res = await restart('?host=web-1&service=frontend', `${scheme} ${BEARER}`);
    expect(res.status).toBe(200);
  });
  it.each([
    ['missing', null],
    ['empty', ''],
    ['other scheme', `Basic ${Buffer.from(`u:${BEARER}`).toString('base64')}`],
    ['token without scheme', BEARER],
    ['scheme without token', 'Bearer'],
    ['wrong token', 'Bearer wrong-token'],
    ['token with extra suffix', `Bearer ${BEARER}x`],
  ])('%s -> 401 with WWW-Authenticate', async (_n, auth) => {
    const res = await restart('?host=web-1&service=frontend', auth);
    expect(res.status).toBe(401);
    expect(res.headers['www-authenticate']).toMatch(/^Bearer realm="opsgate"/);
    expect(res.body).toEqual({
      detail: expect.any(String),
      code: expect.stringMatching(/^(missing_credentials|unsupported_auth_scheme|invalid_bearer_token)$/),
    });
    expect(await ctx.h.queue.bull.getJobs(['waiting'])).toHaveLength(0);
  });
  it('OPS_BEARER_TOKEN unset -> 401 even for a "matching" empty token', async () => {
    const other = await createHarness(ctx.srv.url, { env: { OPS_BEARER_TOKEN: '' } });
    try {
      for (const auth of ['Bearer ', `Bearer ${BEARER}`, 'Bearer ""']) {
        const res = await request(other.app).post('/ops/restart?host=web-1&service=frontend').set('Authorization', auth);
        expect(res.status).toBe(401);
        expect(res.headers['www-authenticate']).toBeDefined();
      }
    } finally {
      await other.close();
    }
  });
  it('auth is checked before the query (no credentials + no params -> 401)', async () => {
    const res = await restart('', null);
    expect(res.status).toBe(401);
  });
  it.each([
    ['', /host/],
    ['?host=web-1', /service/],
    ['?service=frontend', /host/],
    ['?host=&service=frontend', /host/],
    ['?host=web-1&service=', /service/],
    ['?host=web-1&host=db-1&service=frontend', /host/],
  ])('query %j -> 422 {detail}', async (qs, re) => {
    const res = await restart(qs);
    expect(res.status).toBe(422);
    expect(res.body.detail).toMatch(re);
    expect(res.body.code).toBe('invalid_query');
  });
  it.each([
    ['?host=web-9&service=frontend', 'unknown host'],
    ['?host=web-1&service=postgres-exporter', 'unknown service for this host'],
    ['?host=__proto__&service=frontend', 'unknown host'],
    ['?host=web-1&service=constructor', 'unknown service for this host'],
  ])('%s -> 404', async (qs, detail) => {
    const res = await restart(qs);
    expect(res.status).toBe(404);
    expect(res.body).toEqual({ detail, code: detail === 'unknown host' ? 'unknown_host' : 'unknown_service' });
  });
  it('a body is ignored (spec: no body) but hashed in the audit line', async () => {
    const res = await restart('?host=db-1&service=postgres-exporter').set('X-Request-Id', 'restart-audit').send('{"x":1}');
    expect(res.status).toBe(200);
    const line = ctx.h.audits().find((a) => a.caller_request_id === 'restart-audit');
    expect(line).toMatchObject({
      who: `bearer:${credentialId(BEARER)}`,
      method: 'POST',
      path: '/ops/restart',
      status: 200,
      route: '/ops/restart',
      query: 'host=db-1&service=postgres-exporter',
    });
    expect(line!.body_sha256).toMatch(/^[0-9a-f]{64}$/);
  });
  it('refused calls are audited too, without the presented token', async () => {
    await restart('?host=web-1&service=frontend', 'Bearer some-wrong-token-123').set('X-Request-Id', 'restart-denied');
    const line = ctx.h.audits().find((a) => a.caller_request_id === 'restart-denied');
    expect(line).toMatchObject({ who: 'anonymous', status: 401, presented_credential: `bearer:${credentialId('some-wrong-token-123')}` });
    expect(ctx.h.lines.join('\n')).not.toContain('some-wrong-token-123');
  });
  it('Redis down -> 503 + Retry-After', async () => {
    const own = await startRedis();
    const hh = await createHarness(own.url);
    try {
      await own.stop();
      const res = await request(hh.app).post('/ops/restart?host=web-1&service=frontend').set('Authorization', `Bearer ${BEARER}`);
      expect(res.status).toBe(503);
      expect(res.headers['retry-after']).toMatch(/^\d+$/);
    } finally {
      await hh.close();
      await own.destroy();
    }
  });
  it('GET /ops/restart -> 405 Allow: POST', async () => {
    const res = await request(ctx.h.app).get('/ops/restart');
    expect(res.status).toBe(405);
    expect(res.headers.allow).toBe('POST');
  });
});

describe('DELETE /ops/cache (operator)', () => {
  it('operator -> 200 {cleared:true}, removes the cache keys and nothing else', async () => {
    await ctx.h.inspect.set('opsgate:cache:host-status:web-1', '{}', 'EX', 30);
    await ctx.h.inspect.set('opsgate:cache:host-status:db-1', '{}', 'EX', 30);
    await ctx.h.inspect.set('opsgate:seen:scm:keep', '1', 'EX', 100);
    const res = await request(ctx.h.app).delete('/ops/cache').set('X-API-Key', OP_KEY);
    expect(res.status).toBe(200);
    expect(res.body).toEqual({ cleared: true });
    expect(await ctx.h.inspect.keys('opsgate:cache:*')).toEqual([]);
    expect(await ctx.h.inspect.exists('opsgate:seen:scm:keep')).toBe(1);
  });
  it('empty cache -> still 200 {cleared:true}', async () => {
    const res = await request(ctx.h.app).delete('/ops/cache').set('X-API-Key', OP_KEY_2);
    expect(res.body).toEqual({ cleared: true });
  });
  it('readonly key -> 403 {detail, code}, cache kept', async () => {
    await ctx.h.inspect.set('opsgate:cache:host-status:web-1', '{}', 'EX', 30);
    const res = await request(ctx.h.app).delete('/ops/cache').set('X-API-Key', RO_KEY);
    expect(res.status).toBe(403);
    expect(res.body).toEqual({ detail: expect.any(String), code: 'operator_role_required' });
    expect(await ctx.h.inspect.exists('opsgate:cache:host-status:web-1')).toBe(1);
  });
  it.each([[undefined], [''], ['bad-key']])('key %j -> 401', async (key) => {
    let req = request(ctx.h.app).delete('/ops/cache');
    if (key !== undefined) req = req.set('X-API-Key', key);
    expect((await req).status).toBe(401);
  });
  it('audit line with the key id, never the key', async () => {
    await request(ctx.h.app).delete('/ops/cache').set('X-API-Key', OP_KEY).set('X-Request-Id', 'cache-audit');
    const line = ctx.h.audits().find((a) => a.caller_request_id === 'cache-audit');
    expect(line).toMatchObject({ who: `key:${credentialId(OP_KEY)}`, role: 'operator', method: 'DELETE', path: '/ops/cache', status: 200 });
    expect(line!.body_sha256).toBe('e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855');
    expect(containsSecret(ctx.h.lines.join('\n'))).toBeUndefined();
  });
  it('Redis down -> 503 + Retry-After', async () => {
    const own = await startRedis();
    const hh = await createHarness(own.url);
    try {
      await own.stop();
      const res = await request(hh.app).delete('/ops/cache').set('X-API-Key', OP_KEY);
      expect(res.status).toBe(503);
      expect(res.headers['retry-after']).toBeDefined();
    } finally {
      await hh.close();
      await own.destroy();
    }
  });
});

describe('GET /ops/jobs/:id (any valid key)', () => {
  it('shows state and bookkeeping of a queued job, never its data', async () => {
    const ack = await request(ctx.h.app).post('/ops/restart?host=web-1&service=frontend').set('Authorization', `Bearer ${BEARER}`);
    const res = await request(ctx.h.app).get(`/ops/jobs/${ack.body.job_id}`).set('X-API-Key', RO_KEY);
    expect(res.status).toBe(200);
    expect(res.body).toEqual({
      id: ack.body.job_id,
      name: JOB.restartService,
      state: 'waiting',
      attempts_made: 0,
      attempts_max: ctx.h.config.JOB_ATTEMPTS,
      failed_reason: null,
      progress: 0,
      created_at: expect.stringMatching(/^\d{4}-\d\d-\d\dT/),
      processed_at: null,
      finished_at: null,
    });
    expect(JSON.stringify(res.body)).not.toContain('audit_id');
  });
  it('reports a dead-lettered job with its failed reason', async () => {
    const id = await enqueue(ctx.h.queue, JOB.restartService, { host: 'web-1', service: 'frontend', audit_id: 'a', requested_by: 'test' });
    // Move it to failed the way a worker would (real BullMQ: take the job with a token, fail it).
    const { Worker } = await import('bullmq');
    const w = new Worker('ops', null, { connection: { url: ctx.srv.url }, autorun: false });
    try {
      const job = await w.getNextJob('tok');
      expect(job?.id).toBe(id);
      job.opts.attempts = 1;
      await job.moveToFailed(new Error('deployment frontend not found'), 'tok', false);
    } finally {
      await w.close();
    }
    const res = await request(ctx.h.app).get(`/ops/jobs/${id}`).set('X-API-Key', OP_KEY);
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ id, state: 'failed', failed_reason: 'deployment frontend not found', attempts_made: 1 });
    expect(res.body.finished_at).toMatch(/^\d{4}-/);
  });
  it.each([['999999'], ['no-such-job'], ['%2e%2e'], ['a'.repeat(200)]])('unknown or malformed id %s -> 404', async (id) => {
    const res = await request(ctx.h.app).get(`/ops/jobs/${id}`).set('X-API-Key', RO_KEY);
    expect(res.status).toBe(404);
    expect(res.body).toEqual({ detail: 'job not found', code: 'job_not_found' });
  });
  it('no key -> 401', async () => {
    expect((await request(ctx.h.app).get('/ops/jobs/1')).status).toBe(401);
  });
  it('metrics use the route template, never the raw path', async () => {
    await request(ctx.h.app).get('/ops/jobs/12345').set('X-API-Key', RO_KEY);
    const text = await ctx.h.metrics.registry.getSingleMetricAsString('opsgate_http_requests_total');
    expect(text).toContain('route="/ops/jobs/:id"');
    expect(text).not.toContain('/ops/jobs/12345');
  });
  it('Redis down -> 503', async () => {
    const own = await startRedis();
    const hh = await createHarness(own.url);
    try {
      await own.stop();
      const res = await request(hh.app).get('/ops/jobs/1').set('X-API-Key', RO_KEY);
      expect(res.status).toBe(503);
      expect(res.headers['retry-after']).toBeDefined();
    } finally {
      await hh.close();
      await own.destroy();
    }
  });
});
