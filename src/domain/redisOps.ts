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
 * Every intake key (dedup records, delivery-id records, rate-limit counters) is named here and
 * nowhere else. The claim and mark scripts (src/domain/claim.ts) touch several of them in one call.
 *
 * Key naming for Redis Cluster (harmless on a single server or Sentinel). The braces are a hash
 * tag: only the part inside them picks the slot.
 *
 * - Seen and delivery records live in the slot of SLOT_TAG, the same slot as the queue's keys on
 *   a cluster (BullMQ prefix "{opsgate}", src/shared/redis.ts), so BullMQ's deduplication key of
 *   the event too. A claim and its job are then always on the same primary: an enqueue that fails
 *   because that primary died cannot be followed by a successful removal of the record on
 *   another, still healthy shard (rule 9) while the job itself survives on the promoted replica,
 *   which would let the retry make a second job. It also lets the mark script touch the seen
 *   records and BullMQ's deduplication key together.
 * - Rate-limit counters are tagged by address: one key per script, spread over the cluster.
 */
export const SLOT_TAG = '{opsgate}';
/** A key in its own slot by id. `prefix` must not contain braces. */
export const taggedKey = (prefix: string, id: string): string => `${prefix}{${id}}`;
const SEEN_PREFIX = `${SLOT_TAG}:seen:`;
export const seenKey = (id: string): string => SEEN_PREFIX + id;

export const RATE_LIMIT_PREFIX = `${KEY_PREFIX}rl:`;
export const rateLimitKey = (address: string, prefix: string = RATE_LIMIT_PREFIX): string => taggedKey(prefix, address);
/** A sender's own delivery id (X-GitHub-Delivery, X-Gitlab-Event-UUID, Idempotency-Key). */
export const deliveryKey = (source: string, deliveryId: string): string => seenKey(`delivery:${source}:${deliveryId}`);
/** BullMQ's deduplication id of an event (its key is `<queue prefix>:de:<id>`, set by the add script). */
export const dedupId = (eventKey: string): string => (eventKey.startsWith(SEEN_PREFIX) ? eventKey.slice(SEEN_PREFIX.length) : eventKey);
