import { createRequire } from 'node:module';
import { Job, Queue, type JobsOptions } from 'bullmq';
import { Packr } from 'msgpackr';
import { ReplyError, type Redis } from 'ioredis';
import { QueueUnavailableError, UnprocessableError, type QueueOperation } from './errors.js';
import { JOB, JOB_NAMES, QUEUE_NAME, defaultJobOptions, jobDataSchemas, type JobDataByName, type JobName, type JobPolicy } from './jobs.js';
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

/**
 * BullMQ's own script for adding a standard job (no delay, priority or parent), from the BullMQ
 * this process runs, so the intake's jobs are stored exactly as Queue#add stores them: a plain
 * BullMQ worker takes them and Bull Board shows them.
 */
const BULL_ADD_SCRIPT = (
  createRequire(import.meta.url)('bullmq/dist/cjs/scripts/addStandardJob-9.js') as {
    addStandardJob: { name: string; content: string; keys: number };
  }
).addStandardJob;

/**
 * That script as a Lua function `bull_add(KEYS, ARGV)` for a script of ours to call (its KEYS and
 * ARGV become the function's parameters): answers the job's id (an existing job's id when a job
 * with that id exists), or a negative BullMQ error code.
 */
const BULL_ADD_LUA = `local function bull_add(KEYS, ARGV)\n${BULL_ADD_SCRIPT.content}\nend`;

// BullMQ's msgpack settings for the add script's arguments (its redis-queue-backend).
const unpack = (b: Buffer): unknown => new Packr({ useRecords: false, encodeUndefinedAsNil: true }).unpack(b);
const TEMPLATE_ID = 'opsgate-template';
/** A Lua string literal of any bytes (decimal escapes). */
const luaString = (v: string | Buffer): string =>
  `"${Array.from(typeof v === 'string' ? Buffer.from(v) : v, (b) => `\\${String(b).padStart(3, '0')}`).join('')}"`;

export interface OpsQueue {
  /**
   * Validates `data` against the job's schema (422 on failure), adds it, returns the job id.
   * With `jobId`, an add whose id exists is a no-op returning that id; with `deduplication`, an
   * add while the job holding that deduplication id is not finished returns that job's id.
   */
  enqueue<N extends JobName>(name: N, data: JobDataByName[N], opts?: Pick<JobsOptions, 'jobId' | 'deduplication'>): Promise<string>;
  /**
   * The intake's job creation (src/domain/claim.ts), which adds jobs from inside its own claim
   * script so that a seen record and its job are written in one atomic step.
   * - `lua`: a Lua piece for that script (src/shared/lua/intake-events.lua): `bull_add(KEYS,
   *   ARGV)`, BullMQ's own add script as a function, and `bull_templates[name]`, per job name the
   *   packed argument list and packed options of BullMQ's own encoding of an add (Queue#add's,
   *   with the queue's default options), in which the script sets each job's id, timestamp and
   *   data; `bull_dedup_prefix`, the prefix of the queue's deduplication keys.
   * - `keys`: the add script's KEYS (the same for every job of the queue).
   * - `run`: issues commands on the queue's connection in one write (src/shared/redisBatch.ts)
   *   and settles their replies; 503 when the connection is down or the round trip takes longer
   *   than the queue's timeout.
   * - `counted`: counts jobs the intake added (opsgate_jobs_enqueued_total).
   */
  intake: {
    readonly lua: string;
    readonly keys: readonly string[];
    run(issue: (client: Redis) => Array<Promise<unknown>>): Promise<Reply[]>;
    counted(name: JobName): void;
  };
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

  // The add script's arguments as BullMQ builds them for Queue#add, caught on their way to Redis,
  // once per job name. Each intake job is that template with its own id, timestamp and data, set
  // by the intake script: a BullMQ Job built and packed per job cost about 50 us of the API's CPU
  // per request (`make bench-profile`), more than anything else on the duplicate path, where the
  // job is sent before the script knows it is a duplicate. The templates are constants of the
  // script's source (one EVAL per connection, then EVALSHA): nothing to decode per call.
  const encoded = (name: JobName): { keys: string[]; args: Buffer; options: Buffer } => {
    let captured: { name: string; args: unknown[] } | undefined;
    const capture = {
      runCommand(command: string, args: unknown[]) {
        captured = { name: command, args };
        return Promise.resolve(TEMPLATE_ID);
      },
    };
    void new Job(bull, name, {}, { ...bull.defaultJobOptions, jobId: TEMPLATE_ID }, TEMPLATE_ID).addJob(capture as never);
    const c = captured;
    // The intake's jobs have no delay, priority or parent: BullMQ adds them with its standard script.
    if (!c || !c.name.startsWith(`${BULL_ADD_SCRIPT.name}:`) || c.args.length !== BULL_ADD_SCRIPT.keys + 3) {
      throw new Error(`BullMQ encoded an intake job with ${c?.name ?? 'nothing'}, not ${BULL_ADD_SCRIPT.name}`);
    }
    const [args, options] = [c.args[BULL_ADD_SCRIPT.keys], c.args[BULL_ADD_SCRIPT.keys + 2]] as [Buffer, Buffer];
    const list = unpack(args) as unknown[];
    if (
      list[1] !== TEMPLATE_ID ||
      list[2] !== name ||
      typeof list[3] !== 'number' ||
      (unpack(options) as { jobId?: unknown }).jobId !== TEMPLATE_ID
    ) {
      throw new Error("BullMQ's add arguments are not laid out as src/shared/lua/intake-events.lua expects");
    }
    return { keys: c.args.slice(0, BULL_ADD_SCRIPT.keys) as string[], args, options };
  };
  let built: { lua: string; keys: string[] } | undefined;
  const build = () => {
    if (built) return built;
    const all = JOB_NAMES.map((name) => ({ name, ...encoded(name) }));
    const entries = all.map((t) => `  [${luaString(t.name)}] = { args = ${luaString(t.args)}, opts = ${luaString(t.options)} },`);
    built = {
      lua: [
        BULL_ADD_LUA,
        `local bull_templates = {\n${entries.join('\n')}\n}`,
        // BullMQ's deduplication key of an id: `<prefix>:<queue>:de:<id>`.
        `local bull_dedup_prefix = ${luaString(`${bull.keys.de}:`)}`,
      ].join('\n'),
      keys: all[0]!.keys,
    };
    return built;
  };

  const intake: OpsQueue['intake'] = {
    get lua() {
      return build().lua;
    },
    get keys() {
      return build().keys;
    },
    run: (issue) =>
      guard('submit', async () => {
        const client = (await bull.backend.client) as unknown as Redis;
        return settle(corked(client, () => issue(client)));
      }),
    counted: (name) => opts.metrics?.jobsEnqueued.inc({ name }),
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

    intake,

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
      // The state first, then the job's hash: a job ends (state and reason) in one BullMQ script,
      // so a hash read after a final state always carries that state's reason and times.
      const state = await guard('read', () => bull.getJobState(id));
      if (state === 'unknown') return undefined;
      const job = await guard('read', () => bull.getJob(id));
      if (!job) return undefined;
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
