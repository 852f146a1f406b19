import { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import type { Budgets } from '../src/changes/budget/store.js';
import { createPipeline, type Pipeline, type RestartPipeline } from '../src/changes/deps.js';
import { createDeployEndLog, type DeployEndLog } from '../src/changes/deployOrder/deliveries.js';
import { remediationSources } from '../src/remediation/sources.js';
import type { RemediationDeps } from '../src/remediation/engine.js';
import { createRemediationStore } from '../src/remediation/store.js';
import type { WorkerConfig } from '../src/shared/config.js';
import type { Inventory } from '../src/shared/inventory.js';
import { createJobReads } from '../src/shared/jobReads.js';
import { defaultJobOptions, JOB, QUEUE_NAME, type ReportChangeData, type ReportStatusData } from '../src/shared/jobs.js';
import type { Logger } from '../src/shared/logger.js';
import type { Metrics } from '../src/shared/metrics.js';
import type { KubeConfigFactory } from '../src/shared/kubeconfig.js';
import { createProducer } from '../src/shared/producer.js';
import { createQueueGuard } from '../src/shared/queueGuard.js';
import { queuePrefix } from '../src/shared/keys.js';
import { statusHosts, type StatusHosts } from './commitStatus.js';
import type { JobMetrics } from './outcomes.js';

/** The worker's dependencies, built once per process; the change pipeline's stores are the ones the API writes. */
export interface WorkerDeps extends Pick<Pipeline, 'freezes' | 'holds' | 'approvals' | 'deployTurns'> {
  config: WorkerConfig;
  inventory: Inventory;
  /** The worker's Redis connection (idempotency records, the stores, the report queue). */
  redis: Redis;
  logger: Logger;
  kubeConfig: KubeConfigFactory;
  /** The clock of guarded changes (freezes, windows, approval expiry). */
  now: () => number;
  metrics?: Pick<Metrics, 'changeOutcomes' | 'holds'> & Partial<Pick<Metrics, 'deployLastSuccess' | 'commitStatusReports'>>;
  budgets: Pick<Budgets, 'giveBack'>;
  /** Wakes a delayed job now (the next deploy of a group whose running one ended); a job not delayed is left as it is. */
  promote: (id: string) => Promise<void>;
  /** Whether a job of that id is on the queue (an approval left approving: was its change added?). */
  jobExists: (id: string) => Promise<boolean>;
  /** A job of the queue, its name and data (a running deploy a newer one may cancel: worker/deployCancel.ts). */
  readJob?: (id: string) => Promise<{ name: string; data: unknown } | undefined>;
  /** Queues a report_change job under `jobId` (one job per id: a repeat adds nothing). */
  report: (jobId: string, data: ReportChangeData, delayMs?: number) => Promise<void>;
  /** The hosts told each deploy's state (worker/commitStatus.ts): those this worker holds a token for. */
  statusHosts?: StatusHosts;
  /** Queues a report_status job, one per deploy and state (a repeat adds nothing). */
  reportStatus?: (data: ReportStatusData) => Promise<void>;
  /** The senders' deliveries log, the API's: a pushed deploy that never ran or was cancelled is appended to it (flushed by `close`). */
  deliveries?: Pick<DeployEndLog, 'record'>;
  /** Alert-driven remediation's checks and watches (absent without rules in the inventory). */
  remediation?: Omit<RemediationDeps, 'onOutcome'>;
  /** Closes the queue the reports are added on (the connection stays the caller's). */
  close: () => Promise<void>;
}

export function createWorkerDeps(
  base: Pick<WorkerDeps, 'config' | 'inventory' | 'redis' | 'logger' | 'kubeConfig' | 'now'> & { metrics?: JobMetrics | undefined },
): WorkerDeps {
  const { config, inventory, redis, logger, now, metrics: m } = base;
  const reportQueue = new Queue(QUEUE_NAME, {
    connection: redis,
    prefix: queuePrefix(config.REDIS_URL),
    defaultJobOptions: defaultJobOptions({ attempts: config.JOB_ATTEMPTS, backoffMs: config.JOB_BACKOFF_MS }),
  });
  reportQueue.on('error', (err) => logger.debug('report queue connection error', { err }));
  const reports = createProducer({ bull: reportQueue, connection: redis, guard: createQueueGuard(redis, 5000, logger) });
  // A remediation's check acts through the same pipeline as the API: its restarts only, so no intake.
  const pipeline: RestartPipeline = createPipeline({ inventory, redis, producer: reports, logger, now });
  const deliveries = createDeployEndLog({ redis, logger, keep: config.DELIVERIES_KEPT, keepUnverified: config.DELIVERIES_UNVERIFIED_KEPT });
  const deps: WorkerDeps = {
    ...base,
    metrics: m?.changeOutcomes && m.holds ? { ...m, changeOutcomes: m.changeOutcomes, holds: m.holds } : undefined,
    freezes: pipeline.freezes,
    holds: pipeline.holds,
    approvals: pipeline.approvals,
    budgets: pipeline.budgets,
    deployTurns: pipeline.deployTurns,
    promote: async (id) => {
      const job = await reportQueue.getJob(id);
      if (job && (await job.isDelayed())) await job.promote();
    },
    jobExists: async (id) => (await reportQueue.getJob(id)) !== undefined,
    readJob: async (id) => {
      const job = await reportQueue.getJob(id);
      return job ? { name: job.name, data: job.data as unknown } : undefined;
    },
    report: async (jobId, data, delayMs) => {
      await reports.add({ name: JOB.reportChange, data, jobId, ...(delayMs !== undefined ? { delay: delayMs } : {}) });
    },
    statusHosts: statusHosts(config, logger),
    reportStatus: async (data) => {
      await reports.add({ name: JOB.reportStatus, data, jobId: `status.${data.deploy_id}.${data.state}` });
    },
    deliveries,
    // The verdicts recorded last are sent before the connection is quit.
    close: async () => {
      await Promise.all([deliveries.flush(), reportQueue.close()]);
    },
  };
  if (inventory.remediations.length > 0) {
    const { remediations, remediationsSuppressed, remediationEscalations } = m ?? {};
    deps.remediation = {
      pipeline,
      rules: inventory.remediations,
      store: createRemediationStore(redis),
      ...remediationSources(config, logger),
      jobs: createJobReads(reportQueue, createQueueGuard(redis, 5000, logger)),
      logger: logger.child({ component: 'remediation' }),
      metrics:
        remediations && remediationsSuppressed && remediationEscalations
          ? { remediations, remediationsSuppressed, remediationEscalations }
          : undefined,
      now,
    };
  }
  return deps;
}
