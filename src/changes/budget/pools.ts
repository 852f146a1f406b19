import { namespaceBudget, namespaceRemediationBudget, type Inventory } from '../../shared/inventory.js';
import { ruleOfPrincipal } from '../../shared/remediations.js';
import type { BudgetPolicy } from '../../shared/policy.js';

/**
 * The budgets a restart draws on: a person's on the namespace's `budget`; a remediation rule's on its rule's `budget`
 * and the namespace's `remediation_budget` (counted apart), never on the places people's restarts need.
 */
export type BudgetPoolKind = 'namespace' | 'remediation_namespace' | 'remediation_rule';

export interface BudgetPool {
  kind: BudgetPoolKind;
  /** The namespace, or the rule. */
  name: string;
  limit: BudgetPolicy;
}

/** The budget of a rule the inventory no longer has (an approval asked for before a rename): the schema's default. */
const DEFAULT_RULE_BUDGET: BudgetPolicy = { restarts: 3, per: 3600 };

const POOL_WORDS: Record<BudgetPoolKind, string> = {
  namespace: 'restart budget of namespace',
  remediation_namespace: 'remediation budget of namespace',
  remediation_rule: 'remediation budget of rule',
};

/** "restart budget of namespace shop", "remediation budget of rule web-down". */
export const describePool = (p: Pick<BudgetPool, 'kind' | 'name'>): string => `${POOL_WORDS[p.kind]} ${p.name}`;

export function budgetPools(inv: Inventory, namespace: string, requester: string): BudgetPool[] {
  const rule = ruleOfPrincipal(requester);
  if (rule === undefined) {
    const b = namespaceBudget(inv, namespace);
    return b ? [{ kind: 'namespace', name: namespace, limit: b }] : [];
  }
  const own = inv.remediations.find((r) => r.name === rule)?.budget ?? DEFAULT_RULE_BUDGET;
  const ns = namespaceRemediationBudget(inv, namespace);
  return [
    { kind: 'remediation_rule', name: rule, limit: own },
    ...(ns ? [{ kind: 'remediation_namespace' as const, name: namespace, limit: ns }] : []),
  ];
}

/** The budgets a restart by `requester` may hold a place of, by name alone (to give a place back). */
export function poolsOf(namespace: string, requester: string): Array<Pick<BudgetPool, 'kind' | 'name'>> {
  const rule = ruleOfPrincipal(requester);
  return rule === undefined
    ? [{ kind: 'namespace', name: namespace }]
    : [
        { kind: 'remediation_rule', name: rule },
        { kind: 'remediation_namespace', name: namespace },
      ];
}
