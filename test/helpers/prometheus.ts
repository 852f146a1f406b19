import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { freePort } from './redis.js';
import { waitFor } from './waitFor.js';

/**
 * A real Debian Prometheus on 127.0.0.1 for a test file, evaluating static alerting rules over a
 * target the test controls: a small HTTP server on 127.0.0.1 serving the gauge
 * `opsgate_test_alert{alert="<alertname>", <labels>} 1` for every alert the test fires. Each rule
 * is `max without (instance, job, alert) (opsgate_test_alert{alert="<name>"}) > 0` with its own
 * `for`, so the series ALERTS and ALERTS_FOR_STATE carry exactly the labels fired (and alertname).
 * Scrapes and evaluations every 500 ms; a cleared alert goes stale at the next scrape and resolves.
 * With `alertmanager`, Prometheus sends its alerts there, as in a cluster.
 * `stop` ends the process alone (the target and the port stay), `start` runs it again on them.
 */
export const PROMETHEUS_BIN = ['/usr/bin/prometheus'].find((b) => existsSync(b));

export interface TestPrometheus {
  url: string;
  /** Serves the alert's series: Prometheus fires it at its next evaluations (after its rule's `for`). */
  fire(labels: Record<string, string>): void;
  /** Stops serving it: it resolves. */
  clear(labels: Record<string, string>): void;
  /** Until Prometheus fires it (ALERTS{alertstate="firing"} with exactly these labels); answers its active-since (ms). */
  waitFiring(labels: Record<string, string>, timeoutMs?: number): Promise<number>;
  waitResolved(labels: Record<string, string>, timeoutMs?: number): Promise<void>;
  /** fire, then waitFiring (nothing to wait for when it fires already). */
  ensureFiring(labels: Record<string, string>): Promise<number>;
  stop(): Promise<void>;
  start(): Promise<void>;
  close(): Promise<void>;
}

export interface PrometheusOptions {
  rules: Array<{ alert: string; for?: string }>;
  externalLabels?: Record<string, string>;
  /** http://127.0.0.1:<port> of an Alertmanager to send alerts to. */
  alertmanager?: string;
}

const key = (labels: Record<string, string>) => JSON.stringify(Object.entries(labels).sort(([a], [b]) => a.localeCompare(b)));
const escape = (v: string) => v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');

export async function startPrometheus(opts: PrometheusOptions): Promise<TestPrometheus> {
  if (!PROMETHEUS_BIN) throw new Error('prometheus is not installed (/usr/bin/prometheus: make tools-prom)');
  const fired = new Map<string, Record<string, string>>();
  const target = createServer((_req, res) => {
    const lines = ['# TYPE opsgate_test_alert gauge'];
    for (const l of fired.values()) {
      const { alertname, ...rest } = l;
      const pairs = [`alert="${escape(alertname ?? '')}"`, ...Object.entries(rest).map(([k, v]) => `${k}="${escape(v)}"`)];
      lines.push(`opsgate_test_alert{${pairs.join(',')}} 1`);
    }
    res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(`${lines.join('\n')}\n`);
  });
  await new Promise<void>((r) => target.listen(0, '127.0.0.1', r));
  const targetPort = (target.address() as AddressInfo).port;
  const dir = mkdtempSync(join(tmpdir(), 'opsgate-prom-'));
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  writeFileSync(
    join(dir, 'rules.yml'),
    stringify({
      groups: [
        {
          name: 'opsgate-test',
          rules: opts.rules.map((r) => ({
            alert: r.alert,
            expr: `max without (instance, job, alert) (opsgate_test_alert{alert="${escape(r.alert)}"}) > 0`,
            for: r.for ?? '0s',
          })),
        },
      ],
    }),
  );
  writeFileSync(
    join(dir, 'prometheus.yml'),
    stringify({
      global: {
        scrape_interval: '500ms',
        scrape_timeout: '400ms',
        evaluation_interval: '500ms',
        ...(opts.externalLabels ? { external_labels: opts.externalLabels } : {}),
      },
      rule_files: [join(dir, 'rules.yml')],
      scrape_configs: [{ job_name: 'target', static_configs: [{ targets: [`127.0.0.1:${targetPort}`] }] }],
      ...(opts.alertmanager
        ? { alerting: { alertmanagers: [{ api_version: 'v2', static_configs: [{ targets: [new URL(opts.alertmanager).host] }] }] } }
        : {}),
    }),
  );
  let proc: ChildProcess | undefined;
  const stop = async () => {
    const p = proc;
    proc = undefined;
    if (!p || p.exitCode !== null || p.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => p.once('exit', () => resolve()));
    p.kill('SIGTERM');
    // Bounded: a process that does not stop in 5 s is killed.
    const timer = setTimeout(() => p.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(timer);
  };
  const start = async () => {
    proc = spawn(
      PROMETHEUS_BIN,
      [
        `--config.file=${join(dir, 'prometheus.yml')}`,
        `--storage.tsdb.path=${join(dir, 'data')}`,
        `--web.listen-address=127.0.0.1:${port}`,
        '--rules.alert.resend-delay=1s',
        '--log.level=error',
      ],
      { cwd: dir, stdio: ['ignore', 'ignore', 'inherit'] },
    );
    proc.on('error', () => {});
    await waitFor('prometheus ready', async () => (await fetch(`${url}/-/ready`).catch(() => undefined))?.status === 200, 30_000, 100);
  };
  const close = async () => {
    await stop();
    target.closeAllConnections();
    await new Promise((r) => target.close(r));
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    await start();
  } catch (err) {
    await close();
    throw err;
  }
  const query = async (q: string): Promise<Array<{ metric: Record<string, string>; value: [number, string] }>> => {
    const res = await fetch(`${url}/api/v1/query?${new URLSearchParams({ query: q }).toString()}`);
    if (res.status !== 200) return [];
    return ((await res.json()) as { data: { result: Array<{ metric: Record<string, string>; value: [number, string] }> } }).data.result;
  };
  const same = (m: Record<string, string>, labels: Record<string, string>) => {
    const { __name__: _n, alertstate: _s, ...rest } = m;
    return key(rest) === key(labels);
  };
  const activeSince = async (labels: Record<string, string>): Promise<number | undefined> => {
    const firing = (await query(`ALERTS{alertstate="firing",alertname="${escape(labels.alertname ?? '')}"}`)).some((r) =>
      same(r.metric, labels),
    );
    if (!firing) return undefined;
    const state = (await query(`ALERTS_FOR_STATE{alertname="${escape(labels.alertname ?? '')}"}`)).find((r) => same(r.metric, labels));
    return state ? Number(state.value[1]) * 1000 : undefined;
  };
  const waitFiring = (labels: Record<string, string>, timeoutMs = 20_000) =>
    waitFor(`Prometheus firing ${key(labels)}`, () => activeSince(labels), timeoutMs, 100);
  return {
    url,
    fire: (labels) => void fired.set(key(labels), labels),
    clear: (labels) => void fired.delete(key(labels)),
    waitFiring,
    async waitResolved(labels, timeoutMs = 20_000) {
      await waitFor(`Prometheus resolved ${key(labels)}`, async () => (await activeSince(labels)) === undefined, timeoutMs, 100);
    },
    async ensureFiring(labels) {
      fired.set(key(labels), labels);
      return (await activeSince(labels)) ?? waitFiring(labels);
    },
    stop,
    start,
    close,
  };
}
