import { keysetPage, nextCursorSchema, only, pageQueryShape, parseBody, parseQuery } from './request.js';
import { Router } from 'express';
import { z } from 'zod';
import {
  declareFreeze,
  freezeBodySchema,
  freezeViewSchema,
  getFreeze,
  holdViewSchema,
  liftBodySchema,
  liftFreeze,
  listFreezes,
  listHolds,
} from '../changes/freezes/service.js';
import type { Pipeline } from '../changes/deps.js';
import type { ConfirmChange } from '../domain/replication.js';
import { keyChecks, type KeyedDeps } from '../middleware/auth.js';
import { rawBody } from '../middleware/body.js';
import { methodNotAllowed } from '../middleware/errors.js';
import { requireInScope, scopeOf } from '../middleware/scope.js';
import { projectNamespace } from '../changes/deps.js';
import type { ApiConfig } from '../api/config.js';
import { ForbiddenError } from '../shared/errors.js';
import type { JobReads } from '../shared/jobReads.js';
import { FREEZES_KEY, HOLDS_KEY } from '../shared/keys.js';
import type { Logger } from '../shared/logger.js';

/**
 * Freezes and holds (src/changes/freezes/service.ts), read with any valid key, soonest end first.
 * An operator key declares a freeze (POST /ops/freezes) or lifts one early (DELETE
 * /ops/freezes/:id, body {reason}), releasing the deploys it held; both audited with the reason.
 */
interface FreezesDeps extends KeyedDeps, Pick<Pipeline, 'inventory'> {
  config: Pick<ApiConfig, 'apiKeys' | 'BODY_LIMIT'>;
  pipeline: Pipeline;
  jobs: Pick<JobReads, 'get'>;
  logger: Logger;
  /** REDIS_MIN_REPLICAS_ACK for a freeze declared or lifted and the deploys it releases; absent = off. */
  changed?: ConfirmChange;
}

export const freezeListSchema = z.object({ freezes: z.array(freezeViewSchema), next_cursor: nextCursorSchema });
export const holdListSchema = z.object({ holds: z.array(holdViewSchema), next_cursor: nextCursorSchema });

export const listFreezesQuerySchema = z.object(pageQueryShape(100, 500));

export function freezesRouter(deps: FreezesDeps): Router {
  const r = Router();
  const { anyKey, operatorKey } = keyChecks(deps);
  const body = rawBody(deps.config.BODY_LIMIT);
  const g = deps.pipeline;

  r.route('/ops/freezes')
    .get(anyKey, async (req, res) => {
      const q = parseQuery(listFreezesQuerySchema, req.query);
      const page = keysetPage('freezes', await listFreezes(g), (f) => [Date.parse(f.ends_at), f.id], q);
      res.json({ freezes: page.items, next_cursor: page.next_cursor });
    })
    .post(operatorKey, ...body, async (req, res) => {
      const parsed = parseBody(req, freezeBodySchema);
      res.locals.auditFields = { scope: parsed.scope, reason: parsed.reason };
      freezeInScope(res, deps.inventory, parsed);
      const freeze = await declareFreeze(g, parsed, res.locals.principal!);
      res.locals.auditFields = { freeze_id: freeze.id, scope: freeze.scope, reason: freeze.reason, ends_at: freeze.ends_at };
      // A freeze is no change handed to the pipeline: its own WAIT, not handChange's.
      await deps.changed?.(`freeze ${freeze.id} declared`, [FREEZES_KEY]);
      deps.logger.info('freeze declared', { freeze_id: freeze.id, scope: freeze.scope, ends_at: freeze.ends_at, by: res.locals.principal });
      res.status(201).json(freeze);
    })
    .all(methodNotAllowed(['GET', 'POST']));

  r.route('/ops/freezes/:id')
    .get(anyKey, async (req, res) => {
      res.json(await getFreeze(g, String(req.params.id)));
    })
    .delete(operatorKey, ...body, async (req, res) => {
      const id = String(req.params.id);
      const parsed = parseBody(req, liftBodySchema);
      res.locals.auditFields = { freeze_id: id, reason: parsed.reason };
      if (scopeOf(res)) freezeInScope(res, deps.inventory, await getFreeze(g, id));
      const out = await liftFreeze(g, id);
      res.locals.auditFields = { freeze_id: id, reason: parsed.reason, released: out.released };
      // A freeze is no change handed to the pipeline (the deploys it releases wake in the worker): its own WAIT.
      await deps.changed?.(`freeze ${id} lifted`, [FREEZES_KEY, HOLDS_KEY]);
      deps.logger.info('freeze lifted', { freeze_id: id, by: res.locals.principal, released: out.released.length });
      res.json(out);
    })
    .all(methodNotAllowed(['GET', 'DELETE']));

  only(r, 'get', '/ops/holds', anyKey, async (req, res) => {
    const q = parseQuery(listFreezesQuerySchema, req.query);
    const holds = await listHolds(g, async (id) => (await deps.jobs.get(id))?.state);
    const page = keysetPage('holds', holds, (h) => [Date.parse(h.until), h.job_id], q);
    res.json({ holds: page.items, next_cursor: page.next_cursor });
  });

  return r;
}

/** A scoped key declares or lifts only freezes of a namespace or project it admits; a freeze of everything is outside any scope. */
function freezeInScope(
  res: Parameters<typeof requireInScope>[0],
  inventory: Pipeline['inventory'],
  f: { scope: string; namespace?: string | null; project?: string | null },
): void {
  if (!scopeOf(res)) return;
  if (f.scope === 'namespace' && f.namespace) return requireInScope(res, { kind: 'namespace', namespace: f.namespace });
  if (f.scope === 'project' && f.project) {
    return requireInScope(res, { kind: 'project', project: f.project, namespace: projectNamespace(inventory, f.project) });
  }
  throw new ForbiddenError('a freeze of everything is outside the scope of this credential', 'out_of_scope');
}
