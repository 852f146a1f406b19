import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { parseYamlFile } from './config.js';
import { ConfigError } from './errors.js';
import { dnsLabel, dnsSubdomain, STATUS_SENDERS } from './jobs.js';
import { hostPolicySchema, mergePolicy, projectPolicySchema, type HostPolicy, type ProjectPolicy } from './policy.js';
import { pinnedValue, remediationRuleSchema } from './remediations.js';

/**
 * The inventory (OPS_INVENTORY_FILE, YAML or JSON), the allow-list of what opsgate may touch. A deploy Job's arguments never
 * come from a request: project and ref reach it only as environment variables.
 */
const hostSchema = z.object({
  namespace: dnsLabel,
  deployments: z.array(dnsSubdomain).min(1),
  policy: hostPolicySchema.optional(),
});

const projectSchema = z.object({
  namespace: dnsLabel,
  serviceAccountName: dnsSubdomain,
  image: z.string().min(1),
  command: z.array(z.string()).optional(),
  args: z.array(z.string()).optional(),
  /** Refs allowed to deploy; default only refs/heads/main. */
  refs: z.array(z.string().min(1)).default(['refs/heads/main']),
  env: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/), z.string()).default({}),
  activeDeadlineSeconds: z.number().int().positive().max(900).default(900),
  backoffLimit: z.number().int().min(0).max(6).default(0),
  ttlSecondsAfterFinished: z.number().int().min(0).default(86400),
  /** Wait for the deploy Job's end and report it; false: the queue job ends once the Job is created. */
  waitForCompletion: z.boolean().default(true),
  /** `push` (a push webhook), `ci` (POST /ops/deploys, bound to the commit) or `both`. */
  deploy_from: z.enum(['push', 'ci', 'both']).default('push'),
  /** Deploys of one group (a template over `{project}` and `{ref}`; default `{project}:{ref}`) run one at a time, in acceptance order. */
  concurrency: z
    .object({
      group: z
        .string()
        .min(1)
        .max(200)
        .regex(/^(?:[^{}]|\{project\}|\{ref\})+$/, 'may hold only {project} and {ref} in braces'),
    })
    .optional(),
  /** A newer deploy of the group deletes the running one's Job instead of waiting (worker/deployCancel.ts). */
  cancel_in_progress: z.boolean().optional(),
  policy: projectPolicySchema.optional(),
  /** The environment a deploy's state is told under on its commit's host; default: the deploy's ref. */
  environment: z.string().min(1).max(255).optional(),
  /** GitHub: `deployment` (the Deployments API; default) or `commit` (commit statuses). */
  status: z.enum(['deployment', 'commit']).optional(),
  /** The host told the states of deploys whose sender does not say (a CI deploy, /webhook/generic). */
  sender: z.enum(STATUS_SENDERS).optional(),
});

export const inventorySchema = z
  .object({
    policy: hostPolicySchema.optional(),
    hosts: z.record(z.string().min(1).max(253), hostSchema).default({}),
    projects: z.record(z.string().min(1).max(255), projectSchema).default({}),
    remediations: z.array(remediationRuleSchema).max(200).default([]),
  })
  .superRefine((inv, ctx) => {
    // A rule is named once (its metrics and Redis records carry the name); what its match pins must be restartable.
    const issue = (path: (string | number)[], message: string) => ctx.addIssue({ code: 'custom', path, message });
    const names = new Set<string>();
    inv.remediations.forEach((rule, i) => {
      if (names.has(rule.name)) issue(['remediations', i, 'name'], `repeats the rule name ${rule.name}`);
      names.add(rule.name);
      if (rule.target.namespace === rule.target.deployment) {
        issue(['remediations', i, 'target'], 'namespace and deployment must be two different labels');
      }
      rule.targets.forEach((t, j) => {
        const slash = t.indexOf('/');
        if (slash < 0 && !Object.hasOwn(inv.hosts, t)) {
          issue(['remediations', i, 'targets', j], `names host ${JSON.stringify(t)}, which the inventory lacks`);
        }
        if (slash >= 0 && hostOfDeployment(inv, t.slice(0, slash), t.slice(slash + 1)) === undefined) {
          issue(['remediations', i, 'targets', j], `names Deployment ${t}, which no inventory host lists`);
        }
      });
      const ns = pinnedValue(rule, rule.target.namespace);
      const dep = pinnedValue(rule, rule.target.deployment);
      const hosts = Object.values(inv.hosts).filter((h) => ns === undefined || h.namespace === ns);
      if (ns !== undefined && hosts.length === 0) {
        issue(['remediations', i, 'match', 'labels'], `pins namespace ${ns}, which no inventory host has`);
      } else if (dep !== undefined && !hosts.some((h) => h.deployments.includes(dep))) {
        const of = ns !== undefined ? ` of namespace ${ns}` : '';
        issue(['remediations', i, 'match', 'labels'], `pins Deployment ${dep}, which no inventory host${of} lists`);
      }
    });
    // A restart budget (people's, and remediation's) counts per namespace: hosts sharing one must agree on it.
    for (const field of ['budget', 'remediation_budget'] as const) {
      const seen = new Map<string, { host: string; budget: string }>();
      for (const [host, h] of Object.entries(inv.hosts)) {
        const budget = JSON.stringify(mergePolicy(inv.policy, h.policy)[field] ?? null);
        const other = seen.get(h.namespace);
        if (other && other.budget !== budget) {
          issue(
            ['hosts', host, 'policy', field],
            `differs from the ${field} of host ${JSON.stringify(other.host)} in the same namespace ${h.namespace} (a restart budget counts per namespace)`,
          );
        }
        if (!other) seen.set(h.namespace, { host, budget });
      }
    }
  });

export type Inventory = z.infer<typeof inventorySchema>;
type HostEntry = z.infer<typeof hostSchema>;
export type ProjectEntry = z.infer<typeof projectSchema>;

const emptyInventory: Inventory = { hosts: {}, projects: {}, remediations: [] };

/** The effective policy of a host's restarts. */
export function hostPolicy(inv: Inventory, host: string): HostPolicy {
  return mergePolicy(inv.policy, findHost(inv, host)?.policy);
}

/** The effective policy of a project's deploys (a budget applies to restarts only). */
export function projectPolicy(inv: Inventory, project: string): ProjectPolicy {
  const { budget: _restartsOnly, ...defaults } = inv.policy ?? {};
  return mergePolicy<ProjectPolicy>(defaults, findProject(inv, project)?.policy);
}

/** The policy of a namespace's hosts (the same budgets for every host in it; see the schema's check). */
const namespacePolicy = (inv: Inventory, namespace: string): HostPolicy | undefined => {
  const host = Object.keys(inv.hosts).find((h) => inv.hosts[h]!.namespace === namespace);
  return host === undefined ? inv.policy : hostPolicy(inv, host);
};

export function namespaceBudget(inv: Inventory, namespace: string): HostPolicy['budget'] {
  return namespacePolicy(inv, namespace)?.budget;
}

/** A namespace's remediation budget, bounding every rule's restarts there together: its own, else its restart budget. */
export function namespaceRemediationBudget(inv: Inventory, namespace: string): HostPolicy['budget'] {
  const p = namespacePolicy(inv, namespace);
  return p?.remediation_budget ?? p?.budget;
}

export function parseInventory(text: string, source = 'OPS_INVENTORY_FILE'): Inventory {
  const result = inventorySchema.safeParse(parseYamlFile(text, source) ?? {});
  // Every problem at once, one line each, so an operator fixes the file in one round.
  if (!result.success) {
    throw new ConfigError(
      result.error.issues.map((issue) => ({
        variable: source,
        problem: `invalid at ${issue.path.join('.') || '(root)'}: ${issue.message}`,
      })),
    );
  }
  return result.data;
}

export function loadInventory(file: string | undefined): Inventory {
  if (!file) return emptyInventory;
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch {
    throw new ConfigError('OPS_INVENTORY_FILE', 'cannot be read');
  }
  return parseInventory(text);
}

export function hostNames(inv: Inventory): string[] {
  return Object.keys(inv.hosts).sort();
}

/** Own-property lookups only, so names like "__proto__" or "constructor" never hit Object.prototype. */
export function findHost(inv: Inventory, host: string): HostEntry | undefined {
  return Object.hasOwn(inv.hosts, host) ? inv.hosts[host] : undefined;
}

/** The inventory host whose namespace holds this Deployment among its own (a remediation's target). */
export function hostOfDeployment(inv: Inventory, namespace: string, deployment: string): string | undefined {
  return hostNames(inv).find((h) => inv.hosts[h]!.namespace === namespace && inv.hosts[h]!.deployments.includes(deployment));
}

export function findProject(inv: Inventory, project: string): ProjectEntry | undefined {
  return Object.hasOwn(inv.projects, project) ? inv.projects[project] : undefined;
}

/** Whether a deploy of the project may come this way (`deploy_from`); a project not in the inventory: only a push (its job is dead-lettered). */
export function deploysFrom(inv: Inventory, project: string, way: 'push' | 'ci'): boolean {
  const from = findProject(inv, project)?.deploy_from ?? 'push';
  return from === 'both' || from === way;
}
