import { existsSync } from 'node:fs';
import { isIPv6 } from 'node:net';
import { homedir } from 'node:os';
import { delimiter, join } from 'node:path';
import { KubeConfig } from '@kubernetes/client-node';

/**
 * Kubernetes client configuration for both processes (the worker's jobs, the API's host status),
 * read the way kubectl/client-go do, except that nothing configured is an error rather than
 * client-node's implicit "http://localhost:8080" (our own API port in development).
 * Importing this module loads @kubernetes/client-node: the API imports it lazily.
 */
export const SERVICEACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

/** Raised when no cluster configuration exists; jobs turn it into an UnrecoverableError (dead-lettered). */
export class NoKubeConfigError extends Error {
  constructor(detail: string) {
    super(`no Kubernetes configuration: ${detail}`);
    this.name = 'NoKubeConfigError';
  }
}

export interface KubeEnv {
  KUBECONFIG?: string;
  HOME?: string;
  KUBERNETES_SERVICE_HOST?: string;
  KUBERNETES_SERVICE_PORT?: string;
}

/**
 * Loads the cluster configuration, in kubectl's order: $KUBECONFIG (path list), ~/.kube/config,
 * then in-cluster (KUBERNETES_SERVICE_HOST/PORT + the mounted ServiceAccount token).
 * Throws NoKubeConfigError naming what was looked for; never the content of any file.
 */
export function loadKubeConfig(env: KubeEnv = process.env, opts: { pathPrefix?: string } = {}): KubeConfig {
  const kc = new KubeConfig();
  const prefix = opts.pathPrefix ?? '';
  const saDir = prefix + SERVICEACCOUNT_DIR;
  const kubeconfig = env.KUBECONFIG?.trim();
  if (kubeconfig) {
    const files = kubeconfig.split(delimiter).filter(Boolean);
    for (const f of files) {
      if (!existsSync(f)) throw new NoKubeConfigError(`KUBECONFIG names ${f}, which does not exist`);
    }
    try {
      kc.loadFromFile(files[0]!);
      for (const f of files.slice(1)) {
        const more = new KubeConfig();
        more.loadFromFile(f);
        kc.mergeConfig(more);
      }
    } catch (err) {
      throw new NoKubeConfigError(`KUBECONFIG could not be parsed (${(err as Error).name})`);
    }
    return requireCluster(kc, 'KUBECONFIG');
  }
  const home = env.HOME ?? homedir();
  const userConfig = home ? join(home, '.kube', 'config') : undefined;
  if (userConfig && existsSync(userConfig)) {
    try {
      kc.loadFromFile(userConfig);
    } catch (err) {
      throw new NoKubeConfigError(`${userConfig} could not be parsed (${(err as Error).name})`);
    }
    return requireCluster(kc, userConfig);
  }
  const host = env.KUBERNETES_SERVICE_HOST;
  const port = env.KUBERNETES_SERVICE_PORT;
  if (host && port && existsSync(join(saDir, 'token'))) {
    // Like KubeConfig.loadFromCluster(), but from `env` rather than process.env.
    const scheme = port === '80' || port === '8080' || port === '8001' ? 'http' : 'https';
    const server = `${scheme}://${isIPv6(host) ? `[${host}]` : host}:${port}`;
    kc.loadFromOptions({
      clusters: [{ name: 'inCluster', server, caFile: join(saDir, 'ca.crt'), skipTLSVerify: false }],
      users: [{ name: 'inClusterUser', authProvider: { name: 'tokenFile', config: { tokenFile: join(saDir, 'token') } } }],
      contexts: [{ name: 'inClusterContext', cluster: 'inCluster', user: 'inClusterUser' }],
      currentContext: 'inClusterContext',
    });
    return requireCluster(kc, 'in-cluster ServiceAccount');
  }
  throw new NoKubeConfigError(
    'KUBECONFIG is not set, ~/.kube/config does not exist and the worker is not running in a cluster ' +
      '(KUBERNETES_SERVICE_HOST and a mounted ServiceAccount token)',
  );
}

function requireCluster(kc: KubeConfig, source: string): KubeConfig {
  if (!kc.getCurrentCluster()) throw new NoKubeConfigError(`${source} has no current context/cluster`);
  return kc;
}
