import { performance } from 'node:perf_hooks';

/**
 * Event-loop lag for the worker's /livez: how late a timer due every `intervalMs` fires. The largest
 * lag of the last `windowMs` counts, and so does an overdue tick, so a probe just after a long block sees it.
 */
export type LoopMonitor = ReturnType<typeof startLoopMonitor>;

export function startLoopMonitor({ intervalMs = 250, windowMs = 10_000 } = {}) {
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
    maxLagMs() {
      const now = performance.now();
      let max = Math.max(0, now - last - intervalMs);
      for (const s of samples) if (s.at >= now - windowMs && s.lag > max) max = s.lag;
      return Math.round(max);
    },
    stop: () => clearInterval(timer),
  };
}
