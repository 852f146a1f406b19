import { DelayedError, UnrecoverableError, type Job } from 'bullmq';
import { JOB, jobSchemaOf, type JobName, type Outcome } from '../src/shared/jobs.js';
import { kindOfJob } from '../src/changes/kinds/index.js';
import { changeJobOf, type ChangeJob } from '../src/changes/wake.js';
import { withTimeout } from '../src/shared/timeout.js';
import type { Handler, JobContext } from './context.js';
import type { WorkerDeps } from './deps.js';
import { JobCancelledError, JobTimeoutError } from './errors.js';
import { runDeployPipeline } from './jobs/deploy.js';
import { dryRun } from './jobs/dryRun.js';
import { notifyOncall } from './jobs/notify.js';
import { remediate } from './jobs/remediate.js';
import { reportChange } from './jobs/report.js';
import { reportStatus } from './jobs/reportStatus.js';
import { restartService } from './jobs/restart.js';
import { checkGate, failureOutcome, isFinal, recordOutcome } from './report.js';
import type { DeployState } from '../src/changes/deployOrder/history.js';
import { takeTurn, type TakenTurn } from './deployTurn.js';
import { deployRecorder } from './deployHistory.js';

/**
 * The worker's processor: dispatch by job name, with validation (bad data is an UnrecoverableError:
 * retrying cannot fix it), the per-attempt timeout (the attempt fails even if the handler ignores its
 * signal), a change's gate and outcome (worker/report.ts) and a deploy's turn (worker/deployTurn.ts),
 * which ends with its attempt but not when the worker shuts down under it.
 */
export const handlers: { [N in JobName]: Handler<never> } = {
  [JOB.restartService]: restartService,
  [JOB.runDeployPipeline]: runDeployPipeline,
  [JOB.notifyOncall]: notifyOncall,
  [JOB.dryRun]: dryRun,
  [JOB.reportChange]: reportChange,
  [JOB.remediate]: remediate,
  [JOB.reportStatus]: reportStatus,
};

/** The catalog's handler, or a registered kind of change's (src/changes/kinds/: its `handle`). */
function handlerOf(name: string): Handler<unknown> | undefined {
  if (Object.hasOwn(handlers, name)) return handlers[name as JobName] as Handler<unknown>;
  const kind = kindOfJob(name);
  return kind?.handle ? (data, ctx) => kind.handle!(data, ctx as never) : undefined;
}

export function createProcessor(base: Omit<WorkerDeps, 'close'>) {
  const timeoutSeconds = base.config.JOB_TIMEOUT_SECONDS;
  // Three declared parameters: BullMQ passes the cancellation signal only to processors that take it.
  return async function process(job: Job, token?: string, bullSignal?: AbortSignal): Promise<unknown> {
    const handler = handlerOf(job.name);
    const schema = jobSchemaOf(job.name);
    if (!handler || !schema) throw new UnrecoverableError(`unknown job name ${JSON.stringify(job.name).slice(0, 200)}`);
    const parsed = schema.safeParse(job.data);
    if (!parsed.success) {
      const issue = parsed.error.issues[0]!;
      throw new UnrecoverableError(`invalid job data at ${issue.path.join('.') || '(root)'}: ${issue.message}`);
    }
    const logger = base.logger.child({ job_id: job.id, job_name: job.name, attempt: job.attemptsMade + 1 });
    const controller = new AbortController();
    const cancelled = new Promise<never>((_, reject) => {
      const onCancel = () => {
        const reason: unknown = bullSignal?.reason;
        const err = new JobCancelledError(
          `attempt interrupted: ${reason instanceof Error ? reason.message : typeof reason === 'string' ? reason : 'worker shutting down'}`,
        );
        controller.abort(err);
        reject(err);
      };
      if (bullSignal?.aborted) onCancel();
      else bullSignal?.addEventListener('abort', onCancel, { once: true });
    });
    const ctx: JobContext = { ...base, job, ...(token !== undefined ? { token } : {}), signal: controller.signal, logger };
    const change = changeJobOf(job.name, parsed.data);
    const started = Date.now();
    let turn: TakenTurn | undefined;
    let interrupted = false;
    // A deploy's steps in its history (worker/deployHistory.ts); `passed` tells a hold from a wait for its turn.
    const history = change ? deployRecorder(change, ctx) : undefined;
    let passed = false;
    // How a change ended: its outcome, and a deploy's last step (`by`: the deploy that superseded or cancelled it).
    const end = async (c: ChangeJob, outcome: Outcome, state: DeployState, by?: string) => {
      await recordOutcome(c, ctx, outcome, by);
      const named = by === undefined ? {} : state === 'superseded' ? { superseded_by: by } : { cancelled_by: by };
      await history?.step({ state, ...named, finished_at: Date.now() });
    };
    try {
      if (change) await checkGate(change, ctx);
      passed = true;
      turn = change ? await takeTurn(change, ctx) : undefined;
      if (change && turn?.superseded !== undefined) {
        const reason = `superseded by deploy ${turn.superseded}, accepted after it`;
        await end(change, { result: 'superseded', reason }, 'superseded', turn.superseded);
        return { superseded_by: turn.superseded };
      }
      await history?.step({ state: 'running', started_at: Date.now() });
      const value = await withTimeout(Promise.race([handler(parsed.data, ctx), cancelled]), timeoutSeconds * 1000, () => {
        const err = new JobTimeoutError(timeoutSeconds);
        controller.abort(err);
        return err;
      });
      if (change) {
        const ended = value as { outcome?: { result?: string; reason?: string }; cancelled_by?: string } | undefined;
        const own = ended?.outcome;
        // A deploy a newer one cancelled (cancel_in_progress, worker/deployCancel.ts) ended as asked: no retry, no dead letter.
        const cancelled = own?.result === 'cancelled' && ended?.cancelled_by !== undefined;
        const result = cancelled ? 'cancelled' : own?.result === 'created' ? 'created' : 'rolled_out';
        const duration_s = Math.round((Date.now() - started) / 100) / 10;
        const outcome: Outcome = { result, ...(own?.reason ? { reason: own.reason } : {}), duration_s };
        await end(change, outcome, cancelled ? 'cancelled' : 'succeeded', cancelled ? ended.cancelled_by : undefined);
      }
      return value;
    } catch (err) {
      interrupted = err instanceof JobCancelledError;
      if (change && isFinal(err, ctx)) {
        const outcome = failureOutcome(err, (Date.now() - started) / 1000);
        await end(change, outcome, outcome.result === 'cancelled' ? 'cancelled' : 'failed');
      } else if (err instanceof DelayedError) {
        await history?.step({ state: passed ? 'queued' : 'held' });
      }
      throw err;
    } finally {
      if (turn?.release && !interrupted)
        await turn.release().catch((err: unknown) => logger.warn('could not end the turn of its group', { err }));
      if (!controller.signal.aborted) controller.abort(new JobCancelledError('attempt finished'));
    }
  };
}
