import type { Redis } from 'ioredis';
import { z } from 'zod';
import type { ErrorCode } from '../shared/errors.js';
import { deliveriesKey, unverifiedDeliveriesKey } from '../shared/keys.js';
import type { Logger } from '../shared/logger.js';
import { defineLua, loadLua } from '../shared/lua.js';
import { storedJson } from '../shared/redis.js';
import { redisCall } from './redisOps.js';

/**
 * "Why didn't my push deploy?": each sender's last deliveries with the API's verdict, in a capped
 * Redis stream per sender. Never the body, a header or a secret. A push that reached a decision
 * keeps its event, so an operator can replay it.
 *
 * Unverified deliveries go to a smaller stream of their own (DELIVERIES_UNVERIFIED_KEPT): anyone
 * can send those as fast as the rate limit lets them, and in the sender's stream they would push
 * its genuine deliveries (and the pushes an operator would replay) out.
 *
 * Recording never fails a delivery: a Redis error is logged. The verdicts of one short interval
 * (FLUSH_INTERVAL_MS or FLUSH_MAX) go out together, one script per sender, instead of one write
 * per delivery. A process killed without its shutdown loses its last interval's lines (the answers
 * went out, the jobs are queued), as an XADD not yet applied would be lost either way.
 */
const FLUSH_INTERVAL_MS = 5;
export const FLUSH_MAX = 256;
export const VERDICTS = [
  'queued',
  'duplicate',
  'not_a_push',
  'not_deploy_branch',
  'ignored',
  'bad_signature',
  'invalid_payload',
  'rate_limited',
  'failed',
  // Appended by the worker after the push's entry: its deploy never ran, or was cancelled by a newer one.
  'superseded',
  'cancelled',
] as const;
export type Verdict = (typeof VERDICTS)[number];

export interface DeliveryEntry {
  source: string;
  verdict: Verdict;
  status: number;
  /** The answer's reason or error detail (never a secret: the error catalog's texts). */
  detail?: string;
  code?: ErrorCode;
  /** The job it queued, or the job a duplicate stands for. */
  jobId?: string;
  /** An alert payload: how many jobs it queued. */
  jobs?: number;
  deliveryId?: string;
  bodySha256?: string;
  requestId?: string;
  /** The push event (a decision was reached): what a replay submits again. */
  push?: { project: string; ref: string; sha: string; eventId: string; before?: string };
  replayOf?: string;
  /** The sender's proof was missing or wrong, or it was refused before the check (always so for UNVERIFIED_VERDICTS). */
  unverified?: boolean;
}

const UNVERIFIED_VERDICTS: ReadonlySet<Verdict> = new Set(['bad_signature', 'rate_limited']);
const isUnverified = (e: Pick<DeliveryEntry, 'verdict' | 'unverified'>): boolean =>
  e.unverified === true || UNVERIFIED_VERDICTS.has(e.verdict);

export const deliveryViewSchema = z.object({
  id: z.string().describe('<sender>.<stream id>, or <sender>.unverified.<stream id> for an unverified delivery; newest first'),
  at: z.string().describe('when the answer was given (RFC 3339)'),
  source: z.string(),
  verdict: z
    .enum(VERDICTS)
    .describe(
      "the API's answer; superseded or cancelled: a second entry of a push, appended by the worker when its deploy never ran or was cancelled (job_id, event and delivery_id as the push's, detail naming the newer deploy)",
    ),
  status: z.number().int().describe('the HTTP status of the answer'),
  detail: z.string().nullable(),
  code: z.string().nullable().describe('an error answer: its code (the error catalog), e.g. invalid_signature'),
  job_id: z.string().nullable().describe('the job it queued, or the job a duplicate stands for'),
  jobs_queued: z.number().int().nullable().describe('an alert payload: jobs queued'),
  delivery_id: z.string().nullable().describe("the sender's own delivery id"),
  body_sha256: z.string().nullable().describe('SHA-256 of the raw body (never the body)'),
  request_id: z.string().nullable(),
  event: z
    .object({
      project: z.string(),
      ref: z.string(),
      sha: z.string(),
      event_id: z.string(),
      before: z.string().optional().describe('the commit before the push (GitHub, Gitea, Bitbucket; "" for a new branch)'),
    })
    .nullable()
    .describe('the push event, when a decision was reached (replayable)'),
  replay_of: z.string().nullable(),
  verified: z
    .boolean()
    .describe(
      "false: the sender's proof was missing or wrong, or the delivery was refused before it was checked (rate-limited); kept apart, fewer of them (DELIVERIES_UNVERIFIED_KEPT)",
    ),
});
type DeliveryView = z.infer<typeof deliveryViewSchema>;

export type DeliveryLog = ReturnType<typeof createDeliveryLog>;

/** `<sender>.<stream id>` or `<sender>.unverified.<stream id>`: the sender and the kind name the stream. */
export const DELIVERY_ID = /^([a-z][a-z0-9-]*)\.(?:(unverified)\.)?(\d{1,15}-\d{1,10})$/;

function parseId(id: string): { source: string; verified: boolean; streamId: string } | undefined {
  const m = DELIVERY_ID.exec(id);
  return m ? { source: m[1]!, verified: m[2] === undefined, streamId: m[3]! } : undefined;
}

const streamKey = (source: string, verified: boolean): string => (verified ? deliveriesKey(source) : unverifiedDeliveriesKey(source));

function toView(source: string, verified: boolean, streamId: string, flat: string[]): DeliveryView {
  const f: Record<string, string> = {};
  for (let i = 0; i + 1 < flat.length; i += 2) f[flat[i]!] = flat[i + 1]!;
  const p = storedJson<{ project: string; ref: string; sha: string; eventId: string; before?: unknown }>(f.push);
  const before = typeof p?.before === 'string' ? { before: p.before } : {};
  const event = p ? { project: p.project, ref: p.ref, sha: p.sha, event_id: p.eventId, ...before } : null;
  const verdict = (VERDICTS as readonly string[]).includes(f.verdict ?? '') ? (f.verdict as Verdict) : 'failed';
  return {
    id: verified ? `${source}.${streamId}` : `${source}.unverified.${streamId}`,
    at: new Date(Number(streamId.split('-')[0])).toISOString(),
    source,
    verdict,
    status: Number(f.status ?? 0),
    detail: f.detail ?? null,
    code: f.code ?? null,
    job_id: f.job ?? null,
    jobs_queued: f.jobs !== undefined ? Number(f.jobs) : null,
    delivery_id: f.delivery ?? null,
    body_sha256: f.sha256 ?? null,
    request_id: f.request ?? null,
    event,
    replay_of: f.replay_of ?? null,
    verified,
  };
}

const ADD = 'opsgateDeliveriesAdd';
const ADD_LUA = loadLua(new URL('./deliveries-add.lua', import.meta.url));

/**
 * Newest first; entries of one millisecond by sequence (a sender's two streams share one sequence,
 * deliveries-add.lua), then by sender name, then verified first.
 */
const newestFirst = (a: Pick<DeliveryView, 'id'>, b: Pick<DeliveryView, 'id'>): number => {
  const pa = parseId(a.id)!;
  const pb = parseId(b.id)!;
  const [am, as] = pa.streamId.split('-').map(Number) as [number, number];
  const [bm, bs] = pb.streamId.split('-').map(Number) as [number, number];
  return (
    bm - am ||
    bs - as ||
    (pa.source === pb.source ? 0 : pa.source < pb.source ? -1 : 1) ||
    (pa.verified === pb.verified ? 0 : pa.verified ? -1 : 1)
  );
};

export function createDeliveryLog(deps: {
  redis: Redis;
  logger: Logger;
  /** Each sender's deliveries kept (DELIVERIES_KEPT, DELIVERIES_UNVERIFIED_KEPT); 0 keeps none. */
  keep: number;
  keepUnverified: number;
}) {
  const { redis, logger, keep, keepUnverified } = deps;
  defineLua(redis, ADD, ADD_LUA, 2);
  const scripts = redis as unknown as Record<string, (...a: Array<string | number>) => Promise<number>>;
  const capOf = (verified: boolean) => (verified ? keep : keepUnverified);
  let lastWarn = 0;
  const warn = (source: string | undefined, err: unknown) => {
    const now = Date.now();
    if (now - lastWarn < 10_000) return;
    lastWarn = now;
    logger.warn('could not record a webhook delivery (GET /ops/deliveries will miss it)', { source, err });
  };

  // Recorded, not yet sent: each sender's script arguments (per entry: v|u, its field count, its fields), in the order recorded.
  let waiting = new Map<string, Array<string | number>>();
  let waitingCount = 0;
  let timer: NodeJS.Timeout | undefined;
  // The last writes sent: flush() resolves once it (and every earlier one, same connection) is answered.
  let lastSent: Promise<void> = Promise.resolve();

  const send = (): Promise<void> => {
    if (timer) {
      clearTimeout(timer);
      timer = undefined;
    }
    if (waitingCount === 0) return lastSent;
    const batch = waiting;
    waiting = new Map();
    waitingCount = 0;
    // One script per sender (on a Cluster each sender has its own slot, both its streams in it).
    const sent = [...batch].map(([source, args]) =>
      scripts[ADD]!(streamKey(source, true), streamKey(source, false), keep, keepUnverified, ...args).then(
        () => undefined,
        (err: unknown) => warn(source, err),
      ),
    );
    lastSent = sent.length === 1 ? sent[0]! : Promise.all(sent).then(() => undefined);
    return lastSent;
  };

  return {
    /** Queues the verdict for the next write; never throws, never waits. */
    record(e: DeliveryEntry): void {
      const verified = !isUnverified(e);
      if (capOf(verified) <= 0) return;
      const fields: Array<string | number> = ['verdict', e.verdict, 'status', e.status];
      if (e.detail) fields.push('detail', e.detail.slice(0, 500));
      if (e.code) fields.push('code', e.code);
      if (e.jobId) fields.push('job', e.jobId);
      if (e.jobs !== undefined) fields.push('jobs', e.jobs);
      if (e.deliveryId) fields.push('delivery', e.deliveryId);
      if (e.bodySha256) fields.push('sha256', e.bodySha256);
      if (e.requestId) fields.push('request', e.requestId);
      if (e.push) fields.push('push', JSON.stringify(e.push));
      if (e.replayOf) fields.push('replay_of', e.replayOf);
      const args = waiting.get(e.source) ?? [];
      waiting.set(e.source, args);
      args.push(verified ? 'v' : 'u', fields.length, ...fields);
      if (++waitingCount >= FLUSH_MAX) void send();
      else timer ??= setTimeout(() => void send(), FLUSH_INTERVAL_MS);
    },

    /** Sends every verdict recorded so far (at shutdown); resolves once Redis answered them. */
    flush: send,

    /** Newest first, across `sources`, optionally of one verdict, before a cursor id. */
    async list(opts: { sources: readonly string[]; verdict?: Verdict; limit: number; before?: string }) {
      const { sources, verdict, limit, before } = opts;
      // Sent before the read, on the same connection: Redis applies them first.
      void send();
      const cursor = before && parseId(before) ? { id: before } : undefined;
      const streamBound = cursor ? parseId(cursor.id)!.streamId : '+';
      // A verdict only one kind of delivery gets is read from that kind's stream alone.
      const kinds = verdict && UNVERIFIED_VERDICTS.has(verdict) ? [false] : [true, false];
      const all: DeliveryView[] = [];
      for (const source of sources) {
        for (const verified of kinds) {
          const cap = capOf(verified);
          // A stream holds about its cap of entries: reading one whole (for a verdict filter) is bounded.
          const rows = (await redisCall(
            (r) => r.xrevrange(streamKey(source, verified), streamBound, '-', 'COUNT', verdict ? cap + 100 : limit + 2),
            redis,
          )) as Array<[string, string[]]>;
          for (const [id, flat] of rows) {
            const view = toView(source, verified, id, flat);
            if (verdict && view.verdict !== verdict) continue;
            if (cursor && newestFirst(cursor, view) >= 0) continue;
            all.push(view);
          }
        }
      }
      all.sort(newestFirst);
      const page = all.slice(0, limit);
      return { deliveries: page, next: all.length > limit ? page[page.length - 1]!.id : null };
    },

    async get(id: string): Promise<DeliveryView | undefined> {
      const p = parseId(id);
      if (!p) return undefined;
      void send();
      const rows = (await redisCall((r) => r.xrange(streamKey(p.source, p.verified), p.streamId, p.streamId), redis)) as Array<
        [string, string[]]
      >;
      const row = rows[0];
      return row ? toView(p.source, p.verified, row[0], row[1]) : undefined;
    },
  };
}
