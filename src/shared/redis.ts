import { Redis, type RedisOptions } from 'ioredis';

/**
 * Redis connections. Two profiles:
 * - `request`: for the API's request path (dedup keys, rate limits, caches, enqueueing). It
 *   fails fast when Redis is down (no offline queue, one retry per command) so a request gets
 *   a 503 instead of hanging.
 * - `blocking`: for BullMQ workers and queue event listeners, which need
 *   maxRetriesPerRequest=null and reconnect forever.
 */
export type RedisProfile = 'request' | 'blocking';

export function redisOptions(profile: RedisProfile): RedisOptions {
  const common: RedisOptions = {
    connectTimeout: 2000,
    // Reconnect with capped backoff; never give up (the process stays up while Redis restarts).
    retryStrategy: (times) => Math.min(100 * 2 ** Math.min(times, 5), 2000),
    lazyConnect: false,
  };
  if (profile === 'request') {
    return { ...common, enableOfflineQueue: false, maxRetriesPerRequest: 1, commandTimeout: 2000 };
  }
  return { ...common, maxRetriesPerRequest: null, enableOfflineQueue: true };
}

export function createRedis(url: string, profile: RedisProfile, name = 'opsgate'): Redis {
  const client = new Redis(url, { ...redisOptions(profile), connectionName: name });
  // ioredis emits 'error' on every failed reconnect; an unhandled 'error' event would crash the
  // process. Callers that care attach their own listener for logging.
  client.on('error', () => {});
  return client;
}

/** The password inside a redis:// URL, if any, so the logger can redact it. */
export function redisPassword(url: string): string | undefined {
  try {
    const u = new URL(url);
    return u.password ? decodeURIComponent(u.password) : undefined;
  } catch {
    return undefined;
  }
}
