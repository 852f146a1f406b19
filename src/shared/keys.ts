import { redisTopology } from './redis.js';

/**
 * Every Redis key opsgate reads or writes is named here and nowhere else: the queue's prefix, the
 * intake's seen and delivery records, rate-limit counters, the restart Idempotency-Key records, the
 * host-status cache and the worker's own records. BullMQ names the keys under the queue prefix
 * itself (`<prefix>:<queue>:<suffix>`); queueKey spells that form for the few places that touch one.
 *
 * Key naming for Redis Cluster (harmless on a single server or Sentinel). The braces are a hash
 * tag: only the part inside them picks the slot.
 *
 * - Seen and delivery records live in the slot of SLOT_TAG, the same slot as the queue's keys on
 *   a cluster (queue prefix "{opsgate}"). The intake's script (src/domain/claim.ts) writes an
 *   event's records and its job together, which a script can do only within one slot; and a claim
 *   and its job are then always on the same primary, so no failover can keep one without the other.
 * - Rate-limit counters are tagged by address: one key per script, spread over the cluster.
 */

/** Prefix of everything opsgate itself keeps in Redis (BullMQ's keys use the queue prefix). */
export const KEY_PREFIX = 'opsgate:';
export const SLOT_TAG = '{opsgate}';

/**
 * BullMQ key prefix. A single server and Sentinel keep BullMQ's default ("bull", so an existing
 * installation sees its queue unchanged). Redis Cluster needs every key of one BullMQ script in
 * one hash slot, so there the prefix is a hash tag: all of the "ops" queue lives in the slot of
 * "opsgate" (on one primary; BullMQ's documented way to run on a cluster).
 */
export const QUEUE_PREFIX_DEFAULT = 'bull';
export const QUEUE_PREFIX_CLUSTER = SLOT_TAG;
export function queuePrefix(url: string): string {
  return redisTopology(url) === 'cluster' ? QUEUE_PREFIX_CLUSTER : QUEUE_PREFIX_DEFAULT;
}
/** One of BullMQ's keys of a queue, e.g. queueKey('bull', 'ops', 'id'). */
export const queueKey = (prefix: string, queue: string, suffix: string): string => `${prefix}:${queue}:${suffix}`;

/** A key in its own slot by id. `prefix` must not contain braces. */
export const taggedKey = (prefix: string, id: string): string => `${prefix}{${id}}`;

/** The prefix of every seen and delivery record. */
export const SEEN_PREFIX = `${SLOT_TAG}:seen:`;
/** An intake event's seen record (its content key: SCM ref + commit, alert fingerprint). */
export const seenKey = (id: string): string => SEEN_PREFIX + id;
/** An alert's seen record, by its Alertmanager fingerprint. */
export const alertSeenKey = (fingerprint: string): string => seenKey(`alert:${fingerprint}`);
/** A sender's own delivery id (X-GitHub-Delivery, X-Gitlab-Event-UUID, Idempotency-Key). */
export const deliveryKey = (source: string, deliveryId: string): string => seenKey(`delivery:${source}:${deliveryId}`);

export const RATE_LIMIT_PREFIX = `${KEY_PREFIX}rl:`;
/** A client address's rate-limit counter (`address` as src/shared/rateLimit.ts addressKey makes it). */
export const rateLimitKey = (address: string, prefix: string = RATE_LIMIT_PREFIX): string => taggedKey(prefix, address);

/** The stored answer of a restart request's Idempotency-Key (scope: principal + key, hashed). */
export const idempotencyRecordKey = (scope: string): string => `${KEY_PREFIX}idem:restart:${scope}`;

/** Every cache key starts with it, so DELETE /ops/cache can scan for them. */
export const CACHE_PREFIX = `${KEY_PREFIX}cache:`;
export const hostStatusKey = (host: string): string => `${CACHE_PREFIX}host-status:${host}`;

/** Records the worker writes besides BullMQ's own. */
export const WORKER_KEY_PREFIX = `${KEY_PREFIX}worker`;
/**
 * The worker's record of the restartedAt value a restart job chose (its retries re-apply it: no
 * second restart). The API drops it on a manual retry of a dead-lettered restart (POST
 * /ops/jobs/{id}/retry): a replay is a new restart.
 */
export const restartedAtKey = (jobId: string): string => `${WORKER_KEY_PREFIX}:restart:${jobId}`;
/** A notify job's record of one delivered notification; `urlHash`, never the URL (it carries a secret). */
export const notifyDeliveryKey = (jobId: string, urlHash: string): string => `${WORKER_KEY_PREFIX}:notify:${jobId}:${urlHash}`;
