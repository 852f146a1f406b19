import { afterAll, describe, expect, it } from '@jest/globals';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadApiConfig, secretsOf } from '../../../src/api/config.js';
import { expiredKeyWarnings, parseApiKeyRoles, parseApiKeysFile, reloadApiKeys, weakCredentialWarnings } from '../../../src/api/apiKeys.js';
import { credentialId } from '../../../src/shared/crypto.js';
import { ConfigError } from '../../../src/shared/errors.js';

/**
 * OPS_API_KEYS_FILE: entries {id, role, key or sha256, expires}, refused at start with every bad
 * entry named by position and id at once, never a key or a hash; beside OPS_API_KEY_ROLES.
 */
const KEY = 'file-key-must-not-leak-0001';
const OTHER = 'file-key-must-not-leak-0002';
const ENV_KEY = 'env-key-must-not-leak-0003';
const sha = (s: string) => createHash('sha256').update(s).digest('hex');
const NEVER = [KEY, OTHER, ENV_KEY, sha(KEY), sha(OTHER), sha(ENV_KEY)];

const dir = mkdtempSync(join(tmpdir(), 'opsgate-keysfile-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let n = 0;
function file(text: string): string {
  const f = join(dir, `keys-${++n}.yaml`);
  writeFileSync(f, text);
  return f;
}

function refusal(fn: () => unknown): ConfigError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    const e = err as ConfigError;
    for (const s of NEVER) expect(e.message).not.toContain(s);
    return e;
  }
  throw new Error('expected a ConfigError');
}

const base = { REDIS_URL: 'redis://127.0.0.1:6379' };

describe('parseApiKeysFile', () => {
  it('reads YAML: a clear key, a hash (any case) and an expiry, in file order', () => {
    const keys = parseApiKeysFile(`
- id: ci-deploy
  role: operator
  key: ${KEY}
- { id: grafana.ro, role: readonly, sha256: ${sha(OTHER).toUpperCase()}, expires: 2026-03-01T12:00:00+01:00 }
`);
    expect(keys.map((k) => [k.id, k.role, k.source, k.position, k.expiresAt])).toEqual([
      ['ci-deploy', 'operator', 'file', 1, undefined],
      ['grafana.ro', 'readonly', 'file', 2, Date.parse('2026-03-01T11:00:00Z')],
    ]);
    expect(keys[0]!.digest.toString('hex')).toBe(sha(KEY));
    expect(keys[1]!.digest.toString('hex')).toBe(sha(OTHER));
    expect(keys[1]!.key).toBeUndefined(); // the file held no usable key
  });

  it('reads JSON, and an empty file is an empty list', () => {
    expect(parseApiKeysFile(JSON.stringify([{ id: 'a', role: 'readonly', key: KEY }])).map((k) => k.id)).toEqual(['a']);
    expect(parseApiKeysFile('')).toEqual([]);
    expect(parseApiKeysFile('[]')).toEqual([]);
  });

  it('reports every bad entry at once, each by position and id, never a key or a hash', () => {
    const err = refusal(() =>
      parseApiKeysFile(`
- { id: good, role: operator, key: ${KEY} }
- { id: no-role, key: ${OTHER} }
- { id: both, role: readonly, key: ${ENV_KEY}, sha256: ${sha(ENV_KEY)} }
- { id: neither, role: readonly }
- { id: short-hash, role: readonly, sha256: ${sha(OTHER).slice(0, 40)} }
- { id: admin, role: admin, key: ${OTHER} }
- { id: date-only, role: readonly, key: ${OTHER}x, expires: 2026-03-01 }
- { id: no-offset, role: readonly, key: ${OTHER}y, expires: "2026-03-01T00:00:00" }
- { id: typo, role: readonly, key: ${OTHER}z, expiry: 2026-03-01T00:00:00Z }
- { id: "has space", role: readonly, key: ${OTHER}w }
- { role: readonly, key: ${OTHER}v }
- { id: empty, role: readonly, key: "" }
- { id: placeholder, role: readonly, key: CHANGE-ME-api-key }
- ${KEY}:operator
- { id: 12, role: readonly, key: ${OTHER}u }
`),
    );
    expect(err.problems.every((p) => p.variable === 'OPS_API_KEYS_FILE')).toBe(true);
    expect(err.problems.map((p) => p.problem)).toEqual([
      'entry 2 (id "no-role") has no role',
      'entry 3 (id "both") needs exactly one of key or sha256',
      'entry 4 (id "neither") needs exactly one of key or sha256',
      'entry 5 (id "short-hash") has a sha256 that is not 64 hex characters (the SHA-256 of the key)',
      'entry 6 (id "admin") has a role that is not readonly or operator',
      'entry 7 (id "date-only") has an expires that is not an RFC 3339 date-time such as 2026-03-01T00:00:00Z',
      'entry 8 (id "no-offset") has an expires that is not an RFC 3339 date-time such as 2026-03-01T00:00:00Z',
      'entry 9 (id "typo") has a field other than id, role, key, sha256, expires, owner, scope',
      'entry 10 has an id that is not 1-63 letters, digits, ".", "_" or "-" (starting with a letter or digit)',
      'entry 11 has no id',
      'entry 12 (id "empty") has an empty key',
      'entry 13 (id "placeholder") has a key that still holds the CHANGE-ME placeholder of the plain manifests; set a real secret',
      'entry 14 is not a mapping of id, role, key or sha256, expires, owner',
      'entry 15 has an id that is not text (quote it)',
    ]);
  });

  it('refuses an id or a key listed twice: in the file, by key or by hash, and against OPS_API_KEY_ROLES', () => {
    const env = parseApiKeyRoles(`${ENV_KEY}:readonly`);
    const err = refusal(() =>
      parseApiKeysFile(
        `
- { id: a, role: operator, key: ${KEY} }
- { id: a, role: readonly, key: ${OTHER} }
- { id: b, role: readonly, sha256: ${sha(KEY)} }
- { id: c, role: readonly, sha256: ${sha(ENV_KEY)} }
- { id: ${env[0]!.id}, role: readonly, key: ${OTHER} }
`,
        env,
      ),
    );
    expect(err.problems.map((p) => p.problem)).toEqual([
      'entry 2 (id "a") repeats the id of entry 1',
      'entry 3 (id "b") holds the same key as entry 1 (id "a"); list each key once',
      'entry 4 (id "c") holds the same key as OPS_API_KEY_ROLES item 1; list each key once',
      `entry 5 (id "${env[0]!.id}") has the id of OPS_API_KEY_ROLES item 1`,
    ]);
  });

  it('refuses what is not a list of entries', () => {
    expect(refusal(() => parseApiKeysFile('keys: {a: 1}')).message).toBe(
      'OPS_API_KEYS_FILE: must hold a list of entries {id, role, key or sha256, expires, owner}',
    );
    expect(refusal(() => parseApiKeysFile('- [unclosed')).message).toBe('OPS_API_KEYS_FILE: is not valid YAML or JSON');
  });
});

describe('loadApiConfig with OPS_API_KEYS_FILE', () => {
  it('keys from both sources are valid: OPS_API_KEY_ROLES first, then the file', () => {
    const c = loadApiConfig({
      ...base,
      OPS_API_KEY_ROLES: `${ENV_KEY}:readonly`,
      OPS_API_KEYS_FILE: file(`- { id: ci, role: operator, sha256: ${sha(KEY)} }`),
    });
    expect(c.apiKeys.map((k) => [k.source, k.role])).toEqual([
      ['env', 'readonly'],
      ['file', 'operator'],
    ]);
    expect(c.API_KEY_EXPIRY_WARNING_DAYS).toBe(14);
  });

  it('with a keys file OPS_API_KEY_ROLES may be unset or blank; without one it is required', () => {
    const f = file(`- { id: ci, role: operator, sha256: ${sha(KEY)} }`);
    expect(loadApiConfig({ ...base, OPS_API_KEYS_FILE: f }).apiKeys).toHaveLength(1);
    expect(loadApiConfig({ ...base, OPS_API_KEYS_FILE: f, OPS_API_KEY_ROLES: ' ' }).apiKeys).toHaveLength(1);
    expect(refusal(() => loadApiConfig(base)).problems).toEqual([
      { variable: 'OPS_API_KEY_ROLES', problem: 'is required and must not be blank (or set OPS_API_KEYS_FILE)' },
    ]);
  });

  it('no key in either source is refused (the contract: no key configured)', () => {
    expect(refusal(() => loadApiConfig({ ...base, OPS_API_KEYS_FILE: file('[]') })).problems).toEqual([
      { variable: 'OPS_API_KEYS_FILE', problem: 'configures no key, and OPS_API_KEY_ROLES is unset' },
    ]);
  });

  it("the file's problems join the other variables' in one report; an unreadable file names no path", () => {
    const err = refusal(() =>
      loadApiConfig({
        ...base,
        OPS_API_KEY_ROLES: `${ENV_KEY}:admin`,
        OPS_API_KEYS_FILE: file(`- { id: x, role: readonly, key: ${KEY}, expires: soon }\n- { id: y, role: readonly }`),
        API_KEY_EXPIRY_WARNING_DAYS: '-1',
        PORT: 'eighty',
      }),
    );
    expect(err.problems.map((p) => p.variable)).toEqual([
      'OPS_API_KEY_ROLES',
      'OPS_API_KEYS_FILE',
      'OPS_API_KEYS_FILE',
      'PORT',
      'API_KEY_EXPIRY_WARNING_DAYS',
    ]);
    const missing = join(dir, 'nope.yaml');
    const unreadable = refusal(() => loadApiConfig({ ...base, OPS_API_KEYS_FILE: missing }));
    expect(unreadable.message).toBe('OPS_API_KEYS_FILE: cannot be read (ENOENT)');
  });

  it('redaction covers clear keys and hashes; warnings name ids and dates only', () => {
    const c = loadApiConfig({
      ...base,
      OPS_API_KEYS_FILE: file(`
- { id: short, role: readonly, key: tiny-key }
- { id: old, role: readonly, sha256: ${sha(OTHER)}, expires: 2020-01-01T00:00:00Z }
- { id: later, role: operator, key: ${KEY}, expires: 2999-01-01T00:00:00Z }
`),
    });
    expect(secretsOf(c).sort()).toEqual(['tiny-key', sha(OTHER), KEY].sort());
    expect(weakCredentialWarnings(c)).toEqual([
      'OPS_API_KEYS_FILE: entry 1 (id "short") is shorter than 16 characters; use a long random key',
    ]);
    expect(expiredKeyWarnings(c, Date.parse('2026-01-01T00:00:00Z'))).toEqual([
      'OPS_API_KEYS_FILE: entry 2 (id "old") expired at 2020-01-01T00:00:00Z; every call with it answers 401',
    ]);
  });
});

describe('owners: who holds each key', () => {
  it('a keys-file entry names its owner, else its id is; a key of OPS_API_KEY_ROLES is its own owner, env:<id>', () => {
    const env = parseApiKeyRoles(`${ENV_KEY}:operator`);
    expect(env.map((k) => [k.id, k.owner])).toEqual([[credentialId(ENV_KEY), `env:${credentialId(ENV_KEY)}`]]);
    const longest = 'o'.repeat(127) + 'x';
    const keys = parseApiKeysFile(
      `
- { id: alice-laptop, role: operator, key: ${KEY}, owner: alice@example.com }
- { id: alice-ci, role: operator, sha256: ${sha(OTHER)}, owner: "alice@example.com" }
- { id: grafana, role: readonly, key: ${KEY}-grafana }
- { id: oncall, role: readonly, key: ${KEY}-oncall, owner: "team:payments/on-call+1_a.b-c" }
- { id: longest, role: readonly, key: ${KEY}-longest, owner: ${longest} }
`,
      env,
    );
    expect(keys.map((k) => [k.id, k.owner])).toEqual([
      ['alice-laptop', 'alice@example.com'],
      ['alice-ci', 'alice@example.com'],
      ['grafana', 'grafana'],
      ['oncall', 'team:payments/on-call+1_a.b-c'],
      ['longest', longest],
    ]);
  });

  const BAD_OWNERS = `
- { id: empty, role: readonly, key: ${KEY}-1, owner: "" }
- { id: spaced, role: readonly, key: ${KEY}-2, owner: "alice smith" }
- { id: too-long, role: readonly, key: ${KEY}-3, owner: ${'o'.repeat(129)} }
- { id: number, role: readonly, key: ${KEY}-4, owner: 12 }
- { id: comma, role: readonly, key: ${KEY}-5, owner: "alice,bob" }
- { id: accent, role: readonly, key: ${KEY}-6, owner: "zoë" }
- { id: no-role, key: ${KEY}-7, owner: fine }
`;
  const RULE = 'has an owner that is not 1-128 letters, digits or the characters . _ : @ / + -';
  const BAD_OWNER_PROBLEMS = [
    `entry 1 (id "empty") ${RULE}`,
    `entry 2 (id "spaced") ${RULE}`,
    `entry 3 (id "too-long") ${RULE}`,
    'entry 4 (id "number") has an owner that is not text (quote it)',
    `entry 5 (id "comma") ${RULE}`,
    `entry 6 (id "accent") ${RULE}`,
    'entry 7 (id "no-role") has no role',
  ];

  it('a bad owner is refused with every other problem at once, by position and id, never the owner itself', () => {
    const err = refusal(() => parseApiKeysFile(BAD_OWNERS));
    expect(err.problems.map((p) => p.problem)).toEqual(BAD_OWNER_PROBLEMS);
    for (const owner of ['alice smith', 'alice,bob', 'zoë', 'o'.repeat(129)]) expect(err.message).not.toContain(owner);
  });

  it('at start (loadApiConfig, beside the other variables) and on reload (reloadApiKeys) alike', () => {
    const atStart = refusal(() => loadApiConfig({ ...base, OPS_API_KEYS_FILE: file(BAD_OWNERS), PORT: 'eighty' }));
    expect(atStart.problems).toEqual([
      ...BAD_OWNER_PROBLEMS.map((problem) => ({ variable: 'OPS_API_KEYS_FILE', problem })),
      { variable: 'PORT', problem: 'must be an integer >= 0' },
    ]);
    const onReload = refusal(() => reloadApiKeys(BAD_OWNERS, parseApiKeyRoles(`${ENV_KEY}:operator`)));
    expect(onReload.problems.map((p) => p.problem)).toEqual(BAD_OWNER_PROBLEMS);
  });
});
