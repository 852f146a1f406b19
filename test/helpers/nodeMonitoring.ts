import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse, stringify } from 'yaml';
import { REPO } from './cluster.js';
import { freePort } from './redis.js';
import { NODE_DIR, waitFor, type Obj } from './nodeSupport.js';

/**
 * Real Prometheus (built from github.com/prometheus/prometheus: Debian's lacks Kubernetes service
 * discovery) and Alertmanager (Debian package prometheus-alertmanager) as host
 * processes on 127.0.0.1 (or the node's bridge address, where pods must reach them) against the test node: Prometheus discovers the release's pods through
 * Kubernetes service discovery (the apiserver on the node's bridge address), loads the chart's own
 * rules file (charts/opsgate/files/prometheus-rules.yaml, what the PrometheusRule renders) and
 * sends alerts to Alertmanager, whose receiver is opsgate's /webhook/alerts with the bearer token.
 */
export const RULES_FILE = join(REPO, 'charts', 'opsgate', 'files', 'prometheus-rules.yaml');
export const DASHBOARD_FILE = join(REPO, 'charts', 'opsgate', 'files', 'grafana-dashboard.json');
// Built from its Go module by `make tools-prometheus`: Debian's prometheus 2.42 has no Kubernetes SD.
const PROMETHEUS = process.env.PROMETHEUS_BIN ?? join(REPO, '.tools', 'bin', 'prometheus');
const ALERTMANAGER = process.env.ALERTMANAGER_BIN ?? '/usr/bin/prometheus-alertmanager';
const NODE_IP = process.env.NODE_IP ?? '10.244.0.1';

function startProc(bin: string, args: string[], log: string): ChildProcess {
  const fd = openSync(log, 'a');
  const c = spawn(bin, args, { stdio: ['ignore', fd, fd] });
  closeSync(fd);
  c.on('error', () => {});
  return c;
}

async function getJson(url: string): Promise<Obj> {
  const r = await fetch(url, { signal: AbortSignal.timeout(5000) });
  if (!r.ok) throw new Error(`${url}: ${r.status}`);
  return (await r.json()) as Obj;
}

export interface Monitoring {
  prometheus: string;
  alertmanager: string;
  waitForTargets(components: string[]): Promise<void>;
  /** Dashboard panels none of whose queries return a sample (after a short settling wait). */
  emptyDashboardPanels(): Promise<string[]>;
  /** The alert once Alertmanager has delivered it to the webhook receiver without a failure. */
  waitForAlertDelivered(alertname: string, timeoutMs: number): Promise<Obj>;
  /** Alertmanager's webhook notifications so far: sent (attempted) and failed. */
  webhookNotifications(): Promise<{ sent: number; failed: number }>;
  /** Posts a firing alert to Alertmanager's API (as Prometheus would). */
  postAlert(alertname: string, labels?: Record<string, string>): Promise<void>;
  /** Replaces the opsgate receiver's webhook_configs entry and has Alertmanager reload its configuration. */
  setReceiver(webhookConfig: Obj): Promise<void>;
  stop(): Promise<void>;
}

/** Panel title -> its PromQL queries, Grafana variables replaced as Grafana would for "All". */
export function dashboardQueries(): Map<string, string[]> {
  const d = JSON.parse(readFileSync(DASHBOARD_FILE, 'utf8')) as Obj;
  const out = new Map<string, string[]>();
  const walk = (panels: Obj[]) => {
    for (const p of panels) {
      const exprs = ((p.targets as Obj[] | undefined) ?? []).map((t) => String(t.expr ?? '')).filter(Boolean);
      if (exprs.length)
        out.set(
          String(p.title),
          exprs.map((e) => e.replaceAll('$__rate_interval', '1m').replaceAll('$queue', '.*')),
        );
      walk((p.panels as Obj[] | undefined) ?? []);
    }
  };
  walk(d.panels as Obj[]);
  return out;
}

/** The chart's rules file as it is, but for the `for:` of the alerts named in `override`. */
function rulesFile(dir: string, override: Record<string, string>): string {
  if (Object.keys(override).length === 0) return RULES_FILE;
  const rules = parse(readFileSync(RULES_FILE, 'utf8')) as { groups: Array<{ rules: Obj[] }> };
  const seen = new Set<string>();
  for (const r of rules.groups.flatMap((g) => g.rules)) {
    const d = override[String(r.alert)];
    if (d === undefined) continue;
    r.for = d;
    seen.add(String(r.alert));
  }
  const missing = Object.keys(override).filter((a) => !seen.has(a));
  if (missing.length) throw new Error(`no rule for ${missing.join(', ')} in ${RULES_FILE}`);
  const file = join(dir, 'prometheus-rules.yaml');
  writeFileSync(file, stringify(rules));
  return file;
}

export async function startMonitoring(opts: {
  namespace: string;
  release: string;
  alertsUrl: string;
  alertsToken: string;
  /** The metrics ports serve HTTPS (tls.enabled): scrape them as the chart's ServiceMonitor says, CA and server name. */
  scrapeTls?: { caFile: string; serverName: string };
  /** The receiver's webhook_configs entry, instead of a plain one to alertsUrl with the bearer token. */
  webhookConfig?: Obj;
  /**
   * Alerts whose `for:` is replaced (alertname -> duration) in the copy of the rules file Prometheus
   * loads. The shipped durations are tested by promtool's unit tests (monitoring/tests, make test);
   * here the path from a scrape to a job is, and OpsgateWorkerDown's 5 minutes of waiting would
   * add nothing to that but 5 minutes.
   */
  forOverride?: Record<string, string>;
  /** More rule files for Prometheus to load beside the chart's (a test's own alerts). */
  extraRuleFiles?: string[];
  /** More scrape jobs (a test's own workloads), as written in prometheus.yml. */
  extraScrapeConfigs?: Obj[];
  /** Fields of Alertmanager's route replacing the defaults below (group_by, repeat_interval, ...). */
  route?: Obj;
  /**
   * The address Alertmanager listens on: 127.0.0.1 unless pods must reach it too (opsgate's
   * ALERTMANAGER_URL), then the node's bridge address, which the pods route to.
   */
  alertmanagerHost?: string;
  /**
   * The address Prometheus listens on: 127.0.0.1 unless pods must reach it too (opsgate's
   * PROMETHEUS_URL, where remediation confirms its alerts), then the node's bridge address.
   */
  prometheusHost?: string;
}): Promise<Monitoring> {
  const dir = mkdtempSync(join(tmpdir(), 'opsgate-monitoring-'));
  const [promPort, amPort] = [await freePort(), await freePort()];
  const amHost = opts.alertmanagerHost ?? '127.0.0.1';
  const promHost = opts.prometheusHost ?? '127.0.0.1';
  const pki = join(NODE_DIR, 'pki');
  const tls = { ca_file: join(pki, 'ca.crt'), cert_file: join(pki, 'admin.crt'), key_file: join(pki, 'admin.key') };

  const plainWebhook: Obj = {
    url: opts.alertsUrl,
    send_resolved: false,
    max_alerts: 1000,
    http_config: { authorization: { type: 'Bearer', credentials: opts.alertsToken } },
  };
  const writeAlertmanagerConfig = (webhookConfig: Obj) =>
    writeFileSync(
      join(dir, 'alertmanager.yml'),
      stringify({
        route: {
          receiver: 'opsgate',
          group_by: ['alertname'],
          group_wait: '1s',
          group_interval: '5s',
          repeat_interval: '1h',
          ...(opts.route ?? {}),
        },
        receivers: [{ name: 'opsgate', webhook_configs: [webhookConfig] }],
      }),
      { mode: 0o600 },
    );
  writeAlertmanagerConfig(opts.webhookConfig ?? plainWebhook);
  writeFileSync(
    join(dir, 'prometheus.yml'),
    stringify({
      global: { scrape_interval: '2s', evaluation_interval: '2s', scrape_timeout: '2s' },
      rule_files: [rulesFile(dir, opts.forOverride ?? {}), ...(opts.extraRuleFiles ?? [])],
      alerting: { alertmanagers: [{ static_configs: [{ targets: [`${amHost}:${amPort}`] }] }] },
      scrape_configs: [
        {
          // what the chart's ServiceMonitor does: the "metrics" port of the release's pods, job = <release>-<component>
          job_name: 'opsgate-pods',
          kubernetes_sd_configs: [
            { role: 'pod', api_server: `https://${NODE_IP}:6443`, tls_config: tls, namespaces: { names: [opts.namespace] } },
          ],
          relabel_configs: [
            { source_labels: ['__meta_kubernetes_pod_label_app_kubernetes_io_instance'], regex: opts.release, action: 'keep' },
            { source_labels: ['__meta_kubernetes_pod_container_port_name'], regex: 'metrics', action: 'keep' },
            { source_labels: ['__meta_kubernetes_pod_phase'], regex: 'Running', action: 'keep' },
            {
              source_labels: [
                '__meta_kubernetes_pod_label_app_kubernetes_io_instance',
                '__meta_kubernetes_pod_label_app_kubernetes_io_component',
              ],
              separator: '-',
              target_label: 'job',
            },
            { source_labels: ['__meta_kubernetes_namespace'], target_label: 'namespace' },
            { source_labels: ['__meta_kubernetes_pod_name'], target_label: 'pod' },
          ],
          ...(opts.scrapeTls
            ? { scheme: 'https', tls_config: { ca_file: opts.scrapeTls.caFile, server_name: opts.scrapeTls.serverName } }
            : {}),
        },
        ...(opts.extraScrapeConfigs ?? []),
      ],
    }),
  );

  const am = startProc(
    ALERTMANAGER,
    [
      `--config.file=${join(dir, 'alertmanager.yml')}`,
      `--storage.path=${join(dir, 'am-data')}`,
      `--web.listen-address=${amHost}:${amPort}`,
      '--cluster.listen-address=',
    ],
    join(dir, 'alertmanager.log'),
  );
  const prom = startProc(
    PROMETHEUS,
    [
      `--config.file=${join(dir, 'prometheus.yml')}`,
      `--storage.tsdb.path=${join(dir, 'prom-data')}`,
      `--web.listen-address=${promHost}:${promPort}`,
    ],
    join(dir, 'prometheus.log'),
  );
  async function stopAll(): Promise<void> {
    for (const c of [prom, am]) {
      if (c.exitCode !== null || c.signalCode !== null) continue;
      const exited = new Promise((r) => c.once('exit', r));
      c.kill('SIGTERM');
      const t = setTimeout(() => c.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(t);
    }
    rmSync(dir, { recursive: true, force: true });
  }
  const prometheus = `http://${promHost}:${promPort}`;
  const alertmanager = `http://${amHost}:${amPort}`;
  const logTail = () =>
    ['prometheus.log', 'alertmanager.log']
      .map((f) => `--- ${f}\n${readFileSync(join(dir, f), 'utf8').split('\n').slice(-15).join('\n')}`)
      .join('\n');
  try {
    await waitFor('prometheus ready', async () => (await fetch(`${prometheus}/-/ready`)).ok, 60_000);
    await waitFor('alertmanager ready', async () => (await fetch(`${alertmanager}/-/ready`)).ok, 60_000);
  } catch (e) {
    const msg = `${(e as Error).message}\n${logTail()}`;
    await stopAll();
    throw new Error(msg, { cause: e });
  }

  async function query(q: string): Promise<Obj[]> {
    const r = await getJson(`${prometheus}/api/v1/query?query=${encodeURIComponent(q)}`);
    if (r.status !== 'success') throw new Error(`query ${q}: ${JSON.stringify(r)}`);
    return r.data.result as Obj[];
  }

  async function metric(url: string, name: string, match: string): Promise<number> {
    const text = await (await fetch(`${url}/metrics`)).text();
    return text
      .split('\n')
      .filter((l) => l.startsWith(name) && l.includes(match))
      .reduce((n, l) => n + Number(l.split(' ').pop()), 0);
  }

  return {
    prometheus,
    alertmanager,
    async waitForTargets(components) {
      await waitFor(
        `prometheus scraping ${components.join(', ')}`,
        async () => {
          const t = await getJson(`${prometheus}/api/v1/targets?state=active`);
          const up = (t.data.activeTargets as Obj[]).filter((x) => x.health === 'up').map((x) => String(x.labels.job));
          return components.every((c) => up.includes(`${opts.release}-${c}`));
        },
        120_000,
        1000,
      );
      // the rules file loaded as it is
      const rules = await getJson(`${prometheus}/api/v1/rules`);
      const names = (rules.data.groups as Obj[]).flatMap((g) => (g.rules as Obj[]).map((r) => r.name));
      if (!names.includes('OpsgateWorkerDown')) throw new Error(`rules not loaded: ${names.join(', ')}`);
    },
    async emptyDashboardPanels() {
      const panels = dashboardQueries();
      const empty = async () => {
        const out: string[] = [];
        for (const [title, exprs] of panels) {
          let any = false;
          for (const e of exprs) if ((await query(e)).length > 0) any = true;
          if (!any) out.push(title);
        }
        return out;
      };
      // rates need two samples of every series: settle for a while, then report what is still empty
      let last: string[] = [];
      try {
        await waitFor('every dashboard panel to return data', async () => (last = await empty()).length === 0, 90_000, 2000);
      } catch {
        /* reported below */
      }
      return last;
    },
    async waitForAlertDelivered(alertname, timeoutMs) {
      const alert = await waitFor(
        `${alertname} firing in Alertmanager`,
        async () => {
          const alerts = (await getJson(
            `${alertmanager}/api/v2/alerts?filter=${encodeURIComponent(`alertname="${alertname}"`)}`,
          )) as unknown as Obj[];
          return alerts.find((a) => a.status?.state === 'active');
        },
        timeoutMs,
        2000,
      );
      await waitFor(
        'Alertmanager to deliver to the webhook',
        async () => (await metric(alertmanager, 'alertmanager_notifications_total', 'integration="webhook"')) >= 1,
        60_000,
        1000,
      );
      const failed = await metric(alertmanager, 'alertmanager_notifications_failed_total', 'integration="webhook"');
      if (failed > 0) throw new Error(`Alertmanager failed ${failed} webhook notification(s)\n${logTail()}`);
      return { ...alert, status: 'firing' };
    },
    async webhookNotifications() {
      return {
        sent: await metric(alertmanager, 'alertmanager_notifications_total', 'integration="webhook"'),
        failed: await metric(alertmanager, 'alertmanager_notifications_failed_total', 'integration="webhook"'),
      };
    },
    async postAlert(alertname, labels = {}) {
      const r = await fetch(`${alertmanager}/api/v2/alerts`, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify([
          { labels: { alertname, severity: 'warning', ...labels }, annotations: { summary: `${alertname} from the e2e` } },
        ]),
        signal: AbortSignal.timeout(5000),
      });
      if (!r.ok) throw new Error(`POST /api/v2/alerts: ${r.status} ${await r.text()}`);
    },
    async setReceiver(webhookConfig) {
      writeAlertmanagerConfig(webhookConfig);
      const r = await fetch(`${alertmanager}/-/reload`, { method: 'POST', signal: AbortSignal.timeout(10_000) });
      if (!r.ok) throw new Error(`alertmanager reload: ${r.status} ${await r.text()}\n${logTail()}`);
    },
    stop: stopAll,
  };
}
