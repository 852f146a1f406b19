import type { Redis } from 'ioredis';
import { deployCancelKey } from '../../shared/keys.js';

/** cancel_in_progress's record of the newer deploy that cancelled a running one (the first to ask stays named). */
const MARK_MS = 24 * 3600 * 1000;

export async function markCancelled(redis: Pick<Redis, 'set'>, jobId: string, by: string): Promise<void> {
  await redis.set(deployCancelKey(jobId), by, 'PX', MARK_MS, 'NX');
}

export async function cancelledBy(redis: Pick<Redis, 'get'>, jobId: string): Promise<string | undefined> {
  return (await redis.get(deployCancelKey(jobId))) ?? undefined;
}
