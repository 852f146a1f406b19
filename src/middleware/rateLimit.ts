import { isIP } from 'node:net';
import type { NextFunction, Request, RequestHandler, Response } from 'express';
import type { Redis } from 'ioredis';
import { Counter } from 'prom-client';
import { taggedKey } from '../domain/redisOps.js';
import { sha256Hex } from '../shared/crypto.js';
import { TooManyRequestsError } from '../shared/errors.js';
import type { Logger } from '../shared/logger.js';
import type { Metrics } from '../shared/metrics.js';

/**
 * Per-client-address rate limit (RATE_LIMIT_RPS requests per second), shared by every API
 * replica through Redis.
 *
 * Algorithm: a fixed one-second window per address. One Lua script does INCR + PEXPIRE
 * atomically in a single round trip (the TTL is set when the counter is created, and repaired
 * if a key ever lost it), and returns the count and the window's remaining milliseconds. Over
 * the limit: 429 {detail} with Retry-After (whole seconds, at least 1). Fixed windows allow a
 * burst of up to 2x the limit across a window boundary; that is the accepted trade-off for one
 * key and one round trip per request.
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
 * Redis (webhooks, restart) answer 503 + Retry-After on their own. Each fail-open is counted
 * (opsgate_rate_limit_errors_total) and logged (at most one warning per 10 s per process).
 * A Redis call that hangs is abandoned after `timeoutMs` (default 250 ms), then fails open too.
 */
export interface RateLimitOptions {
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

export const DEFAULT_EXEMPT_PATHS = ['/health', '/ready'] as const;

const SCRIPT_NAME = 'opsgateRateLimitHit';
/** KEYS[1] = counter key, ARGV[1] = window ms. Returns {count, remaining window ms}. */
const HIT_SCRIPT = `
local n = redis.call('INCR', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
if n == 1 or ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
return {n, ttl}
`;

type HitFn = (key: string, windowMs: number) => Promise<[number, number]>;

/** The Redis key part for an address: the IP itself, or a hash of anything that is not one. */
export function addressKey(address: string | undefined): string {
  if (!address) return 'unknown';
  if (isIP(address) !== 0) return address;
  return 'h:' + sha256Hex(address).slice(0, 32);
}

function errorsCounter(metrics: Metrics | undefined): Counter | undefined {
  if (!metrics) return undefined;
  const name = 'opsgate_rate_limit_errors_total';
  const existing = metrics.registry.getSingleMetric(name);
  if (existing) return existing as Counter;
  return new Counter({
    name,
    help: 'Requests let through without a rate-limit decision because Redis was unavailable (fail-open).',
    registers: [metrics.registry],
  });
}

export function createRateLimiter(opts: RateLimitOptions): RequestHandler {
  const rps = opts.rps;
  if (!Number.isInteger(rps) || rps < 0) throw new Error('rate limit rps must be an integer >= 0');
  if (rps === 0) {
    return (_req: Request, _res: Response, next: NextFunction) => next();
  }
  const { redis, metrics, logger } = opts;
  const exempt = new Set(opts.exemptPaths ?? DEFAULT_EXEMPT_PATHS);
  const prefix = opts.keyPrefix ?? 'opsgate:rl:';
  const windowMs = opts.windowMs ?? 1000;
  const timeoutMs = opts.timeoutMs ?? 250;
  const failOpen = errorsCounter(metrics);

  if (typeof (redis as unknown as Record<string, unknown>)[SCRIPT_NAME] !== 'function') {
    // EVALSHA with an automatic EVAL fallback (NOSCRIPT after a Redis restart).
    redis.defineCommand(SCRIPT_NAME, { numberOfKeys: 1, lua: HIT_SCRIPT });
  }
  const hit = (redis as unknown as Record<string, HitFn>)[SCRIPT_NAME]!.bind(redis) as HitFn;

  let lastWarn = 0;
  const onRedisError = (err: unknown) => {
    failOpen?.inc();
    const now = Date.now();
    if (logger && now - lastWarn >= 10_000) {
      lastWarn = now;
      logger.warn('rate limit unavailable (Redis error); failing open', { err });
    }
  };

  return function rateLimit(req: Request, res: Response, next: NextFunction): void {
    if (exempt.has(req.path)) return next();
    const key = taggedKey(prefix, addressKey(req.ip ?? req.socket.remoteAddress));

    let settled = false;
    const timer = setTimeout(() => {
      if (settled) return;
      settled = true;
      onRedisError(new Error(`rate limit: Redis did not answer within ${timeoutMs} ms`));
      next();
    }, timeoutMs);

    hit(key, windowMs).then(
      (reply) => {
        clearTimeout(timer);
        if (settled) return;
        settled = true;
        const count = Number(reply[0]);
        const ttlMs = Number(reply[1]);
        if (count <= rps) return next();
        metrics?.rateLimited.inc();
        const retryAfter = Math.max(1, Math.ceil((ttlMs > 0 ? ttlMs : windowMs) / 1000));
        next(new TooManyRequestsError(retryAfter));
      },
      (err: unknown) => {
        clearTimeout(timer);
        if (settled) return;
        settled = true;
        onRedisError(err);
        next();
      },
    );
  };
}
