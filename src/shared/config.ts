import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { type ConfigProblem, ConfigError } from './errors.js';
import { parseRedisUrl, redisPasswords, RedisUrlError } from './redis.js';
import { isPlaceholder, PLACEHOLDER_PREFIX, PLACEHOLDER_PROBLEM } from './secrets.js';
import { tlsPairProblems, type TlsFiles } from './tls.js';
import { outboundVariables } from './outboundVariables.js';

const optionalString = z.string().optional();

export const intFrom = (def: number, min = 0) =>
  optionalString.transform((v, ctx) => {
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

/** A file's YAML (a superset of JSON), or a ConfigError of its variable. */
export function parseYamlFile(text: string, variable: string): unknown {
  try {
    return parseYaml(text);
  } catch {
    throw new ConfigError(variable, 'is not valid YAML or JSON');
  }
}

/** A value trimmed, `def` when it is unset or blank. */
export const trimmed = <D extends string | undefined>(def: D) =>
  optionalString.transform((v) => (v === undefined || v.trim() === '' ? def : v.trim()));

export const optionalPath = trimmed(undefined);

/** An http(s) base URL without its trailing slashes; unset or blank: undefined. */
const optionalHttpUrl = optionalPath
  .transform((v) => v?.replace(/\/+$/, ''))
  .refine((v) => v === undefined || /^https?:\/\/[^\s]+$/.test(v), 'must be an http(s) URL');

/** Optional settings by name: a `_FILE` one is a path. */
const optionalSettings = (names: readonly string[]) =>
  Object.fromEntries(names.map((v) => [v, v.endsWith('_FILE') ? optionalPath : optionalString]));

/** The environment both processes read; the worker's extends it, the API's is src/api/config.ts. */
export const commonSchema = z.object({
  REDIS_URL: redisUrl,
  METRICS_PORT: intFrom(9464),
  /** HTTPS on METRICS_PORT (both or neither), re-read when they change. */
  METRICS_TLS_CERT_FILE: optionalPath,
  METRICS_TLS_KEY_FILE: optionalPath,
  TLS_RELOAD_INTERVAL_MS: intFrom(10000, 100),
  OPS_INVENTORY_FILE: optionalString.transform((v) => (v ? v : undefined)),
  LOG_LEVEL: z.enum(['debug', 'info', 'warn', 'error']).optional().default('info'),
  JOB_ATTEMPTS: intFrom(5, 1),
  JOB_BACKOFF_MS: intFrom(10000, 0),
  JOB_TIMEOUT_SECONDS: intFrom(900, 1),
  DEPLOY_HISTORY_KEPT: intFrom(100, 1),
  /** Each sender's last deliveries kept for GET /ops/deliveries; 0 keeps none. Both processes append and trim. */
  DELIVERIES_KEPT: intFrom(1000, 0),
  /** Unverified deliveries, kept apart so that anyone's flood of them evicts none of the verified ones; 0 keeps none. */
  DELIVERIES_UNVERIFIED_KEPT: intFrom(100, 0),
  OPSGATE_VERSION: optionalString,
  /** Alertmanager (API v2): firing alerts confirmed and silences kept there. Unset: notifications alone, no silence. */
  ALERTMANAGER_URL: optionalHttpUrl,
  /** Prometheus (or its query API, e.g. Thanos Query), for rules with `confirm: prometheus`. */
  PROMETHEUS_URL: optionalHttpUrl,
  /** Prometheus's external labels (`name=value,...`) when /api/v1/status/config cannot tell them (Thanos Query). */
  PROMETHEUS_EXTERNAL_LABELS: optionalString.transform((v, ctx) => {
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
  /** Credentials presented to PROMETHEUS_URL and ALERTMANAGER_URL, read by loadOutboundAuth. */
  ...optionalSettings([...outboundVariables('PROMETHEUS', true), ...outboundVariables('ALERTMANAGER', false)]),
  /** Bound of the close steps on SIGTERM/SIGINT (the worker's after its job drain); past it the process exits 1. */
  SHUTDOWN_TIMEOUT_SECONDS: intFrom(20, 1),
});

/** The settings' prefix of each host told deploy states (`<PREFIX>_API_URL`, `<PREFIX>_BEARER_TOKEN`...). */
export const STATUS_HOSTS = ['GITHUB_STATUS', 'GITLAB_STATUS', 'GITEA_STATUS', 'BITBUCKET_STATUS'] as const;

const apiUrl = (fallback: string | undefined) => optionalHttpUrl.transform((v) => v ?? fallback);

const workerSchema = commonSchema.extend({
  NOTIFY_WEBHOOK_URLS: optionalString.transform((v, ctx) => {
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
  /** The API's address as operators reach it, for the links in notifications; unset: the path alone. */
  OPSGATE_PUBLIC_URL: optionalHttpUrl,
  /** Which ends of restarts and deploys are posted to NOTIFY_WEBHOOK_URLS; the news of guards always is. */
  REPORT_OUTCOMES: z.enum(['all', 'failures', 'none']).optional().default('all'),
  NOTIFY_TIMEOUT_MS: intFrom(5000, 1),
  ROLLOUT_TIMEOUT_SECONDS: intFrom(600, 1),
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
  /** The hosts' APIs told each deploy's state (worker/commitStatus.ts). No token or no URL: nothing is sent there. */
  GITHUB_STATUS_API_URL: apiUrl('https://api.github.com'),
  GITLAB_STATUS_API_URL: apiUrl('https://gitlab.com/api/v4'),
  GITEA_STATUS_API_URL: apiUrl(undefined),
  BITBUCKET_STATUS_API_URL: apiUrl('https://api.bitbucket.org'),
  ...optionalSettings(STATUS_HOSTS.flatMap((prefix) => [`${prefix}_BEARER_TOKEN`, `${prefix}_BEARER_TOKEN_FILE`, `${prefix}_TLS_CA_FILE`])),
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
