import type { Redis } from 'ioredis';
import { API_KEY_LAST_USED_KEY } from '../shared/keys.js';

/** expired from its expiry on; expiring within `warningDays` of it; else active (also without an expiry). */
export function keyStatus(key: { readonly expiresAt?: number }, now: number, warningDays: number): 'active' | 'expiring' | 'expired' {
  if (key.expiresAt === undefined) return 'active';
  if (now >= key.expiresAt) return 'expired';
  return key.expiresAt - now <= warningDays * 86_400_000 ? 'expiring' : 'active';
}

/** RFC 3339 in UTC, without fractional seconds when there are none (2026-03-01T00:00:00Z). */
export function rfc3339(ms: number): string {
  return new Date(ms).toISOString().replace('.000Z', 'Z');
}

/** The headers of every answer to a key close to its expiry: `Deprecation` (RFC 9745: `@<Unix seconds>`) and `Sunset` (RFC 8594: an HTTP-date). */
export function expiryHeaders(expiresAt: number): { Deprecation: string; Sunset: string } {
  return { Deprecation: `@${Math.floor(expiresAt / 1000)}`, Sunset: new Date(expiresAt).toUTCString() };
}

export type KeyUsage = ReturnType<typeof createKeyUsage>;

/**
 * When each key was last used, in Redis so every replica reports the same. Only ids of configured keys reach it, so its size is
 * bounded by the configuration. One process writes one key's use at most once a minute, never awaited; a failed write is dropped.
 */
export function createKeyUsage(opts: { redis: Pick<Redis, 'zadd' | 'zmscore'>; intervalMs?: number }) {
  const interval = opts.intervalMs ?? 60_000;
  const written = new Map<string, number>();
  return {
    record(id: string, now: number): void {
      const last = written.get(id);
      // A clock stepped back writes again: ZADD GT keeps the later time anyway.
      if (last !== undefined && now >= last && now - last < interval) return;
      written.set(id, now);
      // GT: a replica whose clock is behind never moves the time back.
      opts.redis.zadd(API_KEY_LAST_USED_KEY, 'GT', Math.floor(now / 1000), id).catch(() => {});
    },
    /** Last use (Unix seconds) of each of `ids` that has one. */
    async lastUsed(ids: readonly string[]): Promise<Map<string, number>> {
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
