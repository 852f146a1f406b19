import { fileURLToPath } from 'node:url';
import { Worker } from 'bullmq';
import type { Redis } from 'ioredis';
import { loadWorkerConfig, metricsTlsFiles, type WorkerConfig } from '../src/shared/config.js';
import { reportConfigError } from '../src/shared/configReport.js';
import { ConfigError } from '../src/shared/errors.js';
import { startLoopMonitor } from './eventLoop.js';
import { loadInventory, type Inventory } from '../src/shared/inventory.js';
import { QUEUE_NAME } from '../src/shared/jobs.js';
import { queuePrefix } from '../src/shared/keys.js';
import { createLogger, type Logger } from '../src/shared/logger.js';
import { createMetrics } from '../src/shared/metrics.js';
import { startMetricsServer, type MetricsServer } from '../src/shared/metricsServer.js';
import { exportQueueDepth } from './queueDepth.js';
import { connectRedis } from '../src/shared/redisConnection.js';
import { settlesWithin } from '../src/shared/timeout.js';
import { loadTlsMaterial, type ListenerTls } from '../src/shared/tls.js';
import { packageVersion } from '../src/shared/version.js';
import { kubeConfigFromEnv, type KubeConfigFactory } from '../src/shared/kubeconfig.js';
import { createWorkerDeps } from './deps.js';
import { createRemediationStore, OUTCOMES, SUPPRESSION_GUARDS } from '../src/remediation/store.js';
import { remediationStartProblems } from '../src/shared/remediations.js';
import { confirmSourcesOf, remediationSources } from '../src/remediation/sources.js';
import { workerLiveness } from './liveness.js';
import { observeJobs, type JobMetrics } from './outcomes.js';
import { createProcessor } from './processor.js';
import { secretsForWorker } from './secrets.js';
import { closeWorker, onShutdownSignals } from './shutdown.js';

/** The worker process's wiring (entry point dist/worker/index.js); startWorker() runs it in-process for tests. */
export const READY_MESSAGE = 'worker ready';

export interface WorkerOptions {
  logger?: Logger;
  metrics?: JobMetrics;
  inventory?: Inventory;
  /** Default: KUBECONFIG / ~/.kube/config / in-cluster, read from process.env at each job. */
  kubeConfig?: KubeConfigFactory;
  /** Worker id shown in Redis CLIENT LIST and logs. */
  name?: string;
  now?: () => number;
}

export interface WorkerHandle {
  readonly worker: Worker;
  readonly redis: Redis;
  readonly logger: Logger;
  /** closeWorker (worker/shutdown.ts), by default within WORKER_SHUTDOWN_GRACE_SECONDS and SHUTDOWN_TIMEOUT_SECONDS. Idempotent. */
  close(graceMs?: number, stepMs?: number): Promise<boolean>;
}

export async function startWorker(config: WorkerConfig, opts: WorkerOptions = {}): Promise<WorkerHandle> {
  const logger = opts.logger ?? createLogger({ level: config.LOG_LEVEL, base: { component: 'worker' }, secrets: secretsForWorker(config) });
  const inventory = opts.inventory ?? loadInventory(config.OPS_INVENTORY_FILE);
  const kubeConfig = opts.kubeConfig ?? kubeConfigFromEnv(process.env);
  const { metrics, now = Date.now } = opts;
  const redis = connectRedis({ url: config.REDIS_URL, profile: 'blocking', name: opts.name ?? 'opsgate-worker', logger });
  const { close: closeReports, ...deps } = createWorkerDeps({ config, inventory, redis, logger, kubeConfig, now, metrics });
  const worker = new Worker(QUEUE_NAME, createProcessor(deps), {
    connection: redis,
    prefix: queuePrefix(config.REDIS_URL),
    concurrency: config.WORKER_CONCURRENCY,
    lockDuration: config.WORKER_LOCK_DURATION_MS,
    stalledInterval: config.WORKER_STALLED_INTERVAL_MS,
    maxStalledCount: config.WORKER_MAX_STALLED_COUNT,
    autorun: false,
    ...(opts.name ? { name: opts.name } : {}),
  });
  observeJobs(worker, { logger, metrics });

  // Connect first (waits, retrying, while Redis is unreachable), then start taking jobs.
  await worker.waitUntilReady();
  void worker.run().catch((err: unknown) => logger.error('worker stopped', { err }));
  logger.info(READY_MESSAGE, {
    queue: QUEUE_NAME,
    concurrency: config.WORKER_CONCURRENCY,
    job_timeout_s: config.JOB_TIMEOUT_SECONDS,
    notify_endpoints: config.NOTIFY_WEBHOOK_URLS.length,
    inventory_hosts: Object.keys(inventory.hosts).length,
    inventory_projects: Object.keys(inventory.projects).length,
  });

  let closing: Promise<boolean> | undefined;
  const close = (
    graceMs = config.WORKER_SHUTDOWN_GRACE_SECONDS * 1000,
    stepMs = config.SHUTDOWN_TIMEOUT_SECONDS * 1000,
  ): Promise<boolean> => (closing ??= closeWorker(worker, redis, logger, graceMs, stepMs, closeReports));

  return { worker, redis, logger, close };
}

export async function main(env: NodeJS.ProcessEnv = process.env): Promise<void> {
  let config: WorkerConfig;
  let inventory: Inventory;
  let metricsTls: ListenerTls | undefined;
  try {
    config = loadWorkerConfig(env);
    inventory = loadInventory(config.OPS_INVENTORY_FILE);
    const problems = remediationStartProblems(inventory.remediations, {
      alertmanagerUrl: config.ALERTMANAGER_URL,
      confirm: confirmSourcesOf(remediationSources(config)),
    });
    if (problems.length > 0) throw new ConfigError(problems);
    const files = metricsTlsFiles(config);
    if (files) metricsTls = { files, material: loadTlsMaterial(files), intervalMs: config.TLS_RELOAD_INTERVAL_MS };
  } catch (err) {
    if (err instanceof ConfigError) {
      reportConfigError('opsgate-worker', 'worker', err);
      process.exit(1);
    }
    throw err;
  }
  const version = config.OPSGATE_VERSION ?? packageVersion();
  const logger = createLogger({ level: config.LOG_LEVEL, base: { component: 'worker', version }, secrets: secretsForWorker(config) });
  const metrics = createMetrics('worker', version);

  // /metrics first: it answers (and shows opsgate_worker_errors_total growing) even while Redis
  // is still unreachable at start-up and the worker waits for it.
  let metricsServer: MetricsServer | undefined;
  let handle: WorkerHandle | undefined;
  let queueDepth: { close(): Promise<void> } | undefined;
  const livez = workerLiveness({ monitor: startLoopMonitor(), maxLagMs: config.WORKER_LIVENESS_MAX_LAG_MS, redis: () => handle?.redis });
  try {
    metricsServer = await startMetricsServer({
      registry: metrics.registry,
      port: config.METRICS_PORT,
      logger,
      livez,
      tls: metricsTls,
      metrics,
    });
  } catch (err) {
    logger.error('metrics server failed to start', { err, port: config.METRICS_PORT });
    await logger.flush();
    process.exit(1);
  }
  onShutdownSignals({
    logger,
    graceMs: config.WORKER_SHUTDOWN_GRACE_SECONDS * 1000,
    stepMs: config.SHUTDOWN_TIMEOUT_SECONDS * 1000,
    handle: () => handle,
    steps: [
      {
        name: 'metrics server',
        run: async () => {
          const closing = metricsServer?.close();
          // A scrape still running (Redis frozen) must not hold the listener open.
          if (closing !== undefined && !(await settlesWithin(closing, 1000))) metricsServer?.server.closeAllConnections();
          await closing;
        },
      },
      { name: 'queue depth reader', run: async () => queueDepth?.close() },
    ],
  });

  handle = await startWorker(config, { logger, metrics, inventory });
  // Every remediation series at 0 from the start; the silences kept are counted in Redis.
  const remediationStore = createRemediationStore(handle.redis);
  metrics.setRemediationRules(
    inventory.remediations.map((r) => r.name),
    { outcomes: OUTCOMES, guards: SUPPRESSION_GUARDS },
    () => remediationStore.silences(),
  );
  queueDepth = exportQueueDepth(metrics, config.REDIS_URL);
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) {
  main().catch((err: unknown) => {
    process.stderr.write(`opsgate-worker: failed to start: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  });
}
