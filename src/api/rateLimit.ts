import { isIP } from 'node:net';
import type { Redis } from 'ioredis';
import { Counter } from 'prom-client';
import { sha256Hex } from '../shared/crypto.js';
import { TooManyRequestsError } from '../shared/errors.js';
import type { Logger } from '../shared/logger.js';
import { defineLua, loadLua } from '../shared/lua.js';
import type { Metrics } from '../shared/metrics.js';
import { withFallback } from '../shared/timeout.js';

/**
 * A fixed window per client address, counted in Redis so every API replica shares it, in one round trip (./rate-limit.lua:
 * INCR + PEXPIRE, returns the count and the window's remaining ms). Fixed windows allow a burst of up to 2x the limit across
 * a window boundary: the trade-off for one key and one round trip per request. Redis unavailable or slow: fail open, counted
 * and logged (at most one warning per 10 s).
 */
const SCRIPT_NAME = 'opsgateRateLimitHit';
const HIT_SCRIPT = loadLua(new URL('./rate-limit.lua', import.meta.url));

interface RateCounterOptions {
  redis: Redis;
  /** Hits per window per key; at least 1. */
  rps: number;
  windowMs: number;
  timeoutMs: number;
  metrics?: Metrics;
  logger?: Logger;
}

/** The Redis key part for an address: the IP itself, or a hash of anything that is not one. */
export function addressKey(address: string | undefined): string {
  if (!address) return 'unknown';
  if (isIP(address) !== 0) return address;
  return 'h:' + sha256Hex(address).slice(0, 32);
}

const ERRORS_METRIC = 'opsgate_rate_limit_errors_total';
const ERRORS_HELP = 'Requests let through without a rate-limit decision because Redis was unavailable (fail-open).';
const errorsCounter = (metrics: Metrics) =>
  (metrics.registry.getSingleMetric(ERRORS_METRIC) as Counter | undefined) ??
  new Counter({ name: ERRORS_METRIC, help: ERRORS_HELP, registers: [metrics.registry] });

/** `hit` resolves with the 429 error or undefined (also on a Redis error or timeout). */
export function createRateCounter(opts: RateCounterOptions) {
  const { redis, rps, windowMs, timeoutMs, metrics, logger } = opts;
  const failOpen = metrics && errorsCounter(metrics);
  defineLua(redis, SCRIPT_NAME, HIT_SCRIPT, 1);
  const send = (key: string) =>
    (redis as unknown as Record<string, (key: string, windowMs: number) => Promise<[number, number]>>)[SCRIPT_NAME]!(key, windowMs);
  let lastWarn = 0;
  const onRedisError = (err: unknown) => {
    failOpen?.inc();
    const now = Date.now();
    if (logger && now - lastWarn >= 10_000) {
      lastWarn = now;
      logger.warn('rate limit unavailable (Redis error); failing open', { err });
    }
  };
  const refusalOf = (reply: unknown): TooManyRequestsError | undefined => {
    const [count, ttl] = reply as [number, number];
    if (Number(count) <= rps) return undefined;
    metrics?.rateLimited.inc();
    const ttlMs = Number(ttl);
    return new TooManyRequestsError(Math.max(1, Math.ceil((ttlMs > 0 ? ttlMs : windowMs) / 1000)));
  };
  // A late answer after the fail-open is ignored: each hit fails open (and is counted) once.
  const hit = (key: string) =>
    withFallback(send(key).then(refusalOf), timeoutMs, (): TooManyRequestsError | undefined => {
      onRedisError(new Error(`rate limit: Redis did not answer within ${timeoutMs} ms`));
      return undefined;
    }).catch((err: unknown) => {
      onRedisError(err);
      return undefined;
    });
  return { hit };
}
