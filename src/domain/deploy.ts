import { randomUUID } from 'node:crypto';
import { UnprocessableError } from '../shared/errors.js';
import { describeReasons } from '../shared/gate.js';
import { projectPolicy } from '../shared/inventory.js';
import { JOB, parseJobData } from '../shared/jobs.js';
import type { PushSource } from '../sources/index.js';
import { requestApproval } from './approvals.js';
import { deployGate, projectNamespace, recordHold, reportHold, type Guards } from './guards.js';
import type { Intake, Outcome } from './intake.js';

/**
 * Push webhooks, whatever their sender (src/sources): decide from the event header and the
 * payload whether a push deploys, then one run_deploy_pipeline job per event (src/domain/intake.ts).
 * Plain values in, plain values out: no HTTP here.
 */
export const DEPLOY_REF = 'refs/heads/main';
/** A delivery id longer than this, or with control characters, is refused (422). */
export const MAX_DELIVERY_ID = 128;

/** The delivery id header, checked; undefined when absent or empty. */
export function deliveryIdOf(value: string | undefined, header: string): string | undefined {
  if (value === undefined || value === '') return undefined;
  if (value.length > MAX_DELIVERY_ID || !/^[\x21-\x7e]+$/.test(value)) {
    throw new UnprocessableError(`${header} must be at most ${MAX_DELIVERY_ID} printable characters`);
  }
  return value;
}

/** Why a push is ignored: another event, another branch, or the sender's own reason (a deletion). */
export type IgnoredCode = 'not_a_push' | 'not_deploy_branch' | 'ignored';

export type PushDecision =
  | { kind: 'ignored'; code: IgnoredCode; reason: string }
  /** `before`: a `replayGuard` sender's commit before the push (src/sources/types.ts). */
  | { kind: 'deploy'; project: string; ref: string; sha: string; eventId: string; before?: string };

/** `<prefix>:<project>:<ref>:<sha>`: the contract's `scm:` form, one prefix per sender system. */
export function pushEventId(prefix: string, project: string, ref: string, sha: string): string {
  return `${prefix}:${project}:${ref}:${sha}`;
}

/** Quotes a caller-supplied value for a reason text, bounded in length. */
const quote = (s: string): string => JSON.stringify(s.length > 200 ? s.slice(0, 200) + '…' : s);

/**
 * The push rules, in the contract's order, on a verified and parsed payload: an event header that
 * is not the sender's push -> ignored; a ref other than the deploy branch -> ignored naming the
 * ref; a branch deletion -> ignored; no pushed commit -> 422. Then the event id.
 */
export function decidePush(source: PushSource, eventHeader: string | undefined, payload: unknown, deployRef = DEPLOY_REF): PushDecision {
  const { header, push } = source.event;
  if (eventHeader !== push) {
    return {
      kind: 'ignored',
      code: 'not_a_push',
      reason: `event ${quote(eventHeader ?? '')} is not a push (${header} must be ${JSON.stringify(push)})`,
    };
  }
  const mapped = source.map(payload, deployRef);
  if (mapped.kind === 'ignored') return { kind: 'ignored', code: 'ignored', reason: mapped.reason };
  const { ref, sha, deleted } = mapped.fields;
  if (ref !== deployRef) return { kind: 'ignored', code: 'not_deploy_branch', reason: `ref ${quote(ref)} is not ${deployRef}` };
  if (deleted) return { kind: 'ignored', code: 'ignored', reason: `ref ${quote(ref)} was deleted` };
  if (sha === undefined || sha === null || sha === '') throw new UnprocessableError(`${source.commitField} is required`);
  if (typeof sha !== 'string') throw new UnprocessableError(`${source.commitField} must be a string`);
  if (mapped.fields.project.length > 255) throw new UnprocessableError('project is longer than 255 characters');
  const project = mapped.fields.project === '' ? 'unknown' : mapped.fields.project;
  const before = source.replayGuard ? { before: mapped.fields.before ?? '' } : {};
  return { kind: 'deploy', project, ref, sha, eventId: pushEventId(source.eventPrefix, project, ref, sha), ...before };
}

export interface PushRequest {
  source: string;
  decision: Extract<PushDecision, { kind: 'deploy' }>;
  auditId: string;
  requestedBy: string;
  /** The sender's own delivery id: remembered 30 days, so its replay is a duplicate after the event's 24 h. */
  deliveryId?: string;
  /** The credential id of the requester (a replay's operator key), for four eyes. */
  credential?: string;
  /** A replay's reason. */
  reason?: string;
  /** An operator's replay: deploys a push the intake's commit-pair rule ignores (src/domain/intake.ts). */
  allowRedeploy?: boolean;
}

/**
 * A push to the deploy branch: one run_deploy_pipeline job per event id within 24 h. The job's
 * data is validated before anything is recorded, so a payload that would be refused never marks
 * the event seen.
 *
 * With guards (the project's policy in the inventory, the freezes): a project whose policy asks
 * for approval gets a pending approval instead of a job (the same event again joins it); a deploy
 * covered by a freeze or outside its windows is queued held, a BullMQ delayed job due when the
 * gate opens, with the reasons recorded (src/shared/holds.ts) and reported.
 */
export async function submitPush(intake: Pick<Intake, 'push'>, req: PushRequest, guards?: Guards): Promise<Outcome> {
  const d = req.decision;
  const parsed = parseJobData(JOB.runDeployPipeline, {
    project: d.project,
    ref: d.ref,
    sha: d.sha,
    ...(req.deliveryId ? { delivery_id: req.deliveryId } : {}),
    event_id: d.eventId,
    audit_id: req.auditId,
    requested_by: req.requestedBy,
  });
  if (!parsed.success) throw new UnprocessableError(`invalid ${parsed.error.issues[0]!.path.join('.')}`);
  const event = {
    source: req.source,
    eventId: d.eventId,
    ...(req.deliveryId ? { deliveryId: req.deliveryId } : {}),
    ...(d.before !== undefined ? { before: d.before } : {}),
    ...(req.allowRedeploy ? { allowRedeploy: true } : {}),
    data: parsed.data,
  };
  if (!guards) return intake.push(event);
  const g = guards;
  const now = g.now();
  const policy = projectPolicy(g.inventory, d.project);

  if (policy.approval) {
    // Already let through (approved before, or queued before the policy): a duplicate of that job.
    const holder = await g.producer.deduplicationHolder(d.eventId);
    if (holder !== null) return { accepted: false, duplicate: true, jobId: holder };
    const pending = await requestApproval(g, {
      change: {
        kind: 'deploy',
        project: d.project,
        ref: d.ref,
        namespace: projectNamespace(g.inventory, d.project),
        sha: d.sha,
        event_id: d.eventId,
        ...(req.deliveryId ? { delivery_id: req.deliveryId } : {}),
      },
      identity: `deploy:${d.eventId}`,
      requester: req.requestedBy,
      requesterCredential: req.credential ?? '',
      ...(req.reason ? { reason: req.reason } : {}),
      auditId: req.auditId,
      policy: policy.approval,
    });
    return {
      accepted: pending.created,
      duplicate: !pending.created,
      jobId: pending.approval_id,
      approval: { id: pending.approval_id, expires_at: pending.expires_at, required: pending.required },
    };
  }

  const verdict = await deployGate(g, d.project, now);
  if (!verdict.blocked) return intake.push(event);
  const jobId = randomUUID();
  const { delayMs, hold } = await recordHold(g, jobId, parsed.data, verdict, now);
  const out = await intake.push({ ...event, jobId, delayMs });
  if (out.accepted && out.jobId === jobId) {
    await reportHold(g, hold, parsed.data);
    return { ...out, held: { until: new Date(hold.until).toISOString(), reasons: describeReasons(verdict.reasons) } };
  }
  await g.holds.remove(jobId).catch(() => undefined);
  return out;
}
