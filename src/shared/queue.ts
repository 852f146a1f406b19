import { Job, Queue, type JobsOptions } from 'bullmq';
import { ReplyError, type Redis } from 'ioredis';
import { QueueUnavailableError, UnprocessableError, type QueueOperation } from './errors.js';
import { JOB, QUEUE_NAME, defaultJobOptions, jobDataSchemas, type JobDataByName, type JobName, type JobPolicy } from './jobs.js';
import type { Logger } from './logger.js';
import type { Metrics } from './metrics.js';
import { loadLua } from './lua.js';
import { withTimeout } from './timeout.js';
import { QUEUE_PREFIX_DEFAULT, queueKey, queuePrefix, restartedAtKey } from './keys.js';
import { createRedis, waitForReplicas } from './redis.js';
import { corked, settle, type Reply } from './redisBatch.js';

/**
 * The API's producer side of the "ops" queue. Its Redis connection uses the `request` profile
 * (no offline queue, one retry, command timeout), and every call is additionally bounded by
 * `timeoutMs`, so when Redis is down `enqueue` fails fast with a QueueUnavailableError (503 +
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

/** States GET /ops/jobs lists. */
export const LISTABLE_STATES = ['failed', 'completed', 'active', 'waiting', 'delayed'] as const;
export type ListableState = (typeof LISTABLE_STATES)[number];

export type RetryOutcome =
  | { outcome: 'retried'; job: JobView }
  | { outcome: 'not_found' }
  | { outcome: 'not_failed'; state: string }
  | { outcome: 'busy'; holder: string };

/** One job of an intake batch (src/domain/claim.ts): its id is chosen by the claim. */
export interface ClaimedJob {
  name: JobName;
  data: JobDataByName[JobName];
  jobId: string;
  /** BullMQ deduplication: while `ttlMs` lasts, an add with this id is a no-op answering the first job's id. */
  dedupId: string;
  ttlMs: number;
}

export interface ClaimedAddResult {
  /** Per job, in order: the id of the job that stands for it on the queue, or the error of its add. */
  ids: Array<string | Error>;
  /** The replies of the commands `then` sent, in order. */
  then: Reply[];
}

export interface OpsQueue {
  /**
   * Validates `data` against the job's schema (422 on failure), adds it, returns the job id.
   * With `jobId`, an add whose id exists is a no-op returning that id; with `deduplication`, an
   * add while the job holding that deduplication id is not finished returns that job's id.
   */
  enqueue<N extends JobName>(name: N, data: JobDataByName[N], opts?: Pick<JobsOptions, 'jobId' | 'deduplication'>): Promise<string>;
  /**
   * Adds every job in ONE Redis round trip (BullMQ's add script per job, as addBulk does),
   * followed in the same write by the commands `then` sends on the queue's connection (the
   * claim's "mark queued"; it returns their reply promises). The jobs' data must already be
   * validated against their schemas. A round trip that fails or times out throws 503.
   */
  addClaimed(
    jobs: readonly ClaimedJob[],
    then?: (client: Redis, dedupKey: (id: string) => string) => Array<Promise<unknown>>,
  ): Promise<ClaimedAddResult>;
  getJob(id: string): Promise<JobView | undefined>;
  /** One page of the jobs in a state, newest first (failed: the dead letters), and the state's total. */
  listJobs(state: ListableState, offset: number, limit: number): Promise<{ total: number; jobs: JobView[] }>;
  /**
   * Re-queues a failed (dead-lettered) job with a fresh attempt budget, atomically only if it is
   * still failed. A restart job also takes back its Deployment's coalescing slot (unless another
   * restart of that Deployment holds it: `busy`) and drops its recorded restartedAt, so the replay
   * restarts the Deployment again instead of re-applying the old value.
   */
  retryFailed(id: string): Promise<RetryOutcome>;
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

export { QueueUnavailableError } from './errors.js';

/** Longest failure reason shown (the worker's reasons are short; this bounds anything else). */
const MAX_REASON = 1000;

const iso = (ms: number | undefined | null): string | null =>
  typeof ms === 'number' && Number.isFinite(ms) && ms > 0 ? new Date(ms).toISOString() : null;

const RELEASE_IF_OURS = loadLua('release-if-ours');

function jobView(job: Job, state: string): JobView {
  return {
    id: String(job.id),
    name: job.name,
    state,
    attempts_made: job.attemptsMade,
    attempts_max: job.opts.attempts ?? 1,
    failed_reason: job.failedReason ? String(job.failedReason).slice(0, MAX_REASON) : null,
    progress: job.progress,
    created_at: iso(job.timestamp),
    processed_at: iso(job.processedOn),
    finished_at: iso(job.finishedOn),
  };
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

  const guard = async <T>(operation: QueueOperation, op: () => Promise<T>): Promise<T> => {
    // Fail fast while disconnected: BullMQ would otherwise wait for the connection to come back.
    if (connection.status !== 'ready') throw new QueueUnavailableError(operation);
    try {
      return await withTimeout(op(), timeoutMs, 'queue operation');
    } catch (err) {
      opts.logger?.warn('queue operation failed', { err });
      // A reply error is Redis refusing the command (nothing ran); anything else (our timeout, the
      // connection's command timeout, a closed connection) leaves the command's fate unknown.
      throw new QueueUnavailableError(operation, !(err instanceof ReplyError));
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
      const job = await guard('submit', () => bull.add(name, parsed.data, jobOpts));
      if (job.id === undefined) throw new QueueUnavailableError('submit');
      opts.metrics?.jobsEnqueued.inc({ name });
      return job.id;
    },

    async addClaimed(jobs, then) {
      // The data was validated by the domain before anything was recorded (src/domain/deploy.ts,
      // alerts.ts): validating it again here cost as much as the add's own work.
      const dedupKey = (id: string) => `${bull.keys.de}:${id}`;
      const replies = await guard('submit', async () => {
        const client = (await bull.backend.client) as unknown as Redis;
        // One write for every add and whatever `then` sends (src/shared/redisBatch.ts): as
        // Queue#addBulk's pipeline, without the cost of a Pipeline on this 64-script connection.
        const sent = corked(client, () => {
          const adds = jobs.map((j) => {
            const opts: JobsOptions = { ...bull.defaultJobOptions, jobId: j.jobId, deduplication: { id: j.dedupId, ttl: j.ttlMs } };
            return new Job(bull, j.name, j.data, opts, j.jobId).addJob(client as never);
          });
          return [...adds, ...(then?.(client, dedupKey) ?? [])];
        });
        return settle(sent);
      });
      const ids = jobs.map((j, i): string | Error => {
        const [err, id] = replies[i]!;
        if (err) return err;
        if (typeof id !== 'string' && typeof id !== 'number') return new Error(`unexpected add reply ${String(id)}`);
        if (String(id) === j.jobId) opts.metrics?.jobsEnqueued.inc({ name: j.name }); // else deduplicated: not a new job
        return String(id);
      });
      return { ids, then: replies.slice(jobs.length) };
    },

    async waitReplicas(numReplicas, timeoutMs) {
      if (connection.status !== 'ready') throw new QueueUnavailableError('submit', true);
      // Every key of the queue shares the prefix's hash tag: on a Cluster, one primary.
      return waitForReplicas(connection, numReplicas, timeoutMs, [queueKey(bull.opts.prefix ?? QUEUE_PREFIX_DEFAULT, QUEUE_NAME, 'id')]);
    },

    async remove(id) {
      if (connection.status !== 'ready') throw new QueueUnavailableError('submit', true);
      // Only a job no worker has taken yet is taken back: one that is active or already finished
      // was accepted for real (removing it would let a retry run the work twice).
      const state = await bull.getJobState(id);
      if (state === 'unknown') return true;
      if (!['waiting', 'delayed', 'prioritized', 'waiting-children'].includes(state)) return false;
      // BullMQ's removeJob script answers 0 when a worker locked the job in the meantime.
      return (await bull.remove(id)) === 1;
    },

    async getJob(id) {
      const job = await guard('read', () => bull.getJob(id));
      if (!job) return undefined;
      const state = await guard('read', () => job.getState());
      return jobView(job, state);
    },

    async listJobs(state, offset, limit) {
      const [jobs, total] = await guard('read', () =>
        Promise.all([bull.getJobs([state], offset, offset + limit - 1, false), bull.getJobCountByTypes(state)]),
      );
      return { total, jobs: jobs.filter((j): j is Job => Boolean(j)).map((j) => jobView(j, state)) };
    },

    async retryFailed(id) {
      // Nothing is changed before the deduplication slot is taken: a failure up to there is a read's.
      const job = await guard('read', () => bull.getJob(id));
      if (!job) return { outcome: 'not_found' };
      const state = await guard('read', () => job.getState());
      if (state !== 'failed') return { outcome: 'not_failed', state };
      const client = connection;
      const dedupId = job.name === JOB.restartService ? (job.deduplicationId ?? job.opts.deduplication?.id) : undefined;
      const dedupKey = dedupId ? `${bull.toKey('de')}:${dedupId}` : undefined;
      if (dedupKey) {
        const holder = await guard<string | null>('retry', () => client.set(dedupKey, String(job.id), 'NX', 'GET'));
        if (holder !== null && holder !== String(job.id)) return { outcome: 'busy', holder };
      }
      try {
        await guard('retry', () => job.retry('failed', { resetAttemptsMade: true, resetAttemptsStarted: true }));
      } catch (err) {
        // Not in the failed set any more (retried or removed concurrently): give the slot back.
        if (dedupKey) await client.eval(RELEASE_IF_OURS, 1, dedupKey, String(job.id)).catch(() => undefined);
        if (err instanceof QueueUnavailableError) {
          const now = await guard('read', () => job.getState());
          if (now !== 'failed') return { outcome: 'not_failed', state: now };
        }
        throw err;
      }
      if (job.name === JOB.restartService) await guard('retry', () => client.del(restartedAtKey(String(job.id))));
      return { outcome: 'retried', job: jobView(job, 'waiting') };
    },

    async close() {
      if (connection.status !== 'ready') {
        // Not connected: nothing is pending (no offline queue) and BullMQ's close would wait for
        // a connection that may never come back. Drop the connection and let BullMQ wind down.
        connection.disconnect();
        void bull.close().catch(() => undefined);
        return;
      }
      try {
        await bull.close();
      } finally {
        connection.disconnect();
      }
    },
  };
}
