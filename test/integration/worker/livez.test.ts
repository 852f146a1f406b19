import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { freePort, startRedis, type RedisServer } from '../../helpers/redis.js';
import { startWorkerProcess, type OpsProcess } from '../../helpers/processes.js';

/**
 * The worker's liveness endpoint (GET /livez on METRICS_PORT) on the real worker
 * process with a real redis-server: healthy answer, the Redis state when Redis is frozen
 * (SIGSTOP), and a 503 when the worker's own event loop was stalled (the whole process SIGSTOPped,
 * as a starved or paused container is; no test hook inside the worker).
 */
let redis: RedisServer;
let worker: OpsProcess;
let livez: string;

beforeAll(async () => {
  redis = await startRedis();
  const port = await freePort();
  livez = `http://127.0.0.1:${port}/livez`;
  worker = await startWorkerProcess({
    env: {
      REDIS_URL: redis.url,
      METRICS_PORT: String(port),
      LOG_LEVEL: 'info',
      KUBECONFIG: '/nonexistent/kubeconfig',
      WORKER_LIVENESS_MAX_LAG_MS: '1000',
    },
  });
}, 60_000);

afterAll(async () => {
  await worker?.stop();
  await redis?.destroy();
});

async function get(): Promise<{ status: number; body: Record<string, unknown> }> {
  const r = await fetch(livez, { signal: AbortSignal.timeout(15_000) });
  return { status: r.status, body: (await r.json()) as Record<string, unknown> };
}

describe('worker GET /livez', () => {
  it('healthy: 200 with the event-loop lag and redis "ready"', async () => {
    const r = await get();
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ status: 'ok', redis: 'ready', event_loop_max_lag_ms: 1000 });
    expect(r.body.event_loop_lag_ms).toEqual(expect.any(Number));
  });

  it('Redis frozen (SIGSTOP): still live (a restart would not help), reports redis "unresponsive"; "ready" again once thawed', async () => {
    redis.pause();
    try {
      const r = await get();
      expect(r.status).toBe(200);
      expect(r.body.redis).toBe('unresponsive');
    } finally {
      redis.resume();
    }
    const deadline = Date.now() + 15_000;
    let last = await get();
    while (last.body.redis !== 'ready' && Date.now() < deadline) {
      await new Promise((res) => setTimeout(res, 200));
      last = await get();
    }
    expect(last.body.redis).toBe('ready');
  });

  it("the worker's event loop stalled 2 s (process SIGSTOPped): 503 {detail, code} naming the lag", async () => {
    worker.proc.kill('SIGSTOP');
    let pending: Promise<{ status: number; body: Record<string, unknown> }>;
    try {
      await new Promise((res) => setTimeout(res, 500));
      pending = get(); // the kubelet's probe arrives while the worker cannot run
      await new Promise((res) => setTimeout(res, 1500));
    } finally {
      worker.proc.kill('SIGCONT');
    }
    const r = await pending;
    expect(r.status).toBe(503);
    expect(r.body.status).toBe('event loop blocked');
    expect(r.body.event_loop_lag_ms as number).toBeGreaterThanOrEqual(1500);
    expect(String(r.body.detail)).toMatch(/event loop lagged \d+ ms \(limit 1000 ms\)/);
    expect(r.body.code).toBe('event_loop_blocked');
  });
});
