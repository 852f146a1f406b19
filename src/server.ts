import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { pathToFileURL } from 'node:url';
import { createApp } from './app.js';
import { createDeliveryLog } from './domain/deliveries.js';
import { createKubeHostStatusProvider } from './domain/kubeHostStatus.js';
import { apiTlsFiles, loadApiConfig, secretsOf, type ApiConfig } from './api/config.js';
import { metricsTlsFiles } from './shared/config.js';
import { expiredKeyWarnings, weakCredentialWarnings } from './api/apiKeys.js';
import { absentSecretFileWarnings } from './shared/secrets.js';
import { clientCertificateWarnings, createAllowedNames, parseAllowedNamesFile } from './api/clientNames.js';
import { reportConfigError } from './shared/configReport.js';
import { watchCredentials } from './api/credentialReload.js';
import { ConfigError } from './shared/errors.js';
import { findKubeConfig, kubeConfigFromEnv, NoKubeConfigError } from './shared/kubeconfig.js';
import { loadInventory } from './shared/inventory.js';
import { remediationStartProblems } from './shared/remediations.js';
import { confirmSourcesOf, remediationSources } from './remediation/sources.js';
import { createSenderSecrets, watchCredentialFile } from './shared/liveSecrets.js';
import { createLogger, type Logger } from './shared/logger.js';
import { createMetrics, queueCountsSource } from './shared/metrics.js';
import { startMetricsServer } from './shared/metricsServer.js';
import { jsonClientErrors } from './middleware/clientError.js';
import { createRateLimiter } from './middleware/rateLimit.js';
import { createFreezeStore, watchFreezes } from './changes/freezes/store.js';
import { createOpsQueue } from './api/queue.js';
import { createRedis, redisPasswords } from './shared/redis.js';
import { connectRedis, markClosing } from './shared/redisConnection.js';
import { shutdownBudget } from './shared/shutdown.js';
import { settlesWithin, withTimeout } from './shared/timeout.js';
import type { FileReloader } from './shared/fileReload.js';
import { createListener, loadTlsMaterial, type ListenerTls } from './shared/tls.js';
import { packageVersion } from './shared/version.js';

export interface Running {
  server: Server;
  port: number;
  config: ApiConfig;
  logger: Logger;
  /** Graceful stop: in-flight requests get graceMs, every close step is bounded; false when one did not finish. */
  stop(graceMs?: number): Promise<boolean>;
}

export async function start(
  env: Record<string, string | undefined> = process.env,
  opts: { exitOnDeadline?: boolean } = {},
): Promise<Running> {
  const config = loadApiConfig(env);
  const inventory = loadInventory(config.OPS_INVENTORY_FILE);
  // Remediation rules only behind an authenticated alerts sender, and silences only with an Alertmanager to keep them.
  const remediationProblems = remediationStartProblems(inventory.remediations, {
    alertsAuthenticated: (config.senderSecrets.ALERTS_WEBHOOK_TOKEN ?? []).length > 0 || config.TLS_CLIENT_CA_FILE !== undefined,
    alertmanagerUrl: config.ALERTMANAGER_URL,
    confirm: confirmSourcesOf(remediationSources(config)),
  });
  if (remediationProblems.length > 0) throw new ConfigError(remediationProblems);
  // Unreadable or mismatched certificate files stop the start like any bad configuration.
  const listenerTls = (files: ReturnType<typeof apiTlsFiles>): ListenerTls | undefined =>
    files ? { files, material: loadTlsMaterial(files), intervalMs: config.TLS_RELOAD_INTERVAL_MS } : undefined;
  const apiTls = listenerTls(apiTlsFiles(config));
  const metricsTls = listenerTls(metricsTlsFiles(config));
  const version = config.OPSGATE_VERSION ?? packageVersion();
  const logger = createLogger({
    level: config.LOG_LEVEL,
    base: { component: 'api' },
    secrets: [...secretsOf(config), ...redisPasswords(config.REDIS_URL)],
  });
  for (const warning of [
    ...weakCredentialWarnings(config),
    ...expiredKeyWarnings(config),
    ...absentSecretFileWarnings(config),
    ...clientCertificateWarnings(config),
  ])
    logger.warn(warning);
  const metrics = createMetrics('api', version);
  const senderSecrets = createSenderSecrets(config.senderSecrets);
  const credentials = watchCredentials({ config, senderSecrets, logger, metrics });
  const redis = connectRedis({ url: config.REDIS_URL, profile: 'request', name: 'opsgate-api', logger });
  const queue = createOpsQueue({
    url: config.REDIS_URL,
    policy: { attempts: config.JOB_ATTEMPTS, backoffMs: config.JOB_BACKOFF_MS },
    logger,
    metrics,
  });
  metrics.setQueueDepthSources([queueCountsSource(queue.bull)]);
  const freezeWatch = watchFreezes({
    store: createFreezeStore(redis),
    subscriber: createRedis(config.REDIS_URL, 'blocking', 'opsgate-api-freezes'),
    logger,
  });
  try {
    findKubeConfig(env);
  } catch (err) {
    if (!(err instanceof NoKubeConfigError)) throw err;
    logger.warn(`${err.message}; GET /ops/hosts/{host} answers 503 until there is one`);
  }
  const deliveries = createDeliveryLog({ redis, logger, keep: config.DELIVERIES_KEPT, keepUnverified: config.DELIVERIES_UNVERIFIED_KEPT });
  const allowedNames = createAllowedNames(config.clientAllowedNames);
  const app = createApp({
    config,
    redis,
    queue,
    inventory,
    logger,
    metrics,
    hostStatus: createKubeHostStatusProvider(kubeConfigFromEnv(env)),
    version,
    rateLimit: createRateLimiter({ redis, rps: config.RATE_LIMIT_RPS, metrics, logger }),
    senderSecrets,
    freezeWatch,
    deliveries,
    allowedNames,
  });

  const { server, clientConnections } = createListener(app, { tls: apiTls, listener: 'api', logger, metrics });
  // A changed list closes the connections that presented a certificate under the old one (src/shared/tls.ts).
  let namesReloader: FileReloader | undefined;
  if (config.clientAllowedNamesFile) {
    let closed = 0;
    namesReloader = watchCredentialFile({
      file: config.clientAllowedNamesFile,
      intervalMs: config.TLS_RELOAD_INTERVAL_MS,
      logger,
      metrics,
      parse: (text) => parseAllowedNamesFile(text ?? ''),
      apply(list) {
        // A file rewritten with the same entries (a comment, their order) judges no one differently.
        const same = (l: readonly { text: string }[]) => JSON.stringify(l.map((e) => e.text).sort());
        const changed = same(list) !== same(allowedNames.current());
        allowedNames.set(list);
        closed = changed ? (clientConnections?.closeAll() ?? 0) : 0;
      },
      describe: (list) => ({ allowed_names: list.map((e) => e.text), closed_connections: closed }),
    });
    server.once('close', () => namesReloader?.close());
  }
  server.listen(config.PORT);
  // Parser-level refusals (431 oversized headers, 400 bad bytes) answer JSON {detail, code} too.
  jsonClientErrors(server, logger);
  await new Promise<void>((resolve, reject) => {
    server.once('listening', () => resolve());
    server.once('error', reject);
  });
  // Slow-loris and idle keep-alive bounds (behind an Ingress the proxy's own timeouts are shorter).
  server.requestTimeout = 30_000;
  server.headersTimeout = 20_000;
  server.keepAliveTimeout = 5_000;
  const port = (server.address() as AddressInfo).port;
  let metricsServer: Awaited<ReturnType<typeof startMetricsServer>>;
  try {
    metricsServer = await startMetricsServer({ registry: metrics.registry, port: config.METRICS_PORT, logger, tls: metricsTls, metrics });
  } catch (err) {
    credentials.close();
    namesReloader?.close();
    server.close();
    await freezeWatch.close();
    await withTimeout(queue.close(), 2000, 'queue close').catch(() => {});
    markClosing(redis);
    redis.disconnect();
    throw err;
  }
  logger.info('api listening', {
    port,
    version,
    hosts: Object.keys(inventory.hosts).length,
    scheme: apiTls ? 'https' : 'http',
    client_certificates: apiTls?.files.caFile ? 'requested' : 'off',
    client_allowed_names: config.clientAllowedNames.map((e) => e.text),
    // Re-read every SECRETS_RELOAD_INTERVAL_MS.
    credential_files: config.credentialFiles.map((f) => f.variable),
  });

  let stopping: Promise<boolean> | undefined;
  const stop = (graceMs?: number): Promise<boolean> => {
    stopping ??= (async () => {
      const totalMs = config.SHUTDOWN_TIMEOUT_SECONDS * 1000;
      const budget = shutdownBudget(logger, totalMs, () => {
        if (opts.exitOnDeadline) process.exit(1);
      });
      const drainMs = graceMs ?? Math.min(10_000, totalMs / 2);
      logger.info('api stopping: draining in-flight requests', { drain_ms: drainMs, shutdown_timeout_s: config.SHUTDOWN_TIMEOUT_SECONDS });
      credentials.close();
      namesReloader?.close();
      await budget.step(
        'http server',
        async () => {
          const closed = new Promise<void>((resolve) => server.close(() => resolve()));
          server.closeIdleConnections();
          // In-flight requests get drainMs; then their connections are cut.
          if (!(await settlesWithin(closed, drainMs))) server.closeAllConnections();
          await closed;
        },
        drainMs + 1000,
      );
      await budget.step(
        'metrics server',
        async () => {
          const closing = metricsServer.close();
          if (!(await settlesWithin(closing, 1000))) metricsServer.server.closeAllConnections();
          await closing;
        },
        3000,
      );
      // The verdicts of the last requests, still waiting to be written (src/domain/deliveries.ts).
      await budget.step('deliveries log', () => deliveries.flush(), 1000);
      await budget.step('freezes subscriber', () => freezeWatch.close(), 1000);
      // With Redis unreachable BullMQ's close would wait for a connection forever.
      await budget.step('queue', () => queue.close(), 5000);
      // Not connected: nothing to flush (no offline queue on this profile); just drop it.
      markClosing(redis);
      if (redis.status !== 'ready') redis.disconnect();
      else if (!(await budget.step('redis', () => redis.quit(), 2000))) redis.disconnect();
      budget.done();
      if (budget.unfinished.length > 0) {
        logger.error('shutdown incomplete: some close steps timed out', { unfinished: budget.unfinished });
        return false;
      }
      logger.info('api stopped');
      return true;
    })();
    return stopping;
  };
  return { server, port, config, logger, stop };
}

async function main(): Promise<void> {
  let running: Running;
  try {
    running = await start(process.env, { exitOnDeadline: true });
  } catch (err) {
    if (err instanceof ConfigError) {
      reportConfigError('opsgate-api', 'api', err);
    } else {
      const e = err as { code?: string; message?: string };
      process.stderr.write(
        `opsgate-api: failed to start: ${e.code === 'EADDRINUSE' ? 'PORT or METRICS_PORT is already in use' : (e.message ?? String(err)).split('\n')[0]}\n`,
      );
    }
    process.exit(1);
  }
  const onSignal = (signal: string) => {
    running.logger.info('signal received', { signal });
    // The logger writes asynchronously: its last lines ("api stopped") are flushed before exit (bounded).
    running.stop().then(
      (clean) => running.logger.flush().finally(() => process.exit(clean ? 0 : 1)),
      () => running.logger.flush().finally(() => process.exit(1)),
    );
  };
  for (const signal of ['SIGTERM', 'SIGINT']) process.once(signal, () => onSignal(signal));
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  void main();
}
