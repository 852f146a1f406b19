import type { Job, Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { QueueUnavailableError } from './errors.js';
import { JOB } from './jobs.js';
import { jobView, type JobView } from './jobReads.js';
import { restartedAtKey } from './keys.js';
import type { QueueGuard } from './queueGuard.js';

export type RetryOutcome =
  | { outcome: 'retried'; job: JobView }
  | { outcome: 'not_found' }
  | { outcome: 'not_failed'; state: string }
  | { outcome: 'busy'; holder: string };

/** The dead letters: failed jobs, kept with their reason, re-queued by an operator. */
export interface DeadLetters {
  /**
   * Re-queues a failed job with a fresh attempt budget, only if it is still failed (BullMQ's
   * retry is atomic on that). A restart job is re-queued as a new job `<id>.retry` with its
   * Deployment's coalescing record, only while no other restart of that Deployment holds it
   * (`busy` otherwise); the new job restarts the Deployment again (no restartedAt of the old one
   * is re-applied). The answer's job is the one that runs.
   */
  retry(id: string): Promise<RetryOutcome>;
}

export function createDeadLetters(bull: Queue, connection: Redis, guard: QueueGuard): DeadLetters {
  /**
   * A restart is re-queued with its coalescing record, so a restart of the same Deployment asked
   * for while it waits joins it. A failed job no longer holds the record (BullMQ drops it when the
   * job fails for good), and only an add writes one: the retry is a new job, `<id>.retry`, added
   * with the record in one BullMQ add, and the dead letter is removed after it. A crash between
   * the two leaves both, never neither. A retry of `<id>` once it is replaced answers with the
   * state of `<id>.retry`.
   */
  const retryCoalesced = async (job: Job, dedupId: string): Promise<RetryOutcome> => {
    const id = String(job.id);
    const retryId = `${id}.retry`;
    const holder = await guard('read', () => bull.getDeduplicationJobId(dedupId));
    if (holder !== null && holder !== retryId) return { outcome: 'busy', holder };
    const again = await guard('retry', () => bull.add(job.name, job.data, { jobId: retryId, deduplication: { id: dedupId } }));
    if (again.id !== retryId) return { outcome: 'busy', holder: String(again.id) };
    // The retry is queued: should the removal fail, the dead letter stays visible (and a retry of
    // it answers `<id>.retry` again) until it is removed by hand.
    await guard('retry', () => job.remove()).catch(() => undefined);
    await guard('retry', () => connection.del(restartedAtKey(id)));
    return { outcome: 'retried', job: jobView(again, 'waiting') };
  };

  return {
    async retry(id) {
      const job = await guard('read', () => bull.getJob(id));
      if (!job) {
        // A restart already retried: its retry stands for it (409 with the retry's state).
        const state = await guard('read', () => bull.getJobState(`${id}.retry`));
        return state === 'unknown' ? { outcome: 'not_found' } : { outcome: 'not_failed', state };
      }
      const state = await guard('read', () => job.getState());
      if (state !== 'failed') return { outcome: 'not_failed', state };
      const dedupId = job.name === JOB.restartService ? (job.deduplicationId ?? job.opts.deduplication?.id) : undefined;
      if (dedupId) return retryCoalesced(job, dedupId);
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
