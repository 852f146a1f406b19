/**
 * Deadlines on promises: `p` runs on past the deadline, its later outcome ignored (never an unhandled rejection). The timer
 * is not unref'd: a shutdown step waiting on a dead socket must reach its timeout, not end the process halfway.
 */

export class TimeoutError extends Error {
  constructor(what: string, ms: number) {
    super(`${what} timed out after ${ms} ms`);
    this.name = 'TimeoutError';
  }
}

/** Settles like `p`, or rejects once `ms` have passed: with a TimeoutError, or with the error `onTimeout` returns. */
export function withTimeout<T>(p: Promise<T>, ms: number, onTimeout: string | (() => Error) = 'operation'): Promise<T> {
  return race(p, ms, (_resolve, reject) => reject(typeof onTimeout === 'string' ? new TimeoutError(onTimeout, ms) : onTimeout()));
}

/** Settles like `p`, or resolves with `fallback()` once `ms` have passed. */
export function withFallback<T>(p: Promise<T>, ms: number, fallback: () => T): Promise<T> {
  return race(p, ms, (resolve) => resolve(fallback()));
}

/** Whether `p` settled (resolved or rejected) within `ms`. */
export function settlesWithin(p: Promise<unknown>, ms: number): Promise<boolean> {
  const settled = () => true;
  return withFallback(p.then(settled, settled), ms, () => false);
}

function race<T>(p: Promise<T>, ms: number, late: (resolve: (v: T) => void, reject: (e: Error) => void) => void): Promise<T> {
  const toError = (e: unknown) => (e instanceof Error ? e : new Error(String(e)));
  // A promise settles once: whichever of `p` and the deadline comes second changes nothing.
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(
      () => {
        try {
          late(resolve, reject);
        } catch (err) {
          reject(toError(err));
        }
      },
      Math.max(0, ms),
    );
    p.finally(() => clearTimeout(timer)).then(resolve, (e: unknown) => reject(toError(e)));
  });
}
