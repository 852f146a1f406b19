import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import { withTimeout } from './timeout.js';

/** opsgate_queue_jobs' states. "failed" is the dead-letter set (attempts exhausted or unrecoverable), also opsgate_dead_letter_jobs. */
const QUEUE_STATES = ['waiting', 'active', 'delayed', 'prioritized', 'paused', 'failed'] as const;

/** Where queue depth is read from at scrape time: one entry per queue. */
interface QueueCountsSource {
  queue: string;
  counts(): Promise<Partial<Record<string, number>>>;
}

/** A QueueCountsSource over BullMQ's Queue#getJobCounts (structural: no bullmq import here), one Redis round trip. */
export function queueCountsSource(queue: {
  readonly name: string;
  getJobCounts(...types: string[]): Promise<Record<string, number>>;
}): QueueCountsSource {
  return { queue: queue.name, counts: () => queue.getJobCounts(...QUEUE_STATES) };
}

type MemoryUse = { used: number; max: number };

/** Reads used_memory and maxmemory from INFO memory of any client with ioredis' info(). */
export function redisMemoryReader(client: { info(section: 'memory'): Promise<string> }): () => Promise<MemoryUse> {
  return async () => {
    const text = await client.info('memory');
    const field = (name: string) => Number(new RegExp(`^${name}:(\\d+)`, 'm').exec(text)?.[1] ?? NaN);
    const used = field('used_memory');
    const max = field('maxmemory');
    if (!Number.isFinite(used) || !Number.isFinite(max)) throw new Error('INFO memory without used_memory/maxmemory');
    return { used, max };
  };
}

/** Upper bound of one scrape's Redis read; past it the depth samples are skipped for that scrape. */
const QUEUE_SCRAPE_TIMEOUT_MS = 1500;

/** One read shared by the collects of one scrape (they run at once); the next scrape reads again. */
function perScrape<T>(read: () => Promise<T>): () => Promise<T> {
  let inflight: Promise<T> | undefined;
  return () => (inflight ??= read().finally(() => setImmediate(() => (inflight = undefined))));
}

/**
 * Every metric opsgate exports (prefix opsgate_), in a registry per process. Label values are
 * bounded: route templates (never raw paths), job names from the catalog, fixed words.
 */
export function createMetrics(component: 'api' | 'worker', version: string, opts: { defaults?: boolean } = {}) {
  const registry = new Registry();
  if (opts.defaults !== false) {
    collectDefaultMetrics({ register: registry });
    // prom-client's nodejs_active_{handles,requests,resources}_total are gauges with a counter's
    // suffix (promtool check metrics flags them); the same numbers by type remain in
    // nodejs_active_handles / nodejs_active_requests / nodejs_active_resources (sum() for a total).
    for (const name of ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total']) {
      if (registry.getSingleMetric(name)) registry.removeSingleMetric(name);
    }
  }

  const counter = <const L extends string>(name: string, labelNames: readonly L[], help: string) =>
    new Counter<L>({ name, help, labelNames, registers: [registry] });
  /** `collect`: the gauge is set at scrape time. */
  const gauge = <const L extends string>(
    name: string,
    labelNames: readonly L[],
    help: string,
    collect?: (this: Gauge<L>) => Promise<void>,
  ) => new Gauge<L>({ name, help, labelNames, registers: [registry], collect });

  gauge('opsgate_build_info', ['version', 'component', 'node_version'], 'Build information; the value is always 1.').set(
    { version, component, node_version: process.version },
    1,
  );

  const requestsAndJobs = {
    httpRequests: counter(
      'opsgate_http_requests_total',
      ['method', 'route', 'status'],
      'HTTP requests answered, by method, route template and status code.',
    ),
    httpDuration: new Histogram({
      name: 'opsgate_http_request_duration_seconds',
      help: 'HTTP request latency, by method, route template and status code.',
      labelNames: ['method', 'route', 'status'] as const,
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
      registers: [registry],
    }),
    webhookEvents: counter(
      'opsgate_webhook_events_total',
      ['source', 'outcome'],
      'Webhook deliveries by source and outcome (accepted, duplicate, ignored, rejected, invalid, failed).',
    ),
    authFailures: counter(
      'opsgate_auth_failures_total',
      ['scheme', 'reason'],
      'Rejected credentials by scheme (api_key, bearer, oidc, scm_token, signature, basic, client_certificate) and reason.',
    ),
    oidcVerifications: counter(
      'opsgate_oidc_verifications_total',
      ['issuer', 'result'],
      'OIDC bearer tokens verified, by issuer (one of OPS_OIDC_FILE, or unlisted) and result (accepted, expired, audience, claims, algorithm, signature, unknown_key, invalid, no_matching_rule, unknown_issuer, issuer_unavailable).',
    ),
    jobsEnqueued: counter('opsgate_jobs_enqueued_total', ['name'], 'Jobs put on the queue by the API, by job name.'),
    rateLimited: counter('opsgate_rate_limited_requests_total', [], 'Requests refused with 429 by the per-address rate limit.'),
    jobsProcessed: counter(
      'opsgate_jobs_processed_total',
      ['name', 'outcome'],
      'Job attempts finished by the worker, by job name and outcome (completed, retried, dead_lettered).',
    ),
    jobDuration: new Histogram({
      name: 'opsgate_job_duration_seconds',
      help: 'Duration of job attempts, by job name and outcome.',
      labelNames: ['name', 'outcome'] as const,
      buckets: [0.01, 0.05, 0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600, 900],
      registers: [registry],
    }),
    jobRetries: counter('opsgate_job_retries_total', ['name'], 'Failed job attempts that will be retried, by job name.'),
    jobsStalled: counter(
      'opsgate_jobs_stalled_total',
      [],
      'Active jobs found stalled by this worker (their worker stopped renewing the lock) and moved back to waiting.',
    ),
    workerErrors: counter(
      'opsgate_worker_errors_total',
      [],
      "Errors reported by the worker's queue machinery (mostly Redis connection errors), not job failures.",
    ),
  };

  // Queue depth, read from Redis at scrape time. When Redis cannot be read within the timeout the
  // depth samples are left out of that scrape (no stale value that could hide a growing backlog or
  // keep a dead-letter alert firing wrongly) and opsgate_queue_scrape_errors_total{queue} counts it.
  let depthSources: QueueCountsSource[] = [];
  let depthTimeoutMs = QUEUE_SCRAPE_TIMEOUT_MS;
  const readDepths = perScrape(async () => {
    const out = new Map<string, Partial<Record<string, number>>>();
    await Promise.all(
      depthSources.map(async (src) => {
        try {
          out.set(src.queue, await withTimeout(src.counts(), depthTimeoutMs, 'queue depth read'));
        } catch {
          queueScrapeErrors.inc({ queue: src.queue });
        }
      }),
    );
    return out;
  });
  // Its collect joins the scrape's shared read, so a failure is counted in the scrape that skipped the samples.
  const queueScrapeErrors: Counter<'queue'> = new Counter({
    name: 'opsgate_queue_scrape_errors_total',
    help: 'Scrapes whose queue depth could not be read from Redis in time (depth samples skipped), by queue.',
    labelNames: ['queue'] as const,
    registers: [registry],
    async collect() {
      if (depthSources.length > 0) await readDepths();
    },
  });
  gauge(
    'opsgate_queue_jobs',
    ['queue', 'state'],
    'Jobs in the queue by state (waiting, active, delayed, prioritized, paused, failed = dead-lettered), read from Redis at scrape time.',
    async function () {
      this.reset();
      if (depthSources.length === 0) return;
      for (const [queue, counts] of await readDepths()) {
        for (const state of QUEUE_STATES) this.set({ queue, state }, Number(counts[state] ?? 0));
      }
    },
  );
  gauge(
    'opsgate_dead_letter_jobs',
    ['queue'],
    'Dead-lettered jobs (attempts exhausted or unrecoverable, kept in the failed set), read from Redis at scrape time.',
    async function () {
      this.reset();
      if (depthSources.length === 0) return;
      for (const [queue, counts] of await readDepths()) this.set({ queue }, Number(counts.failed ?? 0));
    },
  );

  // Redis memory (INFO memory): the in-chart Redis runs with noeviction, so reaching maxmemory means
  // writes (enqueues, dedup keys) fail; OpsgateRedisMemoryHigh warns first.
  let redisMemorySource: (() => Promise<MemoryUse>) | undefined;
  const readMemory = perScrape(async () =>
    redisMemorySource ? withTimeout(redisMemorySource(), depthTimeoutMs, 'queue depth read').catch(() => undefined) : undefined,
  );
  for (const [field, name, help] of [
    [
      'used',
      'opsgate_redis_memory_used_bytes',
      'Memory used by Redis (INFO memory used_memory), read at scrape time; absent when Redis does not answer in time. redis="queue": the queue/dedup Redis.',
    ],
    [
      'max',
      'opsgate_redis_memory_max_bytes',
      'maxmemory of Redis (INFO memory maxmemory; 0 = no limit), read at scrape time; absent when Redis does not answer in time.',
    ],
  ] as const) {
    gauge(name, ['redis'], help, async function () {
      this.reset();
      const m = await readMemory();
      if (m) this.set({ redis: 'queue' }, m[field]);
    });
  }

  // Guarded changes (src/changes/, worker/report.ts) and alert-driven remediation (src/remediation/):
  // namespace takes inventory namespaces only, rule the inventory's rule names only.
  const changes = {
    budgetExhausted: counter(
      'opsgate_budget_exhausted_total',
      ['namespace'],
      "Restarts refused with 429 because their namespace's restart budget (the inventory's policy) was spent, by namespace.",
    ),
    approvals: counter(
      'opsgate_approvals_total',
      ['change', 'event'],
      'Approval events of guarded changes, by change (restart, deploy) and event (requested, approved, recorded = one of several, rejected, refused_self, expired, superseded).',
    ),
    guardRefusals: counter(
      'opsgate_guard_refusals_total',
      ['guard'],
      'Restarts refused with 409 by a freeze or outside their change windows, by guard (freeze, window).',
    ),
    guardOverrides: counter(
      'opsgate_guard_overrides_total',
      [],
      'Restarts let through a freeze or outside their change windows by an operator (override=true with a reason).',
    ),
    holds: counter(
      'opsgate_holds_total',
      ['by', 'guard'],
      'Deploys held as delayed jobs by a freeze or outside their change windows, by who held them (api at intake, worker when a held job woke to a closed gate) and guard (freeze, window).',
    ),
    freezes: counter('opsgate_freezes_total', ['action'], 'Freezes declared and lifted (DELETE /ops/freezes/{id}), by action.'),
    dryRuns: counter(
      'opsgate_dry_runs_total',
      ['change', 'verdict'],
      "Dry runs by change (restart, deploy) and the Kubernetes API server's verdict on the worker's identity (admitted, refused, unknown = no worker answered in time or the cluster could not be asked).",
    ),
    changeOutcomes: counter(
      'opsgate_change_outcomes_total',
      ['change', 'result'],
      'How restarts and deploys ended, by change and result (rolled_out, created, failed, progress_deadline_exceeded, refused, held, rejected, expired, superseded, cancelled).',
    ),
    /** Set by the worker when a deploy succeeds; project and ref are the inventory's, never a commit. */
    deployLastSuccess: gauge(
      'opsgate_deploy_last_success_timestamp_seconds',
      ['project', 'ref'],
      "When a project's ref last deployed successfully (Unix seconds), by project and ref; set by the worker.",
    ),
    /** A deploy's state told to the host of its commit (worker/jobs/reportStatus.ts), by attempt. */
    commitStatusReports: new Counter({
      name: 'opsgate_commit_status_reports_total',
      help: 'Deploy states told to the host of the commit, by sender (github, gitlab, gitea, bitbucket) and result (sent; failed: an attempt failed, retried with backoff unless the host refused the request; skipped: a later state was told already; no_token: this worker holds no token for the sender).',
      labelNames: ['sender', 'result'] as const,
      registers: [registry],
    }),
    remediations: counter(
      'opsgate_remediations_total',
      ['rule', 'outcome'],
      'Remediations by rule and outcome (remediated, rolled_out_still_firing, failed, progress_deadline_exceeded, refused, rejected, expired, cancelled, dry_run).',
    ),
    remediationsSuppressed: counter(
      'opsgate_remediations_suppressed_total',
      ['rule', 'guard'],
      'Firing alerts a remediation rule matched that restarted nothing, by rule and the guard that stopped them (target, target_not_allowed, episodes, not_firing, unconfirmed, prometheus, alertmanager, cooldown, escalated, freeze, window, budget).',
    ),
    remediationEscalations: counter(
      'opsgate_remediation_escalations_total',
      ['rule'],
      'Remediation rules that stopped acting on a Deployment and paged, after escalate_after remediations within their escalation window, by rule.',
    ),
    remediationBudgetExhausted: counter(
      'opsgate_remediation_budget_exhausted_total',
      ['budget', 'name'],
      "Remediation restarts refused because a remediation budget was spent, by budget (rule: the rule's own; namespace: all rules of a namespace) and name.",
    ),
  };
  let budgetsSource: (() => Promise<RemediationBudgetUse[]>) | undefined;
  const readBudgets = perScrape(async () =>
    budgetsSource ? withTimeout(budgetsSource(), depthTimeoutMs, 'remediation budgets read').catch(() => undefined) : undefined,
  );
  for (const [field, name, help] of [
    [
      'used',
      'opsgate_remediation_budget_used',
      "Restarts by remediation in a remediation budget's window, by budget (rule, namespace) and name (read from Redis at scrape time).",
    ],
    [
      'limit',
      'opsgate_remediation_budget_limit',
      "Restarts a remediation budget allows in its window, by budget (rule, namespace) and name; people's restarts have their own (the namespace's budget).",
    ],
  ] as const) {
    gauge(name, ['budget', 'name'], help, async function () {
      for (const u of (await readBudgets()) ?? []) this.set({ budget: u.budget, name: u.name }, u[field]);
    });
  }
  let silencesSource: (() => Promise<number>) | undefined;
  gauge(
    'opsgate_remediation_silences_active',
    [],
    'Alertmanager silences opsgate keeps now for remediations under way (read from Redis at scrape time; 0 when it does not answer in time).',
    async function () {
      this.set(silencesSource ? await withTimeout(silencesSource(), depthTimeoutMs, 'remediation silences read').catch(() => 0) : 0);
    },
  );

  const admin = {
    adminActions: counter(
      'opsgate_admin_actions_total',
      ['method', 'status'],
      'State-changing calls under /admin (Bull Board retry, clean, promote, remove...), by method and status code.',
    ),
    // TLS of the process' own listeners (src/shared/tls.ts): listener = api or metrics.
    tlsReloads: counter(
      'opsgate_tls_reloads_total',
      ['listener', 'outcome'],
      'Changed TLS files checked by a listener (api, metrics), by outcome: reloaded (served to new connections) or refused (the last good certificate stays).',
    ),
    tlsCertificateExpiry: gauge(
      'opsgate_tls_certificate_expiry_timestamp_seconds',
      ['listener'],
      'notAfter of the certificate a listener (api, metrics) serves, as a Unix timestamp.',
    ),
    tlsHandshakeErrors: counter(
      'opsgate_tls_handshake_errors_total',
      ['listener'],
      'Connections to a TLS listener (api, metrics) closed because the TLS handshake failed (a plaintext HTTP client, an unsupported protocol).',
    ),
    // Credentials re-read while the API runs (src/shared/liveSecrets.ts): variable = the file's variable.
    secretReloads: counter(
      'opsgate_secret_reloads_total',
      ['variable', 'outcome'],
      "Changed credential files (OPS_API_KEYS_FILE, a webhook sender's <VARIABLE>_FILE) checked by the API, by variable and outcome: reloaded (in use) or refused (invalid: the last good values stay in use).",
    ),
    secretReloadRefused: gauge(
      'opsgate_secret_reload_refused',
      ['variable'],
      '1 while a credential file (by variable) holds contents the API refused, so it still uses the last good ones; 0 once the file is valid again or back to what is in use.',
    ),
  };

  // API keys (src/api/apiKeyLifetime.ts), read at scrape time so a reload of the keys file is
  // exported without a call; key_id takes only the ids of configured keys.
  let apiKeys: readonly { id: string; expiresAt?: number }[] = [];
  let lastUsedSource: ((ids: readonly string[]) => Promise<Map<string, number>>) | undefined;
  gauge(
    'opsgate_api_key_expiry_timestamp_seconds',
    ['key_id'],
    'When an API key of the keys file stops working (its expires), as a Unix timestamp; keys without an expiry have no series.',
    async function () {
      this.reset();
      for (const k of apiKeys) if (k.expiresAt !== undefined) this.set({ key_id: k.id }, Math.floor(k.expiresAt / 1000));
    },
  );
  gauge(
    'opsgate_api_key_last_used_timestamp_seconds',
    ['key_id'],
    'When an API key was last accepted by any replica (kept in Redis, written at most once a minute per key and process), as a Unix timestamp, read at scrape time; absent for a key never used, or when Redis does not answer in time.',
    async function () {
      this.reset();
      const keyIds = apiKeys.map((k) => k.id);
      if (!lastUsedSource || keyIds.length === 0) return;
      const seen = await withTimeout(lastUsedSource(keyIds), depthTimeoutMs, 'api key last use read').catch(() => undefined);
      for (const [key_id, seconds] of seen ?? []) this.set({ key_id }, seconds);
    },
  );

  return {
    registry,
    ...requestsAndJobs,
    ...changes,
    ...admin,
    /** Export queue depth for these queues (once the process has its BullMQ Queue). */
    setQueueDepthSources(sources: QueueCountsSource[], opts: { timeoutMs?: number } = {}) {
      depthSources = [...sources];
      if (opts.timeoutMs !== undefined) depthTimeoutMs = opts.timeoutMs;
      // A series at 0 from the start: rate()/increase() and the dashboard see "no errors", not "no data".
      for (const src of depthSources) queueScrapeErrors.inc({ queue: src.queue }, 0);
    },
    setRedisMemorySource(fn: typeof redisMemorySource) {
      redisMemorySource = fn;
    },
    /** The configured keys (the config's array, whose contents a reload replaces) and where their last use is read. */
    setApiKeys(keys: typeof apiKeys, lastUsed: NonNullable<typeof lastUsedSource>) {
      apiKeys = keys;
      lastUsedSource = lastUsed;
    },
    /** Every series of the rules at 0 from the start (rate() sees "none", not "no data"), and where silences and budgets are read. */
    setRemediationRules(
      rules: readonly string[],
      vocabulary: { outcomes: readonly string[]; guards: readonly string[] },
      silences?: () => Promise<number>,
      budgets?: () => Promise<RemediationBudgetUse[]>,
    ) {
      for (const rule of rules) {
        for (const outcome of vocabulary.outcomes) changes.remediations.inc({ rule, outcome }, 0);
        for (const guard of vocabulary.guards) changes.remediationsSuppressed.inc({ rule, guard }, 0);
        changes.remediationEscalations.inc({ rule }, 0);
        changes.remediationBudgetExhausted.inc({ budget: 'rule', name: rule }, 0);
      }
      if (silences) silencesSource = silences;
      if (budgets) budgetsSource = budgets;
    },
  };
}

export type Metrics = ReturnType<typeof createMetrics>;

/** One remediation budget's use, as the metrics and GET /ops/remediations show it. */
export interface RemediationBudgetUse {
  budget: 'rule' | 'namespace';
  name: string;
  used: number;
  limit: number;
  /** The window, in seconds. */
  per: number;
}
