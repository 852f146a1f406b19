import { Router } from 'express';
import type { Redis } from 'ioredis';
import { methodNotAllowed } from '../middleware/errors.js';
import { ServiceUnavailableError } from '../shared/errors.js';
import type { OpsQueue } from '../shared/queue.js';

/** GET /health (liveness, spec body), GET /ready (Redis reachable), GET /version. No authentication. */
export interface HealthDeps {
  redis: Redis;
  queue: Pick<OpsQueue, 'isReady'>;
  version: string;
}

export function healthRouter(deps: HealthDeps): Router {
  const r = Router();
  const getOnly = methodNotAllowed(['GET']);

  r.route('/health')
    .get((_req, res) => {
      res.json({ status: 'ok' });
    })
    .all(getOnly);

  r.route('/ready')
    .get(async (_req, res) => {
      let ok: boolean;
      try {
        ok = (await deps.redis.ping()) === 'PONG' && deps.queue.isReady();
      } catch {
        ok = false;
      }
      if (!ok) throw new ServiceUnavailableError('redis unavailable', 5);
      res.json({ status: 'ready' });
    })
    .all(getOnly);

  r.route('/version')
    .get((_req, res) => {
      res.json({ version: deps.version, node: process.version });
    })
    .all(getOnly);

  return r;
}
