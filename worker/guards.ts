import { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { createApprovalStore } from '../src/changes/approvals/store.js';
import { createBudgets } from '../src/changes/budget/store.js';
import { createDeployTurns } from '../src/changes/deployOrder/store.js';
import { createFreezeStore } from '../src/changes/freezes/store.js';
import { createHoldStore } from '../src/changes/holds.js';
import { createPipeline } from '../src/changes/deps.js';
import { remediationSources } from '../src/remediation/sources.js';
import type { RemediationMetrics } from '../src/remediation/engine.js';
import { createRemediationStore } from '../src/remediation/store.js';
import type { WorkerConfig } from '../src/shared/config.js';
import type { Inventory } from '../src/shared/inventory.js';
import { createJobReads } from '../src/shared/jobReads.js';
import { defaultJobOptions, JOB, QUEUE_NAME } from '../src/shared/jobs.js';
import type { Logger } from '../src/shared/logger.js';
import { createProducer } from '../src/shared/producer.js';
import { createQueueGuard } from '../src/shared/queueGuard.js';
import { queuePrefix } from '../src/shared/keys.js';
import type { WorkerGuards } from './context.js';

/**
 * The worker's side of the change pipeline: the stores the API writes (freezes, holds, approvals,
 * budgets), and a producer for the reports this worker queues (one BullMQ Queue on the worker's
 * connection). Every restart or deploy job is checked against them when it starts an attempt;
 * a worker without them runs no change.
 */
export function createWorkerGuards(deps: {
  redis: Redis;
  config: Pick<WorkerConfig, 'REDIS_URL' | 'JOB_ATTEMPTS' | 'JOB_BACKOFF_MS'> &
    Partial<Pick<WorkerConfig, 'ALERTMANAGER_URL' | 'PROMETHEUS_URL' | 'PROMETHEUS_EXTERNAL_LABELS'>>;
  logger: Logger;
  now: () => number;
  metrics?: WorkerGuards['metrics'];
  /** With remediation rules: the worker runs their checks and watches through the change pipeline. */
  inventory?: Inventory;
  remediationMetrics?: RemediationMetrics;
}): { guards: WorkerGuards; reportQueue: Queue } {
  const { redis, config, logger } = deps;
  const reportQueue = new Queue(QUEUE_NAME, {
    connection: redis,
    prefix: queuePrefix(config.REDIS_URL),
    defaultJobOptions: defaultJobOptions({ attempts: config.JOB_ATTEMPTS, backoffMs: config.JOB_BACKOFF_MS }),
  });
  reportQueue.on('error', (err) => logger.debug('report queue connection error', { err }));
  const reports = createProducer({ bull: reportQueue, connection: redis, guard: createQueueGuard(redis, 5000, logger) });
  const guards: WorkerGuards = {
    freezes: createFreezeStore(redis),
    holds: createHoldStore(redis),
    approvals: createApprovalStore(redis),
    budgets: createBudgets(redis),
    deployTurns: createDeployTurns(redis),
    promote: async (id) => {
      const job = await reportQueue.getJob(id);
      if (job && (await job.isDelayed())) await job.promote();
    },
    jobExists: async (id) => (await reportQueue.getJob(id)) !== undefined,
    report: async (jobId, data, delayMs) => {
      await reports.add({ name: JOB.reportChange, data, jobId, ...(delayMs !== undefined ? { delay: delayMs } : {}) });
    },
    ...(deps.metrics ? { metrics: deps.metrics } : {}),
    now: deps.now,
  };
  const rules = deps.inventory?.remediations ?? [];
  if (deps.inventory && rules.length > 0) {
    // A remediation's check acts through the same pipeline as the API: its restarts only; a deploy is never asked for here.
    const pipeline = createPipeline({
      inventory: deps.inventory,
      redis,
      producer: reports,
      logger,
      now: deps.now,
    });
    guards.remediation = {
      pipeline,
      rules,
      store: createRemediationStore(redis),
      ...remediationSources(config, logger),
      jobs: createJobReads(reportQueue, createQueueGuard(redis, 5000, logger)),
      logger: logger.child({ component: 'remediation' }),
      ...(deps.remediationMetrics ? { metrics: deps.remediationMetrics } : {}),
      now: deps.now,
    };
  }
  return { guards, reportQueue };
}
