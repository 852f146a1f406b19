import type { Redis } from 'ioredis';
import { NotReplicatedError } from '../shared/errors.js';
import type { Logger } from '../shared/logger.js';
import type { Producer } from '../shared/producer.js';
import { waitForReplicas } from '../shared/redis.js';
import { defineLua, loadLua } from '../shared/lua.js';
import { withFallback } from '../shared/timeout.js';

/**
 * "Acknowledged means replicated" (REDIS_MIN_REPLICAS_ACK=N; 0 = off). Redis replicates
 * asynchronously, so a primary that dies right after a write may take a 202's record and job with
 * it. With N > 0 each route sends `WAIT N REDIS_ACK_TIMEOUT_MS` on both writing connections (the
 * queue's, the request one's; on a Cluster, every primary of each) before its success answer.
 *
 * Fewer than N in time: 503 + Retry-After, and what the request wrote is taken back (each job no
 * worker took, then each record that still names it), so the sender's retry makes one job; a job
 * a worker took stays, and the retry is its duplicate. Never two jobs.
 *
 * Bounded: at most REDIS_ACK_TIMEOUT_MS + CONFIRM_SLACK_MS (the WAITs, cut even when a frozen
 * primary does not answer) + TAKE_BACK_BUDGET_MS: 2 s at the largest timeout (1500), below the
 * webhook senders' 10 s, so a sender gets its 503 and retries instead of timing out.
 */
export const CONFIRM_SLACK_MS = 100;
export const TAKE_BACK_BUDGET_MS = 400;

export interface Written {
  jobId: string;
  /** The records that name this job: a claim's seen and delivery keys, a restart's Idempotency-Key record. */
  keys?: readonly string[];
}

export type ConfirmReplicated = (written: readonly Written[]) => Promise<void>;

interface ReplicationDeps {
  redis: Redis;
  queue: Pick<Producer, 'waitReplicas' | 'remove'>;
  logger: Logger;
  minReplicas: number;
  timeoutMs: number;
}

const RELEASE = 'opsgateReplicaRelease';
/** src/shared/lua/replica-release.lua: deletes a record only while it names the job. */
const RELEASE_LUA = loadLua('replica-release');

/** The fewest replicas any of the WAITs saw acknowledge every write so far; -1: one failed, or all were cut. */
async function fewestAcked(deps: Pick<ReplicationDeps, 'logger' | 'timeoutMs'>, waits: () => Array<Promise<number>>): Promise<number> {
  try {
    return Math.min(...(await withFallback(Promise.all(waits()), deps.timeoutMs + CONFIRM_SLACK_MS, () => [-1])));
  } catch (err) {
    deps.logger.debug('WAIT failed', { err });
    return -1;
  }
}

/** WAIT on both writing connections (the request one's on the primaries of `keys` on a Cluster). */
const onBoth = (deps: Omit<ReplicationDeps, 'queue'> & { queue: Pick<Producer, 'waitReplicas'> }, keys: readonly string[]) => () => [
  waitForReplicas(deps.redis, deps.minReplicas, deps.timeoutMs, deps.redis.isCluster ? keys : undefined),
  deps.queue.waitReplicas(deps.minReplicas, deps.timeoutMs),
];

const ackFields = (deps: Pick<ReplicationDeps, 'minReplicas' | 'timeoutMs'>, acked: number) => ({
  replicas_required: deps.minReplicas,
  replicas_acked: acked < 0 ? null : acked,
  timeout_ms: deps.timeoutMs,
});

/** The one check every route calls before its success answer; a no-op when minReplicas is 0. */
export function replicationGate(deps: ReplicationDeps): ConfirmReplicated {
  if (deps.minReplicas <= 0) return async () => {};
  defineLua(deps.redis, RELEASE, RELEASE_LUA, 1);
  const release = (key: string, jobId: string) =>
    (deps.redis as unknown as Record<string, (key: string, jobId: string) => Promise<unknown>>)[RELEASE]!(key, jobId);
  const { minReplicas, logger } = deps;
  const takeBack = async (w: Written): Promise<void> => {
    try {
      if (!(await deps.queue.remove(w.jobId))) return; // taken by a worker: it stays accepted
      for (const key of w.keys ?? []) await release(key, w.jobId);
    } catch (err) {
      logger.warn('could not take back a write that was not replicated', { job_id: w.jobId, err });
    }
  };

  return async (written) => {
    const keys = written.flatMap((w) => w.keys ?? []);
    const acked = await fewestAcked(deps, onBoth(deps, keys));
    if (acked >= minReplicas) return;
    logger.warn('writes not acknowledged by enough Redis replicas; answering 503', { ...ackFields(deps, acked), jobs: written.length });
    const takenBack = (async () => {
      for (const w of written) await takeBack(w);
      return true;
    })();
    if (!(await withFallback(takenBack, TAKE_BACK_BUDGET_MS, () => false))) {
      logger.warn('taking back the writes that were not replicated did not finish in time; answering 503', {
        budget_ms: TAKE_BACK_BUDGET_MS,
        jobs: written.length,
      });
    }
    throw new NotReplicatedError(minReplicas);
  };
}

export type ConfirmRetryReplicated = () => Promise<void>;

/**
 * REDIS_MIN_REPLICAS_ACK for POST /ops/jobs/{id}/retry, whose writes are all on the queue's
 * connection. Not acknowledged: 503, nothing taken back (that would race a worker that took the
 * job); a retry is idempotent, so the operator repeats it and a 409 "job is waiting" says it took.
 */
export function retryReplicationGate(deps: Omit<ReplicationDeps, 'redis'>): ConfirmRetryReplicated {
  if (deps.minReplicas <= 0) return async () => {};
  const { minReplicas, timeoutMs, logger } = deps;
  return async () => {
    const acked = await fewestAcked(deps, () => [deps.queue.waitReplicas(minReplicas, timeoutMs)]);
    if (acked >= minReplicas) return;
    logger.warn('job retry not acknowledged by enough Redis replicas; answering 503', ackFields(deps, acked));
    throw new NotReplicatedError(
      minReplicas,
      `retry not acknowledged by ${minReplicas} Redis replica${minReplicas === 1 ? '' : 's'} in time; it may still take effect; repeating it is safe (409 "job is waiting" then means it did)`,
    );
  };
}

/** A change of the guarded-changes state, named for its 503: "approval abc123 approved", "freeze f1 declared". */
export type ConfirmChange = (change: string, keys?: readonly string[]) => Promise<void>;

/**
 * REDIS_MIN_REPLICAS_ACK for the guarded-changes routes (approvals, freezes). Not acknowledged:
 * 503, nothing taken back: others may already have acted on the change, so undoing it would be a
 * second change. The caller reads it back before repeating it.
 */
export function changeReplicationGate(deps: Omit<ReplicationDeps, 'queue'> & { queue: Pick<Producer, 'waitReplicas'> }): ConfirmChange {
  if (deps.minReplicas <= 0) return async () => {};
  const { minReplicas, logger } = deps;
  return async (change, keys = []) => {
    const acked = await fewestAcked(deps, onBoth(deps, keys));
    if (acked >= minReplicas) return;
    logger.warn('change not acknowledged by enough Redis replicas; answering 503', { change, ...ackFields(deps, acked) });
    throw new NotReplicatedError(
      minReplicas,
      `${change}, not acknowledged by ${minReplicas} Redis replica${minReplicas === 1 ? '' : 's'} in time; it may still take effect: read it back before repeating it`,
    );
  };
}
