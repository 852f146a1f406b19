import { afterAll, beforeAll, describe, expect, jest, test } from '@jest/globals';
import { spawn, type ChildProcess } from 'node:child_process';
import { createHmac, randomBytes } from 'node:crypto';
import { mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { Agent } from 'node:https';
import { connect } from 'node:net';
import { loadavg, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { parse } from 'yaml';
import { pushSources } from '../../helpers/senders.js';
import { REPO, TOOLS_BIN, freePort, toolPath } from '../../helpers/cluster.js';
import { httpsCall, makeCa, makeLeaf, type HttpsAnswer, type Pem } from '../../helpers/certs.js';
import { allDocBlocks, blockScript, mirrorRepo, runCleanBash, where, type DocBlock } from '../../helpers/docBlocks.js';
import { KUBE_VERSION, parseManifests } from '../../helpers/helm.js';
import { startMonitoring, type Monitoring } from '../../helpers/nodeMonitoring.js';
import {
  CHART,
  KUBECONFIG,
  LOCAL_IMAGES,
  NODE_DIR,
  apply,
  getJson,
  helm,
  kubectl,
  list,
  ok,
  podReady,
  waitFor,
  type Obj,
} from '../../helpers/nodeSupport.js';

/**
 * TLS inside the cluster and rotation without a restart, on the real node, with one release:
 * - a CA and certificates made here with openssl; the TLS Secret and the credentials Secret made by
 *   the chart README's own commands (its `tls-*` and `rotation-*` blocks, run as written);
 * - the chart installed with tls.enabled, mutual TLS on /webhook/alerts and file mode
 *   (secrets.asFiles), behind a real Traefik (Ingress and CRD providers, Traefik's own CRDs);
 * - HTTPS probes; a plaintext request to the HTTPS port closed; Prometheus scraping both processes
 *   over HTTPS as the chart's ServiceMonitor says; the real Alertmanager with
 *   k8s/examples/alertmanager-receiver-tls.yaml refused without its client certificate and
 *   delivering with it; Traefik routing a signed push to the HTTPS pods;
 * - a certificate renewed in the Secret served by every replica within the kubelet's sync period;
 * - a rotation of an API key and a webhook secret under a sender that retries and a caller of the
 *   ops API: both work, the old ones are then refused within the sync period plus the reload
 *   interval, no delivery is lost, no pod restarts or rolls.
 */
jest.setTimeout(600_000);

const RELEASE = 'opsgate';
const NS = 'opsgate';
const SERVER_NAME = `${RELEASE}-api.${NS}.svc`;
const CERT_NAMES = ['api', 'worker'].flatMap((c) => [`${RELEASE}-${c}`, `${RELEASE}-${c}.${NS}`, `${RELEASE}-${c}.${NS}.svc`]);
/** TLS_RELOAD_INTERVAL_MS and SECRETS_RELOAD_INTERVAL_MS of the release. */
const RELOAD_MS = 2000;
const CHART_README = 'charts/opsgate/README.md';
const TRAEFIK_VERSION = /^TRAEFIK_VERSION\s*\?=\s*(\S+)/m.exec(readFileSync(join(REPO, 'mk/tools.mk'), 'utf8'))![1]!;
const INGRESS_VALUES = join(REPO, 'k8s', 'examples', 'ingress-traefik.yaml');
const INGRESS_HOST = (parse(readFileSync(INGRESS_VALUES, 'utf8')) as Obj).ingress.host as string;

/**
 * How long a changed Secret may take to be in use: the kubelet syncs a pod every syncFrequency, up
 * to 1.5 times it (its jitter), and writes the volume then; the process re-reads it within the
 * reload interval; plus the poll of this test and answers in flight.
 */
function kubeletSyncMs(): number {
  const cfg = parse(readFileSync(join(NODE_DIR, 'kubelet.yaml'), 'utf8')) as { syncFrequency?: string };
  const m = /^(\d+)(s|m)$/.exec(cfg.syncFrequency ?? '1m');
  return m ? Number(m[1]) * (m[2] === 'm' ? 60_000 : 1000) : 60_000;
}
const SYNC_MS = kubeletSyncMs();
const IN_USE_BOUND_MS = SYNC_MS * 1.5 + RELOAD_MS + 5000;

/** What the test measures, printed at the end with the load average. */
const measured: Record<string, number> = {};

const work = mirrorRepo(REPO, 'opsgate-tlsrotation-');
const pki = mkdtempSync(join(tmpdir(), 'opsgate-tlsrotation-pki-'));
let ca: Pem;
let certA: Pem;
let certB: Pem;
let amClient: Pem;
let clusterIp = '';
let monitoring: Monitoring | undefined;
let traefik: ChildProcess | undefined;
let traefikPort = 0;
const ran = new Set<string>();

/** A labelled node block of the chart README. */
function docBlock(label: string): DocBlock {
  const b = allDocBlocks(REPO).find((x) => x.file === CHART_README && x.marker === 'node' && x.arg === label);
  if (!b) throw new Error(`${CHART_README} has no block <!-- doc-test: node ${label} -->`);
  return b;
}

/** Runs a chart README block as a reader would, from the directory holding their files. */
async function runDoc(label: string): Promise<string> {
  const b = docBlock(label);
  const home = join(NODE_DIR, 'helm-home');
  const r = await runCleanBash(
    blockScript(b),
    work,
    {
      PATH: `${dirname(toolPath('helm'))}:${dirname(toolPath('kubectl'))}:${process.env.PATH ?? ''}`,
      HOME: work,
      KUBECONFIG,
      HELM_CACHE_HOME: join(home, 'cache'),
      HELM_CONFIG_HOME: join(home, 'config'),
      HELM_DATA_HOME: join(home, 'data'),
    },
    120_000,
  );
  if (r.code !== 0) throw new Error(`${where(b)} exited ${r.code}\n${r.stderr.slice(-2000)}`);
  ran.add(label);
  return r.stdout;
}
const workFile = (name: string) => readFileSync(join(work, name), 'utf8');

/** One HTTPS request to the API Service (port 443), verified against the test's CA for the Service's name. */
function api(
  path: string,
  opts: { method?: string; headers?: Record<string, string>; body?: string; agent?: Agent; clientCert?: Pem } = {},
): Promise<HttpsAnswer> {
  return httpsCall({
    host: clusterIp,
    port: 443,
    servername: SERVER_NAME,
    path,
    ca: ca.cert,
    timeoutMs: 15_000,
    ...(opts.method ? { method: opts.method } : {}),
    ...(opts.headers ? { headers: opts.headers } : {}),
    ...(opts.body !== undefined ? { body: opts.body } : {}),
    ...(opts.agent ? { agent: opts.agent } : {}),
    ...(opts.clientCert ? { clientCert: opts.clientCert } : {}),
  });
}

/**
 * Polls until `n` answers in a row, each on a new connection (kube-proxy spreads them over the
 * replicas), satisfy `one`; resolves with when that streak began (ms since the epoch).
 */
async function inARow(what: string, n: number, timeoutMs: number, one: () => Promise<boolean>): Promise<number> {
  let streak = 0;
  let began = 0;
  await waitFor(
    what,
    async () => {
      const t = Date.now();
      if (await one().catch(() => false)) {
        if (streak++ === 0) began = t;
      } else streak = 0;
      return streak >= n;
    },
    timeoutMs,
    200,
  );
  return began;
}

async function releasePods(component: string): Promise<Obj[]> {
  return list('pods', NS, `app.kubernetes.io/instance=${RELEASE},app.kubernetes.io/component=${component}`);
}

/** Every opsgate pod by name, with its containers' restart counts. */
async function podRestarts(): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const c of ['api', 'worker'])
    for (const p of await releasePods(c))
      out[p.metadata.name as string] = ((p.status.containerStatuses as Obj[]) ?? []).reduce((n, s) => n + Number(s.restartCount), 0);
  return out;
}

async function apiLogLines(): Promise<Obj[]> {
  const out: Obj[] = [];
  for (const p of await releasePods('api')) {
    const text = (await kubectl(['logs', '-n', NS, p.metadata.name as string])).stdout;
    for (const l of text.split('\n')) if (l.startsWith('{')) out.push(JSON.parse(l) as Obj);
  }
  return out;
}

/** One request to Traefik by the Ingress host name (node:http: fetch sends a Host header of its own). */
function viaTraefik(path: string, headers: Record<string, string>, body: string): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      {
        host: '127.0.0.1',
        port: traefikPort,
        method: 'POST',
        path,
        agent: false,
        headers: { ...headers, Host: INGRESS_HOST },
        timeout: 15_000,
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (d: string) => (text += d));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, text }));
      },
    );
    req.on('timeout', () => req.destroy(new Error(`${path} through Traefik timed out`)));
    req.on('error', reject);
    req.end(body);
  });
}

const github = pushSources().find((s) => s.name === 'github')!;
/** A GitHub push of a commit never sent before, signed with `secret`. */
function githubPush(secret: string): { body: string; headers: Record<string, string> } {
  const body = JSON.stringify({ ...github.example, after: randomBytes(20).toString('hex') });
  return { body, headers: { ...pushHeadersOf(secret, body), 'X-GitHub-Delivery': randomBytes(16).toString('hex') } };
}
function pushHeadersOf(secret: string, body: string): Record<string, string> {
  const sig = `sha256=${createHmacHex(secret, body)}`;
  return { 'X-Hub-Signature-256': sig, 'X-GitHub-Event': 'push', 'Content-Type': 'application/json' };
}
const createHmacHex = (secret: string, body: string) => createHmac('sha256', secret).update(body).digest('hex');

beforeAll(async () => {
  await waitFor(`namespace ${NS} gone`, async () => !(await getJson('namespace', NS)), 180_000, 1000);

  // The PKI of this test: a CA for opsgate, two certificates for the Services' names, and a client CA for Alertmanager.
  ca = makeCa(pki, 'opsgate-e2e-ca');
  certA = makeLeaf(pki, ca, 'opsgate-a', 'server', CERT_NAMES);
  certB = makeLeaf(pki, ca, 'opsgate-b', 'server', CERT_NAMES);
  const amCa = makeCa(pki, 'alertmanager-e2e-ca');
  amClient = makeLeaf(pki, amCa, 'alertmanager', 'client');
  for (const [name, text] of Object.entries({ 'tls.crt': certA.cert, 'tls.key': certA.key, 'ca.crt': ca.cert }))
    writeFileSync(join(work, name), text, { mode: 0o600 });
  writeFileSync(join(pki, 'ca.crt'), ca.cert);
  writeFileSync(join(pki, 'am-client.crt'), amClient.cert);
  writeFileSync(join(pki, 'am-client.key'), amClient.key, { mode: 0o600 });
  writeFileSync(join(pki, 'am-ca.crt'), amCa.cert);

  // The Secrets, by the chart README's commands.
  await runDoc('tls-secret');
  await runDoc('rotation-secret');
  ok(
    await kubectl(['-n', NS, 'create', 'secret', 'generic', 'alertmanager-client-ca', `--from-file=ca.crt=${join(pki, 'am-ca.crt')}`]),
    'create the client CA Secret',
  );

  // Traefik with its own CRDs (ServersTransport) and both providers, outside the cluster as in ingress.test.ts.
  ok(
    await kubectl([
      'apply',
      '--server-side',
      '--force-conflicts',
      '-f',
      join(REPO, '.tools', 'traefik', `traefik-crds-${TRAEFIK_VERSION}.yaml`),
    ]),
    "apply Traefik's CRDs (make tools-traefik)",
  );
  await waitFor(
    'the ServersTransport CRD served',
    async () =>
      (
        await kubectl([
          'get',
          'crd',
          'serverstransports.traefik.io',
          '-o',
          'jsonpath={.status.conditions[?(@.type=="Established")].status}',
        ])
      ).stdout === 'True',
    60_000,
  );
  await apply(`apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: traefik}
spec: {controller: traefik.io/ingress-controller}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: traefik, namespace: ${NS}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: e2e-traefik-tls}
rules:
  - {apiGroups: [""], resources: [services, secrets, nodes, configmaps], verbs: [get, list, watch]}
  - {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [get, list, watch]}
  - {apiGroups: [networking.k8s.io], resources: [ingresses, ingressclasses], verbs: [get, list, watch]}
  - {apiGroups: [networking.k8s.io], resources: [ingresses/status], verbs: [update]}
  - apiGroups: [traefik.io]
    resources: [middlewares, middlewaretcps, ingressroutes, traefikservices, ingressroutetcps, ingressrouteudps, tlsoptions, tlsstores, serverstransports, serverstransporttcps]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: e2e-traefik-tls}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: e2e-traefik-tls}
subjects: [{kind: ServiceAccount, name: traefik, namespace: ${NS}}]
`);
  const token = ok(await kubectl(['create', 'token', 'traefik', '-n', NS, '--duration', '2h']), 'create token').stdout.trim();
  traefikPort = await freePort();
  const provider = (p: string) => [
    `--providers.${p}=true`,
    `--providers.${p}.endpoint=https://10.244.0.1:6443`,
    `--providers.${p}.token=${token}`,
    `--providers.${p}.certauthfilepath=${join(NODE_DIR, 'pki', 'ca.crt')}`,
    `--providers.${p}.namespaces=${NS}`,
  ];
  const log = openSync(join(NODE_DIR, 'logs', 'traefik-tls.log'), 'a');
  traefik = spawn(
    join(TOOLS_BIN, 'traefik'),
    [
      `--entryPoints.web.address=127.0.0.1:${traefikPort}`,
      ...provider('kubernetesingress'),
      ...provider('kubernetescrd'),
      '--log.level=INFO',
    ],
    { stdio: ['ignore', log, log] },
  );

  const t0 = Date.now();
  ok(
    await helm([
      'install',
      RELEASE,
      CHART,
      '-n',
      NS,
      '-f',
      LOCAL_IMAGES,
      '-f',
      INGRESS_VALUES,
      ...installSets(),
      '--wait',
      '--timeout',
      '6m',
    ]),
    'helm install with tls.enabled and secrets.asFiles',
  );
  measured.helm_install_wait_ms = Date.now() - t0;
  const svc = (await getJson('service', `${RELEASE}-api`, NS))!;
  clusterIp = svc.spec.clusterIP as string;
});

/** The values of the release: the README's TLS and rotation settings, with the test's intervals. */
function installSets(): string[] {
  const set = {
    'tls.enabled': 'true',
    'tls.existingSecret': 'opsgate-tls',
    'tls.clientAuth.enabled': 'true',
    'tls.clientAuth.caSecret': 'alertmanager-client-ca',
    'tls.reloadIntervalMs': String(RELOAD_MS),
    'secrets.existingSecret': 'opsgate-credentials',
    'secrets.existingSecretApiKeysFile': 'api-keys.yaml',
    'secrets.asFiles': 'true',
    'config.secretsReloadIntervalMs': String(RELOAD_MS),
    'config.rateLimitRps': '0',
  };
  return Object.entries(set).flatMap(([k, v]) => ['--set', `${k}=${v}`]);
}

afterAll(async () => {
  await monitoring?.stop();
  if (traefik && traefik.exitCode === null) {
    const exited = new Promise((r) => traefik!.once('exit', r));
    traefik.kill('SIGTERM');
    await exited;
  }
  await helm(['uninstall', RELEASE, '-n', NS, '--ignore-not-found', '--wait', '--timeout', '2m']);
  await kubectl(['delete', 'namespace', NS, '--ignore-not-found', '--wait=false']);
  await kubectl(['delete', 'clusterrolebinding,clusterrole', 'e2e-traefik-tls', '--ignore-not-found']);
  await kubectl(['delete', 'ingressclass', 'traefik', '--ignore-not-found']);
  await kubectl([
    'delete',
    '-f',
    join(REPO, '.tools', 'traefik', `traefik-crds-${TRAEFIK_VERSION}.yaml`),
    '--ignore-not-found',
    '--wait=false',
  ]);
  rmSync(work, { recursive: true, force: true });
  rmSync(pki, { recursive: true, force: true });
  const [l1, l5] = loadavg();
  process.stderr.write(
    `[e2e tls+rotation] ${JSON.stringify(measured)} kubelet syncFrequency ${SYNC_MS} ms; load average ${l1!.toFixed(2)} ${l5!.toFixed(2)}\n`,
  );
});

describe('TLS inside the cluster', () => {
  let baseline: Record<string, number> = {};
  /** Alertmanager's receiver, from k8s/examples/alertmanager-receiver-tls.yaml. */
  let alertsWebhook: Obj = {};

  test('the chart installs with tls.enabled: every pod Ready through its HTTPS probes; the API Service (443) serves the Secret certificate', async () => {
    for (const c of ['api', 'worker']) {
      const ps = await releasePods(c);
      expect(ps.length).toBeGreaterThan(0);
      for (const p of ps) {
        expect(podReady(p)).toBe(true);
        const probe = (p.spec.containers[0].livenessProbe as Obj).httpGet as Obj;
        expect([c, probe.scheme]).toEqual([c, 'HTTPS']);
      }
    }
    const svc = (await getJson('service', `${RELEASE}-api`, NS))!;
    expect((svc.spec.ports as Obj[]).find((p) => p.name === 'http')!.port).toBe(443);
    const health = await api('/health');
    expect(health).toMatchObject({ status: 200, served: certA.fingerprint });
    baseline = await podRestarts();
    expect(Object.values(baseline).every((n) => n === 0)).toBe(true);
  });

  test('a plaintext request to the HTTPS port fails cleanly: closed without an HTTP answer, the pods go on', async () => {
    const plain = await new Promise<{ data: string }>((resolve, reject) => {
      const s = connect(443, clusterIp, () => s.write(`GET /health HTTP/1.1\r\nHost: ${SERVER_NAME}\r\n\r\n`));
      let data = '';
      s.on('data', (d: Buffer) => (data += d.toString('latin1')));
      s.on('error', () => {}); // a reset is a close too
      s.on('close', () => resolve({ data }));
      s.setTimeout(20_000, () => {
        s.destroy();
        reject(new Error('the HTTPS port kept a plaintext connection open'));
      });
    });
    expect(plain.data).not.toMatch(/^HTTP\//);
    await expect(fetch(`http://${clusterIp}:443/health`, { signal: AbortSignal.timeout(15_000) })).rejects.toThrow();
    expect((await api('/health')).status).toBe(200);
    expect(await podRestarts()).toEqual(baseline);
  });

  test("Prometheus scrapes both processes over HTTPS, with the CA and server name of the chart's ServiceMonitor", async () => {
    // What the Prometheus Operator would do with the ServiceMonitor of these values (no operator here).
    const rendered = ok(
      await helm([
        'template',
        RELEASE,
        CHART,
        '-n',
        NS,
        '--kube-version',
        KUBE_VERSION,
        '-f',
        INGRESS_VALUES,
        ...installSets(),
        '--set',
        'serviceMonitor.enabled=true',
        '-s',
        'templates/servicemonitor.yaml',
      ]),
      'helm template the ServiceMonitor',
    );
    const endpoint = (parseManifests(rendered.stdout)[0]!.spec.endpoints as Obj[])[0]!;
    expect(endpoint.scheme).toBe('https');
    const caRef = endpoint.tlsConfig.ca.secret as { name: string; key: string };
    const caPem = Buffer.from(
      ok(
        await kubectl(['-n', NS, 'get', 'secret', caRef.name, '-o', `jsonpath={.data.${caRef.key.replaceAll('.', '\\.')}}`]),
        'read the CA',
      ).stdout,
      'base64',
    ).toString();
    expect(caPem).toBe(ca.cert);
    const caFile = join(pki, 'servicemonitor-ca.crt');
    writeFileSync(caFile, caPem);

    // Alertmanager's receiver: the example's, with this test's files and the Service's address (the name stays the certificate's).
    const example = parse(readFileSync(join(REPO, 'k8s/examples/alertmanager-receiver-tls.yaml'), 'utf8')) as Obj;
    const webhook = structuredClone((example.receivers as Obj[]).find((r) => r.name === 'opsgate')!.webhook_configs[0] as Obj);
    const url = new URL(webhook.url as string);
    expect(url.hostname).toBe(SERVER_NAME);
    writeFileSync(join(pki, 'alerts-token'), workFile('alerts-token').trim());
    webhook.url = `https://${clusterIp}:${url.port || 443}${url.pathname}`;
    webhook.http_config.authorization = { type: 'Bearer', credentials_file: join(pki, 'alerts-token') };
    webhook.http_config.tls_config = { ca_file: join(pki, 'ca.crt'), server_name: SERVER_NAME };
    alertsWebhook = webhook;

    monitoring = await startMonitoring({
      namespace: NS,
      release: RELEASE,
      alertsUrl: webhook.url as string,
      alertsToken: '',
      scrapeTls: { caFile, serverName: endpoint.tlsConfig.serverName as string },
      webhookConfig: webhook,
    });
    const t0 = Date.now();
    await monitoring.waitForTargets(['api', 'worker']);
    measured.prometheus_targets_up_ms = Date.now() - t0;
  });

  test('the real Alertmanager delivers over HTTPS with mutual TLS: refused without its client certificate, delivered with it', async () => {
    const m = monitoring!;
    const before = await m.webhookNotifications();
    await m.postAlert('TlsE2eNoClientCert');
    const refused = await waitFor(
      'a failed delivery without the client certificate',
      async () => {
        const n = await m.webhookNotifications();
        return n.failed > before.failed ? n : undefined;
      },
      120_000,
      1000,
    );
    expect(refused.failed).toBeGreaterThan(before.failed);
    const audit = await waitFor(
      'the refusal in an audit line',
      async () => (await apiLogLines()).find((l) => l.msg === 'audit' && l.path === '/webhook/alerts' && l.status === 403),
      60_000,
      2000,
    );
    expect(audit.detail).toBe('a client certificate is required');

    // The example's cert_file/key_file: Alertmanager's certificate, signed by the CA of TLS_CLIENT_CA_FILE.
    await m.setReceiver({
      ...alertsWebhook,
      http_config: {
        ...alertsWebhook.http_config,
        tls_config: {
          ...alertsWebhook.http_config.tls_config,
          cert_file: join(pki, 'am-client.crt'),
          key_file: join(pki, 'am-client.key'),
        },
      },
    });
    const t0 = Date.now();
    await m.postAlert('TlsE2eDelivered');
    const delivered = await waitFor(
      'the worker to run notify_oncall for TlsE2eDelivered',
      async () => {
        const [w] = (await releasePods('worker')).filter(podReady);
        const text = w ? (await kubectl(['-n', NS, 'logs', w.metadata.name as string])).stdout : '';
        return text.split('\n').find((l) => l.includes('"msg":"alert notification"') && l.includes('"alertname":"TlsE2eDelivered"'));
      },
      120_000,
      2000,
    );
    measured.alertmanager_mtls_delivery_ms = Date.now() - t0;
    expect(delivered).toBeTruthy();
    const accepted = (await apiLogLines()).find(
      (l) => l.msg === 'audit' && l.path === '/webhook/alerts' && l.status === 202 && typeof l.client_certificate === 'string',
    );
    expect(accepted).toMatchObject({
      who: 'webhook:alerts',
      matched_secret: 'current',
      client_certificate: expect.stringMatching(/^cert:[0-9a-f]{12}$/),
    });
  });

  test('Traefik routes a signed push to the HTTPS pods (serversscheme https, the ServersTransport verifying with the CA)', async () => {
    const svc = (await getJson('service', `${RELEASE}-api`, NS))!;
    expect(svc.metadata.annotations['traefik.ingress.kubernetes.io/service.serversscheme']).toBe('https');
    expect(await getJson('serverstransports.traefik.io', `${RELEASE}-backend`, NS)).toBeTruthy();
    const secret = workFile('github-secret').trim();
    let last: { status: number; text: string } | undefined;
    const answer = await waitFor(
      'the push through Traefik',
      async () => {
        const push = githubPush(secret);
        last = await viaTraefik('/webhook/github', push.headers, push.body);
        return last.status === 202 ? (JSON.parse(last.text) as Obj) : undefined;
      },
      120_000,
      1000,
    ).catch((err: Error) => {
      throw new Error(`${err.message}; last answer ${JSON.stringify(last)}`);
    });
    expect(answer).toMatchObject({ accepted: true, job_id: expect.any(String) });
  });

  test("a certificate renewed in the Secret (the README's command) is served by every replica within the kubelet's sync period, no restart", async () => {
    const before = await podRestarts();
    for (const [name, text] of Object.entries({ 'tls.crt': certB.cert, 'tls.key': certB.key }))
      writeFileSync(join(work, name), text, { mode: 0o600 });
    const t0 = Date.now();
    await runDoc('tls-secret');
    const served = await inARow(
      'the renewed certificate on new connections',
      8,
      IN_USE_BOUND_MS + 60_000,
      async () => (await api('/health')).served === certB.fingerprint,
    );
    measured.certificate_in_use_ms = served - t0;
    expect(measured.certificate_in_use_ms).toBeLessThan(IN_USE_BOUND_MS);
    // The worker's metrics port too, and Prometheus still scrapes (same CA).
    const worker = (await getJson('service', `${RELEASE}-worker`, NS))!;
    await waitFor(
      'the worker serving the renewed certificate',
      async () =>
        (
          await httpsCall({
            host: worker.spec.clusterIP as string,
            port: 9464,
            servername: SERVER_NAME,
            path: '/metrics',
            ca: ca.cert,
            timeoutMs: 15_000,
          })
        ).served === certB.fingerprint,
      IN_USE_BOUND_MS,
      500,
    );
    await monitoring!.waitForTargets(['api', 'worker']);
    expect(await runDoc('tls-reloaded')).toContain('"fingerprint"');
    expect(await podRestarts()).toEqual(before);
  });
});

describe('rotation without a restart', () => {
  test('a new key and a second webhook secret under traffic: both work; the old ones removed are refused within the sync period plus the reload interval; no delivery lost, no restart', async () => {
    const deployGeneration = async () =>
      Object.fromEntries(
        await Promise.all(
          ['api', 'worker'].map(async (c) => [c, (await getJson('deployment', `${RELEASE}-${c}`, NS))!.metadata.generation]),
        ),
      );
    const generations = await deployGeneration();
    const before = await podRestarts();
    const oldKey = workFile('ci-key');
    const oldSecret = workFile('github-secret').trim();

    // The first key is 10 days from its expiry: it works, with Deprecation and Sunset.
    const first = await api('/ops/keys', { headers: { 'X-API-Key': oldKey } });
    expect(first.status).toBe(200);
    expect(first.headers.sunset).toMatch(/ GMT$/);
    expect(first.headers.deprecation).toMatch(/^@\d+$/);
    expect(JSON.parse(first.body).keys).toEqual([expect.objectContaining({ id: 'ci-1', status: 'expiring' })]);

    // A sender that retries what is not accepted (as GitHub redelivers), and a caller of the ops API.
    let senderSecret = oldSecret;
    let callerKey = oldKey;
    const deliveries: Array<{ attempts: number; status: number; jobId?: string }> = [];
    const calls: number[] = [];
    let stop = false;
    const agent = new Agent({ keepAlive: true, maxSockets: 2, ca: ca.cert });
    const sender = (async () => {
      while (!stop) {
        const push = githubPush(senderSecret);
        let attempts = 0;
        let r: HttpsAnswer | undefined;
        while (attempts < 120 && r?.status !== 202) {
          attempts++;
          r = await api('/webhook/github', { method: 'POST', headers: push.headers, body: push.body, agent }).catch(() => undefined);
          if (r?.status !== 202) {
            await new Promise((res) => setTimeout(res, 500));
            // A refused delivery is signed again with the secret the sender holds now.
            Object.assign(push.headers, pushHeadersOf(senderSecret, push.body));
          }
        }
        deliveries.push({ attempts, status: r?.status ?? 0, ...(r?.status === 202 ? { jobId: JSON.parse(r.body).job_id as string } : {}) });
        await new Promise((res) => setTimeout(res, 100));
      }
    })();
    const caller = (async () => {
      while (!stop) {
        calls.push((await api('/ops/hosts', { headers: { 'X-API-Key': callerKey }, agent }).catch(() => undefined))?.status ?? 0);
        await new Promise((res) => setTimeout(res, 200));
      }
    })();
    try {
      await waitFor('traffic with the old credentials', async () => deliveries.length >= 3 && calls.length >= 3, 60_000);

      // 1. Add the new key and the new secret beside the old ones (the README's command).
      const tAdd = Date.now();
      await runDoc('rotation-add');
      const newKey = workFile('ci-key-2');
      const newSecret = workFile('github-secret-2').trim();
      // One probe checks both: the key and the secret are one change of the Secret, taken together.
      const added = await inARow('the new key and the new secret on every replica', 8, IN_USE_BOUND_MS + 60_000, async () => {
        const p = githubPush(newSecret);
        const [byKey, bySecret] = await Promise.all([
          api('/ops/hosts', { headers: { 'X-API-Key': newKey } }),
          api('/webhook/github', { method: 'POST', headers: p.headers, body: p.body }),
        ]);
        return byKey.status === 200 && bySecret.status === 202;
      });
      measured.added_in_use_ms = added - tAdd;
      expect(measured.added_in_use_ms).toBeLessThan(IN_USE_BOUND_MS);
      // Both work; the audit lines say which value of the secret matched.
      const both = githubPush(oldSecret);
      const byOld = await api('/webhook/github', { method: 'POST', headers: both.headers, body: both.body });
      expect(byOld.status).toBe(202);
      expect((await api('/ops/hosts', { headers: { 'X-API-Key': oldKey } })).status).toBe(200);
      const lines = await waitFor(
        'audit lines naming both values',
        async () => {
          const all = (await apiLogLines()).filter((l) => l.msg === 'audit' && l.path === '/webhook/github' && l.status === 202);
          const seen = new Set(all.map((l) => l.matched_secret));
          return seen.has('current') && seen.has('previous') ? all : undefined;
        },
        60_000,
        2000,
      );
      expect(lines.some((l) => l.matched_secret === 'previous')).toBe(true);

      // The sender and the caller move to the new credentials.
      senderSecret = newSecret;
      callerKey = newKey;
      const moved = deliveries.length;
      await waitFor('deliveries with the new secret', async () => deliveries.length >= moved + 3, 60_000);

      // 3. Remove the old ones (the README's command): refused within the sync period plus the reload interval.
      const tRemove = Date.now();
      await runDoc('rotation-remove');
      const refused = await inARow('the old key and the old secret refused on every replica', 8, IN_USE_BOUND_MS + 60_000, async () => {
        const p = githubPush(oldSecret);
        const [byKey, bySecret] = await Promise.all([
          api('/ops/hosts', { headers: { 'X-API-Key': oldKey } }),
          api('/webhook/github', { method: 'POST', headers: p.headers, body: p.body }),
        ]);
        return byKey.status === 401 && bySecret.status === 403;
      });
      measured.removed_refused_ms = refused - tRemove;
      expect(measured.removed_refused_ms).toBeLessThan(IN_USE_BOUND_MS);
      const after = deliveries.length;
      await waitFor('deliveries after the removal', async () => deliveries.length >= after + 3, 60_000);
      expect((await api('/ops/hosts', { headers: { 'X-API-Key': newKey } })).status).toBe(200);
      const keys = JSON.parse((await api('/ops/keys', { headers: { 'X-API-Key': newKey } })).body) as { keys: Obj[] };
      expect(keys.keys.map((k) => [k.id, k.status])).toEqual([['ci-2', 'active']]);
      expect(await runDoc('rotation-logs')).toContain('"variable":"OPS_API_KEYS_FILE"');
    } finally {
      stop = true;
      await Promise.all([sender, caller]);
      agent.destroy();
    }

    // No delivery lost: every push was accepted with a job of its own, which exists.
    measured.deliveries = deliveries.length;
    measured.delivery_retries = deliveries.reduce((n, d) => n + d.attempts - 1, 0);
    expect(deliveries.filter((d) => d.status !== 202)).toEqual([]);
    expect(new Set(deliveries.map((d) => d.jobId)).size).toBe(deliveries.length);
    const readKey = workFile('ci-key-2');
    for (const d of deliveries)
      expect([d.jobId, (await api(`/ops/jobs/${encodeURIComponent(d.jobId!)}`, { headers: { 'X-API-Key': readKey } })).status]).toEqual([
        d.jobId,
        200,
      ]);
    // The caller moved while both keys worked: never refused.
    expect(calls.filter((s) => s !== 200)).toEqual([]);
    // No restart, no rollout: the same pods, restart counts and Deployment generations.
    expect(await podRestarts()).toEqual(before);
    expect(await deployGeneration()).toEqual(generations);
  });

  test("every labelled node block of the chart README's TLS and rotation sections ran here", () => {
    const labels = allDocBlocks(REPO)
      .filter((b) => b.file === CHART_README && b.marker === 'node' && /^(tls|rotation)-/.test(b.arg ?? ''))
      .map((b) => b.arg!);
    expect(labels.length).toBeGreaterThan(0);
    expect([...ran].sort()).toEqual([...new Set(labels)].sort());
  });
});
