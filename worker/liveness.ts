import type { Redis } from 'ioredis';
import { errorBody } from '../src/shared/errors.js';
import type { LoopMonitor } from './eventLoop.js';
import { settlesWithin } from '../src/shared/timeout.js';

/**
 * GET /livez on the worker's metrics port: 503 when the event loop lagged more than maxLagMs within
 * the last 10 s (a blocked loop cannot run jobs or renew their locks). The body also reports Redis,
 * which alone does not fail liveness: restarting the worker would not bring Redis back.
 */
export function workerLiveness(deps: { monitor: LoopMonitor; maxLagMs: number; redis: () => Redis | undefined; timeoutMs?: number }) {
  return async (): Promise<{ status: number; body: Record<string, unknown> }> => {
    const lag = deps.monitor.maxLagMs();
    const client = deps.redis();
    let redisState: string;
    if (!client) redisState = 'connecting';
    else if (client.status !== 'ready') redisState = client.status;
    else redisState = (await settlesWithin(client.ping(), deps.timeoutMs ?? 1000)) ? 'ready' : 'unresponsive';
    const loopOk = lag <= deps.maxLagMs;
    return {
      status: loopOk ? 200 : 503,
      body: {
        status: loopOk ? 'ok' : 'event loop blocked',
        event_loop_lag_ms: lag,
        event_loop_max_lag_ms: deps.maxLagMs,
        redis: redisState,
        ...(loopOk ? {} : errorBody('event_loop_blocked', `event loop lagged ${lag} ms (limit ${deps.maxLagMs} ms) within the last 10 s`)),
      },
    };
  };
}
