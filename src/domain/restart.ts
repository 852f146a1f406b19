import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { z } from 'zod';
import { sha256Hex } from '../shared/crypto.js';
import { BadRequestError, NotFoundError, RestartNotConfirmedError, UnprocessableError } from '../shared/errors.js';
import { findHost, type Inventory } from '../shared/inventory.js';
import { IDEMPOTENCY_TTL_SECONDS, JOB } from '../shared/jobs.js';
import type { Logger } from '../shared/logger.js';
import { QueueUnavailableError } from '../shared/errors.js';
import type { Producer } from '../shared/producer.js';
import { idempotencyRecordKey } from '../shared/keys.js';
import { redisCall } from './redisOps.js';

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
 */
export interface RestartRequest {
  host: unknown;
  service: unknown;
  auditId: string;
  requestedBy: string;
  /** The raw Idempotency-Key header (undefined when absent). */
  idempotencyKey?: string;
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

export const coalesceId = (namespace: string, deployment: string): string => `restart:${namespace}/${deployment}`;

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
}

export async function submitRestart(deps: RestartDeps, req: RestartRequest): Promise<RestartAck> {
  const { host, service, namespace } = validateRestart(deps.inventory, req.host, req.service);
  let scope: string | undefined;
  if (req.idempotencyKey !== undefined) {
    const key = idempotencyKeySchema.safeParse(req.idempotencyKey);
    if (!key.success) throw new BadRequestError('Idempotency-Key header must be 1-255 printable ASCII characters');
    scope = idempotencyScope(req.requestedBy, key.data);
  }

  const recordKey = scope === undefined ? undefined : idempotencyRecordKey(scope);
  const replay = (stored: StoredAnswer): RestartAck => {
    if (stored.host !== host || stored.service !== service) {
      throw new UnprocessableError('this Idempotency-Key was already used for a restart of another host or service');
    }
    return { host, service, status: 'submitted', job_id: stored.job_id, coalesced: stored.coalesced };
  };
  if (recordKey) {
    const stored = parseStored(await redisCall((r) => r.get(recordKey), deps.redis));
    if (stored) return replay(stored);
  }

  const jobId = scope === undefined ? `restart-${randomUUID()}` : `restart-${scope}`;
  let id: string;
  try {
    ({ jobId: id } = await deps.producer.add({
      name: JOB.restartService,
      data: { host, service, audit_id: req.auditId, requested_by: req.requestedBy },
      jobId,
      deduplication: { id: coalesceId(namespace, service) },
    }));
  } catch (err) {
    if (err instanceof QueueUnavailableError && err.mayHaveLanded) throw new RestartNotConfirmedError(scope !== undefined);
    throw err;
  }
  const answer: StoredAnswer = { host, service, job_id: id, coalesced: id !== jobId };
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
  return { host, service, status: 'submitted', job_id: answer.job_id, coalesced: answer.coalesced };
}
