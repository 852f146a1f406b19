import { setTimeout as delay } from 'node:timers/promises';
import { KubeConfig } from '@kubernetes/client-node';
import { UnrecoverableError } from 'bullmq';
import { NoKubeConfigError, type KubeConfigFactory } from '../src/shared/kubeconfig.js';

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
export async function resolveKubeConfig(factory: KubeConfigFactory): Promise<KubeConfig> {
  try {
    return await factory();
  } catch (err) {
    if (err instanceof NoKubeConfigError) throw new UnrecoverableError(err.message);
    throw new UnrecoverableError(`no Kubernetes configuration: ${(err as Error).message}`);
  }
}

/** The Kubernetes API status code of a client-node error, if it is one (ApiException). */
export function apiStatus(err: unknown): number | undefined {
  return err && typeof err === 'object' && 'code' in err && typeof err.code === 'number' ? err.code : undefined;
}

/** The Status.message of an API error body, bounded; safe to log (never carries credentials). */
function statusMessage(err: unknown): string | undefined {
  const body = (err as { body?: unknown }).body;
  let parsed: unknown;
  try {
    parsed = typeof body === 'string' ? JSON.parse(body) : body;
  } catch {
    return undefined;
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
    const c = Array.isArray(nested) ? (nested[0] as { code?: unknown } | undefined)?.code : undefined;
    if (typeof c === 'string') return c;
    if (e instanceof Error && e.message) innermost = e.message;
    e = (e as { cause?: unknown }).cause;
  }
  return innermost.slice(0, 200);
}

/**
 * A Kubernetes API failure as the job's error: 408, 429, 5xx and network errors are a plain Error
 * (BullMQ retries with backoff); any other 4xx is an UnrecoverableError (retrying cannot fix it).
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
export async function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  await delay(ms, undefined, { signal }).catch(() => Promise.reject(abortReason(signal!)));
}

export function abortReason(signal: AbortSignal): Error {
  const r: unknown = signal.reason;
  return r instanceof Error ? r : new Error(typeof r === 'string' ? r : 'aborted');
}

/** RFC 3339 timestamp without fractional seconds, as kubectl writes restartedAt. */
export function rfc3339(date: Date): string {
  return date.toISOString().replace(/\.\d{3}Z$/, 'Z');
}
