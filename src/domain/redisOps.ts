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
 * Key naming for Redis Cluster (harmless on a single server or Sentinel). The braces are a hash
 * tag: only the part inside them picks the slot.
 *
 * - Seen records live in the slot of SLOT_TAG, the same slot as the queue's keys on a cluster
 *   (BullMQ prefix "{opsgate}", src/shared/redis.ts). A claim and its job are then always on the
 *   same primary: an enqueue that fails because that primary died cannot be followed by a
 *   successful removal of the record on another, still healthy shard (rule 9) while the job
 *   itself survives on the promoted replica, which would let the retry make a second job.
 *   It also lets one script touch a seen record and the queue together.
 * - taggedKey(prefix, id) gives a key its own slot by id (the rate-limit counters: one key per
 *   script, spread over the cluster). `prefix` must not contain braces.
 */
export const SLOT_TAG = '{opsgate}';
export const taggedKey = (prefix: string, id: string): string => `${prefix}{${id}}`;
export const seenKey = (id: string): string => `${SLOT_TAG}:seen:${id}`;
