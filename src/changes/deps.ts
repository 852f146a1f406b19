import type { Redis } from 'ioredis';
import { createApprovalStore } from './approvals/store.js';
import { createBudgets } from './budget/store.js';
import { budgetPools } from './budget/pools.js';
import { createFreezeStore, type FreezeWatch } from './freezes/store.js';
import { createHoldStore } from './holds.js';
import { createDeployTurns } from './deployOrder/store.js';
import { createDeployHistory } from './deployOrder/history.js';
import { findProject, type Inventory } from '../shared/inventory.js';
import { JOB, type ReportChangeData } from '../shared/jobs.js';
import type { Logger } from '../shared/logger.js';
import type { Metrics } from '../shared/metrics.js';
import { formatDuration, type BudgetPolicy } from '../shared/policy.js';
import type { Producer } from '../shared/producer.js';
import type { Prober } from '../shared/probe.js';
import type { Intake } from '../domain/intake.js';

type GuardMetrics = Pick<
  Metrics,
  'budgetExhausted' | 'remediationBudgetExhausted' | 'approvals' | 'guardRefusals' | 'guardOverrides' | 'holds' | 'freezes' | 'dryRuns'
>;

/** What the change pipeline needs; createPipeline adds its Redis stores. */
interface PipelineInputs {
  inventory: Inventory;
  /** A `request`-profile connection (fails fast when Redis is down). */
  redis: Redis;
  producer: Pick<Producer, 'add' | 'remove' | 'promote' | 'deduplicationHolder' | 'acceptedAt'>;
  /** Deploys go through the intake: the event's dedup record, the delivery alias. Absent in the worker, whose changes are restarts. */
  intake?: Pick<Intake, 'push'>;
  probe?: Pick<Prober, 'run'>;
  logger: Logger;
  metrics?: GuardMetrics;
  /** The clock of every guard (ms); tests control it. */
  now: () => number;
  /** DRY_RUN_TIMEOUT_MS. */
  dryRunTimeoutMs?: number;
  /** The freezes kept in memory: no Redis round trip per change; absent: read per change. */
  freezeWatch?: FreezeWatch;
  /** DEPLOY_HISTORY_KEPT: deploys kept per project in the history (100 when not given). */
  deployHistoryKept?: number;
}

export type WayInDeps = { inventory: Inventory; redis: Redis; logger: Logger; pipeline: Pipeline };

/** The pipeline of a restart (a remediation's): no deploy's intake, no dry run against the cluster. */
export type RestartPipeline = Omit<Pipeline, 'intake' | 'probe' | 'dryRunTimeoutMs'>;

export function createPipeline(deps: PipelineInputs) {
  return {
    ...deps,
    approvals: createApprovalStore(deps.redis),
    freezes: createFreezeStore(deps.redis),
    holds: createHoldStore(deps.redis),
    budgets: createBudgets(deps.redis),
    deployTurns: createDeployTurns(deps.redis),
    deployHistory: createDeployHistory(deps.redis, deps.deployHistoryKept ?? 100),
    /** The restart budgets a restart of the namespace by `requester` draws on (hosts sharing a namespace agree: checked at start). */
    budgetPools: (namespace: string, requester: string) => budgetPools(deps.inventory, namespace, requester),
  };
}

export type Pipeline = ReturnType<typeof createPipeline>;

/** The namespace a project's deploy Job runs in ('' for a project the inventory lacks: only a freeze of everything covers it). */
export function projectNamespace(inventory: Inventory, project: string): string {
  return findProject(inventory, project)?.namespace ?? '';
}

/** "3 restarts per 10m". */
export const describeBudget = (b: BudgetPolicy): string =>
  `${b.restarts} restart${b.restarts === 1 ? '' : 's'} per ${formatDuration(b.per)}`;

/**
 * Queues a report of a guarded change (the worker's report_change). A report is news, not the
 * change: failing to queue it is logged, never the change's error. `jobId` makes a repeat one job.
 */
export async function queueReport(
  g: Pick<Pipeline, 'producer' | 'logger'>,
  jobId: string,
  data: ReportChangeData,
  delayMs?: number,
): Promise<void> {
  try {
    await g.producer.add({ name: JOB.reportChange, data, jobId, ...(delayMs !== undefined ? { delay: delayMs } : {}) });
  } catch (err) {
    g.logger.warn('could not queue the report of a guarded change', { report: data.event, job_id: jobId, err });
  }
}

/** Every restart job's BullMQ deduplication id: while one restart of a Deployment waits or rolls out, another joins it. */
export const coalesceId = (namespace: string, deployment: string): string => `restart:${namespace}/${deployment}`;
