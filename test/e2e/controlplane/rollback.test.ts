import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import * as k8s from '@kubernetes/client-node';
import request from 'supertest';
import type { Express } from 'express';
import { createApp } from '../../../src/app.js';
import { createKubeHostStatusProvider } from '../../../src/domain/kubeHostStatus.js';
import { loadApiConfig, secretsOf } from '../../../src/api/config.js';
import { loadWorkerConfig } from '../../../src/shared/config.js';
import { parseInventory } from '../../../src/shared/inventory.js';
import { createLogger } from '../../../src/shared/logger.js';
import { createMetrics } from '../../../src/shared/metrics.js';
import { createOpsQueue, type OpsQueue } from '../../../src/api/queue.js';
import { createRedis } from '../../../src/shared/redis.js';
import { startWorker, type WorkerHandle } from '../../../worker/index.js';
import { kubectl, ok, useCluster } from '../../helpers/cluster.js';
import { adminKubeConfig, createNamespaces, deleteNamespaces } from '../../helpers/controlPlaneFixtures.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { waitFor } from '../../helpers/waitFor.js';

jest.setTimeout(180_000);

/**
 * Rollback (POST /ops/deploys/rollback) against a real kube-apiserver and kube-controller-manager,
 * the real worker and the API in process on a real Redis. No kubelet: the job controller creates a
 * deploy Job's pod, and the test ends the Job's run by writing the pod's status phase Succeeded
 * (the job controller then marks the Job complete, and the worker sees it end).
 * - to the previous commit (the default) and to a named one: the Job carries the commit and
 *   OPSGATE_ROLLBACK=true; GET /ops/deploys lists it with origin rollback and the deploy it went
 *   back from, and GET /ops/projects names it current once it succeeded;
 * - a commit that never succeeded: 409 rollback_target_unknown, nothing queued;
 * - a second rollback is a new deploy, never a duplicate;
 * - under a freeze: held, and run when the freeze is lifted; let through by a person's override,
 *   run while it stands; with an approval policy: pending, then run once approved;
 * - during a running deploy: it waits for its turn, then runs.
 */
const OP_KEY = 'k8s-rollback-test-operator-0001';
const OP_KEY_2 = 'k8s-rollback-test-operator-0002';
const RO_KEY = 'k8s-rollback-test-readonly-0001';
const NS = 'rbk-deploy';
const REF = 'refs/heads/main';
const sha = (c: string) => c.repeat(40);

const INVENTORY = parseInventory(`
projects:
  shop/web:
    namespace: ${NS}
    serviceAccountName: deployer
    image: alpine:3.20
    deploy_from: ci
  shop/guarded:
    namespace: ${NS}
    serviceAccountName: deployer
    image: alpine:3.20
    deploy_from: ci
    policy:
      approval: {required: 1, ttl: 1h}
`);

interface DeployView {
  id: string;
  commit: string | null;
  origin: string;
  state: string;
  kubernetes_job: string | null;
  rolled_back_from: string | null;
}

describe('rollback on a real API server, with the real worker', () => {
  let cluster: Awaited<ReturnType<typeof useCluster>>;
  let admin: k8s.KubeConfig;
  let redis: RedisServer;
  let queue: OpsQueue;
  let worker: WorkerHandle | undefined;
  let app: Express;
  const close: Array<() => Promise<void> | void> = [];

  beforeAll(async () => {
    cluster = await useCluster();
    admin = adminKubeConfig(cluster);
    await createNamespaces(cluster, [NS]);
    ok(await kubectl(cluster.kubeconfigPath, ['-n', NS, 'create', 'serviceaccount', 'deployer']), 'create deployer SA');
    redis = await startRedis();
    worker = await startWorker(loadWorkerConfig({ REDIS_URL: redis.url, ROLLOUT_POLL_INTERVAL_MS: '200', JOB_ATTEMPTS: '1' }), {
      inventory: INVENTORY,
      logger: createLogger({ level: 'warn', write: () => {} }),
      kubeConfig: () => admin,
    });
    const config = loadApiConfig({
      OPS_API_KEY_ROLES: `${RO_KEY}:readonly,${OP_KEY}:operator,${OP_KEY_2}:operator`,
      REDIS_URL: redis.url,
      RATE_LIMIT_RPS: '0',
    });
    const logger = createLogger({ level: 'warn', secrets: secretsOf(config), write: () => {} });
    const metrics = createMetrics('api', 'test', { defaults: false });
    const requestRedis = createRedis(redis.url, 'request', 'k8s-rollback-api');
    queue = createOpsQueue({ url: redis.url, policy: { attempts: 1, backoffMs: 100 }, logger, metrics });
    await queue.bull.waitUntilReady();
    close.push(
      () => queue.close(),
      () => requestRedis.disconnect(),
    );
    app = createApp({
      config,
      redis: requestRedis,
      queue,
      inventory: INVENTORY,
      logger,
      metrics,
      hostStatus: createKubeHostStatusProvider(() => admin),
    });
  }, 120_000);

  afterAll(async () => {
    await worker?.close(5000);
    for (const c of close) await c();
    await redis?.destroy();
    if (cluster) {
      await deleteNamespaces(cluster, [NS]);
      await cluster.release();
    }
  }, 60_000);

  const post = (path: string, body: unknown, key = OP_KEY) =>
    request(app).post(path).set('X-API-Key', key).set('Content-Type', 'application/json').send(JSON.stringify(body));
  const view = async (id: string): Promise<DeployView> => {
    const res = await request(app).get(`/ops/deploys/${id}`).set('X-API-Key', RO_KEY);
    return res.body as DeployView;
  };
  const inState = (id: string, state: string, timeoutMs = 60_000) =>
    waitFor(
      `deploy ${id} ${state}`,
      async () => {
        const v = await view(id);
        return v.state === state && (state !== 'running' || v.kubernetes_job) ? v : false;
      },
      timeoutMs,
      200,
    );
  // A deploy is recorded running just before its worker creates the Job: the Job once it exists.
  const jobOf = (name: string) =>
    waitFor(`Job ${name}`, () => admin.makeApiClient(k8s.BatchV1Api).readNamespacedJob({ name, namespace: NS }), 30_000, 100);
  const envOf = async (name: string) =>
    Object.fromEntries(((await jobOf(name)).spec!.template.spec!.containers[0]!.env ?? []).map((e) => [e.name, e.value]));

  /** Ends the run of a deploy Job: its pod's phase Succeeded, written as the kubelet would. */
  async function succeed(jobName: string): Promise<void> {
    const core = admin.makeApiClient(k8s.CoreV1Api);
    await waitFor(
      `the pod of ${jobName} succeeded`,
      async () => {
        const pod = (await core.listNamespacedPod({ namespace: NS, labelSelector: `job-name=${jobName}` })).items[0];
        if (!pod) return false;
        if (pod.status?.phase === 'Succeeded') return true;
        await core.replaceNamespacedPodStatus({
          name: pod.metadata!.name!,
          namespace: NS,
          body: { ...pod, status: { ...pod.status, phase: 'Succeeded' } },
        });
        return false;
      },
      60_000,
      200,
    );
  }

  /** Runs a deploy to its end: waits for it to run, ends its Job's run, waits for it to succeed. */
  async function runToSuccess(id: string): Promise<DeployView> {
    const running = await inState(id, 'running');
    await succeed(running.kubernetes_job!);
    return inState(id, 'succeeded');
  }

  /** A CI deploy of `commit`, approved when its project asks for it, run to success: its id. */
  async function deployed(project: string, commit: string): Promise<string> {
    const res = await post('/ops/deploys', { project, ref: REF, sha: commit });
    expect(res.status).toBe(202);
    if (res.body.status === 'pending_approval') {
      const ok = await post(`/ops/approvals/${res.body.approval_id}/approve`, { reason: 'ship it' }, OP_KEY_2);
      expect(ok.status).toBe(200);
    }
    await runToSuccess(res.body.job_id as string);
    return res.body.job_id as string;
  }

  const rollback = (body: Record<string, unknown>) => post('/ops/deploys/rollback', { ref: REF, reason: 'bad release', ...body });

  it('rolls back to the previous commit by default, then to a named one: the Job gets the commit and OPSGATE_ROLLBACK=true', async () => {
    const first = await deployed('shop/web', sha('a'));
    const second = await deployed('shop/web', sha('b'));

    const back = await rollback({ project: 'shop/web' });
    expect(back.status).toBe(202);
    expect(back.body).toMatchObject({
      sha: sha('a'),
      rolled_back_from: second,
      rolled_back_to: first,
      accepted: true,
      duplicate: false,
      status: 'queued',
    });
    expect(back.body.event_id).toMatch(/^rollback:/);
    const running = await inState(back.body.job_id, 'running');
    expect(await envOf(running.kubernetes_job!)).toMatchObject({ OPSGATE_COMMIT_SHA: sha('a'), OPSGATE_ROLLBACK: 'true' });
    await succeed(running.kubernetes_job!);
    await inState(back.body.job_id, 'succeeded');

    const list = await request(app).get('/ops/deploys?project=shop%2Fweb&limit=1').set('X-API-Key', RO_KEY);
    expect(list.body.deploys[0]).toMatchObject({
      id: back.body.job_id,
      origin: 'rollback',
      commit: sha('a'),
      state: 'succeeded',
      rolled_back_from: second,
    });
    const project = await request(app).get('/ops/projects/shop%2Fweb').set('X-API-Key', RO_KEY);
    expect(project.body.refs).toEqual([expect.objectContaining({ ref: REF, current: expect.objectContaining({ id: back.body.job_id }) })]);

    // Named: the commit b, which succeeded before; the rollback just run is the current one.
    const named = await rollback({ project: 'shop/web', to: sha('b') });
    expect(named.status).toBe(202);
    expect(named.body).toMatchObject({ sha: sha('b'), rolled_back_from: back.body.job_id, rolled_back_to: second });
    const v = await runToSuccess(named.body.job_id);
    expect(await envOf(v.kubernetes_job!)).toMatchObject({ OPSGATE_COMMIT_SHA: sha('b'), OPSGATE_ROLLBACK: 'true' });
    // A deploy that is no rollback is not told it is one.
    const plain = await view(second);
    expect(plain.origin).toBe('ci');
    expect(await envOf(plain.kubernetes_job!)).not.toHaveProperty('OPSGATE_ROLLBACK');
  });

  it('a commit that never succeeded: 409 rollback_target_unknown, nothing queued', async () => {
    const before = (await request(app).get('/ops/deploys?project=shop%2Fweb').set('X-API-Key', RO_KEY)).body.deploys.length;
    const res = await rollback({ project: 'shop/web', to: sha('f') });
    expect(res.status).toBe(409);
    expect(res.body).toEqual({ detail: expect.stringContaining(sha('f')), code: 'rollback_target_unknown' });
    const after = (await request(app).get('/ops/deploys?project=shop%2Fweb').set('X-API-Key', RO_KEY)).body.deploys.length;
    expect(after).toBe(before);
  });

  it('a second rollback request is a new deploy, not a duplicate', async () => {
    const one = await rollback({ project: 'shop/web', to: sha('a') });
    const two = await rollback({ project: 'shop/web', to: sha('a') });
    expect([one.status, two.status]).toEqual([202, 202]);
    expect(two.body).toMatchObject({ accepted: true, duplicate: false });
    expect(two.body.job_id).not.toBe(one.body.job_id);
    expect(two.body.event_id).not.toBe(one.body.event_id);
    // The newer one runs last; the older one either ran before it or ends superseded by it.
    const [first, second] = await waitFor(
      'both rollbacks ended',
      async () => {
        const both = [await view(one.body.job_id), await view(two.body.job_id)] as const;
        for (const v of both) if (v.state === 'running') await succeed(v.kubernetes_job!);
        return both[1].state === 'succeeded' && ['succeeded', 'superseded'].includes(both[0].state) ? both : false;
      },
      120_000,
      200,
    );
    expect(second.commit).toBe(sha('a'));
    expect(['succeeded', 'superseded']).toContain(first.state);
  });

  it('during a running deploy: the rollback waits for its turn, then runs', async () => {
    const c = await post('/ops/deploys', { project: 'shop/web', ref: REF, sha: sha('c') });
    const running = await inState(c.body.job_id, 'running');
    const current = (await request(app).get('/ops/projects/shop%2Fweb').set('X-API-Key', RO_KEY)).body.refs[0].current.id as string;
    const back = await rollback({ project: 'shop/web', to: sha('b') });
    expect(back.status).toBe(202);
    // While c runs, the rollback has no Job.
    await new Promise((r) => setTimeout(r, 1500));
    const waiting = await view(back.body.job_id);
    expect(waiting.state).toBe('queued');
    expect(waiting.kubernetes_job).toBeNull();
    await succeed(running.kubernetes_job!);
    await inState(c.body.job_id, 'succeeded');
    const v = await runToSuccess(back.body.job_id);
    // It goes back from the current (last succeeded) deploy, not from the one that ran meanwhile.
    expect(v).toMatchObject({ origin: 'rollback', commit: sha('b'), rolled_back_from: current });
    expect((await jobOf(v.kubernetes_job!)).metadata!.creationTimestamp!.getTime()).toBeGreaterThanOrEqual(
      (await jobOf(running.kubernetes_job!)).metadata!.creationTimestamp!.getTime(),
    );
  });

  it('under a freeze: held, and run when the freeze is lifted', async () => {
    const freeze = await post('/ops/freezes', { scope: 'project', project: 'shop/web', reason: 'incident', duration: '1h' });
    expect(freeze.status).toBe(201);
    const back = await rollback({ project: 'shop/web', to: sha('a') });
    expect(back.status).toBe(202);
    expect(back.body).toMatchObject({ status: 'held', held_reasons: expect.stringContaining('incident') });
    expect((await view(back.body.job_id)).state).toBe('held');
    const lifted = await request(app)
      .delete(`/ops/freezes/${freeze.body.id}`)
      .set('X-API-Key', OP_KEY)
      .set('Content-Type', 'application/json')
      .send('{"reason":"over"}');
    expect(lifted.status).toBe(200);
    const v = await runToSuccess(back.body.job_id);
    expect(await envOf(v.kubernetes_job!)).toMatchObject({ OPSGATE_COMMIT_SHA: sha('a'), OPSGATE_ROLLBACK: 'true' });
  });

  it("a person's override: it runs while the freeze stands (the worker's gate check honours what it covers)", async () => {
    const freeze = await post('/ops/freezes', { scope: 'project', project: 'shop/web', reason: 'incident', duration: '1h' });
    expect(freeze.status).toBe(201);
    const back = await rollback({ project: 'shop/web', to: sha('b'), override: true });
    expect(back.status).toBe(202);
    expect(back.body).toMatchObject({ status: 'queued', sha: sha('b') });
    const v = await runToSuccess(back.body.job_id);
    expect(await envOf(v.kubernetes_job!)).toMatchObject({ OPSGATE_COMMIT_SHA: sha('b'), OPSGATE_ROLLBACK: 'true' });
    const freezes = await request(app).get('/ops/freezes').set('X-API-Key', RO_KEY);
    expect(freezes.body.freezes).toEqual([expect.objectContaining({ id: freeze.body.id, in_force: true })]);
    await request(app)
      .delete(`/ops/freezes/${freeze.body.id}`)
      .set('X-API-Key', OP_KEY)
      .set('Content-Type', 'application/json')
      .send('{"reason":"over"}');
  });

  it('with an approval policy: pending approval, then run once approved', async () => {
    const first = await deployed('shop/guarded', sha('1'));
    const second = await deployed('shop/guarded', sha('2'));
    const back = await rollback({ project: 'shop/guarded' });
    expect(back.status).toBe(202);
    expect(back.body).toMatchObject({ status: 'pending_approval', sha: sha('1'), rolled_back_from: second, rolled_back_to: first });
    expect(await view(back.body.approval_id)).toMatchObject({ state: 'pending_approval', origin: 'rollback', rolled_back_from: second });
    const approved = await post(`/ops/approvals/${back.body.approval_id}/approve`, { reason: 'go back' }, OP_KEY_2);
    expect(approved.status).toBe(200);
    const v = await runToSuccess(back.body.approval_id);
    expect(v).toMatchObject({ origin: 'rollback', commit: sha('1'), rolled_back_from: second });
    expect(await envOf(v.kubernetes_job!)).toMatchObject({ OPSGATE_COMMIT_SHA: sha('1'), OPSGATE_ROLLBACK: 'true' });
  });
});
