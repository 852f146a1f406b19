import type { Job } from 'bullmq';
import type { Redis } from 'ioredis';
import type { Budgets } from '../src/changes/budget/store.js';
import type { DeployTurns } from '../src/changes/deployOrder/store.js';
import type { ApprovalStore } from '../src/changes/approvals/store.js';
import type { WorkerConfig } from '../src/shared/config.js';
import type { FreezeStore } from '../src/changes/freezes/store.js';
import type { HoldStore } from '../src/changes/holds.js';
import type { Inventory } from '../src/shared/inventory.js';
import type { ReportChangeData } from '../src/shared/jobs.js';
import type { Logger } from '../src/shared/logger.js';
import type { Metrics } from '../src/shared/metrics.js';
import type { KubeConfigFactory } from '../src/shared/kubeconfig.js';
import type { RemediationDeps } from '../src/remediation/engine.js';

/**
 * What the worker needs of guarded changes: the freezes and holds (a held deploy is checked again
 * when it wakes), the approvals (an expiry report expires its approval), a way to queue a report,
 * the metrics of outcomes and holds, and the clock.
 */
export interface WorkerGuards {
  freezes: FreezeStore;
  holds: HoldStore;
  approvals: ApprovalStore;
  budgets: Pick<Budgets, 'giveBack'>;
  /** The deploys' concurrency groups: a deploy takes its group's turn before it runs. */
  deployTurns: DeployTurns;
  /** Wakes a delayed job now (the next deploy of a group whose running one ended); a job not delayed is left as it is. */
  promote(id: string): Promise<void>;
  /** Whether a job of that id is on the queue (an approval left approving: was its change added?). */
  jobExists(id: string): Promise<boolean>;
  /** Queues a report_change job under `jobId` (one job per id: a repeat adds nothing). */
  report(jobId: string, data: ReportChangeData, delayMs?: number): Promise<void>;
  metrics?: Pick<Metrics, 'changeOutcomes' | 'holds'> & Partial<Pick<Metrics, 'deployLastSuccess'>>;
  now: () => number;
  /** Alert-driven remediation's checks and watches (absent without rules in the inventory). */
  remediation?: Omit<RemediationDeps, 'onOutcome'>;
}

/** What a job handler gets besides its validated data. */
export interface JobContext {
  /** The BullMQ job (id, attempts, updateProgress, moveToDelayed for a held deploy). */
  job: Pick<Job, 'id' | 'name' | 'attemptsMade' | 'opts' | 'updateProgress' | 'progress' | 'timestamp'> &
    Partial<Pick<Job, 'moveToDelayed'>>;
  /** The job's lock token (BullMQ's Job#moveToDelayed needs it). */
  token?: string;
  /** Aborted at the per-attempt deadline (JOB_TIMEOUT_SECONDS) or when the worker shuts down. */
  signal: AbortSignal;
  /** Bound to job id and name. */
  logger: Logger;
  config: WorkerConfig;
  inventory: Inventory;
  /** The worker's Redis connection (for idempotency records). */
  redis: Redis;
  kubeConfig: KubeConfigFactory;
  /** Guarded changes; absent in a processor built without them (then nothing is held or reported). */
  guards?: WorkerGuards;
}

export type Handler<D> = (data: D, ctx: JobContext) => Promise<unknown>;
