import { z } from 'zod';
import { APPROVAL_STATES, approvalIdFor, effectiveStatus, newApprovalId, type Approval, type ApprovalChange } from '../shared/approvals.js';
import { ConflictError, ForbiddenError, NotFoundError, UnprocessableError } from '../shared/errors.js';
import { describeReasons } from '../shared/gate.js';
import { namespaceBudget } from '../shared/inventory.js';
import { JOB, type RestartServiceData, type RunDeployPipelineData } from '../shared/jobs.js';
import type { ApprovalPolicy } from '../shared/policy.js';
import { SEEN_EVENT_TTL_SECONDS } from './intake.js';
import { budgetError, coalesceId, deployGate, queueReport, recordHold, reportHold, restartGate, type Guards } from './guards.js';
import { redisCall } from './redisOps.js';

/**
 * Four-eyes approval of guarded changes. A restart or deploy whose policy asks for approval is
 * not queued: it becomes a pending approval (202 {status: "pending_approval", approval_id,
 * expires_at}), the on-call channel is told how to approve it, and an expiry report is queued for
 * its expiry. Operators other than the requester approve or reject it with a reason; the decision
 * is one Redis script (src/shared/lua/approval-decide.lua), so of two operators racing to give the
 * last approval exactly one sees 'approved', and only that one queues the change, under the job id
 * that is the approval id (a repeat of the add adds nothing).
 *
 * A second request for the same change (the same Deployment, the same push event) while one is
 * pending joins it (`coalesced: true`).
 */
const iso = (ms: number | undefined) => (ms === undefined ? null : new Date(ms).toISOString());

export const approvalViewSchema = z.object({
  id: z.string().describe('also the id of the job it lets through (GET /ops/jobs/{id})'),
  status: z.enum(APPROVAL_STATES),
  change: z.enum(['restart', 'deploy']),
  host: z.string().nullable(),
  service: z.string().nullable(),
  project: z.string().nullable(),
  ref: z.string().nullable(),
  namespace: z.string(),
  requested_by: z.string(),
  reason: z.string().nullable(),
  required: z.number().int(),
  approvals: z.array(z.object({ by: z.string(), reason: z.string(), at: z.string() })),
  rejected: z.object({ by: z.string(), reason: z.string(), at: z.string() }).nullable(),
  override: z.object({ by: z.string(), reason: z.string() }).nullable(),
  created_at: z.string(),
  expires_at: z.string(),
  decided_at: z.string().nullable(),
  job_id: z.string(),
});
export type ApprovalView = z.infer<typeof approvalViewSchema>;

export function approvalView(a: Approval, now: number): ApprovalView {
  const c = a.change;
  return {
    id: a.id,
    status: effectiveStatus(a, now),
    change: c.kind,
    host: c.kind === 'restart' ? c.host : null,
    service: c.kind === 'restart' ? c.service : null,
    project: c.kind === 'deploy' ? c.project : null,
    ref: c.kind === 'deploy' ? c.ref : null,
    namespace: c.namespace,
    requested_by: a.requester,
    reason: a.reason === '' ? null : a.reason,
    required: a.required,
    approvals: a.approvers.map((x) => ({ by: x.by, reason: x.reason, at: iso(x.at)! })),
    rejected: a.rejected ? { by: a.rejected.by, reason: a.rejected.reason, at: iso(a.rejected.at)! } : null,
    override: c.kind === 'restart' && c.override ? c.override : null,
    created_at: iso(a.created_at)!,
    expires_at: iso(a.expires_at)!,
    decided_at: iso(a.decided_at),
    job_id: a.id,
  };
}

/** 202 of a change that waits for approval. */
export const pendingApprovalSchema = z.object({
  status: z.literal('pending_approval'),
  approval_id: z.string().describe('approve with POST /ops/approvals/{id}/approve (another operator); the job id it lets through'),
  expires_at: z.string(),
  required: z.number().int().describe('approvals needed from operators other than the requester'),
  coalesced: z.boolean().describe('true when a pending approval of the same change already existed and this request joined it'),
});
export type PendingApproval = z.infer<typeof pendingApprovalSchema>;

export interface ApprovalRequest {
  change: ApprovalChange;
  /** The change's identity: a second request for it while this one is pending joins it. */
  identity: string;
  requester: string;
  requesterCredential: string;
  reason?: string;
  auditId: string;
  policy: ApprovalPolicy;
  /** An Idempotency-Key scope (hex): the approval id derives from it, so a retry finds the same approval. */
  scope?: string;
}

/** The report fields of an approval's change. */
function changeFields(c: ApprovalChange) {
  return c.kind === 'restart'
    ? { change: 'restart' as const, host: c.host, service: c.service, namespace: c.namespace }
    : { change: 'deploy' as const, project: c.project, ref: c.ref, namespace: c.namespace };
}

export async function requestApproval(
  g: Guards,
  req: ApprovalRequest,
): Promise<PendingApproval & { approval: Approval; created: boolean }> {
  const now = g.now();
  const approval: Approval = {
    id: req.scope ? approvalIdFor(req.scope) : newApprovalId(),
    status: 'pending',
    change: req.change,
    requester: req.requester,
    requester_credential: req.requesterCredential,
    reason: req.reason ?? '',
    required: req.policy.required,
    approvers: [],
    created_at: now,
    expires_at: now + req.policy.ttl * 1000,
    audit_id: req.auditId,
    identity: req.identity,
  };
  const out = await redisCall(() => g.approvals.create(approval), g.redis);
  const stored = out.created ? approval : await redisCall(() => g.approvals.get(out.id), g.redis);
  if (!stored) throw new ConflictError('the approval of this change could not be read back; retry');
  if (out.created) {
    g.metrics?.approvals.inc({ change: req.change.kind, event: 'requested' });
    const base = {
      ...changeFields(req.change),
      job_id: approval.id,
      approval_id: approval.id,
      approvers: [],
      audit_id: req.auditId,
      requested_by: req.requester,
    };
    await queueReport(g, `report.${approval.id}.requested`, {
      ...base,
      event: 'approval_requested',
      ...(req.reason ? { reason: req.reason } : {}),
    });
    // Runs at the expiry: expires the approval if nobody decided it, and says so.
    await queueReport(g, `report.${approval.id}.expiry`, { ...base, event: 'approval_expiry' }, approval.expires_at - now);
  }
  return {
    status: 'pending_approval',
    approval_id: stored.id,
    expires_at: new Date(stored.expires_at).toISOString(),
    required: stored.required,
    coalesced: !out.created && stored.id !== approval.id,
    approval: stored,
    created: out.created,
  };
}

export const decisionBodySchema = z.object({
  reason: z.string().trim().min(1).max(500).describe('why; written to the audit line, the approval and the job'),
  override: z
    .boolean()
    .optional()
    .describe('approve a restart although a freeze or its change windows refuse it now (the reason is the override reason)'),
});

export const decisionAnswerSchema = z.object({
  status: z.enum(APPROVAL_STATES),
  approval: approvalViewSchema,
  job_id: z.string().nullable().describe('approved: the job that carries the change (a restart that joined one in progress: that one)'),
  coalesced: z.boolean().describe('approved: the restart joined one of the same Deployment that was still waiting or rolling out'),
  held_until: z.string().nullable().describe('approved deploy held by a freeze or outside its windows: when it is expected to run'),
  approvals_needed: z.number().int().describe('approvals still needed (0 once decided)'),
});
export type DecisionAnswer = z.infer<typeof decisionAnswerSchema>;

export interface DecisionRequest {
  id: string;
  action: 'approve' | 'reject';
  by: string;
  credential: string;
  reason: string;
  override?: boolean;
  auditId: string;
}

/** Queues the change of an approved approval; a repeat finds the job it added (the job id is the approval id). */
async function queueApproved(g: Guards, a: Approval): Promise<{ jobId: string; coalesced: boolean; heldUntil?: number }> {
  const approvers = a.approvers.map((x) => x.by);
  const c = a.change;
  const now = g.now();
  if (c.kind === 'restart') {
    const data: RestartServiceData = {
      host: c.host,
      service: c.service,
      approval_id: a.id,
      approvers,
      ...(a.reason ? { reason: a.reason } : {}),
      ...(c.override ? { override: c.override } : {}),
      audit_id: a.audit_id,
      requested_by: a.requester,
    };
    const out = await g.producer.add({
      name: JOB.restartService,
      data,
      jobId: a.id,
      deduplication: { id: coalesceId(c.namespace, c.service) },
    });
    // Joined a restart already in progress: this approval's restart never runs, its budget place is free again.
    if (out.jobId !== a.id) await g.budgets.giveBack(c.namespace, a.id).catch(() => undefined);
    return { jobId: out.jobId, coalesced: out.jobId !== a.id };
  }
  const data: RunDeployPipelineData = {
    project: c.project,
    ref: c.ref,
    ...(c.sha ? { sha: c.sha } : {}),
    ...(c.event_id ? { event_id: c.event_id } : {}),
    ...(c.delivery_id ? { delivery_id: c.delivery_id } : {}),
    approval_id: a.id,
    approvers,
    ...(a.reason ? { reason: a.reason } : {}),
    audit_id: a.audit_id,
    requested_by: a.requester,
  };
  const verdict = await deployGate(g, c.project, now);
  let delayMs = 0;
  let hold;
  if (verdict.blocked) ({ delayMs, hold } = await recordHold(g, a.id, data, verdict, now));
  const out = await g.producer.add({
    name: JOB.runDeployPipeline,
    data,
    jobId: a.id,
    ...(c.event_id ? { deduplication: { id: c.event_id, ttlMs: SEEN_EVENT_TTL_SECONDS * 1000 + delayMs } } : {}),
    ...(delayMs > 0 ? { delay: delayMs } : {}),
  });
  if (hold && out.added) await reportHold(g, hold, data);
  if (hold && out.jobId !== a.id) await g.holds.remove(a.id).catch(() => undefined);
  return { jobId: out.jobId, coalesced: false, ...(hold && out.jobId === a.id ? { heldUntil: hold.until } : {}) };
}

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

/**
 * One operator's decision. Errors: 404 unknown; 403 the requester approving their own change; 409
 * already decided, expired, approved twice by the same operator, or (a restart's last approval)
 * refused by a freeze or its windows unless `override`; 429 the restart budget is spent (nothing
 * decided: approve again later).
 */
export async function decideApproval(g: Guards, req: DecisionRequest): Promise<DecisionAnswer> {
  const now = g.now();
  const current = await redisCall(() => g.approvals.get(req.id), g.redis);
  if (!current) throw new NotFoundError('approval not found');
  const c = current.change;

  let budget: { namespace: string; restarts: number; perMs: number } | undefined;
  let overridden = false;
  const completes = req.action === 'approve' && current.status === 'pending' && current.approvers.length + 1 >= current.required;
  if (completes && c.kind === 'restart') {
    // The last approval starts the restart now: the gate must let it through now.
    const verdict = await restartGate(g, c.host, c.namespace, now);
    if (verdict.blocked && !c.override) {
      if (!req.override) {
        for (const r of verdict.reasons) g.metrics?.guardRefusals.inc({ guard: r.guard });
        throw new ConflictError(
          `approval ${req.id} cannot let the restart of Deployment ${c.namespace}/${c.service} through now: ${describeReasons(verdict.reasons)}; approve with "override": true to restart anyway`,
        );
      }
      g.metrics?.guardOverrides.inc();
      overridden = true;
    }
    const b = namespaceBudget(g.inventory, c.namespace);
    if (b) budget = { namespace: c.namespace, restarts: b.restarts, perMs: b.per * 1000 };
  }

  const d = await redisCall(
    () =>
      g.approvals.decide(req.id, {
        action: req.action,
        by: req.by,
        credential: req.credential,
        reason: req.reason,
        now,
        ...(budget ? { budget } : {}),
      }),
    g.redis,
  );
  const a = d.approval ?? current;
  const kind = c.kind;
  switch (d.verdict) {
    case 'not_found':
      throw new NotFoundError('approval not found');
    case 'decided': {
      if (a.status === 'approved') {
        // Approved before, perhaps by a call whose answer was lost before the job was added:
        // adding it again under the approval's id adds nothing when it exists.
        const q = await queueApproved(g, a);
        throw new ConflictError(`approval ${req.id} is already approved (job ${q.jobId})`);
      }
      throw new ConflictError(`approval ${req.id} is already ${a.status}`);
    }
    case 'expired':
      g.metrics?.approvals.inc({ change: kind, event: 'expired' });
      throw new ConflictError(`approval ${req.id} expired at ${new Date(a.expires_at).toISOString()}; ask for the change again`);
    case 'pending':
      throw new UnprocessableError('nothing to decide');
    case 'self':
      g.metrics?.approvals.inc({ change: kind, event: 'refused_self' });
      throw new ForbiddenError(
        'the requester cannot approve their own change (four eyes: another operator must approve it)',
        'self_approval',
      );
    case 'again':
      throw new ConflictError(
        `you already approved ${req.id}; it needs ${a.required - a.approvers.length} more approval(s) from other operators`,
      );
    case 'budget':
      throw budgetError(g, budget!.namespace, { restarts: budget!.restarts, per: budget!.perMs / 1000 }, d.retryMs);
    case 'recorded':
      g.metrics?.approvals.inc({ change: kind, event: 'recorded' });
      return answer(a, now);
    case 'rejected':
      g.metrics?.approvals.inc({ change: kind, event: 'rejected' });
      await queueReport(g, `report.${a.id}.rejected`, {
        event: 'approval_rejected',
        ...changeFields(c),
        job_id: a.id,
        approval_id: a.id,
        outcome: { result: 'rejected', reason: `${req.by}: ${req.reason}` },
        approvers: a.approvers.map((x) => x.by),
        audit_id: a.audit_id,
        requested_by: a.requester,
      });
      return answer(a, now);
    case 'approved': {
      g.metrics?.approvals.inc({ change: kind, event: 'approved' });
      // An override given with the last approval travels with the job (audited, notified).
      const approved: Approval =
        c.kind === 'restart' && overridden ? { ...a, change: { ...c, override: { by: req.by, reason: req.reason } } } : a;
      const q = await queueApproved(g, approved);
      if (approved !== a && approved.change.kind === 'restart') {
        await queueReport(g, `report.${q.jobId}.override`, {
          event: 'override',
          ...changeFields(approved.change),
          job_id: q.jobId,
          approval_id: a.id,
          approvers: a.approvers.map((x) => x.by),
          reason: req.reason,
          audit_id: req.auditId,
          requested_by: req.by,
        });
      }
      return answer(a, now, {
        job_id: q.jobId,
        coalesced: q.coalesced,
        held_until: q.heldUntil !== undefined ? new Date(q.heldUntil).toISOString() : null,
      });
    }
  }
}
