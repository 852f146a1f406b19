import { describe, expect, jest, test } from '@jest/globals';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseApiKeyRoles } from '../../../src/api/apiKeys.js';
import { CHART, KUBE_VERSION, ROOT, find, helm, one, render, renderError, templateArgs } from '../../helpers/helm.js';

/**
 * The chart's multi-entry values in the shapes a helm user writes them (real helm): API keys as a
 * list of {key, role} from -f, --set and --set-file, merged with the comma string; notification
 * URLs as a list; and every values file under k8s/examples/ rendered with `helm template -f`.
 */
jest.setTimeout(120_000);

const secretData = (objs: Awaited<ReturnType<typeof render>>) => {
  const s = one(objs, 'Secret', 'opsgate');
  return Object.fromEntries(Object.entries<string>(s.data).map(([k, v]) => [k, Buffer.from(v, 'base64').toString()]));
};

describe('secrets.apiKeys (list of {key, role})', () => {
  test('--set with indices gives OPS_API_KEY_ROLES the API parses', async () => {
    const data = secretData(
      await render({
        set: {
          'secrets.apiKeys[0].key': 'op-0123456789abcdef',
          'secrets.apiKeys[0].role': 'operator',
          'secrets.apiKeys[1].key': 'ro-0123456789abcdef',
          'secrets.apiKeys[1].role': 'readonly',
        },
      }),
    );
    expect(data.OPS_API_KEY_ROLES).toBe('op-0123456789abcdef:operator,ro-0123456789abcdef:readonly');
    expect(parseApiKeyRoles(data.OPS_API_KEY_ROLES).map((k) => k.role)).toEqual(['operator', 'readonly']);
  });

  test('--set-file reads a key from a file', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'opsgate-setfile-'));
    try {
      writeFileSync(join(dir, 'key'), 'file-key-0123456789abcdef');
      const r = await helm([
        ...templateArgs({ set: { 'secrets.apiKeys[0].role': 'operator' } }),
        '--set-file',
        `secrets.apiKeys[0].key=${join(dir, 'key')}`,
        '--show-only',
        'templates/secret.yaml',
      ]);
      expect(r.stderr).toBe('');
      const data = /OPS_API_KEY_ROLES: "([^"]+)"/.exec(r.stdout)![1]!;
      expect(Buffer.from(data, 'base64').toString()).toBe('file-key-0123456789abcdef:operator');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('-f and the comma string are merged (string items first)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'opsgate-values-'));
    try {
      writeFileSync(join(dir, 'v.yaml'), 'secrets:\n  apiKeys:\n    - { key: list-0123456789abcdef, role: readonly }\n');
      const data = secretData(
        await render({ files: [join(dir, 'v.yaml')], setString: { 'secrets.apiKeyRoles': 'str-0123456789abcdef:operator' } }),
      );
      expect(data.OPS_API_KEY_ROLES).toBe('str-0123456789abcdef:operator,list-0123456789abcdef:readonly');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('a key listed twice across both forms fails the render', async () => {
    const err = await renderError({
      set: { 'secrets.apiKeys[0].key': 'same-0123456789abcdef', 'secrets.apiKeys[0].role': 'operator' },
      setString: { 'secrets.apiKeyRoles': 'same-0123456789abcdef:readonly' },
    });
    expect(err).toMatch(/listed twice/);
    expect(err).not.toMatch(/same-0123456789abcdef/);
  });

  test('the schema refuses an unknown role, a missing key and a key with a comma', async () => {
    expect(await renderError({ set: { 'secrets.apiKeys[0].key': 'k-0123456789abcdef', 'secrets.apiKeys[0].role': 'admin' } })).toMatch(
      /role/,
    );
    expect(await renderError({ set: { 'secrets.apiKeys[0].role': 'operator' } })).toMatch(/key/);
    expect(await renderError({ setString: { 'secrets.apiKeys[0].key': 'a\\,b', 'secrets.apiKeys[0].role': 'operator' } })).toMatch(
      /apiKeys/,
    );
  });

  test('without any key the chart generates one operator and one readonly key', async () => {
    const roles = parseApiKeyRoles(secretData(await render()).OPS_API_KEY_ROLES);
    expect(roles.map((k) => k.role)).toEqual(['operator', 'readonly']);
  });
});

describe('secrets.notifyWebhookUrls', () => {
  test('a list from --set {a,b} becomes the comma-separated variable', async () => {
    const data = secretData(await render({ set: { 'secrets.notifyWebhookUrls': '{https://chat.example/a,https://pager.example/b}' } }));
    expect(data.NOTIFY_WEBHOOK_URLS).toBe('https://chat.example/a,https://pager.example/b');
  });

  test('the schema refuses a list entry that is not an http(s) URL', async () => {
    expect(await renderError({ set: { 'secrets.notifyWebhookUrls': '{ftp://x}' } })).toMatch(/notifyWebhookUrls/);
  });
});

describe('inventory from the command line', () => {
  test('--set of a host with its deployments gives the worker its Role', async () => {
    const objs = await render({
      set: { 'inventory.hosts.web-9.namespace': 'shop', 'inventory.hosts.web-9.deployments': '{storefront,checkout}' },
    });
    const role = find(objs, 'Role').find((r) => r.metadata.namespace === 'shop' && /worker/.test(r.metadata.name))!;
    expect(JSON.stringify(role.rules)).toContain('storefront');
  });
});

describe('k8s/examples values files', () => {
  const dir = join(ROOT, 'k8s/examples');
  const files = readdirSync(dir).filter((f) => /\.ya?ml$/.test(f) && !f.startsWith('alertmanager-receiver'));
  // What an example's own header says to add on the command line (a secret no file should carry).
  const extra: Record<string, Record<string, string>> = {
    'ingress-traefik.yaml': { 'secrets.webhookSecrets.alerts': 'render-test-token-0123456789' },
  };

  test('the values files are the ones expected (a new example must be added here)', () => {
    expect(files.sort()).toEqual(['ingress-traefik.yaml', 'inventory.yaml', 'local-images.yaml', 'values.example.yaml']);
  });

  test.each(files)('%s renders with helm template -f', async (f) => {
    const objs = await render({ files: [join(dir, f)], set: extra[f] });
    expect(find(objs, 'Deployment').length).toBeGreaterThanOrEqual(2);
  });

  test.each(files)('%s passes helm lint --strict', async (f) => {
    const sets = Object.entries(extra[f] ?? {}).flatMap(([k, v]) => ['--set', `${k}=${v}`]);
    const r = await helm(['lint', '--strict', '--quiet', '--kube-version', KUBE_VERSION, CHART, '-f', join(dir, f), ...sets]);
    expect({ code: r.code, out: r.stdout + r.stderr }).toEqual({ code: 0, out: expect.not.stringMatching(/\[(ERROR|WARNING)\]/) });
  });

  test('inventory.yaml passes the schema and its hosts reach RBAC', async () => {
    const objs = await render({ files: [join(dir, 'inventory.yaml')] });
    expect(find(objs, 'Role').map((r) => r.metadata.namespace)).toContain('shop');
  });
});
