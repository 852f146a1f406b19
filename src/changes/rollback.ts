import { randomUUID } from 'node:crypto';
import { deployAnswer, deployableNamespace, type CiDeployAnswer } from './ciDeploy.js';
import type { Redis } from 'ioredis';
import { redisCall } from '../domain/redisOps.js';
import type { Written } from '../domain/replication.js';
import { ConflictError } from '../shared/errors.js';
import { answerChange, answered } from './answer.js';
import type { Pipeline, WayInDeps } from './deps.js';
import type { DeployEntry } from './deployOrder/history.js';
import { submitChange } from './pipeline.js';
import type { Change, Principal } from './types.js';

/**
 * A rollback (POST /ops/deploys/rollback, origin `rollback`): a deploy of the commit of an earlier
 * succeeded deploy of the project's ref, as its history keeps it (src/changes/deployOrder/): by
 * default the newest whose commit differs from the current one, or the commit `to` names. Through
 * the pipeline as any deploy of the project, the newest of its group when accepted. A person may
 * override the gate as it stands, as for a restart; the job carries the override, so a freeze
 * declared later still holds it. Its event id is its own (`rollback:<uuid>`): never a `duplicate`.
 */
interface RollbackRequest {
  project: string;
  ref: string;
  /** The commit to go back to; absent: the newest succeeded one other than the current. */
  to?: string;
  requester: Principal;
  auditId: string;
  reason: string;
  /** Let it through the gate as it stands, with the reason: a person only (pipeline.ts checkOverrideAsk). */
  override?: boolean;
}

/** The deploy to go back to, and the current one, from the history: 409 rollback_target_unknown when there is none. */
async function targetOf(g: Pipeline, redis: Redis, req: Pick<RollbackRequest, 'project' | 'ref' | 'to'>) {
  const current = (await redisCall(() => g.deployHistory.refs(req.project), redis)).get(req.ref)?.current;
  const wanted = (e: DeployEntry) =>
    e.ref === req.ref &&
    e.state === 'succeeded' &&
    e.commit !== null &&
    (req.to !== undefined ? e.commit === req.to : e.commit !== current?.commit);
  // The current deploy outlives the history's bound (its ref's record keeps it).
  let to = current && req.to !== undefined && wanted(current) ? current : undefined;
  if (!to) {
    const page = await redisCall(() => g.deployHistory.list({ project: req.project, limit: 1, admit: wanted }), redis);
    to = page.items[0];
  }
  if (!to) {
    throw new ConflictError(
      req.to !== undefined
        ? `commit ${req.to} never succeeded in the deploy history of ${req.project} ${req.ref}: nothing to go back to`
        : `no succeeded deploy of ${req.project} ${req.ref} with a commit other than the current one is kept in its history: nothing to go back to`,
      'rollback_target_unknown',
    );
  }
  return { to, current };
}

export async function submitRollback(
  deps: Omit<WayInDeps, 'logger'>,
  req: RollbackRequest,
): Promise<{ answer: CiDeployAnswer & { rolled_back_from: string | null; rolled_back_to: string }; written?: Written }> {
  const namespace = deployableNamespace(deps.inventory, req.project, req.ref, false);
  const { to, current } = await targetOf(deps.pipeline, deps.redis, req);
  const from = current?.id ?? null;
  const commit = to.commit!;
  const eventId = `rollback:${randomUUID()}`;
  const change: Change = {
    target: { kind: 'deploy', project: req.project, ref: req.ref, sha: commit, namespace, eventId, source: 'rollback', rollback: { from } },
    requester: req.requester,
    reason: req.reason,
    origin: 'rollback',
    auditId: req.auditId,
  };
  const ask = req.override ? { reason: req.reason } : undefined;
  const { body: b, written } = answered(answerChange(await submitChange(deps.pipeline, change, ask), 202));
  const base = { project: req.project, ref: req.ref, sha: commit, rolled_back_from: from, rolled_back_to: to.id, event_id: eventId };
  return { answer: deployAnswer(base, b), ...(written ? { written } : {}) };
}
