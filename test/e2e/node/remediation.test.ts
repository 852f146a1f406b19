import { afterAll, beforeAll, describe, expect, jest, test } from '@jest/globals';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { HOST_ARCH, imageRef } from '../../helpers/images.js';
import { startMonitoring, type Monitoring } from '../../helpers/nodeMonitoring.js';
import {
  CHART,
  LOCAL_IMAGES,
  NODE_DIR,
  apply,
  getJson,
  helm,
  http,
  kubectl,
  list,
  ok,
  podReady,
  serviceUrl,
  waitFor,
  type Obj,
} from '../../helpers/nodeSupport.js';

/**
 * Alert-driven remediation on the real node, the whole loop on real parts: test Deployments whose
 * pods export their own health metric (a few lines of Node in the api image the suite already
 * builds: no kube-state-metrics), Prometheus scraping them and firing a rule on that metric,
 * Alertmanager delivering to the chart's /webhook/alerts, opsgate confirming and timing each alert
 * with that Prometheus (the chart's config.prometheusUrl: the ALERTS series its rule evaluation
 * writes), the worker restarting the Deployment through the change pipeline, the rollout, the
 * alert resolving, the silence lapsing. Prometheus and Alertmanager listen on the node's bridge
 * address, so the opsgate pods reach their APIs:
 * - a pod made unhealthy: restarted, outcome `remediated` (GET /ops/remediations, the restart job,
 *   an Event on the Deployment), its silence expired in Alertmanager;
 * - the same alert flapping back at once: not restarted again before the cooldown has passed, and
 *   restarted once it has;
 * - a Deployment whose new pods are unhealthy too: rolled out, still firing after `verify`
 *   (`rolled_out_still_firing`, a Warning Event), and its next firing escalates with a page.
 * Every duration is seconds, so the file takes about two minutes after the install.
 */
jest.setTimeout(600_000);

const RELEASE = 'opsgate-rem';
const NS = 'rem';
const APPS = 'rem-apps';
const NODE_IP = process.env.NODE_IP ?? '10.244.0.1';
/** The api image: its node serves the test workload's metric. */
const APP_IMAGE = imageRef('api', HOST_ARCH);
const ALERT = 'E2EAppUnhealthy';
/** The cooldown of rule `heal` (seconds): the flapping alert may not restart `web` more often. */
const COOLDOWN_S = 60;

const secrets = {
  apiKeys: [{ key: `rem-readonly-${randomBytes(12).toString('hex')}`, role: 'readonly' }],
  bearerToken: `rem-bearer-${randomBytes(16).toString('hex')}`,
  alertsWebhookToken: `rem-alerts-${randomBytes(16).toString('hex')}`,
};
const readonly = { 'X-API-Key': secrets.apiKeys[0]!.key };

/**
 * The workload: e2e_app_healthy 1 or 0 on /metrics, 0 from the start when its ConfigMap entry says
 * so (read when the container starts, so a restart's new pods read the value of that moment), and
 * 0 from a POST /break on (in memory: a restart's new pods are healthy again). Ready only once
 * Prometheus has scraped it: a rollout then removes an old pod only when its successor's sample is
 * in, and the Deployment's series has no gap that would resolve its alert for a moment.
 */
const SERVER = `
const http = require('node:http');
let healthy = process.env.START_HEALTHY !== '0';
let scraped = false;
const server = http.createServer((req, res) => {
  if (req.method === 'POST' && req.url === '/break') { healthy = false; res.end('broken\\n'); return; }
  if (req.url === '/ready') { res.statusCode = scraped ? 200 : 503; res.end(); return; }
  if (req.url === '/metrics') {
    if (/Prometheus/.test(req.headers['user-agent'] || '')) scraped = true;
    res.setHeader('content-type', 'text/plain; version=0.0.4');
    res.end('# TYPE e2e_app_healthy gauge\\ne2e_app_healthy ' + (healthy ? 1 : 0) + '\\n');
    return;
  }
  res.statusCode = 404;
  res.end();
});
server.listen(8080);
process.on('SIGTERM', () => process.exit(0));
`;

function deployment(name: string): string {
  return stringify({
    apiVersion: 'apps/v1',
    kind: 'Deployment',
    metadata: { name, namespace: APPS },
    spec: {
      replicas: 1,
      selector: { matchLabels: { app: name } },
      strategy: { type: 'RollingUpdate', rollingUpdate: { maxSurge: 1, maxUnavailable: 0 } },
      template: {
        metadata: { labels: { app: name } },
        spec: {
          terminationGracePeriodSeconds: 2,
          automountServiceAccountToken: false,
          containers: [
            {
              name: 'main',
              image: APP_IMAGE,
              imagePullPolicy: 'Never',
              command: ['node', '-e', SERVER],
              env: [{ name: 'START_HEALTHY', valueFrom: { configMapKeyRef: { name: 'health', key: name } } }],
              ports: [{ name: 'metrics', containerPort: 8080 }],
              readinessProbe: { httpGet: { path: '/ready', port: 8080 }, periodSeconds: 1 },
            },
          ],
        },
      },
    },
  });
}

/** The test's own alert: the Deployment's worst pod unhealthy (labels: alertname, namespace, deployment, severity). */
function rulesFile(): string {
  const f = join(mkdtempSync(join(tmpdir(), 'opsgate-e2e-rem-')), 'rules.yaml');
  writeFileSync(
    f,
    stringify({
      groups: [
        {
          name: 'e2e-remediation',
          interval: '2s',
          rules: [
            {
              alert: ALERT,
              expr: `min by (namespace, deployment) (e2e_app_healthy{namespace="${APPS}"}) == 0`,
              for: '2s',
              labels: { severity: 'critical' },
              annotations: { summary: 'a pod of {{ $labels.deployment }} reports itself unhealthy' },
            },
          ],
        },
      ],
    }),
  );
  return f;
}

/** Prometheus scrapes the workload's pods by their "metrics" port, labelled namespace and deployment (its app label). */
const appScrape: Obj = {
  job_name: 'e2e-apps',
  kubernetes_sd_configs: [
    {
      role: 'pod',
      api_server: `https://${NODE_IP}:6443`,
      tls_config: {
        ca_file: join(NODE_DIR, 'pki', 'ca.crt'),
        cert_file: join(NODE_DIR, 'pki', 'admin.crt'),
        key_file: join(NODE_DIR, 'pki', 'admin.key'),
      },
      namespaces: { names: [APPS] },
    },
  ],
  relabel_configs: [
    { source_labels: ['__meta_kubernetes_pod_container_port_name'], regex: 'metrics', action: 'keep' },
    { source_labels: ['__meta_kubernetes_pod_phase'], regex: 'Running', action: 'keep' },
    { source_labels: ['__meta_kubernetes_namespace'], target_label: 'namespace' },
    { source_labels: ['__meta_kubernetes_pod_label_app'], target_label: 'deployment' },
    { source_labels: ['__meta_kubernetes_pod_name'], target_label: 'pod' },
  ],
};

let monitoring: Monitoring | undefined;
let api = '';

async function decisions(rule: string): Promise<Obj[]> {
  const r = await http('GET', `${api}/ops/remediations?rule=${rule}&limit=500`, { headers: readonly });
  expect(r.status).toBe(200);
  return r.body.remediations as Obj[];
}
/** The first decision (oldest first) of `rule` matching `pred`, waited for. */
function decisionOf(rule: string, what: string, pred: (d: Obj) => boolean, timeoutMs: number): Promise<Obj> {
  return waitFor(`${rule}: ${what}`, async () => (await decisions(rule)).reverse().find(pred), timeoutMs, 1000);
}

async function job(id: string): Promise<Obj> {
  const r = await http('GET', `${api}/ops/jobs/${encodeURIComponent(id)}`, { headers: readonly });
  expect(r.status).toBe(200);
  return r.body;
}

async function events(name: string, reason: string): Promise<Obj[]> {
  const r = ok(await kubectl(['get', 'events.events.k8s.io', '-n', APPS, '-o', 'json']), 'kubectl get events');
  return (JSON.parse(r.stdout).items as Obj[]).filter((e) => e.regarding?.name === name && e.reason === reason);
}

async function silences(): Promise<Obj[]> {
  const r = await http('GET', `${monitoring!.alertmanager}/api/v2/silences`);
  expect(r.status).toBe(200);
  return JSON.parse(r.text) as Obj[];
}

async function restartedAt(name: string): Promise<string | undefined> {
  return (await getJson('deployment', name, APPS))?.spec?.template?.metadata?.annotations?.['kubectl.kubernetes.io/restartedAt'] as
    string | undefined;
}

/** Makes the Deployment's (one) ready pod report itself unhealthy. */
async function breakPod(name: string): Promise<string> {
  const pod = await waitFor(
    `a ready ${name} pod alone`,
    async () => {
      const ps = await list('pods', APPS, `app=${name}`);
      return ps.length === 1 && podReady(ps[0]!) && ps[0]!.status.podIP ? ps[0] : undefined;
    },
    120_000,
    1000,
  );
  const r = await http('POST', `http://${pod.status.podIP}:8080/break`);
  expect(r.status).toBe(200);
  return pod.metadata.name as string;
}

async function healthSamples(): Promise<Record<string, number>> {
  const q = encodeURIComponent(`min by (deployment) (e2e_app_healthy{namespace="${APPS}"})`);
  const r = await http('GET', `${monitoring!.prometheus}/api/v1/query?query=${q}`);
  const out: Record<string, number> = {};
  for (const s of (r.body.data?.result as Obj[] | undefined) ?? []) out[String(s.metric.deployment)] = Number(s.value[1]);
  return out;
}

const t0 = Date.now();
const log = (msg: string) => process.stderr.write(`[e2e remediation +${Math.round((Date.now() - t0) / 1000)}s] ${msg}\n`);

describe('alert-driven remediation on a real node', () => {
  beforeAll(async () => {
    for (const ns of [NS, APPS]) await waitFor(`namespace ${ns} gone`, async () => !(await getJson('namespace', ns)), 120_000, 1000);
    ok(await kubectl(['create', 'namespace', APPS]), `create namespace ${APPS}`);
    ok(await kubectl(['-n', APPS, 'create', 'configmap', 'health', '--from-literal=web=1', '--from-literal=stuck=1']), 'create configmap');
    await apply(deployment('web'));
    await apply(deployment('stuck'));

    // Prometheus and Alertmanager first, on the bridge address (the release's PROMETHEUS_URL and
    // ALERTMANAGER_URL); Alertmanager's receiver is pointed at the API once the release has its Service.
    monitoring = await startMonitoring({
      namespace: NS,
      release: RELEASE,
      alertsUrl: 'http://127.0.0.1:9/not-yet',
      alertsToken: secrets.alertsWebhookToken,
      extraRuleFiles: [rulesFile()],
      extraScrapeConfigs: [appScrape],
      // one group per alert; a firing alert told again every 10 s (the cooldown's end is seen soon)
      route: { group_by: ['...'], group_interval: '2s', repeat_interval: '10s' },
      alertmanagerHost: NODE_IP,
      prometheusHost: NODE_IP,
    });

    const values = {
      secrets,
      // Every rule confirms its alerts where they are born (confirm: prometheus, the default).
      config: { prometheusUrl: monitoring.prometheus, alertmanagerUrl: monitoring.alertmanager, rolloutTimeoutSeconds: 120 },
      inventory: {
        hosts: { 'apps-1': { namespace: APPS, deployments: ['web', 'stuck'] } },
        remediations: [
          {
            name: 'heal',
            match: { alertname: ALERT, labels: { deployment: 'web' } },
            targets: [`${APPS}/web`],
            trigger: { for: '0s' },
            cooldown: `${COOLDOWN_S}s`,
            escalate_after: 3,
            escalation_window: '600s',
            verify: '60s',
            settle: '5s',
            silence: true,
          },
          {
            name: 'stuck',
            match: { alertname: ALERT, labels: { deployment: 'stuck' } },
            targets: [`${APPS}/stuck`],
            cooldown: '5s',
            escalate_after: 1,
            escalation_window: '600s',
            verify: '10s',
            settle: '3s',
            silence: true,
          },
        ],
      },
    };
    const file = join(mkdtempSync(join(tmpdir(), 'opsgate-e2e-rem-')), 'values.yaml');
    writeFileSync(file, stringify(values), { mode: 0o600 });
    ok(
      await helm(['install', RELEASE, CHART, '-n', NS, '--create-namespace', '-f', LOCAL_IMAGES, '-f', file, '--wait', '--timeout', '6m']),
      'helm install --wait',
    );
    log('helm install --wait done');
    api = await serviceUrl(`${RELEASE}-api`, NS);
    await monitoring.setReceiver({
      url: `${api}/webhook/alerts`,
      send_resolved: true,
      max_alerts: 1000,
      http_config: { authorization: { type: 'Bearer', credentials: secrets.alertsWebhookToken } },
    });
    // both workloads scraped and healthy before anything is broken
    await waitFor(
      'Prometheus sees web and stuck healthy',
      async () => {
        const s = await healthSamples();
        return s.web === 1 && s.stuck === 1;
      },
      120_000,
      1000,
    );
    log('workloads scraped');
  });

  afterAll(async () => {
    await monitoring?.stop();
    await helm(['uninstall', RELEASE, '-n', NS, '--ignore-not-found', '--wait', '--timeout', '2m']);
    for (const ns of [NS, APPS]) await kubectl(['delete', 'namespace', ns, '--ignore-not-found', '--wait=false']);
  });

  let firstQueued: Obj;
  let firstRestartedAt: string | undefined;

  test('an unhealthy pod: Prometheus fires, Alertmanager delivers, opsgate restarts the Deployment, the alert resolves: remediated, an Event, the silence lapsed', async () => {
    const broken = await breakPod('web');
    log(`web pod ${broken} broken`);
    firstQueued = await decisionOf('heal', 'the restart queued', (d) => d.decision === 'queued', 120_000);
    log(`restart ${firstQueued.job_id} queued`);
    expect(firstQueued).toMatchObject({ alertname: ALERT, namespace: APPS, deployment: 'web', host: 'apps-1', mode: 'act' });

    // while it works, Alertmanager holds a silence of exactly this alert, naming the remediation
    const silence = await waitFor(
      'the silence of the remediation',
      async () => (await silences()).find((s) => String(s.comment).includes(firstQueued.id) && s.status.state === 'active'),
      60_000,
      1000,
    );
    expect(String(silence.comment)).toContain('by rule heal: restart of Deployment rem-apps/web');
    expect((silence.matchers as Obj[]).map((m) => `${m.name}=${m.value}`).sort()).toEqual(
      [`alertname=${ALERT}`, `deployment=web`, `namespace=${APPS}`, 'severity=critical'].sort(),
    );

    const outcome = await decisionOf('heal', 'the outcome', (d) => d.id === firstQueued.id && d.decision === 'outcome', 180_000);
    log(`outcome ${outcome.outcome}`);
    expect(outcome).toMatchObject({ outcome: 'remediated', job_id: firstQueued.job_id });
    expect(outcome.reason).toMatch(/rolled out and alert E2EAppUnhealthy resolved/);

    // the restart job itself: completed after its rollout, requested by the rule
    const done = await job(firstQueued.job_id as string);
    expect(done).toMatchObject({ state: 'completed', outcome: { result: 'rolled_out' } });
    const pods = await list('pods', APPS, 'app=web');
    expect(pods.map((p) => p.metadata.name)).not.toContain(broken);
    firstRestartedAt = await restartedAt('web');
    expect(firstRestartedAt).toBeTruthy();

    const [event] = await waitFor(
      'the OpsgateRemediated Event',
      async () => {
        const e = await events('web', 'OpsgateRemediated');
        return e.length > 0 ? e : undefined;
      },
      30_000,
      1000,
    );
    expect(event!.type).toBe('Normal');
    expect(String(event!.note)).toContain(`: remediated: restart ${firstQueued.job_id} rolled out`);

    // settle (5 s) after the outcome, the silence is expired: Alertmanager notifies for this alert again
    const lapsed = await waitFor(
      'the silence expired',
      async () => (await silences()).find((s) => s.id === silence.id && s.status.state === 'expired'),
      60_000,
      1000,
    );
    expect(Date.parse(String(lapsed.endsAt))).toBeLessThanOrEqual(Date.now());
    expect((await silences()).filter((s) => s.status.state === 'active' && String(s.comment).includes(firstQueued.id))).toEqual([]);
    log('silence expired');
  });

  test('the alert flapping back at once: suppressed by the cooldown, restarted again only once the cooldown has passed', async () => {
    await breakPod('web');
    log('web broken again');
    const suppressed = await decisionOf(
      'heal',
      'the cooldown to suppress the second firing',
      (d) => d.decision === 'suppressed' && d.guard === 'cooldown' && d.starts_at !== firstQueued.starts_at,
      120_000,
    );
    log(`suppressed: ${suppressed.reason}`);
    expect(Date.parse(suppressed.at as string) - Date.parse(firstQueued.at as string)).toBeLessThan(COOLDOWN_S * 1000);
    expect(suppressed.reason).toMatch(/restarted by this rule less than 1m ago/);
    // nothing restarted by it: the Deployment's pod template is as the first restart left it
    expect(await restartedAt('web')).toBe(firstRestartedAt);

    const second = await decisionOf(
      'heal',
      'the restart after the cooldown',
      (d) => d.decision === 'queued' && d.id !== firstQueued.id,
      (COOLDOWN_S + 60) * 1000,
    );
    log(`second restart ${second.job_id} queued`);
    expect(Date.parse(second.at as string) - Date.parse(firstQueued.at as string)).toBeGreaterThanOrEqual(COOLDOWN_S * 1000);
    // two restarts in all, each of its own firing
    const queued = (await decisions('heal')).filter((d) => d.decision === 'queued');
    expect(queued).toHaveLength(2);
    expect(second.starts_at).not.toBe(firstQueued.starts_at);

    const outcome = await decisionOf('heal', 'the second outcome', (d) => d.id === second.id && d.decision === 'outcome', 180_000);
    expect(outcome.outcome).toBe('remediated');
    expect(await restartedAt('web')).not.toBe(firstRestartedAt);
    log('second remediation done');
  });

  test('new pods as unhealthy as the old: rolled out, still firing after verify (a Warning Event), and its next firing escalates with a page', async () => {
    // a restart's new pods start unhealthy from here on
    ok(await kubectl(['-n', APPS, 'patch', 'configmap', 'health', '--type=merge', '-p', '{"data":{"stuck":"0"}}']), 'patch configmap');
    const broken = await breakPod('stuck');
    const queued = await decisionOf('stuck', 'the restart queued', (d) => d.decision === 'queued', 120_000);
    log(`stuck: restart ${queued.job_id} queued`);
    const outcome = await decisionOf('stuck', 'the outcome', (d) => d.id === queued.id && d.decision === 'outcome', 180_000);
    log(`stuck: outcome ${outcome.outcome}`);
    expect(outcome).toMatchObject({ outcome: 'rolled_out_still_firing', job_id: queued.job_id });
    expect(outcome.reason).toMatch(/rolled out, but alert E2EAppUnhealthy still fires 10s later/);
    expect(await job(queued.job_id as string)).toMatchObject({ state: 'completed', outcome: { result: 'rolled_out' } });
    expect((await list('pods', APPS, 'app=stuck')).map((p) => p.metadata.name)).not.toContain(broken);
    const failedEvent = await waitFor(
      'the OpsgateRemediationFailed Event',
      async () => {
        const e = await events('stuck', 'OpsgateRemediationFailed');
        return e[0];
      },
      30_000,
      1000,
    );
    expect(failedEvent.type).toBe('Warning');
    expect(String(failedEvent.note)).toContain(`: rolled_out_still_firing: restart ${queued.job_id} rolled out`);

    // escalate_after 1: once its silence lapses, the alert still firing is told again and escalates
    const escalated = await decisionOf('stuck', 'the escalation', (d) => d.decision === 'escalated', 120_000);
    log('stuck: escalated');
    expect(escalated.reason).toMatch(/^1 remediations of Deployment rem-apps\/stuck within 10m did not keep alert E2EAppUnhealthy away/);
    const page = await waitFor(
      'the page of the escalation',
      async () => {
        const j = await job(`remediation-escalation.${escalated.id}`);
        return j.state === 'completed' ? j : undefined;
      },
      60_000,
      1000,
    );
    expect(page.name).toBe('ops_worker.notify_oncall');
    // one restart in all
    expect((await decisions('stuck')).filter((d) => d.decision === 'queued')).toHaveLength(1);
  });
});
