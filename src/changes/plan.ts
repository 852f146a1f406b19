import type { GateReason } from './gate.js';
import { kindOfChange } from './kinds/index.js';
import type { Change, Decision, Facts, Origin, Override } from './types.js';

/**
 * The planner: every restart and deploy is decided here, from the change and its facts. Pure (`now`
 * is given), so a table of cases pins every guard and origin (test/unit/changes/plan.test.ts).
 * First, a resubmission whose group started a newer change is superseded (an older deploy never
 * runs after a newer one). A kind a closed gate refuses (a restart) is refused there: it answers
 * something happening now, and running it hours later could do harm. A job waking meets the gate
 * again with the override it carries.
 */

/** The origins that ask for approval when the policy wants one: all but the approval itself and a job already let through. */
const ASKS_APPROVAL: ReadonlySet<Origin> = new Set(['api', 'webhook', 'replay', 'retry', 'remediation', 'ci', 'rollback']);
/** The origins of a job already counted against the budget or let through (no budget taken again, no coalescing). */
const ALREADY_LET_THROUGH: ReadonlySet<Origin> = new Set(['wake']);

/** What an override records of a gate reason: a freeze by its id, the windows as `window`. */
export const coverOf = (r: GateReason): string => (r.guard === 'freeze' ? `freeze:${r.freeze_id}` : 'window');

export function overrideOf(reasons: readonly GateReason[], by: string, owner: string, reason: string): Override {
  return { by, owner, reason, covers: reasons.map(coverOf) };
}

/** The policy's approvals, one more when nobody is named for the requester's credential. */
const requiredApprovals = (facts: Facts, change: Change) => facts.approval!.required + (change.requester.ownerKnown ? 0 : 1);

export function plan(change: Change, facts: Facts, now: number): Decision {
  if (facts.supersededBy !== undefined) return { kind: 'superseded', by: facts.supersededBy };
  const covered = new Set(change.override?.covers ?? []);
  const g: Gated = {
    blocking: facts.gate.reasons.filter((r) => !covered.has(coverOf(r))),
    overridden: facts.gate.reasons.filter((r) => covered.has(coverOf(r))),
    asks: facts.approval !== undefined && ASKS_APPROVAL.has(change.origin),
    through: ALREADY_LET_THROUGH.has(change.origin),
  };
  return kindOfChange(change).closedGate === 'refuse' ? planRefusing(change, facts, g) : planHolding(change, facts, g, now);
}

interface Gated {
  blocking: GateReason[];
  overridden: GateReason[];
  asks: boolean;
  through: boolean;
}

/** Gate, approval, joining a restart in progress, budgets, queue. */
function planRefusing(change: Change, facts: Facts, { blocking, overridden, asks, through }: Gated): Decision {
  if (blocking.length > 0) return { kind: 'refuse', reasons: blocking };
  if (asks) return { kind: 'pending_approval', required: requiredApprovals(facts, change), ttl: facts.approval!.ttl };
  if (through) return { kind: 'queue', takeBudget: false, overridden };
  if (facts.holder && facts.holder !== change.jobId) return { kind: 'join', jobId: facts.holder };
  const budgets = facts.budgets ?? [];
  const spent = budgets.findIndex((b, i) => (facts.budgetUse?.[i]?.used ?? 0) >= b.limit.restarts);
  if (spent >= 0) return { kind: 'over_budget', retryMs: Math.max(1, facts.budgetUse![spent]!.retryMs), pool: budgets[spent]! };
  return { kind: 'queue', takeBudget: budgets.length > 0, overridden };
}

/** A push event already queued, approval, a closed gate holds it until it opens (a delayed job), queue. */
function planHolding(change: Change, facts: Facts, { blocking, overridden, asks, through }: Gated, now: number): Decision {
  if (!through && facts.duplicateOf) return { kind: 'join', jobId: facts.duplicateOf };
  if (asks) return { kind: 'pending_approval', required: requiredApprovals(facts, change), ttl: facts.approval!.ttl };
  if (blocking.length > 0) return { kind: 'hold', until: Math.max(now + 1, facts.gate.until ?? now + 1), reasons: blocking };
  return { kind: 'queue', takeBudget: false, overridden };
}
