import { parseInventory } from '../../src/shared/inventory.js';
import type { KubeConfigFactory } from '../../src/shared/kubeconfig.js';
import { startWorker } from '../../worker/index.js';
import { startAlertmanager, startAppFront, type Alertmanager } from './alertmanager.js';
import { createHarness, type Harness } from './apiHarness.js';
import { startRedis } from './redis.js';
import { collectLogs, testMetrics, workerConfig } from './workerSupport.js';

/**
 * Alert-driven remediation on real parts: a real Redis, the API (its app behind a server that
 * listens first, so Alertmanager can be given its URL), a real Alertmanager posting to
 * /webhook/alerts with the token and answering the API and the worker at ALERTMANAGER_URL, and a
 * real worker with the inventory's rules. `close` stops them in reverse, bounded by each part's
 * own stop; a start that fails stops what it had started.
 */
export interface RemediationRig {
  h: Harness;
  am: Alertmanager;
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
    const env = { ALERTMANAGER_URL: am.url, ...opts.env };
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
    return { h, am, close };
  } catch (err) {
    await close();
    throw err;
  }
}
