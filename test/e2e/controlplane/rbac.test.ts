import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import * as k8s from '@kubernetes/client-node';
import { kubectl } from '../../helpers/cluster.js';
import {
  adminKubeConfig,
  chartRelease,
  createDeployments,
  serviceAccountToken,
  tokenKubeConfig,
} from '../../helpers/controlPlaneFixtures.js';

// A real apiserver under a loaded 2-core machine: generous per-test time (also under the root jest config).
jest.setTimeout(180_000);

/**
 * Least privilege of the chart's Roles, decided by the real RBAC authorizer:
 * - `kubectl auth can-i --as system:serviceaccount:<ns>:<sa>` (impersonation, a
 *   SelfSubjectAccessReview as that user) for the full matrix;
 * - SubjectAccessReview objects created through the API;
 * - and real requests with ServiceAccount tokens from the TokenRequest API (403s included).
 */
describe('RBAC of the chart: worker and api ServiceAccounts', () => {
  const rel = chartRelease('rbac');
  const { ns } = rel;
  const workerSa = 'opsgate-worker';
  const apiSa = 'opsgate-api';
  const asWorker = () => `system:serviceaccount:${ns.release}:${workerSa}`;
  const asApi = () => `system:serviceaccount:${ns.release}:${apiSa}`;

  beforeAll(async () => {
    const cluster = await rel.setUp({ install: true });
    await createDeployments(cluster, [
      [ns.apps, 'web'],
      [ns.apps, 'checkout'],
      [ns.apps, 'payments'], // same namespace, not in the inventory
      [ns.data, 'cache'],
      [ns.other, 'web'], // same name, namespace not in the inventory
    ]);
  }, 240_000); // starts a cluster when run outside make test-k8s

  afterAll(() => rel.tearDown(), 120_000);

  async function canI(as: string, verb: string, resource: string, namespace: string): Promise<boolean> {
    const r = await kubectl(rel.cluster.kubeconfigPath, ['auth', 'can-i', verb, resource, '-n', namespace, '--as', as]);
    const answer = r.stdout.trim();
    if (answer !== 'yes' && answer !== 'no') throw new Error(`kubectl auth can-i failed: ${r.stderr}`);
    return answer === 'yes';
  }

  // [verb, resource, namespace key, expected]
  const workerMatrix: Array<[string, string, keyof typeof ns, boolean]> = [
    ['get', 'deployments.apps/web', 'apps', true],
    ['patch', 'deployments.apps/web', 'apps', true],
    ['patch', 'deployments.apps/checkout', 'apps', true],
    ['patch', 'deployments.apps/cache', 'data', true],
    ['patch', 'deployments.apps/payments', 'apps', false],
    ['get', 'deployments.apps/payments', 'apps', false],
    ['patch', 'deployments.apps/web', 'other', false],
    ['update', 'deployments.apps/web', 'apps', false],
    ['delete', 'deployments.apps/web', 'apps', false],
    ['list', 'deployments.apps', 'apps', false],
    ['create', 'deployments.apps', 'apps', false],
    ['get', 'secrets', 'apps', false],
    ['list', 'secrets', 'apps', false],
    ['get', 'secrets', 'release', false],
    ['get', 'secrets/opsgate', 'release', false],
    ['get', 'secrets', 'deploy', false],
    ['create', 'jobs.batch', 'deploy', true],
    // run_deploy_pipeline creates its Job and reads it until it ends: no list/watch
    ['get', 'jobs.batch', 'deploy', true],
    ['list', 'jobs.batch', 'deploy', false],
    ['watch', 'jobs.batch', 'deploy', false],
    ['delete', 'jobs.batch', 'deploy', false],
    ['create', 'jobs.batch', 'apps', false],
    ['create', 'pods', 'deploy', false],
    ['create', 'serviceaccounts', 'deploy', false],
    ['patch', 'roles.rbac.authorization.k8s.io', 'apps', false],
  ];

  it.each(workerMatrix)('worker: can-i %s %s in %s -> %s', async (verb, resource, nsKey, expected) => {
    expect(await canI(asWorker(), verb, resource, ns[nsKey])).toBe(expected);
  });

  const apiMatrix: Array<[string, string, keyof typeof ns, boolean]> = [
    ['get', 'deployments.apps/web', 'apps', true],
    ['get', 'deployments.apps/cache', 'data', true],
    ['patch', 'deployments.apps/web', 'apps', false],
    ['get', 'deployments.apps/payments', 'apps', false],
    ['get', 'secrets', 'apps', false],
    ['get', 'secrets', 'release', false],
    ['create', 'jobs.batch', 'deploy', false],
  ];

  it.each(apiMatrix)('api: can-i %s %s in %s -> %s', async (verb, resource, nsKey, expected) => {
    expect(await canI(asApi(), verb, resource, ns[nsKey])).toBe(expected);
  });

  it('SubjectAccessReview agrees (worker patch listed vs unlisted Deployment, Secrets)', async () => {
    const authz = adminKubeConfig(rel.cluster).makeApiClient(k8s.AuthorizationV1Api);
    const review = async (attrs: k8s.V1ResourceAttributes) =>
      (
        await authz.createSubjectAccessReview({
          body: {
            spec: {
              user: asWorker(),
              groups: ['system:serviceaccounts', `system:serviceaccounts:${ns.release}`],
              resourceAttributes: attrs,
            },
          },
        })
      ).status?.allowed;
    expect(await review({ group: 'apps', resource: 'deployments', verb: 'patch', name: 'web', namespace: ns.apps })).toBe(true);
    expect(await review({ group: 'apps', resource: 'deployments', verb: 'patch', name: 'payments', namespace: ns.apps })).toBe(false);
    expect(await review({ group: '', resource: 'secrets', verb: 'get', name: 'opsgate', namespace: ns.release })).toBe(false);
  });

  it('real requests with TokenRequest tokens: allowed calls pass, the rest are 403', async () => {
    const admin = adminKubeConfig(rel.cluster);
    const tokenFor = (sa: string) => serviceAccountToken(admin, ns.release, sa);
    const clientFor = (token: string) => tokenKubeConfig(admin, token);
    const status = (p: Promise<unknown>) =>
      p.then(
        () => 200,
        (e: { code?: number }) => e.code,
      );

    const worker = clientFor(await tokenFor(workerSa));
    const wApps = worker.makeApiClient(k8s.AppsV1Api);
    const wCore = worker.makeApiClient(k8s.CoreV1Api);
    const patch = (api: k8s.AppsV1Api, name: string, namespace: string) =>
      api.patchNamespacedDeployment(
        // what restart_service sends (other changes are refused by the chart's ValidatingAdmissionPolicy: admissionPolicy.test.ts)
        {
          name,
          namespace,
          body: { spec: { template: { metadata: { annotations: { 'kubectl.kubernetes.io/restartedAt': '2026-11-23T10:00:00Z' } } } } },
        },
        k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.StrategicMergePatch),
      );
    expect(await status(wApps.readNamespacedDeployment({ name: 'web', namespace: ns.apps }))).toBe(200);
    expect(await status(patch(wApps, 'web', ns.apps))).toBe(200);
    expect(await status(patch(wApps, 'payments', ns.apps))).toBe(403);
    expect(await status(patch(wApps, 'web', ns.other))).toBe(403);
    expect(await status(wCore.listNamespacedSecret({ namespace: ns.release }))).toBe(403);
    expect(await status(wCore.readNamespacedSecret({ name: 'opsgate', namespace: ns.release }))).toBe(403);

    const api = clientFor(await tokenFor(apiSa));
    const aApps = api.makeApiClient(k8s.AppsV1Api);
    expect(await status(aApps.readNamespacedDeployment({ name: 'cache', namespace: ns.data }))).toBe(200);
    expect(await status(patch(aApps, 'web', ns.apps))).toBe(403);
    expect(await status(api.makeApiClient(k8s.CoreV1Api).readNamespacedSecret({ name: 'opsgate', namespace: ns.release }))).toBe(403);

    // an unrelated ServiceAccount of the same namespace gets nothing from the chart's bindings
    expect(await status(wApps.readNamespacedDeployment({ name: 'web', namespace: ns.apps }))).toBe(200);
    const stranger = clientFor(await tokenFor('default'));
    expect(await status(stranger.makeApiClient(k8s.AppsV1Api).readNamespacedDeployment({ name: 'web', namespace: ns.apps }))).toBe(403);
  });
});
