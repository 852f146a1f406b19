import { afterAll, beforeAll, describe, expect, jest, test } from '@jest/globals';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { openSync, readFileSync } from 'node:fs';
import { request } from 'node:http';
import { join } from 'node:path';
import { parse } from 'yaml';
import { REPO, TOOLS_BIN, freePort } from '../../helpers/cluster.js';
import { CHART, LOCAL_IMAGES, NODE_DIR, apply, helm, kubectl, list, ok, waitFor, type Obj } from '../../helpers/nodeSupport.js';
import { pushHeaders, pushSources, wrongProofHeaders } from '../../helpers/senders.js';

/**
 * The chart's Ingress through a real Ingress controller: Traefik (hack/build-tool.sh traefik), its
 * Kubernetes Ingress provider watching the node's apiserver with a ServiceAccount token, listening on
 * 127.0.0.1. The chart is installed with k8s/examples/ingress-traefik.yaml; clients reach it by the
 * Ingress host name (Host header) from their own loopback addresses (127.0.0.7, 127.0.0.8), so the
 * address the API records can only be the client's if ingress.proxyHops is honoured: the controller
 * reaches the pods from the bridge address (10.244.0.1). The release enables the gitea, bitbucket and
 * generic senders by values alone (webhooks.senders, secrets.webhookSecrets) and leaves github out, so
 * the Ingress routes exactly the enabled senders' paths.
 */
jest.setTimeout(600_000);

const NS = 'e2e-ingress';
const RELEASE = 'ing';
const VALUES = join(REPO, 'k8s', 'examples', 'ingress-traefik.yaml');
const HOST = (parse(readFileSync(VALUES, 'utf8')) as Obj).ingress.host as string;
const GITLAB_SECRET = `e2e-gitlab-${randomBytes(12).toString('hex')}`;
const ALERTS_TOKEN = `e2e-alerts-${randomBytes(12).toString('hex')}`;
const CLIENT = '127.0.0.7';
const OTHER_CLIENT = '127.0.0.8';
/** The senders the release adds to the defaults, each with its secret and a client address of its own (own rate-limit bucket). */
const ADDED = ['gitea', 'bitbucket', 'generic'].map((name, i) => ({
  source: pushSources().find((s) => s.name === name)!,
  secret: `e2e-${name}-${randomBytes(12).toString('hex')}`,
  from: `127.0.0.${21 + i}`,
}));
const RATE = 3;

let traefik: ChildProcess | undefined;
let port = 0;

interface Answer {
  status: number;
  text: string;
}

/** One HTTP request to Traefik with the Ingress host name, sent from a chosen loopback address. */
function send(
  method: string,
  path: string,
  opts: { from?: string; headers?: Record<string, string>; body?: string } = {},
): Promise<Answer> {
  return new Promise((res, rej) => {
    const req = request(
      {
        host: '127.0.0.1',
        port,
        method,
        path,
        agent: false,
        localAddress: opts.from ?? CLIENT,
        headers: { Host: HOST, ...opts.headers },
        timeout: 15_000,
      },
      (r) => {
        let text = '';
        r.setEncoding('utf8');
        r.on('data', (d: string) => (text += d));
        r.on('end', () => res({ status: r.statusCode ?? 0, text }));
      },
    );
    req.on('timeout', () => req.destroy(new Error(`${method} ${path} timed out`)));
    req.on('error', rej);
    req.end(opts.body);
  });
}

async function apiLogs(): Promise<string> {
  const pods = await list('pods', NS, 'app.kubernetes.io/component=api');
  let out = '';
  for (const p of pods) out += (await kubectl(['logs', '-n', NS, p.metadata.name as string])).stdout;
  return out;
}

beforeAll(async () => {
  ok(await kubectl(['create', 'namespace', NS]), 'create namespace');
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
metadata: {name: e2e-traefik}
rules:
  - {apiGroups: [""], resources: [services, secrets, nodes], verbs: [get, list, watch]}
  - {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [get, list, watch]}
  - {apiGroups: [networking.k8s.io], resources: [ingresses, ingressclasses], verbs: [get, list, watch]}
  - {apiGroups: [networking.k8s.io], resources: [ingresses/status], verbs: [update]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: e2e-traefik}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: e2e-traefik}
subjects: [{kind: ServiceAccount, name: traefik, namespace: ${NS}}]
`);
  const token = ok(await kubectl(['create', 'token', 'traefik', '-n', NS, '--duration', '2h']), 'create token').stdout.trim();
  port = await freePort();
  const log = openSync(join(NODE_DIR, 'logs', 'traefik.log'), 'a');
  traefik = spawn(
    join(TOOLS_BIN, 'traefik'),
    [
      `--entryPoints.web.address=127.0.0.1:${port}`,
      '--providers.kubernetesingress=true',
      '--providers.kubernetesingress.endpoint=https://10.244.0.1:6443',
      `--providers.kubernetesingress.token=${token}`,
      `--providers.kubernetesingress.certauthfilepath=${join(NODE_DIR, 'pki', 'ca.crt')}`,
      `--providers.kubernetesingress.namespaces=${NS}`,
      '--log.level=INFO',
    ],
    { stdio: ['ignore', log, log] },
  );

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
      VALUES,
      '--set',
      `secrets.gitlabWebhookSecret=${GITLAB_SECRET}`,
      '--set',
      `secrets.alertsWebhookToken=${ALERTS_TOKEN}`,
      '--set',
      `config.rateLimitRps=${RATE}`,
      '--set',
      'webhooks.senders.github.enabled=false',
      ...ADDED.flatMap((a) => [
        '--set',
        `webhooks.senders.${a.source.name}.enabled=true`,
        '--set',
        `secrets.webhookSecrets.${a.source.name}=${a.secret}`,
      ]),
      '--wait',
      '--timeout',
      '5m',
    ]),
    'helm install with the ingress values',
  );
  await waitFor('the Ingress routed by Traefik', async () => (await send('GET', '/health')).status === 200, 120_000);
});

afterAll(async () => {
  if (traefik && traefik.exitCode === null) {
    const exited = new Promise((r) => traefik!.once('exit', r));
    traefik.kill('SIGTERM');
    await exited;
  }
  await helm(['uninstall', RELEASE, '-n', NS, '--wait', '--timeout', '2m']);
  await kubectl(['delete', 'namespace', NS, '--wait=false']);
  await kubectl(['delete', 'clusterrolebinding,clusterrole', 'e2e-traefik']);
  await kubectl(['delete', 'ingressclass', 'traefik']);
});

describe('webhooks through Traefik by the Ingress host name', () => {
  test('a GitLab push and an Alertmanager payload are answered 202', async () => {
    const push = readFileSync(join(REPO, 'test', 'fixtures', 'gitlab-push-hook.json'), 'utf8');
    const gl = await send('POST', '/webhook/gitlab', {
      headers: { 'Content-Type': 'application/json', 'X-Gitlab-Token': GITLAB_SECRET, 'X-Gitlab-Event': 'Push Hook' },
      body: push,
    });
    expect(gl).toMatchObject({ status: 202 });
    const alert = JSON.stringify({
      version: '4',
      status: 'firing',
      alerts: [{ status: 'firing', labels: { alertname: 'IngressCheck' }, fingerprint: `ing-${randomBytes(4).toString('hex')}` }],
    });
    const am = await send('POST', '/webhook/alerts', {
      headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${ALERTS_TOKEN}` },
      body: alert,
    });
    expect(am.status).toBe(202);
  });

  test('gitea, bitbucket and generic pushes, signed as each sender signs them, are accepted (202 with a job)', async () => {
    for (const { source, secret, from } of ADDED) {
      const body = JSON.stringify(source.example);
      const r = await send('POST', `/webhook/${source.name}`, { from, headers: pushHeaders(source, secret, body), body });
      expect({ sender: source.name, status: r.status }).toEqual({ sender: source.name, status: 202 });
      expect([source.name, JSON.parse(r.text)]).toEqual([
        source.name,
        expect.objectContaining({ accepted: true, job_id: expect.any(String) }),
      ]);
      // The secret of the values reached the API: a delivery signed with another one is refused.
      const forged = await send('POST', `/webhook/${source.name}`, {
        from,
        headers: { ...wrongProofHeaders(source, body), [source.event.header]: source.event.push, 'Content-Type': 'application/json' },
        body,
      });
      expect({ sender: source.name, status: forged.status }).toEqual({ sender: source.name, status: 403 });
    }
  });

  test("only the enabled senders' /webhook/<name>, /ops and /health are routed; /ready, /metrics and /admin are not", async () => {
    expect((await send('GET', '/health')).status).toBe(200);
    expect((await send('GET', '/ops/hosts', { from: OTHER_CLIENT })).status).toBe(401); // the API's answer
    // github is not enabled in this release; the senders' paths are Exact, there is no /webhook prefix.
    for (const path of ['/webhook/github', '/webhook/gitea/more', '/webhook']) {
      const r = await send('POST', path, { from: OTHER_CLIENT, headers: { 'Content-Type': 'application/json' }, body: '{}' });
      expect({ path, status: r.status, text: r.text.trim() }).toEqual({ path, status: 404, text: '404 page not found' });
    }
    for (const path of ['/ready', '/metrics', '/admin/queues', '/openapi.json']) {
      const r = await send('GET', path, { from: OTHER_CLIENT });
      expect({ path, status: r.status, text: r.text.trim() }).toEqual({ path, status: 404, text: '404 page not found' }); // Traefik's own 404
    }
    // Any other host name is not routed at all.
    const other = await send('GET', '/health', { headers: { Host: 'elsewhere.example.test' } });
    expect(other.status).toBe(404);
  });

  test("the audit line records the client's address, not the controller's, and ignores a forged X-Forwarded-For", async () => {
    // A webhook call (audited whatever its outcome) with a wrong token and a forged client address.
    const r = await send('POST', '/webhook/gitlab?probe=ingress-audit', {
      headers: {
        'Content-Type': 'application/json',
        'X-Gitlab-Token': 'not-the-secret',
        'X-Gitlab-Event': 'Push Hook',
        'X-Forwarded-For': '203.0.113.9',
      },
      body: '{}',
    });
    expect(r.status).toBe(403);
    const entry = await waitFor(
      'the audit line of the probe',
      async () =>
        (await apiLogs())
          .split('\n')
          .filter((l) => l.startsWith('{'))
          .map((l) => JSON.parse(l) as Obj)
          .find((l) => l.msg === 'audit' && l.query === 'probe=ingress-audit'),
      60_000,
    );
    expect(entry).toMatchObject({ path: '/webhook/gitlab', status: 403, client: CLIENT });
  });

  test('the rate limiter counts per client address behind the controller', async () => {
    const burst = await Promise.all(Array.from({ length: RATE * 4 }, () => send('GET', '/ops/hosts')));
    const codes = burst.map((b) => b.status);
    expect(codes).toContain(429);
    // Another client in the same second has its own bucket.
    expect((await send('GET', '/ops/hosts', { from: OTHER_CLIENT })).status).toBe(401);
  });

  test('/admin is routed when adminUI.ingress is set', async () => {
    ok(
      await helm([
        'upgrade',
        RELEASE,
        CHART,
        '-n',
        NS,
        '--reuse-values',
        '--set',
        'adminUI.enabled=true',
        '--set',
        'adminUI.ingress=true',
        '--wait',
        '--timeout',
        '5m',
      ]),
      'helm upgrade adminUI.ingress=true',
    );
    const r = await waitFor(
      '/admin/queues through Traefik',
      async () => {
        const a = await send('GET', '/admin/queues', { from: OTHER_CLIENT });
        return a.status !== 404 ? a : false;
      },
      120_000,
    );
    expect(r.status).toBe(401); // the API's operator-key challenge
  });
});
