import type { Redis } from 'ioredis';
import { ServiceUnavailableError } from '../shared/errors.js';

/** Runs one Redis operation; any Redis failure (down, timeout) becomes 503 + Retry-After. */
export async function redisCall<T>(op: (r: Redis) => Promise<T>, redis: Redis): Promise<T> {
  try {
    return await op(redis);
  } catch {
    throw new ServiceUnavailableError('redis unavailable; retry later', 5);
  }
}

/** Key prefix of everything opsgate itself keeps in Redis (BullMQ uses its own prefix: src/shared/redis.ts queuePrefix). */
export const KEY_PREFIX = 'opsgate:';

/**
 * The one naming rule for keys a script touches: `<prefix>{<id>}`. The braces are a Redis Cluster
 * hash tag: only `id` picks the slot, so every key built for the same id (seen record, and any
 * further per-event key a script uses with it) lands in one slot, while different ids spread
 * over the cluster. `prefix` must not contain braces. Harmless on a single server or Sentinel.
 */
export const taggedKey = (prefix: string, id: string): string => `${prefix}{${id}}`;
export const seenKey = (id: string): string => taggedKey(`${KEY_PREFIX}seen:`, id);
