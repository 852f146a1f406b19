import { afterAll, describe, expect, jest, test } from '@jest/globals';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadApiConfig } from '../../../src/api/config.js';
import { parseApiKeyRoles } from '../../../src/api/apiKeys.js';
import { find, one, render, renderError, renderNotes, VALUES_DIR, type K8sObject } from '../../helpers/helm.js';

/**
 * The chart's keys file (real helm): secrets.apiKeys entries with an id become api-keys.yaml in the
 * chart-made Secret (the file OPS_API_KEYS_FILE the API reads), mounted into the api pods; an
 * existingSecret may hold the file under a key of its own; the schema and the render refuse what
 * the API would refuse at start, without echoing a key or a hash.
 */
jest.setTimeout(120_000);

const OP = 'op-key-in-clear-0123456789';
const RO = 'ro-key-by-hash-0123456789';
const ENV = 'env-form-key-0123456789';
const sha = (s: string) => createHash('sha256').update(s).digest('hex');

const dir = mkdtempSync(join(tmpdir(), 'opsgate-chart-keys-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const secretData = (objs: K8sObject[]): Record<string, string> =>
  Object.fromEntries(Object.entries<string>(one(objs, 'Secret', 'opsgate').data).map(([k, v]) => [k, Buffer.from(v, 'base64').toString()]));
const apiPod = (objs: K8sObject[]) => one(objs, 'Deployment', 'opsgate-api').spec.template.spec;
const env = (objs: K8sObject[]) => apiPod(objs).containers[0].env as { name: string; value?: string; valueFrom?: any }[];

function valuesFile(name: string, text: string): string {
  const f = join(dir, name);
  writeFileSync(f, text);
  return f;
}

/** What the API's config makes of the rendered Secret, with the keys file where the pod has it. */
function apiKeysOf(objs: K8sObject[]) {
  const data = secretData(objs);
  const file = join(dir, `api-keys-${Math.random().toString(36).slice(2)}.yaml`);
  writeFileSync(file, data['api-keys.yaml'] ?? '');
  return loadApiConfig({ REDIS_URL: 'redis://r:6379', OPS_API_KEY_ROLES: data.OPS_API_KEY_ROLES, OPS_API_KEYS_FILE: file }).apiKeys;
}

describe('secrets.apiKeys entries with an id: the keys file', () => {
  // Written as a user writes a values file: the expiry unquoted.
  const mixed = valuesFile(
    'mixed.yaml',
    `secrets:
  apiKeys:
    - { id: ci-deploy, role: operator, key: ${OP}, expires: 2026-03-01T00:00:00Z }
    - { id: grafana, role: readonly, sha256: ${sha(RO)} }
    - { key: ${ENV}, role: readonly }
`,
  );

  test('become api-keys.yaml of the Secret, read by the API as written; entries without an id stay in OPS_API_KEY_ROLES', async () => {
    const objs = await render({ files: [mixed] });
    const data = secretData(objs);
    expect(Object.keys(data).sort()).toEqual(['OPS_API_KEY_ROLES', 'REDIS_PASSWORD', 'api-keys.yaml']);
    expect(data.OPS_API_KEY_ROLES).toBe(`${ENV}:readonly`);
    expect(data['api-keys.yaml']).not.toContain(RO); // a hash entry: no usable key in the Secret
    const keys = apiKeysOf(objs);
    expect(keys.map((k) => [k.id, k.role, k.source, k.expiresAt])).toEqual([
      [parseApiKeyRoles(`${ENV}:readonly`)[0]!.id, 'readonly', 'env', undefined],
      ['ci-deploy', 'operator', 'file', Date.parse('2026-03-01T00:00:00Z')],
      ['grafana', 'readonly', 'file', undefined],
    ]);
    expect(keys[2]!.digest.toString('hex')).toBe(sha(RO));
  });

  test('mounted read-only into the api pods as a whole volume; OPS_API_KEYS_FILE points at it; the worker gets none', async () => {
    const objs = await render({ files: [mixed] });
    const spec = apiPod(objs);
    expect(spec.volumes.find((v: any) => v.name === 'api-keys')).toEqual({
      name: 'api-keys',
      secret: { secretName: 'opsgate', defaultMode: 288, items: [{ key: 'api-keys.yaml', path: 'api-keys.yaml' }] },
    });
    const mount = spec.containers[0].volumeMounts.find((m: any) => m.name === 'api-keys');
    expect(mount).toEqual({ name: 'api-keys', mountPath: '/etc/opsgate-keys', readOnly: true }); // no subPath
    expect(env(objs).find((e) => e.name === 'OPS_API_KEYS_FILE')).toEqual({
      name: 'OPS_API_KEYS_FILE',
      value: '/etc/opsgate-keys/api-keys.yaml',
    });
    expect(env(objs).find((e) => e.name === 'OPS_API_KEY_ROLES')!.valueFrom.secretKeyRef).toEqual({
      name: 'opsgate',
      key: 'OPS_API_KEY_ROLES',
      optional: true,
    });
    const worker = one(objs, 'Deployment', 'opsgate-worker').spec.template.spec;
    expect(JSON.stringify(worker)).not.toMatch(/api-keys|OPS_API_KEYS_FILE/);
    expect(one(objs, 'ConfigMap', 'opsgate-config').data.API_KEY_EXPIRY_WARNING_DAYS).toBe('14');
  });

  test('only hashed keys: no OPS_API_KEY_ROLES and no generated key; the API starts with the file alone', async () => {
    const objs = await render({
      set: { 'secrets.apiKeys[0].id': 'only', 'secrets.apiKeys[0].role': 'operator', 'config.apiKeyExpiryWarningDays': '30' },
      setString: { 'secrets.apiKeys[0].sha256': sha(OP), 'secrets.apiKeys[0].expires': '2027-01-01T00:00:00+02:00' },
    });
    const data = secretData(objs);
    expect(data.OPS_API_KEY_ROLES).toBeUndefined();
    expect(apiKeysOf(objs).map((k) => [k.id, k.expiresAt])).toEqual([['only', Date.parse('2026-12-31T22:00:00Z')]]);
    expect(one(objs, 'ConfigMap', 'opsgate-config').data.API_KEY_EXPIRY_WARNING_DAYS).toBe('30');
  });

  test('without entries with an id nothing changes: no file, no volume, OPS_API_KEY_ROLES required', async () => {
    const objs = await render({ set: { 'secrets.apiKeys[0].key': ENV, 'secrets.apiKeys[0].role': 'operator' } });
    expect(Object.keys(secretData(objs))).not.toContain('api-keys.yaml');
    expect(apiPod(objs).volumes.some((v: any) => v.name === 'api-keys')).toBe(false);
    expect(env(objs).find((e) => e.name === 'OPS_API_KEYS_FILE')).toBeUndefined();
    expect(env(objs).find((e) => e.name === 'OPS_API_KEY_ROLES')!.valueFrom.secretKeyRef.optional).toBeUndefined();
  });

  test('NOTES.txt says where the keys are and how to see their expiry', async () => {
    const notes = await renderNotes(
      join(VALUES_DIR, 'defaults-values.yaml'),
      { 'secrets.apiKeys[0].id': 'only', 'secrets.apiKeys[0].role': 'operator', 'secrets.apiKeys[0].sha256': sha(OP) },
      { 'secrets.apiKeyRoles': '' },
    );
    expect(notes).toContain('They are all in the keys\n   file (key api-keys.yaml of the Secret');
    expect(notes).toContain('GET /ops/keys');
    expect(notes).not.toContain(sha(OP));
  });
});

describe('owners: who holds each credential', () => {
  test("an entry's owner goes into the keys file, read by the API as written; without one the id is the owner", async () => {
    const f = valuesFile(
      'owners.yaml',
      `secrets:
  apiKeys:
    - { id: alice-laptop, role: operator, key: ${OP}, owner: alice@example.com }
    - { id: grafana, role: readonly, sha256: ${sha(RO)} }
    - { key: ${ENV}, role: readonly }
`,
    );
    const keys = apiKeysOf(await render({ files: [f] }));
    const envId = parseApiKeyRoles(`${ENV}:readonly`)[0]!.id;
    expect(keys.map((k) => [k.id, k.owner])).toEqual([
      [envId, `env:${envId}`],
      ['alice-laptop', 'alice@example.com'],
      ['grafana', 'grafana'],
    ]);
  });

  test('config.bearerTokenOwner is OPS_BEARER_TOKEN_OWNER in the ConfigMap, which the API accepts; empty (default): not set', async () => {
    expect(one(await render({}), 'ConfigMap', 'opsgate-config').data.OPS_BEARER_TOKEN_OWNER).toBeUndefined();
    const data = one(await render({ set: { 'config.bearerTokenOwner': 'ci:deploy-bot' } }), 'ConfigMap', 'opsgate-config').data;
    expect(data.OPS_BEARER_TOKEN_OWNER).toBe('ci:deploy-bot');
    const config = loadApiConfig({ REDIS_URL: 'redis://r:6379', OPS_API_KEY_ROLES: `${ENV}:readonly`, ...data });
    expect(config.OPS_BEARER_TOKEN_OWNER).toBe('ci:deploy-bot');
  });

  test.each([
    [
      'an entry owner with a space',
      {
        'secrets.apiKeys[0].id': 'a',
        'secrets.apiKeys[0].role': 'readonly',
        'secrets.apiKeys[0].key': OP,
        'secrets.apiKeys[0].owner': 'alice smith',
      },
      /apiKeys\/0\/owner'/,
    ],
    [
      'an entry owner without an id',
      { 'secrets.apiKeys[0].role': 'readonly', 'secrets.apiKeys[0].key': OP, 'secrets.apiKeys[0].owner': 'alice' },
      /apiKeys\/0': missing property 'id'/,
    ],
    ['a bearer token owner of 129 characters', { 'config.bearerTokenOwner': 'o'.repeat(129) }, /config\/bearerTokenOwner'/],
  ])('refused at render: %s', async (_name, setString, message) => {
    const err = await renderError({ setString });
    expect(err).toMatch(message);
    expect(err).not.toContain(OP);
  });
});

describe('an existingSecret holding the keys file', () => {
  test('secrets.existingSecretApiKeysFile names its key: mounted as api-keys.yaml, OPS_API_KEY_ROLES optional', async () => {
    const objs = await render({ set: { 'secrets.existingSecret': 'mine', 'secrets.existingSecretApiKeysFile': 'keys.json' } });
    expect(find(objs, 'Secret')).toHaveLength(0);
    expect(apiPod(objs).volumes.find((v: any) => v.name === 'api-keys').secret).toEqual({
      secretName: 'mine',
      defaultMode: 288,
      items: [{ key: 'keys.json', path: 'api-keys.yaml' }],
    });
    expect(env(objs).find((e) => e.name === 'OPS_API_KEY_ROLES')!.valueFrom.secretKeyRef.optional).toBe(true);
    expect(env(objs).find((e) => e.name === 'OPS_API_KEYS_FILE')!.value).toBe('/etc/opsgate-keys/api-keys.yaml');
  });

  test('without existingSecret the value is refused', async () => {
    expect(await renderError({ set: { 'secrets.existingSecretApiKeysFile': 'api-keys.yaml' } })).toMatch(
      /secrets\.existingSecretApiKeysFile names a key of secrets\.existingSecret/,
    );
  });
});

describe('refused at render, never echoing a key or a hash', () => {
  const entry = (fields: Record<string, string>) =>
    Object.fromEntries(Object.entries(fields).map(([k, v]) => [`secrets.apiKeys[0].${k}`, v])) as Record<string, string>;

  test.each([
    ['a sha256 that is not 64 hex characters', { id: 'a', role: 'readonly', sha256: sha(RO).slice(1) }, /sha256/],
    ['an expires that is not RFC 3339', { id: 'a', role: 'readonly', key: OP, expires: '2026-03-01' }, /expires/],
    ['both key and sha256', { id: 'a', role: 'readonly', key: OP, sha256: sha(RO) }, /oneOf|key|sha256/],
    ['a sha256 without an id', { role: 'readonly', sha256: sha(RO) }, /id/],
    ['an expires without an id', { role: 'readonly', key: OP, expires: '2026-03-01T00:00:00Z' }, /id/],
    ['an id with a space', { id: 'has space', role: 'readonly', key: OP }, /id/],
    ['a misspelt field', { id: 'a', role: 'readonly', key: OP, expiry: '2026-03-01T00:00:00Z' }, /expiry/],
  ])('%s', async (_name, fields, message) => {
    const err = await renderError({ setString: entry(fields) });
    expect(err).toMatch(message);
  });

  test('an id listed twice', async () => {
    const f = valuesFile(
      'twice-id.yaml',
      `secrets:\n  apiKeys:\n    - { id: a, role: readonly, key: ${OP} }\n    - { id: a, role: readonly, sha256: ${sha(RO)} }\n`,
    );
    expect(await renderError({ files: [f] })).toMatch(/secrets\.apiKeys lists the id "a" twice/);
  });

  test.each([
    [
      'a key and its own hash',
      `- { id: a, role: readonly, key: ${OP} }\n    - { id: b, role: operator, sha256: ${sha(OP).toUpperCase()} }`,
    ],
    [
      'a key of OPS_API_KEY_ROLES and its hash in the file',
      `- { key: ${OP}, role: readonly }\n    - { id: b, role: operator, sha256: ${sha(OP)} }`,
    ],
  ])('the same key twice: %s', async (name, entries) => {
    const f = valuesFile(`twice-${name.length}.yaml`, `secrets:\n  apiKeys:\n    ${entries}\n`);
    const err = await renderError({ files: [f] });
    expect(err).toMatch(/an API key is listed twice/);
    expect(err).not.toContain(OP);
    expect(err.toLowerCase()).not.toContain(sha(OP));
  });
});
