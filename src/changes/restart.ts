import { sha256Hex } from '../shared/crypto.js';
import { NotFoundError, UnprocessableError } from '../shared/errors.js';
import { findHost, hostPolicy, type Inventory } from '../shared/inventory.js';
import { idempotencyRecordKey } from '../shared/keys.js';
import { redisCall } from '../domain/redisOps.js';
import { approvalIdFor } from './approvals/store.js';
import type { PendingApproval } from './approvals/view.js';
import { answerChange, answered, idempotentAnswer } from './answer.js';
import { sameTarget } from './kinds/index.js';
import { coalesceId, type WayInDeps } from './deps.js';
import { checkOverrideAsk, submitChange } from './pipeline.js';
import type { Change, Origin, Principal, RestartTarget } from './types.js';

export { coalesceId };

/**
 * A restart of an inventory host's Deployment (POST /ops/restart): the target is checked against
 * the inventory (404; the worker checks again), then the change goes through the pipeline.
 * An Idempotency-Key names the job `restart-<sha256(principal, key)>` and its pending approval, so
 * another principal's same key is another id (no probing of someone else's keys); BullMQ adds
 * nothing under an existing id, and the first answer is kept (a key reused for another target: 422).
 * While a restart of the Deployment waits or rolls out, a new one joins it (`coalesced: true`).
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

/** `approval_id`: the first call waits for this approval. */
type StoredAnswer = Omit<RestartAck, 'status'> & { approval_id?: string };

/** `http`: the status the renderer (src/changes/answer.ts) gave it; a repeat under its Idempotency-Key is a restart's 200. */
type RestartAnswer =
  | ({ kind: 'submitted'; http: 200 | 202 } & RestartAck)
  | ({ kind: 'pending_approval'; http: 200 | 202; host: string; service: string } & PendingApproval);

const reused = () =>
  new UnprocessableError('this Idempotency-Key was already used for a restart of another host or service', 'idempotency_key_reused');

export function restartChange(deps: Pick<WayInDeps, 'inventory'>, req: RestartRequest, scope?: string): Change & { target: RestartTarget } {
  return {
    target: validateRestart(deps.inventory, req.host, req.service),
    requester: req.requester,
    ...(req.reason ? { reason: req.reason } : {}),
    origin: req.origin ?? 'api',
    auditId: req.auditId,
    ...(scope ? { jobId: `restart-${scope}`, approvalId: approvalIdFor(scope) } : {}),
  };
}

export async function submitRestart(deps: WayInDeps, req: RestartRequest): Promise<RestartAnswer> {
  const scope = req.idempotencyKey === undefined ? undefined : idempotencyScope(req.requester.principal, req.idempotencyKey);
  const change = restartChange(deps, req, scope);
  const ask = req.override && req.reason ? { reason: req.reason } : undefined;
  checkOverrideAsk(change, ask);
  const { host, service } = req;
  const record = idempotentAnswer<StoredAnswer>({
    ...deps,
    key: scope === undefined ? undefined : idempotencyRecordKey(scope),
    valid: () => true,
    same: (a) => a.host === host && a.service === service,
    reused,
    warning: 'could not record the Idempotency-Key answer',
  });
  if (scope !== undefined) {
    const stored = await record.read();
    if (stored && !stored.approval_id) {
      return { kind: 'submitted', http: 200, host, service, status: 'submitted', job_id: stored.job_id, coalesced: stored.coalesced };
    }
    // A pending approval of the key's first call, for another target (its answer was not stored).
    if (!stored && hostPolicy(deps.inventory, host).approval) {
      const c = (await redisCall(() => deps.pipeline.approvals.get(change.approvalId!), deps.redis))?.change;
      if (c && !sameTarget(c, change.target)) throw reused();
    }
  }

  const { status: http, body: b } = answered(answerChange(await submitChange(deps.pipeline, change, ask), 200));
  if (b.status === 'pending_approval') {
    await record.keep({ host, service, job_id: b.job_id, coalesced: false, approval_id: b.approval_id! });
    const pending: PendingApproval = {
      status: 'pending_approval',
      approval_id: b.approval_id!,
      expires_at: b.expires_at!,
      required: b.required!,
      coalesced: b.coalesced,
    };
    return { kind: 'pending_approval', http, host, service, ...pending };
  }
  const kept = await record.keep({ host, service, job_id: b.job_id, coalesced: b.coalesced });
  return { kind: 'submitted', http, host, service, status: 'submitted', job_id: kept.job_id, coalesced: kept.coalesced };
}
