import { BatchV1Api } from '@kubernetes/client-node';
import { markCancelled } from '../src/changes/deployOrder/cancel.js';
import { findProject } from '../src/shared/inventory.js';
import { deployKind } from '../src/changes/kinds/deploy.js';
import { kindOfJob } from '../src/changes/kinds/index.js';
import type { RunDeployPipelineData } from '../src/shared/jobs.js';
import type { JobContext } from './context.js';
import { apiStatus, k8sFailure, resolveKubeConfig } from './k8s.js';
import { deleteDeployJob, deployJobName, jobEnd } from './jobs/deploy.js';

/**
 * cancel_in_progress: a newer deploy of a group marks the running one cancelled in Redis (the first
 * to ask stays named) and deletes its Job, pods included, each time it wakes and still waits. A Job
 * not created yet is left to the running deploy (worker/jobs/deploy.ts reads the mark). Only deploys
 * with waitForCompletion hold the turn while their Job runs. Never throws: a failure is logged.
 */
export async function cancelRunning(
  ctx: Pick<JobContext, 'inventory' | 'redis' | 'kubeConfig' | 'logger' | 'readJob'>,
  runningId: string,
  by: string,
): Promise<void> {
  try {
    const running = await ctx.readJob?.(runningId);
    if (!running || kindOfJob(running.name) !== deployKind) return;
    const d = running.data as RunDeployPipelineData;
    const entry = findProject(ctx.inventory, d.project);
    if (!entry?.cancel_in_progress || !entry.waitForCompletion) return;
    await markCancelled(ctx.redis, runningId, by);
    const name = deployJobName(runningId, d.audit_id, d.project);
    const batch = (await resolveKubeConfig(ctx.kubeConfig)).makeApiClient(BatchV1Api);
    const job = await batch.readNamespacedJob({ name, namespace: entry.namespace }).catch((err: unknown) => {
      if (apiStatus(err) === 404) return undefined; // not created yet: the running deploy reads the mark itself
      throw k8sFailure(err, `Job ${entry.namespace}/${name}`, 'read');
    });
    if (!job || jobEnd(job).done || job.metadata?.deletionTimestamp) return;
    await deleteDeployJob(batch, entry.namespace, name);
    ctx.logger.info('cancelled the running deploy of its group (cancel_in_progress): its Job deleted', {
      running: runningId,
      k8s_job: name,
      namespace: entry.namespace,
    });
  } catch (err) {
    ctx.logger.warn('could not cancel the running deploy of its group; waiting for it', { running: runningId, err });
  }
}
