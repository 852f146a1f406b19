import { DelayedError, type Job } from 'bullmq';
import type { ChangeJob } from '../src/changes/wake.js';
import { kindOf } from '../src/changes/kinds/index.js';
import type { Acceptance } from '../src/changes/deployOrder/store.js';
import type { JobContext } from './context.js';
import { cancelRunning } from './deployCancel.js';

/**
 * A change of a kind with an order (a deploy) takes its group's turn after its gate: superseded by a
 * newer one, it never runs; while another runs, it waits delayed (holding no worker slot) until that
 * one ends and wakes it. Without the job's lock token the attempt fails: it never runs out of order.
 */

/** How long a waiting deploy sleeps before it asks again. */
const TURN_RECHECK_MS = 5000;

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
  const group = kind.turnGroup(ctx.inventory, kind.fromJob(ctx.inventory, c.data).target);
  if (group === undefined) return undefined;
  const jobId = String(ctx.job.id);
  const leaseMs = ctx.config.JOB_TIMEOUT_SECONDS * 1000 + 60_000;
  const turn = await ctx.deployTurns.begin(group, jobId, acceptanceOf(c, ctx.job), ctx.now(), leaseMs);
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
      const next = await ctx.deployTurns.release(group, jobId);
      // The newest waiting one need not sleep out its recheck: it runs now (or finds itself superseded).
      if (next) await ctx.promote(next).catch((err: unknown) => ctx.logger.debug('could not wake the next deploy', { err }));
    },
  };
}
