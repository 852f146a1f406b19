import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { parseAllDocuments } from 'yaml';
import { helm, kubectl, ok, useCluster } from '../../helpers/cluster.js';
import {
  ALL_TOGGLES,
  CHART,
  chartValues,
  createNamespaces,
  deleteNamespaces,
  installMonitoringCrds,
  namespaces,
  objectsOf,
  writeValues,
} from '../../helpers/controlPlaneFixtures.js';

// A real apiserver under a loaded 2-core machine: generous per-test time (also under the root jest config).
jest.setTimeout(180_000);

/**
 * The chart as real helm renders it, validated by a real kube-apiserver: server-side apply in
 * dry-run mode with strict field validation (unknown or misplaced fields are errors, every
 * object goes through defaulting, validation and admission), for several values sets.
 */
describe('chart rendered by helm, validated server-side by kube-apiserver', () => {
  let cluster: Awaited<ReturnType<typeof useCluster>>;
  const ns = namespaces('apply');
  const allNs = [ns.release, ns.apps, ns.data, ns.deploy];

  beforeAll(async () => {
    cluster = await useCluster();
    await createNamespaces(cluster, allNs);
    await installMonitoringCrds(cluster);
  }, 240_000); // starts a cluster when run outside make test-k8s

  afterAll(async () => {
    if (cluster) {
      await deleteNamespaces(cluster, allNs);
      await cluster.release();
    }
  }, 120_000);

  async function renderAndDryRun(values: unknown) {
    const file = writeValues(values);
    const rendered = ok(
      await helm(cluster.kubeconfigPath, ['template', 'opsgate', CHART, '--namespace', ns.release, '-f', file]),
      'helm template',
    ).stdout;
    const docs = parseAllDocuments(rendered).map((d) => d.toJS() as Record<string, unknown> | null);
    const objects = objectsOf(docs);
    const applied = ok(
      await kubectl(
        cluster.kubeconfigPath,
        ['apply', '--server-side', '--dry-run=server', '--validate=strict', '--field-manager=opsgate-test', '-o', 'name', '-f', '-'],
        rendered,
      ),
      'kubectl apply --server-side --dry-run=server',
    );
    // applied without -n: every object names its namespace (the chart renders no cluster-scoped kind)
    expect(objects.filter((o) => !o.namespace).map((o) => `${o.kind}/${o.name}`)).toEqual([]);
    return { objects, applied: applied.stdout.trim().split('\n').filter(Boolean), stderr: applied.stderr };
  }

  it('accepts the defaults with the required secret and an inventory', async () => {
    const { objects, applied, stderr } = await renderAndDryRun(chartValues(ns));
    // every rendered object was accepted (one "kind/name" line each), with no warnings
    expect(applied).toHaveLength(objects.length);
    expect(stderr).not.toMatch(/warning/i);
    const kinds = objects.map((o) => o.kind);
    expect(kinds).toEqual(
      expect.arrayContaining(['Deployment', 'Service', 'Secret', 'ConfigMap', 'ServiceAccount', 'Role', 'RoleBinding', 'StatefulSet']),
    );
    // a Role per inventory namespace, none elsewhere, and never a ClusterRole
    const roleNs = new Set(objects.filter((o) => o.kind === 'Role').map((o) => o.namespace));
    expect([...roleNs].sort()).toEqual([ns.apps, ns.data, ns.deploy].sort());
    expect(kinds).not.toContain('ClusterRole');
    expect(kinds).not.toContain('ClusterRoleBinding');
  });

  it('accepts every optional toggle on (Ingress, NetworkPolicy, PDB, HPA, ServiceMonitor, PrometheusRule, dashboard)', async () => {
    const { objects, applied, stderr } = await renderAndDryRun(chartValues(ns, ALL_TOGGLES));
    expect(applied).toHaveLength(objects.length);
    expect(stderr).not.toMatch(/warning/i);
    const kinds = new Set(objects.map((o) => o.kind));
    for (const k of ['Ingress', 'NetworkPolicy', 'PodDisruptionBudget', 'HorizontalPodAutoscaler', 'ServiceMonitor', 'PrometheusRule']) {
      expect(kinds).toContain(k);
    }
    expect(applied).toEqual(expect.arrayContaining([expect.stringMatching(/^servicemonitor\.monitoring\.coreos\.com\//)]));
    expect(applied).toEqual(expect.arrayContaining([expect.stringMatching(/^prometheusrule\.monitoring\.coreos\.com\//)]));
  });

  it('accepts an external Redis from an existing Secret, without the in-chart StatefulSet', async () => {
    const { objects, applied } = await renderAndDryRun({
      secrets: { existingSecret: 'opsgate-prod' },
      redis: { enabled: false },
      inventory: chartValues(ns).inventory,
    });
    expect(applied).toHaveLength(objects.length);
    const kinds = objects.map((o) => o.kind);
    expect(kinds).not.toContain('StatefulSet');
    expect(objects.filter((o) => o.kind === 'Secret')).toEqual([]);
  });

  it('the apiserver really validates: a corrupted render is refused', async () => {
    // guards the tests above against a dry-run that accepts anything
    const file = writeValues(chartValues(ns));
    const rendered = ok(
      await helm(cluster.kubeconfigPath, ['template', 'opsgate', CHART, '--namespace', ns.release, '-f', file]),
      'helm template',
    ).stdout;
    const broken = rendered.replace(/\n(\s+)replicas: (\d+)/, '\n$1replicas: "two"\n$1replicaz: $2');
    expect(broken).not.toBe(rendered);
    const r = await kubectl(cluster.kubeconfigPath, ['apply', '--server-side', '--dry-run=server', '--validate=strict', '-f', '-'], broken);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/replicas|replicaz/);
  });
});
