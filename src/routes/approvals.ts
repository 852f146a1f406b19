import { keysetPage, nextCursorSchema, only, pageQueryShape, parseBody, parseQuery } from './request.js';
import { Router } from 'express';
import { z } from 'zod';
import { kindOfApproval } from '../changes/kinds/index.js';
import { handChange } from '../changes/hand.js';
import { decideApproval } from '../changes/approvals/decide.js';
import { approvalView, approvalViewSchema, decisionBodySchema, type DecisionAnswer } from '../changes/approvals/view.js';
import { principalOf } from './principal.js';
import type { Pipeline } from '../changes/deps.js';
import type { ConfirmChange } from '../domain/replication.js';
import { redisCall } from '../domain/redisOps.js';
import { keyChecks, type KeyedDeps } from '../middleware/auth.js';
import { rawBody } from '../middleware/body.js';
import { requireInScope, scopeOf } from '../middleware/scope.js';
import type { ApiConfig } from '../api/config.js';
import { approvalKey } from '../shared/keys.js';
import { NotFoundError, UnprocessableError } from '../shared/errors.js';
import type { Logger } from '../shared/logger.js';

/**
 * Four-eyes approvals (src/changes/approvals/decide.ts): GET /ops/approvals (pending, soonest expiry
 * first) and /ops/approvals/:id for any valid key; POST /ops/approvals/:id/approve and /reject for an
 * operator key, audited. An approval while the change still needs others answers 202; a decision 200.
 */
interface ApprovalsDeps extends KeyedDeps, Pick<Pipeline, 'approvals' | 'redis' | 'now'> {
  config: Pick<ApiConfig, 'apiKeys' | 'BODY_LIMIT'>;
  pipeline: Pipeline;
  logger: Logger;
  /** REDIS_MIN_REPLICAS_ACK for a decision and the job it queues; absent = off. */
  changed?: ConfirmChange;
}

export const approvalListSchema = z.object({ approvals: z.array(approvalViewSchema), next_cursor: nextCursorSchema });

export const listApprovalsQuerySchema = z.object(pageQueryShape(100, 500));

export function approvalsRouter(deps: ApprovalsDeps): Router {
  const r = Router();
  const { anyKey, operatorKey } = keyChecks(deps);

  only(r, 'get', '/ops/approvals', anyKey, async (req, res) => {
    const q = parseQuery(listApprovalsQuerySchema, req.query);
    const now = deps.now();
    const pending = await redisCall(() => deps.approvals.pending(now), deps.redis);
    const page = keysetPage('approvals', pending, (a) => [a.expires_at, a.id], q);
    res.json({ approvals: page.items.map((a) => approvalView(a, now)), next_cursor: page.next_cursor });
  });

  only(r, 'get', '/ops/approvals/:id', anyKey, async (req, res) => {
    const a = await redisCall(() => deps.approvals.get(String(req.params.id)), deps.redis);
    if (!a) throw new NotFoundError('approval not found', 'approval_not_found');
    res.json(approvalView(a, deps.now()));
  });

  for (const action of ['approve', 'reject'] as const) {
    only(r, 'post', `/ops/approvals/:id/${action}`, operatorKey, ...rawBody(deps.config.BODY_LIMIT), async (req, res) => {
      const id = String(req.params.id);
      const body = parseBody(req, decisionBodySchema);
      if (action === 'reject' && body.override !== undefined) {
        throw new UnprocessableError('override applies to approve only', 'invalid_body');
      }
      const audited = { approval_id: id, decision: action, reason: body.reason };
      res.locals.auditFields = audited;
      // A scoped key decides only changes its scope admits (read first only for such a key).
      if (scopeOf(res)) {
        const c = (await redisCall(() => deps.approvals.get(id), deps.redis))?.change;
        if (c) {
          const kind = kindOfApproval(c);
          requireInScope(res, kind.scopeTarget(kind.fromApproval(c).target));
        }
      }
      const decision = {
        id,
        action,
        by: principalOf(res),
        reason: body.reason,
        ...(body.override ? { override: true } : {}),
        auditId: res.locals.requestId,
      };
      const audit = (out: DecisionAnswer) => ({
        ...audited,
        status: out.status,
        ...(out.job_id ? { job_id: out.job_id } : {}),
        ...(body.override ? { override: true } : {}),
      });
      let out: DecisionAnswer;
      if (action === 'approve') {
        // An approval given may be the last, which hands the change to the pipeline.
        out = await handChange(deps, res.locals, {
          submit: () => decideApproval(deps.pipeline, decision),
          audit,
          handed: () => ({ wrote: 'approval', approvalId: id, event: 'approved' }),
        });
      } else {
        // A rejection hands no change over: its own audit line and WAIT.
        out = await decideApproval(deps.pipeline, decision);
        res.locals.auditFields = audit(out);
        await deps.changed?.(`approval ${id} rejected`, [approvalKey(id)]);
      }
      deps.logger.info(`approval ${action === 'approve' ? 'given' : 'rejected'}`, {
        approval_id: id,
        by: res.locals.principal,
        owner: res.locals.owner,
        status: out.status,
        job_id: out.job_id,
        request_id: res.locals.requestId,
      });
      res.status(out.status === 'pending' ? 202 : 200).json(out);
    });
  }
  return r;
}
