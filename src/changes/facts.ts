import type { Inventory } from '../shared/inventory.js';
import type { Freeze } from './freezes/store.js';
import { redisCall } from '../domain/redisOps.js';
import type { Pipeline } from './deps.js';
import { kindOfChange } from './kinds/index.js';
import type { Change, Facts } from './types.js';

/** The facts from the policy and the freezes alone: a job waking in the worker is planned on these. */
export function policyFacts(inventory: Inventory, freezes: readonly Freeze[], change: Change, now: number): Facts {
  return kindOfChange(change).policyFacts(inventory, freezes, change, now, change.approval);
}

/**
 * The facts for the planner. Only what the plan can use is read (a push without an approval policy
 * reads nothing here); the add's deduplication and the budget's atomic take answer the rest.
 * `peek`: a dry run reads everything, since it carries nothing out.
 */
export async function gatherFacts(g: Pipeline, change: Change, now: number, peek = false): Promise<Facts> {
  const freezes = await redisCall(() => (g.freezeWatch ?? g.freezes).list(now), g.redis);
  const facts = policyFacts(g.inventory, freezes, change, now);
  await kindOfChange(change).readFacts(g, change, facts, now, peek);
  return facts;
}
