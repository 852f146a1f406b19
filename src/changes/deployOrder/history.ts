import type { Redis } from 'ioredis';
import { z } from 'zod';
import { DEPLOY_HISTORY_ALL_KEY, DEPLOY_HISTORY_KEY, deployHistoryProjectKey, deployRefsKey } from '../../shared/keys.js';
import { defineLua, loadLua } from '../../shared/lua.js';
import { storedJson } from '../../shared/redis.js';
import type { Origin } from '../types.js';

/**
 * The history of deploys: the last DEPLOY_HISTORY_KEPT of each project, newest accepted first. Each step is one
 * script (deploy-history.lua) that never moves a deploy back to an earlier state, whatever order the API's and the
 * worker's writes land in. A step is written by whoever writes at that moment anyway, so a push costs no round trip
 * more: the worker for a queued push and every end, the API for the rest (src/changes/deployOrder/record.ts).
 */
const LUA = loadLua(new URL('./deploy-history.lua', import.meta.url));
const COMMAND = 'opsgateDeployHistory';

export const DEPLOY_STATES = [
  'pending_approval',
  'held',
  'queued',
  'running',
  'succeeded',
  'failed',
  'superseded',
  'cancelled',
  'rejected',
] as const;
export type DeployState = (typeof DEPLOY_STATES)[number];

/** The origin an entry names: a change's, a sender's push named `push`. */
export type DeployOrigin = Exclude<Origin, 'webhook' | 'wake'> | 'push';
export const deployOrigin = (o: Origin): DeployOrigin => (o === 'webhook' || o === 'wake' ? 'push' : o);

/** Times in ms. */
export interface DeployEntry {
  id: string;
  project: string;
  ref: string;
  commit: string | null;
  group: string;
  origin: DeployOrigin;
  owner: string | null;
  state: DeployState;
  accepted_at: number;
  started_at?: number | null;
  finished_at?: number | null;
  queue_job: string | null;
  k8s_job?: string | null;
  superseded_by?: string | null;
  /** A deploy whose Kubernetes Job a newer one of its group deleted (cancel_in_progress): that deploy. */
  cancelled_by?: string | null;
  /** A rollback (origin `rollback`): the deploy that was current when it was accepted. */
  rolled_back_from?: string | null;
}

/** One step of a deploy: who it is (written when first seen), what only the API knows, and its state. */
export interface DeployStep {
  id: string;
  accepted: number;
  first: Pick<DeployEntry, 'project' | 'ref' | 'commit' | 'group' | 'origin' | 'owner' | 'queue_job' | 'rolled_back_from'>;
  /** The origin as the API knows it (a worker's first write only guesses it). */
  origin?: DeployOrigin;
  step: { state: DeployState } & Partial<
    Pick<DeployEntry, 'started_at' | 'finished_at' | 'k8s_job' | 'superseded_by' | 'cancelled_by' | 'queue_job'>
  >;
}

/** A list's position: the acceptance and id of the last entry of the page before. */
export type HistoryPosition = readonly [number, string];
type ListQuery = { project?: string; after?: HistoryPosition; limit: number; admit: (e: DeployEntry) => boolean };

export type DeployHistory = ReturnType<typeof createDeployHistory>;

type Run = (k1: string, k2: string, k3: string, k4: string, ...argv: (string | number)[]) => Promise<[string, string, string]>;

const parse = storedJson<DeployEntry>;

/** How many entries one read of a list's index asks for, while the filters leave the page short. */
const BATCH = 200;

export function createDeployHistory(redis: Redis, keep: number) {
  defineLua(redis, COMMAND, LUA, 4);
  const run: Run = (...args) => (redis as unknown as Record<string, Run>)[COMMAND]!(...args);
  return {
    async record(s: DeployStep): Promise<{ written: boolean; state: DeployState }> {
      const info = s.origin ? { origin: s.origin } : {};
      const [verdict, state] = await run(
        DEPLOY_HISTORY_KEY,
        deployHistoryProjectKey(s.first.project),
        DEPLOY_HISTORY_ALL_KEY,
        deployRefsKey(s.first.project),
        s.id,
        s.accepted,
        keep,
        JSON.stringify(s.first),
        JSON.stringify(info),
        JSON.stringify(s.step),
      );
      return { written: verdict === 'written', state: state as DeployState };
    },
    async get(id: string): Promise<DeployEntry | undefined> {
      return parse(await redis.hget(DEPLOY_HISTORY_KEY, id));
    },
    /** Newest first, after `after`, the entries `admit` lets through, at most `limit`, and the position after them when more remain. */
    async list({ project, after, limit, admit }: ListQuery): Promise<{ items: DeployEntry[]; next: HistoryPosition | null }> {
      const index = project !== undefined ? deployHistoryProjectKey(project) : DEPLOY_HISTORY_ALL_KEY;
      const items: DeployEntry[] = [];
      let offset = 0;
      for (;;) {
        const max = after ? String(after[0]) : '+inf';
        const page = await redis.zrange(index, max, '-inf', 'BYSCORE', 'REV', 'LIMIT', offset, BATCH, 'WITHSCORES');
        if (page.length === 0) return { items, next: null };
        offset += page.length / 2;
        const ids: string[] = [];
        for (let i = 0; i < page.length; i += 2) {
          const id = page[i]!;
          // Within the cursor's millisecond only the ids after it in the order (descending) come next.
          if (after && Number(page[i + 1]) === after[0] && id >= after[1]) continue;
          ids.push(id);
        }
        const raws = ids.length > 0 ? await redis.hmget(DEPLOY_HISTORY_KEY, ...ids) : [];
        for (const raw of raws) {
          const e = parse(raw);
          if (!e || !admit(e)) continue;
          if (items.length === limit) {
            const last = items.at(-1)!;
            return { items, next: [last.accepted_at, last.id] };
          }
          items.push(e);
        }
      }
    },
    /** Each ref's current (last succeeded) and running deploy of the project. */
    async refs(project: string): Promise<Map<string, { current?: DeployEntry; running?: DeployEntry }>> {
      const all = await redis.hgetall(deployRefsKey(project));
      const out = new Map<string, { current?: DeployEntry; running?: DeployEntry }>();
      for (const [field, raw] of Object.entries(all)) {
        const cut = field.lastIndexOf('\n');
        const ref = field.slice(0, cut);
        const which = field.slice(cut + 1);
        const e = parse(raw);
        if (!e || (which !== 'current' && which !== 'running')) continue;
        out.set(ref, { ...out.get(ref), [which]: e });
      }
      return out;
    },
  };
}

const iso = (ms: number | null | undefined): string | null => (typeof ms === 'number' ? new Date(ms).toISOString() : null);

export const deployViewSchema = z.object({
  id: z.string().describe('the deploy: its queue job id (a deploy that waited for approval: the approval id, which its job took)'),
  project: z.string(),
  ref: z.string(),
  commit: z.string().nullable(),
  group: z.string().describe('its concurrency group'),
  origin: z.string().describe('push, ci, api, replay, retry, approval, rollback'),
  owner: z.string().nullable().describe("the owner of the requester's credential"),
  state: z.enum(DEPLOY_STATES),
  accepted_at: z.string().nullable(),
  started_at: z.string().nullable(),
  finished_at: z.string().nullable(),
  job_id: z.string().nullable().describe('the queue job (GET /ops/jobs/{id})'),
  kubernetes_job: z.string().nullable().describe('the Kubernetes Job it created, once it runs'),
  superseded_by: z.string().nullable().describe('superseded: the deploy of its group accepted after it'),
  cancelled_by: z.string().nullable().describe('cancelled: the deploy of its group whose start deleted its Kubernetes Job'),
  rolled_back_from: z
    .string()
    .nullable()
    .describe('a rollback (origin rollback): the deploy of its ref that was current (the last succeeded) when it was accepted'),
});
export type DeployView = z.infer<typeof deployViewSchema>;

export function deployView(e: DeployEntry): DeployView {
  return {
    id: e.id,
    project: e.project,
    ref: e.ref,
    commit: e.commit ?? null,
    group: e.group,
    origin: e.origin,
    owner: e.owner ?? null,
    state: e.state,
    accepted_at: iso(e.accepted_at),
    started_at: iso(e.started_at),
    finished_at: iso(e.finished_at),
    job_id: e.queue_job ?? null,
    kubernetes_job: e.k8s_job ?? null,
    superseded_by: e.superseded_by ?? null,
    cancelled_by: e.cancelled_by ?? null,
    rolled_back_from: e.rolled_back_from ?? null,
  };
}

export const deployListSchema = z.object({
  deploys: z.array(deployViewSchema),
  next_cursor: z.string().nullable().describe('pass as `cursor` for the next page; null on the last page'),
});

export const projectViewSchema = z.object({
  project: z.string(),
  refs: z.array(
    z.object({
      ref: z.string(),
      current: deployViewSchema.nullable().describe('the last deploy that succeeded'),
      running: deployViewSchema.nullable().describe('the deploy running now'),
    }),
  ),
});
