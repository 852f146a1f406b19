import { afterAll, beforeAll, beforeEach } from '@jest/globals';
import type { Express, RequestHandler } from 'express';
import { Redis } from 'ioredis';
import { createApp, type AppDeps } from '../../src/app.js';
import { createDeliveryLog, type DeliveryLog } from '../../src/domain/deliveries.js';
import { createKubeHostStatusProvider } from '../../src/domain/kubeHostStatus.js';
import type { HostStatusProvider } from '../../src/domain/hostStatus.js';
import { loadApiConfig, secretsOf, type ApiConfig } from '../../src/api/config.js';
import { parseInventory, type Inventory } from '../../src/shared/inventory.js';
import { createLogger, type Logger } from '../../src/shared/logger.js';
import { createMetrics, type Metrics } from '../../src/shared/metrics.js';
import { createOpsQueue, type OpsQueue } from '../../src/api/queue.js';
import { createRedis } from '../../src/shared/redis.js';
import { createFreezeStore, watchFreezes } from '../../src/changes/freezes/store.js';
import { FREEZES_CHANNEL } from '../../src/shared/keys.js';
import { Worker } from 'bullmq';
import { loadWorkerConfig } from '../../src/shared/config.js';
import { QUEUE_NAME } from '../../src/shared/jobs.js';
import { NoKubeConfigError } from '../../src/shared/kubeconfig.js';
import { createWorkerDeps } from '../../worker/deps.js';
import { createProcessor } from '../../worker/processor.js';
import { startRedis, type RedisServer } from './redis.js';
import { senderSecretsEnv } from './senders.js';

/**
 * One real API app per test file: real Redis (the file's startRedis()), real BullMQ queue, real
 * logger whose lines are collected for assertions. No mocks: the only stand-in is the
 * Kubernetes host-status provider, and by default it is the real one with no cluster (503).
 */
export const RO_KEY = 'ro-key:with:colons-0001';
export const OP_KEY = 'op-key-0002-abcdef';
export const OP_KEY_2 = 'op-key-rotated-0003';
export const BEARER = 'bearer-token-0004-xyz';
/** Who holds BEARER (OPS_BEARER_TOKEN_OWNER). */
export const BEARER_OWNER = 'oncall-rotation';
export const SCM_SECRET = 'scm-secret-0005';
export const GITHUB_SECRET = "It's a Secret to Everybody";
export const SECRETS = [RO_KEY, OP_KEY, OP_KEY_2, BEARER, SCM_SECRET, GITHUB_SECRET, ...Object.values(senderSecretsEnv())];

export const INVENTORY_YAML = `
hosts:
  web-1:
    namespace: shop
    deployments: [frontend, checkout]
  db-1:
    namespace: data
    deployments: [postgres-exporter]
projects:
  group/app:
    namespace: deploys
    serviceAccountName: deployer
    image: alpine:3.20
  group/ci:
    namespace: deploys
    serviceAccountName: deployer
    image: alpine:3.20
    deploy_from: ci
`;

export function baseEnv(redisUrl: string): Record<string, string | undefined> {
  return {
    OPS_API_KEY_ROLES: `${RO_KEY}:readonly,${OP_KEY}:operator,${OP_KEY_2}:operator`,
    REDIS_URL: redisUrl,
    OPS_BEARER_TOKEN: BEARER,
    // The on-call rotation holds the bearer token here; tests of a token nobody is named for unset it.
    OPS_BEARER_TOKEN_OWNER: BEARER_OWNER,
    ...senderSecretsEnv(),
    SCM_WEBHOOK_SECRET: SCM_SECRET,
    GITHUB_WEBHOOK_SECRET: GITHUB_SECRET,
    RATE_LIMIT_RPS: '0',
  };
}

export interface Harness {
  app: Express;
  config: ApiConfig;
  inventory: Inventory;
  redis: Redis;
  queue: OpsQueue;
  metrics: Metrics;
  logger: Logger;
  /** Every log line written so far (raw JSON text, after redaction). */
  lines: string[];
  logs(): Array<Record<string, unknown>>;
  audits(): Array<Record<string, unknown>>;
  /** A plain client for inspecting Redis in assertions (not the app's). */
  inspect: Redis;
  /** Redis was emptied behind the app's back: tell every process watching the freezes, and wait for this one's reload. */
  freezesFlushed(): Promise<void>;
  /** The app's deliveries log (its verdicts are written a moment after each answer; flush() sends them now). */
  deliveries: DeliveryLog;
  close(): Promise<void>;
}

export interface HarnessOptions {
  env?: Record<string, string | undefined>;
  /** Queue on another Redis (to make enqueueing fail while dedup works). */
  queueUrl?: string;
  hostStatus?: HostStatusProvider;
  /** Passed to createApp as its rate-limit slot. */
  rateLimit?: (deps: { redis: Redis; metrics: Metrics; logger: Logger }) => RequestHandler;
  /** The app's clock for API-key expiry and the guards of changes (createApp's `now`). */
  now?: () => number;
  /** Another inventory than INVENTORY_YAML (policies of guarded changes). */
  inventoryYaml?: string;
  /** Passed to createApp: the routes of a kind of change a test registers. */
  changeRoutes?: AppDeps['changeRoutes'];
}

export async function createHarness(redisUrl: string, opts: HarnessOptions = {}): Promise<Harness> {
  const config = loadApiConfig({ ...baseEnv(redisUrl), ...(opts.env ?? {}) });
  const inventory = parseInventory(opts.inventoryYaml ?? INVENTORY_YAML);
  const lines: string[] = [];
  const logger = createLogger({ level: 'debug', secrets: secretsOf(config), write: (l) => lines.push(l) });
  const metrics = createMetrics('api', 'test', { defaults: false });
  const redis = createRedis(redisUrl, 'request', 'test-api');
  const queue = createOpsQueue({
    url: opts.queueUrl ?? redisUrl,
    policy: { attempts: config.JOB_ATTEMPTS, backoffMs: config.JOB_BACKOFF_MS },
    logger,
    metrics,
    timeoutMs: 2000,
  });
  await waitReady(redis);
  if (!opts.queueUrl) await queue.bull.waitUntilReady();
  const inspect = new Redis(redisUrl, { maxRetriesPerRequest: 1, lazyConnect: false });
  inspect.on('error', () => {});
  // As src/server.ts wires it: the freezes in memory, kept current through pub/sub.
  const freezeWatch = watchFreezes({
    store: createFreezeStore(redis),
    subscriber: createRedis(redisUrl, 'blocking', 'test-api-freezes'),
    logger,
  });
  // As src/server.ts wires it: the log whose last verdicts are sent at close.
  const deliveries = createDeliveryLog({ redis, logger, keep: config.DELIVERIES_KEPT, keepUnverified: config.DELIVERIES_UNVERIFIED_KEPT });
  const app = createApp({
    config,
    redis,
    queue,
    inventory,
    logger,
    metrics,
    hostStatus:
      opts.hostStatus ??
      createKubeHostStatusProvider(() => {
        throw new NoKubeConfigError('none in this test');
      }),
    version: '9.9.9-test',
    rateLimit: opts.rateLimit?.({ redis, metrics, logger }),
    ...(opts.now ? { now: opts.now } : {}),
    freezeWatch,
    deliveries,
    ...(opts.changeRoutes ? { changeRoutes: opts.changeRoutes } : {}),
  });
  const logs = () => lines.map((l) => JSON.parse(l) as Record<string, unknown>);
  return {
    app,
    config,
    inventory,
    redis,
    queue,
    metrics,
    logger,
    lines,
    logs,
    audits: () => logs().filter((l) => l.msg === 'audit'),
    inspect,
    freezesFlushed: async () => {
      await inspect.publish(FREEZES_CHANNEL, 'flushed');
      await freezeWatch.changed();
    },
    deliveries,
    close: async () => {
      await deliveries.flush();
      await freezeWatch.close();
      await queue.close();
      redis.disconnect();
      inspect.disconnect();
    },
  };
}

export async function waitReady(r: Redis, timeoutMs = 10000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (r.status !== 'ready') {
    if (Date.now() > deadline) throw new Error('redis client not ready');
    await new Promise((res) => setTimeout(res, 20));
  }
}

/** Polls `fn` until it returns true (e.g. after a Redis restart, until clients reconnect). */
export async function eventually(fn: () => Promise<boolean>, timeoutMs = 15000, stepMs = 100): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await fn()) return;
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((res) => setTimeout(res, stepMs));
  }
}

/** Asserts no configured secret appears anywhere in the text. */
export function containsSecret(text: string): string | undefined {
  return SECRETS.find((s) => text.includes(s));
}

/**
 * The per-file set-up every API test file shares: its own redis-server and harness for the whole
 * file, torn down after it; with `flush` (default) Redis is emptied before each test.
 */
export function useHarness(
  opts: {
    flush?: boolean;
    env?: Record<string, string | undefined>;
    now?: () => number;
    inventoryYaml?: string;
    changeRoutes?: AppDeps['changeRoutes'];
  } = {},
): {
  readonly srv: RedisServer;
  readonly h: Harness;
} {
  let srv: RedisServer | undefined;
  let h: Harness | undefined;
  beforeAll(async () => {
    srv = await startRedis();
    h = await createHarness(srv.url, {
      env: opts.env,
      ...(opts.now ? { now: opts.now } : {}),
      ...(opts.inventoryYaml ? { inventoryYaml: opts.inventoryYaml } : {}),
      ...(opts.changeRoutes ? { changeRoutes: opts.changeRoutes } : {}),
    });
  });
  afterAll(async () => {
    await h?.close();
    await srv?.destroy();
  });
  if (opts.flush !== false) {
    beforeEach(async () => {
      await h!.inspect.flushall();
      await h!.freezesFlushed();
    });
  }
  return {
    get srv() {
      return srv!;
    },
    get h() {
      return h!;
    },
  };
}

/**
 * Runs the real worker processor (BullMQ Worker, INVENTORY_YAML, no cluster configured: restart
 * and deploy jobs are dead-lettered with "no Kubernetes configuration") until `done()` holds.
 */
export async function runWorkerUntil(
  redisUrl: string,
  done: () => Promise<boolean>,
  timeoutMs = 20000,
  env: Record<string, string> = {},
): Promise<void> {
  const redis = new Redis(redisUrl, { maxRetriesPerRequest: null });
  const config = loadWorkerConfig({ ...env, REDIS_URL: redisUrl });
  const logger = createLogger({ level: 'error', write: () => {} });
  const { close, ...deps } = createWorkerDeps({
    config,
    inventory: parseInventory(INVENTORY_YAML),
    redis,
    logger,
    kubeConfig: () => {
      throw new NoKubeConfigError('none in this test');
    },
    now: Date.now,
  });
  const processor = createProcessor(deps);
  const worker = new Worker(QUEUE_NAME, processor, { connection: redis });
  try {
    await eventually(done, timeoutMs);
  } finally {
    await worker.close();
    await close();
    redis.disconnect();
  }
}
