import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import * as k8s from '@kubernetes/client-node';
import { kubectl, ok, useCluster } from '../../helpers/cluster.js';

// A real apiserver under a loaded 2-core machine: generous per-test time (also under the root jest config).
jest.setTimeout(180_000);

/**
 * The harness itself: a real kube-apiserver (RBAC on, anonymous off) over a real etcd, with a
 * real kube-controller-manager reconciling Deployments.
 */
describe('real control plane', () => {
  let cluster: Awaited<ReturnType<typeof useCluster>>;
  let kc: k8s.KubeConfig;
  const ns = 'cp-smoke';

  beforeAll(async () => {
    cluster = await useCluster();
    kc = new k8s.KubeConfig();
    kc.loadFromFile(cluster.kubeconfigPath);
    ok(await kubectl(cluster.kubeconfigPath, ['create', 'namespace', ns]), 'create namespace');
  }, 240_000); // starts a cluster when run outside make test-k8s

  afterAll(async () => {
    if (cluster) {
      await kubectl(cluster.kubeconfigPath, ['delete', 'namespace', ns, '--wait=false']);
      await cluster.release();
    }
  }, 120_000);

  it('serves a real Kubernetes version with RBAC and the TokenRequest API', async () => {
    const v = ok(await kubectl(cluster.kubeconfigPath, ['version', '-o', 'json']), 'kubectl version');
    const server = JSON.parse(v.stdout).serverVersion;
    expect(server.major).toBe('1');
    expect(Number(server.minor)).toBeGreaterThanOrEqual(30);
    expect(server.gitVersion).toMatch(/^v1\.\d+\.\d+$/);
    const res = ok(await kubectl(cluster.kubeconfigPath, ['api-resources', '-o', 'name']), 'api-resources').stdout;
    expect(res.split('\n')).toEqual(expect.arrayContaining(['deployments.apps', 'jobs.batch', 'roles.rbac.authorization.k8s.io']));
  });

  it('rejects a wrong token (401)', async () => {
    const bad = new k8s.KubeConfig();
    bad.loadFromString(
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [
          { name: 'c', cluster: { server: cluster.server, 'certificate-authority-data': Buffer.from(cluster.caPem).toString('base64') } },
        ],
        users: [{ name: 'u', user: { token: 'not-a-valid-token' } }],
        contexts: [{ name: 'x', context: { cluster: 'c', user: 'u' } }],
        'current-context': 'x',
      }),
    );
    const err = await bad
      .makeApiClient(k8s.CoreV1Api)
      .listNamespace()
      .then(
        () => null,
        (e: unknown) => e as { code?: number },
      );
    expect(err?.code).toBe(401);
  });

  it('creates a Deployment with 0 replicas that the controller-manager rolls out', async () => {
    const apps = kc.makeApiClient(k8s.AppsV1Api);
    await apps.createNamespacedDeployment({
      namespace: ns,
      body: {
        metadata: { name: 'web', labels: { app: 'web' } },
        spec: {
          replicas: 0,
          selector: { matchLabels: { app: 'web' } },
          template: {
            metadata: { labels: { app: 'web' } },
            spec: { containers: [{ name: 'web', image: 'registry.invalid/web:1' }] },
          },
        },
      },
    });
    // kubectl's own rollout logic: needs the deployment controller to observe it and update status
    ok(await kubectl(cluster.kubeconfigPath, ['-n', ns, 'rollout', 'status', 'deployment/web', '--timeout=90s']), 'rollout status');
    const d = await apps.readNamespacedDeployment({ name: 'web', namespace: ns });
    expect(d.status?.observedGeneration).toBe(d.metadata?.generation);
    const rs = await apps.listNamespacedReplicaSet({ namespace: ns });
    expect(rs.items.map((r) => r.metadata?.ownerReferences?.[0]?.name)).toContain('web');
  });
});
