import { describe, expect, it } from '@jest/globals';
import {
  apiTlsFiles,
  loadApiConfig,
  loadWorkerConfig,
  metricsTlsFiles,
  parseApiKeyRoles,
  secretsOf,
  weakCredentialWarnings,
} from '../../../src/shared/config.js';
import { credentialId } from '../../../src/shared/crypto.js';
import { ConfigError } from '../../../src/shared/errors.js';

/**
 * OPS_API_KEY_ROLES and the API environment: refuse to start when the variable is missing or blank,
 * an item lacks the key:role form, a key is empty, a role is unknown or no key is configured.
 */
const SECRET = 'k3y-th4t-must-n0t-leak';

function refusal(fn: () => unknown): ConfigError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return err as ConfigError;
  }
  throw new Error('expected a ConfigError');
}

describe('parseApiKeyRoles', () => {
  it('parses several keys (rotation) with their roles', () => {
    const keys = parseApiKeyRoles('alpha:readonly,beta:operator, gamma:operator');
    expect(keys.map((k) => [k.key, k.role])).toEqual([
      ['alpha', 'readonly'],
      ['beta', 'operator'],
      ['gamma', 'operator'],
    ]);
  });
  it('the role is the text after the LAST colon: keys may contain colons', () => {
    const [k] = parseApiKeyRoles('a:b:c:operator');
    expect(k).toMatchObject({ key: 'a:b:c', role: 'operator' });
  });
  it('the id is the first 12 hex of SHA-256(key), never the key', () => {
    const [k] = parseApiKeyRoles(`${SECRET}:readonly`);
    expect(k!.id).toBe(credentialId(SECRET));
    expect(k!.id).toMatch(/^[0-9a-f]{12}$/);
    expect(k!.id).not.toContain(SECRET.slice(0, 4));
  });
  it.each([
    ['missing', undefined],
    ['empty', ''],
    ['blank', '   '],
    ['an item without key:role', `${SECRET}`],
    ['an item without key:role among good ones', `good:readonly,${SECRET}`],
    ['an empty key', ':operator'],
    ['an empty key after a good one', 'good:readonly,:readonly'],
    ['an unknown role', `${SECRET}:admin`],
    ['an empty role', `${SECRET}:`],
    ['a role in another case', `${SECRET}:Operator`],
    ['a role with the colon-separated key before it unknown', `${SECRET}:operator:root`],
    ['no key at all (only commas)', ',, ,'],
    ['an empty item between good ones', 'good:readonly,,other:operator'],
    ['a trailing comma', 'good:readonly,'],
  ])('refuses %s, naming the variable and never the value', (_name, raw) => {
    const err = refusal(() => parseApiKeyRoles(raw));
    expect(err.variable).toBe('OPS_API_KEY_ROLES');
    expect(err.message).toMatch(/^OPS_API_KEY_ROLES: /);
    expect(err.message).not.toContain(SECRET);
    expect(err.message.split('\n')).toHaveLength(1);
  });
});

describe('loadApiConfig', () => {
  const base = { OPS_API_KEY_ROLES: `${SECRET}:operator`, REDIS_URL: 'redis://127.0.0.1:6379' };

  it('the admin UI (Bull Board, a write-capable UI) is off unless ADMIN_UI_ENABLED says true or 1', () => {
    expect(loadApiConfig(base).ADMIN_UI_ENABLED).toBe(false);
    expect(loadApiConfig({ ...base, ADMIN_UI_ENABLED: '' }).ADMIN_UI_ENABLED).toBe(false);
    expect(loadApiConfig({ ...base, ADMIN_UI_ENABLED: 'false' }).ADMIN_UI_ENABLED).toBe(false);
    expect(loadApiConfig({ ...base, ADMIN_UI_ENABLED: 'true' }).ADMIN_UI_ENABLED).toBe(true);
    expect(loadApiConfig({ ...base, ADMIN_UI_ENABLED: '1' }).ADMIN_UI_ENABLED).toBe(true);
  });

  it('defaults of DESIGN.md', () => {
    const c = loadApiConfig(base);
    expect(c).toMatchObject({
      PORT: 8080,
      METRICS_PORT: 9464,
      RATE_LIMIT_RPS: 50,
      BODY_LIMIT: '1mb',
      TRUST_PROXY: '0', // no proxy trusted unless configured
      JOB_ATTEMPTS: 5,
      JOB_BACKOFF_MS: 10000,
    });
    // Unset secrets are absent (undefined): every call they protect is rejected.
    expect(c.OPS_BEARER_TOKEN).toBeUndefined();
    expect(c.SCM_WEBHOOK_SECRET).toBeUndefined();
    expect(c.GITHUB_WEBHOOK_SECRET).toBeUndefined();
    expect(c.ALERTS_WEBHOOK_TOKEN).toBeUndefined();
    expect(c.apiKeys).toHaveLength(1);
  });
  it('empty secrets count as unset (so every protected call is rejected)', () => {
    const c = loadApiConfig({ ...base, OPS_BEARER_TOKEN: '', SCM_WEBHOOK_SECRET: '' });
    expect(c.OPS_BEARER_TOKEN).toBeUndefined();
    expect(c.SCM_WEBHOOK_SECRET).toBeUndefined();
  });
  it.each([
    ['REDIS_URL missing', { REDIS_URL: undefined }, 'REDIS_URL'],
    ['REDIS_URL blank', { REDIS_URL: '  ' }, 'REDIS_URL'],
    ['REDIS_URL not redis://', { REDIS_URL: `https://x:${SECRET}@h` }, 'REDIS_URL'],
    ['PORT not an integer', { PORT: '80.5' }, 'PORT'],
    ['RATE_LIMIT_RPS negative', { RATE_LIMIT_RPS: '-1' }, 'RATE_LIMIT_RPS'],
    ['JOB_ATTEMPTS zero', { JOB_ATTEMPTS: '0' }, 'JOB_ATTEMPTS'],
    ['BODY_LIMIT malformed', { BODY_LIMIT: '1 gigabyte' }, 'BODY_LIMIT'],
    ['LOG_LEVEL unknown', { LOG_LEVEL: 'verbose' }, 'LOG_LEVEL'],
    ['OPS_API_KEY_ROLES missing', { OPS_API_KEY_ROLES: undefined }, 'OPS_API_KEY_ROLES'],
  ])('%s -> ConfigError naming %s', (_n, env, variable) => {
    const err = refusal(() => loadApiConfig({ ...base, ...env }));
    expect(err.variable).toBe(variable);
    expect(err.message).not.toContain(SECRET);
  });
  it('secretsOf lists every secret for log redaction', () => {
    const c = loadApiConfig({
      ...base,
      OPS_BEARER_TOKEN: 'b-token',
      SCM_WEBHOOK_SECRET: 's-secret',
      GITHUB_WEBHOOK_SECRET: 'g-secret',
      ALERTS_WEBHOOK_TOKEN: 'a-token',
    });
    expect(secretsOf(c).sort()).toEqual([SECRET, 'a-token', 'b-token', 'g-secret', 's-secret'].sort());
  });
});

/** The plain manifests' placeholders, repeated keys, short keys. */
describe('placeholder secrets, repeated keys, short keys', () => {
  const base = { OPS_API_KEY_ROLES: `${SECRET}:operator`, REDIS_URL: 'redis://127.0.0.1:6379' };

  it.each([
    ['an API key', { OPS_API_KEY_ROLES: `${SECRET}:readonly,CHANGE-ME-operator-api-key:operator` }, 'OPS_API_KEY_ROLES'],
    ['the bearer token', { OPS_BEARER_TOKEN: 'CHANGE-ME-bearer-token' }, 'OPS_BEARER_TOKEN'],
    ['the SCM secret', { SCM_WEBHOOK_SECRET: 'CHANGE-ME-scm-webhook-secret' }, 'SCM_WEBHOOK_SECRET'],
    ['the GitHub secret', { GITHUB_WEBHOOK_SECRET: 'change-me-github' }, 'GITHUB_WEBHOOK_SECRET'],
    ['the alerts token', { ALERTS_WEBHOOK_TOKEN: 'CHANGE-ME-alerts-webhook-token' }, 'ALERTS_WEBHOOK_TOKEN'],
    ['the Redis password in REDIS_URL', { REDIS_URL: 'redis://:CHANGE-ME-redis-password@opsgate-redis:6379/0' }, 'REDIS_URL'],
    ['a URL-encoded Redis password', { REDIS_URL: 'redis://default:%43HANGE-ME-x@opsgate-redis:6379/0' }, 'REDIS_URL'],
  ])('the API refuses to start on %s still holding the CHANGE-ME placeholder', (_n, env, variable) => {
    const err = refusal(() => loadApiConfig({ ...base, ...env }));
    expect(err.variable).toBe(variable);
    expect(err.message).toMatch(/CHANGE-ME placeholder/);
    expect(err.message).not.toMatch(/CHANGE-ME-/); // never the value itself
    expect(err.message).not.toContain(SECRET);
  });

  it('the worker refuses a placeholder Redis password or notify URL too', () => {
    const wbase = { REDIS_URL: 'redis://127.0.0.1:6379' };
    expect(refusal(() => loadWorkerConfig({ ...wbase, REDIS_URL: 'redis://:CHANGE-ME-redis-password@r:6379' })).variable).toBe('REDIS_URL');
    expect(refusal(() => loadWorkerConfig({ ...wbase, NOTIFY_WEBHOOK_URLS: 'https://hooks.example/services/CHANGE-ME' })).variable).toBe(
      'NOTIFY_WEBHOOK_URLS',
    );
    expect(loadWorkerConfig({ ...wbase, REDIS_URL: 'redis://:a-real-password@r:6379' }).REDIS_URL).toContain('a-real-password');
  });

  it('a secret that merely contains the word later on is fine', () => {
    expect(loadApiConfig({ ...base, OPS_BEARER_TOKEN: 'token-that-says-CHANGE-ME-later' }).OPS_BEARER_TOKEN).toBe(
      'token-that-says-CHANGE-ME-later',
    );
  });

  it.each([
    ['with the same role', `${SECRET}:operator,other-key-0123456789:readonly,${SECRET}:operator`, 'item 3 repeats the key of item 1'],
    ['with another role (the first used to win silently)', `${SECRET}:readonly,${SECRET}:operator`, 'item 2 repeats the key of item 1'],
    ['after trimming spaces', `${SECRET}:readonly, ${SECRET} :operator`.replace(' :', ':'), 'item 2 repeats the key of item 1'],
  ])('refuses a key listed twice %s', (_n, raw, problem) => {
    const err = refusal(() => parseApiKeyRoles(raw));
    expect(err.variable).toBe('OPS_API_KEY_ROLES');
    expect(err.message).toContain(problem);
    expect(err.message).not.toContain(SECRET);
  });

  it('warns (by key id, never the value) on keys and a bearer token shorter than 16 characters', () => {
    const short = 'short-key-123'; // 13 characters
    const c = loadApiConfig({ ...base, OPS_API_KEY_ROLES: `${SECRET}:operator,${short}:readonly`, OPS_BEARER_TOKEN: 'tiny-token' });
    const warnings = weakCredentialWarnings(c);
    expect(warnings).toHaveLength(2);
    expect(warnings[0]).toContain('item 2');
    expect(warnings[0]).toContain(`key:${credentialId(short)}`);
    expect(warnings[1]).toMatch(/^OPS_BEARER_TOKEN is shorter than 16/);
    for (const w of warnings) {
      expect(w).not.toContain(short);
      expect(w).not.toContain('tiny-token');
    }
    expect(weakCredentialWarnings(loadApiConfig({ ...base, OPS_BEARER_TOKEN: 'a-bearer-token-of-32-characters!' }))).toEqual([]);
  });
});

describe('TLS files', () => {
  const base = { OPS_API_KEY_ROLES: 'a-long-enough-key-0001:readonly', REDIS_URL: 'redis://127.0.0.1:6379' };
  it('off by default: no files, plain HTTP', () => {
    const c = loadApiConfig(base);
    expect(apiTlsFiles(c)).toBeUndefined();
    expect(metricsTlsFiles(c)).toBeUndefined();
    expect(c.TLS_RELOAD_INTERVAL_MS).toBe(10000);
  });
  it('both files of a pair or neither, the client CA only with TLS, reported with the other problems at once', () => {
    const err = refusal(() => loadApiConfig({ ...base, TLS_KEY_FILE: '/k', METRICS_TLS_CERT_FILE: '/c', PORT: 'eighty' }));
    expect(err.problems.map((p) => p.variable).sort()).toEqual(['METRICS_TLS_KEY_FILE', 'PORT', 'TLS_CERT_FILE']);
    expect(err.problems.find((p) => p.variable === 'TLS_CERT_FILE')?.problem).toBe('is required when TLS_KEY_FILE is set');
    expect(refusal(() => loadApiConfig({ ...base, TLS_CLIENT_CA_FILE: '/ca' })).variable).toBe('TLS_CLIENT_CA_FILE');
    expect(refusal(() => loadWorkerConfig({ REDIS_URL: base.REDIS_URL, METRICS_TLS_KEY_FILE: '/k' })).variable).toBe(
      'METRICS_TLS_CERT_FILE',
    );
    expect(refusal(() => loadApiConfig({ ...base, TLS_RELOAD_INTERVAL_MS: '10' })).variable).toBe('TLS_RELOAD_INTERVAL_MS');
  });
  it('names the files and the variables that set them', () => {
    const c = loadApiConfig({ ...base, TLS_CERT_FILE: '/t/tls.crt', TLS_KEY_FILE: '/t/tls.key', TLS_CLIENT_CA_FILE: '/t/ca.crt' });
    expect(apiTlsFiles(c)).toEqual({
      certFile: '/t/tls.crt',
      keyFile: '/t/tls.key',
      caFile: '/t/ca.crt',
      vars: { cert: 'TLS_CERT_FILE', key: 'TLS_KEY_FILE', ca: 'TLS_CLIENT_CA_FILE' },
    });
    const w = loadWorkerConfig({ REDIS_URL: base.REDIS_URL, METRICS_TLS_CERT_FILE: '/t/tls.crt', METRICS_TLS_KEY_FILE: '/t/tls.key' });
    expect(metricsTlsFiles(w)?.vars).toEqual({ cert: 'METRICS_TLS_CERT_FILE', key: 'METRICS_TLS_KEY_FILE' });
  });
});
