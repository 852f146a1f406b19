import type { Redis } from 'ioredis';
import { findProject, type Inventory } from '../../shared/inventory.js';
import { deployGroupKey } from '../../shared/keys.js';
import { defineLua, loadLua } from '../../shared/lua.js';

/**
 * Deploys in order: those of one concurrency group run one at a time, never an older one after a newer one, in the
 * order the API accepted them (a resubmission keeps its original acceptance; senders' out-of-order deliveries are
 * not corrected). A push writes nothing here: its job's timestamp is its acceptance. deploy-turn.lua's steps:
 * - `begin`: a newer one started or waits -> superseded; another runs -> wait (delayed); else run;
 * - `release` when it ends (its lease ends it too, should its worker die);
 * - `check`: has a newer one started? (a resubmission is then answered 409 superseded).
 */
const LUA = loadLua(new URL('./deploy-turn.lua', import.meta.url));
const COMMAND = 'opsgateDeployTurn';

export interface Acceptance {
  at: number;
  id: string;
}

type Turn = { turn: 'run' } | { turn: 'wait'; running: string } | { turn: 'superseded'; by: string };

/** A project's ref's concurrency group: its template (`{project}`, `{ref}`; default a project's ref) filled in. */
export function concurrencyGroup(inventory: Inventory, project: string, ref: string): string {
  const template = findProject(inventory, project)?.concurrency?.group ?? '{project}:{ref}';
  return template.replace(/\{(project|ref)\}/g, (_m, name: string) => (name === 'project' ? project : ref));
}

type Run = (key: string, action: string, job: string, at: number, id: string, now: number, lease: number) => Promise<[string, string]>;

export function createDeployTurns(redis: Redis) {
  defineLua(redis, COMMAND, LUA, 1);
  const run: Run = (...args) => (redis as unknown as Record<string, Run>)[COMMAND]!(...args);
  return {
    async begin(group: string, jobId: string, accepted: Acceptance, now: number, leaseMs: number): Promise<Turn> {
      const [verdict, job] = await run(deployGroupKey(group), 'begin', jobId, accepted.at, accepted.id, now, leaseMs);
      if (verdict === 'run') return { turn: 'run' };
      if (verdict === 'wait') return { turn: 'wait', running: job };
      if (verdict === 'superseded') return { turn: 'superseded', by: job };
      throw new Error(`unexpected answer of the deploy group's script: ${verdict}`);
    },
    /** Ends its turn; answers the newest deploy waiting for the group's turn, if any. */
    async release(group: string, jobId: string): Promise<string | undefined> {
      const [verdict, next] = await run(deployGroupKey(group), 'release', jobId, 0, '', 0, 0);
      return verdict === 'released' && next !== '' ? next : undefined;
    },
    /** The deploy of the group accepted after `accepted` that has started already, if any. */
    async supersededBy(group: string, accepted: Acceptance): Promise<string | undefined> {
      const [verdict, job] = await run(deployGroupKey(group), 'check', '', accepted.at, accepted.id, 0, 0);
      return verdict === 'superseded' ? job : undefined;
    },
  };
}
