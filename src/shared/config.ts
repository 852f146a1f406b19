import { z } from 'zod';
import { ConfigError, type ConfigProblem } from './errors.js';
import { credentialId } from './crypto.js';
import { parseRedisUrl, redisPasswords, RedisUrlError } from './redis.js';
import { SOURCE_SECRET_ENVS } from '../sources/index.js';
import { tlsPairProblems, type TlsFiles } from './tls.js';

export type Role = 'readonly' | 'operator';

export interface ApiKey {
  /** The secret itself; only ever compared in constant time, never logged. */
  readonly key: string;
  readonly role: Role;
  /** Audit identity: first 12 hex of SHA-256(key). */
  readonly id: string;
}

/**
 * The fake secrets of the plain manifests (k8s/opsgate.yaml, k8s/examples/values.example.yaml) all start
 * with this. They are public, so a process holding one would accept anyone: refuse to start.
 */
export const PLACEHOLDER_PREFIX = 'CHANGE-ME';
export const isPlaceholder = (v: string): boolean => v.trim().toUpperCase().startsWith(PLACEHOLDER_PREFIX);
const PLACEHOLDER_PROBLEM = `still holds the ${PLACEHOLDER_PREFIX} placeholder of the plain manifests; set a real secret`;
/** Keys (and the bearer token) shorter than this are accepted but logged as a warning at start. */
export const MIN_SECRET_LENGTH = 16;

/**
 * Parses OPS_API_KEY_ROLES: comma-separated `<API_KEY>:<role>` items, the role being the text
 * after the last colon (so keys may contain colons). Refuses a missing/blank value, an item
 * without `key:role`, an empty key, an unknown role, or no key at all; also a key listed twice
 * (which role would win is a guess) and a key still holding the CHANGE-ME placeholder. Errors name the
 * variable and the item's position, never the key.
 */
export function parseApiKeyRoles(raw: string | undefined): ApiKey[] {
  const name = 'OPS_API_KEY_ROLES';
  if (raw === undefined || raw.trim() === '') throw new ConfigError(name, 'is required and must not be blank');
  const items = raw.split(',').map((s) => s.trim());
  const keys: ApiKey[] = [];
  items.forEach((item, i) => {
    // An empty item (",," or a trailing comma) lacks the key:role form too: refuse it rather
    // than guess what was meant (often a key lost in a templating mistake).
    const at = item.lastIndexOf(':');
    if (at < 0) throw new ConfigError(name, `item ${i + 1} is not of the form <key>:<role>`);
    const key = item.slice(0, at);
    const role = item.slice(at + 1);
    if (key === '') throw new ConfigError(name, `item ${i + 1} has an empty key`);
    if (role !== 'readonly' && role !== 'operator') {
      throw new ConfigError(name, `item ${i + 1} has a role that is not readonly or operator`);
    }
    if (isPlaceholder(key)) throw new ConfigError(name, `item ${i + 1} ${PLACEHOLDER_PROBLEM}`);
    const earlier = keys.findIndex((k) => k.key === key);
    if (earlier >= 0) throw new ConfigError(name, `item ${i + 1} repeats the key of item ${earlier + 1}; list each key once with one role`);
    keys.push({ key, role, id: credentialId(key) });
  });
  // Unreachable after the checks above; kept because the contract names it: no configured key, no start.
  if (keys.length === 0) throw new ConfigError(name, 'configures no key');
  return keys;
}

const optionalSecret = z
  .string()
  .optional()
  .transform((v) => (v === undefined || v === '' ? undefined : v))
  .refine((v) => v === undefined || !isPlaceholder(v), PLACEHOLDER_PROBLEM);

const intFrom = (def: number, min = 0) =>
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

const optionalPath = z
  .string()
  .optional()
  .transform((v) => (v === undefined || v.trim() === '' ? undefined : v.trim()));

const commonSchema = z.object({
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
  OPSGATE_VERSION: z.string().optional(),
  /**
   * Bound of the close steps on SIGTERM/SIGINT (src/shared/shutdown.ts): the API's whole shutdown,
   * the worker's after its job drain (WORKER_SHUTDOWN_GRACE_SECONDS). Past it the process exits 1.
   */
  SHUTDOWN_TIMEOUT_SECONDS: intFrom(20, 1),
});

/**
 * "Acknowledged means replicated" (opt-in): before a webhook's 202 or a restart's 200, WAIT until
 * this many replicas hold the seen record and the job (src/domain/replication.ts). 0 = off.
 * The wait is bounded by REDIS_ACK_TIMEOUT_MS, kept under the request connection's 2 s command
 * timeout; with the take-back, a 503 follows at most 0.5 s after it (src/domain/replication.ts).
 */
const replicationSchema = {
  REDIS_MIN_REPLICAS_ACK: intFrom(0, 0),
  REDIS_ACK_TIMEOUT_MS: intFrom(1000, 1).refine((n) => n <= 1500, 'must be at most 1500 (ms)'),
};

const apiSchema = commonSchema.extend({
  PORT: intFrom(8080),
  /** HTTPS on PORT: certificate (chain) and key files (both or neither), re-read when they change. */
  TLS_CERT_FILE: optionalPath,
  TLS_KEY_FILE: optionalPath,
  /**
   * CA bundle for client certificates: with it, /webhook/alerts needs a client certificate signed
   * by one of its CAs (other paths do not ask for one). Needs TLS_CERT_FILE/TLS_KEY_FILE.
   */
  TLS_CLIENT_CA_FILE: optionalPath,
  ...replicationSchema,
  OPS_BEARER_TOKEN: optionalSecret,
  /** The webhook senders' secrets, one variable each, named by src/sources. */
  ...Object.fromEntries(SOURCE_SECRET_ENVS.map((env) => [env, optionalSecret])),
  /** Alerts accepted in one /webhook/alerts payload; over it 413, nothing queued. */
  ALERTS_MAX_PER_REQUEST: intFrom(1000, 1),
  RATE_LIMIT_RPS: intFrom(50),
  BODY_LIMIT: z
    .string()
    .optional()
    .transform((v) => (v === undefined || v.trim() === '' ? '1mb' : v.trim()))
    .refine((v) => /^\d+(b|kb|mb)?$/i.test(v), 'must be a size such as 512kb or 1mb'),
  /**
   * Express trust-proxy. Default 0: X-Forwarded-For is ignored, the client address is the TCP peer.
   * Only behind a proxy (the chart sets the hop count when its Ingress is on) may a header speak
   * for the client: reached directly, a forged one would pick its own rate-limit bucket and audit
   * `client`.
   */
  TRUST_PROXY: z
    .string()
    .optional()
    .transform((v) => (v === undefined || v.trim() === '' ? '0' : v.trim())),
  /** Bull Board at /admin/queues. Off unless asked for: it is a write-capable UI. */
  ADMIN_UI_ENABLED: z
    .enum(['true', 'false', '1', '0', ''])
    .optional()
    .transform((v) => v === 'true' || v === '1'),
});

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
});

export type CommonConfig = z.infer<typeof commonSchema>;
/** The senders' secrets are read by variable name (src/sources): `config[source.secret.env]`. */
export type ApiConfig = z.infer<typeof apiSchema> & { apiKeys: ApiKey[] } & { readonly [sourceSecretEnv: string]: unknown };
export type WorkerConfig = z.infer<typeof workerSchema>;

type Env = Record<string, string | undefined>;

/** Every variable's problem (the first of each), so an operator fixes them all in one round. */
function parseWith<S extends z.ZodType>(schema: S, env: Env, earlier: readonly ConfigProblem[] = []): z.infer<S> {
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

const isSet = (env: Env, v: string) => (env[v] ?? '').trim() !== '';

function tlsProblems(env: Env, api: boolean): ConfigProblem[] {
  const out = tlsPairProblems(env, 'METRICS_TLS_CERT_FILE', 'METRICS_TLS_KEY_FILE');
  if (!api) return out;
  out.push(...tlsPairProblems(env, 'TLS_CERT_FILE', 'TLS_KEY_FILE'));
  // A client certificate can only be asked for on a TLS connection.
  if (isSet(env, 'TLS_CLIENT_CA_FILE') && !isSet(env, 'TLS_CERT_FILE') && !isSet(env, 'TLS_KEY_FILE')) {
    out.push({
      variable: 'TLS_CLIENT_CA_FILE',
      problem: 'needs TLS_CERT_FILE and TLS_KEY_FILE (client certificates are checked on HTTPS only)',
    });
  }
  return out;
}

/** The API port's TLS files, or undefined when it serves plain HTTP. */
export function apiTlsFiles(config: Pick<ApiConfig, 'TLS_CERT_FILE' | 'TLS_KEY_FILE' | 'TLS_CLIENT_CA_FILE'>): TlsFiles | undefined {
  if (!config.TLS_CERT_FILE || !config.TLS_KEY_FILE) return undefined;
  return {
    certFile: config.TLS_CERT_FILE,
    keyFile: config.TLS_KEY_FILE,
    ...(config.TLS_CLIENT_CA_FILE ? { caFile: config.TLS_CLIENT_CA_FILE } : {}),
    vars: { cert: 'TLS_CERT_FILE', key: 'TLS_KEY_FILE', ...(config.TLS_CLIENT_CA_FILE ? { ca: 'TLS_CLIENT_CA_FILE' } : {}) },
  };
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

export function loadApiConfig(env: Env = process.env): ApiConfig {
  let apiKeys: ApiKey[] = [];
  const problems: ConfigProblem[] = tlsProblems(env, true);
  try {
    apiKeys = parseApiKeyRoles(env.OPS_API_KEY_ROLES);
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    problems.push(...err.problems);
  }
  return { ...parseWith(apiSchema, env, problems), apiKeys };
}

export function loadWorkerConfig(env: Env = process.env): WorkerConfig {
  return parseWith(workerSchema, env, tlsProblems(env, false));
}

/**
 * Start-up warnings about weak but accepted credentials: one message per API key (by its audit id,
 * never the value) or bearer token shorter than MIN_SECRET_LENGTH characters. The API logs each.
 */
export function weakCredentialWarnings(config: Pick<ApiConfig, 'apiKeys' | 'OPS_BEARER_TOKEN'>): string[] {
  const out: string[] = [];
  config.apiKeys.forEach((k, i) => {
    if (k.key.length < MIN_SECRET_LENGTH)
      out.push(`OPS_API_KEY_ROLES: item ${i + 1} (key:${k.id}) is shorter than ${MIN_SECRET_LENGTH} characters; use a long random key`);
  });
  if (config.OPS_BEARER_TOKEN !== undefined && config.OPS_BEARER_TOKEN.length < MIN_SECRET_LENGTH) {
    out.push(`OPS_BEARER_TOKEN is shorter than ${MIN_SECRET_LENGTH} characters; use a long random token`);
  }
  return out;
}

/** Every secret value of a config, for the logger's last-line-of-defence redaction. */
export function secretsOf(config: Partial<ApiConfig>): string[] {
  const out: unknown[] = [config.OPS_BEARER_TOKEN, ...SOURCE_SECRET_ENVS.map((env) => config[env])];
  for (const k of config.apiKeys ?? []) out.push(k.key);
  return out.filter((s): s is string => typeof s === 'string' && s.length > 0);
}
