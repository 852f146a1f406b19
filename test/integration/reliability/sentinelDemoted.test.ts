/**
 * A Sentinel primary that becomes a replica under an open connection, with no +switch-master for
 * the client to hear: what a client sees when it reconnected to the old primary while a failover
 * was under way (it missed the announcement), or when a restarted old primary started as a
 * primary and the sentinels then turned it into a replica. On real processes (Debian's
 * redis-server and redis-sentinel, test/helpers/redisTopology.ts): the sentinel is re-pointed at
 * the other node (SENTINEL REMOVE + MONITOR, which announces no switch), the nodes swap roles.
 *
 * Every write on the old connection is then refused READONLY. Both connection profiles reconnect
 * on it and ask the sentinel again: the request profile's refused write fails (its request would
 * answer 503, the sender retries), a later write lands on the new primary; the blocking profile
 * sends the refused write again on the new primary.
 */
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { createRedis } from '../../../src/shared/redis.js';
import { startSentinelRedis, until, type SentinelRedis } from '../../helpers/redisTopology.js';

let topo: SentinelRedis;
const admin = (port: number) => new Redis({ host: '127.0.0.1', port, lazyConnect: false, maxRetriesPerRequest: 1 });

beforeAll(async () => {
  // One sentinel with quorum 2 (the helper's): it never starts a failover of its own.
  topo = await startSentinelRedis({ replicas: 1, sentinels: 1, downAfterMs: 60_000 });
}, 60_000);
afterAll(async () => {
  await topo?.destroy();
});

/** Swap the roles of the two nodes and re-point the sentinel at the new primary, announcing no switch. */
async function demoteWithoutSwitch(from: number, to: number): Promise<void> {
  const a = admin(from);
  const b = admin(to);
  const s = admin(topo.sentinels[0]!.port);
  try {
    await b.call('REPLICAOF', 'NO', 'ONE');
    await a.call('REPLICAOF', '127.0.0.1', String(to));
    await s.call('SENTINEL', 'REMOVE', topo.masterName);
    await s.call('SENTINEL', 'MONITOR', topo.masterName, '127.0.0.1', String(to), '2');
    await until('the old primary is a replica of the new one, in sync', async () => {
      const info = await a.info('replication');
      return /role:slave/.test(info) && /master_link_status:up/.test(info);
    });
  } finally {
    a.disconnect();
    b.disconnect();
    s.disconnect();
  }
}

describe('a Sentinel primary demoted under an open connection, no +switch-master', () => {
  it('request profile: the refused write fails once, the connection follows the sentinel, the next write lands on the new primary', async () => {
    const client = createRedis(topo.url, 'request', 'demoted-request');
    try {
      await until('request connection ready', async () => client.status === 'ready');
      expect(await client.set('before', '1')).toBe('OK');
      const oldPort = topo.primary.port;
      const newPort = topo.replicas[0]!.port;
      await demoteWithoutSwitch(oldPort, newPort);

      // The write that finds the demoted node is refused (nothing written), and the client reconnects.
      await expect(client.set('refused', '1')).rejects.toThrow(/READONLY/);
      // Bounded: the reconnect asks the sentinel, which names the new primary.
      await until('a write accepted again', async () => (await client.set('after', '1').catch(() => undefined)) === 'OK');
      const onNew = admin(newPort);
      try {
        expect(await onNew.get('after')).toBe('1');
        expect(await onNew.get('refused')).toBeNull();
      } finally {
        onNew.disconnect();
      }
    } finally {
      client.disconnect();
    }
  }, 60_000);

  it('blocking profile: the refused write is sent again on the new primary', async () => {
    const client = createRedis(topo.url, 'blocking', 'demoted-blocking');
    try {
      await until('blocking connection ready', async () => client.status === 'ready');
      const oldPort = await topo.primaryPort();
      const other = [topo.primary.port, topo.replicas[0]!.port].find((p) => p !== oldPort)!;
      // The connection is on the current primary; swap again, the other way.
      await demoteWithoutSwitch(oldPort, other);
      expect(await client.set('resent', '1')).toBe('OK');
      const onNew = admin(other);
      try {
        expect(await onNew.get('resent')).toBe('1');
      } finally {
        onNew.disconnect();
      }
    } finally {
      client.disconnect();
    }
  }, 60_000);
});
