/**
 * Bounded shutdown, with the real processes (dist/src/server.js,
 * dist/worker/index.js) and a real redis-server: Redis stopped, paused (SIGSTOP) or restarted,
 * then SIGTERM -> each process exits within its bound. When a close step cannot finish (Redis
 * gone or frozen), the process says so in its log and exits non-zero; after a Redis restart
 * everything closes and it exits 0.
 *
 * Bounds: worker WORKER_SHUTDOWN_GRACE_SECONDS (1 here) + SHUTDOWN_TIMEOUT_SECONDS (5 here);
 * API SHUTDOWN_TIMEOUT_SECONDS (5 here). The test allows a margin for a loaded machine.
 */
import { afterEach, describe, expect, it } from '@jest/globals';
import { startApi, startWorkerProcess, type OpsProcess } from '../../helpers/processes.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { apiEnv, makeSecrets, post, scmPush, waitFor, workerEnv } from '../../helpers/reliability.js';

const secrets = makeSecrets('shutdown');
const SHUTDOWN_TIMEOUT_SECONDS = 5;
const GRACE_SECONDS = 1;
/** What the test waits at most: the configured bound plus room for a loaded 2-core machine. */
const WAIT_MS = (GRACE_SECONDS + SHUTDOWN_TIMEOUT_SECONDS) * 1000 + 10_000;

let redis: RedisServer | undefined;
const procs: OpsProcess[] = [];

afterEach(async () => {
  for (const p of procs.splice(0)) await p.stop();
  await redis?.destroy();
  redis = undefined;
});

async function start() {
  redis = await startRedis();
  const api = await startApi({ env: await apiEnv(redis.url, secrets, { SHUTDOWN_TIMEOUT_SECONDS: String(SHUTDOWN_TIMEOUT_SECONDS) }) });
  procs.push(api);
  const worker = await startWorkerProcess({
    env: await workerEnv(redis.url, {
      WORKER_SHUTDOWN_GRACE_SECONDS: String(GRACE_SECONDS),
      SHUTDOWN_TIMEOUT_SECONDS: String(SHUTDOWN_TIMEOUT_SECONDS),
      WORKER_STALLED_INTERVAL_MS: '1000',
    }),
  });
  procs.push(worker);
  // Some real traffic first: a job flows through both processes.
  expect(
    (
      await post(`${api.baseUrl}/webhook/scm`, scmPush('team/app', `sha-${Date.now()}`), {
        'X-Scm-Token': secrets.scm,
        'X-Scm-Event': 'Push Hook',
      })
    ).status,
  ).toBe(202);
  await worker.waitForLog((l) => l.msg === 'job dead-lettered' || l.msg === 'job attempt failed; will retry', 20_000);
  return { api, worker };
}

/** SIGTERM both; resolves with each exit and how long it took. */
type Exit = { code: number | null; signal: NodeJS.Signals | null; ms: number };
async function terminate(...ps: OpsProcess[]): Promise<Exit[] & [Exit, Exit?]> {
  const t0 = Date.now();
  for (const p of ps) p.kill('SIGTERM');
  return Promise.all(
    ps.map(async (p) => {
      const exit = await p.waitExit(WAIT_MS);
      return { ...exit, ms: Date.now() - t0 };
    }),
  ) as Promise<Exit[] & [Exit, Exit?]>;
}

describe('bounded shutdown with real processes and a real redis-server', () => {
  it('Redis stopped: both processes exit within their bound, non-zero, and say which step did not finish', async () => {
    const { api, worker } = await start();
    await redis!.stop();
    await new Promise((r) => setTimeout(r, 500)); // both notice the lost connection
    const [a, w] = (await terminate(api, worker)) as [Exit, Exit];
    for (const [p, e] of [
      [api, a],
      [worker, w],
    ] as const) {
      expect(e.ms).toBeLessThan(WAIT_MS);
      expect(e.signal).toBeNull();
      if (e.code !== 0) {
        expect(e.code).toBe(1);
        expect(p.logs().some((l) => l.level === 'error' && /shutdown/.test(String(l.msg)))).toBe(true);
      }
    }
  }, 120_000);

  it('Redis paused (SIGSTOP): both processes exit within their bound (non-zero, logged)', async () => {
    const { api, worker } = await start();
    redis!.pause();
    try {
      const [a, w] = (await terminate(api, worker)) as [Exit, Exit];
      for (const [p, e] of [
        [api, a],
        [worker, w],
      ] as const) {
        expect(e.ms).toBeLessThan(WAIT_MS);
        expect(e.signal).toBeNull();
        expect(e.code).toBe(1);
        const logged = p.logs().find((l) => l.level === 'error' && /shutdown/.test(String(l.msg)));
        expect(logged).toBeDefined();
        expect(JSON.stringify(logged)).toMatch(/timed out/);
      }
    } finally {
      redis!.resume();
    }
  }, 120_000);

  it('Redis restarted before SIGTERM (the secrets-in-logs case): both exit 0 well within the bound', async () => {
    const { api, worker } = await start();
    await redis!.stop();
    await new Promise((r) => setTimeout(r, 1500));
    await redis!.start();
    await waitFor('api ready again', async () => (await fetch(`${api.baseUrl}/ready`)).status === 200, 30_000, 100);
    await worker.waitForLog((l) => l.msg === 'redis connection restored', 30_000);
    const [a, w] = (await terminate(api, worker)) as [Exit, Exit];
    expect(a).toMatchObject({ code: 0, signal: null });
    expect(w).toMatchObject({ code: 0, signal: null });
    expect(w.ms).toBeLessThan(WAIT_MS);
    expect(worker.logs().some((l) => l.msg === 'worker stopped')).toBe(true);
  }, 120_000);

  it('Redis restarted and SIGTERM while the worker is still reconnecting (the window the secrets-in-logs failure hit): exits within the bound', async () => {
    const { worker } = await start();
    await redis!.stop();
    await new Promise((r) => setTimeout(r, 4000)); // reconnect backoff grows to its 2 s cap
    await redis!.start();
    const [w] = await terminate(worker); // at once: the blocking connection is still waiting to reconnect
    expect(w.signal).toBeNull();
    expect(w.ms).toBeLessThan(WAIT_MS);
    // Redis is back: every close step can finish. Otherwise the error lines say which step did not.
    const errors = w.code === 0 ? [] : worker.logs().filter((l) => l.level === 'error');
    expect({ code: w.code, errors }).toEqual({ code: 0, errors: [] });
    expect(worker.logs().some((l) => l.msg === 'worker stopped')).toBe(true);
  }, 120_000);
});
