import { z } from 'zod';
import { ConfigError } from './errors.js';
import { credentialId } from './crypto.js';
import { parseRedisUrl, RedisUrlError } from './redis.js';

export type Role = 'readonly' | 'operator';

export interface ApiKey {
  /** The secret itself; only ever compared in constant time, never logged. */
  readonly key: string;
  readonly role: Role;
  /** Audit identity: first 12 hex of SHA-256(key). */
  readonly id: string;
}

/**
 * Parses OPS_API_KEY_ROLES: comma-separated `<API_KEY>:<role>` items, the role being the text
 * after the last colon (so keys may contain colons). Refuses a missing/blank value, an item
 * without `key:role`, an empty key, an unknown role, or no key at all. Errors name the
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
    keys.push({ key, role, id: credentialId(key) });
  });
  if (keys.length === 0) throw new ConfigError(name, 'configures no key'); // unreachable after the checks above; kept as the spec's own rule
  return keys;
}

const optionalSecret = z
  .string()
  .optional()
  .transform((v) => (v === undefined || v === '' ? undefined : v));

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
  });

const commonSchema = z.object({
  REDIS_URL: redisUrl,
  METRICS_PORT: intFrom(9464),
  OPS_INVENTORY_FILE: z.string().optional().transform((v) => (v ? v : undefined)),
  LOG_LEVEL: z.enum(['debug', 'info', 'warn', 'error']).optional().default('info'),
  JOB_ATTEMPTS: intFrom(5, 1),
  JOB_BACKOFF_MS: intFrom(10000, 0),
  JOB_TIMEOUT_SECONDS: intFrom(900, 1),
  OPSGATE_VERSION: z.string().optional(),
});

/**
 * "Acknowledged means replicated" (opt-in): before a webhook's 202 or a restart's 200, WAIT until
 * this many replicas hold the seen record and the job (src/domain/replication.ts). 0 = off.
 * The wait is bounded by REDIS_ACK_TIMEOUT_MS, kept under the request connection's 2 s command
 * timeout.
 */
const replicationSchema = {
  REDIS_MIN_REPLICAS_ACK: intFrom(0, 0),
  REDIS_ACK_TIMEOUT_MS: intFrom(1000, 1).refine((n) => n <= 1500, 'must be at most 1500 (ms)'),
};

const apiSchema = commonSchema.extend({
  PORT: intFrom(8080),
  ...replicationSchema,
  OPS_BEARER_TOKEN: optionalSecret,
  SCM_WEBHOOK_SECRET: optionalSecret,
  GITHUB_WEBHOOK_SECRET: optionalSecret,
  ALERTS_WEBHOOK_TOKEN: optionalSecret,
  RATE_LIMIT_RPS: intFrom(50),
  BODY_LIMIT: z
    .string()
    .optional()
    .transform((v) => (v === undefined || v.trim() === '' ? '1mb' : v.trim()))
    .refine((v) => /^\d+(b|kb|mb)?$/i.test(v), 'must be a size such as 512kb or 1mb'),
  TRUST_PROXY: z
    .string()
    .optional()
    .transform((v) => (v === undefined || v.trim() === '' ? '1' : v.trim())),
  ADMIN_UI_ENABLED: z
    .enum(['true', 'false', '1', '0', ''])
    .optional()
    .transform((v) => v === undefined || v === '' || v === 'true' || v === '1'),
});

const workerSchema = commonSchema.extend({
  NOTIFY_WEBHOOK_URLS: z
    .string()
    .optional()
    .transform((v, ctx) => {
      const urls = (v ?? '').split(',').map((s) => s.trim()).filter(Boolean);
      for (const u of urls) {
        if (!/^https?:\/\//.test(u)) {
          ctx.addIssue({ code: 'custom', message: 'must be a comma-separated list of http(s) URLs' });
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
});

export type CommonConfig = z.infer<typeof commonSchema>;
export type ApiConfig = z.infer<typeof apiSchema> & { apiKeys: ApiKey[] };
export type WorkerConfig = z.infer<typeof workerSchema>;

type Env = Record<string, string | undefined>;

function parseWith<S extends z.ZodType>(schema: S, env: Env): z.infer<S> {
  const result = schema.safeParse(env);
  if (!result.success) {
    const issue = result.error.issues[0]!;
    const variable = String(issue.path[0] ?? 'environment');
    // zod's message for a missing string is "Invalid input..."; keep ours short and value-free.
    const problem = issue.code === 'invalid_type' ? 'is required' : issue.message;
    throw new ConfigError(variable, problem);
  }
  return result.data;
}

export function loadApiConfig(env: Env = process.env): ApiConfig {
  const apiKeys = parseApiKeyRoles(env.OPS_API_KEY_ROLES);
  return { ...parseWith(apiSchema, env), apiKeys };
}

export function loadWorkerConfig(env: Env = process.env): WorkerConfig {
  return parseWith(workerSchema, env);
}

/** Every secret value of a config, for the logger's last-line-of-defence redaction. */
export function secretsOf(config: Partial<ApiConfig>): string[] {
  const out = [config.OPS_BEARER_TOKEN, config.SCM_WEBHOOK_SECRET, config.GITHUB_WEBHOOK_SECRET, config.ALERTS_WEBHOOK_TOKEN];
  for (const k of config.apiKeys ?? []) out.push(k.key);
  return out.filter((s): s is string => typeof s === 'string' && s.length > 0);
}
