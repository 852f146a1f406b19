import { existsSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { rfc3339 } from './apiKeyLifetime.js';
import { ConfigError, type ConfigProblem } from './errors.js';
import { credentialId, sha256Digest } from './crypto.js';
import { parseRedisUrl, redisPasswords, RedisUrlError } from './redis.js';
import { secretFileVar, SOURCE_SECRET_ENVS, SOURCE_SECRET_FILE_ENVS } from '../sources/index.js';
import { contentsDigest, FileProblem, readWatchedFile } from './fileReload.js';
import { envKeyOwner, keyPrincipal, ownerProblem, widthProblem } from './identity.js';
import type { CredentialFile, SecretValues } from './liveSecrets.js';
import { tlsPairProblems, type TlsFiles } from './tls.js';
import { OIDC_FILE_VAR, parseOidcFile, type OidcSettings } from './oidcConfig.js';
import { scopeSchema, type Scope } from './scope.js';
import { outboundSecrets, outboundVariables } from './outboundVariables.js';
import { ALLOWED_NAMES_FILE_VAR, ALLOWED_NAMES_VAR, parseAllowedNames, type AllowedName } from './clientNames.js';

export type Role = 'readonly' | 'operator';

/** Where a key is configured: OPS_API_KEY_ROLES (the contract's form) or the keys file. */
export type ApiKeySource = 'env' | 'file';

export interface ApiKey {
  /**
   * Audit identity and metric label: a keys-file entry's `id`; for OPS_API_KEY_ROLES the first 12
   * hex of SHA-256(key). Never the key.
   */
  readonly id: string;
  /**
   * Who holds the key (a person or a service; src/shared/identity.ts): a keys-file entry's `owner`,
   * else its id; `env:<id>` for a key of OPS_API_KEY_ROLES, which names none. Two keys with one
   * owner are one person.
   */
  readonly owner: string;
  readonly role: Role;
  /** SHA-256 of the key (32 bytes): a presented key is hashed and compared with it in constant time. */
  readonly digest: Buffer;
  /** The key itself when it is configured in clear (absent for a `sha256` entry); never logged. */
  readonly key?: string;
  /** When the key stops working (ms since the epoch); absent: it does not expire. */
  readonly expiresAt?: number;
  readonly source: ApiKeySource;
  /** What the key may act on (a keys-file entry's `scope`, src/shared/scope.ts); absent: everything its role allows. */
  readonly scope?: Scope;
  /** 1-based position in its source (item of OPS_API_KEY_ROLES, entry of the keys file), for start-up messages. */
  readonly position: number;
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
export function parseApiKeyRoles(raw: string | undefined, opts: { optional?: boolean } = {}): ApiKey[] {
  const name = 'OPS_API_KEY_ROLES';
  if (raw === undefined || raw.trim() === '') {
    // With a keys file the file may hold every key (its entries can be hashes, so the Secret holds no usable key).
    if (opts.optional) return [];
    throw new ConfigError(name, 'is required and must not be blank (or set OPS_API_KEYS_FILE)');
  }
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
    const id = credentialId(key);
    const tooWide = widthProblem(keyPrincipal(id));
    if (tooWide) throw new ConfigError(name, `item ${i + 1} has a principal key:<id> that ${tooWide}`);
    keys.push({ key, role, id, owner: envKeyOwner(id), digest: sha256Digest(key), source: 'env', position: i + 1 });
  });
  // Unreachable after the checks above; kept because the contract names it: no configured key, no start.
  if (keys.length === 0) throw new ConfigError(name, 'configures no key');
  return keys;
}

export const API_KEYS_FILE_VAR = 'OPS_API_KEYS_FILE';

/** A keys-file id: it labels metrics and appears in headers, logs and answers, so it is kept short and plain. */
export const API_KEY_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;

const FILE_FIELDS = ['id', 'role', 'key', 'sha256', 'expires', 'owner', 'scope'] as const;

/** A field's message: `absent` when the entry lacks it, `wrong` when it holds something else. */
const fieldError =
  (absent: string, wrong: string) =>
  (issue: { input?: unknown }): string =>
    issue.input === undefined ? absent : wrong;

/**
 * One entry of the keys file. Unknown fields are refused: a misspelt `expires` would otherwise
 * leave a key that never expires. Messages name the field, never its value.
 */
const keyEntrySchema = z
  .strictObject({
    id: z
      .string({ error: fieldError('has no id', 'has an id that is not text (quote it)') })
      .regex(API_KEY_ID, 'has an id that is not 1-63 letters, digits, ".", "_" or "-" (starting with a letter or digit)'),
    role: z.enum(['readonly', 'operator'], { error: fieldError('has no role', 'has a role that is not readonly or operator') }),
    key: z.string({ error: 'has a key that is not text (quote it)' }).min(1, 'has an empty key').optional(),
    sha256: z
      .string({ error: 'has a sha256 that is not text (quote it)' })
      .regex(/^[0-9a-fA-F]{64}$/, 'has a sha256 that is not 64 hex characters (the SHA-256 of the key)')
      .optional(),
    expires: z
      .string({ error: 'has an expires that is not text (quote it)' })
      .pipe(z.iso.datetime({ offset: true, error: 'has an expires that is not an RFC 3339 date-time such as 2026-03-01T00:00:00Z' }))
      .optional(),
    owner: z
      .string({ error: 'has an owner that is not text (quote it)' })
      .superRefine((v, ctx) => {
        const problem = ownerProblem(v);
        if (problem) ctx.addIssue({ code: 'custom', message: `has an owner that ${problem}` });
      })
      .optional(),
    // Checked on its own below, so its problem is worded for the keys file.
    scope: z.unknown().optional(),
  })
  .refine((e) => (e.key === undefined) !== (e.sha256 === undefined), 'needs exactly one of key or sha256');

/** `entry 3 (id "ci")`; the id only when it is a valid one, so nothing else from the file is echoed. */
function entryName(position: number, raw: unknown): string {
  const id = typeof raw === 'object' && raw !== null ? (raw as { id?: unknown }).id : undefined;
  return typeof id === 'string' && API_KEY_ID.test(id) ? `entry ${position} (id "${id}")` : `entry ${position}`;
}

/** The problem of one entry: zod's first issue, or a duplicate. */
function keyEntry(raw: unknown, position: number, earlier: readonly ApiKey[], envKeys: readonly ApiKey[]): ApiKey | string {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) return 'is not a mapping of id, role, key or sha256, expires, owner';
  const parsed = keyEntrySchema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    // The names of unknown fields are not repeated: a key pasted as a field name would be echoed.
    return issue.code === 'unrecognized_keys' ? `has a field other than ${FILE_FIELDS.join(', ')}` : issue.message;
  }
  const e = parsed.data;
  let scope: Scope | undefined;
  if (e.scope !== undefined) {
    const s = scopeSchema.safeParse(e.scope);
    if (!s.success) {
      const issue = s.error.issues[0]!;
      return issue.code === 'custom'
        ? `has a scope that ${issue.message}`
        : 'has a scope that is not a mapping of hosts, namespaces, projects (lists of names)';
    }
    scope = s.data;
  }
  const tooWide = widthProblem(keyPrincipal(e.id));
  if (tooWide) return `has an id whose principal key:<id> ${tooWide}`;
  if (e.key !== undefined && isPlaceholder(e.key)) return `has a key that ${PLACEHOLDER_PROBLEM}`;
  const digest = e.key !== undefined ? sha256Digest(e.key) : Buffer.from(e.sha256!, 'hex');
  const sameId = earlier.find((k) => k.id === e.id);
  if (sameId) return `repeats the id of entry ${sameId.position}`;
  const envSameId = envKeys.find((k) => k.id === e.id);
  if (envSameId) return `has the id of OPS_API_KEY_ROLES item ${envSameId.position}`;
  const sameKey = earlier.find((k) => k.digest.equals(digest));
  if (sameKey) return `holds the same key as ${entryName(sameKey.position, sameKey)}; list each key once`;
  const envSameKey = envKeys.find((k) => k.digest.equals(digest));
  if (envSameKey) return `holds the same key as OPS_API_KEY_ROLES item ${envSameKey.position}; list each key once`;
  return {
    id: e.id,
    owner: e.owner ?? e.id,
    role: e.role,
    digest,
    ...(e.key !== undefined ? { key: e.key } : {}),
    ...(e.expires !== undefined ? { expiresAt: Date.parse(e.expires) } : {}),
    ...(scope ? { scope } : {}),
    source: 'file',
    position,
  };
}

/**
 * Parses the text of OPS_API_KEYS_FILE (YAML or JSON): a list of {id, role, key or sha256, expires?, owner?}.
 * Every bad entry is reported at once, each by its position and id, never its key or hash; an id
 * or a key listed twice (in the file, or also in `envKeys`, OPS_API_KEY_ROLES) is refused.
 */
export function parseApiKeysFile(text: string, envKeys: readonly ApiKey[] = []): ApiKey[] {
  const variable = API_KEYS_FILE_VAR;
  let raw: unknown;
  try {
    raw = parseYaml(text); // YAML is a superset of JSON
  } catch {
    throw new ConfigError(variable, 'is not valid YAML or JSON');
  }
  raw ??= [];
  if (!Array.isArray(raw)) throw new ConfigError(variable, 'must hold a list of entries {id, role, key or sha256, expires, owner}');
  const problems: ConfigProblem[] = [];
  const keys: ApiKey[] = [];
  (raw as unknown[]).forEach((entry, i) => {
    const out = keyEntry(entry, i + 1, keys, envKeys);
    if (typeof out === 'string') problems.push({ variable, problem: `${entryName(i + 1, entry)} ${out}` });
    else keys.push(out);
  });
  if (problems.length > 0) throw new ConfigError(problems);
  return keys;
}

/**
 * The text of a sender's secret file (`<VARIABLE>_FILE`): the secret on the first line and, during
 * a rotation, the previous one on the second; line ends (LF or CRLF, and a final one) are not part
 * of a value. Refused, naming the line and never its text: no secret, an empty line, more than two
 * values, spaces or tabs around a value (a pasting mistake no sender would reproduce), a
 * placeholder.
 */
export function parseSecretFile(text: string, variable: string): string[] {
  const lines = text.split('\n').map((l) => (l.endsWith('\r') ? l.slice(0, -1) : l));
  if (lines.length > 1 && lines[lines.length - 1] === '') lines.pop();
  const fail = (problem: string): never => {
    throw new ConfigError(variable, problem);
  };
  if (lines[0] === '') fail('holds no secret (its first line is empty)');
  if (lines.length > 2) fail('holds more than two lines (the secret in use, then at most the previous one)');
  lines.forEach((l, i) => {
    if (l === '') fail(`line ${i + 1} is empty`);
    if (l.trim() !== l) fail(`line ${i + 1} has spaces or tabs around the secret`);
    if (isPlaceholder(l)) fail(`line ${i + 1} ${PLACEHOLDER_PROBLEM}`);
  });
  return lines;
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
   * Alertmanager's address (its API v2 under /api/v2), for alert-driven remediation: a firing
   * alert is confirmed there before anything is restarted, its resolution read there, and the
   * silences of the rules with `silence: true` kept there. Unset: notifications alone, no silence.
   */
  ALERTMANAGER_URL: z
    .string()
    .optional()
    .transform((v) => (v === undefined || v.trim() === '' ? undefined : v.trim().replace(/\/+$/, '')))
    .refine((v) => v === undefined || /^https?:\/\/[^\s]+$/.test(v), 'must be an http(s) URL'),
  /**
   * Where alerts are born, for alert-driven remediation: Prometheus (or a server answering its
   * query API, such as Thanos Query). A rule with `confirm: prometheus` acts only on an alert
   * Prometheus itself fires, timed by Prometheus (src/remediation/prometheus.ts).
   */
  PROMETHEUS_URL: z
    .string()
    .optional()
    .transform((v) => (v === undefined || v.trim() === '' ? undefined : v.trim().replace(/\/+$/, '')))
    .refine((v) => v === undefined || /^https?:\/\/[^\s]+$/.test(v), 'must be an http(s) URL'),
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
  /**
   * Which certificates of that CA may call /webhook/alerts (src/shared/clientNames.ts): comma-separated
   * `DNS:<name>`, `URI:<uri>`, `<ATTR>=<value>`; empty: any certificate the CA signed (a warning at
   * start). Parsed by loadApiConfig.
   */
  TLS_CLIENT_ALLOWED_NAMES: z.string().optional(),
  /** The same list in a file (one or more entries a line), re-read every TLS_RELOAD_INTERVAL_MS; read by loadApiConfig. */
  TLS_CLIENT_ALLOWED_NAMES_FILE: optionalPath,
  ...replicationSchema,
  OPS_BEARER_TOKEN: optionalSecret,
  /**
   * Who holds OPS_BEARER_TOKEN (an owner, src/shared/identity.ts), so four eyes can tell its holder
   * from the operators. Unset: the token's owner is unknown.
   */
  OPS_BEARER_TOKEN_OWNER: z
    .string()
    .optional()
    .transform((v) => (v === undefined || v.trim() === '' ? undefined : v.trim()))
    .superRefine((v, ctx) => {
      const problem = v === undefined ? undefined : ownerProblem(v);
      if (problem) ctx.addIssue({ code: 'custom', message: problem });
    }),
  /** Keys file (YAML or JSON list of {id, role, key or sha256, expires, owner, scope}), beside OPS_API_KEY_ROLES; read by loadApiConfig. */
  OPS_API_KEYS_FILE: optionalPath,
  /**
   * OIDC issuers and claim rules (YAML or JSON, src/shared/oidcConfig.ts): their ID tokens are
   * accepted as bearer tokens on POST /ops/restart and POST /ops/deploys; read by loadApiConfig and
   * re-read every SECRETS_RELOAD_INTERVAL_MS.
   */
  OPS_OIDC_FILE: optionalPath,
  /**
   * A key this many days (or fewer) from its expiry still works, and every answer to it carries
   * Deprecation and Sunset headers, so callers learn of the expiry before it happens.
   */
  API_KEY_EXPIRY_WARNING_DAYS: intFrom(14, 0),
  /** The webhook senders' secrets, one variable each, named by src/sources. */
  ...Object.fromEntries(SOURCE_SECRET_ENVS.map((env) => [env, optionalSecret])),
  /**
   * File mode of each: `<VARIABLE>_FILE`, a file holding the secret (and during a rotation the
   * previous one on a second line), re-read every SECRETS_RELOAD_INTERVAL_MS; read by loadApiConfig.
   */
  ...Object.fromEntries(SOURCE_SECRET_FILE_ENVS.map((env) => [env, optionalPath])),
  /** How often the keys file and the senders' secret files are re-read, so a rotation needs no restart. */
  SECRETS_RELOAD_INTERVAL_MS: intFrom(10000, 100),
  /** Each sender's last deliveries kept for GET /ops/deliveries (a capped stream per sender); 0 keeps none. */
  DELIVERIES_KEPT: intFrom(1000, 0),
  /**
   * Each sender's last unverified deliveries (its proof missing or wrong, or refused before it was
   * checked: rate-limited), kept apart in a smaller stream so that anyone's flood of them evicts
   * none of the verified ones; 0 keeps none.
   */
  DELIVERIES_UNVERIFIED_KEPT: intFrom(100, 0),
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
  /**
   * How long a dry run (POST /ops/restart?dry_run=true, a replay's dry_run) waits for the worker's
   * rehearsal against the Kubernetes API; past it the answer says the cluster was not asked.
   */
  DRY_RUN_TIMEOUT_MS: intFrom(10000, 100),
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
  /**
   * The API's address as operators reach it, for the notifications of guarded changes ("approve:
   * POST <url>/ops/approvals/<id>/approve"); unset: the path alone.
   */
  OPSGATE_PUBLIC_URL: z
    .string()
    .optional()
    .transform((v) => (v === undefined || v.trim() === '' ? undefined : v.trim().replace(/\/+$/, '')))
    .refine((v) => v === undefined || /^https?:\/\/[^\s]+$/.test(v), 'must be an http(s) URL'),
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
});

/** Every variable the worker reads (its schema's keys), so the chart can be held to setting each one. */
export const WORKER_VARIABLES: readonly string[] = Object.keys(workerSchema.shape);

export type CommonConfig = z.infer<typeof commonSchema>;
/** Every variable the API reads (its schema's keys). */
export const API_VARIABLES: readonly string[] = Object.keys(apiSchema.shape);

/**
 * The senders' secrets are read by variable name (src/sources): `config[source.secret.env]` is
 * the variable as set; `senderSecrets` holds what the API uses, from the variable or its file.
 */
export type ApiConfig = z.infer<typeof apiSchema> & {
  /**
   * Every configured key. One array for the life of the process: a reload of the keys file replaces
   * its contents in place, so whatever holds it (the routes' key checks, Bull Board, the metrics)
   * sees the new set at once.
   */
  apiKeys: ApiKey[];
  /** Each sender secret variable's values at start ([current] or [current, previous]), from the variable or its _FILE. */
  senderSecrets: Readonly<Record<string, SecretValues>>;
  /** The files re-read while the API runs: the keys file, the OIDC file and the senders' secret files, as loaded at start. */
  credentialFiles: readonly CredentialFile[];
  /** The OIDC issuers in use (OPS_OIDC_FILE); one object for the life of the process, its list replaced by a reload. */
  oidc: OidcSettings;
  /** Senders' _FILE variables naming a file that did not exist at start: those senders are not configured until it appears. */
  absentSecretFiles: readonly string[];
  /** The client certificates allowed on /webhook/alerts at start (TLS_CLIENT_ALLOWED_NAMES or its file); empty: any of the CA. */
  clientAllowedNames: readonly AllowedName[];
  /** TLS_CLIENT_ALLOWED_NAMES_FILE as loaded at start, for the reload poll. */
  clientAllowedNamesFile?: CredentialFile;
} & { readonly [sourceSecretEnv: string]: unknown };
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
  for (const v of [ALLOWED_NAMES_VAR, ALLOWED_NAMES_FILE_VAR]) {
    if (isSet(env, v) && !isSet(env, 'TLS_CLIENT_CA_FILE')) {
      out.push({ variable: v, problem: 'needs TLS_CLIENT_CA_FILE (the names are those of client certificates its CA signed)' });
    }
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

/** Reads a credential file at start-up: its text and what the reload poll compares with. */
function readCredentialFile(variable: string, path: string): { text: string; file: CredentialFile } {
  let bytes: Buffer;
  try {
    bytes = readWatchedFile({ variable, path });
  } catch (err) {
    if (err instanceof FileProblem) throw new ConfigError(variable, err.problem.problem);
    throw err;
  }
  return { text: bytes.toString('utf8'), file: { variable, path, digest: contentsDigest([bytes]) } };
}

/**
 * The senders' secrets: each variable's value, or its file's values; both set is a problem of the
 * file variable. A file that does not exist leaves its sender unconfigured, as an unset variable
 * does (an optional key absent from a mounted Secret, or one the kubelet has not written yet): it
 * is named in `absent` for a warning, and watched like the others, so its sender is configured
 * when it appears.
 */
function loadSenderSecrets(env: Env, problems: ConfigProblem[], files: CredentialFile[], absent: string[]): Record<string, SecretValues> {
  const out: Record<string, SecretValues> = {};
  for (const name of SOURCE_SECRET_ENVS) {
    const fileVar = secretFileVar(name);
    const path = (env[fileVar] ?? '').trim();
    if (path === '') {
      const value = env[name];
      if (value !== undefined && value !== '' && !isPlaceholder(value)) out[name] = [value];
      continue;
    }
    if (isSet(env, name)) {
      problems.push({ variable: fileVar, problem: `is set together with ${name}; set one of them` });
      continue;
    }
    if (!existsSync(path)) {
      absent.push(fileVar);
      files.push({ variable: fileVar, path, digest: contentsDigest([undefined]), optional: true });
      continue;
    }
    try {
      const { text, file } = readCredentialFile(fileVar, path);
      out[name] = parseSecretFile(text, fileVar);
      files.push({ ...file, optional: true });
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err;
      problems.push(...err.problems);
    }
  }
  return out;
}

export function loadApiConfig(env: Env = process.env): ApiConfig {
  const problems: ConfigProblem[] = tlsProblems(env, true);
  const collect = <T>(fn: () => T): T | undefined => {
    try {
      return fn();
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err;
      problems.push(...err.problems);
      return undefined;
    }
  };
  const credentialFiles: CredentialFile[] = [];
  const keysFile = (env.OPS_API_KEYS_FILE ?? '').trim();
  const envKeys = collect(() => parseApiKeyRoles(env.OPS_API_KEY_ROLES, { optional: keysFile !== '' }));
  const fileKeys =
    keysFile === ''
      ? []
      : collect(() => {
          const { text, file } = readCredentialFile(API_KEYS_FILE_VAR, keysFile);
          const keys = parseApiKeysFile(text, envKeys ?? []);
          credentialFiles.push(file);
          return keys;
        });
  const apiKeys = [...(envKeys ?? []), ...(fileKeys ?? [])];
  // The contract's rule "no key configured: refuse to start", over both sources.
  if (envKeys && fileKeys && apiKeys.length === 0) {
    problems.push({ variable: API_KEYS_FILE_VAR, problem: 'configures no key, and OPS_API_KEY_ROLES is unset' });
  }
  const oidcFile = (env[OIDC_FILE_VAR] ?? '').trim();
  const issuers =
    oidcFile === ''
      ? []
      : (collect(() => {
          const { text, file } = readCredentialFile(OIDC_FILE_VAR, oidcFile);
          const parsed = parseOidcFile(text);
          credentialFiles.push(file);
          return parsed;
        }) ?? []);
  const absentSecretFiles: string[] = [];
  const senderSecrets = loadSenderSecrets(env, problems, credentialFiles, absentSecretFiles);
  const names = loadAllowedNames(env, problems);
  return {
    ...parseWith(apiSchema, env, problems),
    apiKeys,
    senderSecrets,
    credentialFiles,
    oidc: { issuers, configured: oidcFile !== '' },
    absentSecretFiles,
    clientAllowedNames: names.list,
    ...(names.file ? { clientAllowedNamesFile: names.file } : {}),
  };
}

/**
 * The text of TLS_CLIENT_ALLOWED_NAMES_FILE: the list, which must name someone. An empty file
 * would let in every certificate of the CA; that is what leaving the variables unset says, so an
 * emptied file (a key gone from a ConfigMap, a truncated write) is refused instead of meaning it.
 */
export function parseAllowedNamesFile(text: string): AllowedName[] {
  const list = parseAllowedNames(text, ALLOWED_NAMES_FILE_VAR, { file: true });
  if (list.length === 0) {
    throw new ConfigError(ALLOWED_NAMES_FILE_VAR, `lists no name (to accept any certificate of the CA, unset ${ALLOWED_NAMES_FILE_VAR})`);
  }
  return list;
}

/** TLS_CLIENT_ALLOWED_NAMES, or its file (not both). */
function loadAllowedNames(env: Env, problems: ConfigProblem[]): { list: AllowedName[]; file?: CredentialFile } {
  try {
    const path = (env[ALLOWED_NAMES_FILE_VAR] ?? '').trim();
    if (path === '') return { list: parseAllowedNames(env[ALLOWED_NAMES_VAR], ALLOWED_NAMES_VAR) };
    if (isSet(env, ALLOWED_NAMES_VAR)) {
      problems.push({ variable: ALLOWED_NAMES_FILE_VAR, problem: `is set together with ${ALLOWED_NAMES_VAR}; set one of them` });
      return { list: [] };
    }
    const { text, file } = readCredentialFile(ALLOWED_NAMES_FILE_VAR, path);
    return { list: parseAllowedNamesFile(text), file };
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    problems.push(...err.problems);
    return { list: [] };
  }
}

/**
 * Start-up warning: client certificates are checked against a CA, and every certificate it signed
 * is accepted. Right for a CA of Alertmanager's alone; with a CA that signs for other workloads
 * (a cluster issuer) any of them can post alerts.
 */
export function clientCertificateWarnings(config: Pick<ApiConfig, 'TLS_CLIENT_CA_FILE' | 'clientAllowedNames'>): string[] {
  if (!config.TLS_CLIENT_CA_FILE || config.clientAllowedNames.length > 0) return [];
  return [
    `TLS_CLIENT_CA_FILE is set without ${ALLOWED_NAMES_VAR}: /webhook/alerts accepts every client certificate its CA signed; list the names of Alertmanager's certificate (DNS:<name>, URI:<uri> or CN=<name>)`,
  ];
}

/**
 * The keys of a new keys file, checked as at start against the keys of OPS_API_KEY_ROLES (which
 * stay): every problem of the file, or no key left at all, is a ConfigError.
 */
export function reloadApiKeys(text: string, envKeys: readonly ApiKey[]): ApiKey[] {
  const fileKeys = parseApiKeysFile(text, envKeys);
  if (envKeys.length + fileKeys.length === 0) {
    throw new ConfigError(API_KEYS_FILE_VAR, 'configures no key, and OPS_API_KEY_ROLES is unset');
  }
  return [...envKeys, ...fileKeys];
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
  for (const k of config.apiKeys) {
    if (k.key === undefined || k.key.length >= MIN_SECRET_LENGTH) continue;
    const where =
      k.source === 'env'
        ? `OPS_API_KEY_ROLES: item ${k.position} (key:${k.id})`
        : `${API_KEYS_FILE_VAR}: entry ${k.position} (id "${k.id}")`;
    out.push(`${where} is shorter than ${MIN_SECRET_LENGTH} characters; use a long random key`);
  }
  if (config.OPS_BEARER_TOKEN !== undefined && config.OPS_BEARER_TOKEN.length < MIN_SECRET_LENGTH) {
    out.push(`OPS_BEARER_TOKEN is shorter than ${MIN_SECRET_LENGTH} characters; use a long random token`);
  }
  return out;
}

/** Every secret value of a config, for the logger's last-line-of-defence redaction. */
export function secretsOf(config: Partial<ApiConfig>): string[] {
  const out: unknown[] = [
    config.OPS_BEARER_TOKEN,
    ...outboundSecrets(config, 'PROMETHEUS'),
    ...outboundSecrets(config, 'ALERTMANAGER'),
    ...SOURCE_SECRET_ENVS.map((env) => config[env]),
    ...Object.values(config.senderSecrets ?? {}).flat(),
  ];
  // A hash entry's digest is no usable key, but it is kept out of logs all the same.
  for (const k of config.apiKeys ?? []) out.push(k.key ?? k.digest.toString('hex'));
  return [...new Set(out.filter((s): s is string => typeof s === 'string' && s.length > 0))];
}

/** Start-up warnings about secret files that do not exist: their senders run unconfigured, as with the variable unset. */
export function absentSecretFileWarnings(config: Pick<ApiConfig, 'absentSecretFiles'>): string[] {
  return config.absentSecretFiles.map(
    (v) =>
      `${v} names a file that does not exist: its sender is not configured, as if ${v.replace(/_FILE$/, '')} were unset, until the file appears`,
  );
}

/**
 * Start-up warnings about keys-file entries already past their expiry: accepted (a Secret may be
 * updated late), every call with such a key answers 401. By id and date, never the key.
 */
export function expiredKeyWarnings(config: Pick<ApiConfig, 'apiKeys'>, now: number = Date.now()): string[] {
  return config.apiKeys
    .filter((k) => k.expiresAt !== undefined && k.expiresAt <= now)
    .map(
      (k) => `${API_KEYS_FILE_VAR}: entry ${k.position} (id "${k.id}") expired at ${rfc3339(k.expiresAt!)}; every call with it answers 401`,
    );
}
