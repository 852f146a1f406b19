import { z } from 'zod';

/**
 * The queue contract shared by the API (producer) and the worker (consumer): queue name,
 * job names, the schema of each job's data and the default job options.
 * Job names are the contract's worker function names (`ops_worker.<name>`) on queue "ops".
 */
export const QUEUE_NAME = 'ops';

export const JOB = {
  restartService: 'ops_worker.restart_service',
  runDeployPipeline: 'ops_worker.run_deploy_pipeline',
  notifyOncall: 'ops_worker.notify_oncall',
} as const;
export type JobName = (typeof JOB)[keyof typeof JOB];
export const JOB_NAMES: readonly JobName[] = Object.values(JOB);

/**
 * A job name as a metric label: the catalogue's names as they are, anything else (a job added to
 * the queue by something other than the API, e.g. "x2" or "") as "unknown", so label values stay
 * bounded and cannot be chosen by whoever writes to Redis.
 */
export function metricJobName(name: string): JobName | 'unknown' {
  return (JOB_NAMES as readonly string[]).includes(name) ? (name as JobName) : 'unknown';
}

const auditFields = {
  /** Correlates the API request, its audit line, the job and (for deploys) the Kubernetes Job label. */
  audit_id: z.string().min(1).max(64),
  /** Who asked: a credential id (12 hex), or the webhook source. Never a secret. */
  requested_by: z.string().min(1).max(64),
};

/** DNS-1123 label: what a Kubernetes namespace/Deployment name must be. */
export const dnsLabel = z.string().regex(/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/, 'must be a DNS-1123 label');
/** DNS-1123 subdomain (Deployment names may contain dots). */
export const dnsSubdomain = z
  .string()
  .max(253)
  .regex(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/, 'must be a DNS-1123 subdomain');

export const restartServiceData = z.object({
  host: z.string().min(1).max(253),
  service: dnsSubdomain,
  ...auditFields,
});

export const runDeployPipelineData = z.object({
  project: z.string().min(1).max(255),
  ref: z.string().min(1).max(255),
  /** The dedup identity (scm:<project>:<ref>:<sha>) of the event that caused this job. */
  event_id: z.string().min(1).max(1024).optional(),
  /** The pushed commit (checkout_sha / after): the deploy Job gets it as OPSGATE_COMMIT_SHA, so a replay deploys that commit or nothing. */
  sha: z.string().min(1).max(255).optional(),
  /** The sender's delivery id (X-GitHub-Delivery, X-Gitlab-Event-UUID), for tracing. */
  delivery_id: z.string().min(1).max(255).optional(),
  ...auditFields,
});

export const notifyOncallData = z.object({
  alertname: z.string().max(1024),
  annotations: z.record(z.string(), z.unknown()),
  fingerprint: z.string().max(256).optional(),
  ...auditFields,
});

export type RestartServiceData = z.infer<typeof restartServiceData>;
export type RunDeployPipelineData = z.infer<typeof runDeployPipelineData>;
export type NotifyOncallData = z.infer<typeof notifyOncallData>;

export interface JobDataByName {
  [JOB.restartService]: RestartServiceData;
  [JOB.runDeployPipeline]: RunDeployPipelineData;
  [JOB.notifyOncall]: NotifyOncallData;
}

export const jobDataSchemas = {
  [JOB.restartService]: restartServiceData,
  [JOB.runDeployPipeline]: runDeployPipelineData,
  [JOB.notifyOncall]: notifyOncallData,
} as const;

export interface JobPolicy {
  attempts: number;
  backoffMs: number;
}

/**
 * How long a job's identity is remembered, in both processes: a completed job is kept this long
 * (so GET /ops/jobs/{id} can report it), a restart's Idempotency-Key answer names its job this
 * long, and the worker's records of a job's steps (a notification delivered, a restart's
 * restartedAt) live this long. A record keyed by a job id must not outlive the job: a restart
 * asked again with the same Idempotency-Key once both are gone gets the same job id, and a
 * restartedAt left from the first job would turn its patch into a no-op instead of a restart.
 * A day is far longer than a job's tries under the default policy (5 tries from 10 s apart, each
 * at most JOB_TIMEOUT_SECONDS); a dead letter retried after it repeats its steps (notifications
 * are at-least-once, and a retried restart is a new restart).
 */
export const IDEMPOTENCY_TTL_SECONDS = 24 * 3600;

/**
 * Default options of every job on "ops": retries with exponential backoff, then the job stays
 * in the failed set (= dead-lettered) with its reason: removeOnFail is false, nothing is dropped.
 * Completed jobs are kept for IDEMPOTENCY_TTL_SECONDS (and at most 10,000 of them).
 */
export function defaultJobOptions(policy: JobPolicy) {
  return {
    attempts: policy.attempts,
    backoff: { type: 'exponential' as const, delay: policy.backoffMs },
    removeOnComplete: { age: IDEMPOTENCY_TTL_SECONDS, count: 10000 },
    removeOnFail: false,
  };
}
