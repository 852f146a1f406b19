import type { Redis } from 'ioredis';
import { API_KEY_LAST_USED_KEY } from '../shared/keys.js';

/**
 * The lifetime of API keys: whether a key is active, close to its expiry or past it, how an answer
 * tells the caller (RFC 9745 Deprecation, RFC 8594 Sunset), and when each key was last used, kept
 * in Redis so every replica reports the same.
 */
type KeyStatus = 'active' | 'expiring' | 'expired';

const DAY_MS = 86_400_000;

/** expired from its expiry on; expiring within `warningDays` of it; else active (also without an expiry). */
export function keyStatus(key: { readonly expiresAt?: number }, now: number, warningDays: number): KeyStatus {
  if (key.expiresAt === undefined) return 'active';
  if (now >= key.expiresAt) return 'expired';
  return key.expiresAt - now <= warningDays * DAY_MS ? 'expiring' : 'active';
}

/** RFC 3339 in UTC, without fractional seconds when there are none (2026-03-01T00:00:00Z). */
export function rfc3339(ms: number): string {
  return new Date(ms).toISOString().replace('.000Z', 'Z');
}

/**
 * The headers of every answer to a key close to its expiry: `Deprecation` (RFC 9745: an RFC 9651
 * date, `@<Unix seconds>`) and `Sunset` (RFC 8594: an HTTP-date), both the key's expiry.
 */
export function expiryHeaders(expiresAt: number): { Deprecation: string; Sunset: string } {
  return { Deprecation: `@${Math.floor(expiresAt / 1000)}`, Sunset: new Date(expiresAt).toUTCString() };
}

/** How often one process writes one key's last use at most: bounds the writes, whatever the traffic. */
const LAST_USED_WRITE_INTERVAL_MS = 60_000;

export interface KeyUsage {
  /** Notes an accepted use of key `id` at `now` (ms); written to Redis at most once per interval per key, never awaited. */
  record(id: string, now: number): void;
  /** Last use (Unix seconds) of each of `ids` that has one, from Redis. Rejects when Redis does not answer. */
  lastUsed(ids: readonly string[]): Promise<Map<string, number>>;
}

/**
 * Last use in Redis (API_KEY_LAST_USED_KEY). Only ids of configured keys reach it: record is
 * called for a matched key, lastUsed with the configured ids, so its size is bounded by the
 * configuration. A failed write is dropped: the next one comes within the interval.
 */
export function createKeyUsage(opts: { redis: Pick<Redis, 'zadd' | 'zmscore'>; intervalMs?: number }): KeyUsage {
  const interval = opts.intervalMs ?? LAST_USED_WRITE_INTERVAL_MS;
  const written = new Map<string, number>();
  return {
    record(id, now) {
      const last = written.get(id);
      // A clock stepped back writes again: ZADD GT keeps the later time anyway.
      if (last !== undefined && now >= last && now - last < interval) return;
      written.set(id, now);
      // GT: a replica whose clock is behind never moves the time back.
      opts.redis.zadd(API_KEY_LAST_USED_KEY, 'GT', Math.floor(now / 1000), id).catch(() => {});
    },
    async lastUsed(ids) {
      const out = new Map<string, number>();
      if (ids.length === 0) return out;
      const scores = await opts.redis.zmscore(API_KEY_LAST_USED_KEY, ...ids);
      ids.forEach((id, i) => {
        const s = scores[i];
        if (s !== null && s !== undefined) out.set(id, Number(s));
      });
      return out;
    },
  };
}
