import type { IntakeResult } from '../domain/intake.js';
import { answerChange, answered } from './answer.js';
import type { Handed } from './hand.js';
import { projectNamespace, type Pipeline } from './deps.js';
import { submitChange } from './pipeline.js';
import type { Acceptance } from './deployOrder/store.js';
import type { Change, Origin, Principal } from './types.js';

/** A push to the deploy branch (origin `webhook`) or an operator's replay of one (`replay`), through the pipeline. */
interface PushRequest {
  source: string;
  project: string;
  ref: string;
  sha: string;
  eventId: string;
  auditId: string;
  requester: Principal;
  /** The sender's own delivery id: remembered 30 days, so its replay is a duplicate after the event's 24 h. */
  deliveryId?: string;
  reason?: string;
  origin: Extract<Origin, 'webhook' | 'replay'>;
  /** A signed sender's commit before the push (its replay guard). */
  before?: string;
  /** A replay: when the delivery it replays was accepted, and its job (its place in its group's order). */
  accepted?: Acceptance;
}

export function pushChange(g: Pick<Pipeline, 'inventory'>, req: PushRequest): Change {
  return {
    target: {
      kind: 'deploy',
      project: req.project,
      ref: req.ref,
      sha: req.sha,
      namespace: projectNamespace(g.inventory, req.project),
      eventId: req.eventId,
      source: req.source,
      ...(req.deliveryId ? { deliveryId: req.deliveryId } : {}),
      ...(req.before !== undefined ? { before: req.before } : {}),
    },
    requester: req.requester,
    ...(req.reason ? { reason: req.reason } : {}),
    origin: req.origin,
    auditId: req.auditId,
    ...(req.accepted ? { accepted: req.accepted } : {}),
  };
}

/** What a push wrote: its approval's record, or its job (none for a duplicate). */
export const pushHanded = (out: IntakeResult): Handed =>
  out.approval
    ? { wrote: 'approval', approvalId: out.approval.id, event: 'requested' }
    : { wrote: 'job', ...(out.written ? { written: out.written } : {}) };

export async function submitPush(g: Pipeline, req: PushRequest): Promise<IntakeResult> {
  const { body: b, written } = answered(answerChange(await submitChange(g, pushChange(g, req)), 202));
  if (b.status === 'ignored') return { accepted: false, duplicate: false, jobId: b.job_id, ignored: { reason: b.ignored_reason! } };
  return {
    accepted: b.accepted,
    duplicate: b.duplicate,
    jobId: b.job_id,
    ...(b.status === 'pending_approval' ? { approval: { id: b.approval_id!, expires_at: b.expires_at!, required: b.required! } } : {}),
    ...(written ? { written } : {}),
    ...(b.status === 'held' ? { held: { until: b.held_until!, reasons: b.held_reasons! } } : {}),
  };
}
