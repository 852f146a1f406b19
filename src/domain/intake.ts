import type { Redis } from 'ioredis';
import { JOB, type JobDataByName, type JobName } from '../shared/jobs.js';
import { INTAKE_SINCE_KEY, deliveryKey, legacySeenKey } from '../shared/keys.js';
import type { Logger } from '../shared/logger.js';
import type { JobReads } from '../shared/jobReads.js';
import type { AddRequest, Producer } from '../shared/producer.js';
import { redisCall } from './redisOps.js';
import type { Written } from './replication.js';

/**
 * The intake: an event that passed its sender's checks becomes exactly one job, however often it
 * is delivered.
 *
 * - The event's own identity (a push's `<source>:<project>:<ref>:<sha>`, an alert's fingerprint)
 *   is BullMQ's deduplication id of its job, kept for the event's lifetime (24 h for a push, 300 s
 *   for an alert) whatever becomes of the job. BullMQ writes that record and the job in one script
 *   (src/shared/producer.ts): the contract's "record as seen only if not already recorded, enqueue
 *   when recorded, remove the record when enqueueing fails" with no step in between that a crash
 *   could split. A duplicate answers with the job that holds the record.
 * - A sender's own delivery id (X-GitHub-Delivery, X-Request-UUID, Idempotency-Key) is an alias
 *   kept 30 days, past the event's 24 h, so a delivery replayed by its sender days later does not
 *   deploy again. It is read before the add and written after it ("q:<job id>", SET NX), so it is
 *   at most one step behind its job: an API killed between the add and the alias leaves the event
 *   deduplicated by its identity for 24 h, and its delivery id unknown after that.
 * - Upgrade: version 0.1 kept an event's record under `{opsgate}:seen:<identity>` ("q:<job id>",
 *   or "p:<job id>" for a claim whose job it may not have added). For the lifetime of such records
 *   after this version first ran against a queue that already held jobs (LEGACY_WINDOW_MS), the
 *   intake reads them with the alias: "q:" is a duplicate of that job; "p:" adds the job under
 *   that id (BullMQ adds nothing when it exists). A queue without any job has accepted nothing in
 *   the last 24 h (completed jobs are kept that long), so a new installation never reads them.
 */
export const SEEN_EVENT_TTL_SECONDS = 86400;
export const SEEN_ALERT_TTL_SECONDS = 300;
/**
 * How long a sender's delivery id is remembered: 30 days, well past the event's 24 h and GitHub's
 * 3-day redelivery limit, so a replayed delivery never deploys again.
 */
export const SEEN_DELIVERY_TTL_SECONDS = 30 * 86400;
/** An alias value: the job the delivery stands for. */
export const QUEUED = 'q:';
const LEGACY_PENDING = 'p:';
/** Version 0.1's longest record (a push's 24 h) and an upgrade's rollout after it. */
export const LEGACY_WINDOW_MS = (SEEN_EVENT_TTL_SECONDS + 3600) * 1000;

export interface IntakeDeps {
  producer: Pick<Producer, 'add' | 'addMany'>;
  jobs: Pick<JobReads, 'any'>;
  /** A `request`-profile connection: aliases and version 0.1's records. */
  redis: Redis;
  logger: Logger;
  /** Test clocks; default Date.now. */
  now?: () => number;
}

export interface PushEvent {
  /** The sender's name (a key of the source registry): names its delivery ids. */
  source: string;
  /** The event's dedup identity (absent: an operator's explicit deploy, not deduplicated by event). */
  eventId?: string;
  deliveryId?: string;
  /**
   * The deploy job, as the change pipeline's executor built it (src/changes/execute.ts): its data,
   * and for a held or approved deploy its job id and delay. The intake adds its dedup record.
   */
  job: Omit<AddRequest<typeof JOB.runDeployPipeline>, 'deduplication'>;
}

export interface Outcome {
  accepted: boolean;
  duplicate: boolean;
  /** The job that stands for the event: the new one, or the one a duplicate found. */
  jobId: string;
  /** Accepted: what the intake wrote, for REDIS_MIN_REPLICAS_ACK's take-back. */
  written?: Written;
  /** The deploy waits for approval (no job yet; its job id will be the approval id). */
  approval?: { id: string; expires_at: string; required: number };
  /** The deploy is held by a freeze or outside its windows: a delayed job until then. */
  held?: { until: string; reasons: string };
}

export interface AlertEvent {
  fingerprint: string;
  data: JobDataByName[typeof JOB.notifyOncall];
}

export interface Intake {
  push(event: PushEvent): Promise<Outcome>;
  /** One payload's firing alerts, in one round trip (two while version 0.1's records may exist). */
  alerts(events: readonly AlertEvent[]): Promise<Outcome[]>;
}

const pushDedupId = (eventId: string): string => eventId;
const alertDedupId = (fingerprint: string): string => `alert:${fingerprint}`;

/** A record's job: "q:<id>" -> a duplicate of <id>; "p:<id>" -> add under <id>; else nothing. */
function parseRecord(v: string | null | undefined): { duplicateOf?: string; pendingId?: string } {
  if (!v) return {};
  if (v.startsWith(QUEUED)) return { duplicateOf: v.slice(QUEUED.length) };
  if (v.startsWith(LEGACY_PENDING)) return { pendingId: v.slice(LEGACY_PENDING.length) };
  return {};
}

export function createIntake(deps: IntakeDeps): Intake {
  const now = deps.now ?? Date.now;
  const { redis, logger } = deps;

  // When this version first ran against a queue with jobs: version 0.1's records are read until
  // they have all expired. Known once per process; until it is, they are read.
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

  // Version 0.1's pending claim, its job now made sure of: the record names the job from here on,
  // and the delivery that made sure of it answers as a duplicate of the claim's delivery.
  const settlePending = async (key: string, out: Outcome): Promise<Outcome> => {
    await redisCall((r) => r.set(key, QUEUED + out.jobId, 'KEEPTTL', 'XX'), redis);
    return { accepted: false, duplicate: true, jobId: out.jobId };
  };

  const add = async <N extends JobName>(req: AddRequest<N>): Promise<Outcome> => {
    const out = await deps.producer.add(req);
    return { accepted: out.added, duplicate: !out.added, jobId: out.jobId, ...(out.added ? { written: { jobId: out.jobId } } : {}) };
  };

  return {
    async push(event) {
      const alias = event.deliveryId ? deliveryKey(event.source, event.deliveryId) : undefined;
      const reads = [...(alias ? [alias] : []), ...(event.eventId && (await legacyOpen()) ? [legacySeenKey(event.eventId)] : [])];
      const found = reads.length > 0 ? (await redisCall((r) => r.mget(...reads), redis)).map(parseRecord) : [];
      const prior = found.find((r) => r.duplicateOf || r.pendingId);

      let out: Outcome;
      if (prior?.duplicateOf) {
        out = { accepted: false, duplicate: true, jobId: prior.duplicateOf };
      } else {
        const delay = event.job.delay ?? 0;
        out = await add({
          ...event.job,
          ...(prior?.pendingId ? { jobId: prior.pendingId } : {}),
          // A held event stays deduplicated for 24 h after it is due, not after it arrived.
          ...(event.eventId ? { deduplication: { id: pushDedupId(event.eventId), ttlMs: SEEN_EVENT_TTL_SECONDS * 1000 + delay } } : {}),
        });
        if (prior?.pendingId && event.eventId) out = await settlePending(legacySeenKey(event.eventId), out);
      }
      if (alias && found[0]?.duplicateOf === undefined) {
        try {
          const set = await redis.set(alias, QUEUED + out.jobId, 'EX', SEEN_DELIVERY_TTL_SECONDS, 'NX');
          if (set !== null && out.written) out.written = { jobId: out.jobId, keys: [alias] };
        } catch (err) {
          // The job is queued and its event deduplicated for 24 h; a 503 now would only invite a retry.
          logger.warn('could not record the delivery id of a queued event', { job_id: out.jobId, err });
        }
      }
      return out;
    },

    async alerts(events) {
      if (events.length === 0) return [];
      let legacy: ReturnType<typeof parseRecord>[] = [];
      if (await legacyOpen()) {
        const keys = events.map((e) => legacySeenKey(`alert:${e.fingerprint}`));
        legacy = (await redisCall((r) => r.mget(...keys), redis)).map(parseRecord);
      }
      const outcomes = new Array<Outcome>(events.length);
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
            deduplication: { id: alertDedupId(e.fingerprint), ttlMs: SEEN_ALERT_TTL_SECONDS * 1000 },
          },
        });
      });
      const added = await deps.producer.addMany(toAdd.map((t) => t.req));
      for (const [j, a] of added.entries()) {
        const { i, req } = toAdd[j]!;
        const out: Outcome = {
          accepted: a.added,
          duplicate: !a.added,
          jobId: a.jobId,
          ...(a.added ? { written: { jobId: a.jobId } } : {}),
        };
        outcomes[i] = req.jobId ? await settlePending(legacySeenKey(`alert:${events[i]!.fingerprint}`), out) : out;
      }
      return outcomes;
    },
  };
}
