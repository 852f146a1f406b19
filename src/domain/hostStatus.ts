import type { Redis } from 'ioredis';
import { NotFoundError, ServiceUnavailableError } from '../shared/errors.js';
import { findHost, type Inventory } from '../shared/inventory.js';
import type { Logger } from '../shared/logger.js';
import { primariesOf } from '../shared/redis.js';
import { CACHE_PREFIX, hostStatusKey } from '../shared/keys.js';
import { redisCall } from './redisOps.js';

/**
 * GET /ops/hosts/{host}: the status of the host's Deployments, cached in Redis for 30 s. When Redis
 * is down the cache is skipped: it is an optimisation, not a dependency.
 */
export interface DeploymentStatus {
  name: string;
  /** false when the Deployment does not exist in the namespace. */
  found: boolean;
  replicas: number | null;
  ready: number;
  updated: number;
  available: number;
  /** kubectl.kubernetes.io/restartedAt of the pod template (last `rollout restart`), if any. */
  restarted_at: string | null;
}

export interface HostStatusProvider {
  deployments(namespace: string, names: readonly string[]): Promise<DeploymentStatus[]>;
}

interface HostStatus {
  host: string;
  namespace: string;
  deployments: DeploymentStatus[];
  checked_at: string;
  cached: boolean;
}

export class ClusterUnavailableError extends ServiceUnavailableError {
  constructor(detail = 'Kubernetes API unavailable; retry later') {
    super(detail, 'cluster_unavailable', 10);
  }
}

const HOST_STATUS_TTL_SECONDS = 30;

export async function getHostStatus(
  deps: { redis: Redis; inventory: Inventory; provider: HostStatusProvider; logger: Logger },
  host: string,
): Promise<HostStatus> {
  const entry = findHost(deps.inventory, host);
  if (!entry) throw new NotFoundError('unknown host', 'unknown_host');
  const key = hostStatusKey(host);
  try {
    const hit = await deps.redis.get(key);
    if (hit) return { ...(JSON.parse(hit) as Omit<HostStatus, 'cached'>), cached: true };
  } catch (err) {
    deps.logger.warn('host status cache unavailable; reading live', { err });
  }
  const deployments = await deps.provider.deployments(entry.namespace, entry.deployments);
  const fresh = { host, namespace: entry.namespace, deployments, checked_at: new Date().toISOString() };
  try {
    await deps.redis.set(key, JSON.stringify(fresh), 'EX', HOST_STATUS_TTL_SECONDS);
  } catch (err) {
    deps.logger.warn('host status cache unavailable; not cached', { err });
  }
  return { ...fresh, cached: false };
}

/** DELETE /ops/cache: removes every opsgate cache key (SCAN + UNLINK, never KEYS); how many. */
export async function clearCache(redis: Redis): Promise<number> {
  return redisCall(async (r) => {
    let removed = 0;
    // On a Redis Cluster every primary holds part of the keys: scan each.
    for (const node of primariesOf(r)) {
      let cursor = '0';
      do {
        const [next, keys] = await node.scan(cursor, 'MATCH', `${CACHE_PREFIX}*`, 'COUNT', 500);
        cursor = next;
        for (const k of keys) removed += await node.unlink(k);
      } while (cursor !== '0');
    }
    return removed;
  }, redis);
}
