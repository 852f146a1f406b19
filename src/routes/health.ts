import { only } from './request.js';
import { Router } from 'express';
import type { Redis } from 'ioredis';
import { RedisUnavailableError } from '../shared/errors.js';
import { redisProblem, watchRedis } from '../shared/redisConnection.js';
import type { OpsQueue } from '../api/queue.js';

/** GET /health (liveness), GET /ready (Redis reachable; 503 {detail, code} says why not), GET /version. No authentication. */
interface HealthDeps {
  redis: Redis;
  queue: Pick<OpsQueue, 'isReady'>;
  version: string;
}

export function healthRouter(deps: HealthDeps): Router {
  const r = Router();
  watchRedis(deps.redis);

  only(r, 'get', '/health', (_req, res) => {
    res.json({ status: 'ok' });
  });

  only(r, 'get', '/ready', async (_req, res) => {
    const down = redisProblem(deps.redis);
    if (down) throw new RedisUnavailableError(down);
    let detail: string | undefined;
    try {
      if ((await deps.redis.ping()) !== 'PONG') detail = 'redis unavailable: unexpected PING answer';
      else if (!deps.queue.isReady()) detail = 'redis unavailable: the queue connection is not ready';
    } catch (err) {
      detail =
        redisProblem(deps.redis) ?? `redis unavailable: ${err instanceof Error ? err.message.split('\n')[0]!.slice(0, 120) : 'error'}`;
    }
    if (detail) throw new RedisUnavailableError(detail);
    res.json({ status: 'ready' });
  });

  only(r, 'get', '/version', (_req, res) => {
    res.json({ version: deps.version, node: process.version });
  });

  return r;
}
