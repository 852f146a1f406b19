import { describePool } from './budget/pools.js';
import { z } from 'zod';
import { gateReasonSchema, describeReasons, type GateVerdict } from './gate.js';
import { DRY_RUN_JOB_OPTIONS, JOB, dryRunResultSchema, type DryRunData } from '../shared/jobs.js';
import { formatDuration } from '../shared/policy.js';
import { describeBudget, type Guards } from './guards.js';
import { planChange, type OverrideAsk } from './pipeline.js';
import type { Change, Decision, DeployTarget, RestartTarget } from './types.js';

/**
 * Dry runs: what a restart (POST /ops/restart?dry_run=true) or a deploy replay (`dry_run` in its
 * body) would do, with nothing queued as work, nothing taken from a budget, nothing patched.
 *
 * The guards' verdicts are the API's own (the same functions the real request runs, read-only).
 * Whether the Kubernetes API server would admit the change is the worker's to find out: the API
 * holds none of the worker's rights (its ServiceAccount may only read the inventory's
 * Deployments), so it queues a `dry_run` job and waits for it (DRY_RUN_TIMEOUT_MS). The worker
 * reads the object and sends the very patch (or Job) it would send, with dryRun=All: the API
 * server runs authentication, RBAC and admission (ValidatingAdmissionPolicies, webhooks) and
 * persists nothing, so the object's resourceVersion does not move. The alternative, the API
 * impersonating the worker's ServiceAccount, would give the API the `impersonate` verb and with
 * it every right of the worker: a dry run is not worth that. A dry-run job is one attempt, kept an
 * hour; one no worker took in time is taken back, and the answer says the cluster was not asked.
 */
export const kubernetesVerdictSchema = z.object({
  checked: z
    .boolean()
    .describe(
      'false: the API server was not asked (no worker answered within DRY_RUN_TIMEOUT_MS, or the worker has no cluster); reason says why',
    ),
  reason: z.string().nullable(),
  ...dryRunResultSchema.partial().shape,
});
export type KubernetesVerdict = z.infer<typeof kubernetesVerdictSchema>;

const gateViewSchema = z.object({
  open: z.boolean().describe('no freeze covers the change and a change window is open (or there are none)'),
  reasons: z.array(gateReasonSchema),
  until: z.string().nullable().describe('closed: when it is expected to open'),
  override: z.boolean().describe('override=true was given (a restart goes through a closed gate)'),
});

const approvalVerdictSchema = z
  .object({ required: z.number().int(), ttl: z.string() })
  .nullable()
  .describe('the approval the policy asks for; null: none');

export const restartDryRunSchema = z.object({
  dry_run: z.literal(true),
  change: z.literal('restart'),
  host: z.string(),
  service: z.string(),
  namespace: z.string(),
  would: z
    .enum(['queue', 'join', 'pending_approval', 'refuse', 'over_budget'])
    .describe('what the same request without dry_run would do now'),
  detail: z.string(),
  verdicts: z.object({
    gate: gateViewSchema,
    approval: approvalVerdictSchema,
    coalescing: z.object({
      joins: z.string().nullable().describe('the restart of this Deployment still waiting or rolling out, which it would join'),
    }),
    budget: z
      .object({
        restarts: z.number().int(),
        per: z.string(),
        used: z.number().int(),
        remaining: z.number().int(),
        retry_after_s: z.number().int().describe('0 while there is room'),
      })
      .nullable(),
  }),
  kubernetes: kubernetesVerdictSchema,
});
export type RestartDryRun = z.infer<typeof restartDryRunSchema>;

export const deployDryRunSchema = z.object({
  dry_run: z.literal(true),
  change: z.literal('deploy'),
  project: z.string(),
  ref: z.string(),
  namespace: z.string(),
  event_id: z.string(),
  would: z.enum(['queue', 'duplicate', 'pending_approval', 'hold']).describe('what the same replay without dry_run would do now'),
  detail: z.string(),
  verdicts: z.object({
    gate: gateViewSchema,
    approval: approvalVerdictSchema,
    duplicate: z.object({ job_id: z.string().nullable().describe('the job that already stands for this event') }),
  }),
  kubernetes: kubernetesVerdictSchema,
});
export type DeployDryRun = z.infer<typeof deployDryRunSchema>;

function gateView(v: GateVerdict, override = false): z.infer<typeof gateViewSchema> {
  return { open: !v.blocked, reasons: v.reasons, until: v.until !== undefined ? new Date(v.until).toISOString() : null, override };
}

/** Asks the worker; never throws for what the cluster says, only for a queue that is down (503). */
async function askWorker(g: Guards, data: DryRunData): Promise<KubernetesVerdict> {
  if (!g.probe) return { checked: false, reason: 'dry runs against the cluster are not configured in this process' };
  const timeoutMs = g.dryRunTimeoutMs ?? 10_000;
  const out = await g.probe.run({ name: JOB.dryRun, data, jobOptions: DRY_RUN_JOB_OPTIONS }, timeoutMs);
  let verdict: KubernetesVerdict;
  if (out.state === 'timeout') {
    verdict = {
      checked: false,
      reason: `no worker answered within ${timeoutMs} ms (dry-run job ${out.jobId} taken back); the cluster was not asked`,
    };
  } else if (out.state === 'failed') {
    verdict = { checked: false, reason: `the worker could not ask the cluster: ${out.reason}` };
  } else {
    const parsed = dryRunResultSchema.safeParse(out.value);
    verdict = parsed.success
      ? { checked: true, reason: null, ...parsed.data }
      : { checked: false, reason: 'the worker answered something unexpected' };
  }
  g.metrics?.dryRuns.inc({ change: data.change, verdict: !verdict.checked ? 'unknown' : verdict.admitted ? 'admitted' : 'refused' });
  return verdict;
}

const WOULD: Record<Decision['kind'], RestartDryRun['would']> = {
  refuse: 'refuse',
  pending_approval: 'pending_approval',
  join: 'join',
  over_budget: 'over_budget',
  queue: 'queue',
  hold: 'refuse',
};

/** A restart's dry run: the pipeline's plan of the same change, and the worker's server-side dry run. */
export async function dryRunRestart(g: Guards, change: Change & { target: RestartTarget }, ask?: OverrideAsk): Promise<RestartDryRun> {
  const t = change.target;
  const p = await planChange(g, change, ask, true);
  const { facts, decision } = p;
  let budget: RestartDryRun['verdicts']['budget'] = null;
  // The answer shows the budget a person's restart draws on: the first (a person's has one).
  const first = facts.budgets?.[0];
  if (first) {
    const use = facts.budgetUse?.[0] ?? { used: 0, retryMs: 0 };
    budget = {
      restarts: first.limit.restarts,
      per: formatDuration(first.limit.per),
      used: use.used,
      remaining: Math.max(0, first.limit.restarts - use.used),
      retry_after_s: Math.ceil(use.retryMs / 1000),
    };
  }
  let detail: string;
  switch (decision.kind) {
    case 'refuse':
    case 'hold':
      detail = `refused: ${describeReasons(decision.reasons)}`;
      break;
    case 'pending_approval':
      detail = `waits for ${decision.required} approval(s) from other people within ${formatDuration(decision.ttl)}`;
      break;
    case 'join':
      detail = `joins restart ${decision.jobId}, still waiting or rolling out`;
      break;
    case 'over_budget':
      detail = `refused: ${describePool(decision.pool)} (${describeBudget(decision.pool.limit)}) is spent for ${Math.ceil(decision.retryMs / 1000)} s`;
      break;
    case 'queue':
      detail = decision.overridden.length > 0 ? `queued despite the gate (override): ${describeReasons(decision.overridden)}` : 'queued';
      break;
  }
  const kubernetes = await askWorker(g, {
    change: 'restart',
    host: t.host,
    service: t.service,
    audit_id: change.auditId,
    requested_by: change.requester.principal,
  });
  return {
    dry_run: true,
    change: 'restart',
    host: t.host,
    service: t.service,
    namespace: t.namespace,
    would: WOULD[decision.kind],
    detail,
    verdicts: {
      gate: gateView(facts.gate, ask !== undefined),
      approval: facts.approval ? { required: facts.approval.required, ttl: formatDuration(facts.approval.ttl) } : null,
      coalescing: { joins: facts.holder ?? null },
      budget,
    },
    kubernetes,
  };
}

/** A deploy's dry run (a delivery's replay): the pipeline's plan of the same change, and the worker's server-side dry run. */
export async function dryRunDeploy(g: Guards, change: Change & { target: DeployTarget }): Promise<DeployDryRun> {
  const t = change.target;
  const { facts, decision } = await planChange(g, change, undefined, true);
  let would: DeployDryRun['would'];
  let detail: string;
  switch (decision.kind) {
    case 'join':
      would = 'duplicate';
      detail = `a duplicate of job ${decision.jobId}: nothing new would be queued`;
      break;
    case 'pending_approval':
      would = 'pending_approval';
      detail = `waits for ${decision.required} approval(s) within ${formatDuration(decision.ttl)}`;
      break;
    case 'hold':
      would = 'hold';
      detail = `held until ${new Date(decision.until).toISOString()}: ${describeReasons(decision.reasons)}`;
      break;
    default:
      would = 'queue';
      detail = 'queued';
  }
  const kubernetes = await askWorker(g, {
    change: 'deploy',
    project: t.project,
    ref: t.ref,
    ...(t.sha ? { sha: t.sha } : {}),
    audit_id: change.auditId,
    requested_by: change.requester.principal,
  });
  return {
    dry_run: true,
    change: 'deploy',
    project: t.project,
    ref: t.ref,
    namespace: t.namespace,
    event_id: t.eventId ?? '',
    would,
    detail,
    verdicts: {
      gate: gateView(facts.gate),
      approval: facts.approval ? { required: facts.approval.required, ttl: formatDuration(facts.approval.ttl) } : null,
      duplicate: { job_id: facts.duplicateOf ?? null },
    },
    kubernetes,
  };
}
