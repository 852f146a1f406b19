import { Router, type Request, type Response } from 'express';
import type { Redis } from 'ioredis';
import { z } from 'zod';
import { submitCiDeploy, type CiDeployAnswer } from '../changes/ciDeploy.js';
import { submitRollback } from '../changes/rollback.js';
import { handChange, type Handed } from '../changes/hand.js';
import { projectNamespace, type Pipeline } from '../changes/deps.js';
import { DEPLOY_STATES, deployView, type DeployEntry } from '../changes/deployOrder/history.js';
import { redisCall } from '../domain/redisOps.js';
import { scopeAdmits } from '../shared/scope.js';
import type { ConfirmChange, ConfirmReplicated, Written } from '../domain/replication.js';
import { keyChecks, type KeyedDeps, requireOidcOrOperatorKey } from '../middleware/auth.js';
import { rawBody } from '../middleware/body.js';
import { methodNotAllowed } from '../middleware/errors.js';
import type { OidcCaller, OidcVerifier } from '../middleware/oidc.js';
import { requireInScope, scopeOf } from '../middleware/scope.js';
import type { ApiConfig } from '../api/config.js';
import { ForbiddenError, NotFoundError, UnprocessableError } from '../shared/errors.js';
import { findProject, type Inventory } from '../shared/inventory.js';
import type { Logger } from '../shared/logger.js';
import { principalOf } from './principal.js';
import { idempotencyKeyOf } from './restartQuery.js';
import { decodeCursor, encodeCursor, only, pageQueryShape, parseBody, parseQuery, sortKeySchema } from './request.js';

/**
 * CI deploys (POST /ops/deploys, for an OIDC identity or an operator key, never the shared bearer
 * token: a body may leave out what the token binds, never contradict it), rollbacks, and the deploy
 * history for any valid key. A scoped credential acts on and sees only the projects its scope admits:
 * the others' deploys are left out of the list and 404 by id, as if not kept.
 */
export interface DeploysDeps extends KeyedDeps {
  config: Pick<ApiConfig, 'apiKeys' | 'OPS_BEARER_TOKEN' | 'BODY_LIMIT'>;
  redis: Redis;
  inventory: Inventory;
  logger: Logger;
  oidc?: OidcVerifier;
  replicated?: ConfirmReplicated;
  changed?: ConfirmChange;
  pipeline: Pipeline;
}

/** A full commit id: 40 hex digits (SHA-1) or 64 (SHA-256), lower case. */
const FULL_COMMIT = /^(?:[0-9a-f]{40}|[0-9a-f]{64})$/;

export const deployBodySchema = z.strictObject({
  project: z.string().min(1).max(255).optional().describe('an inventory project; optional when the OIDC rule binds it'),
  ref: z
    .string()
    .min(1)
    .max(255)
    .optional()
    .describe("the ref deployed, e.g. refs/heads/main (one of the project's refs); optional when the OIDC rule binds it"),
  sha: z
    .string()
    .regex(FULL_COMMIT, 'must be a full commit id (40 or 64 lower-case hex digits)')
    .optional()
    .describe('the commit; optional when the OIDC rule binds it'),
  reason: z.string().trim().min(1).max(500).optional().describe('why: audited, carried by the job and an approval'),
});

export const deployAnswerSchema = z.object({
  project: z.string(),
  ref: z.string(),
  sha: z.string(),
  event_id: z.string().describe('ci:<project>:<ref>:<sha>: one deploy per commit within 24 h'),
  job_id: z.string().describe('the job (a duplicate: the earlier one), or the approval id while it waits'),
  accepted: z.boolean(),
  duplicate: z.boolean().describe('always the negation of accepted'),
  status: z.enum(['queued', 'held', 'pending_approval']),
  approval_id: z.string().optional(),
  expires_at: z.string().optional(),
  held_until: z.string().optional(),
  held_reasons: z.string().optional(),
});

export const rollbackBodySchema = z.strictObject({
  project: z.string().min(1).max(255).describe('an inventory project'),
  ref: z.string().min(1).max(255).describe("the ref rolled back, e.g. refs/heads/main (one of the project's refs)"),
  to: z
    .string()
    .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$/, 'must be a commit as the deploy history names it (letters, digits, ".", "_", "-")')
    .optional()
    .describe(
      "the commit to go back to: one that succeeded on this ref; default the newest succeeded deploy's commit other than the current one",
    ),
  reason: z.string().trim().min(1).max(500).describe('why: audited, carried by the job and an approval'),
  override: z
    .literal(true)
    .optional()
    .describe(
      "let it through the project's freezes and windows as they stand now, with the reason: a person only (403 override_not_allowed)",
    ),
});

export const rollbackAnswerSchema = deployAnswerSchema.extend({
  sha: z.string().describe('the commit deployed again'),
  rolled_back_from: z.string().nullable().describe("the ref's current deploy (the last succeeded) when the rollback was accepted"),
  rolled_back_to: z.string().describe('the earlier succeeded deploy whose commit it deploys'),
  event_id: z.string().describe('rollback:<uuid>: its own identity, never a duplicate of a deploy of that commit'),
});

export const listDeploysQuerySchema = z.object({
  project: z.string().min(1).max(255).optional().describe('only this project'),
  ref: z.string().min(1).max(255).optional().describe('only this ref, e.g. refs/heads/main'),
  state: z.enum(DEPLOY_STATES).optional().describe('only deploys in this state'),
  ...pageQueryShape(20, 100),
});

const DEPLOY_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/** Whether the request's credential may see the deploys of `project`. */
function admits(res: Response, inventory: Inventory, project: string): boolean {
  const scope = scopeOf(res);
  return !scope || scopeAdmits(scope, { kind: 'project', project, namespace: projectNamespace(inventory, project) });
}

/** A body's field that differs from what the caller's OIDC token binds: 403. */
function refuseUnbound(f: string, given: string | undefined, bound: string | undefined, why = ''): void {
  if (bound !== undefined && given !== undefined && bound !== given) {
    throw new ForbiddenError(
      `the body's ${f} ${JSON.stringify(given)} differs from the ${f} the OIDC token names (${JSON.stringify(bound)})${why}`,
      'deploy_not_bound_to_token',
    );
  }
}

/** project, ref and sha: the token's where its rule binds them (a body disagreeing is refused), else the body's. */
function resolveTarget(body: z.infer<typeof deployBodySchema>, caller: OidcCaller | undefined) {
  const out: { project?: string; ref?: string; sha?: string } = {};
  for (const f of ['project', 'ref', 'sha'] as const) {
    const bound = caller?.binds[f];
    refuseUnbound(f, body[f], bound, '; a CI identity deploys exactly what its token names');
    const v = bound ?? body[f];
    if (v === undefined)
      throw new UnprocessableError(`invalid body field ${f}: required (the caller's token does not name it)`, 'invalid_body');
    out[f] = v;
  }
  if (!FULL_COMMIT.test(out.sha!)) {
    throw new UnprocessableError('invalid body field sha: must be a full commit id (40 or 64 lower-case hex digits)', 'invalid_body');
  }
  return out as { project: string; ref: string; sha: string };
}

/** The audit line's fields of a deploy or a rollback. */
const deployAudit = (answer: CiDeployAnswer) => ({
  event_id: answer.event_id,
  job_id: answer.job_id,
  outcome: answer.accepted ? 'accepted' : 'duplicate',
  deploy_status: answer.status,
  project: answer.project,
  ref: answer.ref,
  sha: answer.sha,
});

/** Only what this call wrote (a duplicate or a repeat wrote nothing). */
const handed = ({ answer, written }: { answer: CiDeployAnswer; written?: Written | undefined }): Handed =>
  answer.status === 'pending_approval'
    ? { wrote: 'approval', approvalId: answer.approval_id!, event: 'requested' }
    : { wrote: 'job', ...(written ? { written } : {}) };

export function deploysRouter(deps: DeploysDeps): Router {
  const r = Router();
  const auth = requireOidcOrOperatorKey(deps.config.apiKeys, deps.config.OPS_BEARER_TOKEN, deps.metrics, deps.apiKeyPolicy, deps.oidc);
  const body = rawBody(deps.config.BODY_LIMIT);

  const { anyKey } = keyChecks(deps);
  const history = deps.pipeline.deployHistory;
  const projectInScope = (res: Response, project: string) => {
    const entry = findProject(deps.inventory, project);
    if (entry) requireInScope(res, { kind: 'project', project, namespace: entry.namespace });
  };

  r.route('/ops/deploys')
    .get(anyKey, async (req: Request, res: Response) => {
      const q = parseQuery(listDeploysQuerySchema, req.query);
      let { project, ref, state } = q;
      let after: readonly [number, string] | undefined;
      if (q.cursor !== undefined) {
        const c = decodeCursor('deploys', q.cursor, sortKeySchema, { project, ref, state });
        after = c.position;
        project = c.filters.project;
        ref = c.filters.ref;
        const s = z.enum(DEPLOY_STATES).optional().safeParse(c.filters.state);
        state = s.success ? s.data : undefined;
      }
      const page = await redisCall(
        () =>
          history.list({
            ...(project !== undefined ? { project } : {}),
            ...(after ? { after } : {}),
            limit: q.limit,
            admit: (e: DeployEntry) =>
              (project === undefined || e.project === project) &&
              (ref === undefined || e.ref === ref) &&
              (state === undefined || e.state === state) &&
              admits(res, deps.inventory, e.project),
          }),
        deps.redis,
      );
      res.json({
        deploys: page.items.map(deployView),
        next_cursor: page.next ? encodeCursor('deploys', page.next, { project, ref, state }) : null,
      });
    })
    .post(auth, ...body, async (req: Request, res: Response) => {
      // Empty meaning `{}`: what the token binds may be all there is to say.
      const b = parseBody(req, deployBodySchema, {});
      const target = resolveTarget(b, res.locals.oidc as OidcCaller | undefined);
      projectInScope(res, target.project);
      const idempotencyKey = idempotencyKeyOf(req.get('idempotency-key'));
      const requester = principalOf(res);
      const { http, answer } = await handChange(deps, res.locals, {
        submit: () =>
          submitCiDeploy(deps, {
            ...target,
            requester,
            auditId: res.locals.requestId,
            ...(idempotencyKey !== undefined ? { idempotencyKey } : {}),
            ...(b.reason ? { reason: b.reason } : {}),
          }),
        audit: ({ answer }) => ({ ...deployAudit(answer), ...(b.reason ? { reason: b.reason } : {}) }),
        handed,
      });
      res.status(http).json(answer);
    })
    .all(methodNotAllowed(['GET', 'POST']));

  only(r, 'post', '/ops/deploys/rollback', auth, ...body, async (req: Request, res: Response) => {
    const b = parseBody(req, rollbackBodySchema, {});
    // An OIDC rule that binds a project or ref from the token's claims rolls back only that one.
    const binds = (res.locals.oidc as OidcCaller | undefined)?.binds;
    for (const f of ['project', 'ref'] as const) refuseUnbound(f, b[f], binds?.[f]);
    projectInScope(res, b.project);
    const { answer } = await handChange(deps, res.locals, {
      submit: () =>
        submitRollback(deps, {
          project: b.project,
          ref: b.ref,
          ...(b.to !== undefined ? { to: b.to } : {}),
          requester: principalOf(res),
          auditId: res.locals.requestId,
          reason: b.reason,
          ...(b.override ? { override: true } : {}),
        }),
      audit: ({ answer }) => ({
        ...deployAudit(answer),
        outcome: 'accepted',
        rolled_back_from: answer.rolled_back_from,
        reason: b.reason,
      }),
      handed,
    });
    res.status(202).json(answer);
  });

  only(r, 'get', '/ops/deploys/:id', anyKey, async (req, res) => {
    const id = String(req.params.id);
    const e = DEPLOY_ID.test(id) ? await redisCall(() => history.get(id), deps.redis) : undefined;
    if (!e || !admits(res, deps.inventory, e.project)) throw new NotFoundError('deploy not found', 'deploy_not_found');
    res.json(deployView(e));
  });

  only(r, 'get', '/ops/projects/:project', anyKey, async (req, res) => {
    const project = String(req.params.project);
    const entry = findProject(deps.inventory, project);
    if (project.length > 255) throw new NotFoundError('project not found', 'project_not_found');
    requireInScope(res, { kind: 'project', project, namespace: entry?.namespace ?? '' });
    const refs = await redisCall(() => history.refs(project), deps.redis);
    if (!entry && refs.size === 0) throw new NotFoundError('project not found', 'project_not_found');
    const names = [...new Set([...(entry?.refs ?? []), ...refs.keys()])];
    res.json({
      project,
      refs: names.map((ref) => {
        const kept = refs.get(ref);
        return {
          ref,
          current: kept?.current ? deployView(kept.current) : null,
          running: kept?.running ? deployView(kept.running) : null,
        };
      }),
    });
  });

  return r;
}
