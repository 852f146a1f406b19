import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { callScript, defineScript, type Reply } from '../shared/redisBatch.js';
import { loadLua } from '../shared/lua.js';
import { RATE_HIT_LUA_PIECE, type DeferredRateHit } from '../shared/rateLimit.js';
import type { JobDataByName, JobName } from '../shared/jobs.js';
import type { Logger } from '../shared/logger.js';
import { QueueUnavailableError, type OpsQueue } from '../shared/queue.js';
import { SEEN_PREFIX } from '../shared/keys.js';

/**
 * Seen record and job in one atomic step: one Redis round trip for a new event and for a
 * duplicate, the rate-limit hit included.
 *
 * The spec's flow is "SET seen NX, then enqueue; if enqueueing fails, delete seen" (rules 6-9).
 * Done as two steps, an API process killed between the SET and the enqueue (SIGKILL, OOM, node
 * eviction) leaves a seen record with no job: every retry of the sender is then a "duplicate" for
 * 24 h and the event is lost. test/integration/reliability/faults.test.ts kills APIs under load.
 *
 * So both run in one script on Redis (src/shared/lua/intake-*.lua), per event: when none of its
 * keys exists (its content key, and a sender's delivery id, each with its own lifetime), BullMQ's
 * own add script adds its job (src/shared/queue.ts: stored exactly as Queue#add stores it, for a
 * plain BullMQ worker and Bull Board) and every key is set to "q:<job id>". Redis runs a script
 * alone, and replicates its writes together; a command that fails inside it (Redis out of memory)
 * stops it there, after the events before it were recorded with their jobs and before anything of
 * the events after it. An event is recorded with its job or not at all. Answers, per event:
 *   - new: accepted, with its job's id;
 *   - "q:<id>": a duplicate of job <id>;
 *   - any other value (a record that names no job): a duplicate.
 * A call that fails or times out answers 503 (rule 9 holds: no record is left without its job).
 * After a timeout the outcome is unknown; the sender's retry finds the record with its job (a
 * duplicate) or nothing (a new claim): never two jobs.
 *
 * Rate limit: on one server the request's hit runs first inside the same script, and over the
 * limit the script takes nothing in (429). On a Redis Cluster the rate-limit key (tagged by
 * address) and the intake's keys (the {opsgate} slot, src/shared/keys.ts) may live on different
 * primaries: the hit is its own command there, answered before the intake runs.
 *
 * Job ids are per claim (not per event), so an alert that fires again after its 300 s window gets
 * a new job.
 */
export const QUEUED = 'q:';

/*
 * One script call per EVENTS_PER_CALL events (not one per event: on a 1,000-alert payload the
 * per-command cost of ioredis dominated), which also bounds how long one call holds Redis. Every
 * key of a call shares the {opsgate} hash tag on a Redis Cluster, so one call stays in one slot.
 */
const EVENTS_PER_CALL = 250;

const INTAKE = 'opsgateIntake';
/** The request's rate-limit hit, then the intake, in one command (one server, not a Cluster). */
const INTAKE_RATED = 'opsgateIntakeRated';
/** The seen records' prefix for the intake script (a record of version 0.1.0 is found by its key's rest). */
const SEEN_PREFIX_LUA = { lua: `local seen_prefix = ${JSON.stringify(SEEN_PREFIX)}` };
/** The scripts of a queue: its BullMQ add and templates (OpsQueue.intake.lua), then the intake's own Lua. */
const scripts = new WeakMap<OpsQueue['intake'], { plain: string; rated: string }>();
function scriptsOf(intake: OpsQueue['intake']): { plain: string; rated: string } {
  let s = scripts.get(intake);
  if (!s) {
    s = {
      plain: loadLua({ lua: intake.lua }, SEEN_PREFIX_LUA, 'intake-events', 'intake'),
      rated: loadLua(RATE_HIT_LUA_PIECE, { lua: intake.lua }, SEEN_PREFIX_LUA, 'intake-events', 'intake-rated'),
    };
    scripts.set(intake, s);
  }
  return s;
}
/** What a rated call answers in front of the events' answers: the rate-limit count and ttl. */
const RATED_HEAD = 2;

export interface ClaimDeps {
  redis: Redis;
  queue: Pick<OpsQueue, 'intake'>;
  logger: Logger;
}

export interface ClaimRequest<N extends JobName = JobName> {
  /** The event's seen key (spec: 24 h / 300 s). */
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
  /** Accepted: every seen key this claim wrote (the event's key and its delivery keys), e.g. for REDIS_MIN_REPLICAS_ACK's take-back. */
  keys?: string[];
}

export interface ClaimOptions {
  /** The request's rate-limit hit, sent in the same round trip where Redis is one server. */
  rateHit?: DeferredRateHit;
}

export async function claimAndEnqueue<N extends JobName>(
  deps: ClaimDeps,
  req: ClaimRequest<N>,
  opts: ClaimOptions = {},
): Promise<ClaimOutcome> {
  return (await claimAndEnqueueMany(deps, [req], opts))[0]!;
}

/** One event's keys and script arguments, and the job it is claimed with. */
interface Encoded {
  keys: string[];
  args: Array<string | number>;
  jobId: string;
  name: JobName;
}

/** The protocol above for a batch of events (one alert payload): one round trip, whatever its size. */
export async function claimAndEnqueueMany(
  deps: ClaimDeps,
  reqs: readonly ClaimRequest[],
  opts: ClaimOptions = {},
): Promise<ClaimOutcome[]> {
  if (reqs.length === 0) return [];
  const intake = deps.queue.intake;
  const inline = opts.rateHit && !deps.redis.isCluster ? opts.rateHit.inline() : undefined;
  if (opts.rateHit && !inline) {
    const limited = await opts.rateHit.sendOn(deps.redis);
    if (limited) throw limited;
  }

  const events = reqs.map((r): Encoded => {
    const jobId = randomUUID();
    const keys = [r.key];
    const args: Encoded['args'] = [1 + (r.alsoKeys?.length ?? 0), jobId, r.ttlSeconds];
    for (const k of r.alsoKeys ?? []) {
      keys.push(k.key);
      args.push(k.ttlSeconds);
    }
    args.push(JSON.stringify(r.data));
    return { keys, args, jobId, name: r.name };
  });
  // One call per EVENTS_PER_CALL events of one job name (a call names its jobs' template).
  const calls: Encoded[][] = [];
  for (const e of events) {
    const last = calls[calls.length - 1];
    if (last && last.length < EVENTS_PER_CALL && last[0]!.name === e.name) last.push(e);
    else calls.push([e]);
  }

  const send = (client: Redis, batch: readonly Encoded[], rated: boolean): Promise<unknown> => {
    const keys: string[] = rated ? [inline!.key] : [];
    const args: Encoded['args'] = rated ? [inline!.windowMs, inline!.rps] : [];
    keys.push(...intake.keys);
    args.push(Date.now(), batch[0]!.name);
    for (const e of batch) {
      keys.push(...e.keys);
      args.push(...e.args);
    }
    defineScript(client, rated ? INTAKE_RATED : INTAKE, scriptsOf(intake)[rated ? 'rated' : 'plain']);
    return callScript(client, rated ? INTAKE_RATED : INTAKE, keys, args);
  };

  // Over the rate limit nothing may be taken in: a payload of several calls sends the rest only
  // once the first (rated) call has answered within the limit.
  let replies: Reply[];
  if (inline) {
    replies = await intake.run((client) => [send(client, calls[0]!, true)]);
    const [err, first] = replies[0]!;
    const limited = inline.decide(err ?? (Array.isArray(first) ? [Number(first[0]), Number(first[1])] : new Error('no rate-limit reply')));
    if (limited) throw limited;
    if (calls.length > 1) replies = replies.concat(await intake.run((client) => calls.slice(1).map((c) => send(client, c, false))));
  } else {
    replies = await intake.run((client) => calls.map((c) => send(client, c, false)));
  }

  const outcomes = new Array<ClaimOutcome>(reqs.length);
  /** Index of each call's first event. */
  const starts = calls.map((_, c) => calls.slice(0, c).reduce((n, call) => n + call.length, 0));
  let failed = 0;
  replies.forEach(([err, value], c) => {
    const answers = Array.isArray(value) ? (value as unknown[]).slice(c === 0 && inline ? RATED_HEAD : 0) : [];
    calls[c]!.forEach((e, j) => {
      const i = starts[c]! + j;
      const answer = answers[j];
      if (err || typeof answer !== 'string') {
        failed++;
        return;
      }
      if (answer.startsWith('+')) {
        const id = answer.slice(1);
        if (id === e.jobId) {
          intake.counted(reqs[i]!.name);
          outcomes[i] = { accepted: true, duplicate: false, jobId: id, keys: e.keys };
        } else {
          outcomes[i] = { accepted: false, duplicate: true, jobId: id };
        }
      } else if (answer.startsWith(QUEUED)) {
        outcomes[i] = { accepted: false, duplicate: true, jobId: answer.slice(QUEUED.length) };
      } else {
        outcomes[i] = { accepted: false, duplicate: true };
      }
    });
  });
  if (failed > 0) {
    // The events taken in before the failure stay (each with its job); the sender's retry finds
    // them as duplicates and takes in the rest.
    const err = replies.find(([e]) => e)?.[0];
    deps.logger.warn('intake failed for part of a batch; the sender will retry', { failed, of: reqs.length, err });
    throw new QueueUnavailableError('submit', true);
  }
  return outcomes;
}
