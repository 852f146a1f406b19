import { afterAll, beforeAll, describe, expect, jest, test } from '@jest/globals';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse, stringify } from 'yaml';
import { REPO } from '../../helpers/cluster.js';
import { docBlocks, where } from '../../helpers/docBlocks.js';
import { TAG } from '../../helpers/images.js';
import {
  CHART,
  LOCAL_IMAGES,
  PAUSE_IMAGE,
  TESTTOOLS_IMAGE,
  apply,
  getJson,
  helm,
  kubectl,
  ok,
  waitFor,
  type Obj,
} from '../../helpers/nodeSupport.js';

/**
 * Keyless callers on the real node: the chart installed with docs/keyless-callers.md's `kubernetes` issuer entry
 * (the cluster's own ServiceAccount issuer, read with the api's token: discovery_auth: serviceaccount
 * and the chart's discovery ClusterRoleBinding), and that page's Pod, run as written but for its
 * image (the node has no registry: the test image with curl instead of curlimages/curl). Its
 * projected ServiceAccount token of audience `opsgate` restarts the host its rule's scope names; the
 * same Pod aimed at another host is answered 403 out_of_scope. No Secret is mounted in either.
 */
jest.setTimeout(300_000);

const PAGE = join(REPO, 'docs/keyless-callers.md');
// The names the page uses: release opsgate in namespace opsgate, the caller tekton-bot in ci.
const RELEASE = 'opsgate';
const NS = 'opsgate';
const CI = 'ci';
const APPS = 'keyless-apps';

const yamlBlocks = docBlocks(PAGE, ['yaml']).map((b) => ({ ...b, file: 'docs/keyless-callers.md' }));
const podBlock = yamlBlocks.find((b) => b.marker === 'node' && b.arg === 'keyless-pod');
const issuersBlock = yamlBlocks.find((b) => /^issuers:/m.test(b.code));

/** The documented Pod with the node's image, optionally renamed and aimed at another host and service. */
function readmePod(aim?: { name: string; host: string; service: string }): Obj {
  const pod = parse(podBlock!.code) as Obj;
  const container = pod.spec.containers[0] as Obj;
  container.image = TESTTOOLS_IMAGE;
  container.imagePullPolicy = 'Never';
  if (aim) {
    const script = container.command[2] as string;
    expect(script).toContain('host=web-01&service=frontend');
    container.command[2] = script.replace('host=web-01&service=frontend', `host=${aim.host}&service=${aim.service}`);
    pod.metadata.name = aim.name;
  }
  return pod;
}

interface PodRun {
  exitCode: number;
  status: number;
  body: Obj;
  /** curl's own error lines (`curl: (22) …` when --fail-with-body fails the step). */
  curlErrors: string[];
  spec: Obj;
}

/**
 * Runs a Pod to its end: its exit code, and the answer and HTTP status curl printed
 * (`-w '\nHTTP %{http_code}'`); the container log holds curl's stderr too.
 */
async function runPod(pod: Obj): Promise<PodRun> {
  const name = pod.metadata.name as string;
  await apply(stringify(pod));
  const done = await waitFor(
    `pod ${CI}/${name} to end`,
    async () => {
      const p = await getJson('pod', name, CI);
      return p && ['Succeeded', 'Failed'].includes(p.status?.phase as string) ? p : undefined;
    },
    120_000,
    1000,
  );
  const logs = ok(await kubectl(['logs', '-n', CI, name]), `kubectl logs ${name}`).stdout;
  const lines = logs.split('\n');
  const curlErrors = lines.filter((l) => /^curl: \(\d+\)/.test(l));
  const answer = /^([\s\S]*)\nHTTP (\d{3})\n?$/.exec(lines.filter((l) => !curlErrors.includes(l)).join('\n'));
  if (!answer) throw new Error(`pod ${name} printed no answer:\n${logs}`);
  return {
    exitCode: done.status.containerStatuses[0].state.terminated.exitCode as number,
    status: Number(answer[2]),
    body: JSON.parse(answer[1]!) as Obj,
    curlErrors,
    spec: done.spec as Obj,
  };
}

/** Every way a pod spec can reach a Secret: a volume, a projected source, an env or envFrom reference. */
function secretsMounted(spec: Obj): string[] {
  const found: string[] = [];
  for (const v of (spec.volumes ?? []) as Obj[]) {
    if (v.secret) found.push(`volume ${v.name}`);
    for (const s of (v.projected?.sources ?? []) as Obj[]) if (s.secret) found.push(`projected ${v.name}`);
  }
  for (const c of [...((spec.initContainers ?? []) as Obj[]), ...(spec.containers as Obj[])]) {
    for (const e of (c.env ?? []) as Obj[]) if (e.valueFrom?.secretKeyRef) found.push(`env ${c.name}/${e.name}`);
    for (const e of (c.envFrom ?? []) as Obj[]) if (e.secretRef) found.push(`envFrom ${c.name}`);
  }
  return found;
}

describe('keyless callers on a real node', () => {
  beforeAll(async () => {
    expect(podBlock && issuersBlock).toBeDefined();
    for (const ns of [NS, CI, APPS]) await waitFor(`namespace ${ns} gone`, async () => !(await getJson('namespace', ns)), 120_000, 1000);
    for (const ns of [CI, APPS]) ok(await kubectl(['create', 'namespace', ns]), `create namespace ${ns}`);
    ok(await kubectl(['-n', CI, 'create', 'serviceaccount', 'tekton-bot']), 'create serviceaccount tekton-bot');
    await apply(
      stringify({
        apiVersion: 'apps/v1',
        kind: 'Deployment',
        metadata: { name: 'frontend', namespace: APPS },
        spec: {
          replicas: 1,
          selector: { matchLabels: { app: 'frontend' } },
          template: {
            metadata: { labels: { app: 'frontend' } },
            spec: {
              terminationGracePeriodSeconds: 2,
              automountServiceAccountToken: false,
              containers: [{ name: 'main', image: PAUSE_IMAGE, imagePullPolicy: 'IfNotPresent' }],
            },
          },
        },
      }),
    );
    const kubernetesIssuer = ((parse(issuersBlock!.code) as Obj).issuers as Obj[]).find((i) => i.kind === 'kubernetes');
    expect(kubernetesIssuer).toMatchObject({ issuer: 'https://kubernetes.default.svc.cluster.local', discovery_auth: 'serviceaccount' });
    const values = {
      image: { tag: TAG },
      oidc: { issuers: [kubernetesIssuer] },
      inventory: {
        hosts: {
          'web-01': { namespace: APPS, deployments: ['frontend'] },
          'db-01': { namespace: APPS, deployments: ['postgres'] },
        },
      },
    };
    const file = join(mkdtempSync(join(tmpdir(), 'opsgate-e2e-keyless-')), 'values.yaml');
    writeFileSync(file, stringify(values), { mode: 0o600 });
    ok(
      await helm(['install', RELEASE, CHART, '-n', NS, '--create-namespace', '-f', LOCAL_IMAGES, '-f', file, '--wait', '--timeout', '4m']),
      'helm install --wait',
    );
  });

  afterAll(async () => {
    await helm(['uninstall', RELEASE, '-n', NS, '--ignore-not-found', '--wait', '--timeout', '2m']);
    for (const ns of [NS, CI, APPS]) await kubectl(['delete', 'namespace', ns, '--ignore-not-found', '--wait=false']);
  });

  test(`the documented Pod (${podBlock ? where(podBlock) : 'missing'}) restarts the host in its scope with its projected token, no Secret mounted`, async () => {
    const run = await runPod(readmePod());
    expect({ exitCode: run.exitCode, status: run.status, curlErrors: run.curlErrors }).toEqual({
      exitCode: 0,
      status: 200,
      curlErrors: [],
    });
    expect(run.body).toMatchObject({ host: 'web-01', service: 'frontend', status: 'submitted', job_id: expect.any(String) });
    expect(secretsMounted(run.spec)).toEqual([]);
    expect(run.spec.automountServiceAccountToken).toBe(false);
    expect(run.spec.volumes).toEqual([
      expect.objectContaining({
        projected: expect.objectContaining({
          sources: [{ serviceAccountToken: { audience: 'opsgate', expirationSeconds: 600, path: 'token' } }],
        }),
      }),
    ]);
    // The restart happens, in the name of the token's identity: the worker's Event on the Deployment says who asked.
    const event = await waitFor(
      'the OpsgateRestart Event on frontend',
      async () => {
        const r = ok(await kubectl(['get', 'events.events.k8s.io', '-n', APPS, '-o', 'json']), 'kubectl get events');
        return (JSON.parse(r.stdout).items as Obj[]).find((e) => e.regarding?.name === 'frontend' && e.reason === 'OpsgateRestart');
      },
      120_000,
      1000,
    );
    // The credential is the id of the token (credentialId: a hash), which differs with every token.
    expect(event.note).toMatch(
      new RegExp(
        `requested by oidc:kubernetes\\.default\\.svc\\.cluster\\.local:system:serviceaccount:${CI}:tekton-bot \\(owner k8s:${CI}/tekton-bot, credential [0-9a-f]+\\)`,
      ),
    );
    expect(event.note).toContain(`job ${run.body.job_id as string}`);
    expect((await getJson('deployment', 'frontend', APPS))?.spec.template.metadata.annotations).toHaveProperty([
      'kubectl.kubernetes.io/restartedAt',
    ]);
  });

  test('the same Pod aimed at a host outside its scope is answered 403 out_of_scope, and fails', async () => {
    const run = await runPod(readmePod({ name: 'restart-db', host: 'db-01', service: 'postgres' }));
    expect({ exitCode: run.exitCode, status: run.status }).toEqual({ exitCode: 22, status: 403 });
    expect(run.curlErrors).toEqual([expect.stringMatching(/^curl: \(22\) .*403/)]);
    expect(run.body).toMatchObject({ code: 'out_of_scope', detail: expect.any(String) });
    expect(secretsMounted(run.spec)).toEqual([]);
  });
});
