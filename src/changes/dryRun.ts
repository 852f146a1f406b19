import { DRY_RUN_JOB_OPTIONS, JOB, dryRunResultSchema, type DryRunData } from '../shared/jobs.js';
import type { Pipeline } from './deps.js';
import { kindOfChange, type DryRunAsk } from './kinds/index.js';
import type { DeployDryRun } from './kinds/deploy.js';
import type { RestartDryRun } from './kinds/restart.js';
import { planChange, type OverrideAsk } from './pipeline.js';
import type { KubernetesVerdict } from './dryRunView.js';
import type { Change, DeployTarget, RestartTarget } from './types.js';

export { deployDryRunSchema } from './kinds/deploy.js';
export { restartDryRunSchema } from './kinds/restart.js';

/**
 * Dry runs (POST /ops/restart?dry_run=true, a replay's `dry_run`): the guards' verdicts, read-only,
 * and whether the API server would admit the change. That the worker finds out: it sends its very
 * patch (or Job) with dryRun=All, so RBAC and admission run and nothing persists. The API holds
 * none of the worker's rights, and impersonating the worker would give it every one of them; so it
 * queues a one-attempt `dry_run` job and waits DRY_RUN_TIMEOUT_MS (one not taken is taken back).
 * Never throws for what the cluster says, only for a queue that is down (503).
 */
async function askWorker(g: Pipeline, data: DryRunData | DryRunAsk): Promise<KubernetesVerdict> {
  if (!g.probe) return { checked: false, reason: 'dry runs against the cluster are not configured in this process' };
  const timeoutMs = g.dryRunTimeoutMs ?? 10_000;
  // A registered kind's ask is not in the catalog's type; the dry_run job's schema (jobSchemaOf) parses it.
  const out = await g.probe.run({ name: JOB.dryRun, data: data as DryRunData, jobOptions: DRY_RUN_JOB_OPTIONS }, timeoutMs);
  const parsed = out.state === 'completed' ? dryRunResultSchema.safeParse(out.value) : undefined;
  const verdict: KubernetesVerdict =
    out.state === 'timeout'
      ? {
          checked: false,
          reason: `no worker answered within ${timeoutMs} ms (dry-run job ${out.jobId} taken back); the cluster was not asked`,
        }
      : out.state === 'failed'
        ? { checked: false, reason: `the worker could not ask the cluster: ${out.reason}` }
        : parsed?.success
          ? { checked: true, reason: null, ...parsed.data }
          : { checked: false, reason: 'the worker answered something unexpected' };
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

export const dryRunRestart = (g: Pipeline, change: Change & { target: RestartTarget }, ask?: OverrideAsk): Promise<RestartDryRun> =>
  dryRunChange(g, change, ask) as Promise<RestartDryRun>;

export const dryRunDeploy = (g: Pipeline, change: Change & { target: DeployTarget }): Promise<DeployDryRun> =>
  dryRunChange(g, change) as Promise<DeployDryRun>;
