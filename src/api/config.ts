import { z } from 'zod';
import { type ConfigProblem, ConfigError } from '../shared/errors.js';
import { SOURCE_SECRET_ENVS, SOURCE_SECRET_FILE_ENVS } from '../sources/index.js';
import { API_KEYS_FILE_VAR, parseApiKeyRoles, parseApiKeysFile, type ApiKey } from './apiKeys.js';
import { isPlaceholder, loadSenderSecrets, PLACEHOLDER_PROBLEM, readCredentialFile } from '../shared/secrets.js';
import { ownerProblem } from './identity.js';
import type { CredentialFile, SecretValues } from '../shared/liveSecrets.js';
import { tlsPairProblems, type TlsFiles } from '../shared/tls.js';
import { OIDC_FILE_VAR, parseOidcFile, type OidcSettings } from './oidcConfig.js';
import { outboundSecrets } from '../shared/outboundVariables.js';
import { ALLOWED_NAMES_FILE_VAR, ALLOWED_NAMES_VAR, loadAllowedNames, type AllowedName } from './clientNames.js';
import { commonSchema, intFrom, optionalPath, parseWith, type Env } from '../shared/config.js';

/**
 * The API's environment: its variables' schemas and defaults (beside the ones both processes read,
 * src/shared/config.ts), read once at start by loadApiConfig, every problem reported at once. The
 * API keys are parsed by src/shared/apiKeys.ts, the senders' secrets and the credential files read
 * by src/shared/secrets.ts.
 */

const optionalSecret = z
  .string()
  .optional()
  .transform((v) => (v === undefined || v === '' ? undefined : v))
  .refine((v) => v === undefined || !isPlaceholder(v), PLACEHOLDER_PROBLEM);

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

const isSet = (env: Env, v: string) => (env[v] ?? '').trim() !== '';

function tlsProblems(env: Env): ConfigProblem[] {
  const out = tlsPairProblems(env, 'METRICS_TLS_CERT_FILE', 'METRICS_TLS_KEY_FILE');
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

export function loadApiConfig(env: Env = process.env): ApiConfig {
  const problems: ConfigProblem[] = tlsProblems(env);
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
