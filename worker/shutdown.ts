import type { Worker } from 'bullmq';
import type { Redis } from 'ioredis';
import type { Logger } from '../src/shared/logger.js';
import { shutdownBudget } from '../src/shared/shutdown.js';
import { settlesWithin } from '../src/shared/timeout.js';
import { markClosing } from '../src/shared/redisConnection.js';

/**
 * Waits (at most ms) for a connection to leave the "reconnecting" state. BullMQ's blocking connection
 * duplicates the worker's, so after a Redis restart both come back within one retry step.
 */
async function settleConnection(client: Redis, ms: number): Promise<void> {
  if (client.status !== 'reconnecting' && client.status !== 'connecting') return;
  await settlesWithin(new Promise((resolve) => client.once('ready', resolve).once('end', resolve)), ms);
}

/**
 * Stops the queue worker: active jobs may finish within graceMs, then are aborted (and retried
 * later); then Redis is quit. Each step is bounded by stepMs; false when one did not finish in time.
 */
export async function closeWorker(
  worker: Worker,
  redis: Redis,
  logger: Logger,
  graceMs: number,
  stepMs: number,
  /** Closed after the jobs drained, before Redis is quit (the report producer's Queue), bounded. */
  alsoClose?: () => Promise<unknown>,
): Promise<boolean> {
  let clean = true;
  // BullMQ's close interrupts its blocking BZPOPMIN by disconnecting that connection and then
  // waits for its 'end' event. ioredis never emits 'end' for a connection disconnected while
  // it waits to reconnect (status "reconnecting", e.g. just after a Redis restart): close()
  // would wait forever. So a reconnecting worker gets a bounded chance to come back first.
  await settleConnection(redis, Math.min(5000, stepMs / 2));
  const closed = worker.close();
  if (!(await settlesWithin(closed, graceMs))) {
    logger.warn('shutdown grace period over; aborting active jobs (they will be retried)', { grace_ms: graceMs });
    worker.cancelAllJobs('worker shutting down');
    if (!(await settlesWithin(closed, Math.min(5000, stepMs / 2)))) {
      // worker.close(true) would return the same pending promise: nothing more to wait for.
      logger.error('shutdown step timed out: the queue worker did not close (active jobs are recovered as stalled)', { step: 'worker' });
      clean = false;
    }
  }
  // settlesWithin counts a rejected close as settled: the step is bounded, not checked.
  if (alsoClose && !(await settlesWithin(alsoClose(), Math.min(2000, stepMs / 4)))) {
    logger.error('shutdown step timed out: the report producer did not close', { step: 'report producer' });
    clean = false;
  }
  markClosing(redis);
  if (!(await settlesWithin(redis.quit(), Math.min(2000, stepMs / 4)))) {
    redis.disconnect();
    logger.error('shutdown step timed out: redis quit; disconnected', { step: 'redis' });
    clean = false;
  }
  return clean;
}

/**
 * SIGTERM / SIGINT: drain the active jobs, close the rest, exit 0 when every step finished, else 1,
 * within graceMs + stepMs. A second signal exits at once.
 */
export function onShutdownSignals(deps: {
  logger: Logger;
  graceMs: number;
  stepMs: number;
  /** The running worker, once it is connected. */
  handle(): { close(graceMs?: number, stepMs?: number): Promise<boolean> } | undefined;
  /** Further close steps after the worker, each bounded by 3 s (metrics server, queue depth reader). */
  steps: ReadonlyArray<{ name: string; run: () => Promise<unknown> }>;
}): void {
  const { logger, graceMs, stepMs } = deps;
  let stopping = false;
  const shutdown = (signal: NodeJS.Signals) => {
    if (stopping) {
      logger.warn('second signal during shutdown; exiting now', { signal });
      process.exit(1);
    }
    stopping = true;
    const h = deps.handle();
    if (!h) {
      // Still connecting to Redis: no job can be active yet.
      logger.info('worker stopped before it was ready', { signal });
      void logger.flush().finally(() => process.exit(0));
      return;
    }
    // Hard bound of the whole shutdown: the job drain plus the close steps.
    const budget = shutdownBudget(logger, graceMs + stepMs, () => process.exit(1));
    logger.info('shutting down: waiting for active jobs', { signal, grace_s: graceMs / 1000, shutdown_timeout_s: stepMs / 1000 });
    void (async () => {
      // Metrics stay up while active jobs drain.
      const workerClean = await h.close(graceMs, stepMs);
      for (const s of deps.steps) await budget.step(s.name, s.run, 3000);
      budget.done();
      const clean = workerClean && budget.unfinished.length === 0;
      if (clean) logger.info('worker stopped', { signal });
      else {
        const unfinished = [...(workerClean ? [] : ['worker']), ...budget.unfinished];
        logger.error('shutdown incomplete: some close steps timed out; exiting 1', { signal, unfinished });
      }
      // The logger writes asynchronously: flush its last lines before exit (bounded).
      await logger.flush();
      process.exit(clean ? 0 : 1);
    })();
  };
  process.on('SIGTERM', shutdown);
  process.on('SIGINT', shutdown);
}
