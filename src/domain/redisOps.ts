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

/** Key prefix of everything opsgate itself keeps in Redis (BullMQ uses its own "bull:" prefix). */
export const KEY_PREFIX = 'opsgate:';
const SEEN_PREFIX = `${KEY_PREFIX}seen:`;
export const seenKey = (id: string): string => SEEN_PREFIX + id;

/**
 * Every intake key (dedup records, delivery-id records, rate-limit counters) is named here and
 * nowhere else, so a deployment on Redis Cluster can give them one hash tag in one place.
 * The claim and mark scripts (src/domain/claim.ts) touch several of them in one call.
 */
export const RATE_LIMIT_PREFIX = `${KEY_PREFIX}rl:`;
export const rateLimitKey = (address: string, prefix: string = RATE_LIMIT_PREFIX): string => prefix + address;
/** A sender's own delivery id (X-GitHub-Delivery, X-Gitlab-Event-UUID, Idempotency-Key). */
export const deliveryKey = (source: string, deliveryId: string): string => seenKey(`delivery:${source}:${deliveryId}`);
/** BullMQ's deduplication id of an event (its key is `<queue prefix>:de:<id>`, set by the add script). */
export const dedupId = (eventKey: string): string => (eventKey.startsWith(SEEN_PREFIX) ? eventKey.slice(SEEN_PREFIX.length) : eventKey);
