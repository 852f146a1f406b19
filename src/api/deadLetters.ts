import type { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { ConflictError, NotFoundError, QueueUnavailableError } from '../shared/errors.js';
import { JOB } from '../shared/jobs.js';
import { jobView, type JobView } from '../shared/jobReads.js';
import type { QueueGuard } from '../shared/queueGuard.js';

export type RetryOutcome =
  | { outcome: 'retried'; job: JobView; held_until?: string }
  | { outcome: 'pending_approval'; approval_id: string; expires_at: string; required: number }
  | { outcome: 'not_found' }
  | { outcome: 'not_failed'; state: string }
  | { outcome: 'busy'; holder: string };

/** A retry that did not happen, as the error both ways of retrying (the API, Bull Board) answer with. */
export function refuseUnretried(out: RetryOutcome): asserts out is Extract<RetryOutcome, { outcome: 'retried' | 'pending_approval' }> {
  switch (out.outcome) {
    case 'not_found':
      throw new NotFoundError('job not found', 'job_not_found');
    case 'not_failed':
      throw new ConflictError(`job is ${out.state}; only a failed (dead-lettered) job can be retried`, 'job_not_failed');
    case 'busy':
      throw new ConflictError(
        `another restart of this Deployment is waiting or rolling out (job ${out.holder}); retry this one after it finished`,
        'restart_in_progress',
      );
  }
}

/** Who retries a dead letter, and why (a restart's or deploy's retry is a new change of theirs). */
interface RetryBy {
  requester: { principal: string; credential: string; owner: string; ownerKnown: boolean };
  reason: string;
  auditId: string;
}

/** A change's retry: a new change under the job id `<id>.retry`, planned like any other (src/changes/retry.ts); refusals thrown. */
export interface ChangeRetry {
  carries(jobName: string): boolean;
  /** `clear`: the records of the old job to delete once its dead letter is removed (a restart's restartedAt). */
  retry(
    job: { id: string; name: string; data: unknown; timestamp?: number },
    by: RetryBy,
  ): Promise<RetryOutcome & { clear?: readonly string[] }>;
}

/** The jobs retried in place: they carry no change. Without the pipeline, every other job is refused (fails closed). */
const RETRIED_IN_PLACE: ReadonlySet<string> = new Set([JOB.notifyOncall, JOB.reportChange, JOB.remediate, JOB.dryRun]);

export type DeadLetters = ReturnType<typeof createDeadLetters>;

/**
 * Re-queues a failed job, only if it is still failed. A notification is retried in place with a fresh attempt budget (BullMQ's
 * retry is atomic on that). A restart or deploy is a new change: once it is queued, the dead letter is removed (a crash between
 * the two leaves both, never neither); waiting for approval, the dead letter stays. The answer's job is the one that runs.
 */
export function createDeadLetters(bull: Queue, connection: Redis, guard: QueueGuard, changeRetry?: ChangeRetry) {
  return {
    async retry(id: string, by: RetryBy): Promise<RetryOutcome> {
      const job = await guard('read', () => bull.getJob(id));
      if (!job) {
        // A change already retried: its retry stands for it (409 with the retry's state).
        const state = await guard('read', () => bull.getJobState(`${id}.retry`));
        return state === 'unknown' ? { outcome: 'not_found' } : { outcome: 'not_failed', state };
      }
      const state = await guard('read', () => job.getState());
      if (state !== 'failed') return { outcome: 'not_failed', state };
      if (changeRetry ? changeRetry.carries(job.name) : !RETRIED_IN_PLACE.has(job.name)) {
        // Fails closed: a change never goes back on the queue without the pipeline.
        if (!changeRetry)
          throw new ConflictError('a restart or deploy can only be retried through the change pipeline', 'guards_unavailable');
        const { clear, ...out } = await changeRetry.retry({ id, name: job.name, data: job.data, timestamp: job.timestamp }, by);
        if (out.outcome === 'retried') {
          // Should the removal fail, the dead letter stays visible (its retry answers `<id>.retry`) until removed by hand.
          await guard('retry', () => job.remove()).catch(() => undefined);
          if (clear && clear.length > 0) await guard('retry', () => connection.del(...clear));
        }
        return out;
      }
      try {
        await guard('retry', () => job.retry('failed', { resetAttemptsMade: true, resetAttemptsStarted: true }));
      } catch (err) {
        // Not in the failed set any more (retried or removed concurrently).
        if (err instanceof QueueUnavailableError) {
          const now = await guard('read', () => job.getState());
          if (now !== 'failed') return { outcome: 'not_failed', state: now };
        }
        throw err;
      }
      return { outcome: 'retried', job: jobView(job, 'waiting') };
    },
  };
}
