import type { Redis } from 'ioredis';
import type { Written } from '../domain/replication.js';
import { redisCall } from '../domain/redisOps.js';
import { UnprocessableError, type AppError } from '../shared/errors.js';
import { IDEMPOTENCY_TTL_SECONDS } from '../shared/jobs.js';
import type { Logger } from '../shared/logger.js';
import { storedJson } from '../shared/redis.js';
import { refusalError, type ChangeResult } from './execute.js';
import { describeReasons } from './gate.js';

/**
 * The one renderer of what a change came to, for every way in that answers over HTTP: a refusal is
 * its catalog error (409 change_refused, 429 budget_exhausted), anything carried out a status and
 * the fields each way in picks its answer from. Remediation answers nobody: it reads the result.
 */
export interface ChangeBody {
  status: 'queued' | 'held' | 'ignored' | 'pending_approval';
  /** The job that carries the change (an earlier one for a duplicate), or the approval's id while it waits. */
  job_id: string;
  /** This request added the job or the approval. */
  accepted: boolean;
  /** The change was already queued (or its approval asked for) by an earlier request. */
  duplicate: boolean;
  /** The change joined a job, or an approval, of the same change. */
  coalesced: boolean;
  approval_id?: string;
  expires_at?: string;
  required?: number;
  held_until?: string;
  held_reasons?: string;
  ignored_reason?: string;
}

type ChangeAnswer =
  | { status: 200 | 202; body: ChangeBody; /** For REDIS_MIN_REPLICAS_ACK. */ written?: Written; error?: undefined }
  | { error: AppError; status?: undefined; body?: undefined };

/** `queued`: this way in's status of a change carried out (a restart's 200, a deploy's 202); waiting for approval is always 202. */
export function answerChange(result: ChangeResult, queued: 200 | 202): ChangeAnswer {
  if (result.refusal) return { error: refusalError(result.refusal) };
  const c = result.carried;
  if (c.approval) {
    const a = c.approval.approval;
    return {
      status: 202,
      body: {
        status: 'pending_approval',
        job_id: a.id,
        accepted: c.approval.created,
        duplicate: !c.approval.created,
        coalesced: c.approval.coalesced,
        approval_id: a.id,
        expires_at: new Date(a.expires_at).toISOString(),
        required: a.required,
      },
    };
  }
  const body: ChangeBody = {
    status: c.ignored ? 'ignored' : c.held ? 'held' : 'queued',
    job_id: c.jobId,
    accepted: !c.coalesced && !c.ignored,
    duplicate: c.coalesced,
    coalesced: c.coalesced,
    ...(c.held ? { held_until: new Date(c.held.until).toISOString(), held_reasons: describeReasons(c.held.reasons) } : {}),
    ...(c.ignored ? { ignored_reason: c.ignored.reason } : {}),
  };
  return { status: queued, body, ...(c.written ? { written: c.written } : {}) };
}

/** The answer's fields, or its error thrown (the way in's error handler renders it). */
export function answered(a: ChangeAnswer): { status: 200 | 202; body: ChangeBody; written?: Written } {
  if (a.error) throw a.error;
  return a;
}

/**
 * A way in's first answer, kept IDEMPOTENCY_TTL_SECONDS under its Idempotency-Key's record (no
 * key: nothing kept), so a repeat answers as the first call did; a stored answer for another
 * target is the key reused (422).
 */
export function idempotentAnswer<A extends { job_id: string }>(opts: {
  redis: Redis;
  logger: Logger;
  key: string | undefined;
  /** A stored answer is one of this way in's (its fields present). */
  valid: (a: A) => boolean;
  same: (a: A) => boolean;
  reused: () => UnprocessableError;
  warning: string;
}) {
  const { redis, key } = opts;
  const parse = (raw: string | null): A | undefined => {
    const v = storedJson<A>(raw);
    if (typeof v?.job_id !== 'string' || !opts.valid(v)) return undefined;
    if (!opts.same(v)) throw opts.reused();
    return v;
  };
  return {
    read: async (): Promise<A | undefined> => (key ? parse(await redisCall((r) => r.get(key), redis)) : undefined),
    /** Keeps the answer and returns it; a concurrent call's stored answer wins. */
    async keep(answer: A): Promise<A> {
      if (!key) return answer;
      try {
        // NX: a concurrent call with the same key may have stored first; then its answer wins.
        const set = await redis.set(key, JSON.stringify(answer), 'EX', IDEMPOTENCY_TTL_SECONDS, 'NX');
        if (set === null) return parse(await redis.get(key)) ?? answer;
      } catch (err) {
        if (err instanceof UnprocessableError) throw err;
        // The change is queued; answering 503 now would invite a retry, and a retry without the
        // record finds its job anyway (by its id, the same running restart, the event's deduplication).
        opts.logger.warn(opts.warning, { err });
      }
      return answer;
    },
  };
}
