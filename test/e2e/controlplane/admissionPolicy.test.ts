import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import * as k8s from '@kubernetes/client-node';
import { parseInventory } from '../../../src/shared/inventory.js';
import { buildDeployJob } from '../../../worker/jobs/deploy.js';
import {
  adminKubeConfig,
  chartRelease,
  createDeployments,
  inventory,
  PROJECT,
  serviceAccountToken,
  tokenKubeConfig,
} from '../../helpers/controlPlaneFixtures.js';

jest.setTimeout(180_000);

/**
 * The chart's ValidatingAdmissionPolicy (templates/admission-policy.yaml) on the
 * real kube-apiserver, with requests made under the worker ServiceAccount's own token: the
 * restartedAt patch restart_service sends and the Job run_deploy_pipeline builds pass; any other
 * change to a Deployment, and a Job with another image or ServiceAccount, are refused (403) even
 * though RBAC allows the verb.
 */
describe('ValidatingAdmissionPolicy of the worker', () => {
  const rel = chartRelease('vap');
  const { ns } = rel;
  let wApps: k8s.AppsV1Api;
  let wBatch: k8s.BatchV1Api;
  let admin: k8s.KubeConfig;

  beforeAll(async () => {
    const cluster = await rel.setUp({ install: true });
    await createDeployments(cluster, [
      [ns.apps, 'web'],
      [ns.data, 'cache'],
    ]);
    admin = adminKubeConfig(cluster);
    const kc = tokenKubeConfig(admin, await serviceAccountToken(admin, ns.release, 'opsgate-worker'));
    wApps = kc.makeApiClient(k8s.AppsV1Api);
    wBatch = kc.makeApiClient(k8s.BatchV1Api);
    // A new policy is enforced once the apiserver's policy informer has it (asynchronous): wait
    // for a refused server-side dry run (nothing is changed) before the tests start.
    const deadline = Date.now() + 60_000;
    for (;;) {
      const code = await wApps
        .patchNamespacedDeployment(
          { name: 'web', namespace: ns.apps, dryRun: 'All', body: { spec: { replicas: 7 } } },
          k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.StrategicMergePatch),
        )
        .then(
          () => 200,
          (e: { code?: number }) => e.code,
        );
      if (code === 403) break;
      if (Date.now() > deadline) throw new Error(`admission policy not enforced within 60 s (dry run answered ${code})`);
      await new Promise((r) => setTimeout(r, 250));
    }
  }, 240_000);

  afterAll(() => rel.tearDown(), 120_000);

  type Outcome = { code: number; message: string };
  const outcome = (p: Promise<unknown>): Promise<Outcome> =>
    p.then(
      () => ({ code: 200, message: '' }),
      (e: { code?: number; body?: unknown }) => ({
        code: e.code ?? 0,
        message: typeof e.body === 'string' ? e.body : JSON.stringify(e.body ?? ''),
      }),
    );
  const patch = (name: string, namespace: string, body: object) =>
    outcome(
      wApps.patchNamespacedDeployment(
        { name, namespace, body, fieldManager: 'opsgate' },
        k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.StrategicMergePatch),
      ),
    );

  it('the policy and its binding are installed by the chart (the apiserver serves admissionregistration.k8s.io/v1)', async () => {
    const api = admin.makeApiClient(k8s.AdmissionregistrationV1Api);
    const name = `${ns.release}-opsgate-worker`;
    const policy = await api.readValidatingAdmissionPolicy({ name });
    expect(policy.spec?.matchConditions?.[0]?.expression).toContain(`system:serviceaccount:${ns.release}:opsgate-worker`);
    expect(policy.status?.typeChecking?.expressionWarnings ?? []).toEqual([]);
    expect((await api.readValidatingAdmissionPolicyBinding({ name })).spec?.validationActions).toEqual(['Deny']);
  });

  it('Deployment: the restartedAt patch of restart_service passes; every other change is refused (403)', async () => {
    // What `kubectl rollout restart` / restart_service sends (worker/jobs/restart.ts).
    const restart = (at: string) => ({ spec: { template: { metadata: { annotations: { 'kubectl.kubernetes.io/restartedAt': at } } } } });
    expect(await patch('web', ns.apps, restart('2026-11-23T10:00:00Z'))).toMatchObject({ code: 200 });
    expect(await patch('web', ns.apps, restart('2026-11-23T10:05:00Z'))).toMatchObject({ code: 200 });
    expect(await patch('cache', ns.data, restart('2026-11-23T10:00:00Z'))).toMatchObject({ code: 200 });

    const refused: Array<[string, object]> = [
      ['another pod-template annotation', { spec: { template: { metadata: { annotations: { 'sidecar.example/inject': 'true' } } } } }],
      ['replicas', { spec: { replicas: 3 } }],
      ['the image', { spec: { template: { spec: { containers: [{ name: 'web', image: 'evil.example/miner:1' }] } } } }],
      ['a pod-template label', { spec: { template: { metadata: { labels: { extra: 'x' } } } } }],
      ['a Deployment label', { metadata: { labels: { owner: 'mallory' } } }],
      ['a Deployment annotation', { metadata: { annotations: { 'opsgate.io/rbac-test': 'x' } } }],
      ['paused', { spec: { paused: true } }],
      [
        'restartedAt together with the image',
        {
          spec: {
            template: {
              metadata: { annotations: { 'kubectl.kubernetes.io/restartedAt': 'x' } },
              spec: { containers: [{ name: 'web', image: 'evil.example/miner:1' }] },
            },
          },
        },
      ],
    ];
    for (const [what, body] of refused) {
      const r = await patch('web', ns.apps, body);
      expect({ what, code: r.code }).toEqual({ what, code: 403 });
      expect(r.message).toMatch(/only the kubectl\.kubernetes\.io\/restartedAt annotation/);
    }
    const d = await admin.makeApiClient(k8s.AppsV1Api).readNamespacedDeployment({ name: 'web', namespace: ns.apps });
    expect(d.spec?.replicas).toBe(0);
    expect(d.spec?.template.spec?.containers[0]?.image).toBe('registry.example.com/web:1');
    expect(d.spec?.template.metadata?.annotations).toEqual({ 'kubectl.kubernetes.io/restartedAt': '2026-11-23T10:05:00Z' });
    // The policy binds the worker only: an administrator may still change the Deployment.
    await admin
      .makeApiClient(k8s.AppsV1Api)
      .patchNamespacedDeployment(
        { name: 'web', namespace: ns.apps, body: { metadata: { labels: { owner: 'sre' } } } },
        k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.StrategicMergePatch),
      );
  });

  it('Job: the one run_deploy_pipeline builds passes; another image or ServiceAccount, or an init container, is refused (403)', async () => {
    const entry = parseInventory(JSON.stringify(inventory(ns))).projects[PROJECT]!;
    let n = 0;
    const job = (mutate: (j: k8s.V1Job) => void = () => {}) => {
      const j = buildDeployJob({
        name: `vap-deploy-${++n}`,
        project: PROJECT,
        ref: 'refs/heads/main',
        auditId: 'a1',
        requestedBy: 'webhook:scm',
        queueJobId: String(n),
        entry,
      });
      mutate(j);
      return j;
    };
    const create = (body: k8s.V1Job, namespace = ns.deploy) =>
      outcome(wBatch.createNamespacedJob({ namespace, body: { ...body, metadata: { ...body.metadata, namespace } } }));

    expect(await create(job())).toMatchObject({ code: 200 });
    const refused: Array<[string, k8s.V1Job, string?]> = [
      ['another image', job((j) => (j.spec!.template.spec!.containers[0]!.image = 'evil.example/miner:1'))],
      ['another ServiceAccount', job((j) => (j.spec!.template.spec!.serviceAccountName = 'default'))],
      ['no ServiceAccount (the namespace default)', job((j) => delete j.spec!.template.spec!.serviceAccountName)],
      [
        'only the deprecated serviceAccount field, pointing elsewhere',
        job((j) => {
          delete j.spec!.template.spec!.serviceAccountName;
          j.spec!.template.spec!.serviceAccount = 'admin';
        }),
      ],
      [
        'a second container with another image',
        job((j) => j.spec!.template.spec!.containers.push({ name: 'x', image: 'evil.example/miner:1' })),
      ],
      ['an init container', job((j) => (j.spec!.template.spec!.initContainers = [{ name: 'init', image: entry.image }]))],
    ];
    for (const [what, body] of refused) {
      const r = await create(body);
      expect({ what, code: r.code }).toEqual({ what, code: 403 });
      expect(r.message).toMatch(/image and ServiceAccount of an inventory project/);
    }
    // A Job in a namespace with no inventory project: RBAC already refuses (no Role there).
    expect((await create(job(), ns.other)).code).toBe(403);
  });
});
