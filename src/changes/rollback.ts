import { randomUUID } from 'node:crypto';
import type { CiDeployAnswer } from './ciDeploy.js';
import type { Redis } from 'ioredis';
import { redisCall } from '../domain/redisOps.js';
import type { Written } from '../domain/replication.js';
import { ConflictError, NotFoundError, UnprocessableError } from '../shared/errors.js';
import { findProject, type Inventory } from '../shared/inventory.js';
import { answerChange, answered } from './answer.js';
import { projectNamespace, type Pipeline } from './deps.js';
import type { DeployEntry } from './deployOrder/history.js';
import { submitChange } from './pipeline.js';
import type { Change, DeployTarget, Principal } from './types.js';

/**
 * A rollback (POST /ops/deploys/rollback, origin `rollback`): a deploy of the commit of an earlier
 * succeeded deploy of the project's ref, as its history keeps it (src/changes/deployOrder/). By
 * default the newest succeeded deploy whose commit differs from the current one (the last
 * succeeded); `to` names the commit, which must have succeeded there. It is a deploy like any
 * other (the deploy kind, src/changes/kinds/deploy.ts), through the pipeline: approvals, freezes
 * and windows as for a deploy of the project; in the project's concurrency group, the newest when
 * accepted (a new request), so it waits for a running deploy and supersedes the older waiting ones.
 * A person (an operator's own key, an OIDC rule with may_override) may let it through the freezes
 * and windows as they stand, as a restart's override: the job carries the override, so a freeze
 * declared later still holds it.
 * Its identity is its own (`rollback:<uuid>`): the 24 h deduplication of a commit's deploy never
 * answers it `duplicate`, and a second rollback is a second deploy. The deploy Job is told
 * (OPSGATE_ROLLBACK=true), and the history names the deploy it went back from.
 */
const ROLLBACK_SOURCE = 'rollback';

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

export interface RollbackAnswer extends CiDeployAnswer {
  /** The deploy current when the rollback was accepted (null: none had succeeded). */
  rolled_back_from: string | null;
  /** The deploy whose commit it deploys again. */
  rolled_back_to: string;
}

interface RollbackDeps {
  inventory: Inventory;
  redis: Redis;
  pipeline: Pipeline;
}

/** The project's namespace, refusing a project or ref the inventory does not deploy: 404, 422. */
function checkRollback(inventory: Inventory, project: string, ref: string): string {
  const entry = findProject(inventory, project);
  if (!entry) throw new NotFoundError(`unknown project ${JSON.stringify(project)}`, 'unknown_project');
  if (!entry.refs.includes(ref)) {
    throw new UnprocessableError(
      `ref ${JSON.stringify(ref)} is not a deployable ref of ${project} (${entry.refs.join(', ')})`,
      'ref_not_deployable',
    );
  }
  return projectNamespace(inventory, project);
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

export async function submitRollback(deps: RollbackDeps, req: RollbackRequest): Promise<{ answer: RollbackAnswer; written?: Written }> {
  const namespace = checkRollback(deps.inventory, req.project, req.ref);
  const { to, current } = await targetOf(deps.pipeline, deps.redis, req);
  const commit = to.commit!;
  const eventId = `rollback:${randomUUID()}`;
  const change: Change & { target: DeployTarget } = {
    target: {
      kind: 'deploy',
      project: req.project,
      ref: req.ref,
      sha: commit,
      namespace,
      eventId,
      source: ROLLBACK_SOURCE,
      rollback: { from: current?.id ?? null },
    },
    requester: req.requester,
    reason: req.reason,
    origin: 'rollback',
    auditId: req.auditId,
  };
  const ask = req.override ? { reason: req.reason } : undefined;
  const { body: b, written } = answered(answerChange(await submitChange(deps.pipeline, change, ask), 202));
  const answer: RollbackAnswer = {
    project: req.project,
    ref: req.ref,
    sha: commit,
    rolled_back_from: current?.id ?? null,
    rolled_back_to: to.id,
    event_id: eventId,
    job_id: b.job_id,
    accepted: b.accepted,
    duplicate: b.duplicate,
    status: b.status === 'pending_approval' ? 'pending_approval' : b.status === 'held' ? 'held' : 'queued',
    ...(b.status === 'pending_approval' ? { approval_id: b.approval_id!, expires_at: b.expires_at! } : {}),
    ...(b.status === 'held' ? { held_until: b.held_until!, held_reasons: b.held_reasons! } : {}),
  };
  return { answer, ...(written ? { written } : {}) };
}
