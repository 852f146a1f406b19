import type { Written } from '../domain/replication.js';
import type { AppError } from '../shared/errors.js';
import { refusalError, type ChangeResult } from './execute.js';
import { describeReasons } from './gate.js';

/**
 * The one renderer of what a change came to, for every way in that answers over HTTP (the restart
 * API, CI deploys, every push sender and a delivery's replay, a dead letter's retry, the last
 * approval): a refusal is its catalog error (409 change_refused, 429 budget_exhausted), anything
 * carried out is a status and the fields each way in's answer is made of, in the API's words. A way
 * in picks the fields its contract names (a restart's `coalesced`, a push's `accepted`/`duplicate`)
 * and adds what names its target; it does not read the pipeline's result itself. Remediation is no
 * way in over HTTP: it reads the result.
 */

/** The fields of a carried change's answer. */
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
  /** Ignored: why nothing was queued. */
  ignored_reason?: string;
}

type ChangeAnswer =
  | { status: 200 | 202; body: ChangeBody; /** What was written, for REDIS_MIN_REPLICAS_ACK. */ written?: Written; error?: undefined }
  | { error: AppError; status?: undefined; body?: undefined };

/**
 * `queued`: the status of a change carried out (queued, joined, held, ignored) on this way in: a
 * restart's 200, a deploy's 202. A change that waits for approval is always 202.
 */
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
