import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import * as k8s from '@kubernetes/client-node';
import request from 'supertest';
import type { Express } from 'express';
import { createApp } from '../../../src/app.js';
import { createKubeHostStatusProvider } from '../../../src/domain/kubeHostStatus.js';
import { loadApiConfig, secretsOf } from '../../../src/api/config.js';
import { loadWorkerConfig } from '../../../src/shared/config.js';
import { credentialId } from '../../../src/shared/crypto.js';
import { parseInventory, type Inventory } from '../../../src/shared/inventory.js';
import { DRY_RUN_JOB_OPTIONS, JOB } from '../../../src/shared/jobs.js';
import { createLogger } from '../../../src/shared/logger.js';
import { createMetrics } from '../../../src/shared/metrics.js';
import { createOpsQueue, type OpsQueue } from '../../../src/api/queue.js';
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
  deployment,
  inventory as inventoryFor,
  namespaces,
  PROJECT,
  serviceAccountToken,
  writeValues,
} from '../../helpers/controlPlaneFixtures.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { waitFor } from '../../helpers/waitFor.js';

jest.setTimeout(180_000);

/**
 * Guarded changes against a real kube-apiserver with the chart's RBAC and ValidatingAdmissionPolicy,
 * the worker authenticated as the chart's worker ServiceAccount (a TokenRequest token), the API in
 * process on a real Redis:
 * - a dry run of a restart is the worker's server-side dryRun=All patch: admitted, and the
 *   Deployment's resourceVersion does not move; a Deployment the chart's RBAC does not cover is
 *   refused by RBAC (403), and says so; a cluster admin's own ValidatingAdmissionPolicy refusing the
 *   patch is named as admission;
 * - a deploy's dry run creates no Job; a Job the chart's policy refuses (another image) says so;
 * - the outcome of a restart: rolled out (with its duration) and the Event OpsgateRolledOut; past
 *   its progressDeadlineSeconds (no node here: its pods never start), failed as
 *   progress_deadline_exceeded with the Event OpsgateRolloutFailed; an approved restart's
 *   OpsgateRestart Event names its approver.
 */
const BEARER = 'k8s-guards-test-bearer-0001';
const OP_KEY = 'k8s-guards-test-operator-0001';
const OP_KEY_2 = 'k8s-guards-test-operator-0002';
const RO_KEY = 'k8s-guards-test-readonly-0001';

describe('dry runs and outcomes on a real API server, as the worker ServiceAccount', () => {
  let cluster: Awaited<ReturnType<typeof useCluster>>;
  const ns = namespaces('grd');
  const allNs = [ns.release, ns.apps, ns.data, ns.deploy, ns.other];
  let admin: k8s.KubeConfig;
  let redis: RedisServer;
  let queue: OpsQueue;
  let worker: WorkerHandle | undefined;
  let app: Express;
  let inv: Inventory;
  const close: Array<() => Promise<void> | void> = [];

  /** The chart's inventory plus a host with an approval policy; the worker and the API also list "uncovered", which the chart's RBAC does not. */
  const chartInventory = () => ({
    ...inventoryFor(ns),
    hosts: {
      ...inventoryFor(ns).hosts,
      'guarded-1': { namespace: ns.data, deployments: ['cache'], policy: { approval: { required: 1, ttl: '1h' } } },
      'slow-1': { namespace: ns.other, deployments: ['stuck'] },
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
        writeValues(chartValues(ns, { inventory: chartInventory() })),
      ]),
      'helm install',
    );
    const apps = admin.makeApiClient(k8s.AppsV1Api);
    for (const [namespace, name] of [
      [ns.apps, 'web'],
      [ns.apps, 'checkout'],
      [ns.apps, 'uncovered'],
      [ns.data, 'cache'],
    ] as const) {
      await apps.createNamespacedDeployment({ namespace, body: deployment(name, namespace) });
    }
    // one replica that can never start (no kubelet), with a short progress deadline
    const stuck = deployment('stuck', ns.other);
    stuck.spec!.replicas = 1;
    stuck.spec!.progressDeadlineSeconds = 5;
    await apps.createNamespacedDeployment({ namespace: ns.other, body: stuck });
    ok(await kubectl(cluster.kubeconfigPath, ['-n', ns.deploy, 'create', 'serviceaccount', 'deployer']), 'create deployer SA');

    const token = await serviceAccountToken(admin, ns.release, 'opsgate-worker', 3600);
    const caData = Buffer.from(cluster.caPem).toString('base64');
    const wide = chartInventory();
    wide.hosts['web-1.example.com'] = { namespace: ns.apps, deployments: ['web', 'checkout', 'uncovered'] };
    inv = parseInventory(JSON.stringify(wide));

    redis = await startRedis();
    worker = await startWorker(
      loadWorkerConfig({ REDIS_URL: redis.url, ROLLOUT_POLL_INTERVAL_MS: '200', ROLLOUT_TIMEOUT_SECONDS: '120', JOB_ATTEMPTS: '1' }),
      {
        inventory: inv,
        logger: createLogger({ level: 'warn', write: () => {} }),
        kubeConfig: () => kubeConfigForToken(cluster.server, token, { caData }),
      },
    );
    const config = loadApiConfig({
      OPS_API_KEY_ROLES: `${RO_KEY}:readonly,${OP_KEY}:operator,${OP_KEY_2}:operator`,
      OPS_BEARER_TOKEN: BEARER,
      OPS_BEARER_TOKEN_OWNER: 'oncall',
      REDIS_URL: redis.url,
      RATE_LIMIT_RPS: '0',
      DRY_RUN_TIMEOUT_MS: '30000',
    });
    const logger = createLogger({ level: 'warn', secrets: secretsOf(config), write: () => {} });
    const metrics = createMetrics('api', 'test', { defaults: false });
    const requestRedis = createRedis(redis.url, 'request', 'k8s-guards-api');
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
      inventory: inv,
      logger,
      metrics,
      hostStatus: createKubeHostStatusProvider(() => admin),
    });
  }, 240_000);

  afterAll(async () => {
    await worker?.close(5000);
    for (const c of close) await c();
    await redis?.destroy();
    if (cluster) {
      await helm(cluster.kubeconfigPath, ['uninstall', 'opsgate', '-n', ns.release, '--ignore-not-found']);
      await kubectl(cluster.kubeconfigPath, [
        'delete',
        'validatingadmissionpolicy,validatingadmissionpolicybinding',
        `${ns.release}-cab-freeze`,
        '--ignore-not-found',
      ]);
      await deleteNamespaces(cluster, allNs);
      await cluster.release();
    }
  }, 120_000);

  const read = (namespace: string, name: string) => admin.makeApiClient(k8s.AppsV1Api).readNamespacedDeployment({ name, namespace });
  const dryRestart = (service: string) =>
    request(app).post(`/ops/restart?host=web-1.example.com&service=${service}&dry_run=true`).set('Authorization', `Bearer ${BEARER}`);
  const events = async (namespace: string, name: string, reason: string) =>
    (await admin.makeApiClient(k8s.EventsV1Api).listNamespacedEvent({ namespace })).items.filter(
      (e) => e.regarding?.name === name && e.reason === reason && e.reportingController === 'opsgate.io/worker',
    );
  const jobView = async (id: string) => (await request(app).get(`/ops/jobs/${id}`).set('X-API-Key', RO_KEY)).body;
  const ended = (id: string, timeoutMs = 120_000) =>
    waitFor(
      `job ${id} to end`,
      async () => {
        const j = await jobView(id);
        return j.state === 'completed' || j.state === 'failed' ? j : undefined;
      },
      timeoutMs,
      250,
    );

  it('a dry run of a covered Deployment: admitted by the API server from the worker identity, and its resourceVersion unchanged', async () => {
    const before = await read(ns.apps, 'web');
    const res = await dryRestart('web');
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({
      dry_run: true,
      would: 'queue',
      namespace: ns.apps,
      kubernetes: {
        checked: true,
        identity: `system:serviceaccount:${ns.release}:opsgate-worker`,
        admitted: true,
        refused_by: null,
        object: {
          kind: 'Deployment',
          name: 'web',
          found: true,
          resource_version: before.metadata!.resourceVersion,
          replicas: 0,
          paused: false,
        },
      },
    });
    const after = await read(ns.apps, 'web');
    expect(after.metadata!.resourceVersion).toBe(before.metadata!.resourceVersion);
    expect(after.spec!.template.metadata?.annotations?.['kubectl.kubernetes.io/restartedAt']).toBeUndefined();
    // nothing queued as work: only the finished dry-run job
    const jobs = await queue.bull.getJobs(['waiting', 'active', 'delayed', 'completed', 'failed']);
    expect([...new Set(jobs.map((j) => j.name))]).toEqual([JOB.dryRun]);
  });

  it('a dry run of a Deployment the chart RBAC does not cover says so (refused_by rbac, 403, the API server message)', async () => {
    const res = await dryRestart('uncovered');
    expect(res.status).toBe(200);
    expect(res.body.kubernetes).toMatchObject({
      checked: true,
      admitted: false,
      refused_by: 'rbac',
      status: 403,
      object: { name: 'uncovered', found: null },
    });
    expect(res.body.kubernetes.message).toMatch(
      new RegExp(`cannot patch resource "deployments" in API group "apps" in the namespace "${ns.apps}"`),
    );
  });

  it("a cluster admin's ValidatingAdmissionPolicy refusing the patch is named as admission", async () => {
    const policy = `${ns.release}-cab-freeze`;
    const yaml = `
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: ${policy}}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules: [{apiGroups: [apps], apiVersions: ["*"], operations: [UPDATE], resources: [deployments]}]
    namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: ${ns.apps}}}
  validations:
    - expression: "object.metadata.name != 'checkout'"
      message: "checkout is frozen by the change advisory board"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: ${policy}}
spec: {policyName: ${policy}, validationActions: [Deny]}
`;
    ok(await kubectl(cluster.kubeconfigPath, ['apply', '-f', '-'], yaml), 'apply the policy');
    const refused = await waitFor(
      'the policy enforced (asynchronous)',
      async () => {
        const r = await dryRestart('checkout');
        return r.body.kubernetes?.admitted === false ? r : undefined;
      },
      60_000,
      500,
    );
    // a validation without a reason answers 422 Invalid; the message names the policy
    expect(refused.body.kubernetes).toMatchObject({ checked: true, refused_by: 'admission', status: 422 });
    expect(refused.body.kubernetes.message).toContain('checkout is frozen by the change advisory board');
    expect((await dryRestart('web')).body.kubernetes.admitted).toBe(true);
  });

  it("a deploy's dry run creates no Job; a Job the chart's policy refuses (another image than the inventory's) is named as admission", async () => {
    const ok1 = await queue.probe.run(
      {
        name: JOB.dryRun,
        data: { change: 'deploy', project: PROJECT, ref: 'refs/heads/main', audit_id: 'a', requested_by: 'k' },
        jobOptions: DRY_RUN_JOB_OPTIONS,
      },
      30_000,
    );
    expect(ok1).toMatchObject({
      state: 'completed',
      value: { admitted: true, object: { kind: 'Job', namespace: ns.deploy, service_account: 'deployer' } },
    });
    expect((await admin.makeApiClient(k8s.BatchV1Api).listNamespacedJob({ namespace: ns.deploy })).items).toEqual([]);

    // a worker whose inventory names another image than the chart's (drift): the policy refuses its Job
    const token = await serviceAccountToken(admin, ns.release, 'opsgate-worker', 600);
    const drift = parseInventory(
      JSON.stringify({
        ...chartInventory(),
        projects: { [PROJECT]: { ...inventoryFor(ns).projects[PROJECT], image: 'evil.example/miner:1' } },
      }),
    );
    await worker!.close(5000);
    worker = await startWorker(loadWorkerConfig({ REDIS_URL: redis.url, JOB_ATTEMPTS: '1' }), {
      inventory: drift,
      logger: createLogger({ level: 'warn', write: () => {} }),
      kubeConfig: () => kubeConfigForToken(cluster.server, token, { caData: Buffer.from(cluster.caPem).toString('base64') }),
    });
    try {
      const refused = await queue.probe.run(
        {
          name: JOB.dryRun,
          data: { change: 'deploy', project: PROJECT, ref: 'refs/heads/main', audit_id: 'a', requested_by: 'k' },
          jobOptions: DRY_RUN_JOB_OPTIONS,
        },
        30_000,
      );
      expect(refused).toMatchObject({ state: 'completed', value: { admitted: false, refused_by: 'admission', status: 403 } });
      expect((refused as { value: { message: string } }).value.message).toMatch(
        /a Job must use the image and ServiceAccount of an inventory project/,
      );
    } finally {
      await worker.close(5000);
      worker = await startWorker(
        loadWorkerConfig({ REDIS_URL: redis.url, ROLLOUT_POLL_INTERVAL_MS: '200', ROLLOUT_TIMEOUT_SECONDS: '120', JOB_ATTEMPTS: '1' }),
        {
          inventory: inv,
          logger: createLogger({ level: 'warn', write: () => {} }),
          kubeConfig: () => kubeConfigForToken(cluster.server, token, { caData: Buffer.from(cluster.caPem).toString('base64') }),
        },
      );
    }
  });

  it('an approved restart rolls out: outcome rolled_out with its duration, Events OpsgateRestart (naming the approver) and OpsgateRolledOut', async () => {
    const asked = await request(app).post('/ops/restart?host=guarded-1&service=cache').set('Authorization', `Bearer ${BEARER}`);
    expect(asked.status).toBe(202);
    // The shared bearer token hides who asked: two people approve where the policy asks one.
    expect(asked.body.required).toBe(2);
    const id = asked.body.approval_id as string;
    const approve = (key: string) =>
      request(app)
        .post(`/ops/approvals/${id}/approve`)
        .set('X-API-Key', key)
        .set('Content-Type', 'application/json')
        .send(JSON.stringify({ reason: 'cache warmed' }));
    expect((await approve(OP_KEY)).body).toMatchObject({ status: 'pending', approvals_needed: 1 });
    const approved = await approve(OP_KEY_2);
    expect(approved.body).toMatchObject({ status: 'approved', job_id: id });
    const done = await ended(id);
    expect(done).toMatchObject({ state: 'completed', outcome: { result: 'rolled_out', duration_s: expect.any(Number) } });
    const approver = `key:${credentialId(OP_KEY)}, key:${credentialId(OP_KEY_2)}`;
    const restart = await waitFor('the OpsgateRestart Event', async () => (await events(ns.data, 'cache', 'OpsgateRestart'))[0]);
    expect(restart.note).toContain(`approved by ${approver}`);
    const rolled = await waitFor('the OpsgateRolledOut Event', async () => (await events(ns.data, 'cache', 'OpsgateRolledOut'))[0]);
    expect(rolled).toMatchObject({ type: 'Normal', action: 'RolledOut' });
    expect(rolled.note).toMatch(
      new RegExp(
        `^rollout restart rolled out requested by bearer:${credentialId(BEARER)} \\(owner oncall\\), approved by ${approver} \\(audit .*, job ${id}\\): .* in [0-9.]+ s$`,
      ),
    );
  });

  it('a restart past its progressDeadlineSeconds is a failure: outcome progress_deadline_exceeded, Event OpsgateRolloutFailed', async () => {
    const res = await request(app).post('/ops/restart?host=slow-1&service=stuck').set('Authorization', `Bearer ${BEARER}`);
    expect(res.status).toBe(200);
    const done = await ended(res.body.job_id as string);
    expect(done).toMatchObject({ state: 'failed', outcome: { result: 'progress_deadline_exceeded' } });
    expect(done.failed_reason).toMatch(/rollout exceeded its progress deadline \(progressDeadlineSeconds 5\)/);
    const failed = await waitFor(
      'the OpsgateRolloutFailed Event',
      async () => (await events(ns.other, 'stuck', 'OpsgateRolloutFailed'))[0],
    );
    expect(failed).toMatchObject({ type: 'Warning' });
    expect(failed.note).toContain('progress deadline');
  });
});
