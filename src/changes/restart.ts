import type { Redis } from 'ioredis';
import { sha256Hex } from '../shared/crypto.js';
import { NotFoundError, UnprocessableError } from '../shared/errors.js';
import { findHost, hostPolicy, type Inventory } from '../shared/inventory.js';
import { IDEMPOTENCY_TTL_SECONDS } from '../shared/jobs.js';
import type { Logger } from '../shared/logger.js';
import { idempotencyRecordKey } from '../shared/keys.js';
import { redisCall } from '../domain/redisOps.js';
import { approvalIdFor } from './approvals/store.js';
import type { PendingApproval } from './approvals/view.js';
import { answerChange, answered, type ChangeBody } from './answer.js';
import { sameTarget } from './kinds/index.js';
import { coalesceId, type Pipeline } from './deps.js';
import { checkOverrideAsk, submitChange } from './pipeline.js';
import type { Change, Origin, Principal, RestartTarget } from './types.js';
import { storedJson } from '../shared/redis.js';

export { coalesceId };

/**
 * A restart of an inventory host's Deployment, asked for by a caller (POST /ops/restart) or by the
 * pipeline's other ways in: the target is checked against the inventory (404 otherwise; the worker
 * checks again), then the change goes through the pipeline (src/changes/pipeline.ts).
 *
 * Idempotency (optional key; without it nothing is derived): the job id is
 * `restart-<sha256(principal, key)>` and a pending approval's id derives from the same scope, so the
 * same key from another principal is another id (no collision, no probing of someone else's keys).
 * BullMQ ignores an add whose job id exists, so a retry of a call whose answer was lost never makes
 * a second job. The answer itself is remembered for IDEMPOTENCY_TTL_SECONDS, so a repeat answers
 * exactly as the first call did (even a first call that joined another restart), and a key reused
 * for another target is refused, whether the first call queued a job or waits for approval.
 *
 * Coalescing: every restart job carries the BullMQ deduplication id `restart:<ns>/<deployment>`,
 * so while a restart of that Deployment is waiting, retrying or rolling out, a new request adds
 * nothing and answers with that job's id and `coalesced: true`.
 */
interface RestartRequest {
  host: string;
  service: string;
  requester: Principal;
  auditId: string;
  /** The Idempotency-Key (already checked for its form). */
  idempotencyKey?: string;
  /** Let the restart through a closed gate, for this reason (covers the gate's reasons as they stand). */
  override?: boolean;
  reason?: string;
  origin?: Origin;
}

interface RestartAck {
  host: string;
  service: string;
  status: 'submitted';
  job_id: string;
  /** true: an identical restart was still waiting or rolling out and this request joined it. */
  coalesced: boolean;
}

/** The inventory's host and Deployment (404 otherwise), with the namespace. */
export function validateRestart(inventory: Inventory, host: string, service: string): RestartTarget {
  const entry = findHost(inventory, host);
  if (!entry) throw new NotFoundError('unknown host', 'unknown_host');
  if (!entry.deployments.includes(service)) throw new NotFoundError('unknown service for this host', 'unknown_service');
  return { kind: 'restart', host, service, namespace: entry.namespace };
}

/** The per-principal scope of an Idempotency-Key: nobody can name or probe another principal's job. */
export function idempotencyScope(principal: string, key: string): string {
  return sha256Hex(`restart\n${principal}\n${key}`).slice(0, 40);
}

interface StoredAnswer {
  host: string;
  service: string;
  job_id: string;
  coalesced: boolean;
  /** The first call waits for this approval. */
  approval_id?: string;
}

function parseStored(raw: string | null): StoredAnswer | undefined {
  const v = storedJson<StoredAnswer>(raw);
  return typeof v?.job_id === 'string' ? v : undefined;
}

interface RestartDeps {
  inventory: Inventory;
  redis: Redis;
  logger: Logger;
  pipeline: Pipeline;
}

/** `http`: the status the renderer (src/changes/answer.ts) gave it; a repeat under its Idempotency-Key is a restart's 200. */
type RestartAnswer =
  | ({ kind: 'submitted'; http: 200 | 202 } & RestartAck)
  | ({ kind: 'pending_approval'; http: 200 | 202; host: string; service: string } & PendingApproval);

const reused = () =>
  new UnprocessableError('this Idempotency-Key was already used for a restart of another host or service', 'idempotency_key_reused');

/** The change a restart request stands for. */
export function restartChange(
  deps: Pick<RestartDeps, 'inventory'>,
  req: RestartRequest,
  scope?: string,
): Change & { target: RestartTarget } {
  return {
    target: validateRestart(deps.inventory, req.host, req.service),
    requester: req.requester,
    ...(req.reason ? { reason: req.reason } : {}),
    origin: req.origin ?? 'api',
    auditId: req.auditId,
    ...(scope ? { jobId: `restart-${scope}`, approvalId: approvalIdFor(scope) } : {}),
  };
}

export async function submitRestart(deps: RestartDeps, req: RestartRequest): Promise<RestartAnswer> {
  const scope = req.idempotencyKey === undefined ? undefined : idempotencyScope(req.requester.principal, req.idempotencyKey);
  const change = restartChange(deps, req, scope);
  const ask = req.override && req.reason ? { reason: req.reason } : undefined;
  checkOverrideAsk(change, ask);
  const { host, service } = req;
  const recordKey = scope === undefined ? undefined : idempotencyRecordKey(scope);
  if (recordKey) {
    const stored = parseStored(await redisCall((r) => r.get(recordKey), deps.redis));
    if (stored && (stored.host !== host || stored.service !== service)) throw reused();
    if (stored && !stored.approval_id) {
      return { kind: 'submitted', http: 200, host, service, status: 'submitted', job_id: stored.job_id, coalesced: stored.coalesced };
    }
    // A pending approval of the key's first call, for another target (its answer was not stored).
    if (!stored && hostPolicy(deps.inventory, host).approval) {
      const earlier = await redisCall(() => deps.pipeline.approvals.get(change.approvalId!), deps.redis);
      const c = earlier?.change;
      if (c && !sameTarget(c, change.target)) throw reused();
    }
  }

  const { status: http, body: b } = answered(answerChange(await submitChange(deps.pipeline, change, ask), 200));
  if (b.status === 'pending_approval') {
    await remember(deps, recordKey, { host, service, job_id: b.job_id, coalesced: false, approval_id: b.approval_id! });
    return { kind: 'pending_approval', http, host, service, ...pendingAnswer(b) };
  }
  return { ...(await remember(deps, recordKey, { host, service, job_id: b.job_id, coalesced: b.coalesced })), http };
}

/** 202's body of a change that waits for approval. */
function pendingAnswer(b: ChangeBody): PendingApproval {
  return {
    status: 'pending_approval',
    approval_id: b.approval_id!,
    expires_at: b.expires_at!,
    required: b.required!,
    coalesced: b.coalesced,
  };
}

/** Remembers the answer under the Idempotency-Key (when given) and returns it; a concurrent call's stored answer wins. */
async function remember(
  deps: RestartDeps,
  recordKey: string | undefined,
  answer: StoredAnswer,
): Promise<Omit<RestartAnswer & { kind: 'submitted' }, 'http'>> {
  const { host, service } = answer;
  let kept = answer;
  if (recordKey) {
    try {
      // NX: a concurrent call with the same key may have stored first; then its answer wins.
      const set = await deps.redis.set(recordKey, JSON.stringify(answer), 'EX', IDEMPOTENCY_TTL_SECONDS, 'NX');
      if (set === null) {
        const stored = parseStored(await deps.redis.get(recordKey));
        if (stored && (stored.host !== host || stored.service !== service)) throw reused();
        if (stored) kept = stored;
      }
    } catch (err) {
      if (err instanceof UnprocessableError) throw err;
      // The job is queued; answering 503 now would invite a retry. A retry without the record
      // still finds the job by its id (or joins the same running restart).
      deps.logger.warn('could not record the Idempotency-Key answer', { err });
    }
  }
  return { kind: 'submitted', host, service, status: 'submitted', job_id: kept.job_id, coalesced: kept.coalesced };
}
