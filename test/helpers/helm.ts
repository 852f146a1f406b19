import { execFile } from 'node:child_process';
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseAllDocuments } from 'yaml';
import { SOURCE_SECRET_ENVS } from '../../src/sources/index.js';

/**
 * Runs the real helm (built by `make tools-helm` into .tools/bin; HELM overrides) on charts/opsgate
 * and parses what it renders. Shared by the test/integration/chart suites.
 */
export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
export const CHART = join(ROOT, 'charts/opsgate');
export const VALUES_DIR = join(CHART, 'ci');
export const RELEASE = 'opsgate';
/**
 * The Kubernetes version charts are rendered for: mk/tools.mk's K8S_VERSION (the apiserver the
 * cluster tests run). Passed explicitly because a helm built from source without the release
 * ldflags assumes v1.20, below the chart's kubeVersion.
 */
export const KUBE_VERSION = /^K8S_VERSION\s*\?=\s*v?(\S+)/m.exec(readFileSync(join(ROOT, 'mk/tools.mk'), 'utf8'))?.[1] ?? '1.35.0';
export const NAMESPACE = 'opsgate';

/**
 * The credentials of PROMETHEUS_URL and ALERTMANAGER_URL the chart keeps in the Secret: they reach
 * the processes as files (<KEY>_FILE), never as environment values.
 */
export const OUTBOUND_SECRET_KEYS: readonly string[] = [
  'PROMETHEUS_BEARER_TOKEN',
  'PROMETHEUS_BASIC_AUTH_PASSWORD',
  'PROMETHEUS_TENANT',
  'ALERTMANAGER_BEARER_TOKEN',
  'ALERTMANAGER_BASIC_AUTH_PASSWORD',
];

/** The Secret keys = environment variables that only ever come from a Secret (every webhook sender's included). */
export const SECRET_VARS: readonly string[] = [
  'OPS_API_KEY_ROLES',
  'OPS_BEARER_TOKEN',
  ...SOURCE_SECRET_ENVS,
  'NOTIFY_WEBHOOK_URLS',
  'REDIS_URL',
  'REDIS_PASSWORD',
  ...OUTBOUND_SECRET_KEYS,
];

export function helmBin(): string {
  const bin = process.env.HELM ?? join(ROOT, '.tools/bin/helm');
  if (!existsSync(bin)) throw new Error(`helm not found at ${bin}: run \`make tools-helm\` (or set HELM)`);
  return bin;
}

export interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

export function run(
  cmd: string,
  args: string[],
  opts: { cwd?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number } = {},
): Promise<RunResult> {
  return new Promise((resolvePromise) => {
    execFile(
      cmd,
      args,
      { cwd: opts.cwd ?? ROOT, env: opts.env ?? process.env, maxBuffer: 64 * 1024 * 1024, timeout: opts.timeoutMs ?? 120_000 },
      (err, stdout, stderr) => {
        const code = err ? (typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : 1) : 0;
        resolvePromise({ code, stdout: String(stdout), stderr: String(stderr) });
      },
    );
  });
}

export function helm(args: string[]): Promise<RunResult> {
  return run(helmBin(), args);
}

export interface RenderOptions {
  /** Chart directory; default charts/opsgate. */
  chart?: string;
  files?: string[];
  set?: Record<string, string>;
  setString?: Record<string, string>;
  /** --kube-version (default KUBE_VERSION, the cluster tests' version) */
  kubeVersion?: string;
  /** Extra --api-versions (capabilities of the target cluster). */
  apiVersions?: string[];
}

function valueArgs(o: RenderOptions): string[] {
  const args: string[] = [];
  for (const f of o.files ?? []) args.push('-f', f.includes('/') ? f : join(VALUES_DIR, f));
  for (const [k, v] of Object.entries(o.set ?? {})) args.push('--set', `${k}=${v}`);
  for (const [k, v] of Object.entries(o.setString ?? {})) args.push('--set-string', `${k}=${v}`);
  for (const a of o.apiVersions ?? []) args.push('--api-versions', a);
  return args;
}

export function templateArgs(o: RenderOptions = {}): string[] {
  return [
    'template',
    RELEASE,
    o.chart ?? CHART,
    '--namespace',
    NAMESPACE,
    '--kube-version',
    o.kubeVersion ?? KUBE_VERSION,
    ...valueArgs(o),
  ];
}

/** `helm template` that must succeed; returns the raw text. */
export async function renderText(o: RenderOptions = {}): Promise<string> {
  const r = await helm(templateArgs(o));
  if (r.code !== 0) throw new Error(`helm template failed (${r.code}):\n${r.stderr}`);
  return r.stdout;
}

/** `helm template` that must fail; returns stderr. */
export async function renderError(o: RenderOptions = {}): Promise<string> {
  const r = await helm(templateArgs(o));
  if (r.code === 0) throw new Error(`helm template unexpectedly succeeded with ${JSON.stringify(o)}`);
  return r.stderr;
}

export type K8sObject = {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
  [k: string]: any;
};

export function parseManifests(text: string): K8sObject[] {
  const out: K8sObject[] = [];
  for (const doc of parseAllDocuments(text)) {
    if (doc.errors.length) throw new Error(`invalid YAML rendered: ${doc.errors[0]!.message}`);
    const v = doc.toJS() as K8sObject | null;
    if (v) out.push(v);
  }
  return out;
}

export async function render(o: RenderOptions = {}): Promise<K8sObject[]> {
  return parseManifests(await renderText(o));
}

export function find(objs: K8sObject[], kind: string, name?: string): K8sObject[] {
  return objs.filter((o) => o.kind === kind && (name === undefined || o.metadata.name === name));
}

export function one(objs: K8sObject[], kind: string, name: string): K8sObject {
  const hits = find(objs, kind, name);
  if (hits.length !== 1) throw new Error(`expected one ${kind}/${name}, found ${hits.length}`);
  return hits[0]!;
}

/** Pod specs of every workload (Deployment, StatefulSet, Job templates and bare Pods). */
export function podSpecs(objs: K8sObject[]): { owner: string; spec: any }[] {
  const out: { owner: string; spec: any }[] = [];
  for (const o of objs) {
    if (o.kind === 'Pod') out.push({ owner: `Pod/${o.metadata.name}`, spec: o.spec });
    else if (['Deployment', 'StatefulSet', 'DaemonSet', 'Job'].includes(o.kind))
      out.push({ owner: `${o.kind}/${o.metadata.name}`, spec: o.spec.template.spec });
  }
  return out;
}

/** The chart-made Secret's data, decoded. */
export function secretData(objs: K8sObject[], name = 'opsgate'): Record<string, string> {
  return Object.fromEntries(
    Object.entries<string>(one(objs, 'Secret', name).data ?? {}).map(([k, v]) => [k, Buffer.from(v, 'base64').toString()]),
  );
}

/**
 * The environment a Deployment's container starts with, as the kubelet would give it: the
 * ConfigMaps of envFrom, then env (values with their $(VAR) references expanded, secretKeyRef read
 * from the rendered Secret; a missing optional key leaves the variable unset).
 */
export function containerEnv(objs: K8sObject[], deployment: string): Record<string, string> {
  const c = one(objs, 'Deployment', deployment).spec.template.spec.containers[0];
  const out: Record<string, string> = {};
  for (const ef of c.envFrom ?? []) Object.assign(out, one(objs, 'ConfigMap', ef.configMapRef.name).data);
  for (const e of c.env ?? []) {
    if (typeof e.value === 'string')
      out[e.name] = e.value.replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m: string, v: string) => out[v] ?? m);
    else if (e.valueFrom?.secretKeyRef) {
      const ref = e.valueFrom.secretKeyRef;
      const value = secretData(objs, ref.name)[ref.key];
      if (value !== undefined) out[e.name] = value;
      else if (!ref.optional) throw new Error(`${deployment}: ${e.name} needs key ${ref.key} of Secret ${ref.name}, which it lacks`);
    } else throw new Error(`${deployment}: ${e.name} has a source this helper does not read`);
  }
  return out;
}

/**
 * NOTES.txt as helm renders it. `helm template` drops NOTES, so a throw-away copy of the chart gets
 * one extra template that includes templates/NOTES.txt into a ConfigMap.
 */
export async function renderNotes(file: string, set: Record<string, string> = {}, setString: Record<string, string> = {}): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'opsgate-notes-'));
  try {
    cpSync(CHART, dir, { recursive: true });
    writeFileSync(
      join(dir, 'templates/zz-notes-for-test.yaml'),
      'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes-for-test\ndata:\n  notes: {{ include (print .Template.BasePath "/NOTES.txt") . | toJson }}\n',
    );
    const objs = await render({ chart: dir, files: [file], set, setString });
    return one(objs, 'ConfigMap', 'notes-for-test').data.notes as string;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
