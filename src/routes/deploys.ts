import { Router, type Request, type Response } from 'express';
import type { Redis } from 'ioredis';
import { z } from 'zod';
import { submitCiDeploy } from '../changes/ciDeploy.js';
import { submitRollback } from '../changes/rollback.js';
import { handChange } from '../changes/hand.js';
import type { Pipeline } from '../changes/deps.js';
import type { ConfirmChange, ConfirmReplicated } from '../domain/replication.js';
import { keyChecks, type KeyedDeps, requireOidcOrOperatorKey } from '../middleware/auth.js';
import { parseJson, rawBody } from '../middleware/body.js';
import { methodNotAllowed } from '../middleware/errors.js';
import type { OidcCaller, OidcVerifier } from '../middleware/oidc.js';
import { requireInScope } from '../middleware/scope.js';
import type { ApiConfig } from '../api/config.js';
import { ForbiddenError, UnprocessableError } from '../shared/errors.js';
import { findProject, type Inventory } from '../shared/inventory.js';
import type { Logger } from '../shared/logger.js';
import { principalOf } from './principal.js';
import { idempotencyKeyOf } from './restartQuery.js';
import { getDeploy, getProject, listDeploys } from './deployHistory.js';

/**
 * POST /ops/deploys: a deploy of one commit asked for by CI (origin `ci`, src/changes/ciDeploy.ts).
 * Callers: an OIDC identity (OPS_OIDC_FILE) or an operator key, never the shared bearer token.
 * The body `{project, ref, sha}` may leave out what the caller's OIDC rule binds from the token's
 * claims (a GitHub or GitLab token names its repository, ref and commit); a body that says
 * otherwise is refused (403 `deploy_not_bound_to_token`). An operator key names all three. The
 * credential's scope must admit the project.
 * POST /ops/deploys/rollback: a deploy of the commit of an earlier succeeded deploy
 * (src/changes/rollback.ts), for an operator key or an OIDC rule with role operator; the
 * credential's scope must admit the project.
 * GET /ops/deploys, /ops/deploys/{id}, /ops/projects/{project}: the history of deploys, for any
 * valid key (src/routes/deployHistory.ts).
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
export const FULL_COMMIT = /^(?:[0-9a-f]{40}|[0-9a-f]{64})$/;

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

/** The body parsed by `schema`, empty meaning `{}`: 422 invalid_body naming the first fault. */
function parseBody<S extends z.ZodType>(req: Request, schema: S): z.infer<S> {
  const raw = req.body as Buffer;
  const value = raw.length === 0 ? {} : parseJson(raw);
  const parsed = schema.safeParse(value);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const field = issue.path.join('.');
    throw new UnprocessableError(
      issue.code === 'unrecognized_keys'
        ? `invalid body: unknown field ${issue.keys.join(', ')}`
        : `invalid body field ${field}: ${issue.message}`,
      'invalid_body',
    );
  }
  return parsed.data;
}

/** The body, empty meaning `{}`: what the token binds may be all there is to say. */
const bodyOf = (req: Request): z.infer<typeof deployBodySchema> => parseBody(req, deployBodySchema);

/** project, ref and sha: the token's where its rule binds them (a body disagreeing is refused), else the body's. */
function resolveTarget(body: z.infer<typeof deployBodySchema>, caller: OidcCaller | undefined) {
  const out: { project?: string; ref?: string; sha?: string } = {};
  for (const f of ['project', 'ref', 'sha'] as const) {
    const bound = caller?.binds[f];
    const given = body[f];
    if (bound !== undefined && given !== undefined && bound !== given) {
      throw new ForbiddenError(
        `the body's ${f} ${JSON.stringify(given)} differs from the ${f} the OIDC token names (${JSON.stringify(bound)}); a CI identity deploys exactly what its token names`,
        'deploy_not_bound_to_token',
      );
    }
    const v = bound ?? given;
    if (v === undefined)
      throw new UnprocessableError(`invalid body field ${f}: required (the caller's token does not name it)`, 'invalid_body');
    out[f] = v;
  }
  if (!FULL_COMMIT.test(out.sha!)) {
    throw new UnprocessableError('invalid body field sha: must be a full commit id (40 or 64 lower-case hex digits)', 'invalid_body');
  }
  return out as { project: string; ref: string; sha: string };
}

export function deploysRouter(deps: DeploysDeps): Router {
  const r = Router();
  const auth = requireOidcOrOperatorKey(deps.config.apiKeys, deps.config.OPS_BEARER_TOKEN, deps.metrics, deps.apiKeyPolicy, deps.oidc);
  const body = rawBody(deps.config.BODY_LIMIT);

  const { anyKey } = keyChecks(deps);
  const history = { inventory: deps.inventory, redis: deps.redis, history: deps.pipeline.deployHistory };

  r.route('/ops/deploys')
    .get(anyKey, listDeploys(history))
    .post(auth, ...body, async (req: Request, res: Response) => {
      const caller = res.locals.oidc as OidcCaller | undefined;
      const b = bodyOf(req);
      const target = resolveTarget(b, caller);
      const entry = findProject(deps.inventory, target.project);
      if (entry) requireInScope(res, { kind: 'project', project: target.project, namespace: entry.namespace });
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
        audit: ({ answer }) => ({
          event_id: answer.event_id,
          job_id: answer.job_id,
          outcome: answer.accepted ? 'accepted' : 'duplicate',
          deploy_status: answer.status,
          project: answer.project,
          ref: answer.ref,
          sha: answer.sha,
          ...(b.reason ? { reason: b.reason } : {}),
        }),
        // Only what this call wrote (a duplicate or a repeat wrote nothing).
        handed: ({ answer, written }) =>
          answer.status === 'pending_approval'
            ? { wrote: 'approval', approvalId: answer.approval_id!, event: 'requested' }
            : { wrote: 'job', ...(written ? { written } : {}) },
      });
      res.status(http).json(answer);
    })
    .all(methodNotAllowed(['GET', 'POST']));

  r.route('/ops/deploys/rollback')
    .post(auth, ...body, async (req: Request, res: Response) => {
      const b = parseBody(req, rollbackBodySchema);
      // An OIDC rule that binds a project or ref from the token's claims rolls back only that one.
      const binds = (res.locals.oidc as OidcCaller | undefined)?.binds;
      for (const f of ['project', 'ref'] as const) {
        const bound = binds?.[f];
        if (bound !== undefined && bound !== b[f]) {
          throw new ForbiddenError(
            `the body's ${f} ${JSON.stringify(b[f])} differs from the ${f} the OIDC token names (${JSON.stringify(bound)})`,
            'deploy_not_bound_to_token',
          );
        }
      }
      const entry = findProject(deps.inventory, b.project);
      if (entry) requireInScope(res, { kind: 'project', project: b.project, namespace: entry.namespace });
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
          event_id: answer.event_id,
          job_id: answer.job_id,
          outcome: 'accepted',
          deploy_status: answer.status,
          project: answer.project,
          ref: answer.ref,
          sha: answer.sha,
          rolled_back_from: answer.rolled_back_from,
          reason: b.reason,
        }),
        handed: ({ answer, written }) =>
          answer.status === 'pending_approval'
            ? { wrote: 'approval', approvalId: answer.approval_id!, event: 'requested' }
            : { wrote: 'job', ...(written ? { written } : {}) },
      });
      res.status(202).json(answer);
    })
    .all(methodNotAllowed(['POST']));

  r.route('/ops/deploys/:id')
    .get(anyKey, getDeploy(history))
    .all(methodNotAllowed(['GET']));
  r.route('/ops/projects/:project')
    .get(anyKey, getProject(history))
    .all(methodNotAllowed(['GET']));

  return r;
}
