import { existsSync } from 'node:fs';
import { isIPv6 } from 'node:net';
import { homedir } from 'node:os';
import { delimiter, join } from 'node:path';
import { KubeConfig } from '@kubernetes/client-node';
import { UnrecoverableError } from 'bullmq';

/**
 * Kubernetes access for the worker's jobs. The KubeConfig comes from a factory (WorkerDeps.kubeConfig)
 * so tests and the cluster suite can point the worker at any API server; the default factory reads
 * the process environment the way kubectl/client-go do, except that it refuses to fall back to
 * client-node's implicit "http://localhost:8080" when nothing is configured.
 */
export type KubeConfigFactory = () => KubeConfig;

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
export function loadKubeConfig(
  env: KubeEnv = process.env,
  opts: { pathPrefix?: string } = {},
): KubeConfig {
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

/** A factory over a fixed environment (what the worker uses by default). */
export function kubeConfigFromEnv(env: KubeEnv = process.env): KubeConfigFactory {
  return () => loadKubeConfig(env);
}

/** A KubeConfig for a bare API server URL and bearer token (handy for the cluster test suite). */
export function kubeConfigForToken(server: string, token: string, opts: { caData?: string; skipTLSVerify?: boolean } = {}): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: 'c', server, caData: opts.caData, skipTLSVerify: opts.skipTLSVerify ?? false }],
    users: [{ name: 'u', token }],
    contexts: [{ name: 'ctx', cluster: 'c', user: 'u' }],
    currentContext: 'ctx',
  });
  return kc;
}

/** Calls the factory; a missing/unreadable configuration becomes an UnrecoverableError. */
export function resolveKubeConfig(factory: KubeConfigFactory): KubeConfig {
  try {
    return factory();
  } catch (err) {
    if (err instanceof NoKubeConfigError) throw new UnrecoverableError(err.message);
    throw new UnrecoverableError(`no Kubernetes configuration: ${(err as Error).message}`);
  }
}

/** The Kubernetes API status code of a client-node error, if it is one (ApiException). */
export function apiStatus(err: unknown): number | undefined {
  if (err && typeof err === 'object' && 'code' in err && typeof (err as { code: unknown }).code === 'number') {
    return (err as { code: number }).code;
  }
  return undefined;
}

/** The Status.message of an API error body, bounded; safe to log (never carries credentials). */
function statusMessage(err: unknown): string | undefined {
  const body = (err as { body?: unknown }).body;
  let parsed: unknown = body;
  if (typeof body === 'string') {
    try {
      parsed = JSON.parse(body);
    } catch {
      return undefined;
    }
  }
  const msg = (parsed as { message?: unknown } | undefined)?.message;
  return typeof msg === 'string' ? msg.slice(0, 300) : undefined;
}

/** Network-level error code (ECONNREFUSED, ENOTFOUND, UND_ERR_CONNECT_TIMEOUT...) of a fetch failure. */
function networkCode(err: unknown): string {
  let e: unknown = err;
  let innermost = err instanceof Error ? err.message : String(err);
  for (let i = 0; i < 4 && e && typeof e === 'object'; i++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string') return code;
    const nested = (e as { errors?: unknown }).errors; // AggregateError (IPv4 + IPv6 attempts)
    if (Array.isArray(nested)) {
      const c = (nested[0] as { code?: unknown } | undefined)?.code;
      if (typeof c === 'string') return c;
    }
    if (e instanceof Error && e.message) innermost = e.message;
    e = (e as { cause?: unknown }).cause;
  }
  return innermost.slice(0, 200);
}

/**
 * Maps a Kubernetes API failure to the job outcome:
 * - 401/403: UnrecoverableError with a clear reason (credentials / RBAC will not fix themselves);
 * - 404: UnrecoverableError (`what` not found);
 * - other 4xx except 408/429: UnrecoverableError (the request is wrong; retrying cannot help);
 * - 408, 429, 5xx and network errors: a plain Error, so BullMQ retries with backoff.
 */
export function k8sFailure(err: unknown, what: string, verb: string): Error {
  if (err instanceof UnrecoverableError) return err;
  const status = apiStatus(err);
  if (status === undefined) {
    const message = err instanceof Error ? err.message : String(err);
    if (/protocol is not allowed|No active cluster|No users? (found|provided)/i.test(message)) {
      return new UnrecoverableError(`Kubernetes client configuration error while trying to ${verb} ${what}: ${message.slice(0, 200)}`);
    }
    return new Error(`Kubernetes API unreachable while trying to ${verb} ${what}: ${networkCode(err)}`);
  }
  const detail = statusMessage(err);
  const suffix = detail ? `: ${detail}` : '';
  if (status === 401) {
    return new UnrecoverableError(
      `Kubernetes API rejected the worker's credentials (401 Unauthorized) while trying to ${verb} ${what}; check the kubeconfig or ServiceAccount token`,
    );
  }
  if (status === 403) {
    return new UnrecoverableError(
      `Kubernetes API forbids the worker to ${verb} ${what} (403 Forbidden); grant its ServiceAccount the RBAC permission${suffix}`,
    );
  }
  if (status === 404) return new UnrecoverableError(`${what} not found (404)${suffix}`);
  if (status === 408 || status === 429 || status >= 500) {
    return new Error(`Kubernetes API error ${status} while trying to ${verb} ${what}${suffix}`);
  }
  return new UnrecoverableError(`Kubernetes API refused to ${verb} ${what} (${status})${suffix}`);
}

/** Sleeps `ms`, or rejects early with the signal's reason when it aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(abortReason(signal));
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(abortReason(signal!));
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

export function abortReason(signal: AbortSignal): Error {
  const r: unknown = signal.reason;
  return r instanceof Error ? r : new Error(typeof r === 'string' ? r : 'aborted');
}

/** RFC 3339 timestamp without fractional seconds, as kubectl writes restartedAt. */
export function rfc3339(date: Date): string {
  return date.toISOString().replace(/\.\d{3}Z$/, 'Z');
}
