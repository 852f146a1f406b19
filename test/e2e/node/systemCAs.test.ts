import { afterAll, beforeAll, describe, expect, jest, test } from '@jest/globals';
import { stringify } from 'yaml';
import { TAG } from '../../helpers/images.js';
import { apply, getJson, kubectl, ok, waitFor, type Obj } from '../../helpers/nodeSupport.js';

/**
 * The worker image unchanged, as the chart runs it (UID 1000, read-only root filesystem, no
 * capabilities), reaching the Kubernetes API over TLS through the worker's own kubeconfig loader
 * (dist/src/shared/kubeconfig.js) and @kubernetes/client-node, with a kubeconfig that names no
 * certificate authority: the server's certificate is checked against the system CA bundle,
 * /etc/ssl/certs/ca-certificates.crt (NODE_EXTRA_CA_CERTS). With the cluster's CA mounted over that
 * bundle, as an operator adds a private CA, the call succeeds; with the image's own bundle (Debian's
 * public CAs only) the same call is refused as an unknown issuer, so the trust did come from the file.
 * (In the cluster the worker normally uses its ServiceAccount's ca.crt; chartInstall.test.ts runs that.)
 */
jest.setTimeout(600_000);

const NS = 'e2e-system-cas';
const IMAGE = `localhost/opsgate-worker:${TAG}`;
const BUNDLE = '/etc/ssl/certs/ca-certificates.crt';

// The worker's loader, then a call every ServiceAccount may make (GET /version); prints one JSON line.
const SCRIPT = `
const { loadKubeConfig } = await import('/app/dist/src/shared/kubeconfig.js');
const k8s = await import('@kubernetes/client-node');
const kc = await loadKubeConfig();
const cluster = kc.getCurrentCluster();
try {
  const v = await kc.makeApiClient(k8s.VersionApi).getCode();
  console.log(JSON.stringify({ ok: true, server: cluster.server, caInKubeconfig: Boolean(cluster.caData || cluster.caFile), gitVersion: v.gitVersion }));
} catch (e) {
  const codes = []; for (let c = e; c; c = c.cause) if (c.code) codes.push(c.code);
  console.log(JSON.stringify({ ok: false, server: cluster.server, caInKubeconfig: Boolean(cluster.caData || cluster.caFile), codes, message: String(e.message) }));
  process.exitCode = 1;
}`;

const kubeconfig = {
  apiVersion: 'v1',
  kind: 'Config',
  clusters: [{ name: 'in-cluster-by-name', cluster: { server: 'https://kubernetes.default.svc' } }],
  users: [{ name: 'worker', user: { 'token-file': '/var/run/secrets/kubernetes.io/serviceaccount/token' } }],
  contexts: [{ name: 'worker', context: { cluster: 'in-cluster-by-name', user: 'worker' } }],
  'current-context': 'worker',
};

function pod(name: string, clusterCaAsSystemBundle: boolean): Obj {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name, namespace: NS },
    spec: {
      restartPolicy: 'Never',
      securityContext: { runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000, seccompProfile: { type: 'RuntimeDefault' } },
      containers: [
        {
          name: 'worker',
          image: IMAGE,
          imagePullPolicy: 'Never',
          command: ['node', '--input-type=module', '-e', SCRIPT],
          env: [{ name: 'KUBECONFIG', value: '/etc/opsgate-kube/config' }],
          securityContext: { readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: { drop: ['ALL'] } },
          volumeMounts: [
            { name: 'kubeconfig', mountPath: '/etc/opsgate-kube', readOnly: true },
            ...(clusterCaAsSystemBundle ? [{ name: 'cluster-ca', mountPath: BUNDLE, subPath: 'ca.crt', readOnly: true }] : []),
          ],
        },
      ],
      volumes: [
        { name: 'kubeconfig', configMap: { name: 'worker-kubeconfig' } },
        // every namespace has it: the cluster's CA, published by kube-controller-manager
        { name: 'cluster-ca', configMap: { name: 'kube-root-ca.crt' } },
      ],
    },
  };
}

async function finished(name: string): Promise<{ phase: string; line: Obj }> {
  const phase = await waitFor(
    `pod ${name} finished`,
    async () => {
      const p = await getJson('pod', name, NS);
      return p && ['Succeeded', 'Failed'].includes(p.status?.phase as string) ? (p.status.phase as string) : undefined;
    },
    300_000,
    1000,
  );
  const logs = ok(await kubectl(['-n', NS, 'logs', name]), `kubectl logs ${name}`).stdout.trim();
  return { phase, line: JSON.parse(logs.split('\n').pop()!) as Obj };
}

beforeAll(async () => {
  await kubectl(['delete', 'namespace', NS, '--ignore-not-found', '--wait=true'], undefined, 300_000);
  ok(await kubectl(['create', 'namespace', NS]), `create namespace ${NS}`);
  await waitFor(
    'the namespace ServiceAccount and kube-root-ca.crt',
    async () => (await getJson('configmap', 'kube-root-ca.crt', NS)) && (await getJson('serviceaccount', 'default', NS)),
    60_000,
  );
  await apply(
    stringify({
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: 'worker-kubeconfig', namespace: NS },
      data: { config: stringify(kubeconfig) },
    }),
  );
});

afterAll(async () => {
  await kubectl(['delete', 'namespace', NS, '--ignore-not-found', '--wait=false']);
});

describe('the worker image reaches the Kubernetes API over TLS with the system CAs', () => {
  test('the cluster CA in the system bundle: GET /version over https succeeds, with no CA in the kubeconfig', async () => {
    await apply(stringify(pod('trusted', true)));
    const { phase, line } = await finished('trusted');
    expect(line).toMatchObject({ ok: true, server: 'https://kubernetes.default.svc', caInKubeconfig: false });
    expect(line.gitVersion).toMatch(/^v1\.\d+\.\d+/);
    expect(phase).toBe('Succeeded');
  });

  test("the image's own bundle (public CAs only): the same call is refused as an unknown issuer", async () => {
    await apply(stringify(pod('untrusted', false)));
    const { phase, line } = await finished('untrusted');
    expect(line).toMatchObject({ ok: false, caInKubeconfig: false });
    expect((line.codes as string[]).join(' ')).toMatch(
      /UNABLE_TO_VERIFY_LEAF_SIGNATURE|UNABLE_TO_GET_ISSUER_CERT_LOCALLY|SELF_SIGNED_CERT_IN_CHAIN/,
    );
    expect(phase).toBe('Failed');
  });
});
