import type { Pipeline } from '../deps.js';
import { deployKind } from '../kinds/deploy.js';
import { kindOfTarget } from '../kinds/index.js';
import type { Change, DeployTarget } from '../types.js';
import { deployOrigin, type DeployState } from './history.js';
import { concurrencyGroup } from './store.js';

/**
 * The API's steps of a deploy in its history, where it writes anyway: after an add, with an approval record, with a
 * rejection; a queued push is the worker's. The history is a record, not the change: a failed write is only logged.
 */
export async function recordDeployStep(
  g: Pick<Pipeline, 'deployHistory' | 'inventory' | 'logger'>,
  change: Change,
  id: string,
  state: Extract<DeployState, 'pending_approval' | 'held' | 'queued' | 'rejected'>,
  now: number,
): Promise<void> {
  if (kindOfTarget(change.target) !== deployKind || (change.origin === 'webhook' && state !== 'rejected' && state !== 'pending_approval'))
    return;
  const t = change.target as DeployTarget;
  const origin = deployOrigin(change.origin);
  try {
    await g.deployHistory.record({
      id,
      accepted: change.accepted?.at ?? now,
      first: {
        project: t.project,
        ref: t.ref,
        commit: t.sha ?? null,
        group: concurrencyGroup(g.inventory, t.project, t.ref),
        origin,
        owner: change.requester.owner || null,
        queue_job: state === 'pending_approval' || state === 'rejected' ? null : id,
        ...(t.rollback ? { rolled_back_from: t.rollback.from } : {}),
      },
      // The last approval keeps the origin of the deploy it lets through.
      ...(change.origin !== 'webhook' && change.origin !== 'approval' ? { origin } : {}),
      // A push approved last gets its queue job with this step: its entry was written without one.
      step: {
        state,
        ...(state === 'rejected' ? { finished_at: now } : {}),
        ...(state === 'held' || state === 'queued' ? { queue_job: id } : {}),
      },
    });
  } catch (err) {
    g.logger.warn('could not record the deploy in its history', { deploy: id, state, err });
  }
}
