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
import { commonSchema, intFrom, optionalPath, parseWith, trimmed, type Env } from '../shared/config.js';

/** The API's environment (beside src/shared/config.ts), read once at start by loadApiConfig, every problem reported at once. */
const optionalSecret = z
  .string()
  .optional()
  .transform((v) => (v === undefined || v === '' ? undefined : v))
  .refine((v) => v === undefined || !isPlaceholder(v), PLACEHOLDER_PROBLEM);

const apiSchema = commonSchema.extend({
  PORT: intFrom(8080),
  TLS_CERT_FILE: optionalPath,
  TLS_KEY_FILE: optionalPath,
  /** With it, /webhook/alerts needs a client certificate signed by one of its CAs. */
  TLS_CLIENT_CA_FILE: optionalPath,
  /** Which certificates of that CA may call /webhook/alerts (src/api/clientNames.ts), or a file of them; parsed by loadApiConfig. */
  TLS_CLIENT_ALLOWED_NAMES: z.string().optional(),
  TLS_CLIENT_ALLOWED_NAMES_FILE: optionalPath,
  /** Opt-in, 0 = off: WAIT for this many replicas before a 202 or 200 (src/domain/replication.ts), under the 2 s command timeout. */
  REDIS_MIN_REPLICAS_ACK: intFrom(0, 0),
  REDIS_ACK_TIMEOUT_MS: intFrom(1000, 1).refine((n) => n <= 1500, 'must be at most 1500 (ms)'),
  OPS_BEARER_TOKEN: optionalSecret,
  /** Who holds OPS_BEARER_TOKEN (an owner), so four eyes can tell its holder from the operators. */
  OPS_BEARER_TOKEN_OWNER: trimmed(undefined).superRefine((v, ctx) => {
    const problem = v === undefined ? undefined : ownerProblem(v);
    if (problem) ctx.addIssue({ code: 'custom', message: problem });
  }),
  /** The credential files (keys, OIDC, senders' secrets, read by loadApiConfig), re-read every SECRETS_RELOAD_INTERVAL_MS. */
  OPS_API_KEYS_FILE: optionalPath,
  OPS_OIDC_FILE: optionalPath,
  /** A key this close to its expiry still works, and every answer to it carries Deprecation and Sunset headers. */
  API_KEY_EXPIRY_WARNING_DAYS: intFrom(14, 0),
  ...Object.fromEntries(SOURCE_SECRET_ENVS.map((env) => [env, optionalSecret])),
  ...Object.fromEntries(SOURCE_SECRET_FILE_ENVS.map((env) => [env, optionalPath])),
  SECRETS_RELOAD_INTERVAL_MS: intFrom(10000, 100),
  /** Alerts accepted in one /webhook/alerts payload; over it 413, nothing queued. */
  ALERTS_MAX_PER_REQUEST: intFrom(1000, 1),
  RATE_LIMIT_RPS: intFrom(50),
  BODY_LIMIT: trimmed('1mb').refine((v) => /^\d+(b|kb|mb)?$/i.test(v), 'must be a size such as 512kb or 1mb'),
  /**
   * Express trust-proxy. Default 0: X-Forwarded-For is ignored; reached directly, a forged one would pick its own rate-limit
   * bucket and audit `client`. Only behind a proxy (the chart's Ingress) may a header speak for the client.
   */
  TRUST_PROXY: trimmed('0'),
  /** How long a dry run waits for the worker's rehearsal; past it the answer says the cluster was not asked. */
  DRY_RUN_TIMEOUT_MS: intFrom(10000, 100),
  /** Bull Board at /admin/queues. Off unless asked for: it is a write-capable UI. */
  ADMIN_UI_ENABLED: z
    .enum(['true', 'false', '1', '0', ''])
    .optional()
    .transform((v) => v === 'true' || v === '1'),
});

export const API_VARIABLES: readonly string[] = Object.keys(apiSchema.shape);

/** `config[source.secret.env]` is a sender's variable as set; `senderSecrets` holds what the API uses, from it or its file. */
export type ApiConfig = z.infer<typeof apiSchema> & {
  /** One array for the life of the process: a reload replaces its contents in place, so every holder sees the new set at once. */
  apiKeys: ApiKey[];
  senderSecrets: Readonly<Record<string, SecretValues>>;
  credentialFiles: readonly CredentialFile[];
  oidc: OidcSettings;
  /** Senders' _FILE variables naming a file that did not exist at start: those senders are not configured until it appears. */
  absentSecretFiles: readonly string[];
  /** The client certificates allowed on /webhook/alerts at start; empty: any of the CA. */
  clientAllowedNames: readonly AllowedName[];
  clientAllowedNamesFile?: CredentialFile;
} & { readonly [sourceSecretEnv: string]: unknown };

const isSet = (env: Env, v: string) => (env[v] ?? '').trim() !== '';

function tlsProblems(env: Env): ConfigProblem[] {
  const out = tlsPairProblems(env, 'METRICS_TLS_CERT_FILE', 'METRICS_TLS_KEY_FILE');
  out.push(...tlsPairProblems(env, 'TLS_CERT_FILE', 'TLS_KEY_FILE'));
  // A client certificate can only be asked for on a TLS connection.
  if (isSet(env, 'TLS_CLIENT_CA_FILE') && !isSet(env, 'TLS_CERT_FILE') && !isSet(env, 'TLS_KEY_FILE')) {
    const problem = 'needs TLS_CERT_FILE and TLS_KEY_FILE (client certificates are checked on HTTPS only)';
    out.push({ variable: 'TLS_CLIENT_CA_FILE', problem });
  }
  for (const v of [ALLOWED_NAMES_VAR, ALLOWED_NAMES_FILE_VAR]) {
    if (isSet(env, v) && !isSet(env, 'TLS_CLIENT_CA_FILE')) {
      out.push({ variable: v, problem: 'needs TLS_CLIENT_CA_FILE (the names are those of client certificates its CA signed)' });
    }
  }
  return out;
}

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
  /** The parsed file a variable names ([] when unset); the file is watched once it parsed. */
  const fromFile = <T>(variable: string, parse: (text: string) => T[]): T[] | undefined => {
    const path = (env[variable] ?? '').trim();
    if (path === '') return [];
    return collect(() => {
      const { text, file } = readCredentialFile(variable, path);
      const parsed = parse(text);
      credentialFiles.push(file);
      return parsed;
    });
  };
  const keysFile = (env.OPS_API_KEYS_FILE ?? '').trim();
  const envKeys = collect(() => parseApiKeyRoles(env.OPS_API_KEY_ROLES, { optional: keysFile !== '' }));
  const fileKeys = fromFile(API_KEYS_FILE_VAR, (text) => parseApiKeysFile(text, envKeys ?? []));
  const apiKeys = [...(envKeys ?? []), ...(fileKeys ?? [])];
  // The contract's rule "no key configured: refuse to start", over both sources.
  if (envKeys && fileKeys && apiKeys.length === 0) {
    problems.push({ variable: API_KEYS_FILE_VAR, problem: 'configures no key, and OPS_API_KEY_ROLES is unset' });
  }
  const issuers = fromFile(OIDC_FILE_VAR, parseOidcFile) ?? [];
  const absentSecretFiles: string[] = [];
  const senderSecrets = loadSenderSecrets(env, problems, credentialFiles, absentSecretFiles);
  const names = collect(() => loadAllowedNames(env)) ?? { list: [] };
  return {
    ...parseWith(apiSchema, env, problems),
    apiKeys,
    senderSecrets,
    credentialFiles,
    oidc: { issuers, configured: (env[OIDC_FILE_VAR] ?? '').trim() !== '' },
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
