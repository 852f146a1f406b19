import { isIP } from 'node:net';
import type { NextFunction, Request, RequestHandler, Response } from 'express';
import type { Redis } from 'ioredis';
import { Counter } from 'prom-client';
import { sha256Hex } from '../shared/crypto.js';
import { TooManyRequestsError } from '../shared/errors.js';
import { callScript, defineScript } from '../shared/redisBatch.js';
import type { Logger } from '../shared/logger.js';
import type { Metrics } from '../shared/metrics.js';
import { RATE_LIMIT_PREFIX, rateLimitKey } from '../domain/redisOps.js';

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
 *
 * Webhook intake (`deferPaths`, POST only): the hit is not sent at the start of the request but
 * handed to the route as a DeferredRateHit (res.locals), which runs it inside its first Redis call
 * (the claim script of src/domain/claim.ts, RATE_HIT_LUA; on a Cluster a command of its own in the
 * same write), so a duplicate delivery costs one round trip in all and a unique one two (issue 10).
 * The decision is the same: over the limit -> 429, and nothing stays claimed. A delivery that never reaches Redis
 * (403, 400, 413, 422, ignored) sends the hit on its own before its answer, exactly as before.
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
  /** POST paths whose hit is deferred to the route's first Redis round trip; default the webhooks. */
  deferPaths?: readonly string[];
}

export const DEFAULT_DEFER_PATHS = ['/webhook/scm', '/webhook/github', '/webhook/gitlab', '/webhook/alerts'] as const;

/** A rate-limit hit that the route sends with its own first Redis call (see the header comment). */
export interface DeferredRateHit {
  /**
   * Sends the hit on `redis` now, synchronously, so it goes out in the same write as the
   * commands the caller issues in this tick (src/shared/redisBatch.ts). Resolves with the
   * decision, never rejects: the 429 error over the limit, else undefined (fails open on a Redis error).
   */
  sendOn(redis: Redis): Promise<TooManyRequestsError | undefined>;
  /**
   * For a caller that runs RATE_HIT_LUA inside its own script (same server, one command less):
   * the counter key, the window, the limit, and the decision for the script's {count, ttl}
   * (an Error: the script failed, fail open). Marks the hit sent.
   */
  inline(): { key: string; windowMs: number; rps: number; decide(reply: [number, number] | Error): TooManyRequestsError | undefined };
  /** Sends the hit on its own (one round trip, abandoned after the timeout); throws 429 over the limit. */
  run(): Promise<void>;
  /** True once sendOn or run has sent it (a hit is sent at most once). */
  readonly sent: boolean;
}

/** The request's deferred hit while it has not been sent yet. */
export function pendingRateHit(res: Response): DeferredRateHit | undefined {
  const hit = res.locals.rateHit as DeferredRateHit | undefined;
  return hit && !hit.sent ? hit : undefined;
}

export const DEFAULT_EXEMPT_PATHS = ['/health', '/ready'] as const;

const SCRIPT_NAME = 'opsgateRateLimitHit';
/**
 * The hit in Lua, for this limiter's own script and for a caller's script that runs it first on
 * the same server (src/domain/claim.ts): KEYS[1] = counter key, ARGV[1] = window ms; leaves the
 * count in rl_n and the window's remaining milliseconds in rl_ttl.
 */
export const RATE_HIT_LUA = `
local rl_n = redis.call('INCR', KEYS[1])
local rl_ttl = redis.call('PTTL', KEYS[1])
if rl_n == 1 or rl_ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  rl_ttl = tonumber(ARGV[1])
end
`;
/** KEYS[1] = counter key, ARGV[1] = window ms. Returns {count, remaining window ms}. */
const HIT_SCRIPT = RATE_HIT_LUA + 'return {rl_n, rl_ttl}\n';

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
  const prefix = opts.keyPrefix ?? RATE_LIMIT_PREFIX;
  const defer = new Set(opts.deferPaths ?? DEFAULT_DEFER_PATHS);
  const windowMs = opts.windowMs ?? 1000;
  const timeoutMs = opts.timeoutMs ?? 250;
  const failOpen = errorsCounter(metrics);

  // EVALSHA with an automatic EVAL fallback (NOSCRIPT after a Redis restart).
  defineScript(redis, SCRIPT_NAME, HIT_SCRIPT);
  const hit: HitFn = (key, w) => callScript(redis, SCRIPT_NAME, [key], [w]) as Promise<[number, number]>;

  let lastWarn = 0;
  const onRedisError = (err: unknown) => {
    failOpen?.inc();
    const now = Date.now();
    if (logger && now - lastWarn >= 10_000) {
      lastWarn = now;
      logger.warn('rate limit unavailable (Redis error); failing open', { err });
    }
  };

  /** Over the limit -> the 429 error; within it -> undefined. */
  const decide = (reply: unknown): TooManyRequestsError | undefined => {
    const [count, ttl] = reply as [number, number];
    if (Number(count) <= rps) return undefined;
    metrics?.rateLimited.inc();
    const ttlMs = Number(ttl);
    return new TooManyRequestsError(Math.max(1, Math.ceil((ttlMs > 0 ? ttlMs : windowMs) / 1000)));
  };

  /** One hit on its own: resolves with the 429 error or undefined (fail open on error or timeout). */
  const hitAlone = (key: string): Promise<TooManyRequestsError | undefined> =>
    new Promise((resolve) => {
      let settled = false;
      const timer = setTimeout(() => {
        if (settled) return;
        settled = true;
        onRedisError(new Error(`rate limit: Redis did not answer within ${timeoutMs} ms`));
        resolve(undefined);
      }, timeoutMs);
      hit(key, windowMs).then(
        (reply) => {
          clearTimeout(timer);
          if (settled) return;
          settled = true;
          resolve(decide(reply));
        },
        (err: unknown) => {
          clearTimeout(timer);
          if (settled) return;
          settled = true;
          onRedisError(err);
          resolve(undefined);
        },
      );
    });

  const deferred = (key: string): DeferredRateHit => ({
    sent: false,
    sendOn(target) {
      (this as { sent: boolean }).sent = true;
      // Another connection (a Cluster's, the queue's) may not know the script yet: define it there once.
      defineScript(target, SCRIPT_NAME, HIT_SCRIPT);
      return callScript(target, SCRIPT_NAME, [key], [windowMs]).then(
        (reply) => decide(reply),
        (err: unknown) => {
          onRedisError(err);
          return undefined;
        },
      );
    },
    inline() {
      (this as { sent: boolean }).sent = true;
      return {
        key,
        windowMs,
        rps,
        decide: (reply) => {
          if (reply instanceof Error) {
            onRedisError(reply);
            return undefined;
          }
          return decide(reply);
        },
      };
    },
    async run() {
      if (this.sent) return;
      (this as { sent: boolean }).sent = true;
      const err = await hitAlone(key);
      if (err) throw err;
    },
  });

  return function rateLimit(req: Request, res: Response, next: NextFunction): void {
    if (exempt.has(req.path)) return next();
    const key = rateLimitKey(addressKey(req.ip ?? req.socket.remoteAddress), prefix);
    if (req.method === 'POST' && defer.has(req.path)) {
      res.locals.rateHit = deferred(key);
      return next();
    }
    void hitAlone(key).then((err) => next(err));
  };
}
