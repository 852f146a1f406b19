import { pushEventId } from '../domain/deploy.js';
import type { Written } from '../domain/replication.js';
import { sha256Hex } from '../shared/crypto.js';
import { ConflictError, NotFoundError, UnprocessableError } from '../shared/errors.js';
import { deploysFrom, findProject, type Inventory } from '../shared/inventory.js';
import { deployIdempotencyRecordKey } from '../shared/keys.js';
import { approvalIdFor } from './approvals/store.js';
import { answerChange, answered, idempotentAnswer, type ChangeBody } from './answer.js';
import { projectNamespace, type WayInDeps } from './deps.js';
import { submitChange } from './pipeline.js';
import type { Principal } from './types.js';

/**
 * A deploy asked for by a CI job (POST /ops/deploys, origin `ci`): one commit of a project whose
 * `deploy_from` takes CI deploys, on one of its deployable refs, through the pipeline like every
 * deploy. The event id `ci:<project>:<ref>:<sha>` deduplicates it for 24 h, as a push's does.
 * An Idempotency-Key, scoped by the principal as a restart's is, names the job (`ci-<scope>`) and a
 * pending approval, and keeps the first answer.
 */
interface CiDeployRequest {
  project: string;
  ref: string;
  sha: string;
  requester: Principal;
  auditId: string;
  idempotencyKey?: string;
  reason?: string;
}

export type CiDeployAnswer = ReturnType<typeof deployAnswer<{ project: string; ref: string; sha: string; event_id: string }>>;

/** A deploy's answer: `base` names it, the rest is what the pipeline made of it (`job_id`: the approval's while it waits). */
export const deployAnswer = <B extends object>(base: B, b: ChangeBody) => ({
  ...base,
  job_id: b.job_id,
  accepted: b.accepted,
  duplicate: b.duplicate,
  status: b.status === 'pending_approval' ? ('pending_approval' as const) : b.status === 'held' ? ('held' as const) : ('queued' as const),
  ...(b.status === 'pending_approval' ? { approval_id: b.approval_id!, expires_at: b.expires_at! } : {}),
  ...(b.status === 'held' ? { held_until: b.held_until!, held_reasons: b.held_reasons! } : {}),
});

/** The project's namespace, refusing what the inventory does not deploy (404, 422) or, from CI, not from CI (409). */
export function deployableNamespace(inventory: Inventory, project: string, ref: string, fromCi: boolean): string {
  const entry = findProject(inventory, project);
  if (!entry) throw new NotFoundError(`unknown project ${JSON.stringify(project)}`, 'unknown_project');
  if (fromCi && !deploysFrom(inventory, project, 'ci')) {
    throw new ConflictError(
      `project ${project} deploys from pushes (deploy_from: ${entry.deploy_from}); set deploy_from: ci or both in the inventory to deploy it from CI`,
      'deploy_source_refused',
    );
  }
  if (!entry.refs.includes(ref)) {
    throw new UnprocessableError(
      `ref ${JSON.stringify(ref)} is not a deployable ref of ${project} (${entry.refs.join(', ')})`,
      'ref_not_deployable',
    );
  }
  return projectNamespace(inventory, project);
}

/** The answer (`http`: the renderer's status; a repeat is 202), and what this call wrote (none for a repeat or a pending approval). */
export async function submitCiDeploy(
  deps: WayInDeps,
  req: CiDeployRequest,
): Promise<{ http: 200 | 202; answer: CiDeployAnswer; written?: Written }> {
  const scope =
    req.idempotencyKey === undefined ? undefined : sha256Hex(`deploy\n${req.requester.principal}\n${req.idempotencyKey}`).slice(0, 40);
  const recordKey = scope === undefined ? undefined : deployIdempotencyRecordKey(scope);
  const eventId = pushEventId('ci', req.project, req.ref, req.sha);
  const namespace = deployableNamespace(deps.inventory, req.project, req.ref, true);
  const record = idempotentAnswer<CiDeployAnswer>({
    ...deps,
    key: recordKey,
    valid: (a) => typeof a.sha === 'string',
    same: (a) => a.project === req.project && a.ref === req.ref && a.sha === req.sha,
    reused: () =>
      new UnprocessableError(
        'this Idempotency-Key was already used for a deploy of another project, ref or commit',
        'idempotency_key_reused',
      ),
    warning: 'could not record the Idempotency-Key answer of a deploy',
  });
  const stored = await record.read();
  if (stored) return { http: 202, answer: stored };
  const change = {
    target: { kind: 'deploy' as const, project: req.project, ref: req.ref, sha: req.sha, namespace, eventId, source: 'ci' },
    requester: req.requester,
    ...(req.reason ? { reason: req.reason } : {}),
    origin: 'ci' as const,
    auditId: req.auditId,
    ...(scope ? { jobId: `ci-${scope}`, approvalId: approvalIdFor(scope) } : {}),
  };
  const { status: http, body: b, written: wrote } = answered(answerChange(await submitChange(deps.pipeline, change), 202));
  const answer = deployAnswer({ project: req.project, ref: req.ref, sha: req.sha, event_id: eventId }, b);
  const kept = await record.keep(answer);
  if (kept !== answer || !wrote) return { http, answer: kept };
  return { http, answer, written: { ...wrote, keys: [...(wrote.keys ?? []), ...(recordKey ? [recordKey] : [])] } };
}
