import { createHmac } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { REPO, run, toolPath, type RunResult } from './cluster.js';
import { waitFor as poll } from './waitFor.js';

/**
 * What the end-to-end tests share: the real node started by hack/node.sh (globalSetup), kubectl and
 * helm against it, HTTP to Services through their ClusterIPs (kube-proxy on this host routes them),
 * and polling with deadlines (never sleeps as a synchronisation).
 */
export const NODE_DIR = process.env.OPSGATE_NODE_DIR ?? '/tmp/opsgate-node';
export const KUBECONFIG = join(NODE_DIR, 'admin.kubeconfig');
export const CHART = join(REPO, 'charts', 'opsgate');
export const LOCAL_IMAGES = join(REPO, 'k8s', 'examples', 'local-images.yaml');
export const TESTTOOLS_IMAGE = 'localhost/opsgate-testtools:2';
export const PAUSE_IMAGE = `localhost/pause:${process.env.K8S_VERSION ?? 'v1.35.4'}`;

export function nodeIsUp(): boolean {
  return existsSync(join(NODE_DIR, 'up')) && existsSync(KUBECONFIG);
}

export function kubectl(args: string[], input?: string, timeoutMs = 120_000): Promise<RunResult> {
  return run(toolPath('kubectl'), ['--kubeconfig', KUBECONFIG, ...args], { input, timeoutMs });
}

export function helm(args: string[], timeoutMs = 420_000): Promise<RunResult> {
  const home = join(NODE_DIR, 'helm-home');
  return run(toolPath('helm'), args, {
    timeoutMs,
    env: {
      KUBECONFIG,
      HELM_CACHE_HOME: join(home, 'cache'),
      HELM_CONFIG_HOME: join(home, 'config'),
      HELM_DATA_HOME: join(home, 'data'),
    },
  });
}

export function ok(r: RunResult, what: string): RunResult {
  if (r.code !== 0) throw new Error(`${what} exited ${r.code}\nstdout:\n${r.stdout.slice(-4000)}\nstderr:\n${r.stderr.slice(-4000)}`);
  return r;
}

export type Obj = Record<string, any>;

export async function getJson(kind: string, name: string, namespace?: string): Promise<Obj | undefined> {
  const r = await kubectl(['get', kind, ...(name ? [name] : []), ...(namespace ? ['-n', namespace] : []), '-o', 'json']);
  return r.code === 0 ? (JSON.parse(r.stdout) as Obj) : undefined;
}

export async function list(kind: string, namespace: string, selector?: string): Promise<Obj[]> {
  const r = ok(await kubectl(['get', kind, '-n', namespace, ...(selector ? ['-l', selector] : []), '-o', 'json']), `kubectl get ${kind}`);
  return (JSON.parse(r.stdout) as Obj).items as Obj[];
}

export async function apply(yaml: string): Promise<void> {
  ok(await kubectl(['apply', '-f', '-'], yaml), 'kubectl apply');
}

/** Polls fn until it returns a truthy value (test/helpers/waitFor.ts); throws with the last value/error after timeoutMs. */
export function waitFor<T>(what: string, fn: () => Promise<T | undefined | null | false>, timeoutMs: number, intervalMs = 500): Promise<T> {
  return poll(what, async () => (await fn()) || undefined, timeoutMs, intervalMs);
}

/** http://<ClusterIP>:<port> of a Service (reached through kube-proxy's rules on this host). */
export async function serviceUrl(name: string, namespace: string, portName = 'http'): Promise<string> {
  const svc = await getJson('service', name, namespace);
  if (!svc) throw new Error(`no service ${namespace}/${name}`);
  const port = (svc.spec.ports as Obj[]).find((p) => p.name === portName) ?? svc.spec.ports[0];
  return `http://${svc.spec.clusterIP}:${port.port}`;
}

export interface HttpAnswer {
  status: number;
  body: Obj;
  text: string;
  headers: Headers;
}

export async function http(
  method: string,
  url: string,
  opts: { headers?: Record<string, string>; body?: string; timeoutMs?: number } = {},
): Promise<HttpAnswer> {
  const res = await fetch(url, { method, headers: opts.headers, body: opts.body, signal: AbortSignal.timeout(opts.timeoutMs ?? 10_000) });
  const text = await res.text();
  let body: Obj = {};
  try {
    body = JSON.parse(text) as Obj;
  } catch {
    /* not JSON (Bull Board's HTML) */
  }
  return { status: res.status, body, text, headers: res.headers };
}

export function githubSignature(secret: string, body: string): string {
  return `sha256=${createHmac('sha256', secret).update(body).digest('hex')}`;
}

export function podReady(p: Obj): boolean {
  return (
    p.status?.phase === 'Running' &&
    (p.status?.conditions as Obj[] | undefined)?.some((c) => c.type === 'Ready' && c.status === 'True') === true &&
    !p.metadata.deletionTimestamp
  );
}

export function readText(path: string): string {
  return readFileSync(path, 'utf8');
}
