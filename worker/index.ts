import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Worker, type Job } from 'bullmq';
import type { Redis } from 'ioredis';
import { loadWorkerConfig, type WorkerConfig } from '../src/shared/config.js';
import { ConfigError } from '../src/shared/errors.js';
import { loadInventory, type Inventory } from '../src/shared/inventory.js';
import { QUEUE_NAME, metricJobName } from '../src/shared/jobs.js';
import { createLogger, type Logger } from '../src/shared/logger.js';
import { createMetrics, type Metrics } from '../src/shared/metrics.js';
import { startMetricsServer, type MetricsServer } from '../src/shared/metricsServer.js';
import { exportQueueDepth } from '../src/shared/queueDepth.js';
import { queuePrefix } from '../src/shared/keys.js';
import { createRedis, redisPasswords } from '../src/shared/redis.js';
import { startLoopMonitor, type LoopMonitor } from '../src/shared/eventLoop.js';
import { shutdownBudget, within } from '../src/shared/shutdown.js';
import { kubeConfigFromEnv, type KubeConfigFactory } from './k8s.js';
import { createProcessor } from './processor.js';

/**
 * The worker process: a BullMQ Worker on queue "ops" running restart_service,
 * run_deploy_pipeline and notify_oncall. Entry point dist/worker/index.js; startWorker() runs the
 * same thing in-process for tests.
 */
export const READY_MESSAGE = 'worker ready';

export interface WorkerDeps {
  logger?: Logger;
  metrics?: Pick<Metrics, 'jobsProcessed' | 'jobDuration' | 'jobRetries'> & Partial<Pick<Metrics, 'jobsStalled' | 'workerErrors'>>;
  /** Default: loadInventory(config.OPS_INVENTORY_FILE). */
  inventory?: Inventory;
  /** Default: KUBECONFIG / ~/.kube/config / in-cluster, read from process.env at each job. */
  kubeConfig?: KubeConfigFactory;
  /** Worker id shown in Redis CLIENT LIST and logs. */
  name?: string;
}

export interface WorkerHandle {
  readonly worker: Worker;
  readonly redis: Redis;
  readonly logger: Logger;
  /**
   * Graceful stop: no new jobs; active jobs may finish within `graceMs` (default
   * WORKER_SHUTDOWN_GRACE_SECONDS); past it they are aborted (their attempt fails and is retried
   * later). Then Redis is quit. Every step is bounded (stepMs, default SHUTDOWN_TIMEOUT_SECONDS);
   * resolves false when one did not finish in time. Idempotent.
   */
  close(graceMs?: number, stepMs?: number): Promise<boolean>;
}

export function secretsForWorker(config: WorkerConfig): string[] {
  const out: string[] = [];
  out.push(...redisPasswords(config.REDIS_URL));
  for (const raw of config.NOTIFY_WEBHOOK_URLS) {
    out.push(raw);
    try {
      const u = new URL(raw);
      if (u.password) out.push(decodeURIComponent(u.password), u.password);
      if (u.username) out.push(decodeURIComponent(u.username), u.username);
      const rest = u.pathname + u.search;
      if (rest.length >= 8) out.push(rest);
      // Token-looking parts on their own (long, or with digits): not words like "services" or "hooks".
      const tokenish = (v: string) => v.length >= 12 || (v.length >= 8 && /\d/.test(v));
      for (const seg of u.pathname.split('/')) if (tokenish(seg)) out.push(seg);
      for (const v of u.searchParams.values()) if (tokenish(v)) out.push(v);
    } catch {
      /* validated by the config schema */
    }
  }
  return [...new Set(out)];
}

/** Waits (at most ms) for BullMQ's blocking connection to leave the "reconnecting" state. */
async function settleBlockingConnection(worker: Worker, ms: number): Promise<void> {
  // BullMQ internals (6.x: worker.backend.blockingConnection.client); absent -> nothing to do.
  const holder = worker as unknown as { backend?: { blockingConnection?: { client?: Promise<Redis> } } };
  const clientP = holder.backend?.blockingConnection?.client;
  if (!clientP) return;
  let client: Redis | undefined;
  await within(clientP.then((c) => (client = c)), ms);
  if (!client || client.status !== 'reconnecting') return;
  const c = client;
  await within(new Promise<void>((resolve) => {
    c.once('ready', () => resolve());
    c.once('end', () => resolve());
  }), ms);
}

export async function startWorker(config: WorkerConfig, deps: WorkerDeps = {}): Promise<WorkerHandle> {
  const logger = deps.logger ?? createLogger({ level: config.LOG_LEVEL, base: { component: 'worker' }, secrets: secretsForWorker(config) });
  const metrics = deps.metrics;
  const inventory = deps.inventory ?? loadInventory(config.OPS_INVENTORY_FILE);
  const kubeConfig = deps.kubeConfig ?? kubeConfigFromEnv(process.env);

  const redis = createRedis(config.REDIS_URL, 'blocking', deps.name ?? 'opsgate-worker');
  let redisDown = false;
  redis.on('error', (err) => {
    if (!redisDown) logger.warn('redis connection error', { err });
    redisDown = true;
  });
  redis.on('ready', () => {
    if (redisDown) logger.info('redis connection restored');
    redisDown = false;
  });

  const processor = createProcessor({ config, inventory, redis, kubeConfig, logger });
  const worker = new Worker(QUEUE_NAME, processor, {
    connection: redis,
    prefix: queuePrefix(config.REDIS_URL),
    concurrency: config.WORKER_CONCURRENCY,
    lockDuration: config.WORKER_LOCK_DURATION_MS,
    stalledInterval: config.WORKER_STALLED_INTERVAL_MS,
    maxStalledCount: config.WORKER_MAX_STALLED_COUNT,
    autorun: false,
    ...(deps.name ? { name: deps.name } : {}),
  });

  const attemptSeconds = (job: Job) => (job.processedOn ? Math.max(0, Date.now() - job.processedOn) / 1000 : 0);

  worker.on('completed', (job) => {
    const seconds = attemptSeconds(job);
    metrics?.jobsProcessed.inc({ name: metricJobName(job.name), outcome: 'completed' });
    metrics?.jobDuration.observe({ name: metricJobName(job.name), outcome: 'completed' }, seconds);
    logger.info('job completed', { job_id: job.id, job_name: job.name, attempt: job.attemptsMade, duration_s: seconds });
  });
  worker.on('failed', (job, err) => {
    if (!job) {
      logger.error('job failed', { err });
      return;
    }
    const seconds = attemptSeconds(job);
    // BullMQ sets finishedOn only when the job went to the failed set for good (attempts
    // exhausted or UnrecoverableError): that is dead-lettering. Otherwise it is delayed for a retry.
    const final = typeof job.finishedOn === 'number' && job.finishedOn > 0;
    const fields = {
      job_id: job.id,
      job_name: job.name,
      attempt: job.attemptsMade,
      attempts_max: job.opts.attempts ?? 1,
      reason: err.message,
      error_type: err.name,
      duration_s: seconds,
    };
    if (final) {
      metrics?.jobsProcessed.inc({ name: metricJobName(job.name), outcome: 'dead_lettered' });
      metrics?.jobDuration.observe({ name: metricJobName(job.name), outcome: 'dead_lettered' }, seconds);
      logger.error('job dead-lettered', fields);
    } else {
      metrics?.jobsProcessed.inc({ name: metricJobName(job.name), outcome: 'retried' });
      metrics?.jobRetries.inc({ name: metricJobName(job.name) });
      metrics?.jobDuration.observe({ name: metricJobName(job.name), outcome: 'retried' }, seconds);
      logger.warn('job attempt failed; will retry', { ...fields, retry_in_ms: job.delay || 0 });
    }
  });
  worker.on('stalled', (jobId) => {
    metrics?.jobsStalled?.inc();
    logger.warn('job stalled (its worker stopped renewing the lock); moved back to waiting', { job_id: jobId });
  });
  let lastError = '';
  worker.on('error', (err) => {
    metrics?.workerErrors?.inc();
    // Connection errors repeat while Redis is down: log each distinct message once in a row.
    if (err.message !== lastError) logger.error('worker error', { err });
    lastError = err.message;
  });

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
  const close = (graceMs = config.WORKER_SHUTDOWN_GRACE_SECONDS * 1000, stepMs = config.SHUTDOWN_TIMEOUT_SECONDS * 1000): Promise<boolean> => {
    closing ??= (async () => {
      let clean = true;
      // BullMQ's close interrupts its blocking BZPOPMIN by disconnecting that connection and then
      // waits for its 'end' event. ioredis never emits 'end' for a connection disconnected while
      // it waits to reconnect (status "reconnecting", e.g. just after a Redis restart): close()
      // would wait forever (the "did not exit within 60000 ms" of secrets-in-logs). So a
      // reconnecting blocking connection gets a bounded chance to come back first.
      await settleBlockingConnection(worker, Math.min(5000, stepMs / 2));
      const closed = worker.close();
      if (!(await within(closed, graceMs))) {
        logger.warn('shutdown grace period over; aborting active jobs (they will be retried)', { grace_ms: graceMs });
        worker.cancelAllJobs('worker shutting down');
        if (!(await within(closed, Math.min(5000, stepMs / 2)))) {
          // worker.close(true) would return the same pending promise: nothing more to wait for.
          logger.error('shutdown step timed out: the queue worker did not close (active jobs are recovered as stalled)', { step: 'worker' });
          clean = false;
        }
      }
      if (!(await within(redis.quit(), Math.min(2000, stepMs / 4)))) {
        redis.disconnect();
        logger.error('shutdown step timed out: redis quit; disconnected', { step: 'redis' });
        clean = false;
      }
      return clean;
    })();
    return closing;
  };

  return { worker, redis, logger, close };
}

/**
 * GET /livez on the worker's metrics port (its liveness probe). 503 when the event loop lagged
 * more than maxLagMs within the last 10 s (a blocked or starved loop cannot run jobs or renew
 * their locks); 200 otherwise. The body also reports the Redis connection: "ready" (PING answered
 * within timeoutMs), "connecting" (not started yet), or the client's state / "unresponsive".
 * Redis trouble alone does not fail liveness: restarting the worker would not bring Redis back.
 */
export function workerLiveness(deps: { monitor: LoopMonitor; maxLagMs: number; redis: () => Redis | undefined; timeoutMs?: number }) {
  return async (): Promise<{ status: number; body: Record<string, unknown> }> => {
    const lag = deps.monitor.maxLagMs();
    const client = deps.redis();
    let redisState: string;
    if (!client) redisState = 'connecting';
    else if (client.status !== 'ready') redisState = client.status;
    else redisState = (await within(client.ping(), deps.timeoutMs ?? 1000)) ? 'ready' : 'unresponsive';
    const loopOk = lag <= deps.maxLagMs;
    return {
      status: loopOk ? 200 : 503,
      body: {
        status: loopOk ? 'ok' : 'event loop blocked',
        event_loop_lag_ms: lag,
        event_loop_max_lag_ms: deps.maxLagMs,
        redis: redisState,
        ...(loopOk ? {} : { detail: `event loop lagged ${lag} ms (limit ${deps.maxLagMs} ms) within the last 10 s` }),
      },
    };
  };
}

function packageVersion(): string {
  try {
    const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version?: string };
    return pkg.version ?? '0.0.0';
  } catch {
    return '0.0.0';
  }
}

export async function main(env: NodeJS.ProcessEnv = process.env): Promise<void> {
  let config: WorkerConfig;
  try {
    config = loadWorkerConfig(env);
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`opsgate-worker: invalid configuration: ${err.message}\n`);
      process.exit(1);
    }
    throw err;
  }
  const version = config.OPSGATE_VERSION ?? packageVersion();
  const logger = createLogger({ level: config.LOG_LEVEL, base: { component: 'worker', version }, secrets: secretsForWorker(config) });
  let inventory: Inventory;
  try {
    inventory = loadInventory(config.OPS_INVENTORY_FILE);
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`opsgate-worker: invalid configuration: ${err.message}\n`);
      process.exit(1);
    }
    throw err;
  }
  const metrics = createMetrics('worker', version);

  // /metrics first: it answers (and shows opsgate_worker_errors_total growing) even while Redis
  // is still unreachable at start-up and the worker waits for it.
  let metricsServer: MetricsServer | undefined;
  let handle: WorkerHandle | undefined;
  const loopMonitor = startLoopMonitor();
  const livez = workerLiveness({ monitor: loopMonitor, maxLagMs: config.WORKER_LIVENESS_MAX_LAG_MS, redis: () => handle?.redis });
  try {
    metricsServer = await startMetricsServer({ registry: metrics.registry, port: config.METRICS_PORT, logger, livez });
  } catch (err) {
    logger.error('metrics server failed to start', { err, port: config.METRICS_PORT });
    await logger.flush();
    process.exit(1);
  }
  let queueDepth: { close(): Promise<void> } | undefined;
  let stopping = false;
  const shutdown = (signal: NodeJS.Signals) => {
    if (stopping) {
      logger.warn('second signal during shutdown; exiting now', { signal });
      process.exit(1);
    }
    stopping = true;
    if (!handle) {
      // Still connecting to Redis: no job can be active yet.
      logger.info('worker stopped before it was ready', { signal });
      void logger.flush().finally(() => process.exit(0));
      return;
    }
    const stepMs = config.SHUTDOWN_TIMEOUT_SECONDS * 1000;
    const graceMs = config.WORKER_SHUTDOWN_GRACE_SECONDS * 1000;
    // Hard bound of the whole shutdown: the job drain plus the close steps.
    const budget = shutdownBudget(logger, graceMs + stepMs, () => process.exit(1));
    logger.info('shutting down: waiting for active jobs', { signal, grace_s: config.WORKER_SHUTDOWN_GRACE_SECONDS, shutdown_timeout_s: config.SHUTDOWN_TIMEOUT_SECONDS });
    const h = handle;
    void (async () => {
      // Metrics stay up while active jobs drain.
      const workerClean = await h.close(graceMs, stepMs);
      await budget.step('metrics server', async () => {
        const closing = metricsServer?.close();
        // A scrape still running (Redis frozen) must not hold the listener open.
        if (closing && !(await within(closing, 1000))) metricsServer?.server.closeAllConnections();
        await closing;
      }, 3000);
      await budget.step('queue depth reader', async () => queueDepth?.close(), 3000);
      budget.done();
      if (workerClean && budget.unfinished.length === 0) {
        logger.info('worker stopped', { signal });
        // The logger writes asynchronously: flush its last lines before exit (bounded).
        await logger.flush();
        process.exit(0);
      }
      logger.error('shutdown incomplete: some close steps timed out; exiting 1', { signal, unfinished: [...(workerClean ? [] : ['worker']), ...budget.unfinished] });
      await logger.flush();
      process.exit(1);
    })();
  };
  process.on('SIGTERM', shutdown);
  process.on('SIGINT', shutdown);

  handle = await startWorker(config, { logger, metrics, inventory });
  // Queue depth / dead letters read from Redis at scrape time (observability; src/shared/queueDepth.ts).
  queueDepth = exportQueueDepth(metrics, config.REDIS_URL);
}

const isEntry = process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1];
if (isEntry) {
  main().catch((err: unknown) => {
    process.stderr.write(`opsgate-worker: failed to start: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  });
}
