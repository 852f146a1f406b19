import type { Redis } from 'ioredis';
import type { Logger } from './logger.js';
import { createRedis, type RedisProfile } from './redis.js';

/** createRedis plus a watcher that logs a lost and a restored connection once each, not once per reconnect attempt. */

/** REDIS_URL with every password replaced by "***" (the userinfo's and sentinelPassword=). */
function redactRedisUrl(url: string): string {
  return url
    .replace(/^([a-z+]+:\/\/)([^@/]*)@/i, (_m, scheme: string, userinfo: string) => {
      const colon = userinfo.indexOf(':');
      return `${scheme}${colon < 0 ? userinfo : `${userinfo.slice(0, colon)}:***`}@`;
    })
    .replace(/([?&]sentinelPassword=)[^&#]*/gi, '$1***');
}

interface Watch {
  /** Why the connection last failed (an error code such as ECONNREFUSED), until it is ready again. */
  problem?: string;
  /** Set by markClosing: the connection then stays closed. */
  closing?: boolean;
}
const watches = new WeakMap<Redis, Watch>();

/** A short reason for an ioredis error: its code where it has one (never a URL or a password). */
function reasonOf(err: unknown): string {
  const e = err as { code?: unknown; message?: unknown };
  if (typeof e.code === 'string' && e.code) return e.code;
  const msg = typeof e.message === 'string' ? e.message : String(err);
  return msg.split('\n')[0]!.slice(0, 120);
}

/** Starts remembering `client`'s connection problems (once per client); logs the changes when a logger is given. */
export function watchRedis(client: Redis, opts: { logger?: Logger; url?: string } = {}): void {
  if (watches.has(client)) return;
  const watch: Watch = {};
  watches.set(client, watch);
  const where = opts.url ? { redis: redactRedisUrl(opts.url) } : {};
  client.on('error', (err: unknown) => {
    const first = watch.problem === undefined;
    watch.problem = reasonOf(err);
    if (first) opts.logger?.warn('redis connection error', { err, reason: watch.problem, ...where });
  });
  client.on('ready', () => {
    if (watch.problem !== undefined) opts.logger?.info('redis connection restored', where);
    watch.problem = undefined;
  });
}

/** Why `client` cannot serve now, for a readiness answer; undefined when connected (a failing command is the caller's). */
export function redisProblem(client: Redis): string | undefined {
  if (client.status === 'ready') return undefined;
  const problem = watches.get(client)?.problem;
  return `redis unreachable: ${problem ?? client.status}`;
}

/** A watched connection for REDIS_URL, never left closed by anyone but the process. */
export function connectRedis(opts: { url: string; profile: RedisProfile; name: string; logger: Logger }): Redis {
  const client = createRedis(opts.url, opts.profile, opts.name);
  watchRedis(client, { logger: opts.logger, url: opts.url });
  reconnectWhenEnded(client, opts);
  return client;
}

/**
 * Connects `client` again when it ends while nobody closed it: ioredis ends a connection for good when a reconnect is asked
 * during its previous connect, which a failover does (+switch-master or READONLY while it asks the sentinels for the primary).
 */
export function reconnectWhenEnded(client: Redis, opts: { url: string; logger?: Logger }): void {
  watchRedis(client);
  const watch = watches.get(client)!;
  client.on('end', () => {
    if (watch.closing) return;
    opts.logger?.warn('redis connection ended while nobody closed it; connecting again', { redis: redactRedisUrl(opts.url) });
    const again = setTimeout(() => {
      if (!watch.closing && client.status === 'end') client.connect().catch(() => undefined);
    }, RECONNECT_AFTER_END_MS);
    again.unref();
  });
}

/** How long after an unasked end connectRedis connects again (the retry strategy's first step). */
const RECONNECT_AFTER_END_MS = 200;

/** Says the process is closing a connectRedis connection (before its quit or disconnect): it is not connected again. */
export function markClosing(client: Redis): void {
  const watch = watches.get(client);
  if (watch) watch.closing = true;
}
