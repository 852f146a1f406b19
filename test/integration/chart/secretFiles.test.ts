import { afterAll, describe, expect, jest, test } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadApiConfig } from '../../../src/api/config.js';
import { SOURCES } from '../../../src/sources/index.js';
import { containerEnv, one, render, renderError, renderNotes, secretData, type K8sObject } from '../../helpers/helm.js';

/**
 * File mode (ci/secret-files-values.yaml, real helm): each enabled webhook sender's secret reaches
 * the api as a file of the Secret (<NAME>_WEBHOOK_SECRET_FILE) in a projected volume the kubelet
 * updates in place, beside the keys file; a secret in rotation is two lines, read by the API as the
 * current and the previous value; and a rotation of the keys file or of a webhook secret leaves
 * both pod templates as they were (no rollout), while a secret still read from the environment
 * rolls them.
 */
jest.setTimeout(120_000);

const FILE = 'secret-files-values.yaml';
const apiPod = (objs: K8sObject[]) => one(objs, 'Deployment', 'opsgate-api').spec.template.spec;
const template = (objs: K8sObject[], name: string) => one(objs, 'Deployment', name).spec.template;
const dir = mkdtempSync(join(tmpdir(), 'opsgate-chart-secret-files-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The files the api pod sees in its webhook-secrets volume: each projected item the rendered Secret holds. */
function projectedFiles(objs: K8sObject[]): Record<string, string> {
  const vol = apiPod(objs).volumes.find((v: any) => v.name === 'webhook-secrets');
  const data = secretData(objs);
  const out: Record<string, string> = {};
  for (const src of vol.projected.sources) for (const item of src.secret.items) if (item.key in data) out[item.path] = data[item.key]!;
  return out;
}

describe('secret-files-values.yaml', () => {
  let objs: K8sObject[];
  test('renders', async () => {
    objs = await render({ files: [FILE] });
  });

  test("each enabled sender's <VARIABLE>_FILE points into the webhook-secrets volume; no sender secret in the environment", () => {
    const env = apiPod(objs).containers[0].env as { name: string; value?: string; valueFrom?: unknown }[];
    const enabled = ['alerts', 'github', 'gitlab', 'scm'].map((n) => SOURCES.find((s) => s.name === n)!.secret.env);
    for (const v of enabled) {
      expect(env.find((e) => e.name === `${v}_FILE`)).toEqual({ name: `${v}_FILE`, value: `/etc/opsgate-secrets/${v}` });
      expect(env.find((e) => e.name === v)).toBeUndefined();
    }
    const mount = apiPod(objs).containers[0].volumeMounts.find((m: any) => m.name === 'webhook-secrets');
    expect(mount).toEqual({ name: 'webhook-secrets', mountPath: '/etc/opsgate-secrets', readOnly: true });
    const vol = apiPod(objs).volumes.find((v: any) => v.name === 'webhook-secrets');
    // Optional like the variables were: a sender without its key runs unconfigured (gitlab falls back to scm).
    expect(vol.projected).toEqual({
      defaultMode: 0o440,
      sources: [{ secret: { name: 'opsgate', optional: true, items: enabled.sort().map((v) => ({ key: v, path: v })) } }],
    });
    expect(containerEnv(objs, 'opsgate-api').SECRETS_RELOAD_INTERVAL_MS).toBe('5000');
    // The worker reads no sender secret.
    expect(template(objs, 'opsgate-worker').spec.volumes.some((v: any) => v.name === 'webhook-secrets')).toBe(false);
  });

  test('a secret in rotation is two lines of the Secret, read by the API as the current and the previous value', () => {
    const files = projectedFiles(objs);
    expect(files.GITHUB_WEBHOOK_SECRET).toBe('fake-github-secret-0009-new\nfake-github-secret-0009-old');
    const paths: Record<string, string> = {};
    for (const [name, text] of Object.entries(files)) writeFileSync((paths[`${name}_FILE`] = join(dir, name)), text);
    const data = secretData(objs);
    const keysFile = join(dir, 'api-keys.yaml');
    writeFileSync(keysFile, data['api-keys.yaml']!);
    const config = loadApiConfig({ REDIS_URL: 'redis://r:6379', OPS_API_KEYS_FILE: keysFile, ...paths });
    expect(config.senderSecrets).toEqual({
      GITHUB_WEBHOOK_SECRET: ['fake-github-secret-0009-new', 'fake-github-secret-0009-old'],
      SCM_WEBHOOK_SECRET: ['fake-scm-secret-0009'],
      ALERTS_WEBHOOK_TOKEN: ['fake-alerts-token-0009'],
    });
    expect(config.credentialFiles.map((f) => f.variable).sort()).toEqual(
      ['ALERTS_WEBHOOK_TOKEN_FILE', 'GITHUB_WEBHOOK_SECRET_FILE', 'OPS_API_KEYS_FILE', 'SCM_WEBHOOK_SECRET_FILE'].sort(),
    );
    expect(config.apiKeys.filter((k) => k.source === 'file').map((k) => k.id)).toEqual(['ci-2026', 'ci-2025']);
  });
});

test('NOTES.txt says the secrets are files re-read without a restart, and shows none of them', async () => {
  const notes = await renderNotes(FILE);
  expect(notes).toContain('File mode (secrets.asFiles): each secret above is a file the API re-reads every 5000 ms');
  for (const secret of ['fake-github-secret-0009-new', 'fake-scm-secret-0009', 'fake-ci-key-0009-new']) expect(notes).not.toContain(secret);
});

describe('a rotation rolls no pod in file mode', () => {
  test('new keys in the keys file and a new webhook secret leave both pod templates as they were; a secret of the environment rolls them', async () => {
    const [base, rotated, bearer, envMode, envModeRotated] = await Promise.all([
      render({ files: [FILE] }),
      render({
        files: [FILE],
        set: {
          'secrets.apiKeys[0].key': 'fake-ci-key-0010-newer',
          'secrets.apiKeys[1].key': 'fake-ci-key-0009-new',
          'secrets.webhookSecrets.github': '{fake-github-secret-0010}',
          'secrets.webhookSecrets.scm': 'fake-scm-secret-0010',
        },
      }),
      render({ files: [FILE], set: { 'secrets.bearerToken': 'fake-bearer-token-0010' } }),
      render({ files: [FILE], set: { 'secrets.asFiles': 'false', 'secrets.webhookSecrets.github': 'fake-github-secret-0009-new' } }),
      render({ files: [FILE], set: { 'secrets.asFiles': 'false', 'secrets.webhookSecrets.github': 'fake-github-secret-0010' } }),
    ]);
    expect(secretData(rotated).GITHUB_WEBHOOK_SECRET).toBe('fake-github-secret-0010');
    expect(secretData(rotated)['api-keys.yaml']).not.toBe(secretData(base)['api-keys.yaml']);
    for (const name of ['opsgate-api', 'opsgate-worker']) {
      expect(template(rotated, name)).toEqual(template(base, name));
      expect(template(bearer, name).metadata.annotations['checksum/secret']).not.toBe(
        template(base, name).metadata.annotations['checksum/secret'],
      );
      // In env mode every secret is in the environment: a new webhook secret rolls the pods.
      expect(template(envModeRotated, name).metadata.annotations['checksum/secret']).not.toBe(
        template(envMode, name).metadata.annotations['checksum/secret'],
      );
    }
  });
});

describe('what file mode needs', () => {
  test('with an existingSecret while the Ingress routes /webhook/alerts, its token is a required item (the pod does not start without it)', async () => {
    const objs = await render({
      files: [FILE],
      set: { 'secrets.existingSecret': 'mine', 'ingress.enabled': 'true' },
    });
    const sources = apiPod(objs).volumes.find((v: any) => v.name === 'webhook-secrets').projected.sources;
    expect(sources).toEqual([
      {
        secret: {
          name: 'mine',
          optional: true,
          items: ['GITHUB_WEBHOOK_SECRET', 'GITLAB_WEBHOOK_SECRET', 'SCM_WEBHOOK_SECRET'].map((v) => ({ key: v, path: v })),
        },
      },
      { secret: { name: 'mine', items: [{ key: 'ALERTS_WEBHOOK_TOKEN', path: 'ALERTS_WEBHOOK_TOKEN' }] } },
    ]);
  });

  test('no sender enabled: no volume (a projected source without items would expose every key of the Secret)', async () => {
    const set: Record<string, string> = { 'secrets.asFiles': 'true' };
    for (const s of SOURCES) set[`webhooks.senders.${s.name}.enabled`] = 'false';
    const objs = await render({ set });
    expect(apiPod(objs).volumes.some((v: any) => v.name === 'webhook-secrets')).toBe(false);
  });

  test.each([
    [{ 'secrets.asFiles': 'false' }, /secrets\.webhookSecrets\.github is a list .* two values need secrets\.asFiles=true/],
    [{ 'secrets.webhookSecrets.github': '{a-value-1,b-value-2,c-value-3}' }, /webhookSecrets/],

    [{ 'config.secretsReloadIntervalMs': '10' }, /secretsReloadIntervalMs/],
  ])('refused: %j', async (set, message) => {
    expect(await renderError({ files: [FILE], set })).toMatch(message);
  });

  test('refused: a value with spaces around it (a pasting mistake no sender reproduces)', async () => {
    const f = join(dir, 'padded.yaml');
    writeFileSync(f, 'secrets:\n  webhookSecrets:\n    github: [" padded-value", fake-github-secret-0009-old]\n');
    expect(await renderError({ files: [FILE, f] })).toMatch(/webhookSecrets/);
  });
});
