import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import type { JobDataByName, JobName } from '../shared/jobs.js';
import type { Logger } from '../shared/logger.js';
import type { OpsQueue } from '../shared/queue.js';
import { redisCall } from './redisOps.js';

/**
 * Seen record + enqueue without a window in which a crash loses the event.
 *
 * The spec's flow is "SET seen NX, then enqueue; if enqueueing fails, delete seen" (rules 6-9).
 * An API process killed between the SET and the enqueue (SIGKILL, OOM, node eviction) leaves a
 * seen record with no job: every retry of the sender is then a "duplicate" for 24 h and the
 * event is lost. test/reliability/faults.test.ts reproduces it by killing an API under load.
 *
 * So the record carries the job id the claimant will use, and a state:
 *   "p:<jobId>"  pending: claimed, job not confirmed on the queue yet;
 *   "q:<jobId>"  queued: the job was added.
 * - claim: one round trip (Lua: SET NX EX, else GET the current value);
 * - claimed -> add the job with that job id -> mark "q:" (XX KEEPTTL) -> accepted;
 *   enqueue failed -> delete the record only if it is still our "p:" (rule 9), propagate (503);
 * - already "q:" -> duplicate (one round trip, as before);
 * - already "p:" -> the claimant is either still in flight or dead: add the job with the
 *   recorded job id. BullMQ ignores an add whose job id exists, so this never makes a second
 *   job; it only completes a claim whose enqueue never happened. Then mark "q:" -> duplicate.
 * - any other value (records written by older versions) -> duplicate.
 * Job ids are per claim (not per event), so an alert that fires again after its 300 s window
 * gets a new job, as before.
 */
export const PENDING = 'p:';
export const QUEUED = 'q:';

const CLAIM = 'opsgateSeenClaim';
/** KEYS[1] seen key; ARGV[1] value, ARGV[2] ttl seconds. Returns false when claimed, else the current value. */
const CLAIM_LUA = `
if redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2], 'NX') then return false end
return redis.call('GET', KEYS[1])
`;
const RELEASE = 'opsgateSeenRelease';
/** KEYS[1] seen key; ARGV[1] expected value. Deletes the key only if it still holds that value. */
const RELEASE_LUA = `
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`;

type ClaimFn = (key: string, value: string, ttl: number) => Promise<string | null>;
type ReleaseFn = (key: string, value: string) => Promise<number>;

function scripts(redis: Redis): { claim: ClaimFn; release: ReleaseFn } {
  const r = redis as unknown as Record<string, unknown>;
  if (typeof r[CLAIM] !== 'function') redis.defineCommand(CLAIM, { numberOfKeys: 1, lua: CLAIM_LUA });
  if (typeof r[RELEASE] !== 'function') redis.defineCommand(RELEASE, { numberOfKeys: 1, lua: RELEASE_LUA });
  return {
    claim: (r[CLAIM] as ClaimFn).bind(redis),
    release: (r[RELEASE] as ReleaseFn).bind(redis),
  };
}

export interface ClaimDeps {
  redis: Redis;
  queue: Pick<OpsQueue, 'enqueue'>;
  logger: Logger;
}

export interface ClaimOutcome {
  accepted: boolean;
  duplicate: boolean;
  jobId?: string;
  /** A duplicate that found a pending claim and made sure its job is on the queue. */
  completedClaim?: boolean;
}

export async function claimAndEnqueue<N extends JobName>(
  deps: ClaimDeps,
  req: { key: string; ttlSeconds: number; name: N; data: JobDataByName[N]; what: string },
): Promise<ClaimOutcome> {
  const { claim, release } = scripts(deps.redis);
  const jobId = randomUUID();
  const pending = PENDING + jobId;
  const current = await redisCall(() => claim(req.key, pending, req.ttlSeconds), deps.redis);

  const markQueued = async (id: string) => {
    try {
      await deps.redis.set(req.key, QUEUED + id, 'KEEPTTL', 'XX');
    } catch (err) {
      // Harmless: a later duplicate finds "p:" and re-adds with the same job id (a no-op).
      deps.logger.warn('could not mark the seen record as queued', { what: req.what, err });
    }
  };

  if (current === null) {
    let id: string;
    try {
      id = await deps.queue.enqueue(req.name, req.data, { jobId });
    } catch (err) {
      await releaseClaim(deps, () => release(req.key, pending), req.what);
      throw err;
    }
    await markQueued(id);
    return { accepted: true, duplicate: false, jobId: id };
  }
  if (current.startsWith(PENDING)) {
    const claimedId = current.slice(PENDING.length);
    const id = await deps.queue.enqueue(req.name, req.data, { jobId: claimedId });
    await markQueued(id);
    return { accepted: false, duplicate: true, jobId: id, completedClaim: true };
  }
  return { accepted: false, duplicate: true, ...(current.startsWith(QUEUED) ? { jobId: current.slice(QUEUED.length) } : {}) };
}

/** Rule 9: remove our own pending record after a failed enqueue; a few quick tries, and a loud log if it stays. */
async function releaseClaim(deps: ClaimDeps, op: () => Promise<number>, what: string): Promise<void> {
  for (let attempt = 1; attempt <= 3; attempt++) {
    try {
      await op();
      return;
    } catch {
      await new Promise((r) => setTimeout(r, 50 * attempt));
    }
  }
  deps.logger.error('could not remove the seen record after a failed enqueue; a retry will complete the pending claim', { what });
}
