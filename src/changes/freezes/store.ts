import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { FREEZES_CHANNEL, FREEZES_KEY } from '../../shared/keys.js';
import type { Logger } from '../../shared/logger.js';
import { storedJson } from '../../shared/redis.js';

/**
 * Change freezes, in one Redis hash; those past their end are dropped when next read. Every change is published on
 * FREEZES_CHANNEL in the same MULTI, so each API process keeps them in memory (watchFreezes) at no round trip per
 * request; a change it misses for a moment is caught by the worker, which reads them afresh per job.
 */
export const FREEZE_SCOPES = ['all', 'namespace', 'project'] as const;
const FREEZE_ID = /^frz-[0-9a-f]{16}$/;

export interface Freeze {
  id: string;
  scope: (typeof FREEZE_SCOPES)[number];
  namespace?: string;
  project?: string;
  reason: string;
  created_by: string;
  created_at: number;
  starts_at: number;
  ends_at: number;
}

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

export type FreezeStore = ReturnType<typeof createFreezeStore>;

const parse = storedJson<Freeze>;

export function createFreezeStore(redis: Redis) {
  return {
    async create(f: Freeze): Promise<void> {
      await redis.multi().hset(FREEZES_KEY, f.id, JSON.stringify(f)).publish(FREEZES_CHANNEL, f.id).exec();
    },
    /** Every freeze not yet ended (those that start later included), soonest end first. */
    async list(now: number): Promise<Freeze[]> {
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
    async get(id: string, now: number): Promise<Freeze | undefined> {
      if (!FREEZE_ID.test(id)) return undefined;
      const f = parse(await redis.hget(FREEZES_KEY, id));
      return f && f.ends_at > now ? f : undefined;
    },
    /** Removes it; answers the freeze that was removed, or undefined when there was none (or it had ended). */
    async remove(id: string, now: number): Promise<Freeze | undefined> {
      if (!FREEZE_ID.test(id)) return undefined;
      const f = parse(await redis.hget(FREEZES_KEY, id));
      // HDEL answers 1 to one caller only: two operators lifting the same freeze release its holds once.
      const removed = await redis.hdel(FREEZES_KEY, id);
      if (removed === 1) await redis.publish(FREEZES_CHANNEL, id).catch(() => 0);
      return removed === 1 && f && f.ends_at > now ? f : undefined;
    },
  };
}

/**
 * An API process's freezes in memory: reloaded on each FREEZES_CHANNEL message and after each reconnection (which
 * may have missed one), read from Redis while the subscription is not live. A hand edit in Redis is seen at the next.
 */
export type FreezeWatch = ReturnType<typeof watchFreezes>;

export function watchFreezes(deps: { store: FreezeStore; subscriber: Redis; logger?: Logger }) {
  const { store, subscriber, logger } = deps;
  let cached: Freeze[] | undefined;
  let live = false;
  let started = false;
  let generation = 0;
  let inflight: Promise<void> | undefined;
  const reload = (): Promise<void> => {
    const mine = ++generation;
    const p = (async () => {
      try {
        const list = await store.list(Date.now());
        // Two reloads in flight: the later one's answer stands.
        if (mine === generation) cached = list;
      } catch (err) {
        if (mine === generation) cached = undefined;
        logger?.warn('could not load the freezes; reading them per request until it works', { err });
      }
    })().finally(() => {
      if (inflight === p) inflight = undefined;
    });
    inflight = p;
    return p;
  };
  const onMessage = (channel: string) => {
    if (channel === FREEZES_CHANNEL) void reload();
  };
  const onReady = () => {
    // A reconnection: ioredis subscribes again by itself; what changed meanwhile is read now.
    if (started) void reload().then(() => (live = cached !== undefined));
  };
  const onClose = () => {
    live = false;
  };
  subscriber.on('message', onMessage);
  subscriber.on('ready', onReady);
  subscriber.on('close', onClose);
  subscriber.on('error', (err: Error) => logger?.debug('freezes subscriber error', { err }));
  void subscriber
    .subscribe(FREEZES_CHANNEL)
    .then(() => reload())
    .then(() => {
      started = true;
      live = cached !== undefined;
    })
    .catch((err: unknown) => logger?.warn('could not subscribe to the freezes channel; reading them per request', { err }));

  return {
    async list(now: number): Promise<Freeze[]> {
      // A reload in flight was asked for by a change: its answer is the one to use.
      if (inflight) await inflight;
      if (live && cached) return cached.filter((f) => f.ends_at > now);
      return store.list(now);
    },
    /** They changed (this process changed them; the message comes a moment later): reload now. Resolves once reloaded. */
    changed: reload,
    async close(): Promise<void> {
      live = false;
      subscriber.off('message', onMessage);
      subscriber.off('ready', onReady);
      subscriber.off('close', onClose);
      subscriber.disconnect();
    },
  };
}
