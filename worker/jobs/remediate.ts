import { DelayedError } from 'bullmq';
import { createRemediation } from '../../src/remediation/engine.js';
import type { Active } from '../../src/remediation/store.js';
import type { RemediateData } from '../../src/shared/jobs.js';
import type { JobContext } from '../context.js';
import { recordEventResolving } from '../events.js';

/**
 * remediate: alert-driven remediation's steps in the worker (src/remediation/engine.ts): a check
 * once a rule's `for` passed, or a watch of a remediation under way, which moves itself back to
 * the delayed set between looks (BullMQ's documented way: the attempt does not count) and ends with
 * an Event on the Deployment (OpsgateRemediated, or OpsgateRemediationFailed as a Warning).
 */
type RemediateContext = Pick<JobContext, 'job' | 'token' | 'logger' | 'kubeConfig' | 'remediation'>;

export async function remediate(data: RemediateData, ctx: RemediateContext): Promise<{ step: string; done: true }> {
  const deps = ctx.remediation;
  if (!deps) throw new Error('this worker has no remediation rules (OPS_INVENTORY_FILE); not acting on the alert');
  const engine = createRemediation({ ...deps, onOutcome: (a, outcome, reason) => outcomeEvent(a, outcome, reason, data, ctx) });
  const next = await engine.step(data);
  if (next === undefined) return { step: data.step, done: true };
  if (!ctx.job.moveToDelayed || !ctx.token) throw new Error('the remediation cannot wait for its next look (no lock token); retried');
  await ctx.job.moveToDelayed(Date.now() + next, ctx.token);
  throw new DelayedError();
}

async function outcomeEvent(a: Active, outcome: string, reason: string, data: RemediateData, ctx: RemediateContext): Promise<void> {
  await recordEventResolving(
    ctx.kubeConfig,
    {
      namespace: a.namespace,
      regarding: { apiVersion: 'apps/v1', kind: 'Deployment', name: a.deployment, namespace: a.namespace },
      reason: outcome === 'remediated' ? 'OpsgateRemediated' : 'OpsgateRemediationFailed',
      action: 'Verify',
      type: outcome === 'remediated' ? 'Normal' : 'Warning',
      queueJobId: a.job_id ?? a.id,
      auditId: a.audit_id,
      requestedBy: data.requested_by,
      detail: `${outcome}: ${reason}`,
    },
    ctx.logger,
  );
}
