import type { ConfirmChange, ConfirmReplicated, ConfirmRetryReplicated, Written } from '../domain/replication.js';
import { approvalKey } from '../shared/keys.js';

/**
 * Where every way in hands a change over: the audit line's fields first (kept when the WAIT fails,
 * so a 503 names the job), then REDIS_MIN_REPLICAS_ACK for what it wrote. The answer comes back
 * only through here, so no way in can skip the WAIT.
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

interface Hand<T> {
  submit: () => Promise<T>;
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

/** `sink`: where the request's audit line takes its fields from (`auditFields`: a route's `res.locals`). */
export async function handChange<T>(confirms: Confirms, sink: Record<string, unknown>, hand: Hand<T>): Promise<T> {
  const out = await hand.submit();
  const fields = hand.audit?.(out);
  if (fields) sink.auditFields = fields;
  await confirm(confirms, hand.handed(out));
  return out;
}
