import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import request from 'supertest';
import { createFreezeStore } from '../../../src/changes/freezes/store.js';
import { concurrencyGroup } from '../../../src/changes/deployOrder/store.js';
import { parseInventory } from '../../../src/shared/inventory.js';
import { JOB } from '../../../src/shared/jobs.js';
import { startWorker, type WorkerHandle } from '../../../worker/index.js';
import { OP_KEY, OP_KEY_2, RO_KEY, SCM_SECRET, useHarness } from '../../helpers/apiHarness.js';
import { startRefusingWebhook, useDeployNamespace, type RefusingWebhook } from '../../helpers/deployJobs.js';
import { decide } from '../../helpers/guards.js';
import { waitFor } from '../../helpers/waitFor.js';
import { collectLogs, metricValue, testMetrics, workerConfig } from '../../helpers/workerSupport.js';

jest.setTimeout(120_000);

/**
 * Deploys in order (src/changes/deployOrder/), on real Redis, through the real app and the real
 * worker (startWorker, its processor and deploy handler), against the real kube-apiserver and Job
 * controller of the shared control plane. No kubelet runs here: test/helpers/deployJobs.ts ends
 * each Job's pod through its status subresource, and reads from the apiserver's watch of the
 * namespace's Jobs which deploys ran, in what order, and whether two ever ran at once. A
 * ValidatingWebhookConfiguration answers the create of one commit's Job with a 503.
 */
const NS = 'dord-deploy';
const INVENTORY_YAML = `
projects:
  group/app:
    namespace: ${NS}
    serviceAccountName: deployer
    image: alpine:3.20
  group/approved:
    namespace: ${NS}
    serviceAccountName: deployer
    image: alpine:3.20
    policy:
      approval: {required: 1, ttl: 1h}
  site/web:
    namespace: ${NS}
    serviceAccountName: deployer
    image: alpine:3.20
    concurrency: {group: "site-{ref}"}
`;
const inventory = parseInventory(INVENTORY_YAML);
const ctx = useHarness({ inventoryYaml: INVENTORY_YAML });

/** How long a Job's pod runs before the test ends it (a deploy's own pace, not a wait of the test). */
const RUN_MS = 400;

const deployNs = useDeployNamespace(NS, RUN_MS);
let webhook: RefusingWebhook;
/** Commits whose Job's pod fails (its deploy is dead-lettered), and whose first create is answered 503 (retried after its backoff). */
const failing = new Set<string>();
const unavailableOnce = new Set<string>();

beforeAll(async () => {
  deployNs.kube.fail = (sha) => failing.has(sha);
  webhook = await startRefusingWebhook(deployNs.admin, NS, (sha) =>
    unavailableOnce.delete(sha) ? { code: 503, message: 'the deploy admission is down for a moment' } : undefined,
  );
});

afterAll(async () => {
  await webhook?.close();
});

/** The real worker for one test: 2 attempts, a backoff no test waits out (a retry is promoted by hand). */
async function withWorker<T>(fn: (w: WorkerHandle & { metrics: ReturnType<typeof testMetrics> }) => Promise<T>): Promise<T> {
  deployNs.kube.reset();
  const metrics = testMetrics();
  const w = await startWorker(
    workerConfig({ REDIS_URL: ctx.srv.url, JOB_ATTEMPTS: '2', JOB_BACKOFF_MS: '600000', ROLLOUT_POLL_INTERVAL_MS: '50' }),
    { logger: collectLogs().logger, metrics, inventory, kubeConfig: () => deployNs.admin },
  );
  try {
    return await fn(Object.assign(w, { metrics }));
  } finally {
    await w.close(1000);
  }
}

const push = (project: string, sha: string) =>
  request(ctx.h.app)
    .post('/webhook/scm')
    .set('Content-Type', 'application/json')
    .set({ 'X-Scm-Token': SCM_SECRET, 'X-Scm-Event': 'Push Hook' })
    .send(JSON.stringify({ ref: 'refs/heads/main', checkout_sha: sha, project: { path_with_namespace: project } }));

async function pushed(project: string, sha: string): Promise<string> {
  const res = await push(project, sha);
  expect(res.status).toBe(202);
  return res.body.job_id as string;
}

/** The job once it is completed or failed: its state and the outcome it recorded. */
const finished = (id: string) =>
  waitFor(`job ${id} finished`, async () => {
    const job = await ctx.h.queue.bull.getJob(id);
    const state = job ? await job.getState() : 'missing';
    if (state !== 'completed' && state !== 'failed') return false;
    const progress = (job!.progress ?? {}) as { outcome?: { result: string; reason?: string } };
    return { state, outcome: progress.outcome, job: job! };
  });

describe('one deploy at a time per group, the newest last', () => {
  it('three pushes of one project within a second: never two at once; the newest runs last; every other one was superseded or had finished before it started', async () => {
    await withWorker(async (w) => {
      const ids = [await pushed('group/app', 'aaa1'), await pushed('group/app', 'aaa2'), await pushed('group/app', 'aaa3')];
      const ends = await Promise.all(ids.map(finished));
      expect(deployNs.kube.mostAtOnce).toBe(1);
      const newest = deployNs.kube.jobs.find((j) => j.queueJobId === ids[2]);
      expect(newest).toBeDefined();
      expect(deployNs.kube.jobs.at(-1)).toBe(newest);
      expect(ends[2]!.outcome?.result).toBe('rolled_out');
      for (const [i, end] of ends.slice(0, 2).entries()) {
        const mine = deployNs.kube.jobs.find((j) => j.queueJobId === ids[i]);
        if (end.outcome?.result === 'superseded') {
          expect(mine).toBeUndefined();
          expect(end.state).toBe('completed');
          expect(ids.map((id) => `superseded by deploy ${id}, accepted after it`)).toContain(end.outcome.reason);
        } else {
          expect(mine!.ended).toBeLessThan(newest!.created);
          expect(mine!.succeeded).toBe(true);
        }
      }
      // However the worker interleaved them, three pushes in a second supersede at least one.
      const superseded = ends.filter((e) => e.outcome?.result === 'superseded').length;
      expect(superseded).toBeGreaterThanOrEqual(1);
      expect(await metricValue(w.metrics, 'opsgate_change_outcomes_total', { change: 'deploy', result: 'superseded' })).toBe(superseded);
      // GET /ops/jobs/{id} shows the outcome.
      const sup = ids[ends.findIndex((e) => e.outcome?.result === 'superseded')]!;
      const view = await request(ctx.h.app).get(`/ops/jobs/${sup}`).set('X-API-Key', RO_KEY);
      expect(view.body.outcome).toMatchObject({ result: 'superseded' });
    });
  });

  it('a concurrency group of the inventory: {ref} filled in, another project naming the same group shares it', () => {
    expect(concurrencyGroup(inventory, 'site/web', 'refs/heads/main')).toBe('site-refs/heads/main');
    expect(concurrencyGroup(inventory, 'group/app', 'refs/heads/main')).toBe('group/app:refs/heads/main');
    expect(() =>
      parseInventory('projects:\n  a/b:\n    namespace: x\n    serviceAccountName: d\n    image: i\n    concurrency: {group: "{sha}"}\n'),
    ).toThrow(/\{project\} and \{ref\}/);
  });
});

describe('never an older deploy after a newer one', () => {
  it("a deploy failing once with a 503 from the API server: the worker's own retry after a newer deploy ran ends superseded and creates no Job", async () => {
    await withWorker(async () => {
      unavailableOnce.add('bbb1');
      const older = await pushed('group/app', 'bbb1');
      // Its first attempt failed on the apiserver's 503; its retry waits out a backoff no test waits for.
      const first = await waitFor('the retry scheduled', async () => {
        const job = await ctx.h.queue.bull.getJob(older);
        return job?.attemptsMade === 1 && (await job.isDelayed()) ? job : false;
      });
      expect(first.failedReason).toMatch(/Kubernetes API error 503 while trying to create Job/);
      expect(first.failedReason).toContain('the deploy admission is down for a moment');
      const newer = await pushed('group/app', 'bbb2');
      expect((await finished(newer)).outcome?.result).toBe('rolled_out');
      await (await ctx.h.queue.bull.getJob(older))!.promote();
      const end = await finished(older);
      expect(end).toMatchObject({
        state: 'completed',
        outcome: { result: 'superseded', reason: `superseded by deploy ${newer}, accepted after it` },
      });
      expect(deployNs.kube.jobs.map((j) => j.sha)).toEqual(['bbb2']);
      // The retry asked the apiserver nothing: one refused create, one admitted.
      expect(webhook.answers.filter((a) => a.sha.startsWith('bbb'))).toEqual([
        { sha: 'bbb1', dryRun: false, code: 503 },
        { sha: 'bbb2', dryRun: false },
      ]);
    });
  });

  it('a held deploy released after a newer one ran ends superseded', async () => {
    await withWorker(async () => {
      const frozen = await request(ctx.h.app)
        .post('/ops/freezes')
        .set('X-API-Key', OP_KEY)
        .set('Content-Type', 'application/json')
        .send(JSON.stringify({ scope: 'project', project: 'group/app', reason: 'release train', duration: '2h' }));
      expect(frozen.status).toBe(201);
      const held = await push('group/app', 'ccc1');
      expect(held.body).toMatchObject({ status: 'held' });
      // The freeze ends without releasing its holds (as when it runs out): the hold is due later.
      await createFreezeStore(ctx.h.redis).remove(frozen.body.id as string, Date.now());
      await ctx.h.freezesFlushed();
      const newer = await pushed('group/app', 'ccc2');
      expect((await finished(newer)).outcome?.result).toBe('rolled_out');
      await (await ctx.h.queue.bull.getJob(held.body.job_id as string))!.promote();
      const end = await finished(held.body.job_id as string);
      expect(end.outcome).toMatchObject({ result: 'superseded', reason: `superseded by deploy ${newer}, accepted after it` });
      expect(deployNs.kube.jobs.map((j) => j.sha)).toEqual(['ccc2']);
    });
  });
});

describe('409 superseded where a person asks to run an older deploy again', () => {
  it("a dead letter's retry after a newer deploy started: 409 naming it; nothing queued", async () => {
    await withWorker(async () => {
      // Its Job's pod fails: the Job controller fails the Job, and the deploy is dead-lettered.
      failing.add('ddd1');
      const older = await pushed('group/app', 'ddd1');
      expect((await finished(older)).state).toBe('failed');
      expect(deployNs.kube.jobs.find((j) => j.sha === 'ddd1')).toMatchObject({ succeeded: false });
      const newer = await pushed('group/app', 'ddd2');
      expect((await finished(newer)).outcome?.result).toBe('rolled_out');
      const res = await request(ctx.h.app)
        .post(`/ops/jobs/${older}/retry`)
        .set('X-API-Key', OP_KEY)
        .set('Content-Type', 'application/json')
        .send(JSON.stringify({ reason: 'try again' }));
      expect(res.status).toBe(409);
      expect(res.body).toMatchObject({ code: 'superseded' });
      expect(res.body.detail).toContain(`deploy ${newer} of its group`);
      expect(res.body.detail).toMatch(/roll back|rollback/);
      expect(await ctx.h.queue.bull.getJob(`${older}.retry`)).toBeUndefined();
      // The audit line of the request names the answer.
      expect(ctx.h.audits().at(-1)).toMatchObject({ status: 409 });
    });
  });

  it('a replay of a recorded delivery older than a started deploy: 409; the newest delivery replays', async () => {
    await withWorker(async () => {
      const older = await pushed('group/app', 'eee1');
      const newer = await pushed('group/app', 'eee2');
      await finished(older);
      expect((await finished(newer)).outcome?.result).toBe('rolled_out');
      const deliveries = await waitFor('two deliveries logged', async () => {
        const res = await request(ctx.h.app).get('/ops/deliveries?source=scm').set('X-API-Key', RO_KEY);
        const list = res.body.deliveries as Array<{ id: string; job_id: string | null }>;
        return list.length >= 2 ? list : false;
      });
      const replay = (id: string) =>
        request(ctx.h.app)
          .post(`/ops/deliveries/${id}/replay`)
          .set('X-API-Key', OP_KEY)
          .set('Content-Type', 'application/json')
          .send(JSON.stringify({ reason: 'redeploy' }));
      const old = await replay(deliveries.find((d) => d.job_id === older)!.id);
      expect(old.status).toBe(409);
      expect(old.body).toMatchObject({ code: 'superseded' });
      expect(old.body.detail).toContain(`deploy ${newer} of its group`);
      // The newest one's replay is no older than what started: answered as any replay (within the
      // event's day, a duplicate of its job).
      const latest = await replay(deliveries.find((d) => d.job_id === newer)!.id);
      expect(latest.status).toBe(200);
      expect(latest.body).toMatchObject({ replayed: true, duplicate: true, job_id: newer });
    });
  });

  it('the last approval of an older pending deploy after a newer one started: 409, and the approval ends superseded', async () => {
    await withWorker(async () => {
      const older = await push('group/approved', 'fff1');
      const newer = await push('group/approved', 'fff2');
      expect(older.body).toMatchObject({ status: 'pending_approval' });
      expect(newer.body).toMatchObject({ status: 'pending_approval' });
      const ok = await decide(ctx.h.app, newer.body.approval_id as string, 'approve', OP_KEY);
      expect(ok.body).toMatchObject({ status: 'approved' });
      expect((await finished(newer.body.approval_id as string)).outcome?.result).toBe('rolled_out');
      const late = await decide(ctx.h.app, older.body.approval_id as string, 'approve', OP_KEY_2);
      expect(late.status).toBe(409);
      expect(late.body).toMatchObject({ code: 'superseded' });
      expect(late.body.detail).toContain(`deploy ${newer.body.approval_id as string} of its group`);
      const view = await request(ctx.h.app)
        .get(`/ops/approvals/${older.body.approval_id as string}`)
        .set('X-API-Key', RO_KEY);
      expect(view.body).toMatchObject({ status: 'superseded', superseded_by: newer.body.approval_id });
      const job = await request(ctx.h.app)
        .get(`/ops/jobs/${older.body.approval_id as string}`)
        .set('X-API-Key', RO_KEY);
      expect(job.body).toMatchObject({ state: 'superseded', outcome: { result: 'superseded' } });
      expect(
        (await ctx.h.queue.bull.getJobs(['waiting', 'delayed', 'active', 'completed', 'failed']))
          .filter((j) => j.name === JOB.runDeployPipeline)
          .map((j) => j.id),
      ).toEqual([newer.body.approval_id]);
    });
  });
});
