import { randomUUID } from 'node:crypto';
import type { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { QueueUnavailableError, UnprocessableError } from './errors.js';
import { QUEUE_NAME, isParsedJobData, jobSchemaOf, type JobDataByName, type JobName } from './jobs.js';
import { QUEUE_PREFIX_DEFAULT, queueKey } from './keys.js';
import type { Metrics } from './metrics.js';
import { waitForReplicas } from './redis.js';
import type { QueueGuard } from './queueGuard.js';

/**
 * The API's side of the "ops" queue, with BullMQ's own deduplication: one script sets the record and adds the job, or answers
 * the job holding it, so a record never exists without its job nor a job without its record, whatever fails around the call.
 */
export interface AddRequest<N extends JobName = JobName> {
  name: N;
  data: JobDataByName[N];
  /** Default: a new UUID. An existing job id adds nothing and answers that job. */
  jobId?: string;
  /** ttlMs: how long the record outlives its job; absent: until the job finishes. */
  deduplication?: { id: string; ttlMs?: number };
  /** A held job: processed no earlier than this many ms from now. */
  delay?: number;
  /** Options that differ from the queue's defaults (a dry run's single short-lived attempt). */
  jobOptions?: { attempts?: number; removeOnComplete?: { age: number }; removeOnFail?: { age: number } };
}

interface Added {
  /** The job that stands for the request: the new one, or the one that held its id or deduplication record. */
  jobId: string;
  /** false: nothing was added (a job with that id or deduplication record existed). */
  added: boolean;
}

export interface Producer {
  /** Validates the data against its job's schema (422), then adds it. 503 when Redis is unavailable. */
  add<N extends JobName>(req: AddRequest<N>): Promise<Added>;
  /** Several adds in one round trip, answers in order. */
  addMany(reqs: readonly AddRequest[]): Promise<Added[]>;
  /** Takes back a job no worker has taken yet, with its deduplication record; false: active or finished, it stays. */
  remove(id: string): Promise<boolean>;
  /** WAIT on the queue's connection: how many replicas acknowledged every job added so far. */
  waitReplicas(numReplicas: number, timeoutMs: number): Promise<number>;
  /** Runs a delayed (held) job as soon as a worker is free; false: it is not delayed. */
  promote(id: string): Promise<boolean>;
  /** The job holding a deduplication id (a restart coalesced on its Deployment), or null. */
  deduplicationHolder(dedupId: string): Promise<string | null>;
  /** When the job was added (ms): a deploy's acceptance; undefined when it is gone. */
  acceptedAt(id: string): Promise<number | undefined>;
}

interface ProducerDeps {
  bull: Queue;
  /** The connection the Queue was given (so WAIT covers its writes). */
  connection: Redis;
  guard: QueueGuard;
  metrics?: Pick<Metrics, 'jobsEnqueued'>;
}

function validated<N extends JobName>(req: AddRequest<N>): JobDataByName[N] {
  // Parsed already by its caller (parseJobData): the same schema would answer the same.
  if (isParsedJobData(req.data)) return req.data;
  const schema = jobSchemaOf(req.name);
  if (!schema) throw new UnprocessableError(`unknown job ${JSON.stringify(req.name).slice(0, 100)}`, 'invalid_job_data');
  const parsed = schema.safeParse(req.data);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw new UnprocessableError(`invalid ${issue.path.join('.') || 'job data'}: ${issue.message}`, 'invalid_job_data');
  }
  return parsed.data as JobDataByName[N];
}

function options(req: AddRequest, jobId: string) {
  const d = req.deduplication;
  return {
    jobId,
    ...(d ? { deduplication: d.ttlMs !== undefined ? { id: d.id, ttl: d.ttlMs } : { id: d.id } } : {}),
    ...(req.delay !== undefined && req.delay > 0 ? { delay: Math.ceil(req.delay) } : {}),
    ...(req.jobOptions ?? {}),
  };
}

export function createProducer(deps: ProducerDeps): Producer {
  const { bull, connection, guard } = deps;
  const counted = (name: JobName, out: Added): Added => {
    if (out.added) deps.metrics?.jobsEnqueued.inc({ name });
    return out;
  };
  return {
    async add(req) {
      const data = validated(req);
      const jobId = req.jobId ?? randomUUID();
      const job = await guard('submit', () => bull.add(req.name, data, options(req, jobId)));
      if (job.id === undefined) throw new QueueUnavailableError('submit', true);
      return counted(req.name, { jobId: job.id, added: job.id === jobId });
    },
    async addMany(reqs) {
      if (reqs.length === 0) return [];
      const ids = reqs.map((r) => r.jobId ?? randomUUID());
      const jobs = reqs.map((r, i) => ({ name: r.name, data: validated(r), opts: options(r, ids[i]!) }));
      const added = await guard('submit', () => bull.addBulk(jobs));
      return added.map((job, i) => {
        if (job.id === undefined) throw new QueueUnavailableError('submit', true);
        return counted(reqs[i]!.name, { jobId: job.id, added: job.id === ids[i] });
      });
    },
    async remove(id) {
      if (connection.status !== 'ready') throw new QueueUnavailableError('submit', true);
      // An active or finished job was accepted for real: removing it would let a retry run the work twice.
      const state = await bull.getJobState(id);
      if (state === 'unknown') return true;
      if (!['waiting', 'delayed', 'prioritized', 'waiting-children'].includes(state)) return false;
      // 0 when a worker locked the job in the meantime; the deduplication record goes with the job.
      return (await bull.remove(id)) === 1;
    },
    async waitReplicas(numReplicas, timeoutMs) {
      if (connection.status !== 'ready') throw new QueueUnavailableError('submit', true);
      // Every key of the queue shares the prefix's hash tag: on a Cluster, one primary.
      return waitForReplicas(connection, numReplicas, timeoutMs, [queueKey(bull.opts.prefix ?? QUEUE_PREFIX_DEFAULT, QUEUE_NAME, 'id')]);
    },
    async promote(id) {
      const job = await guard('retry', () => bull.getJob(id));
      if (!job || (await guard('read', () => job.getState())) !== 'delayed') return false;
      try {
        await guard('retry', () => job.promote());
        return true;
      } catch {
        // Promoted or started by another caller meanwhile, or Redis is unavailable (the read answers 503).
        return (await guard('read', () => job.getState())) !== 'delayed';
      }
    },
    async deduplicationHolder(dedupId) {
      return guard('read', () => bull.getDeduplicationJobId(dedupId));
    },
    async acceptedAt(id) {
      return (await guard('read', () => bull.getJob(id)))?.timestamp;
    },
  };
}
