import type { Redis } from 'ioredis';
import { findProject, type Inventory } from '../../shared/inventory.js';
import { deployGroupKey } from '../../shared/keys.js';
import { defineLua, loadLua } from '../../shared/lua.js';

/**
 * Deploys in order. The deploys of one concurrency group (a project's ref by default; the
 * inventory's `concurrency.group` names another) run one at a time, and never an older one after a
 * newer one: "older" and "newer" are the order in which the API accepted them (a deploy's
 * acceptance: when its job was added, the job id deciding within a millisecond; a resubmission of
 * an accepted deploy carries the acceptance of the deploy it resubmits). Senders that deliver out
 * of order are not corrected.
 *
 * The push path writes nothing here: its job's own timestamp is its acceptance, so a push costs
 * no round trip more. The worker does the bookkeeping when it picks a deploy up (deploy-turn.lua,
 * one script per step on the group's one record):
 * - `begin`: a deploy accepted after this one has started -> superseded; a newer one is known to
 *   wait -> superseded; another one runs -> wait (the job goes back to the delayed set and asks
 *   again when it wakes); otherwise it runs, recorded as the group's running and last started one;
 * - `release` when it ends (its lease ends it too, should its worker die);
 * - `check`: the API's question for a resubmission (a dead letter's retry, a replay, the last
 *   approval of an older deploy): has a newer one started? Then it is answered 409 superseded.
 */
const LUA = loadLua(new URL('./deploy-turn.lua', import.meta.url));
const COMMAND = 'opsgateDeployTurn';

/** When and under which id opsgate accepted a deploy. */
export interface Acceptance {
  at: number;
  id: string;
}

export type Turn = { turn: 'run' } | { turn: 'wait'; running: string } | { turn: 'superseded'; by: string };

export interface DeployTurns {
  begin(group: string, jobId: string, accepted: Acceptance, now: number, leaseMs: number): Promise<Turn>;
  /** Ends its turn; answers the newest deploy waiting for the group's turn, if any. */
  release(group: string, jobId: string): Promise<string | undefined>;
  /** The deploy of the group accepted after `accepted` that has started already, if any. */
  supersededBy(group: string, accepted: Acceptance): Promise<string | undefined>;
}

/** The default group: a project's ref. */
export const DEFAULT_GROUP = '{project}:{ref}';

/** A project's ref's concurrency group: its template (`{project}`, `{ref}`) filled in. */
export function concurrencyGroup(inventory: Inventory, project: string, ref: string): string {
  const template = findProject(inventory, project)?.concurrency?.group ?? DEFAULT_GROUP;
  return template.replace(/\{(project|ref)\}/g, (_m, name: string) => (name === 'project' ? project : ref));
}

type Run = (key: string, action: string, job: string, at: number, id: string, now: number, lease: number) => Promise<[string, string]>;

export function createDeployTurns(redis: Redis): DeployTurns {
  defineLua(redis, COMMAND, LUA, 1);
  const run: Run = (...args) => (redis as unknown as Record<string, Run>)[COMMAND]!(...args);
  return {
    async begin(group, jobId, accepted, now, leaseMs) {
      const [verdict, job] = await run(deployGroupKey(group), 'begin', jobId, accepted.at, accepted.id, now, leaseMs);
      if (verdict === 'run') return { turn: 'run' };
      if (verdict === 'wait') return { turn: 'wait', running: job };
      if (verdict === 'superseded') return { turn: 'superseded', by: job };
      throw new Error(`unexpected answer of the deploy group's script: ${verdict}`);
    },
    async release(group, jobId) {
      const [verdict, next] = await run(deployGroupKey(group), 'release', jobId, 0, '', 0, 0);
      return verdict === 'released' && next !== '' ? next : undefined;
    },
    async supersededBy(group, accepted) {
      const [verdict, job] = await run(deployGroupKey(group), 'check', '', accepted.at, accepted.id, 0, 0);
      return verdict === 'superseded' ? job : undefined;
    },
  };
}
