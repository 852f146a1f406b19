import type { ConfirmChange, ConfirmReplicated, ConfirmRetryReplicated, Written } from '../domain/replication.js';
import { approvalKey } from '../shared/keys.js';

/**
 * Where a way in hands a change to the pipeline (the restart API, CI deploys, a push, a delivery's
 * replay, a dead letter's retry, an approval given): the one place that applies what an answer
 * about a change owes beyond the pipeline. In this order: the audit line's fields (kept even when
 * the WAIT below fails, so a 503 names the job), then REDIS_MIN_REPLICAS_ACK for what the change
 * wrote (src/domain/replication.ts). Scope is the pipeline's (`checkScope`, src/changes/pipeline.ts).
 * A way in says what it wrote; it cannot skip the WAIT, since the answer comes back only through
 * here. No Express in it: the audit fields go to a plain record (a route's `res.locals`).
 */

/** What handing the change over wrote, for REDIS_MIN_REPLICAS_ACK. */
export type Handed =
  /** A job (with its records), taken back when not acknowledged; none when it joined another job. */
  | { wrote: 'job'; written?: Written }
  /** An approval's record: a change of the guards' state, nothing taken back. */
  | { wrote: 'approval'; approvalId: string; event: 'requested' | 'approved' }
  /** A dead letter moved back to waiting: on the queue's connection, nothing taken back. */
  | { wrote: 'retry' }
  /** Nothing of its own to confirm (a repeat's stored answer is confirmed as the job it names). */
  | { wrote: 'nothing' };

/** The REDIS_MIN_REPLICAS_ACK gates of the app (absent = off). */
export interface Confirms {
  replicated?: ConfirmReplicated;
  changed?: ConfirmChange;
  retryReplicated?: ConfirmRetryReplicated;
}

/** Where the request's audit line takes its fields from (`auditFields`). */
type AuditSink = Record<string, unknown>;

interface Hand<T> {
  /** The change handed to the pipeline (its way in's submit). */
  submit: () => Promise<T>;
  /** What it wrote. */
  handed: (out: T) => Handed;
  /** The audit line's fields; absent or undefined: the route sets them itself, after the WAIT. */
  audit?: (out: T) => Record<string, unknown> | undefined;
}

async function confirm(c: Confirms, h: Handed): Promise<void> {
  switch (h.wrote) {
    case 'job':
      return c.replicated?.(h.written ? [h.written] : []);
    case 'approval':
      return c.changed?.(`approval ${h.approvalId} ${h.event}`, [approvalKey(h.approvalId)]);
    case 'retry':
      return c.retryReplicated?.();
    case 'nothing':
      return;
  }
}

export async function handChange<T>(confirms: Confirms, sink: AuditSink, hand: Hand<T>): Promise<T> {
  const out = await hand.submit();
  const fields = hand.audit?.(out);
  if (fields) sink.auditFields = fields;
  await confirm(confirms, hand.handed(out));
  return out;
}
