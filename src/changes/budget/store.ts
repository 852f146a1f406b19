import type { Redis } from 'ioredis';
import { budgetKey, remediationBudgetKey } from '../../shared/keys.js';
import { defineLua, loadLua } from '../../shared/lua.js';
import type { BudgetPool, BudgetPoolKind } from './pools.js';

/**
 * Restart budgets: at most N restarts per sliding window of each pool a restart draws on, taken all or none by
 * budget-take.lua, shared by every replica. A member is the job id: taking twice takes once, and a restart that did
 * not run (it joined another, or was never added) gives its place back.
 */
interface BudgetUse {
  /** Restarts in the window (after this one, when taken). */
  used: number;
  /** Spent: ms until the oldest restart of the window leaves it. */
  retryMs: number;
}

interface BudgetTake extends BudgetUse {
  taken: boolean;
  /** The budget that is spent, when not taken. */
  spent?: BudgetPool;
  /** Each pool's use, in the order given. */
  uses: BudgetUse[];
}

export type Budgets = ReturnType<typeof createBudgets>;

const TAKE = 'opsgateBudgetTake';
const TAKE_LUA = loadLua(new URL('./budget-take.lua', import.meta.url));

const poolKey = (p: { kind: BudgetPoolKind; name: string }): string =>
  p.kind === 'namespace' ? budgetKey(p.name) : remediationBudgetKey(p.kind === 'remediation_rule' ? 'rule' : 'namespace', p.name);

export function createBudgets(redis: Redis) {
  defineLua(redis, TAKE, TAKE_LUA, undefined);
  const scripts = redis as unknown as Record<string, (...a: Array<string | number>) => Promise<number[]>>;
  const run = (pools: readonly BudgetPool[], now: number, jobId: string, mode: 'take' | 'peek') =>
    scripts[TAKE]!(pools.length, ...pools.map(poolKey), now, jobId, mode, ...pools.flatMap((p) => [p.limit.per * 1000, p.limit.restarts]));
  const usesOf = (reply: number[], n: number): BudgetUse[] =>
    Array.from({ length: n }, (_, i) => ({ used: Number(reply[3 + 2 * i]), retryMs: Number(reply[4 + 2 * i]) }));
  return {
    async take(pools: readonly BudgetPool[], jobId: string, now: number): Promise<BudgetTake> {
      if (pools.length === 0) return { taken: true, used: 0, retryMs: 0, uses: [] };
      const reply = await run(pools, now, jobId, 'take');
      const uses = usesOf(reply, pools.length);
      const spent = Number(reply[1]);
      if (Number(reply[0]) === 1) return { taken: true, used: Math.max(...uses.map((u) => u.used)), retryMs: 0, uses };
      return { taken: false, used: uses[spent - 1]!.used, retryMs: Number(reply[2]), spent: pools[spent - 1]!, uses };
    },
    /** Gives a job's place back to every budget it may hold one of (a place it does not hold is no change). */
    async giveBack(pools: ReadonlyArray<Pick<BudgetPool, 'kind' | 'name'>>, jobId: string): Promise<void> {
      if (pools.length === 0) return;
      const m = redis.multi();
      for (const p of pools) m.zrem(poolKey(p), jobId);
      await m.exec();
    },
    /** Without taking anything (a dry run, a listing): each pool's use now, and when a place frees when none is left. */
    async peek(pools: readonly BudgetPool[], now: number): Promise<BudgetUse[]> {
      if (pools.length === 0) return [];
      return usesOf(await run(pools, now, '', 'peek'), pools.length);
    },
  };
}
