import { AppsV1Api, KubeConfig, type V1Deployment } from '@kubernetes/client-node';
import { loadKubeConfig as loadSharedKubeConfig, NoKubeConfigError, type KubeEnv } from '../shared/kubeconfig.js';
import { ClusterUnavailableError, type DeploymentStatus, type HostStatusProvider } from './hostStatus.js';
import { withTimeout } from '../shared/timeout.js';

/**
 * The real HostStatusProvider: AppsV1Api.readNamespacedDeployment for each Deployment.
 * A missing Deployment is reported (found: false); an unreachable or refusing API server is a 503.
 */
const RESTARTED_AT = 'kubectl.kubernetes.io/restartedAt';

/**
 * Kubernetes credentials in kubectl's order (KUBECONFIG path list, ~/.kube/config, in-cluster
 * ServiceAccount), shared with the worker (src/shared/kubeconfig.ts); undefined when there are none.
 */
export function loadKubeConfig(env: KubeEnv = process.env): KubeConfig | undefined {
  try {
    return loadSharedKubeConfig(env);
  } catch (err) {
    if (err instanceof NoKubeConfigError) return undefined;
    throw err;
  }
}

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

export function createKubeHostStatusProvider(kc: KubeConfig | undefined, opts: { timeoutMs?: number } = {}): HostStatusProvider {
  const timeoutMs = opts.timeoutMs ?? 5000;
  if (!kc) {
    return {
      deployments: () =>
        Promise.reject(new ClusterUnavailableError('no Kubernetes cluster configured (no kubeconfig or in-cluster service account)')),
    };
  }
  const api = kc.makeApiClient(AppsV1Api);
  return {
    async deployments(namespace, names) {
      return Promise.all(
        names.map(async (name) => {
          try {
            const d = await withTimeout(api.readNamespacedDeployment({ name, namespace }), timeoutMs, 'Kubernetes API read');
            return statusOf(name, d);
          } catch (err) {
            const code = (err as { code?: unknown }).code;
            if (code === 404) {
              return { name, found: false, replicas: null, ready: 0, updated: 0, available: 0, restarted_at: null };
            }
            if (typeof code === 'number') throw new ClusterUnavailableError(`Kubernetes API answered ${code}; retry later`);
            throw new ClusterUnavailableError();
          }
        }),
      );
    },
  };
}
