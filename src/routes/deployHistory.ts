import type { Request, Response } from 'express';
import { z } from 'zod';
import { DEPLOY_STATES, deployView, type DeployEntry, type DeployHistory } from '../changes/deployOrder/history.js';
import { redisCall } from '../domain/redisOps.js';
import { requireInScope, scopeOf } from '../middleware/scope.js';
import { NotFoundError } from '../shared/errors.js';
import { findProject, type Inventory } from '../shared/inventory.js';
import { scopeAdmits } from '../shared/scope.js';
import type { Redis } from 'ioredis';
import { parseQuery } from './invalid.js';
import { decodeCursor, encodeCursor, pageQueryShape, sortKeySchema } from './paging.js';

/**
 * The history of deploys (src/changes/deployOrder/history.ts), for any valid key: GET /ops/deploys
 * (newest accepted first), /ops/deploys/{id}, and /ops/projects/{project} (each ref's current and
 * running deploy). A scoped credential sees only the projects its scope admits: the others' deploys
 * are left out of the list and 404 by id, as if not kept; a project named in the path is refused 403.
 */
interface DeployHistoryDeps {
  inventory: Inventory;
  redis: Redis;
  history: DeployHistory;
}

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
  return !scope || scopeAdmits(scope, { kind: 'project', project, namespace: findProject(inventory, project)?.namespace ?? '' });
}

export function listDeploys(deps: DeployHistoryDeps) {
  return async (req: Request, res: Response): Promise<void> => {
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
        deps.history.list({
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
  };
}

export function getDeploy(deps: DeployHistoryDeps) {
  return async (req: Request, res: Response): Promise<void> => {
    const id = String(req.params.id);
    const e = DEPLOY_ID.test(id) ? await redisCall(() => deps.history.get(id), deps.redis) : undefined;
    if (!e || !admits(res, deps.inventory, e.project)) throw new NotFoundError('deploy not found', 'deploy_not_found');
    res.json(deployView(e));
  };
}

export function getProject(deps: DeployHistoryDeps) {
  return async (req: Request, res: Response): Promise<void> => {
    const project = String(req.params.project);
    const entry = findProject(deps.inventory, project);
    if (project.length > 255) throw new NotFoundError('project not found', 'project_not_found');
    requireInScope(res, { kind: 'project', project, namespace: entry?.namespace ?? '' });
    const refs = await redisCall(() => deps.history.refs(project), deps.redis);
    if (!entry && refs.size === 0) throw new NotFoundError('project not found', 'project_not_found');
    const names = [...new Set([...(entry?.refs ?? []), ...refs.keys()])];
    res.json({
      project,
      refs: names.map((ref) => {
        const r = refs.get(ref);
        return {
          ref,
          current: r?.current ? deployView(r.current) : null,
          running: r?.running ? deployView(r.running) : null,
        };
      }),
    });
  };
}
