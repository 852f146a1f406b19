import { Queue, type JobsOptions } from 'bullmq';
import type { Redis } from 'ioredis';
import { ServiceUnavailableError, UnprocessableError } from './errors.js';
import { QUEUE_NAME, defaultJobOptions, jobDataSchemas, type JobDataByName, type JobName, type JobPolicy } from './jobs.js';
import type { Logger } from './logger.js';
import type { Metrics } from './metrics.js';
import { createRedis, queuePrefix, waitForReplicas } from './redis.js';

/**
 * The API's producer side of the "ops" queue. Its Redis connection uses the `request` profile
 * (no offline queue, one retry, command timeout), and every call is additionally bounded by
 * `timeoutMs`, so when Redis is down `enqueue` fails fast with a ServiceUnavailableError (503 +
 * Retry-After) instead of hanging the request.
 */
export interface OpsQueueOptions {
  url: string;
  policy: JobPolicy;
  logger?: Logger;
  metrics?: Pick<Metrics, 'jobsEnqueued'>;
  /** Upper bound of one queue operation; default 3000 ms. */
  timeoutMs?: number;
}

/** What GET /ops/jobs/{id} shows: state and bookkeeping, never the job's data or return value. */
export interface JobView {
  id: string;
  name: string;
  state: string;
  attempts_made: number;
  attempts_max: number;
  failed_reason: string | null;
  progress: unknown;
  created_at: string | null;
  processed_at: string | null;
  finished_at: string | null;
}

export interface OpsQueue {
  /** Validates `data` against the job's schema (422 on failure), adds it, returns the job id. */
  enqueue<N extends JobName>(name: N, data: JobDataByName[N], opts?: Pick<JobsOptions, 'jobId'>): Promise<string>;
  getJob(id: string): Promise<JobView | undefined>;
  /** Redis reachable from the queue's connection (for /ready). */
  isReady(): boolean;
  /**
   * WAIT on the queue's own connection (every job it added so far): how many replicas
   * acknowledged them within timeoutMs (src/domain/replication.ts).
   */
  waitReplicas(numReplicas: number, timeoutMs: number): Promise<number>;
  /**
   * Takes back a job no worker has taken yet. true: removed (or not there); false: it is
   * active or finished, so it stays (and counts as accepted).
   */
  remove(id: string): Promise<boolean>;
  /** The BullMQ Queue itself (Bull Board mounts it). */
  readonly bull: Queue;
  close(): Promise<void>;
}

export class QueueUnavailableError extends ServiceUnavailableError {
  constructor() {
    super('job queue unavailable; retry later', 5);
  }
}

const iso = (ms: number | undefined | null): string | null =>
  typeof ms === 'number' && Number.isFinite(ms) && ms > 0 ? new Date(ms).toISOString() : null;

function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`queue operation timed out after ${ms} ms`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

export function createOpsQueue(opts: OpsQueueOptions): OpsQueue {
  const timeoutMs = opts.timeoutMs ?? 3000;
  const connection: Redis = createRedis(opts.url, 'request', 'opsgate-api-queue');
  const bull = new Queue(QUEUE_NAME, {
    connection,
    prefix: queuePrefix(opts.url),
    defaultJobOptions: defaultJobOptions(opts.policy),
  });
  // Without a listener an 'error' event would crash the process; connection errors surface as 503s.
  bull.on('error', (err) => opts.logger?.debug('queue connection error', { err }));

  const guard = async <T>(op: () => Promise<T>): Promise<T> => {
    // Fail fast while disconnected: BullMQ would otherwise wait for the connection to come back.
    if (connection.status !== 'ready') throw new QueueUnavailableError();
    try {
      return await withTimeout(op(), timeoutMs);
    } catch (err) {
      opts.logger?.warn('queue operation failed', { err });
      throw new QueueUnavailableError();
    }
  };

  return {
    bull,
    isReady: () => connection.status === 'ready',

    async enqueue(name, data, jobOpts) {
      const schema = jobDataSchemas[name];
      const parsed = schema.safeParse(data);
      if (!parsed.success) {
        const issue = parsed.error.issues[0]!;
        throw new UnprocessableError(`invalid ${issue.path.join('.') || 'job data'}: ${issue.message}`);
      }
      const job = await guard(() => bull.add(name, parsed.data, jobOpts));
      if (job.id === undefined) throw new QueueUnavailableError();
      opts.metrics?.jobsEnqueued.inc({ name });
      return job.id;
    },

    async waitReplicas(numReplicas, timeoutMs) {
      if (connection.status !== 'ready') throw new QueueUnavailableError();
      // Every key of the queue shares the prefix's hash tag: on a Cluster, one primary.
      return waitForReplicas(connection, numReplicas, timeoutMs, [`${bull.opts.prefix ?? 'bull'}:${QUEUE_NAME}:id`]);
    },

    async remove(id) {
      if (connection.status !== 'ready') throw new QueueUnavailableError();
      // Only a job no worker has taken yet is taken back: one that is active or already finished
      // was accepted for real (removing it would let a retry run the work twice).
      const state = await bull.getJobState(id);
      if (state === 'unknown') return true;
      if (!['waiting', 'delayed', 'prioritized', 'waiting-children'].includes(state)) return false;
      // BullMQ's removeJob script answers 0 when a worker locked the job in the meantime.
      return (await bull.remove(id)) === 1;
    },

    async getJob(id) {
      const job = await guard(() => bull.getJob(id));
      if (!job) return undefined;
      const state = await guard(() => job.getState());
      return {
        id: String(job.id),
        name: job.name,
        state,
        attempts_made: job.attemptsMade,
        attempts_max: job.opts.attempts ?? 1,
        failed_reason: job.failedReason ? String(job.failedReason) : null,
        progress: job.progress,
        created_at: iso(job.timestamp),
        processed_at: iso(job.processedOn),
        finished_at: iso(job.finishedOn),
      };
    },

    async close() {
      try {
        await bull.close();
      } finally {
        connection.disconnect();
      }
    },
  };
}
