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
 * for the running one of such a project; the running one's Kubernetes Job is deleted, with its
 * pods, and that deploy ends `cancelled`, naming the newer one.
 *
 * Who does what, so that two workers and retried attempts agree:
 * - the newer deploy's worker, when its turn answers `wait` (worker/deployTurn.ts), marks the
 *   running deploy cancelled in Redis (src/changes/deployOrder/cancel.ts: the first newer deploy to
 *   ask is named and stays named) and then deletes its Job with foreground propagation. A Job that ended already is
 *   left alone (its deploy ends with its own outcome); a Job not created yet is left to the
 *   running deploy. The deletion is repeated each time the newer deploy wakes and still waits:
 *   a delete that failed is tried again, one that succeeded answers 404 or finds it going;
 * - the running deploy's worker (worker/jobs/deploy.ts) reads the mark before it creates its Job
 *   (a cancelled deploy's next attempt never creates it again) and at each poll of its Job while
 *   it has not ended: marked, it deletes its own Job too (the newer deploy may have found none
 *   yet) and waits until the Job is gone, pods included, then ends `cancelled` (a success of the
 *   queue job: no retry, no dead letter). The group's turn ends with it and the newer deploy runs.
 * With waitForCompletion false a deploy holds its group's turn only while its Job is created, so
 * there is nothing to cancel: the flag is read only with waitForCompletion.
 */

/**
 * The newer deploy `by`, waiting for the running deploy `runningId` of its group: cancels it when
 * the running deploy's project has cancel_in_progress. Never throws: a failure is logged and the
 * newer deploy waits as it would without the flag, trying again when it next wakes.
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
