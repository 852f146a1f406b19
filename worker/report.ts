import { DelayedError, UnrecoverableError } from 'bullmq';
import { describeReasons } from '../src/changes/gate.js';
import { planWake, type ChangeJob } from '../src/changes/wake.js';
import { kindOf } from '../src/changes/kinds/index.js';
import type { Outcome, OutcomeResult } from '../src/shared/jobs.js';
import type { JobContext } from './context.js';
import { JobCancelledError, JobTimeoutError } from './errors.js';

// A change's gate at the start of each attempt and its outcome at the end (a handler writes the outcome's Kubernetes Event).

/** A final failure with the outcome it stands for (e.g. progress_deadline_exceeded). */
export class ChangeFailedError extends UnrecoverableError {
  constructor(
    message: string,
    readonly result: OutcomeResult,
  ) {
    super(message);
  }
}

/** Whether this failure ends the job (no retry follows): unrecoverable, or its last attempt. */
export function isFinal(err: unknown, ctx: Pick<JobContext, 'job'>): boolean {
  if (err instanceof DelayedError || err instanceof JobCancelledError) return false;
  if (err instanceof UnrecoverableError) return true;
  return ctx.job.attemptsMade + 1 >= (ctx.job.opts.attempts ?? 1);
}

export function failureOutcome(err: unknown, seconds: number): Outcome {
  const result: OutcomeResult = err instanceof ChangeFailedError ? err.result : 'failed';
  const reason = err instanceof JobTimeoutError ? `attempt ${err.message}` : err instanceof Error ? err.message : String(err);
  return { result, reason: reason.slice(0, 1000), duration_s: Math.round(seconds * 10) / 10 };
}

/** The report fields of the job's target, its kind's (src/changes/kinds/). */
function target(c: ChangeJob, ctx: Pick<JobContext, 'inventory'>) {
  const kind = kindOf(c.name);
  return kind.reportFields(kind.fromJob(ctx.inventory, c.data).target);
}

/**
 * The gate at the start of an attempt (the pipeline's planner, origin `wake`): a deploy held meanwhile
 * is delayed until it opens (Job#moveToDelayed, then DelayedError); a restart is refused unless an operator
 * overrode the gate. Without its stores or the job's lock token the attempt fails (retried): it never runs unchecked.
 */
export async function checkGate(
  c: ChangeJob,
  ctx: Pick<JobContext, 'job' | 'token' | 'logger' | 'inventory' | 'freezes' | 'holds' | 'metrics' | 'report' | 'now'>,
): Promise<void> {
  const now = ctx.now();
  const jobId = String(ctx.job.id);
  const { change, decision } = planWake(ctx.inventory, await ctx.freezes.list(now), c, jobId, now);
  const t = target(c, ctx);
  const kind = kindOf(c.name);
  switch (decision.kind) {
    case 'queue':
      if (decision.overridden.length > 0) {
        ctx.logger.warn(`${c.name} runs through a closed gate (overridden)`, {
          by: change.override?.by,
          owner: change.override?.owner,
          reasons: describeReasons(decision.overridden),
        });
      }
      if (kind.closedGate === 'hold') await ctx.holds.remove(jobId);
      return;
    case 'refuse':
      throw new ChangeFailedError(`${c.name} refused: ${describeReasons(decision.reasons)}`, 'refused');
    case 'hold': {
      if (kind.closedGate !== 'hold') throw new ChangeFailedError(`${c.name} refused: ${describeReasons(decision.reasons)}`, 'refused');
      if (!ctx.job.moveToDelayed || !ctx.token) {
        throw new Error(`deploy held (${describeReasons(decision.reasons)}) but its lock token is missing; not running it`);
      }
      const until = decision.until;
      const { project, ref } = kind.intake!(change.target);
      await ctx.holds.set({
        job_id: jobId,
        project,
        namespace: t.namespace,
        ref,
        reasons: decision.reasons,
        until,
        held_at: now,
        by: 'worker',
        requested_by: c.data.requested_by,
      });
      for (const r of decision.reasons) ctx.metrics?.holds.inc({ by: 'worker', guard: r.guard });
      ctx.logger.info('deploy held', { until: new Date(until).toISOString(), reasons: describeReasons(decision.reasons) });
      await ctx.report(`report.${jobId}.held`, {
        event: 'held',
        ...t,
        job_id: jobId,
        outcome: { result: 'held', reason: describeReasons(decision.reasons), until: new Date(until).toISOString() },
        approvers: c.data.approvers ?? [],
        audit_id: c.data.audit_id,
        requested_by: c.data.requested_by,
      });
      // The delay is relative: BullMQ schedules on the process's own clock, the gate on the worker's one.
      await ctx.job.moveToDelayed(Date.now() + Math.max(1, until - now), ctx.token);
      throw new DelayedError();
    }
    default:
      throw new Error(`unexpected decision for a job waking: ${decision.kind}`);
  }
}

/** Whether an outcome goes to the notification endpoints (REPORT_OUTCOMES; no endpoint: nothing to queue). */
function reported(ctx: Pick<JobContext, 'config'>, outcome: Outcome): boolean {
  const { REPORT_OUTCOMES: which, NOTIFY_WEBHOOK_URLS: urls } = ctx.config;
  if (urls.length === 0 || which === 'none') return false;
  return which === 'all' || !['rolled_out', 'created'].includes(outcome.result);
}

/**
 * Records how a change ended: its progress, the metric, the audit line, the report and, for a pushed
 * deploy that never ran or was cancelled, its sender's deliveries log. `by`: the deploy that superseded or cancelled it.
 */
export async function recordOutcome(
  c: ChangeJob,
  ctx: Pick<JobContext, 'job' | 'logger' | 'inventory' | 'config' | 'metrics' | 'report'> & Partial<Pick<JobContext, 'deliveries'>>,
  outcome: Outcome,
  by?: string,
): Promise<void> {
  const jobId = String(ctx.job.id);
  const previous = typeof ctx.job.progress === 'object' && ctx.job.progress !== null ? (ctx.job.progress as Record<string, unknown>) : {};
  await ctx.job
    .updateProgress({ ...previous, outcome })
    .catch((err: unknown) => ctx.logger.warn('could not record the outcome on the job', { err }));
  ctx.metrics?.changeOutcomes.inc({ change: c.name, result: outcome.result });
  // The end of the request that asked for the change: the audit id of the API's audit line of that
  // request (the job's logger carries the job id and name).
  ctx.logger.info('change outcome', {
    audit: true,
    audit_id: c.data.audit_id,
    who: c.data.requested_by,
    change: c.name,
    result: outcome.result,
    duration_s: outcome.duration_s,
    reason: outcome.reason,
    ...(by !== undefined ? { [outcome.result === 'cancelled' ? 'cancelled_by' : 'superseded_by']: by } : {}),
  });
  ctx.deliveries?.record(c.data, jobId, outcome);
  if (!reported(ctx, outcome)) return;
  await ctx
    .report(`report.${jobId}.outcome`, {
      event: 'outcome',
      ...target(c, ctx),
      job_id: jobId,
      ...(c.data.approval_id ? { approval_id: c.data.approval_id } : {}),
      outcome,
      approvers: c.data.approvers ?? [],
      ...(c.data.reason ? { reason: c.data.reason } : {}),
      audit_id: c.data.audit_id,
      requested_by: c.data.requested_by,
    })
    .catch((err: unknown) => ctx.logger.warn('could not queue the outcome report', { err }));
}
