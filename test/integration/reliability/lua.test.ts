/**
 * Every Lua script of opsgate (src/shared/lua/*.lua) alone, on a real redis-server: each is a
 * whole script whose KEYS and ARGV are documented at its top, run here with EVAL exactly as
 * documented. A new script without a test here fails the first case.
 */
import { readdirSync } from 'node:fs';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { loadLua } from '../../../src/shared/lua.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';

let server: RedisServer;
let redis: Redis;
const TESTED = ['rate-limit', 'replica-release'];

beforeAll(async () => {
  server = await startRedis();
  redis = new Redis(server.url);
});
beforeEach(async () => {
  await redis.flushall();
});
afterAll(async () => {
  redis?.disconnect();
  await server?.destroy();
});

it('every script in src/shared/lua has its tests here, and documents its KEYS and ARGV', () => {
  const files = readdirSync(new URL('../../../src/shared/lua/', import.meta.url)).filter((f) => f.endsWith('.lua'));
  expect(files.map((f) => f.slice(0, -4)).sort()).toEqual([...TESTED].sort());
  for (const name of TESTED) {
    const head = loadLua(name)
      .split('\n')
      .filter((l) => l.startsWith('--'))
      .join('\n');
    expect(head).toMatch(/KEYS\[1\]/);
  }
});

describe('rate-limit.lua: KEYS[1] counter, ARGV[1] window ms -> {count, remaining ms}', () => {
  const hit = async (key: string, windowMs: number) => (await redis.eval(loadLua('rate-limit'), 1, key, windowMs)) as [number, number];

  it('counts hits in one window; the window starts with its first hit', async () => {
    const [n1, ttl1] = await hit('rl:a', 60_000);
    expect(n1).toBe(1);
    expect(ttl1).toBe(60_000);
    const [n2, ttl2] = await hit('rl:a', 60_000);
    expect(n2).toBe(2);
    expect(ttl2).toBeGreaterThan(0);
    expect(ttl2).toBeLessThanOrEqual(60_000);
    expect(await redis.pttl('rl:a')).toBeGreaterThan(0);
    expect((await hit('rl:b', 60_000))[0]).toBe(1); // another client, another counter
  });

  it('a counter that lost its expiry gets one again (it never counts forever)', async () => {
    await redis.set('rl:c', '5');
    const [n, ttl] = await hit('rl:c', 1_000);
    expect(n).toBe(6);
    expect(ttl).toBe(1_000);
    expect(await redis.pttl('rl:c')).toBeGreaterThan(0);
  });

  it('a new window after the old one expired', async () => {
    await hit('rl:d', 50);
    await hit('rl:d', 50);
    const deadline = Date.now() + 5_000;
    while ((await redis.exists('rl:d')) === 1 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    expect((await hit('rl:d', 50))[0]).toBe(1);
  });
});

describe('replica-release.lua: KEYS[1] record, ARGV[1] job id -> deleted only while it names that job', () => {
  const release = (key: string, jobId: string) => redis.eval(loadLua('replica-release'), 1, key, jobId);

  it('an alias "q:<id>" is deleted for its job, kept for another', async () => {
    await redis.set('alias', 'q:job-1');
    expect(await release('alias', 'job-2')).toBe(0);
    expect(await redis.get('alias')).toBe('q:job-1');
    expect(await release('alias', 'job-1')).toBe(1);
    expect(await redis.exists('alias')).toBe(0);
  });

  it("a restart's Idempotency-Key answer (JSON with job_id) is deleted for its job only", async () => {
    await redis.set('idem', JSON.stringify({ host: 'h', service: 's', job_id: 'restart-1', coalesced: false }));
    expect(await release('idem', 'restart-2')).toBe(0);
    expect(await release('idem', 'restart-1')).toBe(1);
  });

  it('anything else, or nothing, is left alone', async () => {
    await redis.set('other', 'job-1');
    await redis.set('broken', '{not json');
    expect(await release('other', 'job-1')).toBe(0);
    expect(await release('broken', 'job-1')).toBe(0);
    expect(await release('missing', 'job-1')).toBe(0);
    expect(await redis.get('other')).toBe('job-1');
  });
});
