import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { ConfigError } from './errors.js';
import { dnsLabel, dnsSubdomain, STATUS_SENDERS } from './jobs.js';
import { hostPolicySchema, mergePolicy, projectPolicySchema, type HostPolicy, type ProjectPolicy } from './policy.js';
import { pinnedValue, remediationRuleSchema } from './remediations.js';

/**
 * The inventory (OPS_INVENTORY_FILE, YAML or JSON) is the allow-list of what opsgate may touch:
 * - hosts: host name -> Kubernetes namespace + the Deployments ("services") that may be restarted;
 * - projects: source-control project -> how its deploy Job is built (image, command, the
 *   restricted ServiceAccount it runs as). Job arguments are never taken from a request: the
 *   project and ref reach the Job only as environment variables.
 * - policy (top level, per host, per project): the guards of a change (src/shared/policy.ts):
 *   approval, change windows, a restart budget per namespace.
 * - remediations: rules turning firing Alertmanager alerts into restarts (src/shared/remediations.ts);
 *   a rule reaches only the Deployments of the hosts above.
 */
const hostSchema = z.object({
  namespace: dnsLabel,
  deployments: z.array(dnsSubdomain).min(1),
  policy: hostPolicySchema.optional(),
});

/** The ways a project's deploys may come in. */
const DEPLOY_FROM = ['push', 'ci', 'both'] as const;

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
  /**
   * run_deploy_pipeline waits for the deploy Job to succeed or fail and reports that outcome
   * (needs `get` on the project namespace's Jobs, which the chart grants); false: the queue job
   * ends once the Job is created.
   */
  waitForCompletion: z.boolean().default(true),
  /**
   * Where the project's deploys come from: `push` (a push webhook to the deploy branch; default),
   * `ci` (POST /ops/deploys from its CI, bound to the commit: a push does not deploy it), or `both`.
   */
  deploy_from: z.enum(DEPLOY_FROM).default('push'),
  /**
   * Deploys of one concurrency group run one at a time, in the order opsgate accepted them
   * (src/changes/deployOrder/): `group` is a template over `{project}` and `{ref}`, default
   * `{project}:{ref}`; projects naming the same group share it.
   */
  concurrency: z
    .object({
      group: z
        .string()
        .min(1)
        .max(200)
        .regex(/^(?:[^{}]|\{project\}|\{ref\})+$/, 'may hold only {project} and {ref} in braces'),
    })
    .optional(),
  /**
   * A newer deploy of the group, come to its turn while one of this project's deploys runs, deletes
   * that running deploy's Kubernetes Job (with its pods) instead of waiting for it: the running one
   * ends `cancelled` (worker/deployCancel.ts). Needs `delete` on the namespace's Jobs, which the
   * chart grants only to namespaces of projects that ask for it. Off unless set.
   */
  cancel_in_progress: z.boolean().optional(),
  policy: projectPolicySchema.optional(),
  /**
   * The environment a deploy's state is told under on the host of its commit (a GitHub
   * deployment's environment, the context of a commit status); default: the deploy's ref.
   */
  environment: z.string().min(1).max(255).optional(),
  /** GitHub: `deployment` (the Deployments API; default) or `commit` (commit statuses). */
  status: z.enum(['deployment', 'commit']).optional(),
  /**
   * The host of the project's commits, for deploys whose sender does not say (a CI deploy, a push
   * through /webhook/generic): its API is told their states. A push from a host's own webhook
   * is told to that host.
   */
  sender: z.enum(STATUS_SENDERS).optional(),
});

export const inventorySchema = z
  .object({
    /** The default policy of every host and project (each may replace its fields). */
    policy: hostPolicySchema.optional(),
    hosts: z.record(z.string().min(1).max(253), hostSchema).default({}),
    projects: z.record(z.string().min(1).max(255), projectSchema).default({}),
    remediations: z.array(remediationRuleSchema).max(200).default([]),
  })
  .superRefine((inv, ctx) => {
    // A rule is named once (its requester, its metrics and its Redis records carry the name), and
    // a namespace or Deployment its match pins must be one the inventory lets opsgate restart.
    const names = new Set<string>();
    inv.remediations.forEach((rule, i) => {
      if (names.has(rule.name))
        ctx.addIssue({ code: 'custom', path: ['remediations', i, 'name'], message: `repeats the rule name ${rule.name}` });
      names.add(rule.name);
      if (rule.target.namespace === rule.target.deployment) {
        ctx.addIssue({
          code: 'custom',
          path: ['remediations', i, 'target'],
          message: 'namespace and deployment must be two different labels',
        });
      }
      rule.targets.forEach((t, j) => {
        const slash = t.indexOf('/');
        const known =
          slash < 0
            ? Object.hasOwn(inv.hosts, t)
            : Object.values(inv.hosts).some((h) => h.namespace === t.slice(0, slash) && h.deployments.includes(t.slice(slash + 1)));
        if (!known) {
          ctx.addIssue({
            code: 'custom',
            path: ['remediations', i, 'targets', j],
            message:
              slash < 0
                ? `names host ${JSON.stringify(t)}, which the inventory lacks`
                : `names Deployment ${t}, which no inventory host lists`,
          });
        }
      });
      const ns = pinnedValue(rule, rule.target.namespace);
      const dep = pinnedValue(rule, rule.target.deployment);
      const hosts = Object.values(inv.hosts).filter((h) => ns === undefined || h.namespace === ns);
      if (ns !== undefined && hosts.length === 0) {
        ctx.addIssue({
          code: 'custom',
          path: ['remediations', i, 'match', 'labels'],
          message: `pins namespace ${ns}, which no inventory host has`,
        });
      } else if (dep !== undefined && !hosts.some((h) => h.deployments.includes(dep))) {
        ctx.addIssue({
          code: 'custom',
          path: ['remediations', i, 'match', 'labels'],
          message: `pins Deployment ${dep}, which no inventory host${ns !== undefined ? ` of namespace ${ns}` : ''} lists`,
        });
      }
    });
    // A restart budget (people's, and remediation's) counts per namespace: hosts sharing one must agree on it.
    for (const field of ['budget', 'remediation_budget'] as const) {
      const seen = new Map<string, { host: string; budget: string }>();
      for (const [host, h] of Object.entries(inv.hosts)) {
        const budget = JSON.stringify(mergePolicy(inv.policy, h.policy)[field] ?? null);
        const other = seen.get(h.namespace);
        if (other && other.budget !== budget) {
          ctx.addIssue({
            code: 'custom',
            path: ['hosts', host, 'policy', field],
            message: `differs from the ${field} of host ${JSON.stringify(other.host)} in the same namespace ${h.namespace} (a restart budget counts per namespace)`,
          });
        }
        if (!other) seen.set(h.namespace, { host, budget });
      }
    }
  });

export type Inventory = z.infer<typeof inventorySchema>;
type HostEntry = z.infer<typeof hostSchema>;
export type ProjectEntry = z.infer<typeof projectSchema>;

const emptyInventory: Inventory = { hosts: {}, projects: {}, remediations: [] };

/** The effective policy of a host's restarts (the inventory's default, replaced field by field by the host's own). */
export function hostPolicy(inv: Inventory, host: string): HostPolicy {
  const h = findHost(inv, host);
  return mergePolicy(inv.policy, h?.policy);
}

/** The effective policy of a project's deploys (a budget applies to restarts only). */
export function projectPolicy(inv: Inventory, project: string): ProjectPolicy {
  const { budget: _restartsOnly, ...defaults } = inv.policy ?? {};
  return mergePolicy<ProjectPolicy>(defaults, findProject(inv, project)?.policy);
}

/** A namespace's restart budget (the same for every host in it; see the schema's check). */
export function namespaceBudget(inv: Inventory, namespace: string): HostPolicy['budget'] {
  for (const [host, h] of Object.entries(inv.hosts)) if (h.namespace === namespace) return hostPolicy(inv, host).budget;
  return inv.policy?.budget;
}

/** A namespace's remediation budget, bounding every rule's restarts there together: its own, else its restart budget. */
export function namespaceRemediationBudget(inv: Inventory, namespace: string): HostPolicy['budget'] {
  for (const [host, h] of Object.entries(inv.hosts)) {
    if (h.namespace !== namespace) continue;
    const p = hostPolicy(inv, host);
    return p.remediation_budget ?? p.budget;
  }
  return inv.policy?.remediation_budget ?? inv.policy?.budget;
}

export function parseInventory(text: string, source = 'OPS_INVENTORY_FILE'): Inventory {
  let raw: unknown;
  try {
    raw = parseYaml(text); // YAML is a superset of JSON
  } catch {
    throw new ConfigError(source, 'is not valid YAML or JSON');
  }
  const result = inventorySchema.safeParse(raw ?? {});
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
