import { randomUUID } from 'node:crypto';
import {
  BudgetExhaustedError,
  ConflictError,
  QueueUnavailableError,
  RestartNotConfirmedError,
  UnprocessableError,
} from '../shared/errors.js';
import { parseJobData, type JobName } from '../shared/jobs.js';
import type { AddRequest } from '../shared/producer.js';
import type { PushEvent } from '../domain/intake.js';
import { redisCall } from '../domain/redisOps.js';
import type { Written } from '../domain/replication.js';
import { newApprovalId, type Approval } from './approvals/store.js';
import { describeReasons, type GateReason } from './gate.js';
import { describePool, type BudgetPool } from './budget/pools.js';
import { describeBudget, queueReport, type Pipeline } from './deps.js';
import type { Hold } from './holds.js';
import { recordDeployStep } from './deployOrder/record.js';
import { kindOfChange, kindOfTarget, type AnyKind } from './kinds/index.js';
import type { AnyTarget, ApprovedBy, Change, Decision } from './types.js';

/**
 * The executor: carries out the planner's decision (src/changes/plan.ts). The only code that adds a
 * change's job (test/unit/changes/oneAdder.test.ts checks it); its kind (src/changes/kinds/) gives
 * the job, its data and which way carries it. Every override and hold is reported.
 */
export interface Carried {
  decision: Decision;
  /** The job that carries the change (a joined one's id), or the approval's id while it waits. */
  jobId: string;
  coalesced: boolean;
  held?: { until: number; reasons: GateReason[] };
  approval?: { approval: Approval; created: boolean; coalesced: boolean };
  /** A push whose delivery id or event was already recorded: a duplicate. */
  duplicate?: boolean;
  /** A signed push whose commit pair a delivery already deployed: nothing queued, the reason names that job. */
  ignored?: { reason: string };
  written?: Written;
}

class SupersededError extends ConflictError {
  readonly by: string;
  constructor(detail: string, by: string) {
    super(detail, 'superseded');
    this.by = by;
  }
}

/** The refusal of a superseded resubmission: the newer deploy named, and the way to an older commit. */
export function supersededRefusal(c: Change, by: string): Refusal {
  return {
    guard: 'order',
    by,
    detail:
      `${describeTarget(c.target)} is superseded: deploy ${by} of its group, accepted after it, has started; ` +
      'an older deploy never runs after a newer one. To go back to its commit, deploy it anew: POST /ops/deploys/rollback (with "to": the commit), a new push or POST /ops/deploys',
  };
}

class ChangeRefusedError extends ConflictError {
  readonly reasons: GateReason[];
  constructor(detail: string, reasons: GateReason[]) {
    super(detail, 'change_refused');
    this.reasons = reasons;
  }
}

/** "restart of Deployment ns/name", "deploy of group/app refs/heads/main": its kind's words (src/changes/kinds/). */
export const describeTarget = (t: AnyTarget): string => kindOfTarget(t).describe(t);

export const targetFields = (t: AnyTarget) => kindOfTarget(t).reportFields(t);

export type { ApprovedBy };

/**
 * The job's data, parsed before anything is written (422 naming the field), so a change that could
 * not be added never takes a budget place, a hold or an approval's decision.
 */
function parsed(name: JobName, data: unknown): unknown {
  const p = parseJobData(name, data);
  if (!p.success)
    throw new UnprocessableError(`invalid ${p.error.issues[0]!.path.join('.')}: ${p.error.issues[0]!.message}`, 'invalid_job_data');
  return p.data;
}

/** A refusal, nothing carried out: counted once where it is decided; a way in over HTTP answers `refusalError`. */
type Refusal =
  | { guard: 'gate'; reasons: GateReason[]; detail: string }
  | { guard: 'budget'; pool: BudgetPool; retryMs: number; detail: string }
  | { guard: 'order'; by: string; detail: string };

/** What submitting a change came to: carried out (queued, joined, held, waiting for approval), or refused. */
export type ChangeResult = { carried: Carried; refusal?: undefined } | { refusal: Refusal; carried?: undefined };

export function gateRefusal(g: Pipeline, c: Change, reasons: GateReason[]): Refusal {
  for (const r of reasons) g.metrics?.guardRefusals.inc({ guard: r.guard });
  const how =
    c.origin === 'approval'
      ? '; approve with "override": true to restart anyway'
      : c.origin === 'api'
        ? '. An operator may restart anyway with override=true and a reason'
        : '';
  return { guard: 'gate', reasons, detail: `${describeTarget(c.target)} refused: ${describeReasons(reasons)}${how}` };
}

/** The refusal of a spent budget, counted: people's by namespace, a remediation's by its budget. */
function budgetRefusal(g: Pick<Pipeline, 'metrics'>, pool: BudgetPool, retryMs: number): Refusal {
  if (pool.kind === 'namespace') g.metrics?.budgetExhausted.inc({ namespace: pool.name });
  else g.metrics?.remediationBudgetExhausted.inc({ budget: pool.kind === 'remediation_rule' ? 'rule' : 'namespace', name: pool.name });
  const seconds = Math.max(1, Math.ceil(retryMs / 1000));
  const detail = `${describePool(pool)} exhausted: at most ${describeBudget(pool.limit)}; the next restart fits in ${seconds} s`;
  return { guard: 'budget', pool, retryMs, detail };
}

export function refusalError(r: Refusal): ChangeRefusedError | BudgetExhaustedError | SupersededError {
  if (r.guard === 'order') return new SupersededError(r.detail, r.by);
  return r.guard === 'gate'
    ? new ChangeRefusedError(r.detail, r.reasons)
    : new BudgetExhaustedError(r.pool.name, r.detail, Math.max(1, Math.ceil(r.retryMs / 1000)));
}

export async function execute(g: Pipeline, change: Change, decision: Decision, now: number, approved?: ApprovedBy): Promise<ChangeResult> {
  switch (decision.kind) {
    case 'refuse':
      return { refusal: gateRefusal(g, change, decision.reasons) };
    case 'over_budget':
      return { refusal: budgetRefusal(g, decision.pool, decision.retryMs) };
    case 'superseded':
      return { refusal: supersededRefusal(change, decision.by) };
    case 'join':
      return { carried: { decision, jobId: decision.jobId, coalesced: true, duplicate: kindOfChange(change).carry === 'intake' } };
    case 'pending_approval':
      return { carried: await pendingApproval(g, change, decision, now) };
    case 'queue':
    case 'hold': {
      const kind = kindOfChange(change);
      return kind.carry === 'coalesced'
        ? queueCoalesced(g, kind, change, decision as Extract<Decision, { kind: 'queue' }>, approved)
        : { carried: await queueThroughIntake(g, kind, change, decision, now, approved) };
    }
  }
}

/** What every report of a change names. */
/** The fields every report_change of a change carries. */
export const reportOf = (change: Change, jobId: string, approved?: ApprovedBy) => ({
  ...targetFields(change.target),
  job_id: jobId,
  approvers: approved?.approvers ?? [],
  audit_id: change.auditId,
  requested_by: change.requester.principal,
});

async function reportOverride(g: Pipeline, change: Change, jobId: string, overridden: GateReason[], approved?: ApprovedBy) {
  if (!change.override || overridden.length === 0) return;
  g.metrics?.guardOverrides.inc();
  await queueReport(g, `report.${jobId}.override`, {
    event: 'override',
    ...reportOf(change, jobId, approved),
    ...(approved ? { approval_id: approved.approvalId } : {}),
    reason: `${change.override.reason} (overriding: ${describeReasons(overridden)}; by ${change.override.by})`,
  });
}

/** A kind carried `coalesced` (a restart): a place of each of its budgets, then the add with its coalescing id. */
async function queueCoalesced(
  g: Pipeline,
  kind: AnyKind,
  change: Change,
  decision: Extract<Decision, { kind: 'queue' }>,
  approved?: ApprovedBy,
): Promise<ChangeResult> {
  const t = change.target;
  const data = parsed(kind.job, kind.jobData(change, approved));
  const jobId = change.jobId ?? `${kind.name}-${randomUUID()}`;
  const budget = decision.takeBudget ? g.budgetPools(t.namespace, change.requester.principal) : [];
  if (budget.length > 0) {
    const use = await redisCall(() => g.budgets.take(budget, jobId, g.now()), g.redis);
    if (!use.taken) return { refusal: budgetRefusal(g, use.spent!, use.retryMs) };
  }
  let id: string;
  try {
    ({ jobId: id } = await g.producer.add({
      name: kind.job,
      data,
      jobId,
      deduplication: { id: kind.coalesceId!(t) },
    } as AddRequest));
  } catch (err) {
    // Not added (or not known to be): its budget place is given back; an add that lands later
    // restarts within the budget's tolerance of one.
    await g.budgets.giveBack(budget, jobId).catch(() => undefined);
    if (err instanceof QueueUnavailableError && err.mayHaveLanded && change.origin === 'api') {
      throw new RestartNotConfirmedError(change.jobId !== undefined);
    }
    throw err;
  }
  // Joined a restart already in progress: this one never runs, its budget place is free again.
  if (id !== jobId) await g.budgets.giveBack(budget, jobId).catch(() => undefined);
  if (id === jobId) await reportOverride(g, change, jobId, decision.overridden, approved);
  return { carried: { decision, jobId: id, coalesced: id !== jobId, ...(id === jobId ? { written: { jobId: id } } : {}) } };
}

/** A kind carried through the intake (a deploy): its event's dedup record and delivery alias, a hold first when held. */
async function queueThroughIntake(
  g: Pipeline,
  kind: AnyKind,
  change: Change,
  decision: Extract<Decision, { kind: 'queue' | 'hold' }>,
  now: number,
  approved?: ApprovedBy,
): Promise<Carried> {
  const t = kind.intake!(change.target);
  const data = parsed(kind.job, kind.jobData(change, approved));
  const held = decision.kind === 'hold';
  const jobId = change.jobId ?? (held ? randomUUID() : undefined);
  let hold: Hold | undefined;
  if (held) {
    hold = {
      job_id: jobId!,
      project: t.project,
      namespace: change.target.namespace,
      ref: t.ref,
      reasons: decision.reasons,
      until: decision.until,
      held_at: now,
      by: 'api',
      requested_by: change.requester.principal,
    };
    await redisCall(() => g.holds.set(hold!), g.redis);
    for (const r of decision.reasons) g.metrics?.holds.inc({ by: 'api', guard: r.guard });
  }
  if (!g.intake) throw new Error('this process carries out no change through the intake');
  const out = await g.intake.push({
    source: t.source ?? 'api',
    ...(t.eventId && change.origin !== 'retry' ? { eventId: t.eventId } : {}),
    ...(t.deliveryId ? { deliveryId: t.deliveryId } : {}),
    // A retry is the operator's own deploy of the job's commit, not a delivery.
    ...(t.before !== undefined && change.origin !== 'retry' ? { before: t.before } : {}),
    // An operator's replay may deploy again a signed push whose commit pair a delivery may not.
    ...(change.origin === 'replay' ? { allowRedeploy: true } : {}),
    job: {
      name: kind.job,
      data,
      ...(jobId ? { jobId } : {}),
      ...(held ? { delay: Math.max(1, decision.until - now) } : {}),
    } as PushEvent['job'],
  });
  if (out.ignored) {
    if (hold) await g.holds.remove(hold.job_id).catch(() => undefined);
    return { decision, jobId: out.jobId, coalesced: false, ignored: out.ignored };
  }
  const mine = out.accepted && (jobId === undefined || out.jobId === jobId);
  if (out.accepted) await recordDeployStep(g, change, out.jobId, hold && mine ? 'held' : 'queued', now);
  if (out.accepted && decision.kind === 'queue') await reportOverride(g, change, out.jobId, decision.overridden, approved);
  if (hold && mine) {
    await queueReport(g, `report.${hold.job_id}.held`, {
      event: 'held',
      ...reportOf(change, hold.job_id, approved),
      outcome: { result: 'held', reason: describeReasons(hold.reasons), until: new Date(hold.until).toISOString() },
    });
  } else if (hold) {
    await g.holds.remove(hold.job_id).catch(() => undefined);
  }
  return {
    decision,
    jobId: out.jobId,
    coalesced: !out.accepted,
    duplicate: out.duplicate,
    ...(hold && mine ? { held: { until: hold.until, reasons: hold.reasons } } : {}),
    ...(out.written ? { written: out.written } : {}),
  };
}

async function pendingApproval(
  g: Pipeline,
  change: Change,
  decision: Extract<Decision, { kind: 'pending_approval' }>,
  now: number,
): Promise<Carried> {
  const id = change.approvalId ?? newApprovalId();
  const approval: Approval = {
    id,
    status: 'pending',
    change: kindOfChange(change).toApproval(change),
    requester: change.requester.principal,
    requester_credential: change.requester.credential,
    requester_owner: change.requester.owner,
    requester_owner_known: change.requester.ownerKnown,
    ...(change.requester.person !== undefined ? { requester_person: change.requester.person } : {}),
    origin: change.origin,
    reason: change.reason ?? '',
    required: decision.required,
    approvers: [],
    created_at: now,
    expires_at: now + decision.ttl * 1000,
    audit_id: change.auditId,
    identity: kindOfChange(change).approvalIdentity(change.target),
  };
  const out = await redisCall(() => g.approvals.create(approval), g.redis);
  const stored = out.created ? approval : await redisCall(() => g.approvals.get(out.id), g.redis);
  if (!stored) throw new ConflictError('the approval of this change could not be read back; retry', 'approval_changed');
  if (out.created) {
    g.metrics?.approvals.inc({ change: change.target.kind, event: 'requested' });
    await recordDeployStep(g, change, id, 'pending_approval', now);
    const base = { ...reportOf(change, id), approval_id: id };
    await queueReport(g, `report.${id}.requested`, {
      ...base,
      event: 'approval_requested',
      ...(change.reason ? { reason: change.reason } : {}),
    });
    // Runs at the expiry: expires the approval if nobody decided it (or finishes one left approving), and says so.
    await queueReport(g, `report.${id}.expiry`, { ...base, event: 'approval_expiry' }, approval.expires_at - now);
  }
  return {
    decision,
    jobId: stored.id,
    coalesced: !out.created,
    approval: { approval: stored, created: out.created, coalesced: !out.created && stored.id !== id },
  };
}
