import { DelayedError, type Job } from 'bullmq';
import type { ChangeJob } from '../src/changes/wake.js';
import { kindOf } from '../src/changes/kinds/index.js';
import type { Acceptance } from '../src/changes/deployOrder/store.js';
import type { JobContext } from './context.js';
import { cancelRunning } from './deployCancel.js';

/**
 * A change of a kind with an order (a deploy: src/changes/deployOrder/) takes its group's turn
 * before its handler runs, after its gate:
 * - superseded (a deploy of its group accepted after it started, or waits to): it never runs; the
 *   processor records the outcome `superseded`, naming that deploy, and the job completes;
 * - another deploy of its group runs: the job goes back to the delayed set with BullMQ's public API
 *   (Job#moveToDelayed with its token, then DelayedError) and asks again when it wakes, holding no
 *   worker slot meanwhile; the running one, when it ends, wakes the newest waiting one at once.
 *   When the running one's project has cancel_in_progress, it first deletes that one's Job
 *   (worker/deployCancel.ts), which ends it `cancelled`;
 * - its turn: it runs, and `release` ends the turn when the handler ends.
 * Without the job's lock token the turn cannot be taken: the attempt fails (retried),
 * it never runs out of order.
 */

/** How long a waiting deploy sleeps before it asks again (the running one's end wakes the newest sooner). */
export const TURN_RECHECK_MS = 5000;

export type TakenTurn = { superseded: string; release?: undefined } | { release: () => Promise<void>; superseded?: undefined };

/** The acceptance of the job's change: a resubmission's, carried in its data, or the job's own. */
export function acceptanceOf(c: ChangeJob, job: Pick<Job, 'id' | 'timestamp'>): Acceptance {
  return { at: c.data.accepted_at ?? job.timestamp, id: c.data.accepted_id ?? String(job.id) };
}

export async function takeTurn(
  c: ChangeJob,
  ctx: Pick<
    JobContext,
    'job' | 'token' | 'logger' | 'inventory' | 'config' | 'deployTurns' | 'promote' | 'now' | 'redis' | 'kubeConfig' | 'readJob'
  >,
): Promise<TakenTurn | undefined> {
  const kind = kindOf(c.name);
  if (!kind.turnGroup) return undefined;
  const turns = ctx.deployTurns;
  const { target } = kind.fromJob(ctx.inventory, c.data);
  const group = kind.turnGroup(ctx.inventory, target);
  if (group === undefined) return undefined;
  const jobId = String(ctx.job.id);
  const leaseMs = ctx.config.JOB_TIMEOUT_SECONDS * 1000 + 60_000;
  const turn = await turns.begin(group, jobId, acceptanceOf(c, ctx.job), ctx.now(), leaseMs);
  if (turn.turn === 'superseded') return { superseded: turn.by };
  if (turn.turn === 'wait') {
    if (!ctx.job.moveToDelayed || !ctx.token) {
      throw new Error(`${c.name} waits for ${turn.running} of its group but its lock token is missing; not running it`);
    }
    ctx.logger.info('waits for the running deploy of its group', { group, running: turn.running });
    // cancel_in_progress: the running one's Job is deleted; it ends cancelled and wakes this one.
    await cancelRunning(ctx, turn.running, jobId);
    await ctx.job.moveToDelayed(Date.now() + TURN_RECHECK_MS, ctx.token);
    throw new DelayedError();
  }
  return {
    release: async () => {
      const next = await turns.release(group, jobId);
      // The newest waiting one need not sleep out its recheck: it runs now (or finds itself superseded).
      if (next) await ctx.promote(next).catch((err: unknown) => ctx.logger.debug('could not wake the next deploy', { err }));
    },
  };
}
