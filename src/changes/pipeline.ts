import { ForbiddenError } from '../shared/errors.js';
import { describeScopeTarget, scopeAdmits } from '../shared/scope.js';
import { kindOfChange } from './kinds/index.js';
import { execute, type ApprovedBy, type ChangeResult } from './execute.js';
import { gatherFacts } from './facts.js';
import type { Pipeline } from './deps.js';
import { overrideOf, plan } from './plan.js';
import type { Change, Decision, Facts, Principal } from './types.js';

/** Every way into a change calls `submitChange`: facts, the planner's decision, the executor; a dry run `planChange`. */

/** An operator's request to let the change through a closed gate: resolved against the gate as it stands. */
export interface OverrideAsk {
  reason: string;
  /** Who overrides (an approver); default the requester. */
  by?: Principal;
}

/** The change with the override asked for, covering exactly the gate's reasons now (a later freeze is not covered). */
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
 * Overrides are for people: one asked by a caller many people may hold (the shared bearer token, an
 * OIDC rule without may_override) is refused before anything is read, whether or not the gate is closed.
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

/** A scoped credential changes only what its scope admits: checked where every way in passes, so none can forget it. */
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

/** Plans and carries out: a refusal is a value; only what keeps it from being decided or carried out is thrown. */
export async function submitChange(g: Pipeline, change: Change, ask?: OverrideAsk, approved?: ApprovedBy): Promise<ChangeResult> {
  const p = await planChange(g, change, ask);
  return execute(g, p.change, p.decision, p.now, approved);
}
