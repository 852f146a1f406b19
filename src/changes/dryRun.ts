import { DRY_RUN_JOB_OPTIONS, JOB, dryRunResultSchema, type DryRunData } from '../shared/jobs.js';
import type { Pipeline } from './deps.js';
import { kindOfChange, type DryRunAsk } from './kinds/index.js';
import type { DeployDryRun } from './kinds/deploy.js';
import type { RestartDryRun } from './kinds/restart.js';
import { planChange, type OverrideAsk } from './pipeline.js';
import type { KubernetesVerdict } from './dryRunView.js';
import type { Change, DeployTarget, RestartTarget } from './types.js';

export { deployDryRunSchema, type DeployDryRun } from './kinds/deploy.js';
export { restartDryRunSchema, type RestartDryRun } from './kinds/restart.js';
export { kubernetesVerdictSchema, type KubernetesVerdict } from './dryRunView.js';

/**
 * Dry runs: what a change (a restart: POST /ops/restart?dry_run=true; a deploy: a replay with
 * `dry_run` in its body) would do, with nothing queued as work, nothing taken from a budget, nothing patched.
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
 *
 * Each kind (src/changes/kinds/) renders its own answer from the plan and the worker's verdict, and
 * says what the worker rehearses.
 */
/** Asks the worker; never throws for what the cluster says, only for a queue that is down (503). */
async function askWorker(g: Pipeline, data: DryRunData | DryRunAsk): Promise<KubernetesVerdict> {
  if (!g.probe) return { checked: false, reason: 'dry runs against the cluster are not configured in this process' };
  const timeoutMs = g.dryRunTimeoutMs ?? 10_000;
  // A registered kind's ask is not in the catalog's type; the dry_run job's schema (jobSchemaOf) parses it.
  const out = await g.probe.run({ name: JOB.dryRun, data: data as DryRunData, jobOptions: DRY_RUN_JOB_OPTIONS }, timeoutMs);
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

/** A change's dry run: the pipeline's plan of the same change, and the worker's server-side dry run, as its kind answers them. */
export async function dryRunChange(g: Pipeline, change: Change, ask?: OverrideAsk): Promise<unknown> {
  const kind = kindOfChange(change);
  const p = await planChange(g, change, ask, true);
  const kubernetes = await askWorker(g, kind.dryRun.data(p.change));
  return kind.dryRun.answer(p, ask !== undefined, kubernetes);
}

/** A restart's dry run (POST /ops/restart?dry_run=true). */
export const dryRunRestart = (g: Pipeline, change: Change & { target: RestartTarget }, ask?: OverrideAsk): Promise<RestartDryRun> =>
  dryRunChange(g, change, ask) as Promise<RestartDryRun>;

/** A deploy's dry run (a delivery's replay). */
export const dryRunDeploy = (g: Pipeline, change: Change & { target: DeployTarget }): Promise<DeployDryRun> =>
  dryRunChange(g, change) as Promise<DeployDryRun>;
