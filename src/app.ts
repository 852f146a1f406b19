import express, { type Express, type RequestHandler } from 'express';
import type { Redis } from 'ioredis';
import type { HostStatusProvider } from './domain/hostStatus.js';
import { createDeliveryLog, type DeliveryLog } from './domain/deliveries.js';
import { changeRetry } from './changes/retry.js';
import { createPipeline, type Pipeline } from './changes/deps.js';
import type { Confirms } from './changes/hand.js';
import { requireApiKey, type ApiKeyPolicy } from './middleware/auth.js';
import { createIntake } from './domain/intake.js';
import { changeReplicationGate, replicationGate, retryReplicationGate } from './domain/replication.js';
import { requireClientCertificate } from './middleware/clientCert.js';
import { requestId } from './middleware/context.js';
import { errorHandler, notFound } from './middleware/errors.js';
import { observe } from './middleware/observe.js';
import { ADMIN_BASE_PATH, createAdminRouter } from './routes/admin.js';
import { approvalsRouter } from './routes/approvals.js';
import { freezesRouter } from './routes/freezes.js';
import { deliveriesRouter } from './routes/deliveries.js';
import { healthRouter } from './routes/health.js';
import { jobsRouter } from './routes/jobs.js';
import { keysRouter } from './routes/keys.js';
import { openapiRouter } from './openapi/router.js';
import { opsRouter } from './routes/ops.js';
import { remediationSources } from './remediation/sources.js';
import { createRemediation } from './remediation/engine.js';
import { remediationsRouter } from './routes/remediation.js';
import { remediationBudgetUses } from './remediation/budgets.js';
import { createRemediationStore, OUTCOMES, SUPPRESSION_GUARDS } from './remediation/store.js';
import { deploysRouter } from './routes/deploys.js';
import { createOidcVerifier } from './middleware/oidc.js';
import { webhookFailures, webhooksRouter } from './routes/webhooks.js';
import { createKeyUsage } from './api/apiKeyLifetime.js';
import { createAllowedNames, type AllowedNames } from './api/clientNames.js';
import type { ApiConfig } from './api/config.js';
import type { FreezeWatch } from './changes/freezes/store.js';
import type { Inventory } from './shared/inventory.js';
import type { SenderSecrets } from './shared/liveSecrets.js';
import type { Logger } from './shared/logger.js';
import type { Metrics } from './shared/metrics.js';
import type { OpsQueue } from './api/queue.js';

/** What the routes of a kind of change registered beyond restart and deploy are given (AppDeps.changeRoutes). */
export interface ChangeWays {
  pipeline: Pipeline;
  /** Its REDIS_MIN_REPLICAS_ACK, for handChange (src/changes/hand.ts). */
  confirms: Confirms;
  apiKeyPolicy: ApiKeyPolicy;
  operatorKey: RequestHandler;
}

/** The API's dependencies; nothing listens here (src/server.ts does). */
export interface AppDeps {
  /** The routes of kinds of change registered by their modules (src/changes/kinds/ registerKind), before the 404. */
  changeRoutes?: (ways: ChangeWays) => RequestHandler;
  config: ApiConfig;
  /** Redis connection with the 'request' profile (dedup keys, cache, readiness). */
  redis: Redis;
  queue: OpsQueue;
  inventory: Inventory;
  logger: Logger;
  metrics: Metrics;
  hostStatus: HostStatusProvider;
  version?: string;
  /** The freezes kept in memory, told of changes through pub/sub. Absent: read from Redis per change. */
  freezeWatch?: FreezeWatch;
  /** Per-client rate limit, applied before every route when given. */
  rateLimit?: RequestHandler;
  /** The clock API-key expiry and every guard of a change are judged by; default Date.now. */
  now?: () => number;
  /** The senders' secrets in use, reloaded from their files; default: config.senderSecrets, fixed. */
  senderSecrets?: SenderSecrets;
  /** Given by whoever stops the process, so it can send the last verdicts before Redis closes; default: one made here. */
  deliveries?: DeliveryLog;
  /** The client certificates allowed on /webhook/alerts, replaced when their file changes; default: config.clientAllowedNames. */
  allowedNames?: AllowedNames;
}

const trustProxy = (v: string): boolean | number | string =>
  v === 'true' ? true : v === 'false' ? false : /^\d+$/.test(v) ? Number(v) : v;

export function createApp(deps: AppDeps): Express {
  const { config, redis, queue, inventory, logger, metrics } = deps;
  const app = express();
  app.disable('x-powered-by');
  app.set('trust proxy', trustProxy(config.TRUST_PROXY));
  app.set('json spaces', 0);
  // No ETag: every answer is Cache-Control: no-store (src/middleware/context.ts), so a validator is
  // never used, and Express would compute a SHA-1 of every response body for it (about 9 us per
  // webhook answer under `make bench-profile`).
  app.set('etag', false);
  app.use(requestId());
  app.use(observe({ metrics, logger }));
  if (deps.rateLimit) app.use(deps.rateLimit);

  // REDIS_MIN_REPLICAS_ACK: one check before each success answer of a route that writes (no-op at 0).
  const minReplicas = config.REDIS_MIN_REPLICAS_ACK;
  const replication = { redis, queue: queue.producer, logger, minReplicas, timeoutMs: config.REDIS_ACK_TIMEOUT_MS };
  const replicated = replicationGate(replication);
  const changed = changeReplicationGate(replication);
  // API keys: expiry judged by one clock, last use shared through Redis and exported by metrics.
  const keyUsage = createKeyUsage({ redis });
  const now = deps.now ?? Date.now;
  const apiKeyPolicy = { warningDays: config.API_KEY_EXPIRY_WARNING_DAYS, now, usage: keyUsage };
  metrics.setApiKeys(config.apiKeys, (ids) => keyUsage.lastUsed(ids));

  // The webhooks first: they carry the volume, and each router passed costs a match against all its routes.
  const intake = createIntake({ producer: queue.producer, jobs: queue.jobs, redis, logger, ...(deps.now ? { now: deps.now } : {}) });
  // The change pipeline: one set of stores and one clock for every way in of a change.
  const pipeline = createPipeline({
    inventory,
    redis,
    producer: queue.producer,
    intake,
    probe: queue.probe,
    logger,
    metrics,
    now,
    dryRunTimeoutMs: config.DRY_RUN_TIMEOUT_MS,
    deployHistoryKept: config.DEPLOY_HISTORY_KEPT,
    ...(deps.freezeWatch ? { freezeWatch: deps.freezeWatch } : {}),
  });
  const deliveries =
    deps.deliveries ??
    createDeliveryLog({ redis, logger, keep: config.DELIVERIES_KEPT, keepUnverified: config.DELIVERIES_UNVERIFIED_KEPT });
  const allowedNames = deps.allowedNames ?? createAllowedNames(config.clientAllowedNames ?? []);
  // Alert-driven remediation: the inventory's rules, given every alerts notification after its intake.
  const rules = inventory.remediations ?? [];
  const remediationStore = createRemediationStore(redis);
  metrics.setRemediationRules(
    rules.map((r) => r.name),
    { outcomes: OUTCOMES, guards: SUPPRESSION_GUARDS },
    () => remediationStore.silences(),
    () => remediationBudgetUses(inventory, pipeline.budgets, Date.now()),
  );
  const remediation =
    rules.length === 0
      ? {}
      : {
          remediation: createRemediation({
            pipeline,
            rules,
            store: remediationStore,
            ...remediationSources(config, logger),
            jobs: queue.jobs,
            logger: logger.child({ component: 'remediation' }),
            metrics,
            now,
          }),
        };
  const alertsCertificate = config.TLS_CLIENT_CA_FILE
    ? { alertsClientCertificate: requireClientCertificate(metrics, () => allowedNames.current()) }
    : {};
  app.use(webhooksRouter({ ...deps, intake, deliveries, replicated, changed, pipeline, ...remediation, ...alertsCertificate }));
  app.use(healthRouter({ redis, queue, version: deps.version ?? '0.0.0' }));
  // OIDC ID tokens (OPS_OIDC_FILE) as bearer credentials on POST /ops/restart and POST /ops/deploys.
  const oidc = config.oidc?.configured ? { oidc: createOidcVerifier({ settings: config.oidc, metrics, logger }) } : {};
  app.use(opsRouter({ ...deps, replicated, changed, apiKeyPolicy, pipeline, ...oidc }));
  app.use(deploysRouter({ ...deps, replicated, changed, apiKeyPolicy, pipeline, ...oidc }));
  app.use(approvalsRouter({ ...deps, pipeline, approvals: pipeline.approvals, now: pipeline.now, apiKeyPolicy, changed }));
  app.use(freezesRouter({ ...deps, pipeline, jobs: queue.jobs, apiKeyPolicy, changed }));
  app.use(keysRouter({ ...deps, usage: keyUsage, apiKeyPolicy }));
  const budgetUses = () => remediationBudgetUses(inventory, pipeline.budgets, now());
  app.use(remediationsRouter({ ...deps, store: remediationStore, apiKeyPolicy, budgetUses }));
  const retryReplicated = retryReplicationGate(replication);
  app.use(deliveriesRouter({ ...deps, deliveries, intake, replicated, changed, apiKeyPolicy, pipeline }));
  // Dead letters: a restart's or deploy's retry is a new change through the pipeline, from the API and Bull Board alike.
  const deadLetters = queue.deadLetters(changeRetry(pipeline, queue.jobs));
  app.use(jobsRouter({ ...deps, jobs: queue.jobs, deadLetters, retryReplicated, apiKeyPolicy, changeRecords: pipeline }));
  app.use(openapiRouter({ version: deps.version, adminUI: config.ADMIN_UI_ENABLED }));
  if (config.ADMIN_UI_ENABLED) {
    const opsQueue = { bull: queue.bull, deadLetters };
    app.use(
      ADMIN_BASE_PATH,
      createAdminRouter({ queues: [queue.bull], opsQueue, retryReplicated, apiKeys: config.apiKeys, logger, metrics }),
    );
  }
  if (deps.changeRoutes) {
    const operatorKey = requireApiKey(config.apiKeys, metrics, 'operator', apiKeyPolicy);
    app.use(deps.changeRoutes({ pipeline, confirms: { replicated, changed, retryReplicated }, apiKeyPolicy, operatorKey }));
  }
  app.use(notFound);
  app.use(webhookFailures({ deliveries }));
  app.use(errorHandler(logger));
  return app;
}
