import type { Redis } from 'ioredis';
import { pushEventId } from '../domain/deploy.js';
import { redisCall } from '../domain/redisOps.js';
import type { Written } from '../domain/replication.js';
import { sha256Hex } from '../shared/crypto.js';
import { ConflictError, NotFoundError, UnprocessableError } from '../shared/errors.js';
import { deploysFrom, findProject, type Inventory } from '../shared/inventory.js';
import { IDEMPOTENCY_TTL_SECONDS } from '../shared/jobs.js';
import { deployIdempotencyRecordKey } from '../shared/keys.js';
import type { Logger } from '../shared/logger.js';
import { approvalIdFor } from './approvals/store.js';
import { answerChange, answered } from './answer.js';
import { projectNamespace, type Pipeline } from './deps.js';
import { submitChange } from './pipeline.js';
import type { Change, DeployTarget, Principal } from './types.js';
import { storedJson } from '../shared/redis.js';

/**
 * A deploy asked for by a CI job (POST /ops/deploys, origin `ci`): exactly one commit of one
 * project, from a project whose `deploy_from` takes CI deploys, on one of its deployable refs.
 * Through the pipeline like every deploy: approvals, freezes and windows; one deploy per
 * (project, ref, sha) within 24 h (the event id `ci:<project>:<ref>:<sha>` is the job's
 * deduplication id, as a push's is).
 *
 * Idempotency-Key (optional): scoped by the requester's principal as a restart's is, it names the
 * job (`ci-<scope>`) and a pending approval; the first answer is remembered
 * IDEMPOTENCY_TTL_SECONDS, so a retry answers as the first call did, and the key reused for
 * another commit is refused (422).
 */
const CI_EVENT_PREFIX = 'ci';
const CI_SOURCE = 'ci';

interface CiDeployRequest {
  project: string;
  ref: string;
  sha: string;
  requester: Principal;
  auditId: string;
  idempotencyKey?: string;
  reason?: string;
}

export interface CiDeployAnswer {
  project: string;
  ref: string;
  sha: string;
  event_id: string;
  /** The job that carries the deploy (an earlier one for a duplicate), or the approval's id while it waits. */
  job_id: string;
  accepted: boolean;
  duplicate: boolean;
  status: 'queued' | 'held' | 'pending_approval';
  approval_id?: string;
  expires_at?: string;
  held_until?: string;
  held_reasons?: string;
}

/** The answer, and what this call wrote (for REDIS_MIN_REPLICAS_ACK's take-back; absent for a repeat or a pending approval). */
interface CiDeployResult {
  /** The status the renderer (src/changes/answer.ts) gave it; a repeat under its Idempotency-Key is a deploy's 202. */
  http: 200 | 202;
  answer: CiDeployAnswer;
  written?: Written;
}

interface CiDeployDeps {
  inventory: Inventory;
  redis: Redis;
  logger: Logger;
  pipeline: Pipeline;
}

/** The per-principal scope of a deploy's Idempotency-Key. */
function deployIdempotencyScope(principal: string, key: string): string {
  return sha256Hex(`deploy\n${principal}\n${key}`).slice(0, 40);
}

/** The project's namespace, refusing what the inventory does not let CI deploy: 404, 409, 422. */
function checkCiDeploy(inventory: Inventory, project: string, ref: string): string {
  const entry = findProject(inventory, project);
  if (!entry) throw new NotFoundError(`unknown project ${JSON.stringify(project)}`, 'unknown_project');
  if (!deploysFrom(inventory, project, 'ci')) {
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

function ciDeployChange(inventory: Inventory, req: CiDeployRequest, scope?: string): Change & { target: DeployTarget } {
  const namespace = checkCiDeploy(inventory, req.project, req.ref);
  return {
    target: {
      kind: 'deploy',
      project: req.project,
      ref: req.ref,
      sha: req.sha,
      namespace,
      eventId: pushEventId(CI_EVENT_PREFIX, req.project, req.ref, req.sha),
      source: CI_SOURCE,
    },
    requester: req.requester,
    ...(req.reason ? { reason: req.reason } : {}),
    origin: 'ci',
    auditId: req.auditId,
    ...(scope ? { jobId: `ci-${scope}`, approvalId: approvalIdFor(scope) } : {}),
  };
}

function parseStored(raw: string | null): CiDeployAnswer | undefined {
  const v = storedJson<CiDeployAnswer>(raw);
  return typeof v?.job_id === 'string' && typeof v.sha === 'string' ? v : undefined;
}

const reused = () =>
  new UnprocessableError('this Idempotency-Key was already used for a deploy of another project, ref or commit', 'idempotency_key_reused');

const sameDeploy = (a: Pick<CiDeployAnswer, 'project' | 'ref' | 'sha'>, b: Pick<CiDeployRequest, 'project' | 'ref' | 'sha'>) =>
  a.project === b.project && a.ref === b.ref && a.sha === b.sha;

export async function submitCiDeploy(deps: CiDeployDeps, req: CiDeployRequest): Promise<CiDeployResult> {
  const scope = req.idempotencyKey === undefined ? undefined : deployIdempotencyScope(req.requester.principal, req.idempotencyKey);
  const change = ciDeployChange(deps.inventory, req, scope);
  const recordKey = scope === undefined ? undefined : deployIdempotencyRecordKey(scope);
  if (recordKey) {
    const stored = parseStored(await redisCall((r) => r.get(recordKey), deps.redis));
    if (stored && !sameDeploy(stored, req)) throw reused();
    if (stored) return { http: 202, answer: stored };
  }
  const { status: http, body: b, written: wrote } = answered(answerChange(await submitChange(deps.pipeline, change), 202));
  const base = { project: req.project, ref: req.ref, sha: req.sha, event_id: change.target.eventId! };
  const answer: CiDeployAnswer =
    b.status === 'pending_approval'
      ? {
          ...base,
          job_id: b.job_id,
          accepted: b.accepted,
          duplicate: b.duplicate,
          status: 'pending_approval',
          approval_id: b.approval_id!,
          expires_at: b.expires_at!,
        }
      : {
          ...base,
          job_id: b.job_id,
          accepted: b.accepted,
          duplicate: b.duplicate,
          status: b.status === 'held' ? 'held' : 'queued',
          ...(b.status === 'held' ? { held_until: b.held_until!, held_reasons: b.held_reasons! } : {}),
        };
  const written = wrote ? { ...wrote, keys: [...(wrote.keys ?? []), ...(recordKey ? [recordKey] : [])] } : undefined;
  const result = (a: CiDeployAnswer): CiDeployResult => ({ http, answer: a, ...(written && a === answer ? { written } : {}) });
  if (!recordKey) return result(answer);
  try {
    // NX: a concurrent call with the same key may have stored first; then its answer wins.
    const set = await deps.redis.set(recordKey, JSON.stringify(answer), 'EX', IDEMPOTENCY_TTL_SECONDS, 'NX');
    if (set === null) {
      const stored = parseStored(await deps.redis.get(recordKey));
      if (stored && !sameDeploy(stored, req)) throw reused();
      if (stored) return result(stored);
    }
  } catch (err) {
    if (err instanceof UnprocessableError) throw err;
    // The deploy is queued; a retry without the record joins it through the event's deduplication.
    deps.logger.warn('could not record the Idempotency-Key answer of a deploy', { err });
  }
  return result(answer);
}
