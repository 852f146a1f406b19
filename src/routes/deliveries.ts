import { decodeCursor, encodeCursor, nextCursorSchema, only, pageQueryShape, parseBody, parseQuery } from './request.js';
import { Router } from 'express';
import { z } from 'zod';
import { DELIVERY_ID, VERDICTS, deliveryViewSchema, type DeliveryLog } from '../domain/deliveries.js';
import { handChange } from '../changes/hand.js';
import { pushChange, pushHanded, submitPush } from '../changes/push.js';
import type { Change, DeployTarget } from '../changes/types.js';
import { principalOf } from './principal.js';
import { dryRunQuery } from './restartQuery.js';
import { dryRunDeploy } from '../changes/dryRun.js';
import type { Pipeline } from '../changes/deps.js';
import type { Intake, IntakeResult } from '../domain/intake.js';
import type { ConfirmChange, ConfirmReplicated } from '../domain/replication.js';
import { keyChecks, type KeyedDeps } from '../middleware/auth.js';
import { requireInScope } from '../middleware/scope.js';
import { projectNamespace } from '../changes/deps.js';
import { rawBody } from '../middleware/body.js';
import type { ApiConfig } from '../api/config.js';
import { ConflictError, NotFoundError, UnprocessableError } from '../shared/errors.js';
import type { Logger } from '../shared/logger.js';
import { SOURCES } from '../sources/index.js';

/** The guard fields of an intake outcome, for an answer: a pending approval or a hold. */
export function guardFields(out: IntakeResult): Record<string, string> {
  if (out.approval) return { status: 'pending_approval', approval_id: out.approval.id, expires_at: out.approval.expires_at };
  if (out.held) return { status: 'held', held_until: out.held.until };
  return {};
}

/**
 * Why didn't my push deploy? The senders' deliveries (any valid key), and their replay (operator key):
 * a recorded push event again through the same intake and deduplication, past the signed senders'
 * commit-pair rule, audited and recorded as a delivery of its own.
 */
interface DeliveriesDeps extends KeyedDeps, Pick<Pipeline, 'inventory'> {
  config: Pick<ApiConfig, 'apiKeys' | 'BODY_LIMIT'>;
  deliveries: DeliveryLog;
  intake: Pick<Intake, 'push'>;
  logger: Logger;
  /** REDIS_MIN_REPLICAS_ACK (src/domain/replication.ts); absent = off. */
  replicated?: ConfirmReplicated;
  changed?: ConfirmChange;
  /** A replayed push is a change like a delivered one. */
  pipeline: Pipeline;
}

const SOURCE_NAMES = SOURCES.map((s) => s.name);

export const listDeliveriesQuerySchema = z.object({
  source: z
    .string()
    .refine((s) => SOURCE_NAMES.includes(s), `must be one of ${SOURCE_NAMES.join(', ')}`)
    .optional()
    .describe('one sender; default all'),
  verdict: z.enum(VERDICTS).optional(),
  before: z
    .string()
    .regex(DELIVERY_ID, 'must be a delivery id from a previous page')
    .optional()
    .describe('the `next` of the previous page; the older way to page, instead of cursor'),
  ...pageQueryShape(50, 200),
});

export const deliveryListSchema = z.object({
  deliveries: z.array(deliveryViewSchema),
  next: z.string().nullable().describe('pass as `before` for the next page; null on the last'),
  next_cursor: nextCursorSchema,
});

export const replayBodySchema = z.object({
  reason: z.string().trim().min(1).max(500).describe('why the delivery is replayed; written to the audit line'),
  dry_run: z
    .boolean()
    .optional()
    .describe(
      "change nothing: answer what the replay would do (the guards' verdicts) and what the Kubernetes API server says to the worker's own identity about the deploy Job; also given as ?dry_run=true, as on POST /ops/restart",
    ),
});

export const replayAnswerSchema = z.object({
  replayed: z.literal(true),
  accepted: z.boolean(),
  duplicate: z.boolean().describe('the event already has its job (job_id): nothing new was queued'),
  job_id: z.string(),
  event_id: z.string(),
  status: z
    .enum(['queued', 'pending_approval', 'held'])
    .optional()
    .describe('pending_approval: job_id is the approval id (POST /ops/approvals/{id}/approve); held: a delayed job until held_until'),
  approval_id: z.string().optional(),
  expires_at: z.string().optional(),
  held_until: z.string().optional(),
});

export function deliveriesRouter(deps: DeliveriesDeps): Router {
  const r = Router();
  const { anyKey, operatorKey } = keyChecks(deps);

  only(r, 'get', '/ops/deliveries', anyKey, async (req, res) => {
    const q = parseQuery(listDeliveriesQuerySchema, req.query);
    let { source, verdict, before } = q;
    if (q.cursor !== undefined) {
      if (before !== undefined) throw new UnprocessableError('give cursor or before, not both', 'invalid_query');
      const c = decodeCursor('deliveries', q.cursor, z.string().regex(DELIVERY_ID), { source, verdict });
      const filters = listDeliveriesQuerySchema.pick({ source: true, verdict: true }).safeParse(c.filters);
      if (!filters.success) throw new UnprocessableError('cursor is not a next_cursor of this list', 'invalid_cursor');
      ({ source, verdict } = filters.data);
      before = c.position;
    }
    const page = await deps.deliveries.list({
      sources: source ? [source] : SOURCE_NAMES,
      limit: q.limit,
      ...(verdict ? { verdict } : {}),
      ...(before ? { before } : {}),
    });
    res.json({ ...page, next_cursor: page.next === null ? null : encodeCursor('deliveries', page.next, { source, verdict }) });
  });

  only(r, 'get', '/ops/deliveries/:id', anyKey, async (req, res) => {
    const view = await deps.deliveries.get(String(req.params.id));
    if (!view) throw new NotFoundError('delivery not found', 'delivery_not_found');
    res.json(view);
  });

  only(r, 'post', '/ops/deliveries/:id/replay', operatorKey, ...rawBody(deps.config.BODY_LIMIT), async (req, res) => {
    const id = String(req.params.id);
    const body = parseBody(req, replayBodySchema);
    const audit = { delivery: id, replay_reason: body.reason };
    res.locals.auditFields = audit;
    const view = await deps.deliveries.get(id);
    if (!view) throw new NotFoundError('delivery not found', 'delivery_not_found');
    const source = SOURCES.find((s) => s.name === view.source);
    if (!view.event || source?.kind !== 'push') {
      throw new ConflictError(
        `delivery ${id} (${view.verdict}) reached no push event to replay; have the sender redeliver it`,
        'delivery_not_replayable',
      );
    }
    const requester = principalOf(res);
    const e = view.event;
    requireInScope(res, { kind: 'project', project: e.project, namespace: projectNamespace(deps.inventory, e.project) });
    // A signed sender's commit pair: the replay deploys it and the pair names the replay's job.
    const push = {
      project: e.project,
      ref: e.ref,
      sha: e.sha,
      eventId: e.event_id,
      ...(e.before !== undefined ? { before: e.before } : {}),
    };
    const deliveryId = view.delivery_id ? { deliveryId: view.delivery_id } : {};
    const request = {
      source: view.source,
      ...push,
      auditId: res.locals.requestId,
      requester,
      reason: body.reason,
      origin: 'replay' as const,
      ...deliveryId,
      // A replay is the delivery again: its place in its group's order is its job's acceptance (the
      // delivery's answer is logged a moment after it; a newer push may fall in between).
      accepted: {
        at: (view.job_id ? await deps.pipeline.producer.acceptedAt(view.job_id) : undefined) ?? Date.parse(view.at),
        id: view.job_id ?? view.id,
      },
    };
    // dry_run as on POST /ops/restart (the query), or in the body.
    if (dryRunQuery(req.query) || body.dry_run) {
      const answer = await dryRunDeploy(deps.pipeline, pushChange(deps.pipeline, request) as Change & { target: DeployTarget });
      res.locals.auditFields = { ...audit, dry_run: true, would: answer.would };
      res.json(answer);
      return;
    }
    const out = await handChange(deps, res.locals, { submit: () => submitPush(deps.pipeline, request), handed: pushHanded });
    deps.deliveries.record({
      source: view.source,
      verdict: out.accepted ? 'queued' : 'duplicate',
      status: out.approval ? 202 : 200,
      detail: `replay by ${requester.principal}: ${body.reason}`,
      jobId: out.jobId,
      push,
      replayOf: id,
      ...deliveryId,
      ...(typeof res.locals.requestId === 'string' ? { requestId: res.locals.requestId } : {}),
    });
    res.locals.auditFields = {
      ...audit,
      job_id: out.jobId,
      event_id: e.event_id,
      outcome: out.accepted ? 'accepted' : 'duplicate',
    };
    deps.logger.info('webhook delivery replayed', {
      delivery: id,
      job_id: out.jobId,
      accepted: out.accepted,
      request_id: res.locals.requestId,
    });
    res.status(out.approval ? 202 : 200).json({
      replayed: true,
      accepted: out.accepted,
      duplicate: out.duplicate,
      job_id: out.jobId,
      event_id: e.event_id,
      ...guardFields(out),
    });
  });

  return r;
}
