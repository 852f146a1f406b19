import { afterAll, beforeAll, describe, expect, test } from '@jest/globals';
import { Redis } from 'ioredis';
import { createMetrics } from '../../../src/shared/metrics.js';
import { exportQueueDepth } from '../../../worker/queueDepth.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';

/**
 * opsgate_redis_memory_used_bytes / opsgate_redis_memory_max_bytes (what OpsgateRedisMemoryHigh
 * in charts/opsgate/files/prometheus-rules.yaml alerts on), read at scrape time from a real
 * redis-server's INFO memory through the worker's exportQueueDepth.
 */
describe('Redis memory gauges', () => {
  let srv: RedisServer;
  let admin: Redis;
  const metrics = createMetrics('worker', 'test', { defaults: false });
  let depth: { close(): Promise<void> };
  const sample = (text: string, name: string) => {
    const m = new RegExp(`^${name}\\{redis="queue"\\} (\\S+)$`, 'm').exec(text);
    return m ? Number(m[1]) : undefined;
  };

  beforeAll(async () => {
    srv = await startRedis();
    admin = new Redis(srv.url);
    await admin.config('SET', 'maxmemory', String(64 * 1024 * 1024));
    depth = exportQueueDepth(metrics, srv.url);
  });
  afterAll(async () => {
    await depth.close();
    admin.disconnect();
    await srv.destroy();
  });

  test('maxmemory and used memory are exported; nothing (not a stale value) while Redis does not answer', async () => {
    let text = '';
    const deadline = Date.now() + 10_000;
    while (sample(text, 'opsgate_redis_memory_max_bytes') === undefined && Date.now() < deadline) {
      text = await metrics.registry.metrics();
      if (sample(text, 'opsgate_redis_memory_max_bytes') === undefined) await new Promise((r) => setTimeout(r, 100));
    }
    expect(sample(text, 'opsgate_redis_memory_max_bytes')).toBe(64 * 1024 * 1024);
    expect(sample(text, 'opsgate_redis_memory_used_bytes')).toBeGreaterThan(100_000);
    await new Promise((r) => setImmediate(r)); // one scrape's shared read is over
    srv.pause();
    try {
      text = await metrics.registry.metrics();
      expect(sample(text, 'opsgate_redis_memory_max_bytes')).toBeUndefined();
      expect(sample(text, 'opsgate_redis_memory_used_bytes')).toBeUndefined();
    } finally {
      srv.resume();
    }
  });
});
