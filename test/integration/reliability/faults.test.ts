/**
 * Faults, with the real processes (dist/src/server.js, dist/worker/index.js) and a real
 * redis-server with AOF persistence (appendfsync always):
 * - worker SIGKILLed in the middle of a job -> the job's lock expires, the stalled-job checker of
 *   another worker moves it back, and it completes;
 * - API SIGKILLed under load -> every delivery it answered 202 has its job; the deliveries cut
 *   off by the crash are accepted on the sender's retry; nothing is lost or doubled;
 * - Redis stopped -> 503 {detail} + Retry-After on the endpoints that need it, liveness and
 *   Redis-free endpoints keep answering (rate limiter fails open); the retry is accepted once
 *   Redis is back; when enqueueing fails, no seen record is left, so the retry is accepted, not
 *   called a duplicate;
 * - Redis SIGKILLed and restarted -> dedup records and queued jobs survive (AOF);
 * - notification endpoint failing -> retries with exponential backoff, then dead-lettered with
 *   the reason; an endpoint refusing (4xx) -> dead-lettered at once;
 * - Kubernetes API unreachable (a kubeconfig pointing at a closed loopback port) -> restart and
 *   deploy jobs retried with backoff, then dead-lettered with the reason.
 * Worker knobs used: WORKER_LOCK_DURATION_MS, WORKER_STALLED_INTERVAL_MS (short, so a dead
 * worker's job is recovered in seconds); JOB_ATTEMPTS / JOB_BACKOFF_MS on the API (the producer
 * sets the job options).
 */
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Job } from 'bullmq';
import { Redis } from 'ioredis';
import { startApi, startWorkerProcess, type OpsProcess } from '../../helpers/processes.js';
import { freePort, startRedis, type RedisServer } from '../../helpers/redis.js';
import {
  alertPayload,
  apiEnv,
  inspectQueue,
  makeSecrets,
  pool,
  post,
  scmPush,
  startReceiver,
  waitFor,
  workerEnv,
  type Receiver,
} from '../../helpers/reliability.js';

let redis: RedisServer;
let admin: Redis;
let receiver: Receiver;
let dir: string;
let inventoryFile: string;
let kubeconfigFile: string;
const secrets = makeSecrets('faults');
const running: OpsProcess[] = [];
const scmHeaders = () => ({ 'X-Scm-Token': secrets.scm, 'X-Scm-Event': 'Push Hook' });

async function api(extra: Record<string, string | undefined> = {}) {
  const p = await startApi({ env: await apiEnv(redis.url, secrets, { OPS_INVENTORY_FILE: inventoryFile, ...extra }) });
  running.push(p);
  return p;
}
async function worker(extra: Record<string, string | undefined> = {}) {
  const p = await startWorkerProcess({
    env: await workerEnv(redis.url, { NOTIFY_WEBHOOK_URLS: receiver.url, OPS_INVENTORY_FILE: inventoryFile, ...extra }),
  });
  running.push(p);
  return p;
}
const jobOf = async (id: string): Promise<Job | undefined> => {
  const q = inspectQueue(redis.url);
  try {
    return (await q.queue.getJob(id)) ?? undefined;
  } finally {
    await q.close();
  }
};
/** The job holding an event's deduplication record, or null (BullMQ's Queue#getDeduplicationJobId). */
const dedupJobOf = async (eventId: string): Promise<string | null> => {
  const q = inspectQueue(redis.url);
  try {
    return await q.queue.getDeduplicationJobId(eventId);
  } finally {
    await q.close();
  }
};
const stateOf = async (id: string) => {
  const q = inspectQueue(redis.url);
  try {
    return await q.queue.getJobState(id);
  } finally {
    await q.close();
  }
};
const allJobs = async () => {
  const q = inspectQueue(redis.url);
  try {
    return await q.all();
  } finally {
    await q.close();
  }
};
async function waitReady(p: { baseUrl: string }) {
  await waitFor('API /ready', async () => (await fetch(`${p.baseUrl}/ready`)).status === 200, 30_000, 100);
}

beforeAll(async () => {
  redis = await startRedis({ persistence: true });
  admin = new Redis(redis.url, { maxRetriesPerRequest: null });
  admin.on('error', () => {});
  receiver = await startReceiver();
  dir = mkdtempSync(join(tmpdir(), 'opsgate-faults-'));
  inventoryFile = join(dir, 'inventory.json');
  writeFileSync(
    inventoryFile,
    JSON.stringify({
      hosts: { 'web-01': { namespace: 'shop', deployments: ['web'] } },
      projects: { 'team/app': { namespace: 'ci', serviceAccountName: 'deployer', image: 'busybox:1.36', command: ['true'] } },
    }),
  );
  // A syntactically valid kubeconfig whose API server is a loopback port nobody listens on.
  kubeconfigFile = join(dir, 'kubeconfig.yaml');
  const closedPort = await freePort();
  writeFileSync(
    kubeconfigFile,
    [
      'apiVersion: v1',
      'kind: Config',
      'clusters:',
      `- name: down\n  cluster:\n    server: https://127.0.0.1:${closedPort}\n    insecure-skip-tls-verify: true`,
      'users:',
      '- name: u\n  user:\n    token: faults-test-token',
      'contexts:',
      '- name: c\n  context:\n    cluster: down\n    user: u',
      'current-context: c',
      '',
    ].join('\n'),
  );
}, 60_000);

beforeEach(async () => {
  receiver.posts.length = 0;
  receiver.status = () => 200;
  await admin.flushall();
});

afterEach(async () => {
  await Promise.all(running.splice(0).map((p) => p.stop()));
});

afterAll(async () => {
  admin?.disconnect();
  await receiver?.close();
  await redis?.destroy();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('worker killed with SIGKILL mid-job', () => {
  it('the job is recovered by stalled-job handling and completes', async () => {
    const knobs = { WORKER_LOCK_DURATION_MS: '2000', WORKER_STALLED_INTERVAL_MS: '1000', NOTIFY_TIMEOUT_MS: '60000' };
    const a = await api();
    // The first delivery attempt hangs: the worker is inside notify_oncall when it is killed.
    let release: () => void = () => {};
    receiver.status = () => new Promise<number>((r) => (release = () => r(200)));
    const w1 = await worker(knobs);
    const res = await post(`${a.baseUrl}/webhook/alerts`, alertPayload([{ fingerprint: 'stall-1', alertname: 'StallTest' }]));
    expect(res.status).toBe(202);
    await waitFor('the worker to be mid-job', () => receiver.posts.length === 1, 30_000, 50);
    const [job] = await allJobs();
    expect(job).toBeDefined();
    expect(await stateOf(job!.id!)).toBe('active');

    w1.kill('SIGKILL');
    expect((await w1.waitExit()).signal).toBe('SIGKILL');
    release();
    receiver.status = () => 200;

    const w2 = await worker(knobs);
    await waitFor('the job to complete', async () => (await stateOf(job!.id!)) === 'completed', 60_000, 200);
    await w2.waitForLog((l) => l.msg?.includes('stalled') === true && l.job_id === job!.id, 10_000);
    const done = await jobOf(job!.id!);
    expect(done?.finishedOn).toBeGreaterThan(0);
    expect(done?.failedReason ?? '').toBe('');
    // First POST cut off by the crash, second one delivered by the recovering worker.
    expect(receiver.posts.map((p) => p.body.fingerprint)).toEqual(['stall-1', 'stall-1']);
    expect(w2.logs().some((l) => l.msg === 'job completed' && l.job_id === job!.id)).toBe(true);
  }, 120_000);
});

describe('API killed with SIGKILL under load', () => {
  it('keeps every accepted job; deliveries cut off by the crash are accepted on retry; none lost or doubled', async () => {
    const a = await api();
    const ids = Array.from({ length: 400 }, (_, i) => `crash${i.toString(16).padStart(6, '0')}`);
    const answers = new Map<string, number>();
    let killed = false;
    const tasks = ids.map((id, i) => async () => {
      if (i === 150 && !killed) {
        killed = true;
        a.kill('SIGKILL');
      }
      try {
        const r = await post(`${a.baseUrl}/webhook/scm`, scmPush('team/lost-and-found', id), scmHeaders());
        answers.set(id, r.status === 202 && r.json?.accepted === true ? 202 : r.status);
      } catch {
        answers.set(id, -1); // connection refused / reset by the crash
      }
    });
    await pool(tasks, 16);
    expect((await a.waitExit()).signal).toBe('SIGKILL');
    const accepted = ids.filter((id) => answers.get(id) === 202);
    const cutOff = ids.filter((id) => answers.get(id) !== 202);
    expect(accepted.length).toBeGreaterThan(0);
    expect(cutOff.length).toBeGreaterThan(0);

    // Every 202 has its job in Redis.
    const eventIdsInQueue = (await allJobs()).map((j) => String(j.data.event_id));
    for (const id of accepted) expect(eventIdsInQueue).toContain(`scm:team/lost-and-found:refs/heads/main:${id}`);

    // The senders retry against a new API process: the cut-off ones are accepted, the others are duplicates.
    const b = await api();
    // A 503 (nothing queued: the queue did not answer in time, as on a loaded machine) is retried, as
    // the contract asks of a sender.
    const retried = await pool(
      ids.map((id) => async () => {
        let r = await post(`${b.baseUrl}/webhook/scm`, scmPush('team/lost-and-found', id), scmHeaders());
        await waitFor(
          `an answer other than 503 to the retried delivery ${id}`,
          async () => {
            if (r.status !== 503) return true;
            r = await post(`${b.baseUrl}/webhook/scm`, scmPush('team/lost-and-found', id), scmHeaders());
            return r.status !== 503;
          },
          60_000,
        );
        return { id, r };
      }),
      16,
    );
    for (const { id, r } of retried) {
      expect(r.status).toBe(202);
      if (accepted.includes(id)) expect(r.json).toMatchObject({ accepted: false, duplicate: true });
    }
    // Exactly one job per event in the end. (An event whose seen record was written but whose
    // enqueue was cut off by the SIGKILL would show up here as missing.)
    const final = (await allJobs()).map((j) => String(j.data.event_id));
    expect(final).toHaveLength(ids.length);
    expect(new Set(final)).toEqual(new Set(ids.map((id) => `scm:team/lost-and-found:refs/heads/main:${id}`)));

    // And a worker drains them all (unknown project: each dead-lettered once with its reason).
    await worker();
    await waitFor(
      'the worker to finish all jobs',
      async () => {
        const q = inspectQueue(redis.url);
        try {
          return (await q.counts()).failed === ids.length;
        } finally {
          await q.close();
        }
      },
      60_000,
      250,
    );
  }, 180_000);
});

describe('Redis stopped', () => {
  it('answers 503 {detail} + Retry-After where Redis is needed, keeps the rest up, and accepts the retry when Redis is back', async () => {
    const a = await api({ RATE_LIMIT_RPS: '1000' });
    const event = scmPush('team/outage', 'outage-sha-1');
    await redis.stop();
    try {
      for (const [path, body, headers] of [
        ['/webhook/scm', event, scmHeaders()],
        ['/webhook/alerts', alertPayload([{ fingerprint: 'outage-fp' }]), {}],
      ] as const) {
        const r = await post(`${a.baseUrl}${path}`, body, headers);
        expect(r.status).toBe(503);
        expect(Object.keys(r.json ?? {})).toEqual(['detail', 'code']);
        expect(typeof r.json?.detail).toBe('string');
        expect(['redis_unavailable', 'queue_unavailable']).toContain(r.json?.code);
        expect(Number(r.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      }
      const restart = await fetch(`${a.baseUrl}/ops/restart?host=web-01&service=web`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${secrets.bearer}` },
      });
      expect(restart.status).toBe(503);
      expect(restart.headers.get('retry-after')).not.toBeNull();
      expect(Object.keys((await restart.json()) as object)).toEqual(['detail', 'code']);
      // Liveness stays up; readiness says why not.
      expect((await fetch(`${a.baseUrl}/health`)).status).toBe(200);
      const ready = await fetch(`${a.baseUrl}/ready`);
      expect(ready.status).toBe(503);
      expect((await ready.json()) as object).toEqual({ detail: expect.any(String), code: 'redis_unavailable' });
      // Redis-free endpoint: the rate limiter fails open, auth works from memory.
      const hosts = await fetch(`${a.baseUrl}/ops/hosts`, { headers: { 'X-API-Key': secrets.readonlyKey } });
      expect(hosts.status).toBe(200);
      expect(await hosts.json()).toEqual({ hosts: ['web-01'] });
    } finally {
      await redis.start();
    }
    await waitReady(a);
    // The sender's retry is accepted (nothing was recorded during the outage), once.
    const retry = await post(`${a.baseUrl}/webhook/scm`, event, scmHeaders());
    expect(retry.status).toBe(202);
    expect(retry.json).toMatchObject({ accepted: true, duplicate: false });
    const again = await post(`${a.baseUrl}/webhook/scm`, event, scmHeaders());
    expect(again.json).toMatchObject({ accepted: false, duplicate: true });
    expect((await allJobs()).filter((j) => j.data.event_id === 'scm:team/outage:refs/heads/main:outage-sha-1')).toHaveLength(1);
    expect(a.logs().filter((l) => l.msg?.includes('failing open'))).not.toEqual([]);
    expect(a.exited).toBe(false);
  }, 120_000);

  it('enqueueing fails inside the add: no seen record is left, and the retry is accepted', async () => {
    const a = await api();
    // Make BullMQ's job-id counter unusable: its add script (which writes the deduplication
    // record and the job) fails at its INCR of bull:ops:id, before it wrote anything.
    const first = await post(`${a.baseUrl}/webhook/scm`, scmPush('team/rule9', 'warmup'), scmHeaders());
    expect(first.status).toBe(202);
    const idCounter = await admin.get('bull:ops:id');
    expect(idCounter).not.toBeNull();
    await admin.set('bull:ops:id', 'not-a-number');
    const event = scmPush('team/rule9', 'rule9-sha');
    const eventId = 'scm:team/rule9:refs/heads/main:rule9-sha';
    try {
      const r = await post(`${a.baseUrl}/webhook/scm`, event, scmHeaders());
      expect(r.status).toBe(503);
      expect(Object.keys(r.json ?? {})).toEqual(['detail', 'code']);
      expect(r.headers.get('retry-after')).not.toBeNull();
      expect(await dedupJobOf(eventId)).toBeNull();
    } finally {
      await admin.set('bull:ops:id', idCounter!);
    }
    const retry = await post(`${a.baseUrl}/webhook/scm`, event, scmHeaders());
    expect(retry.status).toBe(202);
    expect(retry.json).toMatchObject({ accepted: true, duplicate: false, event_id: eventId });
    expect(await dedupJobOf(eventId)).toBe(retry.json?.job_id);
    expect((await allJobs()).filter((j) => j.data.event_id === eventId)).toHaveLength(1);
  }, 60_000);
});

describe('Redis killed and restarted with AOF persistence', () => {
  it('keeps the dedup records and the queued jobs', async () => {
    const a = await api();
    const scm = scmPush('team/durable', 'durable-sha');
    const alerts = alertPayload([{ fingerprint: 'durable-fp', alertname: 'Durable' }]);
    expect((await post(`${a.baseUrl}/webhook/scm`, scm, scmHeaders())).json).toMatchObject({ accepted: true });
    expect((await post(`${a.baseUrl}/webhook/alerts`, alerts)).status).toBe(202);
    expect(await allJobs()).toHaveLength(2);

    // Crash, not a clean shutdown: SIGKILL the redis-server process.
    const pid = Number(/process_id:(\d+)/.exec(await admin.info('server'))![1]);
    process.kill(pid, 'SIGKILL');
    await waitFor(
      'redis to be gone',
      async () => {
        try {
          process.kill(pid, 0);
          return false;
        } catch {
          return true;
        }
      },
      10_000,
      50,
    );
    await redis.start();
    await waitReady(a);

    const dupScm = await post(`${a.baseUrl}/webhook/scm`, scm, scmHeaders());
    expect(dupScm.json).toMatchObject({ accepted: false, duplicate: true });
    expect((await post(`${a.baseUrl}/webhook/alerts`, alerts)).status).toBe(202);
    const jobs = await allJobs();
    expect(jobs.map((j) => j.name).sort()).toEqual(['ops_worker.notify_oncall', 'ops_worker.run_deploy_pipeline']);
    for (const j of jobs) expect(await stateOf(j.id!)).toBe('waiting');

    // And they run after the crash: the alert is delivered exactly once.
    await worker();
    await waitFor('the alert to be delivered', () => receiver.posts.length >= 1, 30_000, 100);
    await new Promise((r) => setTimeout(r, 500));
    expect(receiver.posts.map((p) => p.body.fingerprint)).toEqual(['durable-fp']);
  }, 120_000);
});

describe('downstream failures: retries with backoff, then dead letter with the reason', () => {
  const policy = { JOB_ATTEMPTS: '3', JOB_BACKOFF_MS: '300' };

  it('notification endpoint answering 503: 3 attempts with growing gaps, then dead-lettered', async () => {
    receiver.status = (b) => (b.fingerprint === 'refuse-404' ? 404 : 503);
    const a = await api(policy);
    const w = await worker();
    expect(
      (await post(`${a.baseUrl}/webhook/alerts`, alertPayload([{ fingerprint: 'fail-503' }, { fingerprint: 'refuse-404' }]))).status,
    ).toBe(202);
    const jobs = await allJobs();
    expect(jobs).toHaveLength(2);
    const byFp = (fp: string) => jobs.find((j) => j.data.fingerprint === fp)!;
    await waitFor(
      'both jobs dead-lettered',
      async () => (await stateOf(byFp('fail-503').id!)) === 'failed' && (await stateOf(byFp('refuse-404').id!)) === 'failed',
      60_000,
      100,
    );

    const failing = (await jobOf(byFp('fail-503').id!))!;
    expect(failing.attemptsMade).toBe(3);
    expect(failing.failedReason).toMatch(/HTTP 503/);
    const at = receiver.posts.filter((p) => p.body.fingerprint === 'fail-503').map((p) => p.at);
    expect(at).toHaveLength(3);
    // Exponential backoff from JOB_BACKOFF_MS=300: >= 300 ms, then >= 600 ms (lower bounds only).
    expect(at[1]! - at[0]!).toBeGreaterThanOrEqual(290);
    expect(at[2]! - at[1]!).toBeGreaterThanOrEqual(590);

    const refused = (await jobOf(byFp('refuse-404').id!))!;
    expect(refused.attemptsMade).toBe(1);
    expect(refused.failedReason).toMatch(/rejected/);
    expect(receiver.posts.filter((p) => p.body.fingerprint === 'refuse-404')).toHaveLength(1);

    const dead = w.logs().filter((l) => l.msg === 'job dead-lettered');
    expect(dead.map((l) => l.job_id).sort()).toEqual([byFp('fail-503').id, byFp('refuse-404').id].sort());
    for (const l of dead) expect(typeof l.reason).toBe('string');
    expect(w.logs().filter((l) => l.msg === 'job attempt failed; will retry' && l.job_id === byFp('fail-503').id)).toHaveLength(2);
  }, 120_000);

  it('Kubernetes API unreachable: restart and deploy jobs retried, then dead-lettered with the reason', async () => {
    const a = await api(policy);
    const w = await worker({ KUBECONFIG: kubeconfigFile });
    const restart = await fetch(`${a.baseUrl}/ops/restart?host=web-01&service=web`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${secrets.bearer}` },
    });
    expect(restart.status).toBe(200);
    const ack = (await restart.json()) as { job_id: string; status: string };
    expect(ack.status).toBe('submitted');
    const deploy = await post(`${a.baseUrl}/webhook/scm`, scmPush('team/app', 'k8s-down-sha'), scmHeaders());
    expect(deploy.json).toMatchObject({ accepted: true });
    const deployJob = (await allJobs()).find((j) => j.name === 'ops_worker.run_deploy_pipeline')!;

    for (const id of [ack.job_id, deployJob.id!]) {
      await waitFor(`job ${id} dead-lettered`, async () => (await stateOf(id)) === 'failed', 60_000, 100);
      const j = (await jobOf(id))!;
      expect(j.attemptsMade).toBe(3);
      expect(j.failedReason).toMatch(/Kubernetes API unreachable/);
      expect(j.failedReason).toMatch(/ECONNREFUSED/);
      expect(w.logs().filter((l) => l.msg === 'job attempt failed; will retry' && l.job_id === id)).toHaveLength(2);
    }
    // The caller can follow it: GET /ops/jobs/{id} shows the dead letter and its reason.
    const view = await fetch(`${a.baseUrl}/ops/jobs/${ack.job_id}`, { headers: { 'X-API-Key': secrets.readonlyKey } });
    expect(view.status).toBe(200);
    expect(await view.json()).toMatchObject({ state: 'failed', attempts_made: 3, failed_reason: expect.stringMatching(/unreachable/) });
  }, 120_000);
});
