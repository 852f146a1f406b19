import { describe, expect, it } from '@jest/globals';
import { apiTlsFiles, loadApiConfig, secretsOf } from '../../../src/api/config.js';
import { loadWorkerConfig, metricsTlsFiles } from '../../../src/shared/config.js';
import { parseApiKeyRoles, reloadApiKeys, weakCredentialWarnings } from '../../../src/api/apiKeys.js';
import { absentSecretFileWarnings, parseSecretFile } from '../../../src/shared/secrets.js';
import { clientCertificateWarnings } from '../../../src/api/clientNames.js';
import { credentialId } from '../../../src/shared/crypto.js';
import { ConfigError } from '../../../src/shared/errors.js';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll } from '@jest/globals';
import { SOURCE_SECRET_ENVS, SOURCE_SECRET_FILE_ENVS } from '../../../src/sources/index.js';

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
  it('OPS_BEARER_TOKEN_OWNER names who holds the bearer token: unset or blank is no owner, spaces around it are dropped', () => {
    expect(loadApiConfig(base).OPS_BEARER_TOKEN_OWNER).toBeUndefined();
    expect(loadApiConfig({ ...base, OPS_BEARER_TOKEN_OWNER: '  ' }).OPS_BEARER_TOKEN_OWNER).toBeUndefined();
    expect(loadApiConfig({ ...base, OPS_BEARER_TOKEN_OWNER: ' ci:deploy-bot@example.com ' }).OPS_BEARER_TOKEN_OWNER).toBe(
      'ci:deploy-bot@example.com',
    );
    expect(loadApiConfig({ ...base, OPS_BEARER_TOKEN_OWNER: 'x'.repeat(128) }).OPS_BEARER_TOKEN_OWNER).toHaveLength(128);
  });
  it.each([
    ['a space inside', 'alice smith'],
    ['a comma', 'alice,bob'],
    ['129 characters', 'x'.repeat(129)],
    ['a character outside the set', 'zoë'],
  ])('OPS_BEARER_TOKEN_OWNER with %s is refused beside the other problems, never repeated', (_name, owner) => {
    const err = refusal(() => loadApiConfig({ ...base, OPS_BEARER_TOKEN_OWNER: owner, PORT: 'eighty' }));
    expect(err.problems).toEqual([
      { variable: 'PORT', problem: 'must be an integer >= 0' },
      { variable: 'OPS_BEARER_TOKEN_OWNER', problem: 'is not 1-128 letters, digits or the characters . _ : @ / + -' },
    ]);
    expect(err.message).not.toContain(owner);
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

describe('allowed client certificates (TLS_CLIENT_ALLOWED_NAMES, TLS_CLIENT_ALLOWED_NAMES_FILE)', () => {
  const base = {
    OPS_API_KEY_ROLES: 'a-long-enough-key-0001:readonly',
    REDIS_URL: 'redis://127.0.0.1:6379',
    TLS_CERT_FILE: '/t/tls.crt',
    TLS_KEY_FILE: '/t/tls.key',
    TLS_CLIENT_CA_FILE: '/t/ca.crt',
  };
  const dir = mkdtempSync(join(tmpdir(), 'opsgate-allowed-names-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const file = (text: string) => {
    const path = join(dir, `names-${Math.random().toString(36).slice(2)}`);
    writeFileSync(path, text);
    return path;
  };

  it('parses DNS:, URI: and subject entries; unset: none, with a start-up warning while a client CA is set', () => {
    const c = loadApiConfig({
      ...base,
      TLS_CLIENT_ALLOWED_NAMES:
        ' dns:Alertmanager.monitoring.svc , URI:spiffe://cluster.local/ns/monitoring/sa/alertmanager,CN=vmalert+O=monitoring',
    });
    expect(c.clientAllowedNames.map((e) => e.text)).toEqual([
      'DNS:alertmanager.monitoring.svc',
      'URI:spiffe://cluster.local/ns/monitoring/sa/alertmanager',
      'CN=vmalert+O=monitoring',
    ]);
    expect(clientCertificateWarnings(c)).toEqual([]);
    const open = loadApiConfig(base);
    expect(open.clientAllowedNames).toEqual([]);
    expect(clientCertificateWarnings(open)).toEqual([
      expect.stringMatching(/^TLS_CLIENT_CA_FILE is set without TLS_CLIENT_ALLOWED_NAMES: /),
    ]);
    expect(clientCertificateWarnings(loadApiConfig({ OPS_API_KEY_ROLES: base.OPS_API_KEY_ROLES, REDIS_URL: base.REDIS_URL }))).toEqual([]);
  });

  it('refuses an entry of no known form, an empty one, a wildcard, a relative URI, a repeat; by position', () => {
    const problems = (v: string) => refusal(() => loadApiConfig({ ...base, TLS_CLIENT_ALLOWED_NAMES: v })).problems;
    expect(problems('alertmanager')).toEqual([
      { variable: 'TLS_CLIENT_ALLOWED_NAMES', problem: 'entry 1 is not DNS:<name>, URI:<uri> or <ATTR>=<value> (such as CN=alertmanager)' },
    ]);
    expect(problems('CN=a,,DNS:*.svc,URI:not a uri,CN=a').map((p) => p.problem)).toEqual([
      'entry 2 is empty',
      expect.stringMatching(/^entry 3 has a DNS name with characters other than/),
      expect.stringMatching(/^entry 4 has a URI that is not an absolute URI/),
      'entry 5 repeats an earlier entry',
    ]);
    expect(problems('DNS:')[0]!.problem).toBe('entry 1 has an empty DNS name');
  });

  it('only with a client CA; the file or the variable, not both', () => {
    const noCa = { ...base, TLS_CLIENT_CA_FILE: '' };
    expect(refusal(() => loadApiConfig({ ...noCa, TLS_CLIENT_ALLOWED_NAMES: 'CN=a' })).problems).toEqual([
      {
        variable: 'TLS_CLIENT_ALLOWED_NAMES',
        problem: 'needs TLS_CLIENT_CA_FILE (the names are those of client certificates its CA signed)',
      },
    ]);
    expect(refusal(() => loadApiConfig({ ...noCa, TLS_CLIENT_ALLOWED_NAMES_FILE: file('CN=a') })).variable).toBe(
      'TLS_CLIENT_ALLOWED_NAMES_FILE',
    );
    expect(
      refusal(() => loadApiConfig({ ...base, TLS_CLIENT_ALLOWED_NAMES: 'CN=a', TLS_CLIENT_ALLOWED_NAMES_FILE: file('CN=b') })).problems,
    ).toEqual([{ variable: 'TLS_CLIENT_ALLOWED_NAMES_FILE', problem: 'is set together with TLS_CLIENT_ALLOWED_NAMES; set one of them' }]);
  });

  it('the file: entries by line or comma, comments skipped; a file that names no one or cannot be read is refused', () => {
    const path = file('# Alertmanager\nURI:spiffe://cluster.local/ns/monitoring/sa/alertmanager\r\n\nDNS:a.svc, CN=b\n');
    const c = loadApiConfig({ ...base, TLS_CLIENT_ALLOWED_NAMES_FILE: path });
    expect(c.clientAllowedNames.map((e) => e.text)).toEqual([
      'URI:spiffe://cluster.local/ns/monitoring/sa/alertmanager',
      'DNS:a.svc',
      'CN=b',
    ]);
    expect(c.clientAllowedNamesFile).toMatchObject({ variable: 'TLS_CLIENT_ALLOWED_NAMES_FILE', path });
    expect(refusal(() => loadApiConfig({ ...base, TLS_CLIENT_ALLOWED_NAMES_FILE: file('# none\n\n') })).problems[0]!.problem).toMatch(
      /^lists no name/,
    );
    expect(refusal(() => loadApiConfig({ ...base, TLS_CLIENT_ALLOWED_NAMES_FILE: join(dir, 'missing') })).problems).toEqual([
      { variable: 'TLS_CLIENT_ALLOWED_NAMES_FILE', problem: 'cannot be read (ENOENT)' },
    ]);
  });
});

describe('deliveries kept', () => {
  it('each sender keeps 1000 verified and 100 unverified deliveries by default; 0 keeps none', () => {
    const base = { OPS_API_KEY_ROLES: 'a-long-enough-key-0001:readonly', REDIS_URL: 'redis://127.0.0.1:6379' };
    expect(loadApiConfig(base)).toMatchObject({ DELIVERIES_KEPT: 1000, DELIVERIES_UNVERIFIED_KEPT: 100 });
    expect(loadApiConfig({ ...base, DELIVERIES_UNVERIFIED_KEPT: '0' }).DELIVERIES_UNVERIFIED_KEPT).toBe(0);
    expect(refusal(() => loadApiConfig({ ...base, DELIVERIES_UNVERIFIED_KEPT: '-1' })).variable).toBe('DELIVERIES_UNVERIFIED_KEPT');
  });

  it('the worker reads the same caps (it appends a pushed deploy that never ran or was cancelled)', () => {
    const base = { REDIS_URL: 'redis://127.0.0.1:6379' };
    expect(loadWorkerConfig(base)).toMatchObject({ DELIVERIES_KEPT: 1000, DELIVERIES_UNVERIFIED_KEPT: 100 });
    expect(loadWorkerConfig({ ...base, DELIVERIES_KEPT: '20', DELIVERIES_UNVERIFIED_KEPT: '0' })).toMatchObject({
      DELIVERIES_KEPT: 20,
      DELIVERIES_UNVERIFIED_KEPT: 0,
    });
    expect(refusal(() => loadWorkerConfig({ ...base, DELIVERIES_KEPT: '-1' })).variable).toBe('DELIVERIES_KEPT');
  });
});

/** File mode of the senders' secrets: <VARIABLE>_FILE, one value or two (current, then previous). */
describe('secret files', () => {
  const dir = mkdtempSync(join(tmpdir(), 'opsgate-secret-files-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  let n = 0;
  const file = (text: string) => {
    const f = join(dir, `s${++n}`);
    writeFileSync(f, text);
    return f;
  };
  const base = { OPS_API_KEY_ROLES: 'some-long-readonly-key-1:readonly', REDIS_URL: 'redis://127.0.0.1:6379' };

  it('every sender secret variable has its _FILE variable', () => {
    expect(SOURCE_SECRET_FILE_ENVS).toEqual(SOURCE_SECRET_ENVS.map((e) => `${e}_FILE`));
    expect(SOURCE_SECRET_FILE_ENVS).toContain('GITHUB_WEBHOOK_SECRET_FILE');
  });

  it.each([
    ['one value', 'current-1', ['current-1']],
    ['one value and a final newline', 'current-1\n', ['current-1']],
    ['current and previous', 'current-1\nprevious-0\n', ['current-1', 'previous-0']],
    ['CRLF line ends', 'current-1\r\nprevious-0\r\n', ['current-1', 'previous-0']],
    ['inner spaces are part of a value', 'a b c', ['a b c']],
  ])('%s', (_n, text, values) => {
    expect(parseSecretFile(text, 'X_FILE')).toEqual(values);
  });

  it.each([
    ['empty', '', /holds no secret/],
    ['a newline only', '\n', /holds no secret/],
    ['three values', 'first-value\nsecond-value\nthird-value', /more than two lines/],
    ['an empty line before the previous value', 'first-value\n\nsecond-value', /more than two lines/],
    ['an empty line after the secret', 'first-value\n\n', /line 2 is empty/],
    ['a trailing space', 'secret-1 \n', /line 1 has spaces or tabs/],
    ['a tab before the previous value', 'secret-1\n\tsecret-0', /line 2 has spaces or tabs/],
    ['the placeholder', 'CHANGE-ME-github', /line 1 still holds the CHANGE-ME placeholder/],
  ])('refused: %s, naming the variable, never the text', (_n, text, problem) => {
    const err = refusal(() => parseSecretFile(text, 'GITHUB_WEBHOOK_SECRET_FILE'));
    expect(err.variable).toBe('GITHUB_WEBHOOK_SECRET_FILE');
    expect(err.problems[0]!.problem).toMatch(problem);
    const first = text.trim().split('\n')[0]!;
    if (first.length > 0) expect(err.message).not.toContain(first);
  });

  it("loadApiConfig reads each _FILE at start: its values are the sender's, the file is kept for its reload, its values for redaction", () => {
    const c = loadApiConfig({
      ...base,
      GITHUB_WEBHOOK_SECRET_FILE: file('gh-new-secret\ngh-old-secret\n'),
      SCM_WEBHOOK_SECRET: 'scm-env-secret',
    });
    expect(c.senderSecrets.GITHUB_WEBHOOK_SECRET).toEqual(['gh-new-secret', 'gh-old-secret']);
    expect(c.senderSecrets.SCM_WEBHOOK_SECRET).toEqual(['scm-env-secret']);
    expect(c.GITHUB_WEBHOOK_SECRET).toBeUndefined();
    expect(c.credentialFiles.map((f) => f.variable)).toEqual(['GITHUB_WEBHOOK_SECRET_FILE']);
    expect(c.credentialFiles[0]!.digest).toMatch(/^[0-9a-f]{64}$/);
    expect(secretsOf(c)).toEqual(expect.arrayContaining(['gh-new-secret', 'gh-old-secret', 'scm-env-secret']));
    expect(c.SECRETS_RELOAD_INTERVAL_MS).toBe(10000);
  });

  it('a file that does not exist leaves its sender unconfigured, like an unset variable, with a warning; it is watched for', () => {
    const c = loadApiConfig({ ...base, GITLAB_WEBHOOK_SECRET_FILE: join(dir, 'absent'), SCM_WEBHOOK_SECRET: 'scm-env-secret' });
    expect(c.senderSecrets.GITLAB_WEBHOOK_SECRET).toBeUndefined();
    expect(c.credentialFiles).toEqual([
      {
        variable: 'GITLAB_WEBHOOK_SECRET_FILE',
        path: join(dir, 'absent'),
        digest: expect.stringMatching(/^[0-9a-f]{64}$/),
        optional: true,
      },
    ]);
    expect(absentSecretFileWarnings(c)).toEqual([
      'GITLAB_WEBHOOK_SECRET_FILE names a file that does not exist: its sender is not configured, as if GITLAB_WEBHOOK_SECRET were unset, until the file appears',
    ]);
  });

  it('refused at start, all at once: a variable set with its _FILE, an unreadable file, an invalid one; never a value or a path', () => {
    const missing = dir; // a directory: not a readable file
    const err = refusal(() =>
      loadApiConfig({
        ...base,
        GITHUB_WEBHOOK_SECRET: 'gh-env-secret-value',
        GITHUB_WEBHOOK_SECRET_FILE: file('gh-file-secret'),
        GITLAB_WEBHOOK_SECRET_FILE: missing,
        GITEA_WEBHOOK_SECRET_FILE: file('a\nb\nthird-gitea-value'),
        SECRETS_RELOAD_INTERVAL_MS: '50',
      }),
    );
    expect(err.problems).toEqual(
      expect.arrayContaining([
        { variable: 'GITHUB_WEBHOOK_SECRET_FILE', problem: 'is set together with GITHUB_WEBHOOK_SECRET; set one of them' },
        { variable: 'GITLAB_WEBHOOK_SECRET_FILE', problem: 'cannot be read (EISDIR)' },
        { variable: 'GITEA_WEBHOOK_SECRET_FILE', problem: expect.stringMatching(/more than two lines/) },
        { variable: 'SECRETS_RELOAD_INTERVAL_MS', problem: 'must be an integer >= 100' },
      ]),
    );
    for (const leak of ['gh-env-secret-value', 'gh-file-secret', 'third-gitea-value', missing]) expect(err.message).not.toContain(leak);
  });
});

describe('reloadApiKeys: a new keys file, checked as at start', () => {
  const envKeys = parseApiKeyRoles('env-readonly-key-0001:readonly');
  it("keeps the keys of OPS_API_KEY_ROLES first, then the file's", () => {
    const keys = reloadApiKeys('- {id: ci, role: operator, key: ci-operator-key-0001}\n', envKeys);
    expect(keys.map((k) => [k.id, k.source])).toEqual([
      [envKeys[0]!.id, 'env'],
      ['ci', 'file'],
    ]);
  });
  it('refuses every bad entry at once, a key also in OPS_API_KEY_ROLES, and a file leaving no key at all', () => {
    const bad = refusal(() =>
      reloadApiKeys('- {id: a, role: admin, key: a-key-000001}\n- {id: b, role: readonly, key: env-readonly-key-0001}\n', envKeys),
    );
    expect(bad.problems.map((p) => p.problem)).toEqual([
      'entry 1 (id "a") has a role that is not readonly or operator',
      'entry 2 (id "b") holds the same key as OPS_API_KEY_ROLES item 1; list each key once',
    ]);
    expect(bad.message).not.toContain('env-readonly-key-0001');
    expect(refusal(() => reloadApiKeys('[]', [])).problems[0]!.problem).toMatch(/configures no key/);
  });
});
