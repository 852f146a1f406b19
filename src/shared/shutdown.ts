import type { Logger } from './logger.js';
import { settlesWithin } from './timeout.js';

/**
 * Bounded shutdown: each close step runs against a deadline (left behind and logged when late), and a hard deadline over
 * the whole runs `onDeadline` (exit 1), so SIGTERM never hangs on a Redis that is down, frozen or still reconnecting.
 */
interface ShutdownBudget {
  /** Milliseconds left before the hard deadline (never below 0). */
  remaining(): number;
  /** Runs one close step bounded by min(maxMs, what is left); whether it finished cleanly. */
  step(name: string, run: () => Promise<unknown>, maxMs: number): Promise<boolean>;
  readonly unfinished: readonly string[];
  /** Cancels the hard-deadline timer (call right before exiting normally). */
  done(): void;
}

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
      if (!(await settlesWithin(p, ms))) {
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
    unfinished,
    done: () => clearTimeout(timer),
  };
}
