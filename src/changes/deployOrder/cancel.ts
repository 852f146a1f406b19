import type { Redis } from 'ioredis';
import { deployCancelKey } from '../../shared/keys.js';

/**
 * cancel_in_progress's record (worker/deployCancel.ts): a running deploy that a newer deploy of its
 * group cancelled, naming that deploy. The first newer deploy to ask is named and stays named; the
 * record outlives any attempt of the cancelled deploy.
 */
const MARK_MS = 24 * 3600 * 1000;

/** Marks `jobId` cancelled by `by`, unless a deploy cancelled it already. */
export async function markCancelled(redis: Pick<Redis, 'set'>, jobId: string, by: string): Promise<void> {
  await redis.set(deployCancelKey(jobId), by, 'PX', MARK_MS, 'NX');
}

/** The newer deploy that cancelled this running one, if one did. */
export async function cancelledBy(redis: Pick<Redis, 'get'>, jobId: string): Promise<string | undefined> {
  return (await redis.get(deployCancelKey(jobId))) ?? undefined;
}
