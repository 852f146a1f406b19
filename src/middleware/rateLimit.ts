import type { NextFunction, Request, RequestHandler, Response } from 'express';
import type { Redis } from 'ioredis';
import { RATE_LIMIT_PREFIX, rateLimitKey } from '../shared/keys.js';
import type { Logger } from '../shared/logger.js';
import type { Metrics } from '../shared/metrics.js';
import { addressKey, createRateCounter } from '../api/rateLimit.js';

/**
 * Per-client-address rate limit (RATE_LIMIT_RPS requests per second), shared by every API
 * replica through Redis. The counting (window, script, 429 decision, fail-open) is
 * src/api/rateLimit.ts; this file decides which requests count and when their hit is sent.
 *
 * Client address: `req.ip`, i.e. what Express resolves with the app's `trust proxy` setting
 * (TRUST_PROXY). With TRUST_PROXY=0 the socket peer is used and X-Forwarded-For is ignored, so a
 * client cannot pick its own bucket; with a hop count N only the N nearest proxies' entries are
 * believed. Non-IP values (which a misconfigured trust setting could let through) are hashed,
 * so the Redis key stays short and printable.
 *
 * Exempt: the probes (/health, /ready): kubelet must never be throttled into restarting pods.
 *
 * Redis unavailable: FAIL OPEN. A rate limiter protects capacity; refusing every request
 * because its own bookkeeping store is down would turn a Redis blip into a full outage of
 * endpoints that do not need Redis (/ops/hosts, auth errors), while the endpoints that do need
 * Redis (webhooks, restart) answer 503 + Retry-After on their own.
 *
 * A plain middleware: one Redis call of its own per request, before the routes; nothing after it
 * knows it exists.
 */
interface RateLimitOptions {
  /** A `request`-profile connection (fails fast when Redis is down). */
  redis: Redis;
  /** Requests per second per client address; 0 disables the limiter. */
  rps: number;
  metrics?: Metrics;
  logger?: Logger;
  /** Paths never limited; default the probes. */
  exemptPaths?: readonly string[];
  /** Redis key prefix; default "opsgate:rl:". */
  keyPrefix?: string;
  /** Window length; default 1000 ms (RATE_LIMIT_RPS is per second). */
  windowMs?: number;
  /** Give up on Redis after this long and fail open; default 250 ms. */
  timeoutMs?: number;
}

const DEFAULT_EXEMPT_PATHS = ['/health', '/ready'] as const;

export function createRateLimiter(opts: RateLimitOptions): RequestHandler {
  const rps = opts.rps;
  if (!Number.isInteger(rps) || rps < 0) throw new Error('rate limit rps must be an integer >= 0');
  if (rps === 0) {
    return (_req: Request, _res: Response, next: NextFunction) => next();
  }
  const exempt = new Set(opts.exemptPaths ?? DEFAULT_EXEMPT_PATHS);
  const prefix = opts.keyPrefix ?? RATE_LIMIT_PREFIX;
  const counter = createRateCounter({
    redis: opts.redis,
    rps,
    windowMs: opts.windowMs ?? 1000,
    timeoutMs: opts.timeoutMs ?? 250,
    metrics: opts.metrics,
    logger: opts.logger,
  });

  return function rateLimit(req: Request, _res: Response, next: NextFunction): void {
    if (exempt.has(req.path)) return next();
    const key = rateLimitKey(addressKey(req.ip ?? req.socket.remoteAddress), prefix);
    void counter.hit(key).then((err) => next(err));
  };
}
