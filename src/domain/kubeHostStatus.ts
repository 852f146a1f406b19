import type { AppsV1Api, V1Deployment } from '@kubernetes/client-node';
import { NoKubeConfigError, type KubeConfigFactory } from '../shared/kubeconfig.js';
import { withTimeout } from '../shared/timeout.js';
import { ClusterUnavailableError, type DeploymentStatus, type HostStatusProvider } from './hostStatus.js';

/**
 * The real HostStatusProvider: a missing Deployment is found: false, an unreachable or refusing API
 * server a 503. The client is built on the first GET /ops/hosts/{host}, since @kubernetes/client-node
 * costs about 78 MB of RSS at import (measured by `make bench`); no configuration: 503, looked for again.
 */
const RESTARTED_AT = 'kubectl.kubernetes.io/restartedAt';

function statusOf(name: string, d: V1Deployment): DeploymentStatus {
  return {
    name,
    found: true,
    replicas: d.spec?.replicas ?? null,
    ready: d.status?.readyReplicas ?? 0,
    updated: d.status?.updatedReplicas ?? 0,
    available: d.status?.availableReplicas ?? 0,
    restarted_at: d.spec?.template?.metadata?.annotations?.[RESTARTED_AT] ?? null,
  };
}

export function createKubeHostStatusProvider(kubeConfig: KubeConfigFactory, opts: { timeoutMs?: number } = {}): HostStatusProvider {
  const timeoutMs = opts.timeoutMs ?? 5000;
  let client: Promise<AppsV1Api> | undefined;
  const apps = (): Promise<AppsV1Api> =>
    (client ??= (async () => {
      const kc = await kubeConfig();
      const { AppsV1Api } = await import('@kubernetes/client-node');
      return kc.makeApiClient(AppsV1Api);
    })().catch((err: unknown) => {
      client = undefined; // looked for again on the next request
      if (err instanceof NoKubeConfigError) {
        throw new ClusterUnavailableError('no Kubernetes cluster configured (no kubeconfig or in-cluster service account)');
      }
      throw new ClusterUnavailableError('Kubernetes client could not be initialised; retry later');
    }));
  return {
    async deployments(namespace, names) {
      const api = await apps();
      return Promise.all(
        names.map(async (name) => {
          try {
            const d = await withTimeout(api.readNamespacedDeployment({ name, namespace }), timeoutMs, 'Kubernetes API read');
            return statusOf(name, d);
          } catch (err) {
            const code = (err as { code?: unknown }).code;
            if (code === 404) return { ...statusOf(name, {}), found: false };
            if (typeof code === 'number') throw new ClusterUnavailableError(`Kubernetes API answered ${code}; retry later`);
            throw new ClusterUnavailableError();
          }
        }),
      );
    },
  };
}
