import { describe, expect, it } from '@jest/globals';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { DIST_DIR } from '../../helpers/processes.js';

/**
 * The event-loop monitor behind the worker's /livez (worker/eventLoop.ts), run in a child
 * process whose event loop is really blocked (a busy loop), not simulated.
 */
describe('event-loop monitor', () => {
  it('sees a real 1.2 s block (also right after it, before its timer ran) and forgets it after the window', () => {
    const mod = pathToFileURL(join(DIST_DIR, 'worker/eventLoop.js')).href;
    const script = `
      import { startLoopMonitor } from ${JSON.stringify(mod)};
      const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
      const m = startLoopMonitor({ intervalMs: 50, windowMs: 2000 });
      await sleep(300);
      const before = m.maxLagMs();
      const t = Date.now();
      while (Date.now() - t < 1200) {} // the event loop is blocked for 1.2 s
      const rightAfter = m.maxLagMs();
      await sleep(150);
      const afterTick = m.maxLagMs();
      await sleep(2600);
      const later = m.maxLagMs();
      m.stop();
      console.log(JSON.stringify({ before, rightAfter, afterTick, later }));
    `;
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 30_000 });
    expect(r.stderr).toBe('');
    const out = JSON.parse(r.stdout) as Record<string, number>;
    expect(out.before).toBeLessThan(1000);
    expect(out.rightAfter).toBeGreaterThanOrEqual(1100);
    expect(out.afterTick).toBeGreaterThanOrEqual(1100);
    expect(out.later).toBeLessThan(1000);
  });
});
