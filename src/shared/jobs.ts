import { z } from 'zod';

/** The queue contract of the API (producer) and the worker (consumer); job names are the contract's `ops_worker.<name>`. */
export const QUEUE_NAME = 'ops';

export const JOB = {
  restartService: 'ops_worker.restart_service',
  runDeployPipeline: 'ops_worker.run_deploy_pipeline',
  notifyOncall: 'ops_worker.notify_oncall',
  /** What the worker's own identity would be allowed to do (server-side dry run); changes nothing. */
  dryRun: 'ops_worker.dry_run',
  /** A guarded change's news to the notification endpoints (and its Kubernetes Event where the API cannot write one). */
  reportChange: 'ops_worker.report_change',
  /** Alert-driven remediation's steps (src/remediation/): a firing alert's check, the watch of a remediation under way. */
  remediate: 'ops_worker.remediate',
  /** A deploy's state told to the host of its commit: its own job, so a host that cannot be reached never holds a deploy up. */
  reportStatus: 'ops_worker.report_status',
} as const;
export type JobName = (typeof JOB)[keyof typeof JOB];
const JOB_NAMES: readonly JobName[] = Object.values(JOB);

/** A job name as a metric label: a name outside the catalogue is "unknown", so whoever writes to Redis cannot choose label values. */
export function metricJobName(name: string): JobName | 'unknown' {
  return (JOB_NAMES as readonly string[]).includes(name) ? (name as JobName) : 'unknown';
}

/** The longest identity a job records; the configuration refuses any credential that would not fit (src/api/identity.ts). */
export const MAX_PRINCIPAL = 256;

const auditFields = {
  /** Correlates the request, its audit line, the job and a deploy's Kubernetes Job label. */
  audit_id: z.string().min(1).max(64),
  /** Who asked: a credential id (12 hex), or the webhook source. Never a secret. */
  requested_by: z.string().min(1).max(MAX_PRINCIPAL),
};

export const dnsLabel = z.string().regex(/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/, 'must be a DNS-1123 label');
export const dnsSubdomain = z
  .string()
  .max(253)
  .regex(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/, 'must be a DNS-1123 subdomain');

/** A guarded change's approval, carried by the job it let through (whose id is the approval id). */
const approvalFields = {
  approval_id: z.string().min(1).max(64).optional(),
  approvers: z.array(z.string().min(1).max(MAX_PRINCIPAL)).max(6).optional(),
  reason: z.string().max(500).optional(),
};

/** Who asked, as a person: the owner of the requester's credential and its id (never a secret). */
const requesterFields = {
  requested_owner: z.string().min(1).max(MAX_PRINCIPAL).optional(),
  requested_credential: z.string().min(1).max(64).optional(),
};

/**
 * A change an operator let through a freeze or outside its windows, and the gate reasons it covers
 * (`freeze:<id>`, `window`): the worker refuses (holds) a change that meets a freeze declared after it.
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
  /** scm:<project>:<ref>:<sha>, the dedup identity of the event. */
  event_id: z.string().min(1).max(1024).optional(),
  /** The deploy Job gets it as OPSGATE_COMMIT_SHA, so a replay deploys that commit or nothing. */
  sha: z.string().min(1).max(255).optional(),
  delivery_id: z.string().min(1).max(255).optional(),
  /** The webhook sender whose push this is: a deploy of it that never runs is appended to its deliveries log. */
  source: z
    .string()
    .regex(/^[a-z][a-z0-9-]{0,62}$/)
    .optional(),
  /** A resubmission's first acceptance (ms, id): its place in its group's order; absent: the job's own. */
  accepted_at: z.number().int().min(0).optional(),
  accepted_id: z.string().min(1).max(128).optional(),
  /** A rollback: the deploy Job gets OPSGATE_ROLLBACK=true; `rolled_back_from`: the deploy it goes back from. */
  rollback: z.literal(true).optional(),
  rolled_back_from: z.string().min(1).max(128).optional(),
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
 * A dry run's return value: the object the change would touch, and whether the API server admits
 * the change from the worker's own identity (RBAC, then admission), asked with dryRun=All.
 */
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
    .enum(['rbac', 'admission', 'not_found', 'invalid', 'api'])
    .nullable()
    .describe(
      'rbac: the worker may not; admission: a ValidatingAdmissionPolicy or webhook refused; not_found; invalid; api: another answer',
    ),
  status: z.number().int().nullable().describe("the API server's HTTP status"),
  message: z.string().nullable().describe("the API server's message"),
});
export type DryRunResult = z.infer<typeof dryRunResultSchema>;

/** How a restart or deploy ended. */
const OUTCOME_RESULTS = [
  'rolled_out',
  'created',
  'failed',
  'progress_deadline_exceeded',
  'refused',
  'held',
  'rejected',
  'expired',
  /** A deploy that never ran: a newer one of its group started or waits to. */
  'superseded',
  /** A running deploy whose Job a newer deploy of its group deleted (cancel_in_progress). */
  'cancelled',
] as const;
export type OutcomeResult = (typeof OUTCOME_RESULTS)[number];

export const outcomeSchema = z.object({
  result: z.enum(OUTCOME_RESULTS),
  reason: z.string().max(1000).optional(),
  duration_s: z.number().min(0).optional(),
  /** A hold: when the change is expected to run. */
  until: z.string().optional(),
});
export type Outcome = z.infer<typeof outcomeSchema>;

const REPORT_EVENTS = ['approval_requested', 'approval_rejected', 'approval_expiry', 'override', 'held', 'outcome', 'remediation'] as const;

const remediationReportSchema = z.object({
  rule: z.string().max(63),
  mode: z.enum(['act', 'dry-run']),
  alertname: z.string().max(1024),
  fingerprint: z.string().max(256),
  decision: z.string().max(64),
  outcome: z.string().max(64).optional(),
  /** When it escalates: the rule's remediations of the Deployment in its escalation window. */
  history: z
    .array(z.object({ id: z.string().max(128), at: z.string().max(64) }))
    .max(100)
    .optional(),
});

/** A report posted to NOTIFY_WEBHOOK_URLS; approval_expiry runs at the expiry and expires an approval nobody decided. */
const reportChangeData = z.object({
  event: z.enum(REPORT_EVENTS),
  /** restart, deploy, or a kind a module registers (src/changes/kinds/). */
  change: z.string().regex(/^[a-z][a-z0-9_]{0,31}$/),
  host: z.string().max(253).optional(),
  service: z.string().max(253).optional(),
  project: z.string().max(255).optional(),
  ref: z.string().max(255).optional(),
  namespace: z.string().max(63),
  job_id: z.string().max(128).optional(),
  approval_id: z.string().max(64).optional(),
  outcome: outcomeSchema.optional(),
  approvers: z.array(z.string().max(MAX_PRINCIPAL)).max(6).default([]),
  reason: z.string().max(1000).optional(),
  remediation: remediationReportSchema.optional(),
  ...auditFields,
});

/** An alert as a remediation step carries it; starts_at in ms. */
const remediationAlert = z.object({
  labels: z.record(z.string().max(1024), z.string().max(4096)),
  fingerprint: z.string().min(1).max(256),
  starts_at: z.number().int().min(0),
});

const remediateData = z.discriminatedUnion('step', [
  /** A firing alert, looked at again once its rule's `for` has passed or its confirmation failed. */
  z.object({
    step: z.literal('check'),
    rule: z.string().min(1).max(63),
    alert: remediationAlert,
    /** When the notification came (ms): a failed confirmation is retried until `within` after it. */
    notified_at: z.number().int().min(0).optional(),
    ...auditFields,
  }),
  z.object({
    step: z.literal('watch'),
    rule: z.string().min(1).max(63),
    fingerprint: z.string().min(1).max(256),
    id: z.string().min(1).max(128),
    ...auditFields,
  }),
]);

export const STATUS_SENDERS = ['github', 'gitlab', 'gitea', 'bitbucket'] as const;
export type StatusSender = (typeof STATUS_SENDERS)[number];

const reportStatusData = z.object({
  deploy_id: z.string().min(1).max(128),
  sender: z.enum(STATUS_SENDERS),
  /** The inventory's project: the repository as the sender names it. */
  project: z.string().min(1).max(255),
  ref: z.string().min(1).max(255),
  sha: z.string().min(1).max(255),
  /** One of DEPLOY_STATES (src/changes/deployOrder/history.ts). */
  state: z.string().regex(/^[a-z_]{1,32}$/),
  /** The project's `environment` (its ref when the inventory names none). */
  environment: z.string().min(1).max(255),
  /** GitHub: a deployment and its statuses, or commit statuses. */
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

export type JobDataByName = { [N in JobName]: z.infer<(typeof jobDataSchemas)[N]> };

export const jobDataSchemas = {
  [JOB.restartService]: restartServiceData,
  [JOB.runDeployPipeline]: runDeployPipelineData,
  [JOB.notifyOncall]: notifyOncallData,
  [JOB.dryRun]: dryRunData,
  [JOB.reportChange]: reportChangeData,
  [JOB.remediate]: remediateData,
  [JOB.reportStatus]: reportStatusData,
} as const;

/** The jobs of kinds registered by their module (src/changes/kinds/), parsed as the catalog's are. */
const registeredSchemas = new Map<string, z.ZodType>();

/** Registers a job's data schema under its name (not one of the catalog's); returns its removal. */
export function registerJobSchema(name: string, schema: z.ZodType): () => void {
  if (Object.hasOwn(jobDataSchemas, name) || registeredSchemas.has(name)) throw new Error(`a job named ${name} is registered already`);
  registeredSchemas.set(name, schema);
  return () => registeredSchemas.delete(name);
}

/** The dry_run data of registered kinds whose rehearsal is their own, by `change`. */
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

const parsedJobData = new WeakSet<object>();

/** Parses job data as the producer would, remembering a success so the producer does not parse it again (it must not change after). */
export function parseJobData<N extends JobName>(name: N, data: unknown): z.ZodSafeParseResult<JobDataByName[N]> {
  const parsed = jobSchemaOf(name)!.safeParse(data) as z.ZodSafeParseResult<JobDataByName[N]>;
  if (parsed.success) parsedJobData.add(parsed.data);
  return parsed;
}

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
 * How long a job's identity is remembered: a completed job, a restart's Idempotency-Key answer,
 * the worker's records of a job's steps. A record keyed by a job id must not outlive the job: a
 * restart asked again with the same key once both are gone gets the same job id, and a leftover
 * restartedAt would turn its patch into a no-op. A day is far longer than a job's tries.
 */
export const IDEMPOTENCY_TTL_SECONDS = 24 * 3600;

/** Retries with exponential backoff, then the job stays in the failed set (dead-lettered): nothing is dropped. */
export function defaultJobOptions(policy: JobPolicy) {
  return {
    attempts: policy.attempts,
    backoff: { type: 'exponential' as const, delay: policy.backoffMs },
    removeOnComplete: { age: IDEMPOTENCY_TTL_SECONDS, count: 10000 },
    removeOnFail: false,
  };
}
