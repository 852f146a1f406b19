import type { IntakeResult } from '../domain/intake.js';
import { describeReasons } from './gate.js';
import { projectNamespace, type Guards } from './guards.js';
import { carriedOrRefused, submitChange } from './pipeline.js';
import type { Change, Origin, Principal } from './types.js';

/**
 * A push to the deploy branch, from a sender (origin `webhook`) or an operator's replay of a
 * recorded delivery (origin `replay`): one run_deploy_pipeline job per event id within 24 h (and,
 * from a signed sender without a timestamp, one per commit pair a delivery brings in 30 days; a
 * replay may deploy it again), through
 * the pipeline: a project whose policy asks for approval gets a pending approval instead of a job
 * (the same event again joins it); a deploy covered by a freeze or outside its windows is queued
 * held, a BullMQ delayed job due when the gate opens, with the reasons recorded and reported.
 */
export interface PushRequest {
  source: string;
  project: string;
  ref: string;
  sha: string;
  eventId: string;
  auditId: string;
  requester: Principal;
  /** The sender's own delivery id: remembered 30 days, so its replay is a duplicate after the event's 24 h. */
  deliveryId?: string;
  /** A replay's reason. */
  reason?: string;
  origin: Extract<Origin, 'webhook' | 'replay'>;
  /** A signed sender's commit before the push (its replay guard). */
  before?: string;
}

export function pushChange(g: Pick<Guards, 'inventory'>, req: PushRequest): Change {
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
    dryRun: false,
    origin: req.origin,
    auditId: req.auditId,
  };
}

export async function submitPush(g: Guards, req: PushRequest): Promise<IntakeResult> {
  const carried = carriedOrRefused(await submitChange(g, pushChange(g, req)));
  if (carried.approval) {
    const a = carried.approval.approval;
    return {
      accepted: carried.approval.created,
      duplicate: !carried.approval.created,
      jobId: a.id,
      approval: { id: a.id, expires_at: new Date(a.expires_at).toISOString(), required: a.required },
    };
  }
  if (carried.ignored) return { accepted: false, duplicate: false, jobId: carried.jobId, ignored: carried.ignored };
  return {
    accepted: !carried.coalesced,
    duplicate: carried.coalesced,
    jobId: carried.jobId,
    ...(carried.written ? { written: carried.written } : {}),
    ...(carried.held
      ? { held: { until: new Date(carried.held.until).toISOString(), reasons: describeReasons(carried.held.reasons) } }
      : {}),
  };
}
