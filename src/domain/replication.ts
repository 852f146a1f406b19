import type { Redis } from 'ioredis';
import { NotReplicatedError } from '../shared/errors.js';
import type { Logger } from '../shared/logger.js';
import type { Producer } from '../shared/producer.js';
import { waitForReplicas } from '../shared/redis.js';
import { defineLua, loadLua } from '../shared/lua.js';
import { withFallback } from '../shared/timeout.js';

/**
 * "Acknowledged means replicated" (REDIS_MIN_REPLICAS_ACK=N, opt-in; 0 = off).
 *
 * Redis replicates asynchronously: a primary that dies right after a write may take the seen
 * record and the job with it, although the API already answered 202. With N > 0, each route
 * calls `confirm` once, after its writes and before its success answer. It sends Redis `WAIT N
 * REDIS_ACK_TIMEOUT_MS` on the two connections that write (the queue's connection: jobs, with the
 * events' deduplication records written by the same BullMQ add; the request connection: a
 * sender's delivery-id alias, a restart's Idempotency-Key record; on a Cluster, on every primary
 * of each). WAIT returns once N replicas
 * acknowledged every write that connection made so far, so a success answer means the record and
 * the job are on N replicas and survive a failover to any of them.
 *
 * When fewer than N acknowledge in time (or the primary is gone), the answer is 503 with
 * Retry-After, and what this request wrote is taken back, as for a failed enqueue (no seen record
 * is left without its job, so the sender's retry is delivered again): each job no worker has taken
 * yet is removed (BullMQ removes its deduplication record with it), then each record that still
 * names that job is deleted: the intake's delivery keys ("q:<id>", src/domain/intake.ts) and a
 * restart's Idempotency-Key answer (JSON with job_id <id>). The sender's retry then makes one job. A job a worker already took stays, and so do its records: the retry
 * is a duplicate. When the primary is gone, taking back fails too; after the failover the retry
 * then finds whatever was replicated: nothing (a new claim) or the record with its job (a
 * duplicate; a replica receives a script's writes together, and the add is one script). Never two jobs.
 *
 * Bounded: the step between the writes and the answer takes at most REDIS_ACK_TIMEOUT_MS +
 * CONFIRM_SLACK_MS (the WAITs, cut there even when the primary does not answer them: frozen, or
 * gone in a failover) + TAKE_BACK_BUDGET_MS (the take-back: past it the 503 goes out, and what
 * the take-back has not finished goes on in the order above and is logged). With the largest REDIS_ACK_TIMEOUT_MS (1500) that is 2 s, below the timeouts
 * of webhook senders (Alertmanager, GitLab: 10 s), so a sender gets its 503 and retries instead of
 * timing out. Without the cuts a frozen primary held each command for the connection's 2 s command
 * timeout, WAIT and every take-back command in turn.
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

/**
 * How many replicas acknowledged every write of both writing connections so far (the request
 * connection's on the primaries of `keys` on a Cluster), cut at timeoutMs + CONFIRM_SLACK_MS;
 * -1 when WAIT failed or was cut.
 */
async function ackedOnBoth(
  deps: Omit<ReplicationDeps, 'queue'> & { queue: Pick<Producer, 'waitReplicas'> },
  keys: readonly string[],
): Promise<number> {
  const { minReplicas, timeoutMs } = deps;
  try {
    const both = Promise.all([
      // The records' primary (on a Cluster the queue's too; a single server or Sentinel: the one).
      waitForReplicas(deps.redis, minReplicas, timeoutMs, deps.redis.isCluster ? keys : undefined),
      deps.queue.waitReplicas(minReplicas, timeoutMs),
    ]);
    const [onRecords, onJobs] = await withFallback(both, timeoutMs + CONFIRM_SLACK_MS, () => [-1, -1]);
    return Math.min(onRecords, onJobs);
  } catch (err) {
    deps.logger.debug('WAIT failed', { err });
    return -1;
  }
}

/** The one check every route calls before its success answer; a no-op when minReplicas is 0. */
export function replicationGate(deps: ReplicationDeps): ConfirmReplicated {
  if (deps.minReplicas <= 0) return async () => {};
  defineLua(deps.redis, RELEASE, RELEASE_LUA, 1);
  const release = (key: string, jobId: string) =>
    (deps.redis as unknown as Record<string, (key: string, jobId: string) => Promise<unknown>>)[RELEASE]!(key, jobId);
  const { minReplicas, timeoutMs, logger } = deps;

  const takeBack = async (w: Written): Promise<void> => {
    try {
      if (!(await deps.queue.remove(w.jobId))) return; // taken by a worker: it stays accepted
      for (const key of w.keys ?? []) await release(key, w.jobId);
    } catch (err) {
      logger.warn('could not take back a write that was not replicated', { job_id: w.jobId, err });
    }
  };

  return async (written) => {
    const acked = await ackedOnBoth(
      deps,
      written.flatMap((w) => w.keys ?? []),
    );
    if (acked >= minReplicas) return;
    logger.warn('writes not acknowledged by enough Redis replicas; answering 503', {
      replicas_required: minReplicas,
      replicas_acked: acked < 0 ? null : acked,
      timeout_ms: timeoutMs,
      jobs: written.length,
    });
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
 * REDIS_MIN_REPLICAS_ACK for POST /ops/jobs/{id}/retry: the retry's writes (the job moved from
 * the failed set back to waiting, a restart's deduplication slot and dropped restartedAt) are all
 * on the queue's connection, so one `WAIT N REDIS_ACK_TIMEOUT_MS` there covers them.
 *
 * Not acknowledged in time: 503 + Retry-After, and nothing is taken back. Moving the job back to
 * the failed set would race with a worker that already took it, and a retry is idempotent: the
 * retry stays in effect on this primary (the job is waiting again and will run); if the primary
 * is lost before a replica got it, the promoted replica still has the job failed. Either way the
 * operator repeats the retry: it re-queues the job (200) or answers 409 "job is waiting" (or
 * active/completed), which means the first one took effect. The job never runs twice for one
 * successful retry.
 */
export function retryReplicationGate(deps: Omit<ReplicationDeps, 'redis'>): ConfirmRetryReplicated {
  if (deps.minReplicas <= 0) return async () => {};
  const { minReplicas, timeoutMs, logger } = deps;
  return async () => {
    let acked = -1;
    try {
      acked = await withFallback(deps.queue.waitReplicas(minReplicas, timeoutMs), timeoutMs + CONFIRM_SLACK_MS, () => -1);
    } catch (err) {
      logger.debug('WAIT failed', { err });
    }
    if (acked >= minReplicas) return;
    logger.warn('job retry not acknowledged by enough Redis replicas; answering 503', {
      replicas_required: minReplicas,
      replicas_acked: acked < 0 ? null : acked,
      timeout_ms: timeoutMs,
    });
    throw new NotReplicatedError(
      minReplicas,
      `retry not acknowledged by ${minReplicas} Redis replica${minReplicas === 1 ? '' : 's'} in time; it may still take effect; repeating it is safe (409 "job is waiting" then means it did)`,
    );
  };
}

/** A change of the guarded-changes state, named for its 503: "approval abc123 approved", "freeze f1 declared". */
export type ConfirmChange = (change: string, keys?: readonly string[]) => Promise<void>;

/**
 * REDIS_MIN_REPLICAS_ACK for the guarded-changes routes (a pending approval, an approval's decision
 * and the job it queues, a freeze declared or lifted with the deploys it releases): one WAIT on each
 * writing connection before the success answer, as for the intake.
 *
 * Not acknowledged in time: 503 + Retry-After, and nothing is taken back. Each of these changes is
 * a state transition other callers may already have seen or acted on (an approver racing, a worker
 * taking a released deploy), so undoing it would be a second change, not a take-back. The answer
 * says the change may still take effect; the caller reads it back (GET /ops/approvals/{id},
 * GET /ops/freezes) before repeating it, and a repeat of one that took effect is answered as such
 * (409 "already approved", or the pending approval joined).
 */
export function changeReplicationGate(deps: Omit<ReplicationDeps, 'queue'> & { queue: Pick<Producer, 'waitReplicas'> }): ConfirmChange {
  if (deps.minReplicas <= 0) return async () => {};
  const { minReplicas, timeoutMs, logger } = deps;
  return async (change, keys = []) => {
    const acked = await ackedOnBoth(deps, keys);
    if (acked >= minReplicas) return;
    logger.warn('change not acknowledged by enough Redis replicas; answering 503', {
      change,
      replicas_required: minReplicas,
      replicas_acked: acked < 0 ? null : acked,
      timeout_ms: timeoutMs,
    });
    throw new NotReplicatedError(
      minReplicas,
      `${change}, not acknowledged by ${minReplicas} Redis replica${minReplicas === 1 ? '' : 's'} in time; it may still take effect: read it back before repeating it`,
    );
  };
}
