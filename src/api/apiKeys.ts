import { z } from 'zod';
import { rfc3339 } from './apiKeyLifetime.js';
import { ConfigError, type ConfigProblem } from '../shared/errors.js';
import { credentialId, sha256Digest } from '../shared/crypto.js';
import { envKeyOwner, keyPrincipal, ownerProblem, widthProblem } from './identity.js';
import { scopeSchema, type Scope } from '../shared/scope.js';
import { parseYamlFile } from '../shared/config.js';
import { isPlaceholder, MIN_SECRET_LENGTH, PLACEHOLDER_PROBLEM } from '../shared/secrets.js';

/** The API keys of OPS_API_KEY_ROLES and of the keys file, and the start-up warnings about them. Messages never name a key. */
export type Role = 'readonly' | 'operator';

export interface ApiKey {
  /** Audit identity and metric label: a keys-file entry's `id`; for OPS_API_KEY_ROLES the first 12 hex of SHA-256(key). */
  readonly id: string;
  /** Who holds the key: a keys-file entry's `owner`, else its id; `env:<id>` for a key of OPS_API_KEY_ROLES. */
  readonly owner: string;
  readonly role: Role;
  /** SHA-256 of the key: a presented key is hashed and compared with it in constant time. */
  readonly digest: Buffer;
  /** The key itself when it is configured in clear (absent for a `sha256` entry); never logged. */
  readonly key?: string;
  readonly expiresAt?: number;
  readonly source: 'env' | 'file';
  readonly scope?: Scope;
  readonly position: number;
}

/** OPS_API_KEY_ROLES: `<key>:<role>` items, the role after the last colon; a key listed twice is refused (which role wins?). */
export function parseApiKeyRoles(raw: string | undefined, opts: { optional?: boolean } = {}): ApiKey[] {
  const name = 'OPS_API_KEY_ROLES';
  if (raw === undefined || raw.trim() === '') {
    // With a keys file the file may hold every key (its entries can be hashes, so the Secret holds no usable key).
    if (opts.optional) return [];
    throw new ConfigError(name, 'is required and must not be blank (or set OPS_API_KEYS_FILE)');
  }
  const keys: ApiKey[] = [];
  raw.split(',').forEach((part, i) => {
    const item = part.trim();
    // An empty item (",," or a trailing comma) is refused rather than guessed at (often a key lost in a templating mistake).
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

/** One entry of the keys file. Unknown fields are refused: a misspelt `expires` would leave a key that never expires. */
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
  const sameKey = [...earlier, ...envKeys].find((k) => k.digest.equals(digest));
  if (sameKey) {
    return `holds the same key as ${sameKey.source === 'file' ? entryName(sameKey.position, sameKey) : `OPS_API_KEY_ROLES item ${sameKey.position}`}; list each key once`;
  }
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

/** Parses the text of OPS_API_KEYS_FILE; every bad entry is reported at once, by its position and id, never its key or hash. */
export function parseApiKeysFile(text: string, envKeys: readonly ApiKey[] = []): ApiKey[] {
  const variable = API_KEYS_FILE_VAR;
  const raw = parseYamlFile(text, variable) ?? [];
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

/** The keys of a new keys file beside those of OPS_API_KEY_ROLES (which stay), checked as at start. */
export function reloadApiKeys(text: string, envKeys: readonly ApiKey[]): ApiKey[] {
  const fileKeys = parseApiKeysFile(text, envKeys);
  if (envKeys.length + fileKeys.length === 0) throw new ConfigError(API_KEYS_FILE_VAR, 'configures no key, and OPS_API_KEY_ROLES is unset');
  return [...envKeys, ...fileKeys];
}

/** Start-up warnings about weak but accepted credentials: API keys (by id) or a bearer token shorter than MIN_SECRET_LENGTH. */
export function weakCredentialWarnings(config: { readonly apiKeys: readonly ApiKey[]; readonly OPS_BEARER_TOKEN?: string | undefined }) {
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

/** Start-up warnings about keys-file entries already past their expiry: accepted (a Secret may be updated late), every call answers 401. */
export function expiredKeyWarnings(config: { readonly apiKeys: readonly ApiKey[] }, now: number = Date.now()): string[] {
  return config.apiKeys
    .filter((k) => k.expiresAt !== undefined && k.expiresAt <= now)
    .map(
      (k) => `${API_KEYS_FILE_VAR}: entry ${k.position} (id "${k.id}") expired at ${rfc3339(k.expiresAt!)}; every call with it answers 401`,
    );
}
