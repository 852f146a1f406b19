/**
 * The rate limiter on its own (src/middleware/rateLimit.ts), in two Express apps that stand for two
 * API replicas, on one real redis-server. The full-app wiring (createApp, TRUST_PROXY from config,
 * the error middleware's {detail, code} body) is covered by rateLimit.app.test.ts.
 */
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import express, { type ErrorRequestHandler } from 'express';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Redis } from 'ioredis';
import { createRateLimiter } from '../../../src/middleware/rateLimit.js';
import { addressKey } from '../../../src/api/rateLimit.js';
import { AppError } from '../../../src/shared/errors.js';
import { createLogger } from '../../../src/shared/logger.js';
import { createMetrics, type Metrics } from '../../../src/shared/metrics.js';
import { createRedis } from '../../../src/shared/redis.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';

let redis: RedisServer;
const clients: Redis[] = [];
const servers: Server[] = [];

interface Replica {
  url: string;
  metrics: Metrics;
  logs: string[];
}

const errorHandler: ErrorRequestHandler = (err, _req, res, _next) => {
  if (err instanceof AppError) {
    res.status(err.statusCode).set(err.headers).json(err.toBody());
    return;
  }
  res.status(500).json({ detail: 'internal error', code: 'internal_error' });
};

/** One "replica": its own Express app, own Redis connection, own metrics. */
async function replica(opts: {
  rps: number;
  trustProxy: number | boolean | string;
  windowMs?: number;
  prefix: string;
  timeoutMs?: number;
}): Promise<Replica> {
  const client = createRedis(redis.url, 'request', 'rl-test');
  clients.push(client);
  if (client.status !== 'ready') await new Promise((r) => client.once('ready', r));
  const metrics = createMetrics('api', 'test', { defaults: false });
  const logs: string[] = [];
  const app = express();
  app.set('trust proxy', opts.trustProxy);
  app.use(
    createRateLimiter({
      redis: client,
      rps: opts.rps,
      metrics,
      logger: createLogger({ write: (l) => logs.push(l) }),
      windowMs: opts.windowMs,
      keyPrefix: opts.prefix,
      timeoutMs: opts.timeoutMs,
    }),
  );
  app.get('/health', (_req, res) => void res.json({ status: 'ok' }));
  app.get('/ready', (_req, res) => void res.json({ status: 'ok' }));
  app.get('/ops/hosts', (req, res) => void res.json({ ip: req.ip }));
  app.use(errorHandler);
  const server = await new Promise<Server>((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  servers.push(server);
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, metrics, logs };
}

async function get(url: string, headers: Record<string, string> = {}) {
  const res = await fetch(url, { headers });
  const text = await res.text();
  return { status: res.status, retryAfter: res.headers.get('retry-after'), text, body: text ? JSON.parse(text) : undefined };
}

async function counterValue(metrics: Metrics, name: string): Promise<number> {
  const m = metrics.registry.getSingleMetric(name);
  if (!m) return 0;
  const v = await m.get();
  return v.values.reduce((a, x) => a + x.value, 0);
}

let prefixSeq = 0;
const freshPrefix = () => `rltest${++prefixSeq}:`;

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
  for (const c of clients) c.disconnect();
  await redis?.destroy();
});

describe('addressKey', () => {
  it('keeps IP addresses and hashes anything else to a short printable token', () => {
    expect(addressKey('10.1.2.3')).toBe('10.1.2.3');
    expect(addressKey('::1')).toBe('::1');
    expect(addressKey(undefined)).toBe('unknown');
    const weird = addressKey('x'.repeat(5000) + '\r\n:*');
    expect(weird).toMatch(/^h:[0-9a-f]{32}$/);
    expect(addressKey('a')).not.toBe(addressKey('b'));
  });
});

describe('rate limit shared by two replicas through Redis', () => {
  // A 30 s window makes the budget arithmetic exact on a loaded machine (no window boundary can
  // fall inside the test); the 1 s default window is exercised separately below.
  it('counts one budget across both replicas, then answers 429 {detail, code} with Retry-After', async () => {
    const prefix = freshPrefix();
    const a = await replica({ rps: 10, trustProxy: false, windowMs: 30_000, prefix });
    const b = await replica({ rps: 10, trustProxy: false, windowMs: 30_000, prefix });
    const statuses: number[] = [];
    for (let i = 0; i < 10; i++) statuses.push((await get(`${i % 2 ? a.url : b.url}/ops/hosts`)).status);
    expect(statuses).toEqual(Array(10).fill(200));

    for (const r of [a, b]) {
      const res = await get(`${r.url}/ops/hosts`);
      expect(res.status).toBe(429);
      expect(typeof res.body.detail).toBe('string');
      expect(res.body.code).toBe('rate_limited');
      expect(Object.keys(res.body)).toEqual(['detail', 'code']);
      expect(Number(res.retryAfter)).toBeGreaterThanOrEqual(1);
      expect(Number(res.retryAfter)).toBeLessThanOrEqual(30);
    }
    expect(await counterValue(a.metrics, 'opsgate_rate_limited_requests_total')).toBe(1);
    expect(await counterValue(b.metrics, 'opsgate_rate_limited_requests_total')).toBe(1);
  });

  it('under concurrent load admits exactly the budget across replicas', async () => {
    const prefix = freshPrefix();
    // The count is what is under test: Redis gets time to answer every call, since a call it answers
    // after the limiter's timeout fails open (a test of its own, below) and admits one request more.
    const a = await replica({ rps: 25, trustProxy: false, windowMs: 30_000, prefix, timeoutMs: 20_000 });
    const b = await replica({ rps: 25, trustProxy: false, windowMs: 30_000, prefix, timeoutMs: 20_000 });
    const results = await Promise.all(Array.from({ length: 120 }, (_, i) => get(`${i % 2 ? a.url : b.url}/ops/hosts`)));
    const ok = results.filter((r) => r.status === 200).length;
    const limited = results.filter((r) => r.status === 429).length;
    expect(ok).toBe(25);
    expect(limited).toBe(95);
  });

  it('never limits the probes', async () => {
    const prefix = freshPrefix();
    const a = await replica({ rps: 1, trustProxy: false, windowMs: 30_000, prefix });
    expect((await get(`${a.url}/ops/hosts`)).status).toBe(200);
    expect((await get(`${a.url}/ops/hosts`)).status).toBe(429);
    for (let i = 0; i < 20; i++) {
      expect((await get(`${a.url}/health`)).status).toBe(200);
      expect((await get(`${a.url}/ready`)).status).toBe(200);
    }
  });

  it('with the default 1 s window, lets the client in again after Retry-After', async () => {
    const prefix = freshPrefix();
    const a = await replica({ rps: 3, trustProxy: false, prefix });
    let limited: Awaited<ReturnType<typeof get>> | undefined;
    for (let i = 0; i < 50 && !limited; i++) {
      const r = await get(`${a.url}/ops/hosts`);
      if (r.status === 429) limited = r;
    }
    expect(limited).toBeDefined();
    expect(limited!.retryAfter).toBe('1');
    await new Promise((r) => setTimeout(r, 1100));
    expect((await get(`${a.url}/ops/hosts`)).status).toBe(200);
    // The counter key carries a TTL: nothing piles up in Redis.
    const c = new Redis(redis.url);
    try {
      const keys = await c.keys(`${prefix}*`);
      for (const k of keys) expect(await c.pttl(k)).toBeGreaterThan(0);
    } finally {
      c.disconnect();
    }
  });

  it('RATE_LIMIT_RPS=0 disables the limiter (no Redis traffic, no 429)', async () => {
    const prefix = freshPrefix();
    const a = await replica({ rps: 0, trustProxy: false, prefix });
    const results = await Promise.all(Array.from({ length: 100 }, () => get(`${a.url}/ops/hosts`)));
    expect(results.every((r) => r.status === 200)).toBe(true);
    const c = new Redis(redis.url);
    try {
      expect(await c.keys(`${prefix}*`)).toEqual([]);
    } finally {
      c.disconnect();
    }
  });
});

describe('client address behind a proxy (TRUST_PROXY)', () => {
  it('TRUST_PROXY=0: X-Forwarded-For is ignored, so a client cannot escape its bucket by spoofing it', async () => {
    const a = await replica({ rps: 3, trustProxy: 0, windowMs: 30_000, prefix: freshPrefix() });
    const statuses: number[] = [];
    for (let i = 0; i < 6; i++) {
      statuses.push((await get(`${a.url}/ops/hosts`, { 'X-Forwarded-For': `203.0.113.${i + 1}` })).status);
    }
    expect(statuses).toEqual([200, 200, 200, 429, 429, 429]);
  });

  it('TRUST_PROXY=1: each forwarded client has its own budget', async () => {
    const a = await replica({ rps: 2, trustProxy: 1, windowMs: 30_000, prefix: freshPrefix() });
    const one = { 'X-Forwarded-For': '198.51.100.1' };
    const two = { 'X-Forwarded-For': '198.51.100.2' };
    expect((await get(`${a.url}/ops/hosts`, one)).body).toEqual({ ip: '198.51.100.1' });
    expect((await get(`${a.url}/ops/hosts`, one)).status).toBe(200);
    expect((await get(`${a.url}/ops/hosts`, one)).status).toBe(429);
    expect((await get(`${a.url}/ops/hosts`, two)).status).toBe(200);
    expect((await get(`${a.url}/ops/hosts`, two)).status).toBe(200);
    expect((await get(`${a.url}/ops/hosts`, two)).status).toBe(429);
  });

  it('TRUST_PROXY=1: only the entry the trusted proxy appended counts, not the ones the client sent', async () => {
    const a = await replica({ rps: 2, trustProxy: 1, windowMs: 30_000, prefix: freshPrefix() });
    // The client forges leading entries; the Ingress appended the real address (last entry).
    const statuses: number[] = [];
    for (let i = 0; i < 4; i++) {
      const r = await get(`${a.url}/ops/hosts`, { 'X-Forwarded-For': `10.9.9.${i}, 192.0.2.50` });
      statuses.push(r.status);
      if (r.status === 200) expect(r.body).toEqual({ ip: '192.0.2.50' });
    }
    expect(statuses).toEqual([200, 200, 429, 429]);
  });

  it('TRUST_PROXY=2: two hops are believed, the third (client-supplied) is not', async () => {
    const a = await replica({ rps: 1, trustProxy: 2, windowMs: 30_000, prefix: freshPrefix() });
    const r1 = await get(`${a.url}/ops/hosts`, { 'X-Forwarded-For': '6.6.6.6, 192.0.2.77, 10.0.0.1' });
    expect(r1.body).toEqual({ ip: '192.0.2.77' });
    const r2 = await get(`${a.url}/ops/hosts`, { 'X-Forwarded-For': '7.7.7.7, 192.0.2.77, 10.0.0.1' });
    expect(r2.status).toBe(429);
  });

  it('a non-IP forwarded value is hashed into a bounded key, still limited', async () => {
    const prefix = freshPrefix();
    const a = await replica({ rps: 1, trustProxy: true, windowMs: 30_000, prefix });
    const junk = { 'X-Forwarded-For': 'not-an-ip-' + 'z'.repeat(4000) };
    expect((await get(`${a.url}/ops/hosts`, junk)).status).toBe(200);
    expect((await get(`${a.url}/ops/hosts`, junk)).status).toBe(429);
    const c = new Redis(redis.url);
    try {
      const keys = await c.keys(`${prefix}*`);
      expect(keys).toHaveLength(1);
      expect(keys[0]!.length).toBeLessThan(80);
    } finally {
      c.disconnect();
    }
  });
});

describe('Redis unavailable: fail open', () => {
  it('lets requests through, counts and logs (once) the fail-open, and limits again when Redis is back', async () => {
    const a = await replica({ rps: 2, trustProxy: false, windowMs: 30_000, prefix: freshPrefix() });
    expect((await get(`${a.url}/ops/hosts`)).status).toBe(200);
    await redis.stop();
    try {
      for (let i = 0; i < 10; i++) expect((await get(`${a.url}/ops/hosts`)).status).toBe(200);
      expect(await counterValue(a.metrics, 'opsgate_rate_limit_errors_total')).toBe(10);
      const warnings = a.logs.filter((l) => l.includes('failing open'));
      expect(warnings).toHaveLength(1);
      expect(JSON.parse(warnings[0]!).level).toBe('warn');
    } finally {
      await redis.start();
    }
    // Reconnects on its own; then the (empty again: no persistence) budget applies.
    const deadline = Date.now() + 15_000;
    let saw429 = false;
    while (!saw429 && Date.now() < deadline) {
      saw429 = (await get(`${a.url}/ops/hosts`)).status === 429;
      if (!saw429) await new Promise((r) => setTimeout(r, 50));
    }
    expect(saw429).toBe(true);
  });

  it('a hung Redis (SIGSTOP) is abandoned after the limiter timeout: requests pass, they do not wait for Redis', async () => {
    const a = await replica({ rps: 2, trustProxy: false, windowMs: 30_000, prefix: freshPrefix() });
    expect((await get(`${a.url}/ops/hosts`)).status).toBe(200);
    const admin = new Redis(redis.url);
    const pid = Number(/process_id:(\d+)/.exec(await admin.info('server'))![1]);
    admin.disconnect();
    process.kill(pid, 'SIGSTOP');
    try {
      const results = await Promise.all(Array.from({ length: 5 }, () => get(`${a.url}/ops/hosts`)));
      expect(results.map((r) => r.status)).toEqual([200, 200, 200, 200, 200]);
      expect(await counterValue(a.metrics, 'opsgate_rate_limit_errors_total')).toBe(5);
      // It was the limiter's own 250 ms deadline that let them through, not the connection's 2 s
      // command timeout (which would also fail open, but only after holding every request 2 s).
      const warning = a.logs
        .map((l) => JSON.parse(l) as Record<string, unknown>)
        .find((l) => l.msg === 'rate limit unavailable (Redis error); failing open');
      expect(warning?.error).toBe('rate limit: Redis did not answer within 250 ms');
    } finally {
      process.kill(pid, 'SIGCONT');
    }
  });
});
