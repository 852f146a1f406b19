import type { Job, Queue } from 'bullmq';
import { outcomeSchema, type Outcome } from './jobs.js';
import type { QueueGuard } from './queueGuard.js';

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
  /** How a restart or deploy ended (or why it is held), from the progress the worker wrote. */
  outcome?: Outcome;
}

function outcomeOf(progress: unknown): Outcome | undefined {
  if (typeof progress !== 'object' || progress === null || !('outcome' in progress)) return undefined;
  const parsed = outcomeSchema.safeParse(progress.outcome);
  return parsed.success ? parsed.data : undefined;
}

export const LISTABLE_STATES = ['failed', 'completed', 'active', 'waiting', 'delayed'] as const;
export type ListableState = (typeof LISTABLE_STATES)[number];

/** The read model of the queue's jobs (GET /ops/jobs, GET /ops/jobs/{id}, Bull Board's audit). */
export interface JobReads {
  get(id: string): Promise<JobView | undefined>;
  /** One page of the jobs in a state, newest first (failed: the dead letters), and the state's total. */
  list(state: ListableState, offset: number, limit: number): Promise<{ total: number; jobs: JobView[] }>;
  any(): Promise<boolean>;
}

/** Longest failure reason shown (the worker's reasons are short; this bounds anything else). */
const MAX_REASON = 1000;

const iso = (ms: number | undefined | null): string | null =>
  typeof ms === 'number' && Number.isFinite(ms) && ms > 0 ? new Date(ms).toISOString() : null;

export function jobView(job: Job, state: string): JobView {
  const outcome = outcomeOf(job.progress);
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
    ...(outcome ? { outcome } : {}),
  };
}

export function createJobReads(bull: Queue, guard: QueueGuard): JobReads {
  return {
    async get(id) {
      // The state first, then the job's hash: a job ends (state and reason) in one BullMQ script,
      // so a hash read after a final state always carries that state's reason and times.
      const state = await guard('read', () => bull.getJobState(id));
      if (state === 'unknown') return undefined;
      const job = await guard('read', () => bull.getJob(id));
      return job ? jobView(job, state) : undefined;
    },
    async list(state, offset, limit) {
      const [jobs, total] = await guard('read', () =>
        Promise.all([bull.getJobs([state], offset, offset + limit - 1, false), bull.getJobCountByTypes(state)]),
      );
      return { total, jobs: jobs.filter((j): j is Job => Boolean(j)).map((j) => jobView(j, state)) };
    },
    async any() {
      return (await guard('read', () => bull.getJobCountByTypes(...LISTABLE_STATES, 'prioritized', 'waiting-children'))) > 0;
    },
  };
}
