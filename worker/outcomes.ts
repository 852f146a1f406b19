import type { Job, Worker } from 'bullmq';
import { metricJobName } from '../src/shared/jobs.js';
import type { Logger } from '../src/shared/logger.js';
import type { Metrics } from '../src/shared/metrics.js';

/** The metrics observeJobs updates; the others are optional (a test may pass a subset), read by the jobs' handlers. */
export type JobMetrics = Pick<Metrics, 'jobsProcessed' | 'jobDuration' | 'jobRetries'> & Partial<Metrics>;

/**
 * Every job attempt's outcome as a log line and metrics, the worker's counterpart of the API's
 * src/middleware/observe.ts: completed, retried, dead-lettered, stalled, and the worker's own errors.
 */
export function observeJobs(worker: Worker, { logger, metrics }: { logger: Logger; metrics?: JobMetrics | undefined }): void {
  const count = (job: Job, outcome: 'completed' | 'dead_lettered' | 'retried') => {
    const seconds = job.processedOn ? Math.max(0, Date.now() - job.processedOn) / 1000 : 0;
    metrics?.jobsProcessed.inc({ name: metricJobName(job.name), outcome });
    metrics?.jobDuration.observe({ name: metricJobName(job.name), outcome }, seconds);
    return seconds;
  };
  worker.on('completed', (job) => {
    logger.info('job completed', { job_id: job.id, job_name: job.name, attempt: job.attemptsMade, duration_s: count(job, 'completed') });
  });
  worker.on('failed', (job, err) => {
    if (!job) {
      logger.error('job failed', { err });
      return;
    }
    // BullMQ sets finishedOn only when the job went to the failed set for good (attempts
    // exhausted or UnrecoverableError): that is dead-lettering. Otherwise it is delayed for a retry.
    const final = typeof job.finishedOn === 'number' && job.finishedOn > 0;
    const fields = {
      job_id: job.id,
      job_name: job.name,
      attempt: job.attemptsMade,
      attempts_max: job.opts.attempts ?? 1,
      reason: err.message,
      error_type: err.name,
      duration_s: count(job, final ? 'dead_lettered' : 'retried'),
    };
    if (!final) metrics?.jobRetries.inc({ name: metricJobName(job.name) });
    if (final) logger.error('job dead-lettered', fields);
    else logger.warn('job attempt failed; will retry', { ...fields, retry_in_ms: job.delay || 0 });
  });
  worker.on('stalled', (jobId) => {
    metrics?.jobsStalled?.inc();
    logger.warn('job stalled (its worker stopped renewing the lock); moved back to waiting', { job_id: jobId });
  });
  let lastError = '';
  worker.on('error', (err) => {
    metrics?.workerErrors?.inc();
    // Connection errors repeat while Redis is down: log each distinct message once in a row.
    if (err.message !== lastError) logger.error('worker error', { err });
    lastError = err.message;
  });
}
