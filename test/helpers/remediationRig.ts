import { parseInventory } from '../../src/shared/inventory.js';
import type { KubeConfigFactory } from '../../src/shared/kubeconfig.js';
import { startWorker } from '../../worker/index.js';
import { startAlertmanager, startAppFront, type Alertmanager } from './alertmanager.js';
import { startPrometheus, type PrometheusOptions, type TestPrometheus } from './prometheus.js';
import { createHarness, type Harness } from './apiHarness.js';
import { startRedis } from './redis.js';
import { collectLogs, testMetrics, workerConfig } from './workerSupport.js';

/**
 * Alert-driven remediation on real parts: a real Redis, the API (its app behind a server that
 * listens first, so Alertmanager can be given its URL), a real Alertmanager posting to
 * /webhook/alerts with the token and answering the API and the worker at ALERTMANAGER_URL, a real
 * Prometheus (with `prometheus`: its rules' alerts sent to that Alertmanager, answering at
 * PROMETHEUS_URL), and a real worker with the inventory's rules. `close` stops them in reverse, bounded by each part's
 * own stop; a start that fails stops what it had started.
 */
export interface RemediationRig {
  h: Harness;
  am: Alertmanager;
  prom: TestPrometheus | undefined;
  /** The Redis server both processes use. */
  redisUrl: string;
  close(): Promise<void>;
}

export async function startRemediationRig(opts: {
  inventoryYaml: string;
  token: string;
  /** Alertmanager's send_resolved (its default: true). */
  sendResolved?: boolean;
  /** More settings of both the API and the worker (JOB_ATTEMPTS, ...). */
  env?: Record<string, string>;
  /** Settings of the worker alone. */
  workerEnv?: Record<string, string>;
  kubeConfig: KubeConfigFactory;
  /** A real Prometheus whose alerts go to the Alertmanager, at PROMETHEUS_URL of both processes. */
  prometheus?: Omit<PrometheusOptions, 'alertmanager'>;
}): Promise<RemediationRig> {
  const stops: Array<() => Promise<unknown>> = [];
  const close = async () => {
    for (const stop of stops.reverse()) await stop();
  };
  try {
    const redis = await startRedis();
    stops.push(() => redis.destroy());
    const front = await startAppFront();
    stops.push(() => front.close());
    const am = await startAlertmanager({
      webhook: `${front.url}/webhook/alerts`,
      token: opts.token,
      ...(opts.sendResolved === undefined ? {} : { sendResolved: opts.sendResolved }),
    });
    stops.push(() => am.stop());
    const prom = opts.prometheus ? await startPrometheus({ ...opts.prometheus, alertmanager: am.url }) : undefined;
    if (prom) stops.push(() => prom.close());
    const env = { ALERTMANAGER_URL: am.url, ...(prom ? { PROMETHEUS_URL: prom.url } : {}), ...opts.env };
    const h = await createHarness(redis.url, { inventoryYaml: opts.inventoryYaml, env: { ALERTS_WEBHOOK_TOKEN: opts.token, ...env } });
    stops.push(() => h.close());
    front.setApp(h.app);
    const worker = await startWorker(workerConfig({ REDIS_URL: redis.url, ...env, ...opts.workerEnv }), {
      logger: collectLogs().logger,
      metrics: testMetrics(),
      inventory: parseInventory(opts.inventoryYaml),
      kubeConfig: opts.kubeConfig,
    });
    stops.push(() => worker.close(2000));
    return { h, am, prom, redisUrl: redis.url, close };
  } catch (err) {
    await close();
    throw err;
  }
}
