import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { callScript, corked, defineScript, settle, type Reply } from '../shared/redisBatch.js';
import { loadLua } from '../shared/lua.js';
import { RATE_HIT_LUA_PIECE, type DeferredRateHit } from '../shared/rateLimit.js';
import type { JobDataByName, JobName } from '../shared/jobs.js';
import type { Logger } from '../shared/logger.js';
import { QueueUnavailableError, type ClaimedJob, type OpsQueue } from '../shared/queue.js';
import { dedupId } from '../shared/keys.js';
import { ServiceUnavailableError } from '../shared/errors.js';

/**
 * Seen record + enqueue without a window in which a crash loses the event, in two Redis round
 * trips for a new event and one for a duplicate, the rate-limit hit included.
 *
 * The spec's flow is "SET seen NX, then enqueue; if enqueueing fails, delete seen" (rules 6-9).
 * An API process killed between the SET and the enqueue (SIGKILL, OOM, node eviction) would leave
 * a seen record with no job: every retry of the sender is then a "duplicate" for 24 h and the
 * event is lost. test/integration/reliability/faults.test.ts reproduces it by killing an API under load.
 *
 * So the record carries the job id the claimant will use, and a state:
 *   "p:<jobId>"  pending: claimed, job not confirmed on the queue yet;
 *   "q:<jobId>"  queued: the job was added.
 * Round trip 1 (one write on the request connection): the request's deferred rate-limit hit
 *   (src/shared/rateLimit.ts) and the claim script, one call per EVENTS_PER_CALL events (SET NX EX on every key of the
 *   event, else the current value; an event may have several keys, e.g. its content key and the
 *   sender's delivery id, claimed atomically together).
 *   - over the rate limit -> our fresh claims are removed, 429;
 *   - "q:<id>" -> duplicate of job <id>: done, one round trip;
 *   - any other value (a record without a job id) -> duplicate;
 *   - claimed, or "p:<id>" (the claimant is still in flight or died) -> round trip 2.
 * Round trip 2 (one write on the queue connection): BullMQ's add script for every job, with
 *   the claimed job id and BullMQ's own deduplication (id = the event, ttl = its window), then the
 *   "mark" script (one call per EVENTS_PER_CALL events) that turns our "p:" into "q:<the id on the queue>" only once the add
 *   has put it there. BullMQ's deduplication key survives the job's completion and its removal by
 *   the retention policy for the whole ttl (test/integration/reliability/claim.test.ts proves it on a real
 *   Redis), so re-adding a "p:" event never makes a second job, even when the first add's reply
 *   was lost or the job is long gone: the add answers the first job's id.
 *   - an add failed -> our "p:" record is removed (rule 9), 503;
 *   - the mark failed -> harmless: a later duplicate finds "p:" and re-adds (a no-op).
 * Job ids are per claim (not per event), so an alert that fires again after its 300 s window
 * gets a new job.
 */
export const PENDING = 'p:';
export const QUEUED = 'q:';

/*
 * The three scripts take a batch of events in one call (one command per EVENTS_PER_CALL events,
 * not one per event: on a 1,000-alert payload the per-command cost of ioredis dominated). Every
 * key of a batch shares the {opsgate} hash tag (src/shared/keys.ts), so on a Redis Cluster
 * one call stays in one slot.
 */
const EVENTS_PER_CALL = 250;

// The scripts' Lua: src/shared/lua/claim-*.lua (the rated claim runs the rate-limit hit first).
const CLAIM = 'opsgateSeenClaimBatch';
const CLAIM_LUA = loadLua('claim-events', 'claim');
const CLAIM_RATED = 'opsgateSeenClaimBatchRated';
/** One command for the hit and the claims where both keys live on one server (not a Cluster). */
const CLAIM_RATED_LUA = loadLua(RATE_HIT_LUA_PIECE, 'claim-events', 'claim-rated');
const RELEASE = 'opsgateSeenReleaseBatch';
const RELEASE_LUA = loadLua('claim-release');
const MARK = 'opsgateSeenMarkBatch';
const MARK_LUA = loadLua('claim-mark');

/** What the first call of a batch carries in front of the items (CLAIM_RATED's rate-limit hit). */
interface Head {
  name: string;
  keys: string[];
  args: Array<string | number>;
}

/** One script call per EVENTS_PER_CALL items: `encode` adds an item's keys and args; answers the calls' promises. */
function batchedCalls<T>(
  redis: Redis,
  name: string,
  items: readonly T[],
  encode: (item: T, keys: string[], args: Array<string | number>) => void,
  head?: Head,
): Array<Promise<unknown>> {
  const calls: Array<Promise<unknown>> = [];
  for (let from = 0; from < items.length; from += EVENTS_PER_CALL) {
    const first = from === 0 && head;
    const keys: string[] = first ? [...head.keys] : [];
    const args: Array<string | number> = first ? [...head.args] : [];
    for (const item of items.slice(from, from + EVENTS_PER_CALL)) encode(item, keys, args);
    calls.push(callScript(redis, first ? head.name : name, keys, args));
  }
  return calls;
}

/**
 * The per-item answers of batchedCalls' replies, in item order: a string, or an error (its call
 * failed, or answered nothing for it). `skip`: leading values of the first reply that are not
 * per item (CLAIM_RATED's count and ttl).
 */
function perItem(replies: ReadonlyArray<Reply>, count: number, skip = 0): Array<string | Error> {
  const out: Array<string | Error> = [];
  replies.forEach(([err, value], c) => {
    const n = Math.min(EVENTS_PER_CALL, count - c * EVENTS_PER_CALL);
    const values = Array.isArray(value) ? (value as unknown[]).slice(c === 0 ? skip : 0) : [];
    for (let i = 0; i < n; i++) {
      const v = values[i];
      out.push(err ?? (typeof v === 'string' ? v : new Error(`unexpected script reply ${String(v)}`)));
    }
  });
  return out;
}

function defineScripts(redis: Redis): void {
  defineScript(redis, CLAIM, CLAIM_LUA);
  defineScript(redis, CLAIM_RATED, CLAIM_RATED_LUA);
  defineScript(redis, RELEASE, RELEASE_LUA);
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
  /** The job that stands for the event (absent only for a record that names no job). */
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

export async function claimAndEnqueue<N extends JobName>(
  deps: ClaimDeps,
  req: ClaimRequest<N>,
  opts: ClaimOptions = {},
): Promise<ClaimOutcome> {
  return (await claimAndEnqueueMany(deps, [req], opts))[0]!;
}

/** The claim protocol above for a batch of events (one alert payload): two round trips in all, whatever its size. */
export async function claimAndEnqueueMany(
  deps: ClaimDeps,
  reqs: readonly ClaimRequest[],
  opts: ClaimOptions = {},
): Promise<ClaimOutcome[]> {
  defineScripts(deps.redis);
  const keysOf = (r: ClaimRequest) => [r.key, ...(r.alsoKeys ?? []).map((k) => k.key)];
  const ttlsOf = (r: ClaimRequest) => [r.ttlSeconds, ...(r.alsoKeys ?? []).map((k) => k.ttlSeconds)];
  const pendings = reqs.map(() => PENDING + randomUUID());

  // Round trip 1: rate limit + every claim, issued together in one write (src/shared/redisBatch.ts).
  // On one server the hit runs inside the first claim call (CLAIM_RATED). On a Redis Cluster the
  // rate-limit key (tagged by address) and the seen keys ({opsgate} slot) may sit on different
  // primaries: the hit is its own command there, sent to its node in the same tick.
  const inline = opts.rateHit && !deps.redis.isCluster ? opts.rateHit.inline() : undefined;
  const head: Head | undefined = inline && { name: CLAIM_RATED, keys: [inline.key], args: [inline.windowMs, inline.rps] };
  const [rateDecision, claimReplies] = corked(
    deps.redis,
    () =>
      [
        inline ? undefined : opts.rateHit?.sendOn(deps.redis),
        settle(
          batchedCalls(
            deps.redis,
            CLAIM,
            reqs.map((r, i) => ({ r, i })),
            ({ r, i }, keys, args) => {
              const ks = keysOf(r);
              keys.push(...ks);
              args.push(ks.length, pendings[i]!, ...ttlsOf(r));
            },
            head,
          ),
        ),
      ] as const,
  );
  const [separate, replies] = await Promise.all([rateDecision, claimReplies]);
  let limited = separate;
  if (inline) {
    const [err, first] = replies[0]!;
    limited = inline.decide(err ?? (Array.isArray(first) ? [Number(first[0]), Number(first[1])] : new Error('no rate-limit reply')));
  }
  // null: claimed by us; a string: the record found; an Error: the claim's call failed (or, over
  // the rate limit, was not made).
  const claimed = perItem(replies, reqs.length, inline ? 2 : 0).map((v) => (v === '' ? null : v));
  const ours = reqs.map((_, i) => i).filter((i) => claimed[i] === null);
  const undo = () =>
    releaseClaims(
      deps,
      ours.map((i) => ({ keys: keysOf(reqs[i]!), value: pendings[i]!, what: reqs[i]!.what })),
    );
  if (limited || claimed.some((c) => c instanceof Error)) {
    await undo();
    throw limited ?? redisDown();
  }

  const outcomes = new Array<ClaimOutcome>(reqs.length);
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
    added = await deps.queue.addClaimed(jobs, (client, dedupKey) => {
      defineScript(client, MARK, MARK_LUA);
      return batchedCalls(
        client,
        MARK,
        toAdd.map((a, n) => ({ a, n })),
        ({ a, n }, keys, args) => {
          const ks = keysOf(reqs[a.i]!);
          keys.push(dedupKey(jobs[n]!.dedupId), ...ks);
          args.push(ks.length, a.value);
        },
      );
    });
  } catch (err) {
    await undo();
    throw err;
  }
  const marks = perItem(added.then, toAdd.length);
  const failed: number[] = [];
  toAdd.forEach((a, n) => {
    const id = added.ids[n]!;
    if (id instanceof Error) {
      failed.push(a.i);
      return;
    }
    const mark = marks[n];
    if (mark === undefined || mark instanceof Error) {
      // Harmless: a later duplicate finds "p:" and re-adds with the same job id (a no-op).
      deps.logger.warn('could not mark the seen record as queued', { what: reqs[a.i]!.what, err: mark });
    }
    outcomes[a.i] =
      a.fresh && id === a.jobId
        ? { accepted: true, duplicate: false, jobId: id, keys: keysOf(reqs[a.i]!) }
        : { accepted: false, duplicate: true, jobId: id, ...(a.fresh ? {} : { completedClaim: true }) };
  });
  if (failed.length > 0) {
    // Rule 9: remove our own pending records of the events whose add failed, then propagate (503).
    await releaseClaims(
      deps,
      failed.filter((i) => claimed[i] === null).map((i) => ({ keys: keysOf(reqs[i]!), value: pendings[i]!, what: reqs[i]!.what })),
    );
    deps.logger.warn('enqueue failed for part of an intake batch; the sender will retry', { failed: failed.length, of: reqs.length });
    throw new QueueUnavailableError('submit');
  }
  return outcomes;
}

/** Rule 9: remove our own pending records (one round trip); a few quick tries, and a loud log if they stay. */
async function releaseClaims(deps: ClaimDeps, claims: ReadonlyArray<{ keys: string[]; value: string; what: string }>): Promise<void> {
  if (claims.length === 0) return;
  for (let attempt = 1; attempt <= 3; attempt++) {
    try {
      const out = await settle(
        corked(deps.redis, () =>
          batchedCalls(deps.redis, RELEASE, claims, (c, keys, args) => {
            keys.push(...c.keys);
            args.push(c.keys.length, c.value);
          }),
        ),
      );
      if (out.every(([err]) => !err)) return;
    } catch {
      // retried below
    }
    await new Promise((r) => setTimeout(r, 50 * attempt));
  }
  deps.logger.error('could not remove the seen record after a failed enqueue; a retry will complete the pending claim', {
    what: claims.map((c) => c.what).slice(0, 10),
  });
}
