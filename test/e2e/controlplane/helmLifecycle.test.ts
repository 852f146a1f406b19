import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { parseAllDocuments } from 'yaml';
import { helm, kubectl, ok } from '../../helpers/cluster.js';
import { CHART, chartRelease, chartValues, objectsOf, writeValues } from '../../helpers/controlPlaneFixtures.js';

// A real apiserver under a loaded 2-core machine: generous per-test time (also under the root jest config).
jest.setTimeout(180_000);

/**
 * A real `helm install` / `helm upgrade` / `helm uninstall` of charts/opsgate against the real
 * apiserver. There is no kubelet, so pods never start: installs run without --wait and the
 * tests assert on the API objects (the controller-manager still reconciles Deployments).
 */
describe('helm install / upgrade / uninstall of charts/opsgate', () => {
  const rel = chartRelease('helm');
  const { ns, release } = rel;
  type Obj = ReturnType<typeof objectsOf>[number];
  let installed: Obj[] = [];

  beforeAll(() => rel.setUp({ install: false }), 240_000); // starts a cluster when run outside make test-k8s
  afterAll(() => rel.tearDown(), 120_000);

  const kc = () => rel.cluster.kubeconfigPath;

  async function manifest(): Promise<Obj[]> {
    const out = ok(await helm(kc(), ['get', 'manifest', release, '-n', ns.release]), 'helm get manifest').stdout;
    return objectsOf(parseAllDocuments(out).map((d) => d.toJS()));
  }

  async function getJson(kind: string, name: string, namespace?: string) {
    const r = await kubectl(kc(), ['get', kind, name, ...(namespace ? ['-n', namespace] : []), '-o', 'json']);
    return r.code === 0 ? (JSON.parse(r.stdout) as Record<string, any>) : undefined;
  }

  async function helmStatus() {
    return JSON.parse(ok(await helm(kc(), ['status', release, '-n', ns.release, '-o', 'json']), 'helm status').stdout);
  }

  it('installs: release deployed and every object of its manifest exists in the cluster', async () => {
    const values = writeValues(chartValues(ns));
    ok(await helm(kc(), ['install', release, CHART, '-n', ns.release, '-f', values, '--timeout', '2m']), 'helm install');
    const st = await helmStatus();
    expect(st.info.status).toBe('deployed');
    expect(st.version).toBe(1);

    installed = await manifest();
    expect(installed.length).toBeGreaterThan(10);
    for (const o of installed) {
      const got = await getJson(o.kind, o.name, o.namespace ?? ns.release);
      expect({ object: `${o.kind}/${o.name}`, exists: !!got }).toEqual({ object: `${o.kind}/${o.name}`, exists: true });
      expect(got?.metadata?.labels?.['app.kubernetes.io/managed-by']).toBe('Helm');
    }
    // the worker's Roles landed in the inventory namespaces, bound to the release's ServiceAccount
    const rb = await getJson('rolebinding', 'opsgate-worker', ns.apps);
    expect(rb?.subjects).toEqual([{ kind: 'ServiceAccount', name: 'opsgate-worker', namespace: ns.release }]);
    expect(await getJson('role', 'opsgate-worker', ns.deploy)).toBeDefined();
    expect(await getJson('role', 'opsgate-worker', ns.other)).toBeUndefined();
    // a real controller-manager took the api Deployment over (ReplicaSet created, status observed)
    ok(
      await kubectl(kc(), ['-n', ns.release, 'wait', '--for=condition=Progressing', 'deployment/opsgate-api', '--timeout=60s']),
      'wait Progressing',
    );
    const rs = JSON.parse(ok(await kubectl(kc(), ['-n', ns.release, 'get', 'replicasets', '-o', 'json']), 'get rs').stdout);
    expect(rs.items.map((r: any) => r.metadata.ownerReferences?.[0]?.name)).toContain('opsgate-api');
  });

  it('upgrades: new config rolls the pod template, replicas change, generated Redis password is kept, RBAC follows the inventory', async () => {
    const before = await getJson('deployment', 'opsgate-api', ns.release);
    const secretBefore = await getJson('secret', 'opsgate', ns.release);
    expect(secretBefore?.data?.REDIS_PASSWORD).toBeTruthy();

    const v = chartValues(ns);
    // the cache host moves out, a host in a new namespace comes in
    const inv = v.inventory as { hosts: Record<string, unknown> };
    delete inv.hosts['cache-1'];
    inv.hosts['batch-1'] = { namespace: ns.other, deployments: ['batch'] };
    const values = writeValues({ ...v, config: { logLevel: 'debug' }, api: { replicaCount: 3 } });
    ok(await helm(kc(), ['upgrade', release, CHART, '-n', ns.release, '-f', values, '--timeout', '2m']), 'helm upgrade');

    const st = await helmStatus();
    expect(st.info.status).toBe('deployed');
    expect(st.version).toBe(2);

    const cm = await getJson('configmap', 'opsgate-config', ns.release);
    expect(cm?.data?.LOG_LEVEL).toBe('debug');
    const after = await getJson('deployment', 'opsgate-api', ns.release);
    expect(after?.spec?.replicas).toBe(3);
    const ann = (d: any) => d?.spec?.template?.metadata?.annotations ?? {};
    expect(ann(after)['checksum/config']).toBeTruthy();
    expect(ann(after)['checksum/config']).not.toBe(ann(before)['checksum/config']);
    expect(after?.metadata?.generation).toBeGreaterThan(before?.metadata?.generation);

    // helm's lookup against the live Secret kept the generated password
    const secretAfter = await getJson('secret', 'opsgate', ns.release);
    expect(secretAfter?.data?.REDIS_PASSWORD).toBe(secretBefore?.data?.REDIS_PASSWORD);

    expect(await getJson('role', 'opsgate-worker', ns.other)).toBeDefined();
    const roleOther = await getJson('role', 'opsgate-worker', ns.other);
    expect(roleOther?.rules?.[0]?.resourceNames).toEqual(['batch']);
    expect(await getJson('role', 'opsgate-worker', ns.data)).toBeUndefined();

    const hist = JSON.parse(ok(await helm(kc(), ['history', release, '-n', ns.release, '-o', 'json']), 'helm history').stdout);
    expect(hist.map((h: { revision: number; status: string }) => [h.revision, h.status])).toEqual([
      [1, 'superseded'],
      [2, 'deployed'],
    ]);
  });

  it('rolls back to revision 1', async () => {
    ok(await helm(kc(), ['rollback', release, '1', '-n', ns.release, '--timeout', '2m']), 'helm rollback');
    const cm = await getJson('configmap', 'opsgate-config', ns.release);
    expect(cm?.data?.LOG_LEVEL).toBe('info');
    expect(await getJson('role', 'opsgate-worker', ns.data)).toBeDefined();
    expect((await helmStatus()).version).toBe(3);
  });

  it('uninstalls: every object of the release is gone, in every namespace', async () => {
    const current = await manifest();
    ok(await helm(kc(), ['uninstall', release, '-n', ns.release, '--timeout', '2m']), 'helm uninstall');
    const deadline = Date.now() + 60000;
    let left: string[];
    do {
      left = [];
      for (const o of [...installed, ...current]) {
        const r = await kubectl(kc(), ['get', o.kind, o.name, '-n', o.namespace ?? ns.release, '-o', 'name']);
        if (r.code === 0) left.push(`${o.kind}/${o.namespace ?? ns.release}/${o.name}`);
        else expect(r.stderr).toMatch(/NotFound|not found/);
      }
      if (left.length === 0) break;
      await new Promise((r) => setTimeout(r, 1000));
    } while (Date.now() < deadline);
    expect(left).toEqual([]);
    const list = ok(await helm(kc(), ['list', '-A', '-o', 'json']), 'helm list').stdout;
    expect(JSON.parse(list).map((r: { name: string; namespace: string }) => `${r.namespace}/${r.name}`)).not.toContain(
      `${ns.release}/${release}`,
    );
  });
});
