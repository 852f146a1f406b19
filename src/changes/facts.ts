import { hostPolicy, projectPolicy, type Inventory } from '../shared/inventory.js';
import { budgetPools } from './budget/pools.js';
import type { ApprovalPolicy } from '../shared/policy.js';
import type { Freeze } from './freezes/store.js';
import { redisCall } from '../domain/redisOps.js';
import { gate } from './gate.js';
import { coalesceId, type Guards } from './guards.js';
import type { Change, Facts } from './types.js';

/**
 * What the stores answer about a change, for the planner (src/changes/plan.ts). Only what the plan
 * can use is read: a push without an approval policy reads nothing here (the freezes are in
 * memory), so it costs the rate limiter's round trip and the add, as before; the add's own
 * deduplication and the budget's atomic take answer the rest when the plan is carried out.
 *
 * `peek`: a dry run, which reads everything (the budget's use, the coalescing holder, the event's
 * job) since it carries nothing out.
 */
/**
 * The facts every plan needs and no store but the freezes answers: the gate (the freezes in force
 * that cover the target, the policy's windows) and the policy's approval and budget. A job waking
 * in the worker is planned on these alone.
 */
export function policyFacts(inventory: Inventory, freezes: readonly Freeze[], change: Change, now: number): Facts {
  const t = change.target;
  if (t.kind === 'restart') {
    const policy = hostPolicy(inventory, t.host);
    const approval = stricter(policy.approval, change.approval);
    const budgets = budgetPools(inventory, t.namespace, change.requester.principal);
    return {
      gate: gate(freezes, policy.windows, { namespace: t.namespace }, now),
      ...(approval ? { approval } : {}),
      ...(budgets.length > 0 ? { budgets } : {}),
    };
  }
  const policy = projectPolicy(inventory, t.project);
  return {
    gate: gate(freezes, policy.windows, { namespace: t.namespace, project: t.project }, now),
    ...(policy.approval ? { approval: policy.approval } : {}),
  };
}

/** Of two approvals asked for, the one needing more approvers (the policy's on a tie). */
function stricter(policy: ApprovalPolicy | undefined, asked: ApprovalPolicy | undefined): ApprovalPolicy | undefined {
  if (!policy || !asked) return policy ?? asked;
  return asked.required > policy.required ? asked : policy;
}

export async function gatherFacts(g: Guards, change: Change, now: number, peek = false): Promise<Facts> {
  const freezes = await redisCall(() => (g.freezeWatch ?? g.freezes).list(now), g.redis);
  const facts = policyFacts(g.inventory, freezes, change, now);
  const t = change.target;
  if (t.kind === 'restart') {
    const policy = facts;
    const asksApproval = policy.approval !== undefined && change.origin !== 'approval' && change.origin !== 'wake';
    if (change.origin === 'wake' || (asksApproval && !peek)) return facts;
    // The holder decides a join before the budget is taken (a join takes none); without a budget
    // the add's own coalescing answers it.
    if (policy.budgets || peek) facts.holder = await g.producer.deduplicationHolder(coalesceId(t.namespace, t.service));
    if (policy.budgets && peek) {
      const b = policy.budgets;
      facts.budgetUse = await redisCall(() => g.budgets.peek(b, now), g.redis);
    }
    return facts;
  }
  const policy = facts;
  // An event already let through (approved before, or queued before the policy) is a duplicate of
  // that job, not a second approval; without a policy the add's deduplication answers it.
  if (t.eventId && change.origin !== 'wake' && change.origin !== 'retry' && (policy.approval || peek)) {
    facts.duplicateOf = await g.producer.deduplicationHolder(t.eventId);
  }
  return facts;
}
