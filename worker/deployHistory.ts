import type { Redis } from 'ioredis';
import { createDeployHistory, type DeployHistory, type DeployOrigin, type DeployStep } from '../src/changes/deployOrder/history.js';
import { concurrencyGroup } from '../src/changes/deployOrder/store.js';
import type { ChangeJob } from '../src/changes/wake.js';
import { deployKind } from '../src/changes/kinds/deploy.js';
import { kindOf } from '../src/changes/kinds/index.js';
import type { RunDeployPipelineData } from '../src/shared/jobs.js';
import type { JobContext } from './context.js';
import { statusReport } from './commitStatus.js';
import { acceptanceOf } from './deployTurn.js';
import { deployJobName } from './jobs/deploy.js';

const stores = new WeakMap<Redis, DeployHistory>();

/** The store on the worker's connection, one per connection. */
function historyOf(ctx: Pick<JobContext, 'redis' | 'config'>): DeployHistory {
  let h = stores.get(ctx.redis);
  if (!h) stores.set(ctx.redis, (h = createDeployHistory(ctx.redis, ctx.config.DEPLOY_HISTORY_KEPT)));
  return h;
}

/** The origin the job's data tells, for an entry the worker writes first (the API's write names it where it knows better). */
function originOf(d: RunDeployPipelineData): DeployOrigin {
  if (d.rollback) return 'rollback';
  if (d.approval_id) return 'approval';
  if (d.event_id?.startsWith('ci:')) return 'ci';
  return 'push';
}

/**
 * The worker's steps of a deploy in its history (its first handling of a push's job writes that push's
 * first entry), each also told to the host of its commit. A failed write is logged: the history is a record,
 * not the deploy. The steps only the API records (a pending approval, a rejection) are not told: no API path pays for them.
 */
export function deployRecorder(c: ChangeJob, ctx: JobContext) {
  if (kindOf(c.name) !== deployKind) return undefined;
  const d = c.data as unknown as RunDeployPipelineData;
  const id = String(ctx.job.id);
  const first: DeployStep['first'] = {
    project: d.project,
    ref: d.ref,
    commit: d.sha ?? null,
    group: concurrencyGroup(ctx.inventory, d.project, d.ref),
    origin: originOf(d),
    owner: d.requested_owner ?? null,
    queue_job: id,
    ...(d.rollback ? { rolled_back_from: d.rolled_back_from ?? null } : {}),
  };
  const accepted = acceptanceOf(c, ctx.job).at;
  return {
    async step(step: DeployStep['step']) {
      const full = step.state === 'running' ? { ...step, k8s_job: deployJobName(id, d.audit_id, d.project) } : step;
      let written = false;
      try {
        const r = await historyOf(ctx).record({ id, accepted, first, step: full });
        written = r.written && r.state === step.state;
      } catch (err) {
        ctx.logger.warn('could not record the deploy in its history', { state: step.state, err });
      }
      // The state is told to the host of the commit where it is recorded, by a job of its own whose
      // add is not waited for: neither a host nor the queue ever fails or delays the deploy.
      if (written && ctx.reportStatus) {
        const by = step.superseded_by ?? step.cancelled_by ?? undefined;
        const report = statusReport(ctx.inventory, ctx.statusHosts, d, id, step.state, by);
        if (report)
          void ctx
            .reportStatus(report)
            .catch((err: unknown) => ctx.logger.warn('could not queue the report of the deploy state', { state: step.state, err }));
      }
      if (step.state === 'succeeded') ctx.metrics?.deployLastSuccess?.set({ project: d.project, ref: d.ref }, Date.now() / 1000);
    },
  };
}
