import { spawnSync } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from '@jest/globals';
import { Redis } from 'ioredis';
import { parse as parseYaml } from 'yaml';
import { startApi, startWorkerProcess, type OpsProcess } from '../../helpers/processes.js';
import { freePort, startRedis, type RedisServer } from '../../helpers/redis.js';

/**
 * Real scrapes of the real processes: the built API (dist/src/server.js) and worker
 * (dist/worker/index.js) on a real redis-server, driven by real traffic (a firing alert whose
 * notification endpoint answers 400, so the job is dead-lettered; refused credentials; a retry
 * from Bull Board once the endpoint answers 200). Checks:
 * - `promtool check metrics` accepts both scrapes;
 * - the instrumentation really moves (http by route template, webhook outcomes, auth failures,
 *   enqueued/processed/dead-lettered jobs, job duration, queue depth and dead letters from Redis);
 * - a hung Redis (SIGSTOP) does not hang a scrape: depth samples are skipped, an error is counted;
 * - every metric named by the Grafana dashboard and the alert rules is one the processes export
 *   (names taken from these scrapes, plus _bucket/_sum/_count of histograms).
 */
const ROOT = resolve(import.meta.dirname, '../../..');
const DASHBOARD = join(ROOT, 'charts/opsgate/files/grafana-dashboard.json');
const RULES = join(ROOT, 'charts/opsgate/files/prometheus-rules.yaml');
const PROMTOOL = process.env.PROMTOOL ?? 'promtool';
const OPERATOR = 'scrape-operator-key-0001';
const READONLY = 'scrape-readonly-key-0001';

function promtool(args: string[], input?: string) {
  const r = spawnSync(PROMTOOL, args, { input, encoding: 'utf8', timeout: 60000 });
  if (r.error) throw new Error(`cannot run ${PROMTOOL} (make tools-prom): ${r.error.message}`);
  return { code: r.status, out: `${r.stdout}${r.stderr}` };
}

async function scrape(port: number): Promise<string> {
  const res = await fetch(`http://127.0.0.1:${port}/metrics`);
  expect(res.status).toBe(200);
  expect(res.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
  return res.text();
}

/** Sample value of an exact series line (name{labels} value), or undefined. */
function sample(text: string, series: string): number | undefined {
  for (const line of text.split('\n')) {
    if (line.startsWith(series + ' ')) return Number(line.slice(series.length + 1));
  }
  return undefined;
}

/** Every series name a scrape can be queried by: families, plus _bucket/_sum/_count for histograms and summaries. */
function exportedNames(text: string): Set<string> {
  const names = new Set<string>();
  for (const m of text.matchAll(/^# TYPE (\S+) (\S+)$/gm)) {
    const [, name, type] = m as unknown as [string, string, string];
    names.add(name);
    if (type === 'histogram') for (const s of ['_bucket', '_sum', '_count']) names.add(name + s);
    if (type === 'summary') for (const s of ['_sum', '_count']) names.add(name + s);
  }
  for (const m of text.matchAll(/^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]/gm)) names.add(m[1]!);
  return names;
}

const PROMQL_KEYWORDS = new Set([
  'and',
  'or',
  'unless',
  'bool',
  'offset',
  'by',
  'without',
  'on',
  'ignoring',
  'group_left',
  'group_right',
  'Inf',
  'NaN',
  'inf',
  'nan',
]);

/** Metric names referenced by a PromQL expression (strings, label matchers, ranges, grouping lists and function names removed). */
function metricNames(expr: string): string[] {
  let s = expr.replace(/"(?:[^"\\]|\\.)*"/g, '""');
  s = s.replace(/\{[^}]*\}/g, ' ');
  s = s.replace(/\[[^\]]*\]/g, ' ');
  s = s.replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ');
  const out: string[] = [];
  for (const m of s.matchAll(/[a-zA-Z_:][a-zA-Z0-9_:]*/g)) {
    const before = s[m.index - 1];
    if (before !== undefined && /[0-9.]/.test(before)) continue; // 1e3, 5m
    const after = s.slice(m.index + m[0].length).trimStart();
    if (after.startsWith('(')) continue; // function / aggregation
    if (PROMQL_KEYWORDS.has(m[0])) continue;
    out.push(m[0]);
  }
  return out;
}

/** Grafana variables replaced by values Prometheus accepts, so the expression can be parsed. */
function grafanaToPromql(expr: string): string {
  return expr
    .replace(/\$__rate_interval|\$__interval|\$__range/g, '5m')
    .replace(/\$\{?queue\}?/g, '.*')
    .replace(/\$\{?[a-zA-Z_]+\}?/g, 'x');
}

interface Panel {
  type: string;
  title: string;
  datasource?: { uid?: string };
  targets?: { expr: string; datasource?: { uid?: string } }[];
  panels?: Panel[];
}

describe('metrics of the running api and worker', () => {
  let redisServer: RedisServer;
  let api: OpsProcess & { baseUrl: string };
  let worker: OpsProcess;
  let receiver: Server;
  let receiverStatus = 400;
  const received: string[] = [];
  let apiMetricsPort = 0;
  let workerMetricsPort = 0;
  let apiText = '';
  let workerText = '';
  const tmp = mkdtempSync(join(tmpdir(), 'opsgate-scrape-'));

  beforeAll(async () => {
    redisServer = await startRedis();
    receiver = createServer((req, res) => {
      let body = '';
      req.on('data', (c: Buffer) => (body += c.toString()));
      req.on('end', () => {
        received.push(body);
        res.writeHead(receiverStatus, { 'Content-Type': 'application/json' }).end('{}');
      });
    });
    const receiverPort = await freePort();
    await new Promise<void>((r) => receiver.listen(receiverPort, '127.0.0.1', () => r()));

    apiMetricsPort = await freePort();
    workerMetricsPort = await freePort();
    api = await startApi({
      env: {
        PORT: String(await freePort()),
        METRICS_PORT: String(apiMetricsPort),
        REDIS_URL: redisServer.url,
        OPS_API_KEY_ROLES: `${OPERATOR}:operator,${READONLY}:readonly`,
        SCM_WEBHOOK_SECRET: 'scm-secret-for-scrape-test',
        OPSGATE_VERSION: '1.2.3-scrape',
        RATE_LIMIT_RPS: '0',
        ADMIN_UI_ENABLED: 'true',
        JOB_ATTEMPTS: '3',
        JOB_BACKOFF_MS: '100',
      },
    });
    worker = await startWorkerProcess({
      env: {
        METRICS_PORT: String(workerMetricsPort),
        REDIS_URL: redisServer.url,
        NOTIFY_WEBHOOK_URLS: `http://127.0.0.1:${receiverPort}/hook`,
        OPSGATE_VERSION: '1.2.3-scrape',
        NOTIFY_TIMEOUT_MS: '3000',
      },
    });

    // Traffic: refused credentials, a readonly call, a firing alert (its notification gets 400 -> dead-lettered).
    expect((await fetch(`${api.baseUrl}/ops/hosts`)).status).toBe(401);
    expect((await fetch(`${api.baseUrl}/ops/hosts`, { headers: { 'X-API-Key': READONLY } })).status).toBe(200);
    expect((await fetch(`${api.baseUrl}/ops/jobs/does-not-exist-123`, { headers: { 'X-API-Key': READONLY } })).status).toBe(404);
    expect((await fetch(`${api.baseUrl}/webhook/scm`, { method: 'POST', headers: { 'X-Scm-Token': 'wrong' }, body: '{}' })).status).toBe(
      403,
    );
    const alert = await fetch(`${api.baseUrl}/webhook/alerts`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({
        alerts: [
          { status: 'firing', fingerprint: 'fp-scrape-1', labels: { alertname: 'DiskFull' }, annotations: { summary: 'disk full' } },
        ],
      }),
    });
    expect(alert.status).toBe(202);
    await worker.waitForLog((l) => l.msg === 'job dead-lettered', 30000);

    apiText = await scrape(apiMetricsPort);
    workerText = await scrape(workerMetricsPort);
    writeFileSync(join(tmp, 'api.prom'), apiText);
    writeFileSync(join(tmp, 'worker.prom'), workerText);
  }, 90000);

  afterAll(async () => {
    await api?.stop();
    await worker?.stop();
    await new Promise<void>((r) => (receiver ? receiver.close(() => r()) : r()));
    await redisServer?.destroy();
    rmSync(tmp, { recursive: true, force: true });
  });

  test('promtool check metrics accepts the real scrape of the api and of the worker', () => {
    for (const text of [apiText, workerText]) {
      expect(text.length).toBeGreaterThan(1000);
      const r = promtool(['check', 'metrics'], text);
      expect(r.out.trim()).toBe('');
      expect(r.code).toBe(0);
    }
  });

  test('promtool check metrics is not a rubber stamp (a broken exposition fails)', () => {
    const broken = apiText + '\n# TYPE opsgate_bogus counter\nopsgate_bogus 1\n';
    expect(promtool(['check', 'metrics'], broken).code).not.toBe(0);
  });

  test('build info and default process metrics on both processes', () => {
    expect(apiText).toMatch(/^opsgate_build_info\{version="1\.2\.3-scrape",component="api",node_version="v[^"]+"\} 1$/m);
    expect(workerText).toMatch(/^opsgate_build_info\{version="1\.2\.3-scrape",component="worker",node_version="v[^"]+"\} 1$/m);
    for (const text of [apiText, workerText]) {
      expect(text).toMatch(/^process_resident_memory_bytes \d+/m);
      expect(text).toMatch(/^nodejs_eventloop_lag_p99_seconds [\d.e-]+/m);
    }
  });

  test('API: http metrics by route template (never the raw path), auth failures, webhook outcomes, enqueued jobs', () => {
    expect(sample(apiText, 'opsgate_http_requests_total{method="GET",route="/ops/hosts",status="401"}')).toBe(1);
    expect(sample(apiText, 'opsgate_http_requests_total{method="GET",route="/ops/jobs/:id",status="404"}')).toBe(1);
    expect(apiText).not.toContain('does-not-exist-123');
    expect(sample(apiText, 'opsgate_http_request_duration_seconds_count{method="POST",route="/webhook/alerts",status="202"}')).toBe(1);
    expect(sample(apiText, 'opsgate_auth_failures_total{scheme="api_key",reason="missing"}')).toBe(1);
    expect(
      sample(apiText, 'opsgate_auth_failures_total{scheme="scm_token",reason="mismatch"}') ??
        sample(apiText, 'opsgate_auth_failures_total{scheme="scm_token",reason="invalid"}'),
    ).toBe(1);
    expect(apiText).toMatch(/^opsgate_webhook_events_total\{source="scm",outcome="rejected"\} 1$/m);
    expect(apiText).toMatch(/^opsgate_webhook_events_total\{source="alerts",outcome="accepted"\} 1$/m);
    expect(sample(apiText, 'opsgate_jobs_enqueued_total{name="ops_worker.notify_oncall"}')).toBe(1);
  });

  test('queue depth and dead letters are read from Redis at scrape time (api and worker agree)', () => {
    for (const text of [apiText, workerText]) {
      expect(sample(text, 'opsgate_dead_letter_jobs{queue="ops"}')).toBe(1);
      expect(sample(text, 'opsgate_queue_jobs{queue="ops",state="failed"}')).toBe(1);
      expect(sample(text, 'opsgate_queue_jobs{queue="ops",state="waiting"}')).toBe(0);
      expect(sample(text, 'opsgate_queue_jobs{queue="ops",state="active"}')).toBe(0);
      expect(sample(text, 'opsgate_queue_jobs{queue="ops",state="delayed"}')).toBe(0);
    }
  });

  test('worker: the dead-lettered attempt is counted and timed', () => {
    expect(sample(workerText, 'opsgate_jobs_processed_total{name="ops_worker.notify_oncall",outcome="dead_lettered"}')).toBe(1);
    expect(sample(workerText, 'opsgate_job_duration_seconds_count{name="ops_worker.notify_oncall",outcome="dead_lettered"}')).toBe(1);
  });

  test('retry from Bull Board once the endpoint is fixed: job completes, dead letters back to 0', async () => {
    receiverStatus = 200;
    const failed = await fetch(`${api.baseUrl}/admin/queues/api/queues?activeQueue=ops&status=failed&page=1`, {
      headers: { 'X-API-Key': OPERATOR },
    });
    const body = (await failed.json()) as { queues: { name: string; jobs: { id: string }[] }[] };
    const jobId = body.queues.find((q) => q.name === 'ops')!.jobs[0]!.id;
    const retry = await fetch(`${api.baseUrl}/admin/queues/api/queues/ops/${jobId}/retry`, {
      method: 'PUT',
      headers: { 'X-API-Key': OPERATOR },
    });
    expect(retry.status).toBe(204);
    await worker.waitForLog((l) => l.msg === 'job completed', 30000);
    const w = await scrape(workerMetricsPort);
    expect(sample(w, 'opsgate_jobs_processed_total{name="ops_worker.notify_oncall",outcome="completed"}')).toBe(1);
    const a = await scrape(apiMetricsPort);
    expect(sample(a, 'opsgate_dead_letter_jobs{queue="ops"}')).toBe(0);
    expect(sample(a, 'opsgate_admin_actions_total{method="PUT",status="204"}')).toBe(1);
    // The API writes its audit line when the response ends, and the line reaches this process through a
    // pipe: it may arrive after the answer, so the test waits for it before counting.
    const auditOfRetry = (l: { msg?: unknown; path?: unknown }) =>
      l.msg === 'audit' && l.path === `/admin/queues/api/queues/ops/${jobId}/retry`;
    await api.waitForLog(auditOfRetry, 30000);
    expect(api.logs().filter(auditOfRetry)).toHaveLength(1);
  }, 60000);

  test('a hung Redis does not hang the scrape: depth skipped, error counted, back when Redis is', async () => {
    const admin = new Redis(redisServer.url);
    const pid = Number(/process_id:(\d+)/.exec(await admin.info('server'))![1]);
    admin.disconnect();
    const before = sample(await scrape(apiMetricsPort), 'opsgate_queue_scrape_errors_total{queue="ops"}') ?? 0;
    process.kill(pid, 'SIGSTOP');
    try {
      const t0 = Date.now();
      const pending = scrape(apiMetricsPort);
      // While the scrape waits on Redis, the process keeps serving: the read is async, not blocking.
      const first = await Promise.race([fetch(`${api.baseUrl}/health`).then((r) => `health ${r.status}`), pending.then(() => 'scrape')]);
      expect(first).toBe('health 200');
      const text = await pending;
      expect(Date.now() - t0).toBeLessThan(10000); // bounded by the 1.5 s read timeout, generous margin
      expect(text).not.toMatch(/^opsgate_queue_jobs\{/m);
      expect(text).not.toMatch(/^opsgate_dead_letter_jobs\{/m);
      expect(sample(text, 'opsgate_queue_scrape_errors_total{queue="ops"}')).toBe(before + 1);
      expect(promtool(['check', 'metrics'], text).code).toBe(0);
    } finally {
      process.kill(pid, 'SIGCONT');
    }
    let back: number | undefined;
    for (let i = 0; i < 50 && back === undefined; i++) {
      back = sample(await scrape(apiMetricsPort), 'opsgate_dead_letter_jobs{queue="ops"}');
      if (back === undefined) await new Promise((r) => setTimeout(r, 200));
    }
    expect(back).toBe(0);
  }, 60000);

  test('metrics port serves /metrics only', async () => {
    for (const port of [apiMetricsPort, workerMetricsPort]) {
      const res = await fetch(`http://127.0.0.1:${port}/health`);
      expect(res.status).toBe(404);
      expect(await res.json()).toEqual({ detail: 'not found', code: 'not_found' });
    }
    // and the API's public port does not expose it
    expect((await fetch(`${api.baseUrl}/metrics`)).status).toBe(404);
  });

  describe('Grafana dashboard', () => {
    const dash = JSON.parse(readFileSync(DASHBOARD, 'utf8')) as {
      uid: string;
      templating: { list: { name: string; type: string; query: unknown; definition?: string }[] };
      panels: Panel[];
    };
    const panels = dash.panels.flatMap((p) => [p, ...(p.panels ?? [])]).filter((p) => p.type !== 'row');
    const exprs = panels.flatMap((p) => (p.targets ?? []).map((t) => t.expr));
    const varQueries = dash.templating.list
      .filter((v) => v.type === 'query')
      .map((v) => (typeof v.query === 'string' ? v.query : (v.query as { query: string }).query));

    test('has a Prometheus datasource variable used by every panel and target', () => {
      const ds = dash.templating.list.find((v) => v.type === 'datasource');
      expect(ds).toMatchObject({ name: 'datasource', query: 'prometheus' });
      expect(panels.length).toBeGreaterThan(10);
      for (const p of panels) {
        expect(p.datasource?.uid).toBe('${datasource}');
        for (const t of p.targets ?? []) expect(t.datasource?.uid).toBe('${datasource}');
      }
    });

    test('every query is valid PromQL (parsed by promtool)', () => {
      const rules = {
        groups: [{ name: 'dashboard', rules: exprs.map((e, i) => ({ record: `dashboard:expr_${i}`, expr: grafanaToPromql(e) })) }],
      };
      const file = join(tmp, 'dashboard-exprs.yaml');
      writeFileSync(file, JSON.stringify(rules));
      const r = promtool(['check', 'rules', file]);
      expect(r.out).toContain(`SUCCESS: ${exprs.length} rules found`);
      expect(r.code).toBe(0);
    });

    test('the expression checker itself rejects a misspelt metric', () => {
      const names = exportedNames(apiText + workerText);
      expect(metricNames('sum by (le) (rate(opsgate_http_request_duration_seconds_bucket{job=~"x"}[5m]))')).toEqual([
        'opsgate_http_request_duration_seconds_bucket',
      ]);
      expect(metricNames('histogram_quantile(0.95, sum by (le) (rate(opsgate_http_latency_bucket[5m])))').every((n) => names.has(n))).toBe(
        false,
      );
    });

    test('every metric it names is exported by the running api or worker', () => {
      const names = exportedNames(apiText + workerText);
      const used = new Set<string>();
      for (const e of exprs) for (const n of metricNames(e)) used.add(n);
      for (const q of varQueries) {
        const m = /label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)/.exec(q);
        if (m) used.add(m[1]!);
      }
      const missing = [...used].filter((n) => !names.has(n));
      expect(missing).toEqual([]);
      // it shows what SREs watch
      for (const n of [
        'opsgate_queue_jobs',
        'opsgate_dead_letter_jobs',
        'opsgate_jobs_processed_total',
        'opsgate_job_duration_seconds_bucket',
        'opsgate_webhook_events_total',
        'opsgate_http_request_duration_seconds_bucket',
        'opsgate_auth_failures_total',
        // both remediation budgets, apart from people's
        'opsgate_remediation_budget_used',
        'opsgate_remediation_budget_limit',
        'opsgate_remediation_budget_exhausted_total',
      ]) {
        expect(used).toContain(n);
      }
      for (const q of ['0.5', '0.95', '0.99']) {
        expect(
          exprs.some((e) => e.startsWith(`histogram_quantile(${q}, `) && e.includes('opsgate_http_request_duration_seconds_bucket')),
        ).toBe(true);
      }
    });

    test('every opsgate metric the alert rules use is exported too', () => {
      const names = exportedNames(apiText + workerText);
      const doc = parseYaml(readFileSync(RULES, 'utf8')) as { groups: { rules: { expr: string }[] }[] };
      const used = doc.groups
        .flatMap((g) => g.rules)
        .flatMap((r) => metricNames(r.expr))
        .filter((n) => n !== 'up');
      expect(used.length).toBeGreaterThan(4);
      expect(used.filter((n) => !names.has(n))).toEqual([]);
    });
  });
});
