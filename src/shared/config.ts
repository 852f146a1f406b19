import { z } from 'zod';
import { type ConfigProblem, ConfigError } from './errors.js';
import { parseRedisUrl, redisPasswords, RedisUrlError } from './redis.js';
import { isPlaceholder, PLACEHOLDER_PREFIX, PLACEHOLDER_PROBLEM } from './secrets.js';
import { tlsPairProblems, type TlsFiles } from './tls.js';
import { outboundVariables } from './outboundVariables.js';

/**
 * The environment both processes read (commonSchema) and the worker's: the variables' schemas and
 * defaults, read once at start, every problem reported at once (src/shared/configReport.ts). The
 * API's own variables are parsed by src/api/config.ts on the same rules.
 */

export const intFrom = (def: number, min = 0) =>
  z
    .string()
    .optional()
    .transform((v, ctx) => {
      if (v === undefined || v.trim() === '') return def;
      const n = Number(v);
      if (!Number.isInteger(n) || n < min) {
        ctx.addIssue({ code: 'custom', message: `must be an integer >= ${min}` });
        return z.NEVER;
      }
      return n;
    });

/** One server, Sentinel or Cluster (src/shared/redis.ts); the message names the problem, never the value. */
const redisUrl = z
  .string({ error: 'is required' })
  .trim()
  .min(1, 'is required')
  .superRefine((v, ctx) => {
    try {
      parseRedisUrl(v);
    } catch (err) {
      ctx.addIssue({ code: 'custom', message: err instanceof RedisUrlError ? err.message : 'is not a usable Redis URL' });
    }
  })
  .refine((v) => !redisPasswords(v).some((pw) => isPlaceholder(pw)), `password ${PLACEHOLDER_PROBLEM}`);

export const optionalPath = z
  .string()
  .optional()
  .transform((v) => (v === undefined || v.trim() === '' ? undefined : v.trim()));

/** An http(s) base URL without its trailing slashes; unset or blank: undefined. */
const optionalHttpUrl = optionalPath
  .transform((v) => v?.replace(/\/+$/, ''))
  .refine((v) => v === undefined || /^https?:\/\/[^\s]+$/.test(v), 'must be an http(s) URL');

export const commonSchema = z.object({
  REDIS_URL: redisUrl,
  METRICS_PORT: intFrom(9464),
  /** HTTPS on METRICS_PORT: certificate and key files (both or neither), re-read when they change. */
  METRICS_TLS_CERT_FILE: optionalPath,
  METRICS_TLS_KEY_FILE: optionalPath,
  /** How often the TLS files of the process' listeners are checked for a renewed certificate. */
  TLS_RELOAD_INTERVAL_MS: intFrom(10000, 100),
  OPS_INVENTORY_FILE: z
    .string()
    .optional()
    .transform((v) => (v ? v : undefined)),
  LOG_LEVEL: z.enum(['debug', 'info', 'warn', 'error']).optional().default('info'),
  JOB_ATTEMPTS: intFrom(5, 1),
  JOB_BACKOFF_MS: intFrom(10000, 0),
  JOB_TIMEOUT_SECONDS: intFrom(900, 1),
  /** Deploys kept per project in the history (GET /ops/deploys), written by both processes. */
  DEPLOY_HISTORY_KEPT: intFrom(100, 1),
  /**
   * Each sender's last deliveries kept for GET /ops/deliveries (a capped stream per sender); 0 keeps
   * none. Both processes append to it: the API its answers, the worker a pushed deploy's end when
   * it never ran or was cancelled (superseded, cancelled), and each trims the stream to this cap.
   */
  DELIVERIES_KEPT: intFrom(1000, 0),
  /**
   * Each sender's last unverified deliveries (its proof missing or wrong, or refused before it was
   * checked: rate-limited), kept apart in a smaller stream so that anyone's flood of them evicts
   * none of the verified ones; 0 keeps none.
   */
  DELIVERIES_UNVERIFIED_KEPT: intFrom(100, 0),
  OPSGATE_VERSION: z.string().optional(),
  /**
   * Alertmanager's address (its API v2 under /api/v2), for alert-driven remediation: a firing
   * alert is confirmed there before anything is restarted, its resolution read there, and the
   * silences of the rules with `silence: true` kept there. Unset: notifications alone, no silence.
   */
  ALERTMANAGER_URL: optionalHttpUrl,
  /**
   * Where alerts are born, for alert-driven remediation: Prometheus (or a server answering its
   * query API, such as Thanos Query). A rule with `confirm: prometheus` acts only on an alert
   * Prometheus itself fires, timed by Prometheus (src/remediation/prometheus.ts).
   */
  PROMETHEUS_URL: optionalHttpUrl,
  /**
   * Prometheus's external labels, `name=value` comma-separated, when /api/v1/status/config cannot
   * tell them (Thanos Query and others): the labels a notification may carry beyond the ALERTS
   * series'. Unset: read from Prometheus.
   */
  PROMETHEUS_EXTERNAL_LABELS: z
    .string()
    .optional()
    .transform((v, ctx) => {
      if (v === undefined || v.trim() === '') return undefined;
      const out: Record<string, string> = {};
      for (const item of v.split(',').map((x) => x.trim())) {
        const m = /^([a-zA-Z_][a-zA-Z0-9_]*)=(.*)$/.exec(item);
        if (!m) {
          ctx.addIssue({ code: 'custom', message: 'must be name=value items, comma-separated' });
          return z.NEVER;
        }
        out[m[1]!] = m[2]!;
      }
      return out;
    }),
  /** Credentials presented to PROMETHEUS_URL and ALERTMANAGER_URL (src/shared/outboundAuth.ts); read by loadOutboundAuth. */
  ...Object.fromEntries(
    [...outboundVariables('PROMETHEUS', true), ...outboundVariables('ALERTMANAGER', false)].map((v) => [
      v,
      v.endsWith('_FILE') ? optionalPath : z.string().optional(),
    ]),
  ),
  /**
   * Bound of the close steps on SIGTERM/SIGINT (src/shared/shutdown.ts): the API's whole shutdown,
   * the worker's after its job drain (WORKER_SHUTDOWN_GRACE_SECONDS). Past it the process exits 1.
   */
  SHUTDOWN_TIMEOUT_SECONDS: intFrom(20, 1),
});

/** The settings' prefix of each host told deploy states (`<PREFIX>_API_URL`, `<PREFIX>_BEARER_TOKEN`...). */
export const STATUS_HOSTS = ['GITHUB_STATUS', 'GITLAB_STATUS', 'GITEA_STATUS', 'BITBUCKET_STATUS'] as const;

/** A host API's base URL, its default when unset; trailing slashes dropped. */
const apiUrl = (fallback: string | undefined) =>
  z
    .string()
    .optional()
    .transform((v) => (v === undefined || v.trim() === '' ? fallback : v.trim().replace(/\/+$/, '')))
    .refine((v) => v === undefined || /^https?:\/\/[^\s]+$/.test(v), 'must be an http(s) URL');

const workerSchema = commonSchema.extend({
  NOTIFY_WEBHOOK_URLS: z
    .string()
    .optional()
    .transform((v, ctx) => {
      const urls = (v ?? '')
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean);
      for (const u of urls) {
        if (!/^https?:\/\//.test(u)) {
          ctx.addIssue({ code: 'custom', message: 'must be a comma-separated list of http(s) URLs' });
          return z.NEVER;
        }
        if (u.toUpperCase().includes(PLACEHOLDER_PREFIX)) {
          ctx.addIssue({ code: 'custom', message: PLACEHOLDER_PROBLEM });
          return z.NEVER;
        }
      }
      return urls;
    }),
  WORKER_CONCURRENCY: intFrom(8, 1),
  /**
   * The API's address as operators reach it, for the notifications of guarded changes ("approve:
   * POST <url>/ops/approvals/<id>/approve"); unset: the path alone.
   */
  OPSGATE_PUBLIC_URL: optionalHttpUrl,
  /**
   * Which ends of restarts and deploys the worker posts to NOTIFY_WEBHOOK_URLS: all, failures
   * (failed, past its progress deadline, refused) or none. The news of guards (an approval asked for,
   * rejected or expired, an override, a hold) is always posted; the outcome is always on the job.
   */
  REPORT_OUTCOMES: z.enum(['all', 'failures', 'none']).optional().default('all'),
  NOTIFY_TIMEOUT_MS: intFrom(5000, 1),
  ROLLOUT_TIMEOUT_SECONDS: intFrom(600, 1),
  /** How often restart_service polls the Deployment while waiting for its rollout. */
  ROLLOUT_POLL_INTERVAL_MS: intFrom(2000, 50),
  /** BullMQ job lock: a worker that stops renewing it for this long loses the job (stalled). */
  WORKER_LOCK_DURATION_MS: intFrom(30000, 1000),
  /** How often the stalled-job checker moves jobs of dead workers back to waiting. */
  WORKER_STALLED_INTERVAL_MS: intFrom(30000, 500),
  /** Times a job may stall before it is dead-lettered ("job stalled more than allowable limit"). */
  WORKER_MAX_STALLED_COUNT: intFrom(1, 0),
  /** On SIGTERM/SIGINT: how long active jobs may run on before they are aborted (and retried). */
  WORKER_SHUTDOWN_GRACE_SECONDS: intFrom(25, 0),
  /** GET /livez on METRICS_PORT answers 503 when the event loop lagged more than this within the last 10 s. */
  WORKER_LIVENESS_MAX_LAG_MS: intFrom(5000, 50),
  /**
   * The hosts' APIs told each deploy's state (worker/commitStatus.ts): their base URLs (GitHub
   * Enterprise, a self-hosted GitLab or Gitea), and the token of each (`<PREFIX>_BEARER_TOKEN` or
   * its `_FILE`, read again when the file changes; `<PREFIX>_TLS_CA_FILE` for a private CA), read
   * by src/shared/outboundAuth.ts (only these of its settings are in the schema). No
   * token, or no URL (Gitea has no default): nothing is sent to that host.
   */
  GITHUB_STATUS_API_URL: apiUrl('https://api.github.com'),
  GITLAB_STATUS_API_URL: apiUrl('https://gitlab.com/api/v4'),
  GITEA_STATUS_API_URL: apiUrl(undefined),
  BITBUCKET_STATUS_API_URL: apiUrl('https://api.bitbucket.org'),
  ...Object.fromEntries(
    STATUS_HOSTS.flatMap((prefix) => [`${prefix}_BEARER_TOKEN`, `${prefix}_BEARER_TOKEN_FILE`, `${prefix}_TLS_CA_FILE`]).map((v) => [
      v,
      v.endsWith('_FILE') ? optionalPath : z.string().optional(),
    ]),
  ),
  /** Bound of one request to a host's status API. */
  STATUS_TIMEOUT_MS: intFrom(10000, 1),
});

/** Every variable the worker reads (its schema's keys), so the chart can be held to setting each one. */
export const WORKER_VARIABLES: readonly string[] = Object.keys(workerSchema.shape);

export type CommonConfig = z.infer<typeof commonSchema>;
export type WorkerConfig = z.infer<typeof workerSchema>;

export type Env = Record<string, string | undefined>;

/** Every variable's problem (the first of each), so an operator fixes them all in one round. */
export function parseWith<S extends z.ZodType>(schema: S, env: Env, earlier: readonly ConfigProblem[] = []): z.infer<S> {
  const result = schema.safeParse(env);
  const problems = [...earlier];
  if (!result.success) {
    for (const issue of result.error.issues) {
      const variable = String(issue.path[0] ?? 'environment');
      if (problems.some((p) => p.variable === variable)) continue;
      // zod's message for a missing string is "Invalid input..."; keep ours short and value-free.
      problems.push({ variable, problem: issue.code === 'invalid_type' ? 'is required' : issue.message });
    }
  }
  if (problems.length > 0) throw new ConfigError(problems);
  return result.data as z.infer<S>;
}

/** The metrics port's TLS files, or undefined when it serves plain HTTP. */
export function metricsTlsFiles(config: Pick<CommonConfig, 'METRICS_TLS_CERT_FILE' | 'METRICS_TLS_KEY_FILE'>): TlsFiles | undefined {
  if (!config.METRICS_TLS_CERT_FILE || !config.METRICS_TLS_KEY_FILE) return undefined;
  return {
    certFile: config.METRICS_TLS_CERT_FILE,
    keyFile: config.METRICS_TLS_KEY_FILE,
    vars: { cert: 'METRICS_TLS_CERT_FILE', key: 'METRICS_TLS_KEY_FILE' },
  };
}

export function loadWorkerConfig(env: Env = process.env): WorkerConfig {
  return parseWith(workerSchema, env, tlsPairProblems(env, 'METRICS_TLS_CERT_FILE', 'METRICS_TLS_KEY_FILE'));
}
