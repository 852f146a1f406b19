import { Cluster, Redis, type ClusterOptions, type RedisOptions } from 'ioredis';

/**
 * Redis connections. The `request` profile (the API's request path) fails fast when Redis is down
 * (no offline queue, one retry per command), so a request gets a 503 instead of hanging; the
 * `blocking` one (BullMQ workers, queue events) retries forever. REDIS_URL's form picks the
 * topology (docs/redis.md): redis:// or rediss://, redis+sentinel://hosts/<master-name>[/db]
 * (sentinels of their own password take `?sentinelPassword=`), or redis+cluster://seed-hosts.
 */
export type RedisProfile = 'request' | 'blocking';

interface RedisNode {
  host: string;
  port: number;
}

export type ParsedRedisUrl =
  | { topology: 'standalone'; url: string; password?: string }
  | {
      topology: 'sentinel';
      sentinels: RedisNode[];
      masterName: string;
      db: number;
      username?: string;
      password?: string;
      sentinelPassword?: string;
    }
  | { topology: 'cluster'; nodes: RedisNode[]; username?: string; password?: string };

/** A REDIS_URL that cannot be used. The message never contains the URL (it may hold a password). */
export class RedisUrlError extends Error {}

const FORMS =
  'must be redis://host:port, rediss://host:port, redis+sentinel://host:port[,host:port...]/<master-name>[/db] or redis+cluster://host:port[,host:port...]';

function decode(part: string, what: string): string {
  try {
    return decodeURIComponent(part);
  } catch {
    throw new RedisUrlError(`has a badly percent-encoded ${what}`);
  }
}

function parseHosts(list: string, defaultPort: number): RedisNode[] {
  const nodes: RedisNode[] = [];
  for (const item of list.split(',')) {
    const s = item.trim();
    if (s === '') throw new RedisUrlError('has an empty host in its host list');
    // host, host:port, [v6], [v6]:port
    const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:[\]\s]+))(?::(\d{1,5}))?$/.exec(s);
    if (!m) throw new RedisUrlError('has an invalid host:port in its host list');
    const port = m[3] === undefined ? defaultPort : Number(m[3]);
    if (!Number.isInteger(port) || port < 1 || port > 65535) throw new RedisUrlError('has a port outside 1-65535');
    nodes.push({ host: (m[1] ?? m[2])!, port });
  }
  return nodes;
}

/** Parses REDIS_URL into one of the three topologies; throws RedisUrlError naming the problem, never the value. */
export function parseRedisUrl(raw: string): ParsedRedisUrl {
  const url = raw.trim();
  if (/^rediss?:\/\//i.test(url)) {
    let u: URL;
    try {
      u = new URL(url);
    } catch {
      throw new RedisUrlError('is not a valid URL');
    }
    if (u.hostname === '') throw new RedisUrlError('has no host');
    const password = u.password ? decode(u.password, 'password') : undefined;
    return { topology: 'standalone', url, ...(password ? { password } : {}) };
  }
  const m = /^redis\+(sentinel|cluster):\/\/(?:([^@/?#]*)@)?([^/?#]*)(\/[^?#]*)?(\?[^#]*)?$/i.exec(url);
  if (!m) throw new RedisUrlError(FORMS);
  const kind = m[1]!.toLowerCase() as 'sentinel' | 'cluster';
  const userinfo = m[2];
  const hostList = m[3]!;
  const path = m[4] ?? '';
  const query = new URLSearchParams(m[5] ?? '');
  if (hostList === '') throw new RedisUrlError('has no host');
  const [user, ...rest] = (userinfo ?? '').split(':');
  const pass = rest.join(':');
  const auth = { ...(user ? { username: decode(user, 'user name') } : {}), ...(pass ? { password: decode(pass, 'password') } : {}) };
  if (kind === 'cluster') {
    if (path !== '' && path !== '/')
      throw new RedisUrlError('is a redis+cluster:// URL and cannot select a database (Redis Cluster has only db 0)');
    for (const k of query.keys()) throw new RedisUrlError(`has an unknown query parameter "${k.slice(0, 40)}"`);
    return { topology: 'cluster', nodes: parseHosts(hostList, 6379), ...auth };
  }
  const segments = path.split('/').filter((s) => s !== '');
  if (segments.length === 0) throw new RedisUrlError('is a redis+sentinel:// URL without a master name (…/<master-name>[/db])');
  if (segments.length > 2) throw new RedisUrlError('has too many path segments (…/<master-name>[/db])');
  const masterName = decode(segments[0]!, 'master name');
  let db = 0;
  if (segments[1] !== undefined) {
    if (!/^\d{1,5}$/.test(segments[1])) throw new RedisUrlError('has a database number that is not an integer');
    db = Number(segments[1]);
  }
  let sentinelPassword: string | undefined;
  for (const [k, v] of query) {
    if (k === 'sentinelPassword') sentinelPassword = v || undefined;
    else throw new RedisUrlError(`has an unknown query parameter "${k.slice(0, 40)}"`);
  }
  return {
    topology: 'sentinel',
    sentinels: parseHosts(hostList, 26379),
    masterName,
    db,
    ...auth,
    ...(sentinelPassword ? { sentinelPassword } : {}),
  };
}

export function redisTopology(url: string): ParsedRedisUrl['topology'] {
  return parseRedisUrl(url).topology;
}

/** Capped exponential backoff; never gives up (the process stays up while Redis restarts). */
const backoff = (times: number) => Math.min(100 * 2 ** Math.min(times, 5), 2000);

export function redisOptions(profile: RedisProfile): RedisOptions {
  const common: RedisOptions = {
    connectTimeout: 2000,
    retryStrategy: backoff,
    lazyConnect: false,
    // A server demoted to a replica under an open connection answers every write READONLY for as
    // long as it lives: reconnecting asks the sentinels for the primary again. The request profile
    // lets the refused command fail (503, the sender retries); the blocking one sends it again on
    // the new connection (a refused command did nothing).
    reconnectOnError: (err) => (err.message.startsWith('READONLY') ? (profile === 'request' ? 1 : 2) : false),
  };
  if (profile === 'request') {
    return { ...common, enableOfflineQueue: false, maxRetriesPerRequest: 1, commandTimeout: 2000 };
  }
  return { ...common, maxRetriesPerRequest: null, enableOfflineQueue: true };
}

/** Exported for tests. */
export function sentinelOptions(p: Extract<ParsedRedisUrl, { topology: 'sentinel' }>, profile: RedisProfile): RedisOptions {
  return {
    ...redisOptions(profile),
    sentinels: p.sentinels,
    name: p.masterName,
    db: p.db,
    ...(p.username ? { username: p.username } : {}),
    ...(p.password ? { password: p.password } : {}),
    ...(p.sentinelPassword ? { sentinelPassword: p.sentinelPassword } : {}),
    sentinelRetryStrategy: backoff,
    // +switch-master drops a connection to a demoted (still running) primary at once, not on its first READONLY.
    failoverDetector: true,
    sentinelCommandTimeout: 1000,
  };
}

/** Exported for tests. */
export function clusterOptions(p: Extract<ParsedRedisUrl, { topology: 'cluster' }>, profile: RedisProfile): ClusterOptions {
  const node = redisOptions(profile);
  return {
    redisOptions: {
      ...node,
      ...(p.username ? { username: p.username } : {}),
      ...(p.password ? { password: p.password } : {}),
    },
    enableOfflineQueue: node.enableOfflineQueue ?? true,
    clusterRetryStrategy: backoff,
    // The request profile gives up within ~200 ms, far below any failover (>= cluster-node-timeout):
    // a command of a request that already failed (e.g. removing a seen record after a failed
    // enqueue) must never land on the promoted replica, where the job may have survived.
    ...(profile === 'request'
      ? { maxRedirections: 4, retryDelayOnFailover: 50, retryDelayOnClusterDown: 50, retryDelayOnTryAgain: 50 }
      : { maxRedirections: 16, retryDelayOnFailover: 200, retryDelayOnClusterDown: 200, retryDelayOnTryAgain: 200 }),
    slotsRefreshTimeout: 2000,
    slotsRefreshInterval: 5000,
    scaleReads: 'master',
  };
}

/** One connection for any REDIS_URL form; a Cluster is typed as Redis (same commands), `isCluster` tells them apart. */
export function createRedis(url: string, profile: RedisProfile, name = 'opsgate'): Redis {
  const p = parseRedisUrl(url);
  let client: Redis;
  if (p.topology === 'cluster') {
    const opts = clusterOptions(p, profile);
    opts.redisOptions = { ...opts.redisOptions, connectionName: name };
    client = new Cluster(p.nodes, opts) as unknown as Redis;
  } else if (p.topology === 'sentinel') {
    client = new Redis({ ...sentinelOptions(p, profile), connectionName: name });
  } else {
    client = new Redis(p.url, { ...redisOptions(profile), connectionName: name });
  }
  // An unhandled 'error' event (ioredis emits one on every failed reconnect) would crash the process.
  client.on('error', () => {});
  return client;
}

/** The primaries of a connection: itself, or every master node of a Cluster. */
export function primariesOf(client: Redis): Redis[] {
  if (client.isCluster) return (client as unknown as Cluster).nodes('master');
  return [client];
}

/** CRC16/XMODEM, Redis Cluster's key hash. */
function crc16(buf: Buffer): number {
  let crc = 0;
  for (const byte of buf) {
    crc ^= byte << 8;
    for (let i = 0; i < 8; i++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc;
}

/** The hash slot of a key (the part inside the first non-empty {…} only, when there is one). */
export function keySlot(key: string): number {
  const open = key.indexOf('{');
  if (open >= 0) {
    const close = key.indexOf('}', open + 1);
    if (close > open + 1) key = key.slice(open + 1, close);
  }
  return crc16(Buffer.from(key, 'utf8')) % 16384;
}

/** The primaries serving these keys now (a Cluster); the connection itself otherwise. */
function primariesFor(client: Redis, keys: readonly string[] | undefined): Redis[] {
  if (!client.isCluster || keys === undefined) return primariesOf(client);
  const cluster = client as unknown as Cluster;
  const wanted = new Set(keys.map((k) => cluster.slots[keySlot(k)]?.[0]).filter((k): k is string => typeof k === 'string'));
  const masters = cluster.nodes('master');
  const byKey = (n: Redis) => `${n.options.host}:${n.options.port}`;
  const out = masters.filter((n) => wanted.has(byKey(n)));
  // A slot map being refreshed (failover) names a node not connected yet: wait on every primary.
  return out.length === wanted.size ? out : masters;
}

/**
 * WAIT: the fewest replicas that acknowledged every write of the connection. On a Cluster, on each
 * primary serving one of `keys` (every primary without `keys`; an empty `keys` waits for nothing).
 */
export async function waitForReplicas(client: Redis, numReplicas: number, timeoutMs: number, keys?: readonly string[]): Promise<number> {
  if (client.isCluster && keys !== undefined && keys.length === 0) return numReplicas;
  const acks = await Promise.all(primariesFor(client, keys).map((c) => c.wait(numReplicas, timeoutMs)));
  return acks.length === 0 ? 0 : Math.min(...acks.map(Number));
}

/** The password inside REDIS_URL (data nodes' and sentinels'), so the logger can redact them. */
export function redisPasswords(url: string): string[] {
  try {
    const p = parseRedisUrl(url);
    const out = [p.password, p.topology === 'sentinel' ? p.sentinelPassword : undefined];
    return out.filter((s): s is string => typeof s === 'string' && s.length > 0);
  } catch {
    return [];
  }
}

/** A record Redis holds as JSON text: undefined when absent or not JSON, so a damaged record reads as none. */
export function storedJson<T>(raw: string | null | undefined): T | undefined {
  if (!raw) return undefined;
  try {
    return JSON.parse(raw) as T;
  } catch {
    return undefined;
  }
}
