import { describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { startRedis } from '../../helpers/redis.js';
import { createRateLimiter } from '../../../src/middleware/rateLimit.js';
import { ERROR_CODES, type ErrorCode } from '../../../src/shared/errors.js';
import { BEARER, createHarness, OP_KEY, RO_KEY, SCM_SECRET, useHarness } from '../../helpers/apiHarness.js';

/** Probes, version, and the HTTP-level error contract: every error is JSON {detail, code}, never an HTML page or a stack. */
const ctx = useHarness({ flush: false });

const expectJsonError = (res: request.Response, status: number) => {
  expect(res.status).toBe(status);
  expect(res.headers['content-type']).toMatch(/^application\/json/);
  expect(res.body).toEqual({ detail: expect.any(String), code: expect.any(String) });
  expect(ERROR_CODES[res.body.code as ErrorCode]?.status).toBe(status);
  expect(res.text).not.toMatch(/<html|<pre>|<!DOCTYPE|\bat \S+ \(|node_modules/i);
};

describe('GET /health, /ready, /version', () => {
  it('/health -> 200 {status:"ok"} without authentication', async () => {
    const res = await request(ctx.h.app).get('/health');
    expect(res.status).toBe(200);
    expect(res.body).toEqual({ status: 'ok' });
  });
  it('/health ignores credentials entirely (a bad key is not a 401)', async () => {
    const res = await request(ctx.h.app).get('/health').set('X-API-Key', 'bad').set('Authorization', 'Bearer bad');
    expect(res.status).toBe(200);
  });
  it('HEAD /health -> 200', async () => {
    expect((await request(ctx.h.app).head('/health')).status).toBe(200);
  });
  it('/ready -> 200 while Redis answers', async () => {
    const res = await request(ctx.h.app).get('/ready');
    expect(res.status).toBe(200);
    expect(res.body).toEqual({ status: 'ready' });
  });
  it('/version -> the build version', async () => {
    const res = await request(ctx.h.app).get('/version');
    expect(res.status).toBe(200);
    expect(res.body).toEqual({ version: '9.9.9-test', node: process.version });
  });
  it('/ready -> 503 + Retry-After when Redis is down, /health stays 200; /ready recovers', async () => {
    const own = await startRedis();
    const hh = await createHarness(own.url);
    try {
      await own.stop();
      const res = await request(hh.app).get('/ready');
      expectJsonError(res, 503);
      expect(res.headers['retry-after']).toMatch(/^\d+$/);
      expect((await request(hh.app).get('/health')).status).toBe(200);
      await own.start();
      const deadline = Date.now() + 15000;
      let status = 0;
      while (Date.now() < deadline && status !== 200) {
        status = (await request(hh.app).get('/ready')).status;
        if (status !== 200) await new Promise((r) => setTimeout(r, 100));
      }
      expect(status).toBe(200);
    } finally {
      await hh.close();
      await own.destroy();
    }
  });
});

describe('request id', () => {
  const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
  it("the caller's X-Request-Id never becomes ours: a generated id is answered and audited, the caller's kept apart", async () => {
    const res = await request(ctx.h.app).delete('/ops/cache').set('X-API-Key', OP_KEY).set('X-Request-Id', 'abc-123.x:y_z');
    expect(res.status).toBe(200);
    expect(res.headers['x-request-id']).toMatch(UUID);
    const line = ctx.h.audits().find((a) => a.request_id === res.headers['x-request-id']);
    expect(line).toMatchObject({ request_id: res.headers['x-request-id'], caller_request_id: 'abc-123.x:y_z', path: '/ops/cache' });
    expect(ctx.h.audits().some((a) => a.request_id === 'abc-123.x:y_z')).toBe(false);
  });
  it('two calls with the same caller id get two distinct ids (no forged collision with another call)', async () => {
    const a = await request(ctx.h.app).delete('/ops/cache').set('X-API-Key', OP_KEY).set('X-Request-Id', 'same-id');
    const b = await request(ctx.h.app).delete('/ops/cache').set('X-API-Key', OP_KEY).set('X-Request-Id', 'same-id');
    expect(a.headers['x-request-id']).not.toBe(b.headers['x-request-id']);
  });
  it("a restart job's audit_id (the deploy Job's Kubernetes label) is ours, not the caller's", async () => {
    const res = await request(ctx.h.app)
      .post('/ops/restart?host=web-1&service=frontend')
      .set('Authorization', `Bearer ${BEARER}`)
      .set('X-Request-Id', 'app.kubernetes.io-name');
    expect(res.status).toBe(200);
    const job = await ctx.h.queue.bull.getJob(res.body.job_id);
    expect(job?.data.audit_id).toBe(res.headers['x-request-id']);
    expect(job?.data.audit_id).toMatch(UUID);
  });
  it.each([
    ['x'.repeat(500), 'x'.repeat(128)],
    ['has space <script>', 'has space <script>'],
    ['caf\u00e9\u00ff-id', 'caf??-id'],
  ])("the caller's value is capped at 128 printable characters (%#)", async (given, kept) => {
    const res = await request(ctx.h.app).delete('/ops/cache').set('X-API-Key', OP_KEY).set('X-Request-Id', given);
    expect(res.headers['x-request-id']).toMatch(UUID);
    const line = ctx.h.audits().find((a) => a.request_id === res.headers['x-request-id']);
    expect(line!.caller_request_id).toBe(kept);
  });
  it('responses are not cacheable and not content-sniffed, and carry no ETag (no validator for no-store answers, no SHA-1 of every body)', async () => {
    for (const res of [
      await request(ctx.h.app).get('/health'),
      await request(ctx.h.app).get('/ops/hosts').set('X-API-Key', RO_KEY),
      await request(ctx.h.app).get('/x'),
    ]) {
      expect(res.headers['cache-control']).toBe('no-store');
      expect(res.headers['x-content-type-options']).toBe('nosniff');
      expect(res.headers.etag).toBeUndefined();
    }
  });
  it('generated when absent, and on errors too', async () => {
    const res = await request(ctx.h.app).get('/nope');
    expect(res.headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);
  });
});

describe('error contract', () => {
  it('unknown route -> 404 JSON', async () => {
    expectJsonError(await request(ctx.h.app).get('/does/not/exist'), 404);
    expectJsonError(await request(ctx.h.app).post('/').send('x'), 404);
  });
  it('wrong method on a known path -> 405 JSON with Allow', async () => {
    for (const [method, path, allow] of [
      ['post', '/health', 'GET, HEAD'],
      ['delete', '/ops/hosts', 'GET, HEAD'],
      ['put', '/ops/cache', 'DELETE'],
      ['patch', '/webhook/alerts', 'POST'],
      ['get', '/webhook/github', 'POST'],
    ] as const) {
      const res = await request(ctx.h.app)[method](path);
      expectJsonError(res, 405);
      expect(res.headers.allow).toBe(allow);
    }
  });
  it('OPTIONS on a known path -> 204 with Allow', async () => {
    const res = await request(ctx.h.app).options('/ops/restart');
    expect(res.status).toBe(204);
    expect(res.headers.allow).toBe('POST, OPTIONS');
  });
  it('malformed percent-encoding in a path parameter -> 400 JSON, not an HTML page', async () => {
    const res = await request(ctx.h.app).get('/ops/jobs/%E0%A4%A').set('X-API-Key', RO_KEY);
    expectJsonError(res, 400);
  });
  it('invalid JSON -> 400 JSON; oversize -> 413 JSON', async () => {
    expectJsonError(await request(ctx.h.app).post('/webhook/alerts').set('Content-Type', 'application/json').send('{"alerts": [}'), 400);
    expectJsonError(
      await request(ctx.h.app)
        .post('/webhook/alerts')
        .send('x'.repeat(1024 * 1024 + 1)),
      413,
    );
  });
  it('a smaller BODY_LIMIT is honoured (413 above it)', async () => {
    const small = await createHarness(ctx.srv.url, { env: { BODY_LIMIT: '1kb' } });
    try {
      expectJsonError(
        await request(small.app).post('/webhook/scm').set('X-Scm-Token', SCM_SECRET).set('X-Scm-Event', 'Push Hook').send('x'.repeat(2000)),
        413,
      );
      const ok = await request(small.app).post('/webhook/alerts').send({ alerts: [] });
      expect(ok.status).toBe(202);
    } finally {
      await small.close();
    }
  });
  it('unsupported Content-Encoding -> 415 JSON', async () => {
    const res = await request(ctx.h.app).post('/webhook/alerts').set('Content-Encoding', 'br-unknown').send('{"alerts":[]}');
    expectJsonError(res, 415);
  });
  it('an unexpected error -> 500 {"detail":"internal error","code":"internal_error"}, logged without leaking to the client', async () => {
    const broken = await createHarness(ctx.srv.url, {
      hostStatus: {
        deployments: async () => {
          throw new Error(`boom with secret ${OP_KEY}`);
        },
      },
    });
    try {
      const res = await request(broken.app).get('/ops/hosts/web-1').set('X-API-Key', RO_KEY);
      expectJsonError(res, 500);
      expect(res.body).toEqual({ detail: 'internal error', code: 'internal_error' });
      const logged = broken.logs().find((l) => l.msg === 'unhandled error');
      expect(logged).toBeDefined();
      expect(String(logged!.error)).toContain('[REDACTED]');
      expect(broken.lines.join('\n')).not.toContain(OP_KEY);
      expect(JSON.stringify(logged)).not.toMatch(/\bat \S+ \(/); // no stack in the log line either
    } finally {
      await broken.close();
    }
  });
  it('unmatched requests are labelled route="unmatched" in metrics', async () => {
    await request(ctx.h.app).get('/random/path/123');
    const text = await ctx.h.metrics.registry.getSingleMetricAsString('opsgate_http_requests_total');
    expect(text).toContain('route="unmatched"');
    expect(text).not.toContain('/random/path/123');
  });
});

describe('rate-limit slot (createApp deps.rateLimit)', () => {
  it('runs before the routes: over the limit -> 429 JSON with Retry-After, probes exempt', async () => {
    const limited = await createHarness(ctx.srv.url, {
      rateLimit: ({ redis, metrics, logger }) => createRateLimiter({ redis, rps: 1, metrics, logger, windowMs: 60000 }),
    });
    try {
      await limited.inspect.flushall();
      expect((await request(limited.app).get('/ops/hosts').set('X-API-Key', RO_KEY)).status).toBe(200);
      const res = await request(limited.app).get('/ops/hosts').set('X-API-Key', RO_KEY);
      expectJsonError(res, 429);
      expect(res.headers['retry-after']).toMatch(/^\d+$/);
      expect(res.headers['x-request-id']).toBeDefined();
      expect((await request(limited.app).get('/health')).status).toBe(200);
    } finally {
      await limited.close();
    }
  });
});
