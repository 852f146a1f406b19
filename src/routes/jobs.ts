import { decodeCursor, encodeCursor, nextCursorSchema, only, pageQueryShape, parseBody, parseQuery } from './request.js';
import { Router } from 'express';
import { z } from 'zod';
import { approvalView, approvalViewSchema } from '../changes/approvals/view.js';
import { holdView, holdViewSchema } from '../changes/freezes/service.js';
import type { Pipeline } from '../changes/deps.js';
import { kindOfApproval } from '../changes/kinds/index.js';
import { redisCall } from '../domain/redisOps.js';
import type { ConfirmRetryReplicated } from '../domain/replication.js';
import { APPROVAL_ID, effectiveStatus } from '../changes/approvals/store.js';
import { describeReasons } from '../changes/gate.js';
import { outcomeSchema } from '../shared/jobs.js';
import { handChange } from '../changes/hand.js';
import { keyChecks, type KeyedDeps } from '../middleware/auth.js';
import { scopeOf } from '../middleware/scope.js';
import { rawBody } from '../middleware/body.js';
import type { ApiConfig } from '../api/config.js';
import { ForbiddenError, NotFoundError, UnprocessableError } from '../shared/errors.js';
import type { Logger } from '../shared/logger.js';
import { refuseUnretried, type DeadLetters } from '../api/deadLetters.js';
import { principalOf } from './principal.js';
import { LISTABLE_STATES, type JobReads } from '../shared/jobReads.js';

/**
 * Jobs without a browser, never their data or return values (any valid key); POST
 * /ops/jobs/:id/retry (operator key) re-queues a dead letter with a fresh attempt budget, audited.
 */
interface JobsDeps extends KeyedDeps {
  config: Pick<ApiConfig, 'apiKeys' | 'BODY_LIMIT'>;
  jobs: JobReads;
  deadLetters: DeadLetters;
  logger: Logger;
  /** REDIS_MIN_REPLICAS_ACK: WAIT before the retry's 200 (else 503, repeating it is safe); absent = off. */
  retryReplicated?: ConfirmRetryReplicated;
  /** The change records a job stands for: a held job's reasons, an approval that has no job yet. */
  changeRecords?: Pick<Pipeline, 'holds' | 'approvals' | 'redis' | 'now'>;
}

const JOB_ID = /^[A-Za-z0-9._:-]{1,128}$/;

const MAX_OFFSET = 100000;

export const listJobsQuerySchema = z.object({
  state: z.enum(LISTABLE_STATES).default('failed').describe('failed = the dead letters'),
  offset: z.coerce
    .number()
    .int()
    .min(0)
    .max(MAX_OFFSET)
    .optional()
    .describe('jobs to skip (default 0); the older way to page, instead of cursor'),
  ...pageQueryShape(20, 100),
});

export const retryBodySchema = z.object({
  reason: z.string().trim().min(1).max(500).describe('why the job is replayed; written to the audit line'),
});

export const jobViewSchema = z.object({
  id: z.string(),
  name: z.string(),
  state: z.string(),
  attempts_made: z.number().int(),
  attempts_max: z.number().int(),
  failed_reason: z.string().nullable(),
  progress: z.unknown(),
  created_at: z.string().nullable(),
  processed_at: z.string().nullable(),
  finished_at: z.string().nullable(),
  outcome: outcomeSchema
    .optional()
    .describe(
      'a restart or deploy: how it ended (rolled_out with duration_s, failed or progress_deadline_exceeded with reason), or why it waits (held, with until)',
    ),
  hold: holdViewSchema.optional().describe('state held: the freeze or window that holds it (the job is a delayed job until then)'),
  approval: approvalViewSchema
    .optional()
    .describe('a change waiting for approval, or rejected or expired: the approval (its id is the job id the change gets)'),
});

export const jobListSchema = z.object({
  state: z.enum(LISTABLE_STATES),
  total: z.number().int(),
  offset: z.number().int(),
  limit: z.number().int(),
  next_offset: z.number().int().nullable().describe('offset of the next page; null on the last page'),
  next_cursor: nextCursorSchema,
  jobs: z.array(jobViewSchema),
});

export const retryAnswerSchema = z.object({ retried: z.literal(true), job: jobViewSchema });

export function jobsRouter(deps: JobsDeps): Router {
  const r = Router();
  const { anyKey, operatorKey } = keyChecks(deps);

  only(r, 'get', '/ops/jobs', anyKey, async (req, res) => {
    const q = parseQuery(listJobsQuerySchema, req.query);
    const { limit, cursor } = q;
    let { state, offset = 0 } = q;
    if (cursor !== undefined) {
      if (q.offset !== undefined) throw new UnprocessableError('give cursor or offset, not both', 'invalid_query');
      const c = decodeCursor('jobs', cursor, z.number().int().min(0).max(MAX_OFFSET), {
        state: typeof req.query.state === 'string' ? state : undefined,
      });
      const s = z.enum(LISTABLE_STATES).safeParse(c.filters.state);
      if (!s.success) throw new UnprocessableError('cursor is not a next_cursor of this list', 'invalid_cursor');
      offset = c.position;
      state = s.data;
    }
    const page = await deps.jobs.list(state, offset, limit);
    const next = offset + page.jobs.length;
    const more = next < page.total && page.jobs.length > 0;
    res.json({
      state,
      total: page.total,
      offset,
      limit,
      next_offset: more ? next : null,
      // A cursor past the deepest offset would be refused: the last reachable page has none.
      next_cursor: more && next <= MAX_OFFSET ? encodeCursor('jobs', next, { state }) : null,
      jobs: page.jobs,
    });
  });

  only(r, 'get', '/ops/jobs/:id', anyKey, async (req, res) => {
    const id = req.params.id;
    if (!JOB_ID.test(id)) throw new NotFoundError('job not found', 'job_not_found');
    const job = await deps.jobs.get(id);
    const g = deps.changeRecords;
    if (job && job.state === 'delayed' && g) {
      const hold = await redisCall(() => g.holds.get(id), g.redis);
      if (hold) {
        res.json({
          ...job,
          state: 'held',
          outcome: { result: 'held', reason: describeReasons(hold.reasons), until: new Date(hold.until).toISOString() },
          hold: holdView(hold),
        });
        return;
      }
    }
    if (job) {
      res.json(job);
      return;
    }
    // A change still waiting for approval (or rejected, expired) has no job: its approval stands for it.
    const approval = g && APPROVAL_ID.test(id) ? await redisCall(() => g.approvals.get(id), g.redis) : undefined;
    if (!approval) throw new NotFoundError('job not found', 'job_not_found');
    const now = g!.now();
    const status = effectiveStatus(approval, now);
    const view = approvalView(approval, now);
    const reason: Partial<Record<typeof status, string>> = {
      rejected: `${view.rejected?.by}: ${view.rejected?.reason}`,
      expired: `nobody approved it before ${view.expires_at}`,
      superseded: `superseded by deploy ${view.superseded_by ?? '?'}`,
    };
    res.json({
      id,
      name: kindOfApproval(approval.change).job,
      state: status === 'pending' ? 'pending_approval' : status,
      attempts_made: 0,
      attempts_max: 0,
      failed_reason: null,
      progress: null,
      created_at: view.created_at,
      processed_at: null,
      finished_at: status === 'pending' ? null : (view.decided_at ?? view.expires_at),
      ...(reason[status] ? { outcome: { result: status, reason: reason[status] } } : {}),
      approval: view,
    });
  });

  only(r, 'post', '/ops/jobs/:id/retry', operatorKey, ...rawBody(deps.config.BODY_LIMIT), async (req, res) => {
    const id = req.params.id;
    if (!JOB_ID.test(id)) throw new NotFoundError('job not found', 'job_not_found');
    const body = parseBody(req, retryBodySchema);
    res.locals.auditFields = { job_id: id, retry_reason: body.reason };
    // A dead letter may be any host's restart or any project's deploy: a scoped key does not retry them.
    if (scopeOf(res))
      throw new ForbiddenError('a scoped key cannot retry dead-lettered jobs; an unscoped operator key can', 'out_of_scope');
    const out = await handChange({ retryReplicated: deps.retryReplicated }, res.locals, {
      submit: () =>
        deps.deadLetters.retry(id, {
          requester: principalOf(res),
          reason: body.reason,
          auditId: res.locals.requestId,
        }),
      audit: (out) =>
        out.outcome === 'pending_approval'
          ? { job_id: id, retry_reason: body.reason, outcome: 'pending_approval', approval_id: out.approval_id }
          : out.outcome === 'retried'
            ? {
                job_id: id,
                job_name: out.job.name,
                retry_reason: body.reason,
                outcome: 'retried',
                ...(out.job.id !== id ? { retried_as: out.job.id } : {}),
              }
            : undefined,
      // A retry that waits for approval, or did not happen, wrote nothing of its own to confirm.
      handed: (out) => (out.outcome === 'retried' ? { wrote: 'retry' } : { wrote: 'nothing' }),
    });
    refuseUnretried(out);
    if (out.outcome === 'pending_approval') {
      res.status(202).json({ retried: false, ...out });
      return;
    }
    deps.logger.info('dead-lettered job retried', {
      job_id: id,
      job_name: out.job.name,
      ...(out.job.id !== id ? { retried_as: out.job.id } : {}),
      request_id: res.locals.requestId,
    });
    res.json({ retried: true, job: out.job, ...(out.held_until ? { held_until: out.held_until } : {}) });
  });
  return r;
}
