/**
 * The rate limiter as wired in the real app: two createApp instances (two API replicas, each
 * with its own Redis connections, as server.ts builds them) on one real redis-server, TRUST_PROXY
 * taken from the config like in production, errors rendered by the app's error middleware.
 * The limiter uses its production 1 s window here, so each check runs inside one window: the
 * burst is timed and an attempt that took longer than 700 ms (a stalled machine) is repeated.
 */
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createRateLimiter } from '../../../src/middleware/rateLimit.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { OP_KEY, RO_KEY, SCM_SECRET, createHarness, type Harness } from '../../helpers/apiHarness.js';
import { rateLimitKey } from '../../../src/shared/keys.js';
import { dedupKey } from '../../helpers/queueOps.js';

let redis: RedisServer;
const harnesses: Harness[] = [];
const servers: Server[] = [];

async function replica(env: Record<string, string>): Promise<string> {
  const h = await createHarness(redis.url, {
    env,
    rateLimit: ({ redis: r, metrics, logger }) => createRateLimiter({ redis: r, rps: Number(env.RATE_LIMIT_RPS), metrics, logger }),
  });
  harnesses.push(h);
  const server = await new Promise<Server>((resolve) => {
    const s = h.app.listen(0, '127.0.0.1', () => resolve(s));
  });
  servers.push(server);
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

async function hosts(base: string, xff?: string) {
  const headers: Record<string, string> = { 'X-API-Key': RO_KEY };
  if (xff) headers['X-Forwarded-For'] = xff;
  const r = await fetch(`${base}/ops/hosts`, { headers });
  return { status: r.status, retryAfter: r.headers.get('retry-after'), body: (await r.json()) as Record<string, unknown> };
}

/** Runs `attempt` until one completes within one rate-limit window (at most 5 tries). */
async function withinOneWindow<T>(attempt: () => Promise<T>): Promise<T> {
  for (let i = 0; i < 5; i++) {
    await new Promise((r) => setTimeout(r, 1100)); // every earlier window has expired
    const t0 = Date.now();
    const out = await attempt();
    if (Date.now() - t0 < 700) return out;
  }
  throw new Error('machine too slow: no attempt finished within one window');
}

beforeAll(async () => {
  redis = await startRedis();
});

afterAll(async () => {
  await Promise.all(
    servers.map((s) => {
      const closed = new Promise((r) => s.close(r));
      s.closeAllConnections();
      return closed;
    }),
  );
  for (const h of harnesses) await h.close();
  await redis?.destroy();
});

describe('rate limit in createApp: two replicas, one Redis, TRUST_PROXY from the config', () => {
  it('shares one budget per client address across replicas; 429 {detail, code} + Retry-After; X-Forwarded-For honoured with TRUST_PROXY=1', async () => {
    const env = { RATE_LIMIT_RPS: '4', TRUST_PROXY: '1' };
    const a = await replica(env);
    const b = await replica(env);
    const out = await withinOneWindow(async () => {
      const seq = [];
      for (let i = 0; i < 4; i++) seq.push(await hosts(i % 2 ? a : b, '203.0.113.7'));
      const fifthA = await hosts(a, '203.0.113.7');
      const fifthB = await hosts(b, '203.0.113.7');
      const other = await hosts(b, '203.0.113.8'); // another client behind the same proxy
      return { seq, fifthA, fifthB, other };
    });
    expect(out.seq.map((r) => r.status)).toEqual([200, 200, 200, 200]);
    for (const r of [out.fifthA, out.fifthB]) {
      expect(r.status).toBe(429);
      expect(Object.keys(r.body)).toEqual(['detail', 'code']);
      expect(typeof r.body.detail).toBe('string');
      expect(r.body.code).toBe('rate_limited');
      expect(r.retryAfter).toBe('1');
    }
    expect(out.other.status).toBe(200);
    const limited = await harnesses[0]!.metrics.rateLimited.get();
    expect(limited.values[0]?.value).toBe(1);
    // The 429 is counted in the HTTP metrics like any other answer.
    const http = await harnesses[0]!.metrics.httpRequests.get();
    expect(http.values.some((v) => v.labels.status === '429')).toBe(true);
  }, 60_000);

  it('TRUST_PROXY=0: X-Forwarded-For cannot be used to get a fresh budget', async () => {
    const env = { RATE_LIMIT_RPS: '3', TRUST_PROXY: '0' };
    const a = await replica(env);
    const b = await replica(env);
    const statuses = await withinOneWindow(async () => {
      const s: number[] = [];
      for (let i = 0; i < 6; i++) s.push((await hosts(i % 2 ? a : b, `198.51.100.${i}`)).status);
      return s;
    });
    expect(statuses).toEqual([200, 200, 200, 429, 429, 429]);
  }, 60_000);

  it('default (TRUST_PROXY unset): a forged X-Forwarded-For reaching the API directly changes neither the bucket nor the audit client', async () => {
    const a = await replica({ RATE_LIMIT_RPS: '3' });
    const h = harnesses[harnesses.length - 1]!;
    expect(h.config.TRUST_PROXY).toBe('0');
    const statuses = await withinOneWindow(async () => {
      const s: number[] = [];
      for (let i = 0; i < 5; i++) s.push((await hosts(a, `198.51.100.${i}, 10.0.0.${i}`)).status);
      return s;
    });
    expect(statuses).toEqual([200, 200, 200, 429, 429]);
    await new Promise((r) => setTimeout(r, 1100)); // a fresh window for the audited call
    const res = await fetch(`${a}/ops/cache`, { method: 'DELETE', headers: { 'X-API-Key': OP_KEY, 'X-Forwarded-For': '203.0.113.99' } });
    expect(res.status).toBe(200);
    const line = h.audits().find((l) => l.request_id === res.headers.get('x-request-id'));
    expect(String(line?.client)).toMatch(/^(::ffff:)?127\.0\.0\.1$/);
    expect(JSON.stringify(h.audits())).not.toMatch(/203\.0\.113\.99|198\.51\.100\./);
  }, 60_000);

  it('webhook intake: over the limit 429 {detail, code} + Retry-After before the route runs, nothing recorded or queued, and the same event is accepted in the next window', async () => {
    const a = await replica({ RATE_LIMIT_RPS: '2', TRUST_PROXY: '1' });
    const h = harnesses[harnesses.length - 1]!;
    const push = (sha: string) =>
      fetch(`${a}/webhook/scm`, {
        method: 'POST',
        headers: {
          'Content-Type': 'application/json',
          'X-Scm-Token': SCM_SECRET,
          'X-Scm-Event': 'Push Hook',
          'X-Forwarded-For': '192.0.2.44',
        },
        body: JSON.stringify({ ref: 'refs/heads/main', checkout_sha: sha, project: { path_with_namespace: 'team/rl-inline' } }),
      }).then(async (r) => ({
        sha,
        status: r.status,
        retryAfter: r.headers.get('retry-after'),
        body: (await r.json()) as Record<string, unknown>,
      }));
    const out = await withinOneWindow(async () => {
      const seq = [];
      for (const sha of ['rl01', 'rl02', 'rl03', 'rl04']) seq.push(await push(sha));
      return seq;
    });
    expect(out.map((r) => r.status)).toEqual([202, 202, 429, 429]);
    for (const r of out.slice(2)) {
      expect(r.body).toEqual({ detail: expect.any(String), code: 'rate_limited' });
      expect(r.retryAfter).toBe('1');
      expect(await h.inspect.exists(dedupKey(h.queue, `scm:team/rl-inline:refs/heads/main:${r.sha}`))).toBe(0);
    }
    const jobs = (await h.queue.bull.getJobs(['waiting'])).filter((j) => j.data.project === 'team/rl-inline');
    expect(jobs.map((j) => j.data.sha).sort()).toEqual(['rl01', 'rl02']);
    // The refused event was not recorded: the sender's retry in a later window is accepted.
    const retried = await withinOneWindow(() => push('rl03'));
    expect(retried.status).toBe(202);
    expect(retried.body).toMatchObject({ accepted: true, duplicate: false });
    expect(Number(await h.inspect.get(rateLimitKey('192.0.2.44')))).toBeGreaterThanOrEqual(1);
  }, 60_000);

  it('probes are never limited', async () => {
    const a = await replica({ RATE_LIMIT_RPS: '1', TRUST_PROXY: '0' });
    const statuses = await withinOneWindow(async () => {
      const s: number[] = [];
      s.push((await hosts(a)).status, (await hosts(a)).status);
      for (let i = 0; i < 5; i++) s.push((await fetch(`${a}/health`)).status, (await fetch(`${a}/ready`)).status);
      return s;
    });
    expect(statuses).toEqual([200, 429, ...Array(10).fill(200)]);
  }, 60_000);
});
