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
 * cancel_in_progress (a project's flag in the inventory): a newer deploy of a group does not wait
 * for the running one; it marks that deploy cancelled in Redis (src/changes/deployOrder/cancel.ts:
 * the first newer deploy to ask stays named) and deletes its Kubernetes Job, pods included, each
 * time it wakes and still waits (a delete that failed is tried again). A Job that ended is left
 * alone; one not created yet is left to the running deploy, whose worker (worker/jobs/deploy.ts)
 * reads the mark before creating its Job and at each poll, deletes it too, and ends `cancelled`.
 * Only deploys with waitForCompletion hold their group's turn while their Job runs, so only they
 * are cancelled. Never throws: a failure is logged and the newer deploy waits as without the flag.
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
    let job;
    try {
      job = await batch.readNamespacedJob({ name, namespace: entry.namespace });
    } catch (err) {
      if (apiStatus(err) === 404) return; // not created yet: the running deploy reads the mark itself
      throw k8sFailure(err, `Job ${entry.namespace}/${name}`, 'read');
    }
    if (jobEnd(job).done || job.metadata?.deletionTimestamp) return;
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
