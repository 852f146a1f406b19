import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { z } from 'zod';
import { sha256Hex } from '../shared/crypto.js';
import { BadRequestError, ConflictError, NotFoundError, RestartNotConfirmedError, UnprocessableError } from '../shared/errors.js';
import { describeReasons } from '../shared/gate.js';
import { findHost, hostPolicy, type Inventory } from '../shared/inventory.js';
import { IDEMPOTENCY_TTL_SECONDS, JOB } from '../shared/jobs.js';
import type { Logger } from '../shared/logger.js';
import { QueueUnavailableError } from '../shared/errors.js';
import type { Producer } from '../shared/producer.js';
import { idempotencyRecordKey } from '../shared/keys.js';
import { requestApproval, type PendingApproval } from './approvals.js';
import { coalesceId, queueReport, restartGate, takeBudget, type Guards } from './guards.js';
import { redisCall } from './redisOps.js';

export { coalesceId };

/**
 * POST /ops/restart: `host` must be an inventory host and `service` one of its Deployments
 * (else 404); then one restart_service job. The worker checks the inventory again.
 *
 * Idempotency (`Idempotency-Key` header, optional; without it nothing is derived): the job id is
 * `restart-<sha256(principal, key)>`, so the same key from another principal is another id (no
 * collision, no probing of someone else's keys). BullMQ ignores an add whose job id exists, so a
 * retry of a call whose answer was lost (a 503 while Redis was paused, a dropped connection)
 * never makes a second job: it answers with the original job id. The answer itself is also
 * remembered for IDEMPOTENCY_TTL_SECONDS (src/shared/jobs.ts), so a repeat answers exactly as the first call did (even
 * a first call that joined another restart), and a key reused for another target is a 422.
 *
 * Coalescing: every restart job carries the BullMQ deduplication id `restart:<ns>/<deployment>`.
 * BullMQ sets it atomically inside the add script and clears it when the job completes or is
 * finally failed, so while a restart of that Deployment is waiting, retrying or rolling out, a
 * new request adds nothing and answers with that job's id and `coalesced: true`.
 *
 * Guards (the host's policy in the inventory, src/shared/policy.ts), in this order:
 * 1. a freeze of its namespace (or of everything), or outside the host's change windows: 409 with
 *    the reasons, unless `override=true` with a `reason` (audited, notified, carried by the job);
 * 2. an approval policy: no job; 202 pending_approval (src/domain/approvals.ts);
 * 3. a restart of the Deployment still waiting or rolling out: joined (no budget taken);
 * 4. the namespace's restart budget: one place taken, or 429 with Retry-After.
 */
export interface RestartRequest {
  host: unknown;
  service: unknown;
  auditId: string;
  requestedBy: string;
  /** The raw Idempotency-Key header (undefined when absent). */
  idempotencyKey?: string;
  /** The credential id of the requester's secret (four eyes compares it with the approvers'). */
  credential?: string;
  /** override=true (with reason): let the restart through a freeze or outside its windows. */
  override?: boolean;
  reason?: string;
}

export interface RestartAck {
  host: string;
  service: string;
  status: 'submitted';
  job_id: string;
  /** true: an identical restart was still waiting or rolling out and this request joined it. */
  coalesced: boolean;
}

/** A query parameter must be given exactly once and be non-empty. */
const queryParam = (name: string) =>
  z
    .string({
      error: (iss) =>
        iss.input === undefined ? `query parameter "${name}" is required` : `query parameter "${name}" must be given once, as a string`,
    })
    .min(1, `query parameter "${name}" is required`);

/** Query of POST /ops/restart: what validates it, and the OpenAPI parameters. */
export const restartQuerySchema = z.object({
  host: queryParam('host').describe('an inventory host (GET /ops/hosts)'),
  service: queryParam('service').describe("one of the host's Deployments in the inventory"),
});

/** IETF draft "The Idempotency-Key HTTP Header Field": an opaque string; we accept 1-255 printable ASCII characters. */
export const idempotencyKeySchema = z
  .string()
  .regex(/^[\x21-\x7e](?:[\x20-\x7e]{0,253}[\x21-\x7e])?$/, 'must be 1-255 printable ASCII characters')
  .describe(
    `makes a retried call return the original job instead of queuing a second one (remembered ${IDEMPOTENCY_TTL_SECONDS / 3600} h)`,
  );

export const restartAckSchema = z.object({
  host: z.string(),
  service: z.string(),
  status: z.literal('submitted'),
  job_id: z.string().describe('follow it with GET /ops/jobs/{id}'),
  coalesced: z.boolean().describe('true when an identical restart was still waiting or rolling out and this request joined it'),
});

const flag = (name: string) =>
  z
    .enum(['true', 'false', '1', '0'], { error: `query parameter "${name}" must be true or false` })
    .optional()
    .transform((v) => v === 'true' || v === '1');

/** The guard options of POST /ops/restart (query parameters). */
export const restartOptionsSchema = z.object({
  dry_run: flag('dry_run').describe(
    "change nothing: answer what would happen (the guards' verdicts) and what the Kubernetes API server says to the worker's own identity (a server-side dry run)",
  ),
  override: flag('override').describe('restart although a freeze or the change windows refuse it (needs reason; audited and notified)'),
  reason: z
    .string()
    .trim()
    .min(1, 'query parameter "reason" must not be blank')
    .max(500)
    .optional()
    .describe('why: audited, carried by the job, the approval and the notification'),
});
export type RestartOptions = z.infer<typeof restartOptionsSchema>;

/** Parses the guard options from a request's query; a repeated parameter is a 422. */
export function restartOptions(query: Record<string, unknown>): RestartOptions {
  const raw = { dry_run: query.dry_run, override: query.override, reason: query.reason };
  for (const [k, v] of Object.entries(raw)) {
    if (v !== undefined && typeof v !== 'string') throw new UnprocessableError(`query parameter "${k}" must be given once, as a string`);
  }
  const parsed = restartOptionsSchema.safeParse(raw);
  if (!parsed.success) throw new UnprocessableError(parsed.error.issues[0]!.message);
  if (parsed.data.override && !parsed.data.reason) throw new UnprocessableError('override=true needs a reason (query parameter "reason")');
  return parsed.data;
}

export function validateRestart(
  inventory: Inventory,
  hostRaw: unknown,
  serviceRaw: unknown,
): { host: string; service: string; namespace: string } {
  const q = restartQuerySchema.safeParse({ host: hostRaw, service: serviceRaw });
  if (!q.success) throw new UnprocessableError(q.error.issues[0]!.message);
  const { host, service } = q.data;
  const entry = findHost(inventory, host);
  if (!entry) throw new NotFoundError('unknown host');
  if (!entry.deployments.includes(service)) throw new NotFoundError('unknown service for this host');
  return { host, service, namespace: entry.namespace };
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
}

function parseStored(raw: string | null): StoredAnswer | undefined {
  if (raw === null) return undefined;
  try {
    const v = JSON.parse(raw) as StoredAnswer;
    return typeof v.job_id === 'string' ? v : undefined;
  } catch {
    return undefined;
  }
}

export interface RestartDeps {
  inventory: Inventory;
  producer: Pick<Producer, 'add'>;
  redis: Redis;
  logger: Logger;
  guards: Guards;
}

export type RestartAnswer =
  ({ kind: 'submitted' } & RestartAck) | ({ kind: 'pending_approval'; host: string; service: string } & PendingApproval);

export async function submitRestart(deps: RestartDeps, req: RestartRequest): Promise<RestartAnswer> {
  const { host, service, namespace } = validateRestart(deps.inventory, req.host, req.service);
  const g = deps.guards;
  const now = g.now();
  const policy = hostPolicy(deps.inventory, host);
  let scope: string | undefined;
  if (req.idempotencyKey !== undefined) {
    const key = idempotencyKeySchema.safeParse(req.idempotencyKey);
    if (!key.success) throw new BadRequestError('Idempotency-Key header must be 1-255 printable ASCII characters');
    scope = idempotencyScope(req.requestedBy, key.data);
  }

  const recordKey = scope === undefined ? undefined : idempotencyRecordKey(scope);
  const replay = (stored: StoredAnswer): RestartAnswer => {
    if (stored.host !== host || stored.service !== service) {
      throw new UnprocessableError('this Idempotency-Key was already used for a restart of another host or service');
    }
    return { kind: 'submitted', host, service, status: 'submitted', job_id: stored.job_id, coalesced: stored.coalesced };
  };
  if (recordKey) {
    const stored = parseStored(await redisCall((r) => r.get(recordKey), deps.redis));
    if (stored) return replay(stored);
  }

  // 1. Freezes and change windows.
  let override: { by: string; reason: string } | undefined;
  const verdict = await restartGate(g, host, namespace, now);
  if (verdict.blocked) {
    if (!req.override) {
      for (const r of verdict.reasons) g.metrics?.guardRefusals.inc({ guard: r.guard });
      throw new ConflictError(
        `restart of Deployment ${namespace}/${service} refused: ${describeReasons(verdict.reasons)}. An operator may restart anyway with override=true and a reason`,
      );
    }
    override = { by: req.requestedBy, reason: req.reason! };
    g.metrics?.guardOverrides.inc();
  }

  // 2. Four eyes.
  if (policy.approval) {
    const pending = await requestApproval(g, {
      change: { kind: 'restart', host, service, namespace, ...(override ? { override } : {}) },
      identity: coalesceId(namespace, service),
      requester: req.requestedBy,
      requesterCredential: req.credential ?? '',
      ...(req.reason ? { reason: req.reason } : {}),
      auditId: req.auditId,
      policy: policy.approval,
      ...(scope ? { scope } : {}),
    });
    const { approval: _record, created: _created, ...answer } = pending;
    return { kind: 'pending_approval', host, service, ...answer };
  }

  const jobId = scope === undefined ? `restart-${randomUUID()}` : `restart-${scope}`;
  // 3. Joining a restart in progress takes no budget (nothing new restarts).
  if (policy.budget) {
    const holder = await deps.guards.producer.deduplicationHolder(coalesceId(namespace, service));
    if (holder !== null && holder !== jobId) {
      return remember(deps, recordKey, { host, service, job_id: holder, coalesced: true });
    }
    // 4. The namespace's budget.
    await takeBudget(g, namespace, policy.budget, jobId, now);
  }
  let id: string;
  try {
    ({ jobId: id } = await deps.producer.add({
      name: JOB.restartService,
      data: {
        host,
        service,
        ...(req.reason ? { reason: req.reason } : {}),
        ...(override ? { override } : {}),
        audit_id: req.auditId,
        requested_by: req.requestedBy,
      },
      jobId,
      deduplication: { id: coalesceId(namespace, service) },
    }));
  } catch (err) {
    // Not added (or not known to be): its budget place is given back; an add that lands later
    // restarts within the budget's tolerance of one.
    if (policy.budget) await g.budgets.giveBack(namespace, jobId).catch(() => undefined);
    if (err instanceof QueueUnavailableError && err.mayHaveLanded) throw new RestartNotConfirmedError(scope !== undefined);
    throw err;
  }
  if (policy.budget && id !== jobId) await g.budgets.giveBack(namespace, jobId).catch(() => undefined);
  if (override && id === jobId) {
    await queueReport(g, `report.${jobId}.override`, {
      event: 'override',
      change: 'restart',
      host,
      service,
      namespace,
      job_id: jobId,
      reason: `${override.reason} (overriding: ${describeReasons(verdict.reasons)})`,
      approvers: [],
      audit_id: req.auditId,
      requested_by: req.requestedBy,
    });
  }
  return remember(deps, recordKey, { host, service, job_id: id, coalesced: id !== jobId });
}

/** Remembers the answer under the Idempotency-Key (when given) and returns it; a concurrent call's stored answer wins. */
async function remember(deps: RestartDeps, recordKey: string | undefined, answer: StoredAnswer): Promise<RestartAnswer> {
  const { host, service } = answer;
  const replay = (stored: StoredAnswer): RestartAnswer => {
    if (stored.host !== host || stored.service !== service) {
      throw new UnprocessableError('this Idempotency-Key was already used for a restart of another host or service');
    }
    return { kind: 'submitted', host, service, status: 'submitted', job_id: stored.job_id, coalesced: stored.coalesced };
  };
  if (recordKey) {
    try {
      // NX: a concurrent call with the same key may have stored first; then its answer wins.
      const set = await deps.redis.set(recordKey, JSON.stringify(answer), 'EX', IDEMPOTENCY_TTL_SECONDS, 'NX');
      if (set === null) {
        const stored = parseStored(await deps.redis.get(recordKey));
        if (stored) return replay(stored);
      }
    } catch (err) {
      // The job is queued; answering 503 now would invite a retry. A retry without the record
      // still finds the job by its id (or joins the same running restart).
      deps.logger.warn('could not record the Idempotency-Key answer', { err });
    }
  }
  return { kind: 'submitted', host, service, status: 'submitted', job_id: answer.job_id, coalesced: answer.coalesced };
}
