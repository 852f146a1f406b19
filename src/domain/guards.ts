import type { Redis } from 'ioredis';
import { createApprovalStore, type ApprovalStore } from '../shared/approvals.js';
import { createBudgets, type BudgetLimit, type Budgets } from '../shared/budget.js';
import { BudgetExhaustedError } from '../shared/errors.js';
import { createFreezeStore, type FreezeStore, type FreezeWatch } from '../shared/freezes.js';
import { describeReasons, gate, type GateVerdict } from '../shared/gate.js';
import { createHoldStore, type Hold, type HoldStore } from '../shared/holds.js';
import { findProject, hostPolicy, projectPolicy, type Inventory } from '../shared/inventory.js';
import { JOB, type ReportChangeData, type RunDeployPipelineData } from '../shared/jobs.js';
import type { Logger } from '../shared/logger.js';
import type { Metrics } from '../shared/metrics.js';
import { formatDuration } from '../shared/policy.js';
import type { Producer } from '../shared/producer.js';
import type { Prober } from '../shared/probe.js';
import { redisCall } from './redisOps.js';

/**
 * What every guarded change needs (src/domain/restart.ts, deploy.ts, approvals.ts, freezes.ts,
 * dryRun.ts): the inventory's policies, the Redis stores of approvals, freezes, holds and budgets,
 * the producer, one clock. Plain values in and out; no HTTP here.
 */
export type GuardMetrics = Pick<
  Metrics,
  'budgetExhausted' | 'approvals' | 'guardRefusals' | 'guardOverrides' | 'holds' | 'freezes' | 'dryRuns'
>;

export interface GuardDeps {
  inventory: Inventory;
  /** A `request`-profile connection (fails fast when Redis is down). */
  redis: Redis;
  producer: Pick<Producer, 'add' | 'remove' | 'promote' | 'deduplicationHolder'>;
  probe?: Pick<Prober, 'run'>;
  logger: Logger;
  metrics?: GuardMetrics;
  /** The clock of every guard (ms since the epoch); tests control it. */
  now: () => number;
  /** DRY_RUN_TIMEOUT_MS. */
  dryRunTimeoutMs?: number;
  /** The freezes kept in memory (src/shared/freezes.ts): no Redis round trip per change; absent: read per change. */
  freezeWatch?: FreezeWatch;
}

export interface Guards extends GuardDeps {
  approvals: ApprovalStore;
  freezes: FreezeStore;
  holds: HoldStore;
  budgets: Budgets;
}

export function createGuards(deps: GuardDeps): Guards {
  return {
    ...deps,
    approvals: createApprovalStore(deps.redis),
    freezes: createFreezeStore(deps.redis),
    holds: createHoldStore(deps.redis),
    budgets: createBudgets(deps.redis),
  };
}

/** The gate of a restart of a host's Deployment at `now`: the freezes of its namespace or of everything, the host's windows. */
/** The freezes not yet ended: from memory when this process watches them, else from Redis. */
const freezesNow = (g: Guards, now: number) => redisCall(() => (g.freezeWatch ?? g.freezes).list(now), g.redis);

export async function restartGate(g: Guards, host: string, namespace: string, now: number): Promise<GateVerdict> {
  const freezes = await freezesNow(g, now);
  return gate(freezes, hostPolicy(g.inventory, host).windows, { namespace }, now);
}

/** The namespace a project's deploy Job runs in ('' for a project the inventory lacks: only a freeze of everything covers it). */
export function projectNamespace(inventory: Inventory, project: string): string {
  return findProject(inventory, project)?.namespace ?? '';
}

/** The gate of a project's deploy at `now`. */
export async function deployGate(g: Guards, project: string, now: number): Promise<GateVerdict> {
  const freezes = await freezesNow(g, now);
  return gate(freezes, projectPolicy(g.inventory, project).windows, { namespace: projectNamespace(g.inventory, project), project }, now);
}

/** "3 restarts per 10m". */
export const describeBudget = (b: BudgetLimit): string =>
  `${b.restarts} restart${b.restarts === 1 ? '' : 's'} per ${formatDuration(b.per)}`;

/**
 * Takes one restart of a namespace's budget for `jobId`, or throws the 429 naming the budget and
 * when it has room again.
 */
export async function takeBudget(g: Guards, namespace: string, budget: BudgetLimit, jobId: string, now: number): Promise<void> {
  const use = await redisCall(() => g.budgets.take(namespace, budget, jobId, now), g.redis);
  if (use.taken) return;
  throw budgetError(g, namespace, budget, use.retryMs);
}

export function budgetError(g: Pick<Guards, 'metrics'>, namespace: string, budget: BudgetLimit, retryMs: number): BudgetExhaustedError {
  g.metrics?.budgetExhausted.inc({ namespace });
  const seconds = Math.max(1, Math.ceil(retryMs / 1000));
  return new BudgetExhaustedError(
    namespace,
    `restart budget of namespace ${namespace} exhausted: at most ${describeBudget(budget)}; the next restart fits in ${seconds} s`,
    seconds,
  );
}

/**
 * Queues a report of a guarded change for the notification endpoints (the worker's report_change).
 * A report is news, not the change: failing to queue it is logged, never answered as an error of
 * the change it reports. `jobId` makes a repeated report of the same thing one job.
 */
export async function queueReport(g: Guards, jobId: string, data: ReportChangeData, delayMs?: number): Promise<void> {
  try {
    await g.producer.add({ name: JOB.reportChange, data, jobId, ...(delayMs !== undefined ? { delay: delayMs } : {}) });
  } catch (err) {
    g.logger.warn('could not queue the report of a guarded change', { report: data.event, job_id: jobId, err });
  }
}

/**
 * Every restart job carries the BullMQ deduplication id `restart:<ns>/<deployment>`: while one
 * restart of a Deployment waits or rolls out, another request joins it (src/domain/restart.ts).
 */
export const coalesceId = (namespace: string, deployment: string): string => `restart:${namespace}/${deployment}`;

/**
 * Records why a deploy is held, before its delayed job is added (a record without its job is
 * ignored by every reader), counts it and queues its report. Returns the job's delay in ms.
 */
export async function recordHold(
  g: Guards,
  jobId: string,
  data: Pick<RunDeployPipelineData, 'project' | 'ref' | 'requested_by' | 'audit_id' | 'approvers'>,
  verdict: GateVerdict,
  now: number,
): Promise<{ delayMs: number; hold: Hold }> {
  const until = verdict.until ?? now;
  const hold: Hold = {
    job_id: jobId,
    project: data.project,
    namespace: projectNamespace(g.inventory, data.project),
    ref: data.ref,
    reasons: verdict.reasons,
    until,
    held_at: now,
    by: 'api',
    requested_by: data.requested_by,
  };
  await redisCall(() => g.holds.set(hold), g.redis);
  for (const r of verdict.reasons) g.metrics?.holds.inc({ by: 'api', guard: r.guard });
  return { delayMs: Math.max(1, until - now), hold };
}

/** The report of a deploy just held (once per job). */
export function reportHold(g: Guards, hold: Hold, data: Pick<RunDeployPipelineData, 'audit_id' | 'requested_by' | 'approvers'>) {
  return queueReport(g, `report.${hold.job_id}.held`, {
    event: 'held',
    change: 'deploy',
    project: hold.project,
    ref: hold.ref,
    namespace: hold.namespace,
    job_id: hold.job_id,
    outcome: { result: 'held', reason: describeReasons(hold.reasons), until: new Date(hold.until).toISOString() },
    approvers: data.approvers ?? [],
    audit_id: data.audit_id,
    requested_by: data.requested_by,
  });
}
