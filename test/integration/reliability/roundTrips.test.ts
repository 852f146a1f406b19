/**
 * Redis round trips per delivery, counted on the wire (test/helpers/roundTrips.ts,
 * a relay in front of a real redis-server) with the real app, the real rate limiter (on, with a
 * budget never reached) and the real BullMQ producer:
 * - the rate limiter: 1 round trip of its own, before the route;
 * - a push: 1 more, BullMQ's add (new or duplicate: its deduplication answers inside the add);
 * - a push with a delivery id: the alias read before the add and its write after it (a replay
 *   found by its alias stops at the read); a signed sender's commit pair rides in the same read
 *   and the same write;
 * - an alert payload: 1 more whatever its size (BullMQ's addBulk).
 * And the rate limiter really counted each of them (its counter is read at the end).
 */
import { createHmac } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import request from 'supertest';
import { RateLimiterMemory, RateLimiterRedis } from 'rate-limiter-flexible';
import { createRateLimiter } from '../../../src/middleware/rateLimit.js';
import { pushPairKey, rateLimitKey } from '../../../src/shared/keys.js';
import { createHarness, GITHUB_SECRET, SCM_SECRET, type Harness } from '../../helpers/apiHarness.js';
import { startRoundTripCounter, type RoundTripCounter } from '../../helpers/roundTrips.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { waitFor } from '../../helpers/waitFor.js';

let srv: RedisServer;
let relay: RoundTripCounter;
let h: Harness;
let admin: Redis;
let sent = 0;

beforeAll(async () => {
  srv = await startRedis();
  relay = await startRoundTripCounter(srv.port);
  // A 10-minute window with a budget never reached: the limiter runs on every request, and its
  // counter at the end says how many it counted.
  h = await createHarness(relay.url, {
    // The deliveries log's XADD goes out after the answer, not waited for: it is counted on its own below.
    env: { RATE_LIMIT_RPS: '100000', TRUST_PROXY: '0', DELIVERIES_KEPT: '0' },
    rateLimit: ({ redis, metrics, logger }) => createRateLimiter({ redis, rps: 100000, windowMs: 600_000, metrics, logger }),
  });
  admin = new Redis(srv.url);
});
afterAll(async () => {
  await h?.close();
  admin?.disconnect();
  await relay?.close();
  await srv?.destroy();
});

const push = (sha: string) => ({ ref: 'refs/heads/main', checkout_sha: sha, project: { path_with_namespace: 'group/app' } });
const scm = (sha: string) => {
  sent++;
  return request(h.app).post('/webhook/scm').set('X-Scm-Token', SCM_SECRET).set('X-Scm-Event', 'Push Hook').send(push(sha));
};
const github = (sha: string, delivery: string) => {
  sent++;
  const body = JSON.stringify({ ref: 'refs/heads/main', after: sha, repository: { full_name: 'octo/app' } });
  return request(h.app)
    .post('/webhook/github')
    .set('Content-Type', 'application/json')
    .set('X-GitHub-Event', 'push')
    .set('X-GitHub-Delivery', delivery)
    .set('X-Hub-Signature-256', 'sha256=' + createHmac('sha256', GITHUB_SECRET).update(body).digest('hex'))
    .send(body);
};
const alerts = (prefix: string, n: number) => {
  sent++;
  return request(h.app)
    .post('/webhook/alerts')
    .send({
      alerts: Array.from({ length: n }, (_, i) => ({ status: 'firing', fingerprint: `${prefix}-${i}`, labels: { alertname: 'Storm' } })),
    });
};

/** Round trips the app made while `fn` ran (fn awaits the HTTP answer, which comes after every Redis reply). */
async function roundTrips(fn: () => PromiseLike<{ status: number }>, status = 202): Promise<number> {
  const before = relay.turns();
  const res = await fn();
  expect(res.status).toBe(status);
  return relay.turns() - before;
}

describe('Redis round trips per delivery (rate limit on)', () => {
  it('warm-up: the first use of each script loads it (not counted below)', async () => {
    await roundTrips(() => scm('warm'));
    await roundTrips(() => scm('warm'));
    await roundTrips(() => github('0a0a0a0', 'warm-delivery'));
    await roundTrips(() => alerts('warm', 2));
    await roundTrips(() => alerts('warm', 2));
  });

  it('push: 2 round trips, the rate limit and the add; duplicate: 2', async () => {
    expect(await roundTrips(() => scm('u1'))).toBe(2);
    expect(await roundTrips(() => scm('u1'))).toBe(2);
    expect(await roundTrips(() => scm('u2'))).toBe(2);
    expect(await roundTrips(() => scm('u2'))).toBe(2);
  });

  it('GitHub push with its delivery id: 4 (rate limit, alias read, add, alias write); its redelivery: 2 (rate limit, alias read)', async () => {
    expect(await roundTrips(() => github('9e1e1e1', 'd-1'))).toBe(4);
    // The commit pair was read with the alias and written with it.
    expect(await admin.exists(pushPairKey('github:octo/app:refs/heads/main:9e1e1e1', ''))).toBe(1);
    expect(await roundTrips(() => github('9e1e1e1', 'd-1'))).toBe(2);
    // The same push under another delivery id: the pair found within the event's 24 h, BullMQ's add answers.
    expect(await roundTrips(() => github('9e1e1e1', 'd-2'))).toBe(4);
  });

  it('alert storm: 1 alert or 1,000 alerts, new or duplicate, cost 2 round trips (rate limit, addBulk)', async () => {
    expect(await roundTrips(() => alerts('one', 1))).toBe(2);
    expect(await roundTrips(() => alerts('storm', 1000))).toBe(2);
    expect(await roundTrips(() => alerts('storm', 1000))).toBe(2); // all duplicates
    expect(await h.queue.bull.getJobCountByTypes('waiting')).toBeGreaterThanOrEqual(1001);
  }, 60_000);

  it('commands per delivery: the rate-limit hit, then one BullMQ add per job (an addBulk is one pipeline)', async () => {
    const commands = async (fn: () => PromiseLike<{ status: number }>) => {
      const before = relay.commands();
      expect((await fn()).status).toBe(202);
      return relay.commands() - before;
    };
    expect(await commands(() => scm('c1'))).toBe(2); // rate limit, add
    expect(await commands(() => scm('c1'))).toBe(2); // the duplicate
    expect(await commands(() => alerts('cmd-storm', 1000))).toBe(1 + 1000); // rate limit; 1,000 adds in one pipeline
    expect(await commands(() => alerts('cmd-storm', 1000))).toBe(1 + 1000); // redelivery: the same
  }, 60_000);

  it('an ignored delivery still counts against the rate limit (1 round trip, the hit)', async () => {
    sent++;
    const n = await roundTrips(() =>
      request(h.app).post('/webhook/scm').set('X-Scm-Token', SCM_SECRET).set('X-Scm-Event', 'Tag Push Hook').send(push('x')),
    );
    expect(n).toBe(1);
  });

  it('the rate limiter counted every delivery above', async () => {
    expect(Number(await admin.get(rateLimitKey('127.0.0.1')))).toBe(sent);
  });
});

describe('the deliveries log', () => {
  it('adds one command per delivery (XADD), sent after the answer (batched with the others of its moment)', async () => {
    const logged = await createHarness(relay.url, { env: { TRUST_PROXY: '0' } });
    try {
      const post = (sha: string) =>
        request(logged.app).post('/webhook/scm').set('X-Scm-Token', SCM_SECRET).set('X-Scm-Event', 'Push Hook').send(push(sha));
      const recorded = await admin.xlen('opsgate:deliveries:{scm}');
      // The first delivery loads each script and reads the intake's start marker: not counted.
      expect((await post('log-warm')).status).toBe(202);
      await waitFor('the warm-up recorded', async () => (await admin.xlen('opsgate:deliveries:{scm}')) === recorded + 1);
      const before = relay.commands();
      expect((await post('log-1')).status).toBe(202);
      // The add and the record (no rate limiter in this app); XLEN goes to Redis directly, not through the relay.
      await waitFor('the delivery recorded', async () => (await admin.xlen('opsgate:deliveries:{scm}')) === recorded + 2);
      expect(relay.commands() - before).toBe(2);
    } finally {
      await logged.close();
    }
  });
});

describe('rate-limiter-flexible in the same slot', () => {
  it('costs the same round trips as the hand-written limiter: one consume() per request, then the add', async () => {
    const rlf = await createHarness(relay.url, {
      env: { RATE_LIMIT_RPS: '100000', TRUST_PROXY: '0', DELIVERIES_KEPT: '0' },
      rateLimit: ({ redis }) => {
        const rl = new RateLimiterRedis({
          storeClient: redis,
          keyPrefix: 'opsgate:rlf',
          points: 100000,
          duration: 600,
          insuranceLimiter: new RateLimiterMemory({ points: 100000, duration: 600 }),
        });
        return (req, _res, next) =>
          void rl.consume(req.ip ?? 'unknown').then(
            () => next(),
            () => next(),
          );
      },
    });
    try {
      const post = (sha: string) =>
        request(rlf.app).post('/webhook/scm').set('X-Scm-Token', SCM_SECRET).set('X-Scm-Event', 'Push Hook').send(push(sha));
      await roundTrips(() => post('rlf-warm'));
      await roundTrips(() => post('rlf-warm'));
      expect(await roundTrips(() => post('rlf-1'))).toBe(2);
      expect(await roundTrips(() => post('rlf-1'))).toBe(2);
    } finally {
      await rlf.close();
    }
  });
});
