import type { Redis } from 'ioredis';
import { JOB, type JobDataByName } from '../shared/jobs.js';
import { INTAKE_SINCE_KEY, deliveryKey, legacySeenKey, pushPairKey } from '../shared/keys.js';
import type { Logger } from '../shared/logger.js';
import type { JobReads } from '../shared/jobReads.js';
import type { AddRequest, Producer } from '../shared/producer.js';
import { redisCall } from './redisOps.js';
import type { Written } from './replication.js';

/**
 * The intake: an event that passed its sender's checks becomes exactly one job, however often it
 * is delivered.
 *
 * - The event's identity (a push's `<source>:<project>:<ref>:<sha>`, an alert's fingerprint) is
 *   its job's BullMQ deduplication id, written with the job in one script: no step between record
 *   and job that a crash could split. A duplicate answers with the job that holds the record.
 * - A sender's delivery id is an alias ("q:<job id>") kept 30 days, past the event's 24 h and
 *   GitHub's 3-day redelivery, read before the add and written after it (at most one step behind).
 * - A signed sender without a timestamp (`replayGuard`) carries the push's `before` commit. A
 *   captured delivery verifies forever, so with a new delivery id after 24 h it would deploy the
 *   old commit again: a rollback by anyone who kept one. Its (project, before, after) is kept 30
 *   days ("<until>:<job id>", in the alias's MGET and MULTI); found past `until`, the push is
 *   ignored. An operator's replay (`allowRedeploy`) skips the rule.
 * - Version 0.1's records (`{opsgate}:seen:<identity>`: "q:<job id>", or "p:<job id>" for a claim
 *   it may not have added) are read for LEGACY_WINDOW_MS after this version first met a queue with
 *   jobs; a queue without jobs accepted nothing in the last 24 h, so a new installation never reads them.
 */
const SEEN_EVENT_TTL_SECONDS = 86400;
const SEEN_ALERT_TTL_SECONDS = 300;
const SEEN_DELIVERY_TTL_SECONDS = 30 * 86400;
export const SEEN_PAIR_TTL_SECONDS = SEEN_DELIVERY_TTL_SECONDS;
/** The API's clock may lag Redis's: a pair's rule answers from this long before its window's end, never after the record expired. */
export const PAIR_CLOCK_SKEW_MS = 60_000;
export const QUEUED = 'q:';
const LEGACY_PENDING = 'p:';
/** Version 0.1's longest record (a push's 24 h) and an upgrade's rollout after it. */
export const LEGACY_WINDOW_MS = (SEEN_EVENT_TTL_SECONDS + 3600) * 1000;

interface IntakeDeps {
  producer: Pick<Producer, 'add' | 'addMany'>;
  jobs: Pick<JobReads, 'any'>;
  /** A `request`-profile connection: aliases and version 0.1's records. */
  redis: Redis;
  logger: Logger;
  now?: () => number;
}

export interface PushEvent {
  /** The sender's name (a key of the source registry): names its delivery ids. */
  source: string;
  /** The event's dedup identity (absent: an operator's explicit deploy, not deduplicated by event). */
  eventId?: string;
  deliveryId?: string;
  /** The deploy job as the executor built it; the intake adds its dedup record. */
  job: Omit<AddRequest<typeof JOB.runDeployPipeline>, 'deduplication'>;
  /** A `replayGuard` sender's commit before the push ("" for a new branch). */
  before?: string;
  /** An operator's replay: not ignored by the commit-pair rule (the event's 24 h still hold). */
  allowRedeploy?: boolean;
}

export interface IntakeResult {
  accepted: boolean;
  duplicate: boolean;
  /** The job that stands for the event: the new one, or the one a duplicate found. */
  jobId: string;
  /** Accepted: what the intake wrote, for REDIS_MIN_REPLICAS_ACK's take-back. */
  written?: Written;
  /** Waiting for approval (its job id will be the approval id). */
  approval?: { id: string; expires_at: string; required: number };
  held?: { until: string; reasons: string };
  /** Not deployed: its commit pair was queued as `jobId` in the last 30 days. */
  ignored?: { reason: string };
}

interface AlertEvent {
  fingerprint: string;
  data: JobDataByName[typeof JOB.notifyOncall];
}

type RecordWrite = { key: string; value: string; ttl: number; nx: boolean };

/** The records as one command, or one MULTI (one round trip either way; on a Cluster they share a slot): whether each was set. */
async function writeRecords(redis: Redis, writes: readonly RecordWrite[]): Promise<boolean[]> {
  if (writes.length === 1) {
    const { key, value, ttl, nx } = writes[0]!;
    return [(nx ? await redis.set(key, value, 'EX', ttl, 'NX') : await redis.set(key, value, 'EX', ttl)) !== null];
  }
  const tx = redis.multi();
  for (const { key, value, ttl, nx } of writes) {
    if (nx) tx.set(key, value, 'EX', ttl, 'NX');
    else tx.set(key, value, 'EX', ttl);
  }
  const replies = await tx.exec();
  if (!replies) throw new Error('MULTI aborted');
  return replies.map(([err, reply]) => {
    if (err) throw err;
    return reply !== null;
  });
}

const addedOf = (a: { added: boolean; jobId: string }): IntakeResult => ({
  accepted: a.added,
  duplicate: !a.added,
  jobId: a.jobId,
  ...(a.added ? { written: { jobId: a.jobId } } : {}),
});

/** A record's job: "q:<id>" -> a duplicate of <id>; "p:<id>" -> add under <id>; else nothing. */
function parseRecord(v: string | null | undefined): { duplicateOf?: string; pendingId?: string } {
  if (!v) return {};
  if (v.startsWith(QUEUED)) return { duplicateOf: v.slice(QUEUED.length) };
  if (v.startsWith(LEGACY_PENDING)) return { pendingId: v.slice(LEGACY_PENDING.length) };
  return {};
}

/** A commit pair's record: "<until ms>:<job id>"; undefined when absent or unreadable. */
function parsePair(v: string | null | undefined): { until: number; jobId: string } | undefined {
  const at = v ? v.indexOf(':') : -1;
  if (!v || at <= 0 || at === v.length - 1) return undefined;
  const until = Number(v.slice(0, at));
  return Number.isFinite(until) ? { until, jobId: v.slice(at + 1) } : undefined;
}

export type Intake = ReturnType<typeof createIntake>;

export function createIntake(deps: IntakeDeps) {
  const now = deps.now ?? Date.now;
  const { redis, logger } = deps;

  // Version 0.1's records are read until LEGACY_WINDOW_MS after this version first met a queue with jobs.
  let legacyUntil: number | undefined;
  const legacyOpen = async (): Promise<boolean> => {
    if (legacyUntil === undefined) {
      try {
        let since = Number(await redis.get(INTAKE_SINCE_KEY));
        if (!since) {
          const start = (await deps.jobs.any()) ? now() : now() - LEGACY_WINDOW_MS;
          await redis.set(INTAKE_SINCE_KEY, String(start), 'NX');
          since = Number(await redis.get(INTAKE_SINCE_KEY));
        }
        if (Number.isFinite(since) && since > 0) legacyUntil = since + LEGACY_WINDOW_MS;
      } catch (err) {
        logger.debug('intake start marker unavailable; reading version 0.1 records', { err });
      }
    }
    return legacyUntil === undefined || now() < legacyUntil;
  };

  // Version 0.1's pending claim, its job made sure of: the record names the job, and this delivery is a duplicate.
  const settlePending = async (key: string, out: IntakeResult): Promise<IntakeResult> => {
    await redisCall((r) => r.set(key, QUEUED + out.jobId, 'KEEPTTL', 'XX'), redis);
    return { accepted: false, duplicate: true, jobId: out.jobId };
  };

  return {
    async push(event: PushEvent): Promise<IntakeResult> {
      const alias = event.deliveryId ? deliveryKey(event.source, event.deliveryId) : undefined;
      const pair = event.before !== undefined && event.eventId ? pushPairKey(event.eventId, event.before) : undefined;
      const legacy = event.eventId && (await legacyOpen()) ? legacySeenKey(event.eventId) : undefined;
      const reads = [alias, pair, legacy].filter((k): k is string => k !== undefined);
      const values = reads.length > 0 ? await redisCall((r) => r.mget(...reads), redis) : [];
      const valueOf = (key: string | undefined) => (key === undefined ? undefined : values[reads.indexOf(key)]);
      const aliasRecord = parseRecord(valueOf(alias));
      const prior = [aliasRecord, parseRecord(valueOf(legacy))].find((r) => r.duplicateOf || r.pendingId);
      const queuedPair = parsePair(valueOf(pair));
      const delay = event.job.delay ?? 0;

      let out: IntakeResult;
      if (prior?.duplicateOf) {
        out = { accepted: false, duplicate: true, jobId: prior.duplicateOf };
      } else if (queuedPair && !event.allowRedeploy && now() >= queuedPair.until - PAIR_CLOCK_SKEW_MS) {
        // No alias (it queued nothing: the same delivery again meets the same rule); the pair keeps naming its job.
        const from = event.before ? event.before : 'a new branch';
        const reason =
          `the push from ${from} to ${event.job.data.sha ?? ''} was queued as job ${queuedPair.jobId} in the last 30 days: ` +
          'a delivery does not deploy it again (an operator can replay this delivery)';
        return { accepted: false, duplicate: false, jobId: queuedPair.jobId, ignored: { reason } };
      } else {
        out = addedOf(
          await deps.producer.add({
            ...event.job,
            ...(prior?.pendingId ? { jobId: prior.pendingId } : {}),
            // A held event stays deduplicated for 24 h after it is due, not after it arrived.
            ...(event.eventId ? { deduplication: { id: event.eventId, ttlMs: SEEN_EVENT_TTL_SECONDS * 1000 + delay } } : {}),
          }),
        );
        if (prior?.pendingId && event.eventId) out = await settlePending(legacySeenKey(event.eventId), out);
      }

      // After the add, one step: the alias (unless it was the answer) and the pair. An accepted
      // push's pair ends with the record the add just wrote. A duplicate's new pair says now: that
      // record's end is unknown, and a later guess could let a delivery reach an add after it expired.
      const writes: RecordWrite[] = [];
      if (alias && aliasRecord.duplicateOf === undefined) {
        writes.push({ key: alias, value: QUEUED + out.jobId, ttl: SEEN_DELIVERY_TTL_SECONDS, nx: true });
      }
      if (pair && !prior?.duplicateOf) {
        const at = now();
        if (out.accepted) {
          const until = at + SEEN_EVENT_TTL_SECONDS * 1000 + delay;
          writes.push({ key: pair, value: `${until}:${out.jobId}`, ttl: SEEN_PAIR_TTL_SECONDS, nx: false });
        } else if (!queuedPair) {
          writes.push({ key: pair, value: `${at}:${out.jobId}`, ttl: SEEN_PAIR_TTL_SECONDS, nx: true });
        }
      }
      if (writes.length > 0) {
        try {
          const set = await writeRecords(redis, writes);
          // REDIS_MIN_REPLICAS_ACK's take-back deletes the alias with its job; a pair left behind names a job that is gone.
          if (writes[0]!.key === alias && set[0] && out.written) out.written = { jobId: out.jobId, keys: [alias] };
        } catch (err) {
          // The job is queued and its event deduplicated for 24 h; a 503 now would only invite a retry.
          logger.warn('could not record the delivery id or commit pair of a queued event', { job_id: out.jobId, err });
        }
      }
      return out;
    },

    /** One payload's firing alerts, in one round trip (two while version 0.1's records may be read). */
    async alerts(events: readonly AlertEvent[]): Promise<IntakeResult[]> {
      if (events.length === 0) return [];
      let legacy: ReturnType<typeof parseRecord>[] = [];
      if (await legacyOpen()) {
        const keys = events.map((e) => legacySeenKey(`alert:${e.fingerprint}`));
        legacy = (await redisCall((r) => r.mget(...keys), redis)).map(parseRecord);
      }
      const outcomes = new Array<IntakeResult>(events.length);
      const toAdd: Array<{ i: number; req: AddRequest }> = [];
      events.forEach((e, i) => {
        const prior = legacy[i];
        if (prior?.duplicateOf) {
          outcomes[i] = { accepted: false, duplicate: true, jobId: prior.duplicateOf };
          return;
        }
        toAdd.push({
          i,
          req: {
            name: JOB.notifyOncall,
            data: e.data,
            ...(prior?.pendingId ? { jobId: prior.pendingId } : {}),
            deduplication: { id: `alert:${e.fingerprint}`, ttlMs: SEEN_ALERT_TTL_SECONDS * 1000 },
          },
        });
      });
      const added = await deps.producer.addMany(toAdd.map((t) => t.req));
      for (const [j, a] of added.entries()) {
        const { i, req } = toAdd[j]!;
        outcomes[i] = req.jobId ? await settlePending(legacySeenKey(`alert:${events[i]!.fingerprint}`), addedOf(a)) : addedOf(a);
      }
      return outcomes;
    },
  };
}
