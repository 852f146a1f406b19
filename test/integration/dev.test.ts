import { afterAll, describe, expect, it } from '@jest/globals';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { freePort } from '../helpers/redis.js';

/**
 * `make dev` (hack/dev.sh on the built dist/): a local Redis, the API and the worker come up,
 * the printed demo credentials and sample requests work, and Ctrl-C (SIGINT) stops everything.
 */
const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
let proc: ChildProcess | undefined;
const dir = mkdtempSync(join(tmpdir(), 'opsgate-dev-'));

afterAll(() => {
  if (proc && proc.exitCode === null) process.kill(-proc.pid!, 'SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

describe('make dev (hack/dev.sh)', () => {
  it('prints demo credentials that work against the running API and worker, and stops on Ctrl-C', async () => {
    const [port, redisPort, apiMetrics, workerMetrics] = await Promise.all([freePort(), freePort(), freePort(), freePort()]);
    proc = spawn('bash', [join(ROOT, 'hack/dev.sh')], {
      cwd: ROOT,
      detached: true, // own process group, like a terminal session
      env: { ...process.env, PORT: String(port), REDIS_PORT: String(redisPort), API_METRICS_PORT: String(apiMetrics), WORKER_METRICS_PORT: String(workerMetrics), DEV_DIR: dir },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    proc.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    proc.stderr!.on('data', (d: Buffer) => (out += d.toString()));
    const deadline = Date.now() + 60_000;
    while (!out.includes('Ctrl-C stops everything')) {
      if (proc.exitCode !== null || Date.now() > deadline) throw new Error(`dev.sh did not come up:\n${out}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    const cred = (label: string) => new RegExp(`${label}\\s*:\\s*(\\S+)`).exec(out)![1]!;
    const base = `http://127.0.0.1:${port}`;

    const hosts = await fetch(`${base}/ops/hosts`, { headers: { 'X-API-Key': cred('readonly API key') } });
    expect(hosts.status).toBe(200);
    expect(((await hosts.json()) as { hosts: string[] }).hosts).toEqual(['web-01', 'worker-01']);

    const push = await fetch(`${base}/webhook/scm`, {
      method: 'POST',
      headers: { 'X-Scm-Token': cred('SCM webhook token'), 'X-Scm-Event': 'Push Hook', 'Content-Type': 'application/json' },
      body: JSON.stringify({ ref: 'refs/heads/main', checkout_sha: 'abc123', project: { path_with_namespace: 'acme/storefront' } }),
    });
    expect(push.status).toBe(202);
    expect(await push.json()).toMatchObject({ accepted: true, duplicate: false });

    const restart = await fetch(`${base}/ops/restart?host=web-01&service=storefront`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${cred('bearer token')}` },
    });
    expect(restart.status).toBe(200);
    const { job_id } = (await restart.json()) as { job_id: string };
    // The worker takes the job; with no cluster here it is dead-lettered with a clear reason.
    let job: { state?: string; failed_reason?: string } = {};
    while (Date.now() < deadline && job.state !== 'failed') {
      const r = await fetch(`${base}/ops/jobs/${job_id}`, { headers: { 'X-API-Key': cred('readonly API key') } });
      job = (await r.json()) as typeof job;
      await new Promise((r) => setTimeout(r, 200));
    }
    expect(job.failed_reason).toMatch(/no Kubernetes configuration/);

    const board = await fetch(`${base}/admin/queues`, { headers: { Authorization: `Basic ${Buffer.from(`me:${cred('operator API key')}`).toString('base64')}` } });
    expect(board.status).toBe(200);

    process.kill(-proc.pid!, 'SIGINT');
    const code = await new Promise<number | null>((r) => proc!.once('exit', (c) => r(c)));
    expect(code).not.toBeNull();
    await new Promise((r) => setTimeout(r, 500));
    await expect(fetch(`${base}/health`)).rejects.toThrow();
  }, 120_000);
});
