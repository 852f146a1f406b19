import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import * as k8s from '@kubernetes/client-node';
import { Job, Queue, QueueEvents } from 'bullmq';
import request from 'supertest';
import type { Express } from 'express';
import { createApp } from '../../../src/app.js';
import { createKubeHostStatusProvider } from '../../../src/domain/kubeHostStatus.js';
import { loadApiConfig, secretsOf } from '../../../src/api/config.js';
import { loadWorkerConfig } from '../../../src/shared/config.js';
import { parseInventory, type Inventory } from '../../../src/shared/inventory.js';
import { JOB, QUEUE_NAME } from '../../../src/shared/jobs.js';
import { credentialId } from '../../../src/shared/crypto.js';
import { SCALED_TO_ZERO } from '../../../worker/jobs/restart.js';
import { createLogger } from '../../../src/shared/logger.js';
import { createMetrics } from '../../../src/shared/metrics.js';
import { createOpsQueue, type OpsQueue } from '../../../src/api/queue.js';
import { createRedis } from '../../../src/shared/redis.js';
import { startWorker, type WorkerHandle } from '../../../worker/index.js';
import { kubeConfigForToken } from '../../../worker/k8s.js';
import { helm, kubectl, ok, useCluster } from '../../helpers/cluster.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import {
  adminKubeConfig,
  CHART,
  chartValues,
  createDeployments,
  createNamespaces,
  deleteNamespaces,
  inventory as inventoryFor,
  namespaces,
  PROJECT,
  serviceAccountToken,
  writeValues,
} from '../../helpers/controlPlaneFixtures.js';

// A real apiserver under a loaded 2-core machine: generous per-test time (also under the root jest config).
jest.setTimeout(180_000);

/**
 * The worker against the real apiserver, authenticated as the chart's worker ServiceAccount with
 * a token from the TokenRequest API (never the admin token), so every call it makes goes through
 * the chart's RBAC. Jobs travel through BullMQ on a real redis-server. The API's
 * GET /ops/hosts/{host} reads the same Deployments as the api ServiceAccount.
 */
const RESTARTED_AT = 'kubectl.kubernetes.io/restartedAt';
const BEARER = 'k8s-worker-test-bearer-0001';
const RO_KEY = 'k8s-worker-test-readonly-0001';

describe('worker on a real cluster, as its ServiceAccount', () => {
  let cluster: Awaited<ReturnType<typeof useCluster>>;
  const ns = namespaces('work');
  const allNs = [ns.release, ns.apps, ns.data, ns.deploy, ns.other];
  let redis: RedisServer;
  let queue: Queue;
  let events: QueueEvents;
  let worker: WorkerHandle | undefined;
  let inv: Inventory;
  let admin: k8s.KubeConfig;
  let workerToken: string;
  let apiToken: string;
  let factoryCalls = 0;
  const logLines: string[] = [];

  const tokenFor = (sa: string) => serviceAccountToken(admin, ns.release, sa, 3600);
  const caData = () => Buffer.from(cluster.caPem).toString('base64');

  beforeAll(async () => {
    cluster = await useCluster();
    admin = adminKubeConfig(cluster);
    await createNamespaces(cluster, allNs);
    // the chart's RBAC, as a user installs it
    ok(
      await helm(cluster.kubeconfigPath, ['install', 'opsgate', CHART, '-n', ns.release, '-f', writeValues(chartValues(ns))]),
      'helm install',
    );
    await createDeployments(cluster, [
      [ns.apps, 'web'],
      [ns.apps, 'checkout'],
      [ns.apps, 'payments'],
      [ns.data, 'cache'],
    ]);
    ok(await kubectl(cluster.kubeconfigPath, ['-n', ns.deploy, 'create', 'serviceaccount', 'deployer']), 'create deployer SA');
    for (const [n, d] of [
      [ns.apps, 'web'],
      [ns.apps, 'checkout'],
      [ns.data, 'cache'],
    ] as const) {
      ok(await kubectl(cluster.kubeconfigPath, ['-n', n, 'rollout', 'status', `deployment/${d}`, '--timeout=90s']), 'initial rollout');
    }

    workerToken = await tokenFor('opsgate-worker');
    apiToken = await tokenFor('opsgate-api');
    expect(workerToken).not.toBe(cluster.adminToken);
    // the token really is the ServiceAccount (TokenReview through the real authenticator)
    const review = await admin.makeApiClient(k8s.AuthenticationV1Api).createTokenReview({ body: { spec: { token: workerToken } } });
    expect(review.status?.authenticated).toBe(true);
    expect(review.status?.user?.username).toBe(`system:serviceaccount:${ns.release}:opsgate-worker`);

    inv = parseInventory(JSON.stringify(inventoryFor(ns)));
    redis = await startRedis();
    queue = new Queue(QUEUE_NAME, { connection: { url: redis.url } });
    events = new QueueEvents(QUEUE_NAME, { connection: { url: redis.url } });
    await events.waitUntilReady();
    const config = loadWorkerConfig({
      REDIS_URL: redis.url,
      ROLLOUT_POLL_INTERVAL_MS: '200',
      ROLLOUT_TIMEOUT_SECONDS: '120',
      JOB_ATTEMPTS: '2',
      LOG_LEVEL: 'debug',
    });
    worker = await startWorker(config, {
      inventory: inv,
      logger: createLogger({ level: 'debug', base: { component: 'worker' }, secrets: [workerToken], write: (l) => logLines.push(l) }),
      kubeConfig: () => {
        factoryCalls++;
        return kubeConfigForToken(cluster.server, workerToken, { caData: caData() });
      },
      name: 'k8s-test-worker',
    });
  }, 240_000); // starts a cluster when run outside make test-k8s

  afterAll(async () => {
    await worker?.close(5000);
    await events?.close();
    await queue?.close();
    await redis?.destroy();
    if (cluster) {
      await helm(cluster.kubeconfigPath, ['uninstall', 'opsgate', '-n', ns.release, '--ignore-not-found']);
      await deleteNamespaces(cluster, allNs);
      await cluster.release();
    }
  }, 120_000);

  const audit = { audit_id: 'k8s-audit-0001', requested_by: 'k8s-test' };

  async function finished(job: Job): Promise<{ state: string; job: Job }> {
    try {
      await job.waitUntilFinished(events, 150000);
    } catch {
      /* failed: inspected below */
    }
    const fresh = (await Job.fromId(queue, job.id!))!;
    return { state: await fresh.getState(), job: fresh };
  }

  /** Events of the opsgate worker about one object, by reason (read as admin). */
  async function opsgateEvents(namespace: string, name: string, reason: string) {
    const list = await admin.makeApiClient(k8s.EventsV1Api).listNamespacedEvent({ namespace });
    return list.items.filter((e) => e.regarding?.name === name && e.reason === reason && e.reportingController === 'opsgate.io/worker');
  }

  async function readDeployment(namespace: string, name: string) {
    return admin.makeApiClient(k8s.AppsV1Api).readNamespacedDeployment({ name, namespace });
  }

  it('restart_service sets restartedAt on the real Deployment and waits for the rollout', async () => {
    const before = await readDeployment(ns.apps, 'web');
    expect(before.spec?.template?.metadata?.annotations?.[RESTARTED_AT]).toBeUndefined();
    const callsBefore = factoryCalls;

    const t0 = Date.now();
    const job = await queue.add(JOB.restartService, { host: 'web-1.example.com', service: 'web', ...audit }, { attempts: 2 });
    const { state, job: done } = await finished(job);
    expect({ state, failedReason: done.failedReason }).toEqual({ state: 'completed', failedReason: undefined });
    expect(factoryCalls).toBeGreaterThan(callsBefore); // the worker used our ServiceAccount kubeconfig

    const after = await readDeployment(ns.apps, 'web');
    const restartedAt = after.spec?.template?.metadata?.annotations?.[RESTARTED_AT];
    expect(restartedAt).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    expect(Date.parse(restartedAt!)).toBeGreaterThanOrEqual(Math.floor(t0 / 1000) * 1000);
    expect(done.returnvalue).toMatchObject({ namespace: ns.apps, deployment: 'web', restartedAt, replicas: 0, note: SCALED_TO_ZERO });
    // the worker watched the rollout to its end (kubectl's rollout-status logic on the live object),
    // and says plainly that a Deployment scaled to 0 had no pod to restart
    expect(done.progress).toMatchObject({ phase: 'done', message: SCALED_TO_ZERO, desired: 0 });
    // a new pod template: the controller-manager made a new ReplicaSet and finished the rollout
    expect(after.metadata?.generation).toBe((before.metadata?.generation ?? 0) + 1);
    expect(after.status?.observedGeneration).toBe(after.metadata?.generation);
    const rs = await admin.makeApiClient(k8s.AppsV1Api).listNamespacedReplicaSet({ namespace: ns.apps, labelSelector: 'app=web' });
    expect(rs.items.length).toBe(2);
    ok(await kubectl(cluster.kubeconfigPath, ['-n', ns.apps, 'rollout', 'status', 'deployment/web', '--timeout=5s']), 'rollout status');
    // the patch was written by the worker's ServiceAccount (managedFields manager "opsgate")
    expect(after.metadata?.managedFields?.map((m) => m.manager)).toContain('opsgate');
    // untouched neighbours
    expect((await readDeployment(ns.apps, 'checkout')).spec?.template?.metadata?.annotations?.[RESTARTED_AT]).toBeUndefined();
    // the ServiceAccount token never reached a log line
    expect(logLines.join('\n')).not.toContain(workerToken);

    // a Kubernetes Event on the Deployment says who restarted it (written as the worker's ServiceAccount)
    const evs = await opsgateEvents(ns.apps, 'web', 'OpsgateRestart');
    expect(evs).toHaveLength(1);
    expect(evs[0]).toMatchObject({
      type: 'Normal',
      action: 'Restart',
      reportingController: 'opsgate.io/worker',
      regarding: { apiVersion: 'apps/v1', kind: 'Deployment', name: 'web', namespace: ns.apps, uid: after.metadata?.uid },
    });
    expect(evs[0]!.note).toBe(
      `rollout restart requested by k8s-test (audit ${audit.audit_id}, job ${job.id}): restartedAt ${restartedAt}; scaled to 0 replicas, no pod restarted`,
    );
    // core/v1 view of the same Event: what `kubectl describe deployment web` lists
    const described = await kubectl(cluster.kubeconfigPath, ['-n', ns.apps, 'describe', 'deployment', 'web']);
    expect(described.stdout).toMatch(/OpsgateRestart/);
  });

  it('the worker ServiceAccount may create Events in the inventory namespaces, and nothing else on them', async () => {
    const user = `system:serviceaccount:${ns.release}:opsgate-worker`;
    const can = async (namespace: string, verb: string) =>
      (
        await admin.makeApiClient(k8s.AuthorizationV1Api).createSubjectAccessReview({
          body: { spec: { user, resourceAttributes: { namespace, verb, group: 'events.k8s.io', resource: 'events' } } },
        })
      ).status!.allowed;
    for (const namespace of [ns.apps, ns.data, ns.deploy]) expect(await can(namespace, 'create')).toBe(true);
    for (const verb of ['get', 'list', 'watch', 'update', 'patch', 'delete']) expect(await can(ns.apps, verb)).toBe(false);
    expect(await can(ns.other, 'create')).toBe(false);
  });

  it('restart_service of a Deployment outside the inventory is dead-lettered before touching the cluster', async () => {
    const job = await queue.add(JOB.restartService, { host: 'web-1.example.com', service: 'payments', ...audit }, { attempts: 2 });
    const { state, job: done } = await finished(job);
    expect(state).toBe('failed');
    expect(done.attemptsMade).toBe(1);
    expect(done.failedReason).toMatch(/not a Deployment of host/);
    expect((await readDeployment(ns.apps, 'payments')).spec?.template?.metadata?.annotations?.[RESTARTED_AT]).toBeUndefined();
  });

  it('RBAC is enforced on the worker: with a host pointing at an unlisted Deployment the apiserver answers 403 and the job is dead-lettered', async () => {
    // a second worker whose inventory (wrongly) lists "payments": the chart's Role does not
    await worker?.close(5000);
    const wide = parseInventory(
      JSON.stringify({
        ...inventoryFor(ns),
        hosts: { 'web-1.example.com': { namespace: ns.apps, deployments: ['web', 'checkout', 'payments'] } },
      }),
    );
    worker = await startWorker(loadWorkerConfig({ REDIS_URL: redis.url, ROLLOUT_POLL_INTERVAL_MS: '200', JOB_ATTEMPTS: '2' }), {
      inventory: wide,
      logger: createLogger({ level: 'warn', write: () => {} }),
      kubeConfig: () => kubeConfigForToken(cluster.server, workerToken, { caData: caData() }),
    });
    try {
      const job = await queue.add(JOB.restartService, { host: 'web-1.example.com', service: 'payments', ...audit }, { attempts: 2 });
      const { state, job: done } = await finished(job);
      expect(state).toBe('failed');
      expect(done.attemptsMade).toBe(1); // 403 is final, not retried
      expect(done.failedReason).toMatch(/403 Forbidden/);
      expect((await readDeployment(ns.apps, 'payments')).spec?.template?.metadata?.annotations?.[RESTARTED_AT]).toBeUndefined();
    } finally {
      await worker.close(5000);
      worker = await startWorker(loadWorkerConfig({ REDIS_URL: redis.url, ROLLOUT_POLL_INTERVAL_MS: '200', JOB_ATTEMPTS: '2' }), {
        inventory: inv,
        logger: createLogger({ level: 'warn', write: () => {} }),
        kubeConfig: () => kubeConfigForToken(cluster.server, workerToken, { caData: caData() }),
      });
    }
  });

  it('run_deploy_pipeline creates the Kubernetes Job from the inventory template', async () => {
    const job = await queue.add(
      JOB.runDeployPipeline,
      { project: PROJECT, ref: 'refs/heads/main', event_id: 'scm:group/shop:refs/heads/main:abc123', ...audit },
      { attempts: 2 },
    );
    const { state, job: done } = await finished(job);
    expect({ state, failedReason: done.failedReason }).toEqual({ state: 'completed', failedReason: undefined });
    const name = (done.returnvalue as { job: string }).job;
    expect(name).toMatch(/^opsgate-deploy-group-shop-[0-9a-f]{12}$/);

    const batch = admin.makeApiClient(k8s.BatchV1Api);
    const kjob = await batch.readNamespacedJob({ name, namespace: ns.deploy });
    const deployEvents = await opsgateEvents(ns.deploy, name, 'OpsgateDeploy');
    expect(deployEvents).toHaveLength(1);
    expect(deployEvents[0]).toMatchObject({
      type: 'Normal',
      action: 'Create',
      regarding: { apiVersion: 'batch/v1', kind: 'Job', name, namespace: ns.deploy, uid: kjob.metadata?.uid },
      note: `deploy requested by k8s-test (audit ${audit.audit_id}, job ${job.id}): ${PROJECT} refs/heads/main`,
    });
    const tmpl = inventoryFor(ns).projects[PROJECT];
    expect(kjob.metadata?.labels).toMatchObject({
      'app.kubernetes.io/managed-by': 'opsgate',
      'opsgate.io/audit-id': audit.audit_id,
    });
    expect(kjob.spec?.activeDeadlineSeconds).toBe(tmpl.activeDeadlineSeconds);
    const pod = kjob.spec!.template.spec!;
    expect(pod.serviceAccountName).toBe('deployer');
    expect(pod.restartPolicy).toBe('Never');
    const c = pod.containers[0]!;
    expect(c.image).toBe(tmpl.image);
    expect(c.command).toEqual(tmpl.command);
    expect(c.args).toEqual(tmpl.args);
    const env = Object.fromEntries((c.env ?? []).map((e) => [e.name, e.value]));
    expect(env).toMatchObject({
      DEPLOY_ENV: 'production',
      OPSGATE_PROJECT: PROJECT,
      OPSGATE_REF: 'refs/heads/main',
      OPSGATE_AUDIT_ID: audit.audit_id,
    });
    expect(c.securityContext).toMatchObject({ allowPrivilegeEscalation: false, runAsNonRoot: true });
    // the real Job controller picked it up (it creates the pod; no kubelet runs it here)
    const deadline = Date.now() + 60000;
    let pods: k8s.V1PodList;
    do {
      pods = await admin.makeApiClient(k8s.CoreV1Api).listNamespacedPod({ namespace: ns.deploy, labelSelector: `job-name=${name}` });
      if (pods.items.length) break;
      await new Promise((r) => setTimeout(r, 500));
    } while (Date.now() < deadline);
    expect(pods.items.map((p) => p.spec?.serviceAccountName)).toEqual(['deployer']);

    // another deploy request is another queue job, hence another Kubernetes Job
    const again = await queue.add(JOB.runDeployPipeline, { project: PROJECT, ref: 'refs/heads/main', ...audit });
    await finished(again);
    const all = await batch.listNamespacedJob({ namespace: ns.deploy });
    expect(all.items.filter((j) => j.metadata?.annotations?.['opsgate.io/project'] === PROJECT).length).toBe(2);
  });

  it('the whole path: POST /ops/restart on the API -> queue -> worker -> Deployment; GET /ops/hosts/{host} reads it as the api ServiceAccount', async () => {
    const logger = createLogger({ level: 'warn', write: () => {} });
    const config = loadApiConfig({
      OPS_API_KEY_ROLES: `${RO_KEY}:readonly`,
      OPS_BEARER_TOKEN: BEARER,
      REDIS_URL: redis.url,
      RATE_LIMIT_RPS: '0',
    });
    const apiRedis = createRedis(redis.url, 'request', 'k8s-test-api');
    const opsQueue: OpsQueue = createOpsQueue({ url: redis.url, policy: { attempts: 2, backoffMs: 100 }, logger });
    await opsQueue.bull.waitUntilReady();
    const app: Express = createApp({
      config,
      redis: apiRedis,
      queue: opsQueue,
      inventory: inv,
      logger: createLogger({ level: 'warn', secrets: secretsOf(config), write: () => {} }),
      metrics: createMetrics('api', 'test', { defaults: false }),
      hostStatus: createKubeHostStatusProvider(() => kubeConfigForToken(cluster.server, apiToken, { caData: caData() })),
      version: 'k8s-test',
    });
    try {
      const res = await request(app)
        .post('/ops/restart')
        .query({ host: 'cache-1', service: 'cache' })
        .set('Authorization', `Bearer ${BEARER}`);
      expect(res.status).toBe(200);
      const jobId = res.body.job_id as string;
      expect(jobId).toBeTruthy();
      const { state } = await finished((await Job.fromId(queue, jobId))!);
      expect(state).toBe('completed');
      const annotated = (await readDeployment(ns.data, 'cache')).spec?.template?.metadata?.annotations?.[RESTARTED_AT];
      expect(annotated).toBeTruthy();
      // the Event names the caller's credential id and the API's audit id and job id
      const [ev] = await opsgateEvents(ns.data, 'cache', 'OpsgateRestart');
      expect(ev?.note).toContain(`requested by bearer:${credentialId(BEARER)} (audit ${res.headers['x-request-id']}, job ${jobId})`);

      // first read of this host (nothing cached yet): straight from the real cluster
      const host = await request(app).get('/ops/hosts/cache-1').set('X-API-Key', RO_KEY);
      expect(host.status).toBe(200);
      expect(host.body).toMatchObject({ host: 'cache-1', namespace: ns.data, cached: false });
      expect(host.body.deployments).toEqual([
        expect.objectContaining({ name: 'cache', found: true, replicas: 0, restarted_at: annotated }),
      ]);
      const web = await request(app).get('/ops/hosts/web-1.example.com').set('X-API-Key', RO_KEY);
      expect(web.status).toBe(200);
      const byName = Object.fromEntries((web.body.deployments as Array<{ name: string }>).map((d) => [d.name, d]));
      expect(byName.web).toMatchObject({ found: true, restarted_at: expect.stringMatching(/Z$/) });
      expect(byName.checkout).toMatchObject({ found: true, restarted_at: null });
    } finally {
      await opsQueue.close();
      apiRedis.disconnect();
    }
  });

  it('a ServiceAccount without create on events (an older RBAC) still restarts; the missing Event is logged, not fatal', async () => {
    const yaml = `apiVersion: v1
kind: ServiceAccount
metadata: {name: no-events, namespace: ${ns.release}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: no-events, namespace: ${ns.data}}
rules:
  - {apiGroups: [apps], resources: [deployments], resourceNames: [cache], verbs: [get, patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: no-events, namespace: ${ns.data}}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: no-events}
subjects: [{kind: ServiceAccount, name: no-events, namespace: ${ns.release}}]
`;
    ok(await kubectl(cluster.kubeconfigPath, ['apply', '-f', '-'], yaml), 'no-events SA');
    const token = await tokenFor('no-events');
    const lines: string[] = [];
    await worker?.close(5000);
    worker = await startWorker(loadWorkerConfig({ REDIS_URL: redis.url, ROLLOUT_POLL_INTERVAL_MS: '200', JOB_ATTEMPTS: '2' }), {
      inventory: inv,
      logger: createLogger({ level: 'warn', secrets: [token], write: (l) => lines.push(l) }),
      kubeConfig: () => kubeConfigForToken(cluster.server, token, { caData: caData() }),
    });
    try {
      const job = await queue.add(JOB.restartService, { host: 'cache-1', service: 'cache', ...audit }, { attempts: 2 });
      const { state, job: done } = await finished(job);
      expect({ state, failedReason: done.failedReason }).toEqual({ state: 'completed', failedReason: undefined });
      const warning = lines
        .map((l) => JSON.parse(l) as Record<string, unknown>)
        .find((l) => l.msg === 'could not record the Kubernetes Event');
      expect(warning).toMatchObject({ reason: 'OpsgateRestart', status: 403 });
      const evs = await opsgateEvents(ns.data, 'cache', 'OpsgateRestart');
      expect(evs.filter((e) => e.note?.includes(`job ${job.id})`))).toEqual([]);
    } finally {
      await worker.close(5000);
      worker = await startWorker(loadWorkerConfig({ REDIS_URL: redis.url, ROLLOUT_POLL_INTERVAL_MS: '200', JOB_ATTEMPTS: '2' }), {
        inventory: inv,
        logger: createLogger({ level: 'warn', write: () => {} }),
        kubeConfig: () => kubeConfigForToken(cluster.server, workerToken, { caData: caData() }),
      });
    }
  });

  it("a paused Deployment is refused with kubectl's reason, dead-lettered at once, untouched, with a Warning Event", async () => {
    await admin
      .makeApiClient(k8s.AppsV1Api)
      .patchNamespacedDeployment(
        { name: 'checkout', namespace: ns.apps, body: { spec: { paused: true } } },
        k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
      );
    const job = await queue.add(JOB.restartService, { host: 'web-1.example.com', service: 'checkout', ...audit }, { attempts: 2 });
    const { state, job: done } = await finished(job);
    expect(state).toBe('failed');
    expect(done.attemptsMade).toBe(1); // UnrecoverableError: not retried
    expect(done.failedReason).toBe(
      `deployments.apps "checkout" (namespace ${ns.apps}) can't restart paused deployment (run rollout resume first)`,
    );
    expect((await readDeployment(ns.apps, 'checkout')).spec?.template?.metadata?.annotations?.[RESTARTED_AT]).toBeUndefined();
    const [ev] = await opsgateEvents(ns.apps, 'checkout', 'OpsgateRestartRefused');
    expect(ev).toMatchObject({ type: 'Warning', action: 'Refuse' });
    expect(ev!.note).toContain("can't restart paused deployment (run rollout resume first)");
    // kubectl itself says the same about this Deployment
    const k = await kubectl(cluster.kubeconfigPath, ['-n', ns.apps, 'rollout', 'restart', 'deployment/checkout']);
    expect(k.stderr).toContain(`deployments.apps "checkout" can't restart paused deployment (run rollout resume first)`);
  });
});
