import { z } from 'zod';
import type { ConfigProblem } from './errors.js';
import { approvalPolicySchema, budgetPolicySchema, durationSchema } from './policy.js';

/**
 * Alert-driven remediation rules, the inventory's `remediations:` (docs/remediation.md): a firing
 * alert that matches a rule becomes a restart of the Deployment its labels name, through the change
 * pipeline (src/remediation/). Durations are written like the policy's ("90s", "10m", "1h").
 */

/** A duration that may be zero ("0s", 0): `for` of an alert that acts at once. */
const durationOrZero = (max: number, what: string) => durationSchema(max, what, true);

const positiveDuration = (max: number, what: string) => durationOrZero(max, what).refine((s) => s > 0, `${what} must be longer than 0s`);

/** A Prometheus label name. */
const labelName = z.string().regex(/^[a-zA-Z_][a-zA-Z0-9_]*$/, 'must be a label name ([a-zA-Z_][a-zA-Z0-9_]*)');

const REGEX_PREFIX = '=~';

/** A label matcher as Alertmanager writes one: a value to equal, or `=~<regex>` (anchored, as Alertmanager's). */
const matcherValue = z
  .string()
  .max(1024)
  .superRefine((v, ctx) => {
    if (!v.startsWith(REGEX_PREFIX)) return;
    try {
      new RegExp(`^(?:${v.slice(REGEX_PREFIX.length)})$`);
    } catch {
      ctx.addIssue({ code: 'custom', message: 'is not a valid regular expression after "=~"' });
    }
  });

const DAY = 86400;

export const remediationRuleSchema = z.strictObject({
  name: z
    .string()
    .regex(
      /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/,
      'must be a DNS-1123 label (it names the requester remediation:<name> and metric labels)',
    ),
  match: z.strictObject({
    alertname: z.string().min(1).max(1024),
    labels: z.record(labelName, matcherValue).default({}),
  }),
  action: z.literal('restart').default('restart'),
  target: z
    .strictObject({
      namespace: labelName.default('namespace'),
      deployment: labelName.default('deployment'),
    })
    .default({ namespace: 'namespace', deployment: 'deployment' }),
  trigger: z
    .strictObject({
      /** Act once the alert has been firing this long, from its startsAt. */
      for: durationOrZero(DAY, 'trigger.for').default(0),
      /** ...and only after this many distinct firings (startsAt) of the alert within `within`. */
      episodes: z.number().int().min(1).max(100).default(1),
      within: positiveDuration(7 * DAY, 'trigger.within').default(3600),
    })
    .default({ for: 0, episodes: 1, within: 3600 }),
  /** No second remediation of the same Deployment by this rule within it (shared by every replica). */
  cooldown: positiveDuration(7 * DAY, 'cooldown').default(900),
  /** After this many remediations of a Deployment within escalation_window, stop and page. */
  escalate_after: z.number().int().min(1).max(100).default(3),
  escalation_window: positiveDuration(7 * DAY, 'escalation_window').default(7200),
  /** How long after the rollout the alert may take to resolve. */
  verify: positiveDuration(DAY, 'verify').default(600),
  /** How long the silence stays after the work ends. */
  settle: positiveDuration(DAY, 'settle').default(300),
  /** Inventory hosts or namespace/Deployment pairs: an alert naming anything else restarts nothing. */
  targets: z
    .array(
      z
        .string()
        .min(1)
        .max(317)
        .regex(/^[^\s/]+(\/[^\s/]+)?$/, 'must be an inventory host or a namespace/Deployment pair'),
      {
        error: (issue) =>
          issue.input === undefined
            ? 'is required: list what the rule may restart (inventory hosts, namespace/Deployment pairs)'
            : 'must be a list of inventory hosts and namespace/Deployment pairs',
      },
    )
    .min(1, 'must list at least one inventory host or namespace/Deployment pair')
    .max(500),
  /** Where a firing is confirmed and timed (PROMETHEUS_URL's ALERTS, or Alertmanager's API): a notification alone never acts. */
  confirm: z.enum(['prometheus', 'alertmanager']).default('prometheus'),
  /** The rule's own restart budget, apart from the namespace budget of people's restarts. */
  budget: budgetPolicySchema.default({ restarts: 3, per: 3600 }),
  mode: z.enum(['act', 'dry-run']).default('act'),
  /** Keep an Alertmanager silence of this alert while acting (needs ALERTMANAGER_URL). */
  silence: z.boolean().default(false),
  approval: approvalPolicySchema.optional(),
});

export type RemediationRule = z.infer<typeof remediationRuleSchema>;

/** Whether a rule's `targets` name this Deployment (by its host, or by namespace/Deployment). */
export function targetAllowed(rule: Pick<RemediationRule, 'targets'>, host: string, namespace: string, deployment: string): boolean {
  return rule.targets.some((t) => t === host || t === `${namespace}/${deployment}`);
}

/** The rule a principal remediation:<rule> names; undefined for anyone else's. */
const REMEDIATION_PRINCIPAL_PREFIX = 'remediation:';
export function ruleOfPrincipal(principal: string): string | undefined {
  return principal.startsWith(REMEDIATION_PRINCIPAL_PREFIX) ? principal.slice(REMEDIATION_PRINCIPAL_PREFIX.length) : undefined;
}

/** Whether a label value satisfies a matcher value (equality, or an anchored `=~regex`). */
function matchesValue(matcher: string, value: string | undefined): boolean {
  if (matcher.startsWith(REGEX_PREFIX)) return new RegExp(`^(?:${matcher.slice(REGEX_PREFIX.length)})$`).test(value ?? '');
  // Alertmanager treats a missing label as the empty string.
  return (value ?? '') === matcher;
}

/** Whether an alert's labels match a rule's `match`. */
export function matchesRule(rule: Pick<RemediationRule, 'match'>, labels: Readonly<Record<string, string>>): boolean {
  if ((labels.alertname ?? '') !== rule.match.alertname) return false;
  return Object.entries(rule.match.labels).every(([k, v]) => matchesValue(v, labels[k]));
}

/** The value a rule's equality matcher fixes for a label (undefined: not fixed, or a regex). */
export function pinnedValue(rule: Pick<RemediationRule, 'match'>, label: string): string | undefined {
  if (label === 'alertname') return rule.match.alertname;
  const v = Object.hasOwn(rule.match.labels, label) ? rule.match.labels[label] : undefined;
  return v === undefined || v.startsWith(REGEX_PREFIX) ? undefined : v;
}

/** What a process can confirm alerts with: PROMETHEUS_URL, ALERTMANAGER_URL with credentials of its API. */
export interface ConfirmSources {
  prometheus: boolean;
  alertmanagerAuthenticated: boolean;
}

/**
 * Why a process may not start with these rules: anyone can post a firing alert, an `act` rule cannot
 * confirm its alerts, or silences have no Alertmanager. Each names the variable and rules, never a value.
 */
export function remediationStartProblems(
  rules: readonly RemediationRule[],
  opts: { alertsAuthenticated?: boolean; alertmanagerUrl?: string | undefined; confirm: ConfirmSources },
): ConfigProblem[] {
  const out: ConfigProblem[] = [];
  if (rules.length === 0) return out;
  if (opts.alertsAuthenticated === false) {
    out.push({
      variable: 'ALERTS_WEBHOOK_TOKEN',
      problem: `is not set and no client certificate is asked for (TLS_CLIENT_CA_FILE), but the inventory has remediation rules (${rules.map((r) => r.name).join(', ')}): anyone could post a firing alert that restarts a Deployment; set the token or TLS_CLIENT_CA_FILE`,
    });
  }
  const acting = rules.filter((r) => r.mode === 'act');
  const byPrometheus = acting.filter((r) => r.confirm === 'prometheus' && !opts.confirm.prometheus);
  if (byPrometheus.length > 0) {
    out.push({
      variable: 'PROMETHEUS_URL',
      problem: `is not set, but remediation rules act on alerts confirmed by Prometheus (${byPrometheus.map((r) => r.name).join(', ')}): set PROMETHEUS_URL (Prometheus or a server answering its query API, such as Thanos Query) so only alerts its rules fire act; or, for alerts born elsewhere, give the rule confirm: alertmanager with ALERTMANAGER_URL and credentials of its API (ALERTMANAGER_BEARER_TOKEN, ALERTMANAGER_BASIC_AUTH_USER/PASSWORD or ALERTMANAGER_TLS_CERT_FILE); or mode: dry-run`,
    });
  }
  const byAlertmanager = acting.filter((r) => r.confirm === 'alertmanager' && !opts.confirm.alertmanagerAuthenticated);
  if (byAlertmanager.length > 0) {
    out.push({
      variable: 'ALERTMANAGER_URL',
      problem: `has no credentials of its API (or is not set), but remediation rules confirm their alerts with Alertmanager (${byAlertmanager.map((r) => r.name).join(', ')}): anyone who reaches its API could post an alert that acts; set ALERTMANAGER_URL with ALERTMANAGER_BEARER_TOKEN, ALERTMANAGER_BASIC_AUTH_USER/PASSWORD or ALERTMANAGER_TLS_CERT_FILE (Alertmanager's --web.config.file asking for them), or confirm: prometheus with PROMETHEUS_URL; or mode: dry-run`,
    });
  }
  const silencing = rules.filter((r) => r.silence);
  if (silencing.length > 0 && !opts.alertmanagerUrl) {
    out.push({
      variable: 'ALERTMANAGER_URL',
      problem: `is not set, but remediation rules ask for a silence while they act (${silencing.map((r) => r.name).join(', ')}): set it, or silence: false`,
    });
  }
  return out;
}
