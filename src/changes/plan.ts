import type { GateReason } from './gate.js';
import { kindOfChange } from './kinds/index.js';
import type { Change, Decision, Facts, Origin, Override } from './types.js';

/**
 * The planner: every restart and deploy, whatever way it came in, is decided here, from the change
 * and what the stores answered. Pure: no I/O, no clock of its own (`now` is given), so a table of
 * cases pins every guard and origin (test/unit/changes/plan.test.ts).
 *
 * The order, for a kind a closed gate refuses (`closedGate: 'refuse'`, src/changes/kinds/: a restart):
 *   1. the gate (freezes, then windows) less what an override covers: closed -> refuse
 *      (a restart answers something happening now; running it hours later could do harm);
 *   2. an approval policy -> pending approval (the approval itself and a job waking skip it);
 *   3. a restart of the same Deployment still waiting or rolling out -> join it (no budget taken);
 *   4. one of its budgets spent (a namespace's for people; a rule's and a namespace's remediation
 *      budget for a remediation) -> over budget, with when a place frees;
 *   5. queue, taking a place of each budget.
 * For a kind a closed gate holds (a deploy):
 *   1. the same push event already queued within its dedup window -> join that job;
 *   2. an approval policy -> pending approval;
 *   3. the gate closed -> hold until it is expected to open (a delayed job);
 *   4. queue.
 * Before either: a resubmission of a change accepted earlier (a retry, a replay, the last approval)
 * whose group started a change accepted after it -> superseded (src/changes/deployOrder/: an older
 * deploy never runs after a newer one).
 * A job waking (origin `wake`) meets the gate again with the override it carries: a freeze declared
 * since refuses the restart or holds the deploy again.
 */

/** The origins that ask for approval when the policy wants one: all but the approval itself and a job already let through. */
const ASKS_APPROVAL: ReadonlySet<Origin> = new Set(['api', 'webhook', 'replay', 'retry', 'remediation', 'ci', 'rollback']);
/** The origins of a job already counted against the budget or let through (no budget taken again, no coalescing). */
const ALREADY_LET_THROUGH: ReadonlySet<Origin> = new Set(['wake']);

/** What an override records of a gate reason: a freeze by its id, the windows as `window`. */
export const coverOf = (r: GateReason): string => (r.guard === 'freeze' ? `freeze:${r.freeze_id}` : 'window');

/** An override of these reasons, by `by` (owner `owner`), for `reason`. */
export function overrideOf(reasons: readonly GateReason[], by: string, owner: string, reason: string): Override {
  return { by, owner, reason, covers: reasons.map(coverOf) };
}

/** The approvals a change needs: the policy's, one more when nobody is named for the requester's credential. */
function requiredApprovals(required: number, change: Pick<Change, 'requester'>): number {
  return required + (change.requester.ownerKnown ? 0 : 1);
}

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

/** The gate as it stands for this change, and what its origin asks. */
interface Gated {
  blocking: GateReason[];
  overridden: GateReason[];
  asks: boolean;
  through: boolean;
}

/** A kind a closed gate refuses (a restart). */
function planRefusing(change: Change, facts: Facts, { blocking, overridden, asks, through }: Gated): Decision {
  if (blocking.length > 0) return { kind: 'refuse', reasons: blocking };
  if (asks) return { kind: 'pending_approval', required: requiredApprovals(facts.approval!.required, change), ttl: facts.approval!.ttl };
  if (through) return { kind: 'queue', takeBudget: false, overridden };
  if (facts.holder && facts.holder !== change.jobId) return { kind: 'join', jobId: facts.holder };
  const budgets = facts.budgets ?? [];
  const spent = budgets.findIndex((b, i) => (facts.budgetUse?.[i]?.used ?? 0) >= b.limit.restarts);
  if (spent >= 0) return { kind: 'over_budget', retryMs: Math.max(1, facts.budgetUse![spent]!.retryMs), pool: budgets[spent]! };
  return { kind: 'queue', takeBudget: budgets.length > 0, overridden };
}

/** A kind a closed gate holds until it opens (a deploy). */
function planHolding(change: Change, facts: Facts, { blocking, overridden, asks, through }: Gated, now: number): Decision {
  if (!through && facts.duplicateOf) return { kind: 'join', jobId: facts.duplicateOf };
  if (asks) return { kind: 'pending_approval', required: requiredApprovals(facts.approval!.required, change), ttl: facts.approval!.ttl };
  if (blocking.length > 0) return { kind: 'hold', until: Math.max(now + 1, facts.gate.until ?? now + 1), reasons: blocking };
  return { kind: 'queue', takeBudget: false, overridden };
}
