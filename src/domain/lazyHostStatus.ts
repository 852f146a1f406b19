import { existsSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { ClusterUnavailableError, type HostStatusProvider } from './hostStatus.js';

/**
 * The API's host-status provider, loading @kubernetes/client-node only on the first
 * GET /ops/hosts/{host}. The client and its dependencies cost ~78 MB of RSS at import
 * (measured by `make bench`), and the API needs them for this one read-only endpoint; every
 * other request (webhooks, restart submissions) never touches Kubernetes.
 */
export function createLazyKubeHostStatusProvider(
  env: Record<string, string | undefined> = process.env,
  opts: { timeoutMs?: number } = {},
): HostStatusProvider {
  let inner: Promise<HostStatusProvider> | undefined;
  return {
    async deployments(namespace, names) {
      inner ??= import('./kubeHostStatus.js').then((m) => m.createKubeHostStatusProvider(m.loadKubeConfig(env), opts));
      let provider: HostStatusProvider;
      try {
        provider = await inner;
      } catch {
        inner = undefined; // try again on the next request rather than failing forever
        throw new ClusterUnavailableError('Kubernetes client could not be initialised; retry later');
      }
      return provider.deployments(namespace, names);
    },
  };
}

/** Whether any Kubernetes configuration is there to load (same order as loadKubeConfig), without loading the client. */
export function kubeConfigPresent(env: Record<string, string | undefined> = process.env): boolean {
  if (env.KUBECONFIG) return true;
  if (existsSync(join(env.HOME ?? homedir(), '.kube', 'config'))) return true;
  return Boolean(env.KUBERNETES_SERVICE_HOST);
}
