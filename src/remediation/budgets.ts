import type { Budgets } from '../changes/budget/store.js';
import { budgetPools, type BudgetPool } from '../changes/budget/pools.js';
import type { Inventory } from '../shared/inventory.js';
import type { RemediationBudgetUse } from '../shared/metrics.js';

/**
 * The remediation budgets and their use now (GET /ops/remediations, the metrics): every rule's own,
 * and the remediation budget of every namespace a rule's targets reach.
 */
export async function remediationBudgetUses(inv: Inventory, budgets: Pick<Budgets, 'peek'>, now: number): Promise<RemediationBudgetUse[]> {
  const pools = new Map<string, BudgetPool>();
  for (const rule of inv.remediations) {
    const namespaces = new Set(
      rule.targets.map((t) => (t.includes('/') ? t.slice(0, t.indexOf('/')) : Object.hasOwn(inv.hosts, t) ? inv.hosts[t]!.namespace : '')),
    );
    for (const ns of namespaces) {
      if (ns === '') continue;
      for (const p of budgetPools(inv, ns, `remediation:${rule.name}`)) pools.set(`${p.kind}:${p.name}`, p);
    }
  }
  const list = [...pools.values()];
  const uses = await budgets.peek(list, now);
  return list.map((p, i) => ({
    budget: p.kind === 'remediation_rule' ? 'rule' : 'namespace',
    name: p.name,
    used: uses[i]?.used ?? 0,
    limit: p.limit.restarts,
    per: p.limit.per,
  }));
}
