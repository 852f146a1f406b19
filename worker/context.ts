import type { Job } from 'bullmq';
import type { WorkerDeps } from './deps.js';

/** What a job handler may use besides its validated data: the worker's dependencies and the job's own. */
export interface JobContext extends Omit<WorkerDeps, 'close'> {
  /** The BullMQ job (id, attempts, updateProgress, moveToDelayed for a held deploy). */
  job: Pick<Job, 'id' | 'name' | 'attemptsMade' | 'opts' | 'updateProgress' | 'progress' | 'timestamp'> &
    Partial<Pick<Job, 'moveToDelayed'>>;
  /** The job's lock token (BullMQ's Job#moveToDelayed needs it). */
  token?: string;
  /** Aborted at the per-attempt deadline (JOB_TIMEOUT_SECONDS) or when the worker shuts down. */
  signal: AbortSignal;
  /** Bound to job id and name. */
  logger: WorkerDeps['logger'];
}

export type Handler<D> = (data: D, ctx: JobContext) => Promise<unknown>;
