/**
 * Resolves or rejects like `p`, or rejects with Error(`${what} timed out after ${ms} ms`) once ms
 * have passed (`p` keeps running; its outcome is then ignored). The timer does not keep the
 * process alive. For a close step that must not throw, see within() in src/shared/shutdown.ts.
 */
export function withTimeout<T>(p: Promise<T>, ms: number, what = 'operation'): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what} timed out after ${ms} ms`)), ms);
    timer.unref();
    p.then(
      (v) => {
        clearTimeout(timer);
        resolve(v);
      },
      (e: unknown) => {
        clearTimeout(timer);
        reject(e instanceof Error ? e : new Error(String(e)));
      },
    );
  });
}
