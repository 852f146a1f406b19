import { UnrecoverableError, type Job } from 'bullmq';
import { JOB, jobDataSchemas, type JobName } from '../src/shared/jobs.js';
import { withTimeout } from '../src/shared/timeout.js';
import type { Handler, JobContext } from './context.js';
import { runDeployPipeline } from './jobs/deploy.js';
import { notifyOncall } from './jobs/notify.js';
import { restartService } from './jobs/restart.js';

/**
 * The worker's processor: dispatch by job name to its handler, with
 * - validation: an unknown job name or data failing the job's zod schema is an
 *   UnrecoverableError (dead-lettered at once: retrying cannot fix it);
 * - the per-attempt timeout (JOB_TIMEOUT_SECONDS, the contract's 900 s by default): the handler's
 *   AbortSignal is aborted at the deadline and the attempt fails with "timed out after Ns"
 *   (retried per policy), even if the handler ignores the signal;
 * - shutdown: BullMQ's own signal (worker.cancelAllJobs) aborts the handler too.
 */
export const handlers: { [N in JobName]: Handler<never> } = {
  [JOB.restartService]: restartService,
  [JOB.runDeployPipeline]: runDeployPipeline,
  [JOB.notifyOncall]: notifyOncall,
};

export class JobTimeoutError extends Error {
  constructor(seconds: number) {
    super(`timed out after ${seconds}s`);
    this.name = 'JobTimeoutError';
  }
}

export class JobCancelledError extends Error {
  constructor(reason: string) {
    super(reason);
    this.name = 'JobCancelledError';
  }
}

function isJobName(name: string): name is JobName {
  return Object.hasOwn(handlers, name);
}

export type Processor = (job: Job, token?: string, signal?: AbortSignal) => Promise<unknown>;

export function createProcessor(base: Omit<JobContext, 'job' | 'signal' | 'logger'> & { logger: JobContext['logger'] }): Processor {
  const timeoutSeconds = base.config.JOB_TIMEOUT_SECONDS;
  // Three declared parameters: BullMQ passes the cancellation signal only to processors that take it.
  return async function process(job: Job, _token?: string, bullSignal?: AbortSignal): Promise<unknown> {
    if (!isJobName(job.name)) {
      throw new UnrecoverableError(`unknown job name ${JSON.stringify(job.name).slice(0, 200)}`);
    }
    const parsed = jobDataSchemas[job.name].safeParse(job.data);
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
    const handler = handlers[job.name] as Handler<unknown>;
    const run = handler(parsed.data, { ...base, job, signal: controller.signal, logger });
    try {
      return await withTimeout(Promise.race([run, cancelled]), timeoutSeconds * 1000, () => {
        const err = new JobTimeoutError(timeoutSeconds);
        controller.abort(err);
        return err;
      });
    } finally {
      if (!controller.signal.aborted) controller.abort(new JobCancelledError('attempt finished'));
    }
  };
}
