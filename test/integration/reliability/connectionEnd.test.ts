/**
 * ioredis ends a connection for good (status `end`, every command "Connection is closed.") when a
 * reconnect is asked while its previous connect is still under way: what a failover does when the
 * sentinels' +switch-master or a READONLY answer arrives while the client is asking the sentinels
 * for the primary. On a real redis-server and a real sentinel (Debian's): the race is made
 * exactly, by asking a reconnect (ioredis' public `disconnect(true)`) from the `connecting` event
 * of the one before. A bare client stays ended; the processes' connection (connectRedis) connects
 * again by itself, and stays closed only when the process closes it (markClosing).
 */
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { Redis } from 'ioredis';
import { createLogger } from '../../../src/shared/logger.js';
import { createRedis, type RedisProfile } from '../../../src/shared/redis.js';
import { connectRedis, markClosing } from '../../../src/shared/redisConnection.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { startSentinelRedis, type SentinelRedis } from '../../helpers/redisTopology.js';
import { waitFor } from '../../helpers/waitFor.js';

let plain: RedisServer;
let sentinel: SentinelRedis;
const open: Redis[] = [];

beforeAll(async () => {
  plain = await startRedis();
  sentinel = await startSentinelRedis({ replicas: 0, sentinels: 1, downAfterMs: 60_000 });
}, 60_000);
afterAll(async () => {
  for (const c of open) {
    markClosing(c);
    c.disconnect();
  }
  await plain?.stop();
  await sentinel?.destroy();
});

/** A reconnect asked from the `connecting` event of the reconnect before it. */
function reconnectWhileConnecting(c: Redis): void {
  c.once('connecting', () => c.disconnect(true));
  c.disconnect(true);
}

describe.each(['request', 'blocking'] as RedisProfile[])('the %s profile', (profile) => {
  it.each(['a plain Redis', 'Sentinel'])(
    'a reconnect asked while connecting: a bare client stays ended, the process connection connects again (%s)',
    async (server) => {
      const url = server === 'Sentinel' ? sentinel.url : plain.url;
      const bare = createRedis(url, profile, 'bare');
      bare.on('error', () => undefined);
      open.push(bare);
      await waitFor('the bare client ready', () => bare.status === 'ready', 10_000, 20);
      reconnectWhileConnecting(bare);
      await waitFor('the bare client ended', () => bare.status === 'end', 10_000, 20);

      const logs: string[] = [];
      const c = connectRedis({ url, profile, name: 'watched', logger: createLogger({ write: (l) => logs.push(l) }) });
      open.push(c);
      await waitFor('the watched client ready', () => c.status === 'ready', 10_000, 20);
      reconnectWhileConnecting(c);
      await waitFor(
        'the watched client ended',
        () => logs.some((l) => l.includes('redis connection ended while nobody closed it')),
        10_000,
        20,
      );
      await waitFor('the watched client ready again', () => c.status === 'ready', 10_000, 20);
      expect(await c.ping()).toBe('PONG');
      expect(bare.status).toBe('end');
    },
  );
});

it('a connection the process closes (markClosing) stays closed', async () => {
  const logs: string[] = [];
  const c = connectRedis({ url: plain.url, profile: 'request', name: 'closing', logger: createLogger({ write: (l) => logs.push(l) }) });
  open.push(c);
  await waitFor('ready', () => c.status === 'ready', 10_000, 20);
  markClosing(c);
  await c.quit();
  await waitFor('ended', () => c.status === 'end', 10_000, 20);
  // The watcher decides on `end` itself, synchronously: no new connect was scheduled.
  await new Promise((r) => setImmediate(r));
  expect(logs.filter((l) => l.includes('connecting again'))).toEqual([]);
  expect(c.status).toBe('end');
});
