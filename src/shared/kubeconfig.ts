import { existsSync } from 'node:fs';
import { isIPv6 } from 'node:net';
import { homedir } from 'node:os';
import { delimiter, join } from 'node:path';
import type { KubeConfig } from '@kubernetes/client-node';

/**
 * The Kubernetes configuration, found as kubectl does, except that nothing configured is an error rather than client-node's
 * implicit "http://localhost:8080" (the API's own port in development). @kubernetes/client-node (about 78 MB of RSS at
 * import) is loaded only when a configuration is first built, so the API can import this module at start-up.
 */
const SERVICEACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

/** Raised when no cluster configuration exists; jobs turn it into an UnrecoverableError (dead-lettered). */
export class NoKubeConfigError extends Error {
  constructor(detail: string) {
    super(`no Kubernetes configuration: ${detail}`);
    this.name = 'NoKubeConfigError';
  }
}

export type KubeEnv = Partial<Record<'KUBECONFIG' | 'HOME' | 'KUBERNETES_SERVICE_HOST' | 'KUBERNETES_SERVICE_PORT', string>>;

/** pathPrefix: prefix of the ServiceAccount directory (tests). */
type KubeConfigLookup = { pathPrefix?: string };

/** Kubeconfig files (merged in order), or the in-cluster ServiceAccount. */
type KubeConfigSource = { kind: 'files'; name: string; files: string[] } | { kind: 'in-cluster'; server: string; saDir: string };

/** kubectl's order: $KUBECONFIG (every file must exist), ~/.kube/config, then in-cluster; reads no file. */
export function findKubeConfig(env: KubeEnv = process.env, opts: KubeConfigLookup = {}): KubeConfigSource {
  const kubeconfig = env.KUBECONFIG?.trim();
  if (kubeconfig) {
    const files = kubeconfig.split(delimiter).filter(Boolean);
    for (const f of files) {
      if (!existsSync(f)) throw new NoKubeConfigError(`KUBECONFIG names ${f}, which does not exist`);
    }
    return { kind: 'files', name: 'KUBECONFIG', files };
  }
  const home = env.HOME ?? homedir();
  const userConfig = home ? join(home, '.kube', 'config') : undefined;
  if (userConfig && existsSync(userConfig)) return { kind: 'files', name: userConfig, files: [userConfig] };
  const saDir = (opts.pathPrefix ?? '') + SERVICEACCOUNT_DIR;
  const host = env.KUBERNETES_SERVICE_HOST;
  const port = env.KUBERNETES_SERVICE_PORT;
  if (host && port && existsSync(join(saDir, 'token'))) {
    // Like KubeConfig.loadFromCluster(), but from `env` rather than process.env.
    const scheme = port === '80' || port === '8080' || port === '8001' ? 'http' : 'https';
    return { kind: 'in-cluster', server: `${scheme}://${isIPv6(host) ? `[${host}]` : host}:${port}`, saDir };
  }
  throw new NoKubeConfigError(
    'KUBECONFIG is not set, ~/.kube/config does not exist and this process is not running in a cluster ' +
      '(KUBERNETES_SERVICE_HOST and a mounted ServiceAccount token)',
  );
}

/** The configuration findKubeConfig finds, read; rejects with NoKubeConfigError when there is none or it cannot be parsed. */
export async function loadKubeConfig(env: KubeEnv = process.env, opts: KubeConfigLookup = {}): Promise<KubeConfig> {
  const source = findKubeConfig(env, opts);
  const { KubeConfig } = await import('@kubernetes/client-node');
  const kc = new KubeConfig();
  if (source.kind === 'in-cluster') {
    kc.loadFromOptions({
      clusters: [{ name: 'inCluster', server: source.server, caFile: join(source.saDir, 'ca.crt'), skipTLSVerify: false }],
      users: [{ name: 'inClusterUser', authProvider: { name: 'tokenFile', config: { tokenFile: join(source.saDir, 'token') } } }],
      contexts: [{ name: 'inClusterContext', cluster: 'inCluster', user: 'inClusterUser' }],
      currentContext: 'inClusterContext',
    });
    return requireCluster(kc, 'in-cluster ServiceAccount');
  }
  try {
    kc.loadFromFile(source.files[0]!);
    for (const f of source.files.slice(1)) {
      const more = new KubeConfig();
      more.loadFromFile(f);
      kc.mergeConfig(more);
    }
  } catch (err) {
    throw new NoKubeConfigError(`${source.name} could not be parsed (${(err as Error).name})`);
  }
  return requireCluster(kc, source.name);
}

/** The environment's configuration (kubeConfigFromEnv) in production; tests give their own. */
export type KubeConfigFactory = () => KubeConfig | Promise<KubeConfig>;

export function kubeConfigFromEnv(env: KubeEnv = process.env, opts: KubeConfigLookup = {}): KubeConfigFactory {
  return () => loadKubeConfig(env, opts);
}

function requireCluster(kc: KubeConfig, source: string): KubeConfig {
  if (!kc.getCurrentCluster()) throw new NoKubeConfigError(`${source} has no current context/cluster`);
  return kc;
}
