import { afterAll, beforeAll, describe, expect, test } from '@jest/globals';
import { createMetrics } from '../../../src/shared/metrics.js';
import { startMetricsServer, type MetricsServer } from '../../../src/shared/metricsServer.js';

describe('metrics server', () => {
  const metrics = createMetrics('api', '9.9.9-test');
  let srv: MetricsServer;
  let base: string;

  beforeAll(async () => {
    srv = await startMetricsServer({ registry: metrics.registry, port: 0, host: '127.0.0.1' });
    base = `http://127.0.0.1:${srv.port}`;
  });
  afterAll(async () => {
    await srv.close();
  });

  test('GET /metrics serves the registry in the Prometheus text format', async () => {
    metrics.httpRequests.inc({ method: 'GET', route: '/ops/hosts', status: '200' });
    const res = await fetch(`${base}/metrics`);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
    const text = await res.text();
    expect(text).toContain('# TYPE opsgate_build_info gauge');
    expect(text).toMatch(/opsgate_build_info\{version="9\.9\.9-test",component="api",node_version="v\d+[^"]*"\} 1/);
    expect(text).toContain('opsgate_http_requests_total{method="GET",route="/ops/hosts",status="200"} 1');
    // default process metrics are on
    expect(text).toContain('# TYPE process_cpu_user_seconds_total counter');
    expect(text).toContain('# TYPE nodejs_eventloop_lag_seconds gauge');
  });

  test('query strings do not matter; HEAD has headers and no body', async () => {
    expect((await fetch(`${base}/metrics?x=1`)).status).toBe(200);
    const head = await fetch(`${base}/metrics`, { method: 'HEAD' });
    expect(head.status).toBe(200);
    expect(await head.text()).toBe('');
  });

  test.each(['/', '/health', '/metrics/', '/metricsx', '/admin/queues'])('%s -> 404 JSON {detail, code}', async (path) => {
    const res = await fetch(`${base}${path}`);
    expect(res.status).toBe(404);
    expect(res.headers.get('content-type')).toMatch(/application\/json/);
    expect(await res.json()).toEqual({ detail: 'not found', code: 'not_found' });
  });

  test('POST /metrics -> 405 with Allow', async () => {
    const res = await fetch(`${base}/metrics`, { method: 'POST', body: 'x' });
    expect(res.status).toBe(405);
    expect(res.headers.get('allow')).toBe('GET, HEAD');
    expect(((await res.json()) as { detail: string }).detail).toMatch(/method not allowed/);
  });

  test('queue read errors start at 0 for every queue that exports depth (rate() sees "no errors", not "no data")', async () => {
    const m = createMetrics('api', '0.0.0-test', { defaults: false });
    expect(await m.registry.metrics()).not.toMatch(/^opsgate_queue_scrape_errors_total\{/m);
    m.setQueueDepthSources([{ queue: 'ops', counts: async () => ({ waiting: 0 }) }]);
    expect(await m.registry.metrics()).toContain('opsgate_queue_scrape_errors_total{queue="ops"} 0');
  });

  test('queue depth: no source -> no samples; a source that never answers is bounded and counted', async () => {
    let text = await (await fetch(`${base}/metrics`)).text();
    expect(text).toContain('# TYPE opsgate_queue_jobs gauge');
    expect(text).not.toMatch(/^opsgate_queue_jobs\{/m);

    // A read that never completes (as a hung Redis would): the scrape still answers within the timeout.
    metrics.setQueueDepthSources([{ queue: 'ops', counts: () => new Promise(() => {}) }], { timeoutMs: 200 });
    const t0 = Date.now();
    text = await (await fetch(`${base}/metrics`)).text();
    expect(Date.now() - t0).toBeLessThan(5000);
    expect(text).not.toMatch(/^opsgate_queue_jobs\{/m);
    expect(text).not.toMatch(/^opsgate_dead_letter_jobs\{/m);
    // one read per scrape shared by both gauges -> exactly one error
    expect(text).toContain('opsgate_queue_scrape_errors_total{queue="ops"} 1');

    metrics.setQueueDepthSources([
      { queue: 'ops', counts: async () => ({ waiting: 3, active: 1, delayed: 2, prioritized: 0, paused: 0, failed: 4 }) },
    ]);
    text = await (await fetch(`${base}/metrics`)).text();
    expect(text).toContain('opsgate_queue_jobs{queue="ops",state="waiting"} 3');
    expect(text).toContain('opsgate_queue_jobs{queue="ops",state="delayed"} 2');
    expect(text).toContain('opsgate_queue_jobs{queue="ops",state="failed"} 4');
    expect(text).toContain('opsgate_dead_letter_jobs{queue="ops"} 4');
    expect(text).toContain('opsgate_queue_scrape_errors_total{queue="ops"} 1');
  });

  test('the port is refused when already taken (start-up error surfaces)', async () => {
    await expect(startMetricsServer({ registry: metrics.registry, port: srv.port, host: '127.0.0.1' })).rejects.toThrow(/EADDRINUSE/);
  });
});
