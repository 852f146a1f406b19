import { performance } from 'node:perf_hooks';

/**
 * Event-loop lag, for the worker's liveness endpoint (/livez on its metrics port). A timer is
 * due every `intervalMs`; how late it fires is the lag. The largest lag of the last `windowMs`
 * is kept, plus the lag of a tick that is overdue right now, so a probe answered just after a long
 * block still sees it (whichever of the timer and the probe's request runs first).
 */
export type LoopMonitor = ReturnType<typeof startLoopMonitor>;

export function startLoopMonitor(opts: { intervalMs?: number; windowMs?: number } = {}) {
  const intervalMs = opts.intervalMs ?? 250;
  const windowMs = opts.windowMs ?? 10_000;
  let last = performance.now();
  const samples: Array<{ at: number; lag: number }> = [];
  const timer = setInterval(() => {
    const now = performance.now();
    const lag = Math.max(0, now - last - intervalMs);
    last = now;
    if (lag > 0) samples.push({ at: now, lag });
    while (samples.length > 0 && samples[0]!.at < now - windowMs) samples.shift();
  }, intervalMs);
  timer.unref();
  return {
    /** Largest lag (ms) within the window, including the currently overdue tick. */
    maxLagMs() {
      const now = performance.now();
      let max = Math.max(0, now - last - intervalMs);
      for (const s of samples) if (s.at >= now - windowMs && s.lag > max) max = s.lag;
      return Math.round(max);
    },
    stop: () => clearInterval(timer),
  };
}
