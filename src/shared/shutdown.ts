import type { Logger } from './logger.js';
import { settlesWithin } from './timeout.js';

/**
 * Bounded shutdown for both processes. Every close step (HTTP server, metrics
 * server, BullMQ worker/queue, Redis connections) runs against a deadline: a step that does not
 * finish in time is logged (msg "shutdown step timed out") and left behind, and the process exits
 * non-zero. A hard deadline covers the whole shutdown: past it the process exits 1 whatever is
 * still running (msg "shutdown deadline passed; timed out"), so SIGTERM never hangs on a Redis that
 * is down, frozen or still reconnecting.
 */

interface ShutdownBudget {
  /** Milliseconds left before the hard deadline (never below 0). */
  remaining(): number;
  /**
   * Runs one close step bounded by min(maxMs, what is left); logs and records it when it times
   * out (or fails). Returns whether it finished cleanly.
   */
  step(name: string, run: () => Promise<unknown>, maxMs: number): Promise<boolean>;
  /** Names of the steps that did not finish. */
  readonly unfinished: readonly string[];
  /** Cancels the hard-deadline timer (call right before exiting normally). */
  done(): void;
}

/**
 * Starts the hard deadline (totalMs from now): when it passes, `onDeadline` runs (production:
 * log + process.exit(1)).
 */
export function shutdownBudget(logger: Logger, totalMs: number, onDeadline: () => void): ShutdownBudget {
  const deadline = Date.now() + totalMs;
  const unfinished: string[] = [];
  const timer = setTimeout(() => {
    logger.error('shutdown deadline passed; timed out, exiting with close steps unfinished', { deadline_ms: totalMs, unfinished });
    onDeadline();
  }, totalMs);
  return {
    remaining: () => Math.max(0, deadline - Date.now()),
    async step(name, run, maxMs) {
      const ms = Math.min(maxMs, Math.max(0, deadline - Date.now()));
      let failed: unknown;
      const p = (async () => run())().catch((err: unknown) => {
        failed = err;
      });
      const finished = await settlesWithin(p, ms);
      if (!finished) {
        unfinished.push(name);
        logger.error('shutdown step timed out', { step: name, timeout_ms: ms });
        return false;
      }
      if (failed !== undefined) {
        unfinished.push(name);
        logger.error('shutdown step failed', { step: name, err: failed });
        return false;
      }
      return true;
    },
    get unfinished() {
      return unfinished;
    },
    done: () => clearTimeout(timer),
  };
}
