import { ForbiddenError } from '../shared/errors.js';
import { describeScopeTarget, scopeAdmits } from '../shared/scope.js';
import { kindOfChange } from './kinds/index.js';
import { execute, type ApprovedBy, type ChangeResult } from './execute.js';
import { gatherFacts } from './facts.js';
import type { Pipeline } from './deps.js';
import { overrideOf, plan } from './plan.js';
import type { Change, Decision, Facts, Principal } from './types.js';

/**
 * Every way into a change (the restart API, every push sender, a delivery's replay, the last
 * approval, a dead letter's retry, remediation, a deploy from CI) calls `submitChange`: the
 * stores' facts, the planner's decision, the executor. A dry run calls `planChange` and carries
 * nothing out. The worker's check of a job waking uses the same planner (src/changes/wake.ts).
 */

/** An operator's request to let the change through a closed gate: resolved against the gate as it stands. */
export interface OverrideAsk {
  reason: string;
  /** Who overrides (an approver); default the requester. */
  by?: Principal;
}

/**
 * The change with the override its requester asked for, covering exactly the reasons the gate
 * gives now (a freeze declared later is not covered). No reasons: no override to record.
 */
function resolveOverride(change: Change, facts: Facts, ask: OverrideAsk | undefined): Change {
  if (!ask || facts.gate.reasons.length === 0) return change;
  const by = ask.by ?? change.requester;
  const mine = overrideOf(facts.gate.reasons, by.principal, by.owner, ask.reason);
  // An earlier override (carried by an approval) keeps what it covered; the new one adds the rest.
  const covers = [...new Set([...(change.override?.covers ?? []), ...mine.covers])];
  return { ...change, override: { ...mine, covers } };
}

export interface Planned {
  change: Change;
  facts: Facts;
  decision: Decision;
  now: number;
}

/**
 * Overrides are for people: an override asked by a caller many people may hold (the shared bearer
 * token, an OIDC token whose rule does not say may_override) is refused before anything is read,
 * whether or not the gate is closed now. Every override ask, dry run included, passes here (a
 * restart's before its Idempotency-Key's answer is read back).
 */
export function checkOverrideAsk(change: Change, ask: OverrideAsk | undefined): void {
  if (!ask) return;
  const by = ask.by ?? change.requester;
  if (by.mayOverride !== true) {
    throw new ForbiddenError(
      `${by.principal} may not override freezes or change windows: overrides are for people (an operator's own key, or an OIDC rule with may_override: true)`,
      'override_not_allowed',
    );
  }
}

/**
 * A scoped credential (a keys-file entry's, an OIDC rule's) changes only what its scope admits: the
 * target as its kind names it to a scope. Checked here, where every way in hands its change to the
 * pipeline (a dry run too), so a way in cannot forget it; a route may check earlier to answer 403
 * before its other checks.
 */
export function checkScope(change: Change): void {
  const scope = change.requester.scope;
  if (!scope) return;
  const target = kindOfChange(change).scopeTarget(change.target);
  if (scopeAdmits(scope, target)) return;
  throw new ForbiddenError(`${describeScopeTarget(target)} is outside the scope of this credential`, 'out_of_scope');
}

/** Facts and decision, nothing carried out. `peek` reads every fact (a dry run). */
export async function planChange(g: Pipeline, change: Change, ask?: OverrideAsk, peek = false): Promise<Planned> {
  checkScope(change);
  checkOverrideAsk(change, ask);
  const now = g.now();
  const facts = await gatherFacts(g, change, now, peek);
  const resolved = resolveOverride(change, facts, ask);
  return { change: resolved, facts, decision: plan(resolved, facts, now), now };
}

/**
 * Plans the change and carries the decision out: what it came to, a refusal included, is a value.
 * Only what keeps it from being decided or carried out (a store down, a job that does not parse,
 * an unknown target) is thrown.
 */
export async function submitChange(g: Pipeline, change: Change, ask?: OverrideAsk, approved?: ApprovedBy): Promise<ChangeResult> {
  const p = await planChange(g, change, ask);
  return execute(g, p.change, p.decision, p.now, approved);
}
