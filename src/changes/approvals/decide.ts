import { ConflictError, ForbiddenError, NotFoundError, UnprocessableError } from '../../shared/errors.js';
import { recordDeployStep } from '../deployOrder/record.js';
import { redisCall } from '../../domain/redisOps.js';
import { answerChange, answered, type ChangeBody } from '../answer.js';
import { gateRefusal, reportOf, supersededRefusal, type ApprovedBy } from '../execute.js';
import { queueReport, type Pipeline } from '../deps.js';
import { planChange, submitChange, type OverrideAsk } from '../pipeline.js';
import { kindOfApproval } from '../kinds/index.js';
import type { Change, Principal } from '../types.js';
import { effectiveStatus, type Approval } from './store.js';
import { approvalView, type DecisionAnswer } from './view.js';

/**
 * Four-eyes decisions. The script compares owners, not credentials: nobody of the requester's owner approves, and
 * one owner approves once whatever keys they hold. So that an approval never reads approved without its job, the
 * last approval runs: 1. the plan (a closed gate refuses before anything is recorded); 2. the script marks the
 * record `approving` (one racer gets there); 3. the pipeline carries the change out under the approval's id;
 * 4. the record is marked approved. A failure in 3 stays as `last_error`, read as pending: the next approve call,
 * or the expiry (worker/jobs/report.ts), finishes it or gives its budget place back.
 */
/** Approving without an error this long after the last approval: abandoned (its API died), the next call finishes it. */
const APPROVING_GRACE_MS = 30_000;

function refuseRacer(a: Approval, id: string, now: number): void {
  if (a.last_error === undefined && now - (a.approving_at ?? 0) < APPROVING_GRACE_MS) {
    throw new ConflictError(`approval ${id} is already approved; its change is being carried out by another call`, 'approval_decided');
  }
}

interface DecisionRequest {
  id: string;
  action: 'approve' | 'reject';
  by: Principal;
  reason: string;
  override?: boolean;
  auditId: string;
}

/** The change an approval stands for, as the pipeline takes it (origin `approval`, job id = approval id). */
export function changeOfApproval(a: Approval): Change {
  const { target, override } = kindOfApproval(a.change).fromApproval(a.change);
  return {
    target,
    requester: {
      principal: a.requester,
      credential: a.requester_credential,
      owner: a.requester_owner || a.requester,
      ownerKnown: a.requester_owner_known ?? true,
      ...(a.requester_person ? { person: a.requester_person } : {}),
    },
    ...(a.reason ? { reason: a.reason } : {}),
    ...(override ? { override } : {}),
    origin: 'approval',
    auditId: a.audit_id,
    jobId: a.id,
    // Accepted when it was asked for: its place in its group's order (src/changes/deployOrder/).
    accepted: { at: a.created_at, id: a.id },
  };
}

const selfApproval = (owner: string) =>
  new ForbiddenError(
    `the requester cannot approve their own change: the credential belongs to ${owner}, who asked for it (four eyes: another person must approve it)`,
    'self_approval',
  );

/** Whether an approver is the requester as four eyes sees it: the requester's owner, or the person behind its OIDC token. */
const isRequester = (a: Approval, by: Principal): boolean =>
  by.owner === (a.requester_owner || a.requester) || (!!a.requester_person && by.owner === a.requester_person);

function answer(a: Approval, now: number, extra: Partial<DecisionAnswer> = {}): DecisionAnswer {
  const status = effectiveStatus(a, now);
  return {
    status,
    approval: approvalView(a, now),
    job_id: null,
    coalesced: false,
    held_until: null,
    approvals_needed: status === 'pending' ? Math.max(0, a.required - a.approvers.length) : 0,
    ...extra,
  };
}

/** opsgate's own closing of an approval (finish, fail, abandon, supersede); a person's decision is decideApproval. */
const closeApproval = (g: Pipeline, id: string, action: 'finish' | 'fail' | 'supersede', detail: string, coalesced = false) =>
  redisCall(
    () => g.approvals.decide(id, { action, by: 'opsgate', owner: 'opsgate', credential: '', reason: detail, now: g.now(), coalesced }),
    g.redis,
  );

/** Carries out an approving approval's change and marks it approved with its job; a failure stays as its last error. */
async function finishApproval(g: Pipeline, a: Approval, ask?: OverrideAsk): Promise<{ approval: Approval; carried: ChangeBody }> {
  const approved: ApprovedBy = { approvalId: a.id, approvers: a.approvers.map((x) => x.by) };
  let carried: ChangeBody;
  try {
    carried = answered(answerChange(await submitChange(g, changeOfApproval(a), ask, approved), 200)).body;
  } catch (err) {
    const message = err instanceof Error ? err.message : String(err);
    await closeApproval(g, a.id, 'fail', message.slice(0, 1000)).catch(() => undefined);
    throw err;
  }
  const done = await closeApproval(g, a.id, 'finish', carried.job_id, carried.coalesced);
  g.metrics?.approvals.inc({ change: a.change.kind, event: 'approved' });
  return { approval: done.approval ?? a, carried };
}

/**
 * One operator's decision. 404 unknown; 403 the requester's owner; 409 decided, expired, approved twice by one owner,
 * or (the last approval) refused by the gate unless `override`; 429 the budget is spent (the approval stays).
 */
export async function decideApproval(g: Pipeline, req: DecisionRequest): Promise<DecisionAnswer> {
  const now = g.now();
  const current = await redisCall(() => g.approvals.get(req.id), g.redis);
  if (!current) throw new NotFoundError('approval not found', 'approval_not_found');
  const kind = current.change.kind;
  const ask: OverrideAsk | undefined = req.override ? { reason: req.reason, by: req.by } : undefined;

  const last =
    req.action === 'approve' &&
    !isRequester(current, req.by) &&
    (current.status === 'approving' || (effectiveStatus(current, now) === 'pending' && current.approvers.length + 1 >= current.required));
  if (last) {
    // The last approval lets the change through now: a closed gate refuses it before anything is recorded.
    const p = await planChange(g, changeOfApproval(current), ask);
    if (p.decision.kind === 'refuse') answered(answerChange({ refusal: gateRefusal(g, p.change, p.decision.reasons) }, 200));
    // A newer deploy of its group started meanwhile: the approval ends superseded, nothing runs.
    if (p.decision.kind === 'superseded') {
      await closeApproval(g, req.id, 'supersede', p.decision.by);
      g.metrics?.approvals.inc({ change: kind, event: 'superseded' });
      answered(answerChange({ refusal: supersededRefusal(p.change, p.decision.by) }, 200));
    }
  }

  let a = current;
  if (current.status !== 'approving') {
    const { principal: by, owner, credential } = req.by;
    const d = await redisCall(
      () => g.approvals.decide(req.id, { action: req.action, by, owner, credential, reason: req.reason, now }),
      g.redis,
    );
    a = d.approval ?? current;
    switch (d.verdict) {
      case 'not_found':
        throw new NotFoundError('approval not found', 'approval_not_found');
      case 'decided':
        throw new ConflictError(
          a.status === 'approved'
            ? `approval ${req.id} is already approved (job ${a.job_id ?? a.id})`
            : `approval ${req.id} is already ${a.status}`,
          'approval_decided',
        );
      case 'expired':
        g.metrics?.approvals.inc({ change: kind, event: 'expired' });
        throw new ConflictError(
          `approval ${req.id} expired at ${new Date(a.expires_at).toISOString()}; ask for the change again`,
          'approval_expired',
        );
      case 'pending':
      case 'failed':
        throw new UnprocessableError('nothing to decide', 'nothing_to_decide');
      case 'self':
        g.metrics?.approvals.inc({ change: kind, event: 'refused_self' });
        throw selfApproval(isRequester(current, req.by) ? req.by.owner : current.requester_owner || current.requester);
      case 'again':
        throw new ConflictError(
          `you already approved ${req.id} (as ${req.by.owner}); it needs ${a.required - a.approvers.length} more approval(s) from other people`,
          'duplicate_approval',
        );
      case 'recorded':
        g.metrics?.approvals.inc({ change: kind, event: 'recorded' });
        return answer(a, now);
      case 'rejected': {
        g.metrics?.approvals.inc({ change: kind, event: 'rejected' });
        const change = changeOfApproval(a);
        await recordDeployStep(g, { ...change, origin: a.origin }, a.id, 'rejected', now);
        await queueReport(g, `report.${a.id}.rejected`, {
          event: 'approval_rejected',
          ...reportOf(change, a.id, { approvalId: a.id, approvers: a.approvers.map((x) => x.by) }),
          approval_id: a.id,
          outcome: { result: 'rejected', reason: `${req.by.principal}: ${req.reason}` },
        });
        return answer(a, now);
      }
      case 'approving':
        // Another call gave the last approval a moment ago and is carrying it out: this one is a racer.
        if (!(a.approvers.at(-1)?.owner === req.by.owner && a.approving_at === now)) refuseRacer(a, req.id, now);
        break;
      case 'approved':
        break;
    }
  } else if (req.action === 'reject') {
    throw new ConflictError(`approval ${req.id} is already approved; its change is being carried out`, 'approval_decided');
  } else if (isRequester(current, req.by)) {
    g.metrics?.approvals.inc({ change: kind, event: 'refused_self' });
    throw selfApproval(req.by.owner);
  } else {
    refuseRacer(current, req.id, now);
  }

  const { approval, carried } = await finishApproval(g, a, ask);
  return answer(approval, g.now(), {
    job_id: carried.job_id,
    coalesced: carried.coalesced,
    held_until: carried.held_until ?? null,
  });
}
