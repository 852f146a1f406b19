import { randomUUID } from 'node:crypto';
import type { ChainableCommander, Redis } from 'ioredis';
import type { DeferredRateHit } from '../middleware/rateLimit.js';
import type { JobDataByName, JobName } from '../shared/jobs.js';
import type { Logger } from '../shared/logger.js';
import { QueueUnavailableError, type ClaimedJob, type OpsQueue } from '../shared/queue.js';
import { dedupId } from './redisOps.js';
import { ServiceUnavailableError } from '../shared/errors.js';

/**
 * Seen record + enqueue without a window in which a crash loses the event, in two Redis round
 * trips for a new event and one for a duplicate, the rate-limit hit included (issue 10).
 *
 * The spec's flow is "SET seen NX, then enqueue; if enqueueing fails, delete seen" (rules 6-9).
 * An API process killed between the SET and the enqueue (SIGKILL, OOM, node eviction) would leave
 * a seen record with no job: every retry of the sender is then a "duplicate" for 24 h and the
 * event is lost. test/reliability/faults.test.ts reproduces it by killing an API under load.
 *
 * So the record carries the job id the claimant will use, and a state:
 *   "p:<jobId>"  pending: claimed, job not confirmed on the queue yet;
 *   "q:<jobId>"  queued: the job was added.
 * Round trip 1 (one pipeline on the request connection): the request's deferred rate-limit hit
 *   (src/middleware/rateLimit.ts) and one claim script per event (SET NX EX on every key of the
 *   event, else the current value; an event may have several keys, e.g. its content key and the
 *   sender's delivery id, claimed atomically together).
 *   - over the rate limit -> our fresh claims are removed, 429;
 *   - "q:<id>" -> duplicate of job <id>: done, one round trip;
 *   - any other value (records written by older versions) -> duplicate;
 *   - claimed, or "p:<id>" (the claimant is still in flight or died) -> round trip 2.
 * Round trip 2 (one pipeline on the queue connection): BullMQ's add script for every job, with
 *   the claimed job id and BullMQ's own deduplication (id = the event, ttl = its window), then one
 *   "mark" script per event that turns our "p:" into "q:<the id on the queue>" only once the add
 *   has put it there. BullMQ's deduplication key survives the job's completion and its removal by
 *   the retention policy for the whole ttl (test/reliability/claim.test.ts proves it on a real
 *   Redis), so re-adding a "p:" event never makes a second job, even when the first add's reply
 *   was lost or the job is long gone: the add answers the first job's id.
 *   - an add failed -> our "p:" record is removed (rule 9), 503;
 *   - the mark failed -> harmless: a later duplicate finds "p:" and re-adds (a no-op).
 * Job ids are per claim (not per event), so an alert that fires again after its 300 s window
 * gets a new job, as before.
 */
export const PENDING = 'p:';
export const QUEUED = 'q:';

const CLAIM = 'opsgateSeenClaimN';
/**
 * KEYS: every key of one event; ARGV[1] the pending value, ARGV[1+i] the ttl (s) of KEYS[i].
 * When no key exists: sets them all, returns false. Else returns the first existing value and
 * records that value on the keys that lack it (so a later delivery found by any key sees it).
 */
const CLAIM_LUA = `
local found = false
for i = 1, #KEYS do
  found = redis.call('GET', KEYS[i])
  if found then break end
end
local value = found or ARGV[1]
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], value, 'EX', ARGV[i + 1], 'NX')
end
return found
`;
const RELEASE = 'opsgateSeenReleaseN';
/** KEYS: the event's keys; ARGV[1] the expected value. Deletes each key that still holds it. */
const RELEASE_LUA = `
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then n = n + redis.call('DEL', KEYS[i]) end
end
return n
`;
const MARK = 'opsgateSeenMarkN';
/**
 * KEYS[1] BullMQ's deduplication key of the event, KEYS[2..] the event's seen keys; ARGV[1] the
 * pending value. If the add put the event on the queue (the dedup key names its job), every
 * seen key still holding ARGV[1] becomes "q:<that job id>" (TTL kept). Returns the job id or false.
 */
const MARK_LUA = `
local id = redis.call('GET', KEYS[1])
if not id then return false end
for i = 2, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('SET', KEYS[i], '${QUEUED}' .. id, 'KEEPTTL') end
end
return id
`;

type Scripted = Record<string, ((...args: Array<string | number>) => unknown) | undefined>;

/** Queues a script on a pipeline by its defined name, or by EVAL on a connection that lacks it. */
function script(p: ChainableCommander, name: string, lua: string, keys: readonly string[], args: ReadonlyArray<string | number>): void {
  const fn = (p as unknown as Scripted)[name];
  if (typeof fn === 'function') fn.call(p, keys.length, ...keys, ...args);
  else p.eval(lua, keys.length, ...keys, ...args);
}

function defineScripts(redis: Redis): void {
  const r = redis as unknown as Scripted;
  if (typeof r[CLAIM] !== 'function') redis.defineCommand(CLAIM, { lua: CLAIM_LUA });
  if (typeof r[RELEASE] !== 'function') redis.defineCommand(RELEASE, { lua: RELEASE_LUA });
  if (typeof r[MARK] !== 'function') redis.defineCommand(MARK, { lua: MARK_LUA });
}

export interface ClaimDeps {
  redis: Redis;
  queue: Pick<OpsQueue, 'addClaimed'>;
  logger: Logger;
}

export interface ClaimRequest<N extends JobName = JobName> {
  /** The event's seen key (spec: 24 h / 300 s), also its BullMQ deduplication id. */
  key: string;
  ttlSeconds: number;
  /** More keys of the same event (a sender's delivery id), each with its own lifetime. */
  alsoKeys?: ReadonlyArray<{ key: string; ttlSeconds: number }>;
  name: N;
  data: JobDataByName[N];
  /** For logs only. */
  what: string;
}

export interface ClaimOutcome {
  accepted: boolean;
  duplicate: boolean;
  /** The job that stands for the event (absent only for records written by old versions). */
  jobId?: string;
  /** A duplicate that found a pending claim and made sure its job is on the queue. */
  completedClaim?: boolean;
  /** Accepted: every seen key this claim wrote (the event's key and its delivery keys), e.g. for REDIS_MIN_REPLICAS_ACK's take-back. */
  keys?: string[];
}

export interface ClaimOptions {
  /** The request's rate-limit hit, sent in the first round trip. */
  rateHit?: DeferredRateHit;
}

const redisDown = () => new ServiceUnavailableError('redis unavailable; retry later', 5);

export async function claimAndEnqueue<N extends JobName>(deps: ClaimDeps, req: ClaimRequest<N>, opts: ClaimOptions = {}): Promise<ClaimOutcome> {
  return (await claimAndEnqueueMany(deps, [req], opts))[0]!;
}

/** The claim protocol above for a batch of events (one alert payload): two round trips in all, whatever its size. */
export async function claimAndEnqueueMany(deps: ClaimDeps, reqs: readonly ClaimRequest[], opts: ClaimOptions = {}): Promise<ClaimOutcome[]> {
  defineScripts(deps.redis);
  const keysOf = (r: ClaimRequest) => [r.key, ...(r.alsoKeys ?? []).map((k) => k.key)];
  const ttlsOf = (r: ClaimRequest) => [r.ttlSeconds, ...(r.alsoKeys ?? []).map((k) => k.ttlSeconds)];
  const pendings = reqs.map(() => PENDING + randomUUID());

  // Round trip 1: rate limit + every claim. On a Redis Cluster the rate-limit key (tagged by
  // address) and the seen keys ({opsgate} slot) may sit on different primaries, and one cluster
  // pipeline must stay on one node: there the hit goes in its own pipeline, sent concurrently
  // (still one round trip of latency).
  const p1 = deps.redis.pipeline();
  const rateOwn = opts.rateHit && deps.redis.isCluster ? deps.redis.pipeline() : undefined;
  const decideRate = opts.rateHit?.appendTo(rateOwn ?? p1);
  reqs.forEach((r, i) => script(p1, CLAIM, CLAIM_LUA, keysOf(r), [pendings[i]!, ...ttlsOf(r)]));
  let replies: Array<[Error | null, unknown]>;
  let rateReply: [Error | null, unknown] | undefined;
  try {
    const [own, main] = await Promise.all([
      rateOwn ? rateOwn.exec().catch((err: Error) => [[err, undefined]] as Array<[Error | null, unknown]>) : Promise.resolve(undefined),
      p1.exec(),
    ]);
    replies = (main ?? []) as Array<[Error | null, unknown]>;
    rateReply = rateOwn ? (own?.[0] as [Error | null, unknown] | undefined) : replies[0];
  } catch {
    throw redisDown();
  }
  const claimReplies = decideRate && !rateOwn ? replies.slice(1) : replies;
  const claimed = reqs.map((_, i) => {
    const [err, value] = claimReplies[i] ?? [new Error('no reply'), undefined];
    return err ? err : (value as string | null);
  });
  const ours = reqs.map((_, i) => i).filter((i) => claimed[i] === null);
  const undo = () => releaseClaims(deps, ours.map((i) => ({ keys: keysOf(reqs[i]!), value: pendings[i]!, what: reqs[i]!.what })));
  try {
    decideRate?.(rateReply);
    if (claimed.some((c) => c instanceof Error)) throw redisDown();
  } catch (err) {
    await undo();
    throw err;
  }

  const outcomes: ClaimOutcome[] = new Array(reqs.length);
  const toAdd: Array<{ i: number; jobId: string; value: string; fresh: boolean }> = [];
  reqs.forEach((_, i) => {
    const current = claimed[i] as string | null;
    if (current === null) toAdd.push({ i, jobId: pendings[i]!.slice(PENDING.length), value: pendings[i]!, fresh: true });
    else if (current.startsWith(PENDING)) toAdd.push({ i, jobId: current.slice(PENDING.length), value: current, fresh: false });
    else if (current.startsWith(QUEUED)) outcomes[i] = { accepted: false, duplicate: true, jobId: current.slice(QUEUED.length) };
    else outcomes[i] = { accepted: false, duplicate: true };
  });
  if (toAdd.length === 0) return outcomes;

  // Round trip 2: every add, then every mark.
  const jobs: ClaimedJob[] = toAdd.map((a) => {
    const r = reqs[a.i]!;
    return { name: r.name, data: r.data, jobId: a.jobId, dedupId: dedupId(r.key), ttlMs: r.ttlSeconds * 1000 };
  });
  let added;
  try {
    added = await deps.queue.addClaimed(jobs, (p2, dedupKey) => {
      toAdd.forEach((a, n) => {
        const r = reqs[a.i]!;
        script(p2, MARK, MARK_LUA, [dedupKey(jobs[n]!.dedupId), ...keysOf(r)], [a.value]);
      });
    });
  } catch (err) {
    await undo();
    throw err;
  }
  const failed: number[] = [];
  toAdd.forEach((a, n) => {
    const id = added.ids[n]!;
    if (id instanceof Error) {
      failed.push(a.i);
      return;
    }
    const mark = added.then[n];
    if (!mark || mark[0]) {
      // Harmless: a later duplicate finds "p:" and re-adds with the same job id (a no-op).
      deps.logger.warn('could not mark the seen record as queued', { what: reqs[a.i]!.what, err: mark?.[0] });
    }
    outcomes[a.i] = a.fresh && id === a.jobId ? { accepted: true, duplicate: false, jobId: id, keys: keysOf(reqs[a.i]!) } : { accepted: false, duplicate: true, jobId: id, ...(a.fresh ? {} : { completedClaim: true }) };
  });
  if (failed.length > 0) {
    // Rule 9: remove our own pending records of the events whose add failed, then propagate (503).
    await releaseClaims(
      deps,
      failed.filter((i) => claimed[i] === null).map((i) => ({ keys: keysOf(reqs[i]!), value: pendings[i]!, what: reqs[i]!.what })),
    );
    deps.logger.warn('enqueue failed for part of an intake batch; the sender will retry', { failed: failed.length, of: reqs.length });
    throw new QueueUnavailableError();
  }
  return outcomes;
}

/** Rule 9: remove our own pending records (one round trip); a few quick tries, and a loud log if they stay. */
async function releaseClaims(deps: ClaimDeps, claims: ReadonlyArray<{ keys: string[]; value: string; what: string }>): Promise<void> {
  if (claims.length === 0) return;
  for (let attempt = 1; attempt <= 3; attempt++) {
    try {
      const p = deps.redis.pipeline();
      for (const c of claims) script(p, RELEASE, RELEASE_LUA, c.keys, [c.value]);
      const out = await p.exec();
      if (out && out.every(([err]) => !err)) return;
    } catch {
      // retried below
    }
    await new Promise((r) => setTimeout(r, 50 * attempt));
  }
  deps.logger.error('could not remove the seen record after a failed enqueue; a retry will complete the pending claim', {
    what: claims.map((c) => c.what).slice(0, 10),
  });
}
