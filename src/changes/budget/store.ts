import type { Redis } from 'ioredis';
import { budgetKey } from '../../shared/keys.js';
import { defineLua, loadLua } from '../../shared/lua.js';

/**
 * Restart budgets: at most N restarts of a namespace's Deployments per sliding window, counted in
 * Redis (src/shared/lua/budget-take.lua), so every API replica, caller and webhook draws on the
 * same budget. A member is the restart's job id: taking twice for one job takes once, and a
 * restart that turned out not to run (it joined another one, or was never added) gives its place
 * back. An approved restart takes its place when the change pipeline carries it out, under the
 * approval's id (the job's id), like any other restart.
 */
export interface BudgetLimit {
  restarts: number;
  /** The window, in seconds. */
  per: number;
}

export interface BudgetUse {
  /** Restarts in the window (after this one, when taken). */
  used: number;
  /** Spent: ms until the oldest restart of the window leaves it. */
  retryMs: number;
}

export interface Budgets {
  take(namespace: string, limit: BudgetLimit, jobId: string, now: number): Promise<{ taken: boolean } & BudgetUse>;
  giveBack(namespace: string, jobId: string): Promise<void>;
  /** Without taking anything (a dry run): what is used now, and when a place frees when none is left. */
  peek(namespace: string, limit: BudgetLimit, now: number): Promise<BudgetUse>;
}

const TAKE = 'opsgateBudgetTake';
const TAKE_LUA = loadLua(new URL('./budget-take.lua', import.meta.url));

export function createBudgets(redis: Redis): Budgets {
  defineLua(redis, TAKE, TAKE_LUA, 1);
  const scripts = redis as unknown as Record<string, (...a: Array<string | number>) => Promise<[number, number, number]>>;
  return {
    async take(namespace, limit, jobId, now) {
      const [taken, used, retry] = await scripts[TAKE]!(budgetKey(namespace), now, limit.per * 1000, limit.restarts, jobId);
      return { taken: taken === 1, used: Number(used), retryMs: Number(retry) };
    },
    async giveBack(namespace, jobId) {
      await redis.zrem(budgetKey(namespace), jobId);
    },
    async peek(namespace, limit, now) {
      const [, used, retry] = await scripts[TAKE]!(budgetKey(namespace), now, limit.per * 1000, limit.restarts, '', 'peek');
      return { used: Number(used), retryMs: Number(retry) };
    },
  };
}
