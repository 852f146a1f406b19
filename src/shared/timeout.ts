/**
 * Deadlines on promises, for both processes: every wait that must not outlast a bound goes through
 * one of the two forms here.
 *
 * - withTimeout: the caller treats "too late" as a failure (a queue read, a Kubernetes read, a job
 *   attempt): rejects once the deadline passes.
 * - withFallback: the caller has an answer for "too late" (a shutdown step that is left behind,
 *   a rate limit that fails open, a WAIT that counts as not acknowledged): resolves with it.
 *
 * In both, `p` keeps running past the deadline and its later outcome is ignored (a late rejection
 * is handled, never unhandled). The timer is cleared as soon as `p` settles; it is not unref'd, so
 * a deadline fires even when nothing else keeps the process alive (a shutdown step waiting on a
 * dead socket must reach its timeout, not end the process halfway).
 */

export class TimeoutError extends Error {
  constructor(what: string, ms: number) {
    super(`${what} timed out after ${ms} ms`);
    this.name = 'TimeoutError';
  }
}

/**
 * Settles like `p`, or rejects once `ms` have passed: with TimeoutError(`${what} timed out after
 * ${ms} ms`), or with the error `onTimeout` returns (it runs once, at the deadline).
 */
export function withTimeout<T>(p: Promise<T>, ms: number, onTimeout: string | (() => Error) = 'operation'): Promise<T> {
  return race(p, ms, (_resolve, reject) => reject(typeof onTimeout === 'string' ? new TimeoutError(onTimeout, ms) : onTimeout()));
}

/**
 * Settles like `p`, or resolves with `fallback()` once `ms` have passed (it runs once, at the
 * deadline). A rejection of `p` before the deadline still rejects.
 */
export function withFallback<T>(p: Promise<T>, ms: number, fallback: () => T): Promise<T> {
  return race(p, ms, (resolve) => resolve(fallback()));
}

/** Whether `p` settled (resolved or rejected) within `ms`: the fallback form for a step that may be left behind. */
export function settlesWithin(p: Promise<unknown>, ms: number): Promise<boolean> {
  return withFallback(
    p.then(
      () => true,
      () => true,
    ),
    ms,
    () => false,
  );
}

function race<T>(p: Promise<T>, ms: number, late: (resolve: (v: T) => void, reject: (e: Error) => void) => void): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let done = false;
    const timer = setTimeout(
      () => {
        if (done) return;
        done = true;
        try {
          late(resolve, reject);
        } catch (err) {
          reject(err instanceof Error ? err : new Error(String(err)));
        }
      },
      Math.max(0, ms),
    );
    p.then(
      (v) => {
        clearTimeout(timer);
        if (done) return;
        done = true;
        resolve(v);
      },
      (e: unknown) => {
        clearTimeout(timer);
        if (done) return;
        done = true;
        reject(e instanceof Error ? e : new Error(String(e)));
      },
    );
  });
}
