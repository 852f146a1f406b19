import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import * as k8s from '@kubernetes/client-node';
import request from 'supertest';
import type { Express } from 'express';
import { createApp } from '../../../src/app.js';
import { createKubeHostStatusProvider } from '../../../src/domain/kubeHostStatus.js';
import { loadApiConfig, secretsOf } from '../../../src/api/config.js';
import { createOpsQueue, type OpsQueue } from '../../../src/api/queue.js';
import { loadWorkerConfig } from '../../../src/shared/config.js';
import { parseInventory } from '../../../src/shared/inventory.js';
import { createLogger } from '../../../src/shared/logger.js';
import { createMetrics } from '../../../src/shared/metrics.js';
import { createRedis } from '../../../src/shared/redis.js';
import { startWorker, type WorkerHandle } from '../../../worker/index.js';
import { kubeConfigForToken } from '../../../worker/k8s.js';
import { helm, kubectl, ok, useCluster } from '../../helpers/cluster.js';
import {
  adminKubeConfig,
  CHART,
  chartValues,
  createNamespaces,
  deleteNamespaces,
  namespaces,
  serviceAccountToken,
  writeValues,
} from '../../helpers/controlPlaneFixtures.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { waitFor } from '../../helpers/waitFor.js';
import { metricValue, startReceiver, testMetrics, type Receiver } from '../../helpers/workerSupport.js';

jest.setTimeout(180_000);

/**
 * cancel_in_progress on a real kube-apiserver and kube-controller-manager (no kubelet: a deploy
 * Job's pods never run, so its Job stays active until it is deleted), with the chart's RBAC and
 * admission policies, the worker authenticated as the chart's worker ServiceAccount, the API in
 * process, both on a real Redis:
 * - a project with cancel_in_progress: its deploy runs (its Job active, its pod created), a newer
 *   push is accepted, the running Job is deleted with its pods, the running deploy ends
 *   `cancelled` naming the newer one (job outcome, history, metric, notification), and the newer
 *   deploy's Job is created;
 * - a project without it: the newer deploy waits, the running Job stays;
 * - the running deploy's worker stops under it (its attempt is retried) and another worker takes
 *   the newer push: the retried attempt creates no Job again and ends `cancelled`;
 * - the chart gives the worker's ServiceAccount `delete` on Jobs only in the namespace of the
 *   project that asks for it (the real RBAC authorizer), and its admission policy lets it delete
 *   there only the deploy Jobs opsgate made.
 */
const SCM_SECRET = 'k8s-cancel-test-scm-0001';
const RO_KEY = 'k8s-cancel-test-readonly-0001';
const CANCELS = 'group/cancels';
const WAITS = 'group/waits';
const HANDED_OVER = 'group/handed-over';

describe('cancel_in_progress on a real API server, as the worker ServiceAccount', () => {
  let cluster: Awaited<ReturnType<typeof useCluster>>;
  const ns = namespaces('cip');
  const allNs = [ns.release, ns.apps, ns.data, ns.deploy, ns.other];
  let admin: k8s.KubeConfig;
  let redis: RedisServer;
  let queue: OpsQueue;
  let worker: WorkerHandle | undefined;
  let startOne: () => Promise<WorkerHandle>;
  /** The Kubernetes API as the chart's worker ServiceAccount. */
  let asWorker: () => k8s.KubeConfig;
  let receiver: Receiver;
  let app: Express;
  const metrics = testMetrics();
  const close: Array<() => Promise<void> | void> = [];

  const project = (namespace: string, extra: Record<string, unknown>) => ({
    namespace,
    serviceAccountName: 'deployer',
    image: 'registry.example.com/shop/deployer:1.4.2',
    command: ['/bin/deploy'],
    refs: ['refs/heads/main'],
    activeDeadlineSeconds: 600,
    ...extra,
  });
  const inventory = () => ({
    hosts: {},
    projects: {
      [CANCELS]: project(ns.deploy, { cancel_in_progress: true }),
      [HANDED_OVER]: project(ns.deploy, { cancel_in_progress: true }),
      [WAITS]: project(ns.other, {}),
    },
  });

  beforeAll(async () => {
    cluster = await useCluster();
    admin = adminKubeConfig(cluster);
    await createNamespaces(cluster, allNs);
    ok(
      await helm(cluster.kubeconfigPath, [
        'install',
        'opsgate',
        CHART,
        '-n',
        ns.release,
        '-f',
        writeValues(chartValues(ns, { inventory: inventory() })),
      ]),
      'helm install',
    );
    for (const n of [ns.deploy, ns.other]) {
      ok(await kubectl(cluster.kubeconfigPath, ['-n', n, 'create', 'serviceaccount', 'deployer']), 'create deployer SA');
    }
    const token = await serviceAccountToken(admin, ns.release, 'opsgate-worker', 3600);
    const caData = Buffer.from(cluster.caPem).toString('base64');
    asWorker = () => kubeConfigForToken(cluster.server, token, { caData });
    const inv = parseInventory(JSON.stringify(inventory()));
    redis = await startRedis();
    receiver = await startReceiver();
    startOne = () =>
      startWorker(
        loadWorkerConfig({
          REDIS_URL: redis.url,
          ROLLOUT_POLL_INTERVAL_MS: '200',
          JOB_ATTEMPTS: '2',
          NOTIFY_WEBHOOK_URLS: receiver.url('/hook'),
        }),
        {
          inventory: inv,
          metrics,
          logger: createLogger({ level: 'warn', write: () => {} }),
          kubeConfig: asWorker,
        },
      );
    worker = await startOne();
    const config = loadApiConfig({
      OPS_API_KEY_ROLES: `${RO_KEY}:readonly`,
      SCM_WEBHOOK_SECRET: SCM_SECRET,
      REDIS_URL: redis.url,
      RATE_LIMIT_RPS: '0',
    });
    const logger = createLogger({ level: 'warn', secrets: secretsOf(config), write: () => {} });
    const apiMetrics = createMetrics('api', 'test', { defaults: false });
    const requestRedis = createRedis(redis.url, 'request', 'k8s-cancel-api');
    queue = createOpsQueue({ url: redis.url, policy: { attempts: 2, backoffMs: 100 }, logger, metrics: apiMetrics });
    await queue.bull.waitUntilReady();
    close.push(
      () => queue.close(),
      () => requestRedis.disconnect(),
    );
    app = createApp({
      config,
      redis: requestRedis,
      queue,
      inventory: inv,
      logger,
      metrics: apiMetrics,
      hostStatus: createKubeHostStatusProvider(() => admin),
    });
  }, 240_000);

  afterAll(async () => {
    await worker?.close(5000);
    for (const c of close) await c();
    await receiver?.close();
    await redis?.destroy();
    if (cluster) {
      await helm(cluster.kubeconfigPath, ['uninstall', 'opsgate', '-n', ns.release, '--ignore-not-found']);
      await deleteNamespaces(cluster, allNs);
      await cluster.release();
    }
  }, 120_000);

  const push = async (path: string, sha: string): Promise<string> => {
    const res = await request(app)
      .post('/webhook/scm')
      .set('Content-Type', 'application/json')
      .set({ 'X-Scm-Token': SCM_SECRET, 'X-Scm-Event': 'Push Hook' })
      .send(JSON.stringify({ ref: 'refs/heads/main', checkout_sha: sha, project: { path_with_namespace: path } }));
    expect(res.status).toBe(202);
    return res.body.job_id as string;
  };
  const batch = () => admin.makeApiClient(k8s.BatchV1Api);
  const core = () => admin.makeApiClient(k8s.CoreV1Api);
  /** The Kubernetes Job of a queue job (the worker annotates it with the queue job id). */
  const k8sJobOf = async (namespace: string, queueJobId: string) =>
    (await batch().listNamespacedJob({ namespace })).items.find((j) => j.metadata?.annotations?.['opsgate.io/queue-job-id'] === queueJobId);
  const podsOf = async (namespace: string, jobName: string) =>
    (await core().listNamespacedPod({ namespace, labelSelector: `job-name=${jobName}` })).items;
  const view = async (path: string) => (await request(app).get(path).set('X-API-Key', RO_KEY)).body;

  it('the worker ServiceAccount may delete Jobs only in the namespace of the project with cancel_in_progress', async () => {
    const canI = async (verb: string, namespace: string) => {
      const r = await kubectl(cluster.kubeconfigPath, [
        'auth',
        'can-i',
        verb,
        'jobs.batch',
        '-n',
        namespace,
        '--as',
        `system:serviceaccount:${ns.release}:opsgate-worker`,
      ]);
      return r.stdout.trim();
    };
    expect(await canI('delete', ns.deploy)).toBe('yes');
    expect(await canI('delete', ns.other)).toBe('no');
    expect(await canI('delete', ns.apps)).toBe('no');
    expect(await canI('deletecollection', ns.deploy)).toBe('no');
    expect(await canI('create', ns.other)).toBe('yes');

    // Another Job of the namespace: RBAC cannot tell it apart by name, the admission policy does.
    await batch().createNamespacedJob({
      namespace: ns.deploy,
      body: {
        metadata: { name: 'not-opsgate' },
        spec: { template: { spec: { restartPolicy: 'Never', containers: [{ name: 'c', image: 'registry.example.com/other:1' }] } } },
      },
    });
    const refused = await waitFor(
      'the delete policy enforced (asynchronous)',
      async () => {
        try {
          await asWorker().makeApiClient(k8s.BatchV1Api).deleteNamespacedJob({ name: 'not-opsgate', namespace: ns.deploy, dryRun: 'All' });
          return undefined;
        } catch (err) {
          return err as { code?: number; body?: string };
        }
      },
      60_000,
      500,
    );
    // kube-controller-manager type-checks the policy's expression against the Job's schema.
    const name = `${ns.release}-opsgate-worker-job-deletes`;
    const policy = await waitFor(
      `the type check of ${name}`,
      async () => {
        const p = await admin.makeApiClient(k8s.AdmissionregistrationV1Api).readValidatingAdmissionPolicy({ name });
        return p.status?.observedGeneration === p.metadata?.generation && p.status?.typeChecking ? p : undefined;
      },
      60_000,
      250,
    );
    expect(policy.status?.typeChecking?.expressionWarnings ?? []).toEqual([]);
    expect(refused.code).toBe(403);
    expect(String(refused.body)).toContain('only a deploy Job opsgate created may be deleted');
    expect((await batch().readNamespacedJob({ name: 'not-opsgate', namespace: ns.deploy })).metadata?.deletionTimestamp).toBeUndefined();
  });

  it('a newer push deletes the running Job with its pods: the running deploy ends cancelled, naming it, and the newer one runs', async () => {
    const older = await push(CANCELS, 'c0ffee01');
    const running = await waitFor('the older deploy Job and its pod', async () => {
      const j = await k8sJobOf(ns.deploy, older);
      return j && (await podsOf(ns.deploy, j.metadata!.name!)).length > 0 ? j : undefined;
    });
    expect(running.metadata?.annotations?.['opsgate.io/commit-sha']).toBe('c0ffee01');
    expect((await view(`/ops/jobs/${older}`)).state).toBe('active');

    const newer = await push(CANCELS, 'c0ffee02');
    const ended = await waitFor(
      'the older deploy to end',
      async () => {
        const j = await view(`/ops/jobs/${older}`);
        return j.state === 'completed' || j.state === 'failed' ? j : undefined;
      },
      120_000,
      250,
    );
    expect(ended).toMatchObject({ state: 'completed', outcome: { result: 'cancelled' } });
    expect(ended.outcome.reason).toContain(`cancelled by deploy ${newer}`);
    // Gone, and its pods with it (foreground propagation: the Job goes after them).
    await expect(batch().readNamespacedJob({ name: running.metadata!.name!, namespace: ns.deploy })).rejects.toMatchObject({ code: 404 });
    expect(await podsOf(ns.deploy, running.metadata!.name!)).toEqual([]);

    const next = await waitFor('the newer deploy Job', () => k8sJobOf(ns.deploy, newer), 60_000, 250);
    expect(next.metadata?.annotations?.['opsgate.io/commit-sha']).toBe('c0ffee02');
    expect(next.metadata?.deletionTimestamp).toBeUndefined();
    expect((await view(`/ops/jobs/${newer}`)).state).toBe('active');

    expect(await view(`/ops/deploys/${older}`)).toMatchObject({ state: 'cancelled', cancelled_by: newer, commit: 'c0ffee01' });
    expect(await view(`/ops/deploys/${newer}`)).toMatchObject({ state: 'running', commit: 'c0ffee02' });
    expect(await metricValue(metrics, 'opsgate_change_outcomes_total', { change: 'deploy', result: 'cancelled' })).toBe(1);
    // Appended to the push's deliveries log after its `queued` entry, naming the newer deploy.
    const entry = await waitFor('the cancelled entry of the push', async () =>
      ((await view('/ops/deliveries?source=scm&verdict=cancelled')).deliveries as Array<Record<string, any>>).find(
        (d) => d.job_id === older,
      ),
    );
    expect(entry).toMatchObject({
      verdict: 'cancelled',
      status: 202,
      detail: expect.stringContaining(`cancelled by deploy ${newer}`),
      event: { project: CANCELS, ref: 'refs/heads/main', sha: 'c0ffee01' },
    });
    const report = await waitFor('the outcome report of the older deploy', async () =>
      receiver
        .requests('/hook')
        .map((r) => JSON.parse(r.body) as { job_id?: string; event?: string; text: string })
        .find((b) => b.job_id === older && b.event === 'outcome'),
    );
    expect(report).toMatchObject({ event: 'outcome', outcome: { result: 'cancelled' } });
    expect(report.text).toContain('Cancelled');
    expect(report.text).toContain(newer);
  });

  it('without cancel_in_progress the newer deploy waits and the running Job stays', async () => {
    const older = await push(WAITS, 'feed0001');
    const running = await waitFor('the older deploy Job', () => k8sJobOf(ns.other, older), 60_000, 250);
    const newer = await push(WAITS, 'feed0002');
    // The newer one takes its turn and is told to wait: back in the delayed set.
    await waitFor('the newer deploy to wait', async () => ((await view(`/ops/jobs/${newer}`)).state === 'delayed' ? true : undefined));
    await new Promise((r) => setTimeout(r, 3000));
    const still = await batch().readNamespacedJob({ name: running.metadata!.name!, namespace: ns.other });
    expect(still.metadata?.deletionTimestamp).toBeUndefined();
    expect(await k8sJobOf(ns.other, newer)).toBeUndefined();
    expect((await view(`/ops/jobs/${older}`)).state).toBe('active');
    expect(await view(`/ops/deploys/${newer}`)).toMatchObject({ state: 'queued' });
  });

  it("the running deploy's worker stops under it and another worker takes the newer push: the retried attempt creates no Job and ends cancelled", async () => {
    const older = await push(HANDED_OVER, 'beef0001');
    const running = await waitFor('the older deploy Job', () => k8sJobOf(ns.deploy, older), 60_000, 250);
    // The worker stops: its attempt is aborted (retried), the group still held by it.
    await worker!.close(1000);
    worker = undefined;
    const newer = await push(HANDED_OVER, 'beef0002');
    worker = await startOne();
    const ended = await waitFor(
      'the older deploy to end',
      async () => {
        const j = await view(`/ops/jobs/${older}`);
        return j.state === 'completed' || j.state === 'failed' ? j : undefined;
      },
      120_000,
      250,
    );
    expect(ended).toMatchObject({ state: 'completed', attempts_made: 2, outcome: { result: 'cancelled' } });
    expect(ended.outcome.reason).toContain(`cancelled by deploy ${newer}`);
    await expect(batch().readNamespacedJob({ name: running.metadata!.name!, namespace: ns.deploy })).rejects.toMatchObject({ code: 404 });
    const next = await waitFor('the newer deploy Job', () => k8sJobOf(ns.deploy, newer), 60_000, 250);
    expect(next.metadata?.annotations?.['opsgate.io/commit-sha']).toBe('beef0002');
    // The retried attempt of the older deploy creates no Job again.
    await new Promise((r) => setTimeout(r, 1000));
    expect(await k8sJobOf(ns.deploy, older)).toBeUndefined();
    expect(await view(`/ops/deploys/${older}`)).toMatchObject({ state: 'cancelled', cancelled_by: newer });
  });
});
