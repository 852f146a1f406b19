import { z } from 'zod';
import { redisCall } from '../../domain/redisOps.js';
import { findHost, hostPolicy, type Inventory } from '../../shared/inventory.js';
import { JOB, type RestartServiceData } from '../../shared/jobs.js';
import { restartedAtKey } from '../../shared/keys.js';
import { formatDuration, type ApprovalPolicy } from '../../shared/policy.js';
import type { ApprovalChange } from '../approvals/store.js';
import { budgetPools, describePool } from '../budget/pools.js';
import { approvalVerdict, approvalVerdictSchema, gateView, gateViewSchema, kubernetesVerdictSchema } from '../dryRunView.js';
import type { Freeze } from '../freezes/store.js';
import { describeReasons, gate } from '../gate.js';
import { coalesceId, describeBudget } from '../deps.js';
import type { Decision, Facts, RestartTarget } from '../types.js';
import { approvalFieldsOf, overrideField, requesterFieldsOf, stricter } from './common.js';
import type { ChangeKind } from './types.js';

/**
 * A restart of a host's Deployment: it answers something happening now, so a closed gate refuses it; one per
 * Deployment waits or rolls out at a time (a second request joins it); it draws on restart budgets.
 */
type RestartApproval = Extract<ApprovalChange, { kind: 'restart' }>;

export const restartDryRunSchema = z.object({
  dry_run: z.literal(true),
  change: z.literal('restart'),
  host: z.string(),
  service: z.string(),
  namespace: z.string(),
  would: z
    .enum(['queue', 'join', 'pending_approval', 'refuse', 'over_budget'])
    .describe('what the same request without dry_run would do now'),
  detail: z.string(),
  verdicts: z.object({
    gate: gateViewSchema,
    approval: approvalVerdictSchema,
    coalescing: z.object({
      joins: z.string().nullable().describe('the restart of this Deployment still waiting or rolling out, which it would join'),
    }),
    budget: z
      .object({
        restarts: z.number().int(),
        per: z.string(),
        used: z.number().int(),
        remaining: z.number().int(),
        retry_after_s: z.number().int().describe('0 while there is room'),
      })
      .nullable(),
  }),
  kubernetes: kubernetesVerdictSchema,
});
export type RestartDryRun = z.infer<typeof restartDryRunSchema>;

function dryRunDetail(decision: Decision): string {
  switch (decision.kind) {
    case 'refuse':
    case 'hold':
      return `refused: ${describeReasons(decision.reasons)}`;
    case 'pending_approval':
      return `waits for ${decision.required} approval(s) from other people within ${formatDuration(decision.ttl)}`;
    case 'join':
      return `joins restart ${decision.jobId}, still waiting or rolling out`;
    case 'over_budget':
      return `refused: ${describePool(decision.pool)} (${describeBudget(decision.pool.limit)}) is spent for ${Math.ceil(decision.retryMs / 1000)} s`;
    case 'queue':
      return decision.overridden.length > 0 ? `queued despite the gate (override): ${describeReasons(decision.overridden)}` : 'queued';
    case 'superseded':
      return `refused: superseded by ${decision.by}`;
  }
}

/** The budget a person's restart draws on (the first: a person's has one), as a dry run shows it. */
function dryRunBudget(facts: Facts): RestartDryRun['verdicts']['budget'] {
  const first = facts.budgets?.[0];
  if (!first) return null;
  const use = facts.budgetUse?.[0] ?? { used: 0, retryMs: 0 };
  return {
    restarts: first.limit.restarts,
    per: formatDuration(first.limit.per),
    used: use.used,
    remaining: Math.max(0, first.limit.restarts - use.used),
    retry_after_s: Math.ceil(use.retryMs / 1000),
  };
}

export const restartKind: ChangeKind<RestartTarget, RestartServiceData> = {
  name: 'restart',
  job: JOB.restartService,
  closedGate: 'refuse',
  carry: 'coalesced',
  describe: (t) => `restart of Deployment ${t.namespace}/${t.service}`,
  reportFields: (t) => ({ change: 'restart', host: t.host, service: t.service, namespace: t.namespace }),
  reportWhat: (d) => `restart of Deployment ${d.namespace}/${d.service ?? '?'} (host ${d.host ?? '?'})`,
  reportObject: (d) =>
    d.service && d.namespace ? { apiVersion: 'apps/v1', kind: 'Deployment', name: d.service, namespace: d.namespace } : undefined,
  scopeTarget: (t) => ({ kind: 'host', host: t.host, namespace: t.namespace }),
  policyFacts(inventory: Inventory, freezes: readonly Freeze[], change, now, asked?: ApprovalPolicy) {
    const t = change.target;
    const policy = hostPolicy(inventory, t.host);
    const approval = stricter(policy.approval, asked);
    const budgets = budgetPools(inventory, t.namespace, change.requester.principal);
    return {
      gate: gate(freezes, policy.windows, { namespace: t.namespace }, now),
      ...(approval ? { approval } : {}),
      ...(budgets.length > 0 ? { budgets } : {}),
    };
  },
  async readFacts(g, change, facts, now, peek) {
    const t = change.target;
    const asksApproval = facts.approval !== undefined && change.origin !== 'approval' && change.origin !== 'wake';
    if (change.origin === 'wake' || (asksApproval && !peek)) return;
    // The holder decides a join before the budget is taken (a join takes none); without a budget
    // the add's own coalescing answers it.
    if (facts.budgets || peek) facts.holder = await g.producer.deduplicationHolder(coalesceId(t.namespace, t.service));
    if (facts.budgets && peek) {
      const b = facts.budgets;
      facts.budgetUse = await redisCall(() => g.budgets.peek(b, now), g.redis);
    }
  },
  jobData: (c, approved) => ({
    host: c.target.host,
    service: c.target.service,
    ...approvalFieldsOf(c, approved),
    ...(c.override ? { override: c.override } : {}),
    ...requesterFieldsOf(c),
  }),
  fromJob: (inventory, d) => ({
    target: { kind: 'restart', host: d.host, service: d.service, namespace: findHost(inventory, d.host)?.namespace ?? '' },
    ...(d.reason ? { reason: d.reason } : {}),
    ...overrideField(d.override),
  }),
  approvalIdentity: (t) => coalesceId(t.namespace, t.service),
  toApproval: (c) => ({
    kind: 'restart',
    host: c.target.host,
    service: c.target.service,
    namespace: c.target.namespace,
    ...(c.override ? { override: c.override } : {}),
  }),
  fromApproval(a) {
    const c = a as RestartApproval;
    return { target: { kind: 'restart', host: c.host, service: c.service, namespace: c.namespace }, ...overrideField(c.override) };
  },
  approvalView(a) {
    const c = a as RestartApproval;
    return { host: c.host, service: c.service, project: null, ref: null, override: c.override };
  },
  dryRun: {
    schema: restartDryRunSchema,
    data: (c) => ({
      change: 'restart',
      host: c.target.host,
      service: c.target.service,
      audit_id: c.auditId,
      requested_by: c.requester.principal,
    }),
    answer: ({ change, facts, decision }, override, kubernetes): RestartDryRun => ({
      dry_run: true,
      change: 'restart',
      host: change.target.host,
      service: change.target.service,
      namespace: change.target.namespace,
      // A kind without an order (no turnGroup) is never superseded.
      would: decision.kind === 'hold' || decision.kind === 'superseded' ? 'refuse' : decision.kind,
      detail: dryRunDetail(decision),
      verdicts: {
        gate: gateView(facts.gate, override),
        approval: approvalVerdict(facts),
        coalescing: { joins: facts.holder ?? null },
        budget: dryRunBudget(facts),
      },
      kubernetes,
    }),
  },
  coalesceId: (t) => coalesceId(t.namespace, t.service),
  // A retried restart is a new restart: the old job's restartedAt would make its patch a no-op.
  retryClears: (jobId) => [restartedAtKey(jobId)],
};
