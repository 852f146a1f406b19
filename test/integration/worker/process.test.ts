import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Queue } from 'bullmq';
import { JOB, QUEUE_NAME, defaultJobOptions } from '../../../src/shared/jobs.js';
import { freePort, startRedis, type RedisServer } from '../../helpers/redis.js';
import { spawnNode, startWorkerProcess, WORKER_ENTRY, type OpsProcess } from '../../helpers/processes.js';
import { audit, startReceiver, waitForFinal, waitForState, type Receiver } from '../../helpers/workerSupport.js';

/**
 * The real worker process (node dist/worker/index.js): start-up refusal on a bad environment,
 * graceful SIGTERM drain, the shutdown grace bound, and recovery of a job whose worker was killed.
 */
let redis: RedisServer;
let receiver: Receiver;
let queue: Queue;
let home: string;
const procs: OpsProcess[] = [];

beforeAll(async () => {
  redis = await startRedis();
  receiver = await startReceiver();
  queue = new Queue(QUEUE_NAME, { connection: { url: redis.url }, defaultJobOptions: defaultJobOptions({ attempts: 3, backoffMs: 200 }) });
  home = mkdtempSync(join(tmpdir(), 'opsgate-home-'));
});

afterEach(async () => {
  await Promise.all(procs.splice(0).map((p) => p.stop()));
});

afterAll(async () => {
  await queue.close();
  await receiver.close();
  await redis.destroy();
  rmSync(home, { recursive: true, force: true });
});

async function env(extra: Record<string, string>): Promise<Record<string, string>> {
  return { REDIS_URL: redis.url, METRICS_PORT: String(await freePort()), HOME: home, LOG_LEVEL: 'info', ...extra };
}

async function worker(extra: Record<string, string>): Promise<OpsProcess> {
  const p = await startWorkerProcess({ env: await env(extra) });
  procs.push(p);
  return p;
}

describe('start-up', () => {
  it('refuses to start without REDIS_URL: one line on stderr naming the variable, exit 1', async () => {
    const p = spawnNode(WORKER_ENTRY, { env: { HOME: home } });
    procs.push(p);
    const exit = await p.waitExit();
    expect(exit.code).toBe(1);
    expect(p.stderr.filter((l) => l.trim() !== '')).toEqual(['opsgate-worker: configuration error: REDIS_URL: is required']);
    expect(p.logs()).toEqual([
      expect.objectContaining({
        level: 'error',
        component: 'worker',
        msg: 'configuration error',
        problems: [{ variable: 'REDIS_URL', problem: 'is required' }],
      }),
    ]);
    expect(p.lines).toHaveLength(1);
  });

  it('names a bad variable but never prints the (secret-bearing) values around it', async () => {
    const p = spawnNode(WORKER_ENTRY, {
      env: {
        HOME: home,
        REDIS_URL: 'redis://:hunter2-redis-password@127.0.0.1:6390',
        JOB_ATTEMPTS: 'many',
        NOTIFY_WEBHOOK_URLS: 'https://hooks.example/T/B/tokentoken',
      },
    });
    procs.push(p);
    const exit = await p.waitExit();
    expect(exit.code).toBe(1);
    const out = [...p.stderr, ...p.lines].join('\n');
    expect(out).toContain('JOB_ATTEMPTS: must be an integer >= 1');
    expect(out).not.toContain('hunter2');
    expect(out).not.toContain('tokentoken');
    expect(out).not.toContain('many');
  });

  it('logs {"msg":"worker ready"} and serves /metrics on METRICS_PORT', async () => {
    const metricsPort = await freePort();
    const p = await startWorkerProcess({ env: await env({ METRICS_PORT: String(metricsPort) }) });
    procs.push(p);
    const ready = p.logs().find((l) => l.msg === 'worker ready');
    expect(ready).toMatchObject({ component: 'worker', queue: 'ops', job_timeout_s: 900 });
    const res = await fetch(`http://127.0.0.1:${metricsPort}/metrics`);
    expect(res.status).toBe(200);
    expect(await res.text()).toMatch(/opsgate_build_info\{[^}]*component="worker"/);
  });

  it('while Redis is unreachable it serves /metrics, is not ready, and stops cleanly on SIGTERM', async () => {
    const metricsPort = await freePort();
    const p = spawnNode(WORKER_ENTRY, {
      env: await env({ REDIS_URL: `redis://127.0.0.1:${await freePort()}`, METRICS_PORT: String(metricsPort) }),
    });
    procs.push(p);
    await p.waitForLog((l) => l.msg === 'metrics listening');
    await p.waitForLog((l) => l.msg === 'redis connection error');
    const res = await fetch(`http://127.0.0.1:${metricsPort}/metrics`);
    expect(res.status).toBe(200);
    await res.text();
    expect(p.logs().some((l) => l.msg === 'worker ready')).toBe(false);
    p.kill('SIGTERM');
    expect(await p.waitExit()).toEqual({ code: 0, signal: null });
    expect(p.logs().some((l) => l.msg === 'worker stopped before it was ready')).toBe(true);
  });
});

describe('secret redaction', () => {
  it('the Redis password and webhook URL secrets never reach a log line, even inside job data', async () => {
    const password = 'redis-pw-Qx7Zk2Lm9';
    const token = 'hooktoken-Vb83Nw01';
    const path = `/services/T1/B2/${token}`;
    const url = new URL(redis.url);
    const p = await worker({ REDIS_URL: `redis://:${password}@${url.host}`, NOTIFY_WEBHOOK_URLS: receiver.url(path) });
    // An alert whose summary happens to contain both secrets: it is logged (the worker logs every alert's summary), so redaction must catch it.
    const job = await queue.add(JOB.notifyOncall, {
      alertname: 'Leaky',
      annotations: { summary: `pw=${password} url=${receiver.url(path)}` },
      ...audit,
    });
    expect((await waitForFinal(queue, job.id!)).state).toBe('completed');
    const line = await p.waitForLog((l) => l.msg === 'alert notification' && l.job_id === job.id);
    expect(line.summary).toBe(`pw=[REDACTED] url=[REDACTED]`);
    const all = [...p.lines, ...p.stderr].join('\n');
    expect(all).not.toContain(password);
    expect(all).not.toContain(token);
    // The endpoint itself did get the alert as sent.
    expect(JSON.parse(receiver.requests(path)[0]!.body).annotations.summary).toContain(password);
  });
});

describe('graceful shutdown', () => {
  it('SIGTERM: the running job finishes before the process exits 0', async () => {
    const path = '/graceful/slow';
    receiver.script(path, [{ status: 200, delayMs: 2500 }]);
    const p = await worker({ NOTIFY_WEBHOOK_URLS: receiver.url(path), WORKER_SHUTDOWN_GRACE_SECONDS: '30' });
    const job = await queue.add(JOB.notifyOncall, { alertname: 'Graceful', annotations: {}, ...audit });
    await receiver.waitForRequests(path, 1); // the job is running (its POST is in flight)
    expect(await (await queue.getJob(job.id!))!.getState()).toBe('active');

    p.kill('SIGTERM');
    const exit = await p.waitExit(20000);
    expect(exit).toEqual({ code: 0, signal: null });

    const { state, job: done } = await waitForFinal(queue, job.id!, 1000);
    expect(state).toBe('completed');
    expect(done.attemptsMade).toBe(1);
    expect(receiver.requests(path)).toHaveLength(1);
    expect(receiver.requests(path)[0]!.aborted).toBe(false);
    const msgs = p.logs().map((l) => l.msg);
    const order = ['shutting down: waiting for active jobs', 'job completed', 'worker stopped'].map((m) => msgs.indexOf(m));
    expect(order.every((i) => i >= 0)).toBe(true);
    expect([...order].sort((a, b) => a - b)).toEqual(order);
  });

  it('past WORKER_SHUTDOWN_GRACE_SECONDS the job is interrupted, kept and retried later, and the process still exits 0', async () => {
    const path = '/graceful/too-slow';
    receiver.script(path, [{ status: 200, delayMs: 15000 }, { status: 200 }]);
    const p = await worker({ NOTIFY_WEBHOOK_URLS: receiver.url(path), WORKER_SHUTDOWN_GRACE_SECONDS: '1' });
    const job = await queue.add(JOB.notifyOncall, { alertname: 'TooSlow', annotations: {}, ...audit });
    await receiver.waitForRequests(path, 1);

    const t0 = Date.now();
    p.kill('SIGTERM');
    const exit = await p.waitExit(20000);
    expect(exit).toEqual({ code: 0, signal: null });
    expect(Date.now() - t0).toBeLessThan(10000);
    expect(p.logs().some((l) => l.msg === 'shutdown grace period over; aborting active jobs (they will be retried)')).toBe(true);

    // Not lost: the interrupted attempt is recorded and the job waits for its retry.
    const state = await waitForState(queue, job.id!, ['delayed', 'waiting']);
    expect(['delayed', 'waiting']).toContain(state);
    const kept = (await queue.getJob(job.id!))!;
    expect(kept.attemptsMade).toBe(1);
    expect(kept.failedReason).toBe('attempt interrupted: worker shutting down');

    // The next worker delivers it.
    await worker({ NOTIFY_WEBHOOK_URLS: receiver.url(path) });
    const { state: final } = await waitForFinal(queue, job.id!);
    expect(final).toBe('completed');
    expect(receiver.requests(path)).toHaveLength(2);
  });
});

describe('crash recovery', () => {
  it('a job whose worker was SIGKILLed mid-attempt is recovered (stalled) and completed by another worker', async () => {
    const path = '/crash/hang';
    receiver.script(path, [{ status: 200, delayMs: 60000 }, { status: 200 }]);
    const fast = { WORKER_LOCK_DURATION_MS: '2000', WORKER_STALLED_INTERVAL_MS: '1000' };
    const a = await worker({ NOTIFY_WEBHOOK_URLS: receiver.url(path), ...fast });
    const job = await queue.add(JOB.notifyOncall, { alertname: 'Crash', annotations: {}, ...audit });
    await receiver.waitForRequests(path, 1);
    a.kill('SIGKILL');
    expect((await a.waitExit()).signal).toBe('SIGKILL');
    expect(await (await queue.getJob(job.id!))!.getState()).toBe('active'); // orphaned, lock still held

    const metricsPort = await freePort();
    const b = await worker({ NOTIFY_WEBHOOK_URLS: receiver.url(path), ...fast, METRICS_PORT: String(metricsPort) });
    const { state } = await waitForFinal(queue, job.id!, 30000);
    expect(state).toBe('completed');
    expect(receiver.requests(path)).toHaveLength(2);
    await b.waitForLog(
      (l) => l.msg === 'job stalled (its worker stopped renewing the lock); moved back to waiting' && l.job_id === job.id,
      5000,
    );
    await b.waitForLog((l) => l.msg === 'job completed' && l.job_id === job.id, 5000);
    const text = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
    expect(text).toMatch(/^opsgate_jobs_stalled_total 1$/m);
    expect(text).toMatch(/^opsgate_jobs_processed_total\{name="ops_worker\.notify_oncall",outcome="completed"\} 1$/m);
  }, 60000);
});
