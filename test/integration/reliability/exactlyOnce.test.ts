/**
 * Exactly-once intake under concurrency, with the real processes: two API processes
 * (dist/src/server.js) on one real redis-server receive 5,000 webhook deliveries from 32
 * concurrent clients: 2,500 scm pushes and 2,500 Alertmanager notifications, every event sent
 * twice (half of the deliveries are duplicates), the two copies going to different API
 * processes, half of the pairs sent at the same instant (a real race on the seen record).
 * A real worker (dist/worker/index.js) drains the queue while the deliveries arrive.
 *
 * What "processed" means here, observed from outside the worker:
 * - notify_oncall: the worker POSTs each alert to NOTIFY_WEBHOOK_URLS; a local receiver counts
 *   the POSTs per fingerprint: exactly one per unique firing alert.
 * - run_deploy_pipeline: the project is not in the (empty) inventory, so the worker's first and
 *   only attempt ends the job as dead-lettered (UnrecoverableError, "not in the inventory"):
 *   exactly one failed job per unique event_id, each with attemptsMade 1; no Kubernetes needed.
 * Plus the queue itself: exactly one job per unique event, none for resolved alerts or alerts
 * without a fingerprint, and the worker logged exactly one final outcome per job id.
 * RATE_LIMIT_RPS=0 (all deliveries come from one address).
 */
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { startApi, startWorkerProcess, type OpsProcess } from '../../helpers/processes.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import {
  alertPayload,
  apiEnv,
  inspectQueue,
  makeSecrets,
  pool,
  post,
  scmPush,
  shuffle,
  startReceiver,
  waitFor,
  workerEnv,
  type Receiver,
} from '../../helpers/reliability.js';

const UNIQUE_SCM = 1250;
const UNIQUE_ALERTS = 1250;
const CONCURRENCY = 32;

let redis: RedisServer;
let apiA: OpsProcess & { baseUrl: string };
let apiB: OpsProcess & { baseUrl: string };
let worker: OpsProcess;
let receiver: Receiver;
const secrets = makeSecrets('once');

beforeAll(async () => {
  redis = await startRedis();
  receiver = await startReceiver();
  [apiA, apiB] = await Promise.all([
    startApi({ env: await apiEnv(redis.url, secrets) }),
    startApi({ env: await apiEnv(redis.url, secrets) }),
  ]);
  worker = await startWorkerProcess({
    env: await workerEnv(redis.url, {
      NOTIFY_WEBHOOK_URLS: receiver.url,
      // This test counts the alerts' posts: the ends of restarts and deploys are not posted (test/integration/worker/outcomes.test.ts covers them).
      REPORT_OUTCOMES: 'none',
      WORKER_CONCURRENCY: '16',
      JOB_BACKOFF_MS: '100',
      NOTIFY_TIMEOUT_MS: '60000',
    }),
  });
}, 120_000);

afterAll(async () => {
  await Promise.all([apiA?.stop(), apiB?.stop(), worker?.stop()]);
  await receiver?.close();
  await redis?.destroy();
});

type Delivery = { kind: 'scm' | 'alert'; id: string; copy: 0 | 1 };
type Answer = Delivery & { status: number; json: Record<string, unknown> | undefined };

describe('exactly-once intake: 2 API processes, 1 redis, 5,000 deliveries, half duplicates', () => {
  it('enqueues and processes exactly one job per unique event; none lost, none twice', async () => {
    const run = Date.now().toString(36);
    const scmIds = Array.from({ length: UNIQUE_SCM }, (_, i) => `${run}${i.toString(16).padStart(8, '0')}`);
    const alertIds = Array.from({ length: UNIQUE_ALERTS }, (_, i) => `fp-${run}-${i}`);

    const send = async (d: Delivery): Promise<Answer> => {
      const base = d.copy === 0 ? apiA.baseUrl : apiB.baseUrl;
      if (d.kind === 'scm') {
        const r = await post(`${base}/webhook/scm`, scmPush('team/exactly-once', d.id), {
          'X-Scm-Token': secrets.scm,
          'X-Scm-Event': 'Push Hook',
        });
        return { ...d, status: r.status, json: r.json };
      }
      // Every 5th alert delivery also carries a resolved alert and a firing alert without a
      // fingerprint: counted in the answer, never queued.
      const i = Number(d.id.split('-').pop());
      const extra = i % 5 === 0 ? [{ status: 'resolved', fingerprint: `resolved-${d.id}` }, { status: 'firing' }] : [];
      const r = await post(
        `${base}/webhook/alerts`,
        alertPayload([{ fingerprint: d.id, alertname: 'ExactlyOnce', summary: d.id }, ...extra]),
      );
      return { ...d, status: r.status, json: r.json };
    };

    // Tasks: half of the events as a simultaneous pair (both copies at once, one per API),
    // the other half as two independent deliveries scattered through the run.
    const events: Array<{ kind: 'scm' | 'alert'; id: string }> = [
      ...scmIds.map((id) => ({ kind: 'scm' as const, id })),
      ...alertIds.map((id) => ({ kind: 'alert' as const, id })),
    ];
    const tasks: Array<() => Promise<Answer[]>> = [];
    events.forEach((e, i) => {
      if (i % 2 === 0) tasks.push(() => Promise.all([send({ ...e, copy: 0 }), send({ ...e, copy: 1 })]));
      else {
        tasks.push(async () => [await send({ ...e, copy: 0 })]);
        tasks.push(async () => [await send({ ...e, copy: 1 })]);
      }
    });
    const started = Date.now();
    const answers = (await pool(shuffle(tasks), CONCURRENCY)).flat();
    const intakeMs = Date.now() - started;
    expect(answers).toHaveLength(2 * (UNIQUE_SCM + UNIQUE_ALERTS));

    // --- the HTTP answers
    const bad = answers.filter((a) => a.status !== 202);
    expect(bad.slice(0, 5)).toEqual([]);
    const scmAnswers = answers.filter((a) => a.kind === 'scm');
    const acceptedPer = new Map<string, number>();
    for (const a of scmAnswers) {
      expect(a.json?.duplicate).toBe(!a.json?.accepted);
      expect(a.json?.event_id).toBe(`scm:team/exactly-once:refs/heads/main:${a.id}`);
      if (a.json?.accepted === true) acceptedPer.set(a.id, (acceptedPer.get(a.id) ?? 0) + 1);
    }
    expect(acceptedPer.size).toBe(UNIQUE_SCM);
    expect([...acceptedPer.values()].every((n) => n === 1)).toBe(true);
    for (const a of answers.filter((x) => x.kind === 'alert')) {
      const i = Number(a.id.split('-').pop());
      // Spec fields exactly, plus job_ids: the jobs this copy queued.
      expect(a.json).toEqual(
        i % 5 === 0 ? { received: 3, firing: 2, job_ids: expect.any(Array) } : { received: 1, firing: 1, job_ids: expect.any(Array) },
      );
    }
    // Both API processes took part in accepting events.
    const acceptedByA = scmAnswers.filter((a) => a.json?.accepted === true && a.copy === 0).length;
    expect(acceptedByA).toBeGreaterThan(0);
    expect(acceptedByA).toBeLessThan(UNIQUE_SCM);

    // --- the worker drains: every unique alert posted once, every deploy job finished once
    const q = inspectQueue(redis.url);
    try {
      await waitFor(
        'the worker to finish every job',
        async () => {
          const c = await q.counts();
          return c.completed === UNIQUE_ALERTS && c.failed === UNIQUE_SCM && c.waiting + c.active + c.delayed === 0;
        },
        120_000,
        250,
      );
      // Give a late duplicate (if there were one) the time to show up before counting.
      await new Promise((r) => setTimeout(r, 1500));

      // --- the queue: exactly one job per unique event, nothing else
      const jobs = await q.all();
      expect(jobs).toHaveLength(UNIQUE_SCM + UNIQUE_ALERTS);
      const deploys = jobs.filter((j) => j.name === 'ops_worker.run_deploy_pipeline');
      const notifies = jobs.filter((j) => j.name === 'ops_worker.notify_oncall');
      expect(deploys).toHaveLength(UNIQUE_SCM);
      expect(notifies).toHaveLength(UNIQUE_ALERTS);
      expect(new Set(deploys.map((j) => j.data.event_id))).toEqual(
        new Set(scmIds.map((id) => `scm:team/exactly-once:refs/heads/main:${id}`)),
      );
      expect(new Set(notifies.map((j) => j.data.fingerprint))).toEqual(new Set(alertIds));
      // The API's audit lines tell the same story: one "accepted" line per unique event, naming its job.
      const audited = [...apiA.logs(), ...apiB.logs()].filter((l) => l.msg === 'audit' && l.path === '/webhook/scm');
      expect(audited).toHaveLength(2 * UNIQUE_SCM);
      const acceptedLines = audited.filter((l) => l.outcome === 'accepted');
      expect(new Set(acceptedLines.map((l) => String(l.job_id)))).toEqual(new Set(deploys.map((j) => String(j.id))));
      expect(audited.filter((l) => l.outcome === 'duplicate')).toHaveLength(UNIQUE_SCM);
      for (const j of deploys) {
        expect(await j.getState()).toBe('failed');
        expect(j.attemptsMade).toBe(1);
        expect(j.failedReason).toContain('not in the inventory');
      }
      for (const j of notifies) {
        expect(j.finishedOn).toBeGreaterThan(0);
        // (the earlier attempt's error, if any, is in the stack trace list)
        expect({ id: j.id, attemptsMade: j.attemptsMade, errors: j.stacktrace }).toEqual({ id: j.id, attemptsMade: 1, errors: [] });
      }
    } finally {
      await q.close();
    }

    // --- the side effect: one POST per unique firing alert, no more
    const perFingerprint = new Map<string, number>();
    for (const p of receiver.posts) {
      const fp = String(p.body.fingerprint);
      perFingerprint.set(fp, (perFingerprint.get(fp) ?? 0) + 1);
    }
    expect(receiver.posts).toHaveLength(UNIQUE_ALERTS);
    expect(new Set(perFingerprint.keys())).toEqual(new Set(alertIds));
    expect([...perFingerprint.values()].every((n) => n === 1)).toBe(true);

    // --- the worker's own account: one final outcome per job id
    const finals = worker.logs().filter((l) => l.msg === 'job completed' || l.msg === 'job dead-lettered');
    const ids = finals.map((l) => String(l.job_id));
    expect(ids).toHaveLength(UNIQUE_SCM + UNIQUE_ALERTS);
    expect(new Set(ids).size).toBe(ids.length);

    // Nothing went wrong anywhere along the way.
    for (const p of [apiA, apiB, worker]) {
      expect(p.logs().filter((l) => l.level === 'error' && l.msg !== 'job dead-lettered')).toEqual([]);
      expect(p.exited).toBe(false);
    }
    process.stderr.write(`[exactly-once] ${answers.length} deliveries in ${intakeMs} ms\n`);
  }, 240_000);
});
