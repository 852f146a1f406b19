/**
 * REDIS_URL's three forms (src/shared/redis.ts): what each is parsed into (ioredis's own
 * Sentinel and Cluster options), what the BullMQ prefix is, and that every refusal names
 * REDIS_URL and the problem, never the value (it may carry a password).
 */
import { describe, expect, it } from '@jest/globals';
import { deliveryKey, queuePrefix, taggedKey } from '../../../src/shared/keys.js';
import { loadApiConfig } from '../../../src/api/config.js';
import { loadWorkerConfig } from '../../../src/shared/config.js';
import { ConfigError } from '../../../src/shared/errors.js';
import { clusterOptions, parseRedisUrl, redisPasswords, sentinelOptions, type ParsedRedisUrl } from '../../../src/shared/redis.js';

const SECRET = 'pw-SECRETREDIS-42';
const base = { OPS_API_KEY_ROLES: 'k-unit-test-key:operator' };

function refusal(fn: () => unknown): ConfigError {
  try {
    fn();
  } catch (err) {
    if (err instanceof ConfigError) return err;
    throw err;
  }
  throw new Error('expected a ConfigError');
}

describe('parseRedisUrl', () => {
  it('redis:// and rediss:// stay one server (ioredis parses them)', () => {
    expect(parseRedisUrl(`redis://:${SECRET}@127.0.0.1:6380/2`)).toEqual({
      topology: 'standalone',
      url: `redis://:${SECRET}@127.0.0.1:6380/2`,
      password: SECRET,
    });
    expect(parseRedisUrl('rediss://redis.example:6380').topology).toBe('standalone');
  });

  it('redis+sentinel://: sentinels (default port 26379), master name, db, passwords', () => {
    const p = parseRedisUrl(
      `redis+sentinel://:${encodeURIComponent(SECRET + '@/')}@s1:26380,s2,[::1]:5000/mymaster/3?sentinelPassword=sp%40ss`,
    );
    expect(p).toEqual({
      topology: 'sentinel',
      sentinels: [
        { host: 's1', port: 26380 },
        { host: 's2', port: 26379 },
        { host: '::1', port: 5000 },
      ],
      masterName: 'mymaster',
      db: 3,
      password: SECRET + '@/',
      sentinelPassword: 'sp@ss',
    });
    const opts = sentinelOptions(p as Extract<ParsedRedisUrl, { topology: 'sentinel' }>, 'request');
    expect(opts).toMatchObject({
      name: 'mymaster',
      db: 3,
      password: SECRET + '@/',
      sentinelPassword: 'sp@ss',
      failoverDetector: true,
      enableOfflineQueue: false,
      maxRetriesPerRequest: 1,
    });
    expect(opts.sentinels).toHaveLength(3);
    expect(sentinelOptions(p as Extract<ParsedRedisUrl, { topology: 'sentinel' }>, 'blocking').maxRetriesPerRequest).toBeNull();
    expect(parseRedisUrl('redis+sentinel://h:1/m')).toMatchObject({ db: 0, masterName: 'm' });
    expect(parseRedisUrl('redis+sentinel://user:pw@h:1/m')).toMatchObject({ username: 'user', password: 'pw' });
  });

  it('redis+cluster://: seed nodes (default port 6379), password into every node connection', () => {
    const p = parseRedisUrl(`redis+cluster://:${SECRET}@c1:7000,c2:7001,c3`);
    expect(p).toEqual({
      topology: 'cluster',
      nodes: [
        { host: 'c1', port: 7000 },
        { host: 'c2', port: 7001 },
        { host: 'c3', port: 6379 },
      ],
      password: SECRET,
    });
    const opts = clusterOptions(p as Extract<ParsedRedisUrl, { topology: 'cluster' }>, 'request');
    expect(opts.redisOptions).toMatchObject({ password: SECRET, maxRetriesPerRequest: 1, enableOfflineQueue: false });
    expect(opts.enableOfflineQueue).toBe(false);
    expect(clusterOptions(p as Extract<ParsedRedisUrl, { topology: 'cluster' }>, 'blocking').redisOptions?.maxRetriesPerRequest).toBeNull();
  });

  it('BullMQ prefix: "bull" on one server and Sentinel (an existing queue stays visible), hash tag on a cluster', () => {
    expect(queuePrefix('redis://h:6379')).toBe('bull');
    expect(queuePrefix('redis+sentinel://h:26379/m')).toBe('bull');
    expect(queuePrefix('redis+cluster://h:7000')).toBe('{opsgate}');
  });

  it("seen records share the queue's hash tag; rate-limit counters have one of their own per address", () => {
    expect(deliveryKey('github', 'd-1')).toBe('{opsgate}:seen:delivery:github:d-1');
    expect(taggedKey('opsgate:rl:', '10.0.0.1')).toBe('opsgate:rl:{10.0.0.1}');
  });

  it('passwords of every form are known to the log redaction', () => {
    expect(redisPasswords(`redis://:${SECRET}@h:1`)).toEqual([SECRET]);
    expect(redisPasswords(`redis+sentinel://:${SECRET}@h:1/m?sentinelPassword=other`)).toEqual([SECRET, 'other']);
    expect(redisPasswords(`redis+cluster://:${SECRET}@h:1`)).toEqual([SECRET]);
    expect(redisPasswords('redis://h:1')).toEqual([]);
  });
});

describe('REDIS_URL validation (API and worker)', () => {
  it.each([
    ['https scheme', `https://x:${SECRET}@h`, /must be redis:\/\//],
    ['sentinel without master name', `redis+sentinel://:${SECRET}@h:26379`, /without a master name/],
    ['sentinel with a bad port', `redis+sentinel://:${SECRET}@h:99999/m`, /port outside 1-65535/],
    ['sentinel with an empty host', `redis+sentinel://:${SECRET}@h:1,,h2:2/m`, /empty host/],
    ['sentinel db not a number', `redis+sentinel://:${SECRET}@h:1/m/x`, /database number/],
    ['sentinel too many segments', `redis+sentinel://:${SECRET}@h:1/m/0/9`, /too many path segments/],
    ['cluster with a db', `redis+cluster://:${SECRET}@h:7000/2`, /cannot select a database/],
    ['cluster with no host', `redis+cluster://:${SECRET}@`, /has no host/],
    ['unknown query parameter', `redis+sentinel://:${SECRET}@h:1/m?password=${SECRET}`, /unknown query parameter "password"/],
    ['garbage host', `redis+cluster://:${SECRET}@h h:7000`, /invalid host:port/],
  ])('%s: one line naming REDIS_URL, never the value', (_name, url, problem) => {
    for (const load of [() => loadApiConfig({ ...base, REDIS_URL: url }), () => loadWorkerConfig({ REDIS_URL: url })]) {
      const err = refusal(load);
      expect(err.variable).toBe('REDIS_URL');
      expect(err.message).toMatch(/^REDIS_URL: /);
      expect(err.message).toMatch(problem);
      expect(err.message).not.toContain(SECRET);
      expect(err.message.split('\n')).toHaveLength(1);
    }
  });

  it('accepts the three forms', () => {
    for (const url of [
      'redis://127.0.0.1:6379',
      'redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/opsgate/1',
      'redis+cluster://127.0.0.1:7000',
    ]) {
      expect(loadApiConfig({ ...base, REDIS_URL: url }).REDIS_URL).toBe(url);
      expect(loadWorkerConfig({ REDIS_URL: url }).REDIS_URL).toBe(url);
    }
  });

  it('REDIS_MIN_REPLICAS_ACK (default 0 = off) and REDIS_ACK_TIMEOUT_MS (default 1000, at most 1500)', () => {
    const c = loadApiConfig({ ...base, REDIS_URL: 'redis://h:1' });
    expect(c.REDIS_MIN_REPLICAS_ACK).toBe(0);
    expect(c.REDIS_ACK_TIMEOUT_MS).toBe(1000);
    expect(loadApiConfig({ ...base, REDIS_URL: 'redis://h:1', REDIS_MIN_REPLICAS_ACK: '2', REDIS_ACK_TIMEOUT_MS: '300' })).toMatchObject({
      REDIS_MIN_REPLICAS_ACK: 2,
      REDIS_ACK_TIMEOUT_MS: 300,
    });
    expect(refusal(() => loadApiConfig({ ...base, REDIS_URL: 'redis://h:1', REDIS_MIN_REPLICAS_ACK: '-1' })).variable).toBe(
      'REDIS_MIN_REPLICAS_ACK',
    );
    expect(refusal(() => loadApiConfig({ ...base, REDIS_URL: 'redis://h:1', REDIS_ACK_TIMEOUT_MS: '5000' })).message).toBe(
      'REDIS_ACK_TIMEOUT_MS: must be at most 1500 (ms)',
    );
  });
});

describe('keySlot (Redis Cluster hash slots, for WAIT on the right primary)', () => {
  it('matches Redis: CRC16/XMODEM mod 16384, hash tags', async () => {
    const { keySlot } = await import('../../../src/shared/redis.js');
    expect(keySlot('123456789')).toBe(0x31c3); // the CRC16 check value of the cluster spec
    expect(keySlot('foo')).toBe(12182);
    expect(keySlot('{user1000}.following')).toBe(keySlot('{user1000}.followers'));
    expect(keySlot('{opsgate}:ops:id')).toBe(keySlot('opsgate'));
    expect(keySlot(deliveryKey('gitlab', 'x'))).toBe(keySlot('{opsgate}:ops:wait'));
  });
});
