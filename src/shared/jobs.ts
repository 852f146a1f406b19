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
  /** A rehearsal: what the worker's own identity would be allowed to do (server-side dry run); changes nothing. */
  dryRun: 'ops_worker.dry_run',
  /** A guarded change's news to the notification endpoints (and its Kubernetes Event where the API cannot write one). */
  reportChange: 'ops_worker.report_change',
  /**
   * Alert-driven remediation's steps in the worker (src/remediation/): a firing alert's check once
   * its rule's `for` has passed, and the watch of a remediation under way (its approval or job, its
   * silence, the verification of its outcome).
   */
  remediate: 'ops_worker.remediate',
  /**
   * A deploy's state told to the host of its commit (GitHub, GitLab, Gitea, Bitbucket: a deployment
   * status or a commit status, worker/jobs/reportStatus.ts): one job per deploy and state, added by
   * the worker as it records the step, so a host that cannot be reached never holds a deploy up.
   */
  reportStatus: 'ops_worker.report_status',
} as const;
export type JobName = (typeof JOB)[keyof typeof JOB];
const JOB_NAMES: readonly JobName[] = Object.values(JOB);

/**
 * A job name as a metric label: the catalogue's names as they are, anything else (a job added to
 * the queue by something other than the API, e.g. "x2" or "") as "unknown", so label values stay
 * bounded and cannot be chosen by whoever writes to Redis.
 */
export function metricJobName(name: string): JobName | 'unknown' {
  return (JOB_NAMES as readonly string[]).includes(name) ? (name as JobName) : 'unknown';
}

/**
 * The longest identity a job records (requested_by, approvers, override.by): a principal such as
 * `key:<id>` or an owner. The configuration refuses any credential whose principal or owner would
 * not fit (src/api/identity.ts), so every accepted caller can be written into every job.
 */
export const MAX_PRINCIPAL = 256;

const auditFields = {
  /** Correlates the API request, its audit line, the job and (for deploys) the Kubernetes Job label. */
  audit_id: z.string().min(1).max(64),
  /** Who asked: a credential id (12 hex), or the webhook source. Never a secret. */
  requested_by: z.string().min(1).max(MAX_PRINCIPAL),
};

/** DNS-1123 label: what a Kubernetes namespace/Deployment name must be. */
export const dnsLabel = z.string().regex(/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/, 'must be a DNS-1123 label');
/** DNS-1123 subdomain (Deployment names may contain dots). */
export const dnsSubdomain = z
  .string()
  .max(253)
  .regex(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/, 'must be a DNS-1123 subdomain');

/** A guarded change's approval, carried by the job it let through (and shown in its Kubernetes Event). */
const approvalFields = {
  /** The approval that let the change through; the job id is the approval id. */
  approval_id: z.string().min(1).max(64).optional(),
  /** Who approved it (principals, never secrets). */
  approvers: z.array(z.string().min(1).max(MAX_PRINCIPAL)).max(6).optional(),
  /** The requester's reason, when given. */
  reason: z.string().max(500).optional(),
};

/** Who asked, as a person: the owner of the requester's credential and that credential's id (never a secret). */
const requesterFields = {
  requested_owner: z.string().min(1).max(MAX_PRINCIPAL).optional(),
  requested_credential: z.string().min(1).max(64).optional(),
};

/**
 * A change let through a freeze or outside its windows by an operator: who (principal and owner),
 * why, and which gate reasons it covers (`freeze:<id>`, `window`); a freeze declared after it is
 * not covered, and the worker refuses the restart (holds the deploy) when it meets one (audited, notified).
 */
const overrideField = z
  .object({
    by: z.string().min(1).max(MAX_PRINCIPAL),
    owner: z.string().min(1).max(MAX_PRINCIPAL).optional(),
    reason: z.string().min(1).max(500),
    covers: z.array(z.string().min(1).max(128)).max(64).optional(),
  })
  .optional();

const restartServiceData = z.object({
  host: z.string().min(1).max(253),
  service: dnsSubdomain,
  ...approvalFields,
  override: overrideField,
  ...requesterFields,
  ...auditFields,
});

const runDeployPipelineData = z.object({
  project: z.string().min(1).max(255),
  ref: z.string().min(1).max(255),
  /** The dedup identity (scm:<project>:<ref>:<sha>) of the event that caused this job. */
  event_id: z.string().min(1).max(1024).optional(),
  /** The pushed commit (checkout_sha / after): the deploy Job gets it as OPSGATE_COMMIT_SHA, so a replay deploys that commit or nothing. */
  sha: z.string().min(1).max(255).optional(),
  /** The sender's delivery id (X-GitHub-Delivery, X-Gitlab-Event-UUID), for tracing. */
  delivery_id: z.string().min(1).max(255).optional(),
  /**
   * The webhook sender whose push (or its replay) this deploy is: a deploy of it that never runs
   * or is cancelled is appended to that sender's deliveries log (src/domain/deliveries.ts).
   */
  source: z
    .string()
    .regex(/^[a-z][a-z0-9-]{0,62}$/)
    .optional(),
  /**
   * A resubmission of a deploy accepted earlier (a retry, a replay, an approval): that acceptance
   * (ms, and the id it was accepted under), its place in its group's order. Absent: the job's own
   * timestamp and id (src/changes/deployOrder/).
   */
  accepted_at: z.number().int().min(0).optional(),
  accepted_id: z.string().min(1).max(128).optional(),
  /**
   * A rollback (POST /ops/deploys/rollback): the deploy Job gets OPSGATE_ROLLBACK=true;
   * `rolled_back_from` names the deploy it goes back from (absent: none was current).
   */
  rollback: z.literal(true).optional(),
  rolled_back_from: z.string().min(1).max(128).optional(),
  /** A rollback a person let through a freeze or outside the project's windows. */
  override: overrideField,
  ...approvalFields,
  ...requesterFields,
  ...auditFields,
});

const notifyOncallData = z.object({
  alertname: z.string().max(1024),
  annotations: z.record(z.string(), z.unknown()),
  fingerprint: z.string().max(256).optional(),
  ...auditFields,
});

/** What a dry run rehearses: the worker's server-side dry run of the patch or the Job create. */
const dryRunData = z.discriminatedUnion('change', [
  z.object({ change: z.literal('restart'), host: z.string().min(1).max(253), service: dnsSubdomain, ...auditFields }),
  z.object({
    change: z.literal('deploy'),
    project: z.string().min(1).max(255),
    ref: z.string().min(1).max(255),
    sha: z.string().min(1).max(255).optional(),
    ...auditFields,
  }),
]);

/**
 * What a dry run found (its job's return value): the object the change would touch as the worker
 * reads it, and whether the Kubernetes API server admits the change from the worker's own
 * identity (RBAC, then admission: ValidatingAdmissionPolicies and webhooks), asked with a
 * server-side dry run (dryRun=All), which persists nothing.
 */
const DRY_RUN_REFUSALS = ['rbac', 'admission', 'not_found', 'invalid', 'api'] as const;
export const dryRunResultSchema = z.object({
  identity: z.string().nullable().describe("the worker's user name as the API server sees it (SelfSubjectReview), when it may ask"),
  object: z
    .object({
      kind: z.enum(['Deployment', 'Job']),
      namespace: z.string(),
      name: z.string(),
      found: z.boolean().nullable().describe('Deployment: read with the worker identity (null: it may not read it)'),
      resource_version: z.string().nullable(),
      replicas: z.number().int().nullable(),
      ready_replicas: z.number().int().nullable(),
      updated_replicas: z.number().int().nullable(),
      paused: z.boolean().nullable(),
      progress_deadline_seconds: z.number().int().nullable(),
      rollout: z
        .object({ done: z.boolean(), failed: z.boolean(), message: z.string() })
        .nullable()
        .describe('as `kubectl rollout status` tells it: a rollout in progress, done, or past its progress deadline'),
      service_account: z.string().nullable().describe('Job: the ServiceAccount it would run as'),
      image: z.string().nullable().describe('Job: its image'),
    })
    .nullable(),
  admitted: z.boolean().describe('the API server accepted the dry-run patch (restart) or create (deploy) from the worker identity'),
  refused_by: z
    .enum(DRY_RUN_REFUSALS)
    .nullable()
    .describe(
      'rbac: the worker may not; admission: a ValidatingAdmissionPolicy or webhook refused; not_found; invalid; api: another answer',
    ),
  status: z.number().int().nullable().describe("the API server's HTTP status"),
  message: z.string().nullable().describe("the API server's message"),
});
export type DryRunResult = z.infer<typeof dryRunResultSchema>;

/** How a restart or deploy ended (GET /ops/jobs/{id}, its Kubernetes Event, the notification). */
const OUTCOME_RESULTS = [
  'rolled_out',
  'created',
  'failed',
  'progress_deadline_exceeded',
  'refused',
  'held',
  'rejected',
  'expired',
  /** A deploy that never ran: a deploy of its group accepted after it started, or waits to (the reason names it). */
  'superseded',
  /** A running deploy whose Kubernetes Job a newer deploy of its group deleted as it came to run (cancel_in_progress). */
  'cancelled',
] as const;
export type OutcomeResult = (typeof OUTCOME_RESULTS)[number];

export const outcomeSchema = z.object({
  result: z.enum(OUTCOME_RESULTS),
  reason: z.string().max(1000).optional(),
  duration_s: z.number().min(0).optional(),
  /** A hold: when the change is expected to run (RFC 3339). */
  until: z.string().optional(),
});
export type Outcome = z.infer<typeof outcomeSchema>;

const REPORT_EVENTS = ['approval_requested', 'approval_rejected', 'approval_expiry', 'override', 'held', 'outcome', 'remediation'] as const;

/** A remediation's news (event `remediation`): the rule, the alert, what was decided and why. */
const remediationReportSchema = z.object({
  rule: z.string().max(63),
  mode: z.enum(['act', 'dry-run']),
  alertname: z.string().max(1024),
  fingerprint: z.string().max(256),
  decision: z.string().max(64),
  outcome: z.string().max(64).optional(),
  /** The rule's remediations of the Deployment in its escalation window (RFC 3339 times), when it escalates. */
  history: z
    .array(z.object({ id: z.string().max(128), at: z.string().max(64) }))
    .max(100)
    .optional(),
});

/**
 * A report about a guarded change, posted to NOTIFY_WEBHOOK_URLS. approval_expiry is added
 * delayed until the approval's expiry: when it runs, it expires the approval if nobody decided it
 * and reports that.
 */
const reportChangeData = z.object({
  event: z.enum(REPORT_EVENTS),
  /** The kind of change (src/changes/kinds/): restart, deploy, or one a module registers. */
  change: z.string().regex(/^[a-z][a-z0-9_]{0,31}$/),
  /** The restart's host and Deployment, or the deploy's project and ref. */
  host: z.string().max(253).optional(),
  service: z.string().max(253).optional(),
  project: z.string().max(255).optional(),
  ref: z.string().max(255).optional(),
  namespace: z.string().max(63),
  /** The job the report is about (for an approval: the job it lets through, same id). */
  job_id: z.string().max(128).optional(),
  approval_id: z.string().max(64).optional(),
  outcome: outcomeSchema.optional(),
  approvers: z.array(z.string().max(MAX_PRINCIPAL)).max(6).default([]),
  reason: z.string().max(1000).optional(),
  remediation: remediationReportSchema.optional(),
  ...auditFields,
});

/** An alert as a remediation step carries it: its full label set, fingerprint and startsAt (ms). */
const remediationAlert = z.object({
  labels: z.record(z.string().max(1024), z.string().max(4096)),
  fingerprint: z.string().min(1).max(256),
  starts_at: z.number().int().min(0),
});

const remediateData = z.discriminatedUnion('step', [
  /**
   * A firing alert, looked at again: once its rule's `for` has passed, or after its confirmation
   * failed (asked again with backoff until the rule's `within` has passed since `notified_at`).
   */
  z.object({
    step: z.literal('check'),
    rule: z.string().min(1).max(63),
    alert: remediationAlert,
    /** When the notification came (ms): the retries of a failed confirmation end `within` after it. */
    notified_at: z.number().int().min(0).optional(),
    ...auditFields,
  }),
  /** A remediation under way: its approval or job, its silence, its verification. */
  z.object({
    step: z.literal('watch'),
    rule: z.string().min(1).max(63),
    fingerprint: z.string().min(1).max(256),
    id: z.string().min(1).max(128),
    ...auditFields,
  }),
]);

/** The hosts whose API is told the state of a deploy of one of their commits. */
export const STATUS_SENDERS = ['github', 'gitlab', 'gitea', 'bitbucket'] as const;
export type StatusSender = (typeof STATUS_SENDERS)[number];

const reportStatusData = z.object({
  /** The deploy (its history entry, GET /ops/deploys/{id}). */
  deploy_id: z.string().min(1).max(128),
  sender: z.enum(STATUS_SENDERS),
  /** The repository as the sender names it (GitLab: the project's path), the inventory's project. */
  project: z.string().min(1).max(255),
  ref: z.string().min(1).max(255),
  sha: z.string().min(1).max(255),
  /** The deploy's state in opsgate's history (src/changes/deployOrder/history.ts DEPLOY_STATES). */
  state: z.string().regex(/^[a-z_]{1,32}$/),
  /** The project's `environment` (its ref when the inventory names none). */
  environment: z.string().min(1).max(255),
  /** GitHub: a deployment and its statuses, or commit statuses (the inventory's `status: commit`). */
  mode: z.enum(['deployment', 'commit']),
  /** What the state's description adds (the superseding deploy). */
  detail: z.string().max(200).optional(),
  ...auditFields,
});

export type RestartServiceData = z.infer<typeof restartServiceData>;
export type ReportStatusData = z.infer<typeof reportStatusData>;
export type DryRunData = z.infer<typeof dryRunData>;
export type ReportChangeData = z.infer<typeof reportChangeData>;
export type RunDeployPipelineData = z.infer<typeof runDeployPipelineData>;
export type NotifyOncallData = z.infer<typeof notifyOncallData>;
export type RemediateData = z.infer<typeof remediateData>;

export interface JobDataByName {
  [JOB.restartService]: RestartServiceData;
  [JOB.runDeployPipeline]: RunDeployPipelineData;
  [JOB.notifyOncall]: NotifyOncallData;
  [JOB.dryRun]: DryRunData;
  [JOB.reportChange]: ReportChangeData;
  [JOB.remediate]: RemediateData;
  [JOB.reportStatus]: ReportStatusData;
}

export const jobDataSchemas = {
  [JOB.restartService]: restartServiceData,
  [JOB.runDeployPipeline]: runDeployPipelineData,
  [JOB.notifyOncall]: notifyOncallData,
  [JOB.dryRun]: dryRunData,
  [JOB.reportChange]: reportChangeData,
  [JOB.remediate]: remediateData,
  [JOB.reportStatus]: reportStatusData,
} as const;

/**
 * Jobs beyond the catalog above: a kind of change registered by its module (src/changes/kinds/
 * registerKind) brings its job's name and data schema, so the producer, the worker and a dead
 * letter's retry parse its data as they parse the catalog's.
 */
const registeredSchemas = new Map<string, z.ZodType>();

/** Registers a job's data schema under its name (not one of the catalog's); returns its removal. */
export function registerJobSchema(name: string, schema: z.ZodType): () => void {
  if (Object.hasOwn(jobDataSchemas, name) || registeredSchemas.has(name)) throw new Error(`a job named ${name} is registered already`);
  registeredSchemas.set(name, schema);
  return () => registeredSchemas.delete(name);
}

/**
 * A dry run of a registered kind whose rehearsal is its own (src/changes/kinds/ registerKind): the
 * dry_run job's data is the catalog's union or one of these, by its `change`.
 */
const registeredDryRuns = new Map<string, z.ZodType>();
let dryRunSchema: z.ZodType = dryRunData;

function rebuildDryRunSchema(): void {
  const own = [...registeredDryRuns.values()];
  dryRunSchema = own.length === 0 ? dryRunData : z.union([dryRunData, ...own]);
}

/** Registers the dry_run data of a kind named `change` (not restart or deploy); returns its removal. */
export function registerDryRunSchema(change: string, schema: z.ZodType): () => void {
  if (registeredDryRuns.has(change) || dryRunData.options.some((o) => o.shape.change.value === change)) {
    throw new Error(`a dry run of ${change} is registered already`);
  }
  registeredDryRuns.set(change, schema);
  rebuildDryRunSchema();
  return () => {
    registeredDryRuns.delete(change);
    rebuildDryRunSchema();
  };
}

/** The data schema of a job of the catalog or registered; undefined for a name nobody knows. */
export function jobSchemaOf(name: string): z.ZodType | undefined {
  if (name === JOB.dryRun) return dryRunSchema;
  return Object.hasOwn(jobDataSchemas, name) ? jobDataSchemas[name as JobName] : registeredSchemas.get(name);
}

/** Job data that came out of its schema's parse in this process (parseJobData): not parsed again. */
const parsedJobData = new WeakSet<object>();

/**
 * Parses job data against its job's schema, as the producer would; a success's data is remembered,
 * so the producer adds it without parsing it a second time. The data must not be changed after.
 */
export function parseJobData<N extends JobName>(name: N, data: unknown): z.ZodSafeParseResult<JobDataByName[N]> {
  const parsed = jobSchemaOf(name)!.safeParse(data) as z.ZodSafeParseResult<JobDataByName[N]>;
  if (parsed.success) parsedJobData.add(parsed.data);
  return parsed;
}

/** The data is parseJobData's answer for this job (the same object). */
export function isParsedJobData(data: unknown): boolean {
  return typeof data === 'object' && data !== null && parsedJobData.has(data);
}

/** A dry run's answer is wanted within seconds or not at all: kept an hour, tried once. */
export const DRY_RUN_JOB_OPTIONS = { attempts: 1, removeOnComplete: { age: 3600 }, removeOnFail: { age: 3600 } } as const;

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
