import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

/**
 * Every metric opsgate exports, in one place (prefix opsgate_). Each process (api, worker)
 * builds its own registry with createMetrics(); tests build as many as they like.
 * Label values are bounded: route templates (never raw paths), job names from the catalog,
 * fixed outcome/reason words.
 */
export type Component = 'api' | 'worker';

export function createMetrics(component: Component, version: string, opts: { defaults?: boolean } = {}) {
  const registry = new Registry();
  if (opts.defaults !== false) collectDefaultMetrics({ register: registry });

  const buildInfo = new Gauge({
    name: 'opsgate_build_info',
    help: 'Build information; the value is always 1.',
    labelNames: ['version', 'component', 'node_version'] as const,
    registers: [registry],
  });
  buildInfo.set({ version, component, node_version: process.version }, 1);

  const httpRequests = new Counter({
    name: 'opsgate_http_requests_total',
    help: 'HTTP requests answered, by method, route template and status code.',
    labelNames: ['method', 'route', 'status'] as const,
    registers: [registry],
  });
  const httpDuration = new Histogram({
    name: 'opsgate_http_request_duration_seconds',
    help: 'HTTP request latency, by method, route template and status code.',
    labelNames: ['method', 'route', 'status'] as const,
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
    registers: [registry],
  });
  const webhookEvents = new Counter({
    name: 'opsgate_webhook_events_total',
    help: 'Webhook deliveries by source and outcome (accepted, duplicate, ignored, rejected, invalid, failed).',
    labelNames: ['source', 'outcome'] as const,
    registers: [registry],
  });
  const authFailures = new Counter({
    name: 'opsgate_auth_failures_total',
    help: 'Rejected credentials by scheme (api_key, bearer, scm_token, signature, basic) and reason.',
    labelNames: ['scheme', 'reason'] as const,
    registers: [registry],
  });
  const jobsEnqueued = new Counter({
    name: 'opsgate_jobs_enqueued_total',
    help: 'Jobs put on the queue by the API, by job name.',
    labelNames: ['name'] as const,
    registers: [registry],
  });
  const rateLimited = new Counter({
    name: 'opsgate_rate_limited_requests_total',
    help: 'Requests refused with 429 by the per-address rate limit.',
    registers: [registry],
  });
  const jobsProcessed = new Counter({
    name: 'opsgate_jobs_processed_total',
    help: 'Job attempts finished by the worker, by job name and outcome (completed, retried, dead_lettered).',
    labelNames: ['name', 'outcome'] as const,
    registers: [registry],
  });
  const jobDuration = new Histogram({
    name: 'opsgate_job_duration_seconds',
    help: 'Duration of job attempts, by job name and outcome.',
    labelNames: ['name', 'outcome'] as const,
    buckets: [0.01, 0.05, 0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600, 900],
    registers: [registry],
  });
  const jobRetries = new Counter({
    name: 'opsgate_job_retries_total',
    help: 'Failed job attempts that will be retried, by job name.',
    labelNames: ['name'] as const,
    registers: [registry],
  });

  return {
    registry,
    buildInfo,
    httpRequests,
    httpDuration,
    webhookEvents,
    authFailures,
    jobsEnqueued,
    rateLimited,
    jobsProcessed,
    jobDuration,
    jobRetries,
  };
}

export type Metrics = ReturnType<typeof createMetrics>;
