import request from 'supertest';
import type { Express } from 'express';
import { NoKubeConfigError, type KubeConfigFactory } from '../../src/shared/kubeconfig.js';
import { parseInventory } from '../../src/shared/inventory.js';
import { startWorker, type WorkerHandle } from '../../worker/index.js';
import { BEARER } from './apiHarness.js';
import { collectLogs, testMetrics, workerConfig, type LogCollector } from './workerSupport.js';

/**
 * What the tests of guarded changes share: an inventory with one host or project per policy, calls
 * of the guarded routes, and a real worker (BullMQ Worker, the inventory, no cluster unless one is
 * given) with its own clock.
 */
export const GUARDED_INVENTORY_YAML = `
hosts:
  web-1:
    namespace: shop
    deployments: [frontend, checkout]
  pay-1:
    namespace: payments
    deployments: [api, ledger]
    policy:
      approval: {required: 1, ttl: 1h}
  vault-1:
    namespace: vault
    deployments: [core]
    policy:
      approval: {required: 2, ttl: 10m}
  batch-1:
    namespace: batch
    deployments: [reports, exports, imports, sync]
    policy:
      budget: {restarts: 3, per: 10m}
  batch-2:
    namespace: batch
    deployments: [archive]
    policy:
      approval: {required: 1, ttl: 1h}
      budget: {restarts: 3, per: 10m}
  office-1:
    namespace: office
    deployments: [intranet]
    policy:
      windows: [{days: [mon, tue, wed, thu, fri], start: "09:00", end: "17:00", timeZone: Europe/Paris}]
projects:
  group/app:
    namespace: deploys
    serviceAccountName: deployer
    image: alpine:3.20
  group/guarded:
    namespace: deploys
    serviceAccountName: deployer
    image: alpine:3.20
    policy:
      approval: {required: 1, ttl: 1h}
  group/office:
    namespace: office
    serviceAccountName: deployer
    image: alpine:3.20
    policy:
      windows: [{days: [mon, tue, wed, thu, fri], start: "09:00", end: "17:00", timeZone: Europe/Paris}]
`;

export const GUARDED_INVENTORY = parseInventory(GUARDED_INVENTORY_YAML);

export const restartAs = (app: Express, qs: string, auth: Record<string, string> = { Authorization: `Bearer ${BEARER}` }) =>
  request(app).post(`/ops/restart${qs}`).set(auth);

export const decide = (
  app: Express,
  id: string,
  action: 'approve' | 'reject',
  key: string,
  body: Record<string, unknown> = { reason: 'looks right' },
) =>
  request(app)
    .post(`/ops/approvals/${id}/${action}`)
    .set('X-API-Key', key)
    .set('Content-Type', 'application/json')
    .send(JSON.stringify(body));

export const noCluster: KubeConfigFactory = () => {
  throw new NoKubeConfigError('none in this test');
};

/** A real worker on `redisUrl` with the guarded inventory; `now` is its clock of guarded changes. */
export async function guardedWorker(
  redisUrl: string,
  opts: { now?: () => number; env?: Record<string, string>; kubeConfig?: KubeConfigFactory } = {},
): Promise<WorkerHandle & { logs: LogCollector; metrics: ReturnType<typeof testMetrics> }> {
  const logs = collectLogs();
  const metrics = testMetrics();
  const handle = await startWorker(workerConfig({ REDIS_URL: redisUrl, JOB_ATTEMPTS: '1', ...(opts.env ?? {}) }), {
    logger: logs.logger,
    metrics,
    inventory: GUARDED_INVENTORY,
    kubeConfig: opts.kubeConfig ?? noCluster,
    ...(opts.now ? { now: opts.now } : {}),
  });
  return Object.assign(handle, { logs, metrics });
}
