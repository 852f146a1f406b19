import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { FREEZES_KEY } from './keys.js';

/**
 * Change freezes, declared by operators (POST /ops/freezes) and kept in one Redis hash shared by
 * every API replica and the worker. A freeze covers every change (`all`), the changes of one
 * namespace (restarts of its hosts' Deployments, deploys of projects whose Jobs run there) or the
 * deploys of one project, from `starts_at` (default: when it is declared) until `ends_at`.
 * Freezes past their end are dropped when next read.
 */
export const FREEZE_SCOPES = ['all', 'namespace', 'project'] as const;
export type FreezeScope = (typeof FREEZE_SCOPES)[number];
export const FREEZE_ID = /^frz-[0-9a-f]{16}$/;

export interface Freeze {
  id: string;
  scope: FreezeScope;
  /** scope namespace */
  namespace?: string;
  /** scope project */
  project?: string;
  reason: string;
  created_by: string;
  created_at: number;
  starts_at: number;
  ends_at: number;
}

/** What a freeze can cover. */
export interface FreezeTarget {
  namespace: string;
  /** A deploy's project; absent for a restart. */
  project?: string;
}

export function covers(f: Freeze, t: FreezeTarget): boolean {
  if (f.scope === 'all') return true;
  if (f.scope === 'namespace') return f.namespace === t.namespace;
  return t.project !== undefined && f.project === t.project;
}

/** "namespace shop", "project group/app", "everything". */
export function describeScope(f: Pick<Freeze, 'scope' | 'namespace' | 'project'>): string {
  return f.scope === 'all' ? 'everything' : f.scope === 'namespace' ? `namespace ${f.namespace}` : `project ${f.project}`;
}

export const newFreezeId = (): string => `frz-${randomBytes(8).toString('hex')}`;

export interface FreezeStore {
  create(f: Freeze): Promise<void>;
  /** Every freeze not yet ended (those that start later included), soonest end first. */
  list(now: number): Promise<Freeze[]>;
  get(id: string, now: number): Promise<Freeze | undefined>;
  /** Removes it; answers the freeze that was removed, or undefined when there was none (or it had ended). */
  remove(id: string, now: number): Promise<Freeze | undefined>;
}

function parse(raw: string | null | undefined): Freeze | undefined {
  if (!raw) return undefined;
  try {
    return JSON.parse(raw) as Freeze;
  } catch {
    return undefined;
  }
}

export function createFreezeStore(redis: Redis): FreezeStore {
  return {
    async create(f) {
      await redis.hset(FREEZES_KEY, f.id, JSON.stringify(f));
    },
    async list(now) {
      const all = await redis.hgetall(FREEZES_KEY);
      const out: Freeze[] = [];
      const ended: string[] = [];
      for (const [id, raw] of Object.entries(all)) {
        const f = parse(raw);
        if (!f || f.ends_at <= now) ended.push(id);
        else out.push(f);
      }
      // A freeze read as ended by this replica is ended for every replica: dropping it is safe.
      if (ended.length > 0) await redis.hdel(FREEZES_KEY, ...ended).catch(() => undefined);
      return out.sort((a, b) => a.ends_at - b.ends_at || a.id.localeCompare(b.id));
    },
    async get(id, now) {
      if (!FREEZE_ID.test(id)) return undefined;
      const f = parse(await redis.hget(FREEZES_KEY, id));
      return f && f.ends_at > now ? f : undefined;
    },
    async remove(id, now) {
      if (!FREEZE_ID.test(id)) return undefined;
      const f = parse(await redis.hget(FREEZES_KEY, id));
      // HDEL answers 1 to one caller only: two operators lifting the same freeze release its holds once.
      const removed = await redis.hdel(FREEZES_KEY, id);
      return removed === 1 && f && f.ends_at > now ? f : undefined;
    },
  };
}
