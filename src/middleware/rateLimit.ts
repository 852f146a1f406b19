import type { RequestHandler } from 'express';
import type { Redis } from 'ioredis';
import { RATE_LIMIT_PREFIX, rateLimitKey } from '../shared/keys.js';
import type { Logger } from '../shared/logger.js';
import type { Metrics } from '../shared/metrics.js';
import { addressKey, createRateCounter } from '../api/rateLimit.js';

/**
 * Per-client-address rate limit (RATE_LIMIT_RPS per second; 0: off) by `req.ip`, as TRUST_PROXY resolves it, so a client reached
 * directly cannot pick its own bucket. The probes are exempt: kubelet must never be throttled into restarting pods.
 *
 * Redis unavailable: FAIL OPEN. Refusing every request because the limiter's own store is down would turn a Redis blip into an
 * outage of endpoints that do not need Redis, while those that do answer 503 + Retry-After on their own.
 */
interface RateLimitOptions {
  redis: Redis;
  rps: number;
  metrics?: Metrics;
  logger?: Logger;
  exemptPaths?: readonly string[];
  keyPrefix?: string;
  windowMs?: number;
  /** Give up on Redis after this long and fail open; default 250 ms. */
  timeoutMs?: number;
}

export function createRateLimiter(opts: RateLimitOptions): RequestHandler {
  const rps = opts.rps;
  if (!Number.isInteger(rps) || rps < 0) throw new Error('rate limit rps must be an integer >= 0');
  if (rps === 0) return (_req, _res, next) => next();
  const exempt = new Set(opts.exemptPaths ?? ['/health', '/ready']);
  const prefix = opts.keyPrefix ?? RATE_LIMIT_PREFIX;
  const counter = createRateCounter({
    redis: opts.redis,
    rps,
    windowMs: opts.windowMs ?? 1000,
    timeoutMs: opts.timeoutMs ?? 250,
    metrics: opts.metrics,
    logger: opts.logger,
  });
  return function rateLimit(req, _res, next) {
    if (exempt.has(req.path)) return next();
    const key = rateLimitKey(addressKey(req.ip ?? req.socket.remoteAddress), prefix);
    void counter.hit(key).then((err) => next(err));
  };
}
