import { redisTopology } from './redis.js';

/**
 * Every Redis key opsgate reads or writes is named here. On a Cluster only the part inside braces (a hash tag) picks the
 * slot: delivery aliases and push pairs share SLOT_TAG with the queue's keys (queue prefix "{opsgate}"), so one MGET or
 * MULTI covers them and their job; rate-limit counters are tagged by address, spread over the cluster.
 */
const KEY_PREFIX = 'opsgate:';
const SLOT_TAG = '{opsgate}';

/** A single server and Sentinel keep BullMQ's default prefix; a Cluster needs each BullMQ script's keys in one slot: a hash tag. */
export const QUEUE_PREFIX_DEFAULT = 'bull';
export const QUEUE_PREFIX_CLUSTER = SLOT_TAG;
export function queuePrefix(url: string): string {
  return redisTopology(url) === 'cluster' ? QUEUE_PREFIX_CLUSTER : QUEUE_PREFIX_DEFAULT;
}
export const queueKey = (prefix: string, queue: string, suffix: string): string => `${prefix}:${queue}:${suffix}`;

/** A key in its own slot by id. `prefix` must not contain braces. */
export const taggedKey = (prefix: string, id: string): string => `${prefix}{${id}}`;

/** The intake's own records (src/domain/intake.ts), beside BullMQ's deduplication records. */
const SEEN_PREFIX = `${SLOT_TAG}:seen:`;
/** A sender's own delivery id (X-GitHub-Delivery, X-Gitlab-Event-UUID, Idempotency-Key): "q:<job id>". */
export const deliveryKey = (source: string, deliveryId: string): string => `${SEEN_PREFIX}delivery:${source}:${deliveryId}`;
/** A push of `before` to the commit of `eventId` queued as a job ("<until ms>:<job id>"), for senders with `replayGuard`. */
export const pushPairKey = (eventId: string, before: string): string => `${SEEN_PREFIX}pair:${before}:${eventId}`;
/** Version 0.1's record of an event, read during an upgrade. */
export const legacySeenKey = (identity: string): string => SEEN_PREFIX + identity;
/** When this version's intake first ran against the Redis (ms since the epoch). */
export const INTAKE_SINCE_KEY = `${KEY_PREFIX}intake:since`;

/** A timestamped signature already used by a sender (its replay is refused while its timestamp is fresh). */
export const signatureSeenKey = (source: string, signature: string): string => `${KEY_PREFIX}sig:${source}:${signature}`;

/** A sender's last deliveries (a capped stream), tagged by sender: on a Cluster each on its own slot. */
export const deliveriesKey = (source: string): string => `${KEY_PREFIX}deliveries:{${source}}`;
/** Unverified deliveries, which anyone can send, kept apart from the verified ones (same slot). */
export const unverifiedDeliveriesKey = (source: string): string => `${KEY_PREFIX}deliveries:unverified:{${source}}`;

export const RATE_LIMIT_PREFIX = `${KEY_PREFIX}rl:`;
/** A client address's rate-limit counter (`address` as src/api/rateLimit.ts addressKey makes it). */
export const rateLimitKey = (address: string, prefix: string = RATE_LIMIT_PREFIX): string => taggedKey(prefix, address);

/** The stored answer of a restart's or a CI deploy's Idempotency-Key (scope: principal + key, hashed). */
export const idempotencyRecordKey = (scope: string): string => `${KEY_PREFIX}idem:restart:${scope}`;
export const deployIdempotencyRecordKey = (scope: string): string => `${KEY_PREFIX}idem:deploy:${scope}`;

/** When each API key was last accepted, by any replica: a sorted set, member = key id, score = Unix seconds. */
export const API_KEY_LAST_USED_KEY = `${KEY_PREFIX}api-keys:last-used`;

/** Every cache key starts with it, so DELETE /ops/cache can scan for them. */
export const CACHE_PREFIX = `${KEY_PREFIX}cache:`;
export const hostStatusKey = (host: string): string => `${CACHE_PREFIX}host-status:${host}`;

const WORKER_KEY_PREFIX = `${KEY_PREFIX}worker`;
/** The restartedAt a restart job chose (its retries re-apply it); a manual retry drops it: a replay is a new restart. */
export const restartedAtKey = (jobId: string): string => `${WORKER_KEY_PREFIX}:restart:${jobId}`;
/** A notify job's record of one delivered notification; `urlHash`, never the URL (it carries a secret). */
export const notifyDeliveryKey = (jobId: string, urlHash: string): string => `${WORKER_KEY_PREFIX}:notify:${jobId}:${urlHash}`;

/**
 * Guarded changes. Approvals and restart budgets share SLOT_TAG: an approval's decision and the
 * budget it takes are one script over both (on a Cluster, one slot).
 */
const GUARD_PREFIX = `${SLOT_TAG}:guard:`;
export const approvalKey = (id: string): string => `${GUARD_PREFIX}approval:${id}`;
/** The pending approvals: a sorted set, member = approval id, score = expiry (ms). */
export const APPROVALS_PENDING_KEY = `${GUARD_PREFIX}approvals:pending`;
/** The pending approval of one change identity: a second request for the same change joins it. */
export const approvalIndexKey = (identity: string): string => `${GUARD_PREFIX}approval-for:${identity}`;
/** A concurrency group of deploys: the one running and the newest started and accepted. */
export const deployGroupKey = (group: string): string => `${GUARD_PREFIX}deploy-group:${group}`;
/** A running deploy a newer one of its group cancels (cancel_in_progress): the newer deploy's job id, for a while. */
export const deployCancelKey = (jobId: string): string => `${GUARD_PREFIX}deploy-cancel:${jobId}`;
/** A namespace's restarts in the budget's sliding window: a sorted set, member = job id, score = when (ms). */
export const budgetKey = (namespace: string): string => `${GUARD_PREFIX}budget:restart:${namespace}`;
/** A rule's or a namespace's remediation budget; one hash tag for all, as a remediation takes a place of two in one script. */
export const remediationBudgetKey = (of: 'rule' | 'namespace', name: string): string => `${GUARD_PREFIX}budget:{remediation}:${of}:${name}`;
/** The freezes: a hash, field = freeze id, value = JSON. */
export const FREEZES_KEY = `${KEY_PREFIX}freezes`;
/** Pub/sub channel told of every change of the freezes (each API process keeps them in memory). */
export const FREEZES_CHANNEL = `${KEY_PREFIX}freezes:changed`;
/** The deploys held by a freeze or outside their windows: a hash, field = job id, value = JSON (reasons, until). */
export const HOLDS_KEY = `${KEY_PREFIX}holds`;

/** Alert-driven remediation. A rule's records of one Deployment share a hash tag: the guard's one script covers them. */
const REMEDIATION_PREFIX = `${KEY_PREFIX}remediation:`;
function remediationTargetKey(kind: string) {
  return (rule: string, namespace: string, deployment: string): string =>
    `${REMEDIATION_PREFIX}${kind}:{${rule}/${namespace}/${deployment}}`;
}
/** The rule's cooldown of a Deployment: the id of the remediation that started it, expiring with it. */
export const remediationCooldownKey = remediationTargetKey('cooldown');
/** The rule's remediations of a Deployment in the escalation window: a sorted set, member = id, score = when (ms). */
export const remediationHistoryKey = remediationTargetKey('history');
/** The rule escalated for this Deployment: no remediation and no second page until it expires. */
export const remediationEscalatedKey = remediationTargetKey('escalated');
/** The distinct firings of one alert seen by a rule: a sorted set, member = its firing start, score = when last seen (ms). */
export const remediationEpisodesKey = (rule: string, fingerprint: string): string => `${REMEDIATION_PREFIX}episodes:${rule}:${fingerprint}`;
/** The remediation under way for one alert of a rule (JSON), until its silence's settle time ends. */
export const remediationActiveKey = (rule: string, fingerprint: string): string => `${REMEDIATION_PREFIX}active:${rule}:${fingerprint}`;
/** One alert of a rule was notified resolved (its startsAt, ms): read when there is no ALERTMANAGER_URL to ask. */
export const remediationResolvedKey = (rule: string, fingerprint: string): string => `${REMEDIATION_PREFIX}resolved:${rule}:${fingerprint}`;
/** The recent decisions, newest first (a capped list of JSON), for GET /ops/remediations. */
export const REMEDIATION_DECISIONS_KEY = `${REMEDIATION_PREFIX}decisions`;
/** The silences opsgate keeps (a set of Alertmanager silence ids), for opsgate_remediation_silences_active. */
export const REMEDIATION_SILENCES_KEY = `${REMEDIATION_PREFIX}silences`;

/** The history of deploys: every kept deploy's entry (hash: id -> JSON). */
export const DEPLOY_HISTORY_KEY = `${GUARD_PREFIX}deploys:entries`;
/** Every project's kept deploys: a sorted set, member = deploy id, score = acceptance (ms). */
export const DEPLOY_HISTORY_ALL_KEY = `${GUARD_PREFIX}deploys:all`;
/** One project's kept deploys, as DEPLOY_HISTORY_ALL_KEY; its length is the bound (DEPLOY_HISTORY_KEPT). */
export const deployHistoryProjectKey = (project: string): string => `${GUARD_PREFIX}deploys:project:${project}`;
/** What the host of a deploy's commit was told (a hash per deploy), and the lock its reports take one at a time. */
export const deployStatusKey = (id: string): string => `${GUARD_PREFIX}deploys:status:${id}`;
export const deployStatusLockKey = (id: string): string => `${GUARD_PREFIX}deploys:status-lock:${id}`;
/** One project's refs: the current (last succeeded) and the running deploy of each. */
export const deployRefsKey = (project: string): string => `${GUARD_PREFIX}deploys:refs:${project}`;
