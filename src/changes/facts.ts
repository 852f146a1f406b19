import type { Inventory } from '../shared/inventory.js';
import type { Freeze } from './freezes/store.js';
import { redisCall } from '../domain/redisOps.js';
import type { Pipeline } from './deps.js';
import { kindOfChange } from './kinds/index.js';
import type { Change, Facts } from './types.js';

/**
 * The facts every plan needs and no store but the freezes answers: the gate (the freezes in force
 * that cover the target, the policy's windows) and the policy's approval and budget. A job waking
 * in the worker is planned on these alone.
 */
export function policyFacts(inventory: Inventory, freezes: readonly Freeze[], change: Change, now: number): Facts {
  return kindOfChange(change).policyFacts(inventory, freezes, change, now, change.approval);
}

/**
 * What the stores answer about a change, for the planner (src/changes/plan.ts). Only what the plan
 * can use is read: a push without an approval policy reads nothing here (the freezes are in
 * memory), so it costs the rate limiter's round trip and the add; the add's own
 * deduplication and the budget's atomic take answer the rest when the plan is carried out.
 * What each kind reads is its module's (src/changes/kinds/).
 *
 * `peek`: a dry run, which reads everything (the budget's use, the coalescing holder, the event's
 * job) since it carries nothing out.
 */
export async function gatherFacts(g: Pipeline, change: Change, now: number, peek = false): Promise<Facts> {
  const freezes = await redisCall(() => (g.freezeWatch ?? g.freezes).list(now), g.redis);
  const facts = policyFacts(g.inventory, freezes, change, now);
  await kindOfChange(change).readFacts(g, change, facts, now, peek);
  return facts;
}
