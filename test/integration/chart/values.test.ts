import { describe, expect, jest, test } from '@jest/globals';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { isMap, isScalar, parseDocument, type YAMLMap } from 'yaml';
import { CHART, KUBE_VERSION, VALUES_DIR, helm, renderError, renderText } from '../../helpers/helm.js';

/**
 * values.yaml <-> values.schema.json <-> helm-docs comments, and the schema really rejecting bad
 * values through `helm template` with a message naming the value.
 */
jest.setTimeout(120_000);

const schema = JSON.parse(readFileSync(join(CHART, 'values.schema.json'), 'utf8'));
const valuesDoc = parseDocument(readFileSync(join(CHART, 'values.yaml'), 'utf8'));

function resolveRef(node: any): any {
  while (node && node.$ref)
    node = node.$ref
      .replace('#/definitions/', '')
      .split('/')
      .reduce((n: any, k: string) => n[k], schema.definitions);
  return node;
}

/** Walks values.yaml keys along the schema: every key the schema names must be in values.yaml with a `# --` comment. */
function walk(map: YAMLMap, node: any, path: string, out: { path: string; comment: string | undefined }[], seen: Set<string>) {
  node = resolveRef(node);
  map.items.forEach((pair, i) => {
    const key = String(isScalar(pair.key) ? pair.key.value : pair.key);
    const p = path ? `${path}.${key}` : key;
    seen.add(p);
    // The yaml parser hangs the comment above a map's first key on the map itself.
    const comment = (isScalar(pair.key) ? pair.key.commentBefore : undefined) ?? (i === 0 ? map.commentBefore : undefined) ?? undefined;
    const childSchema = node?.properties?.[key];
    if (!childSchema) return; // free-form maps (resources lists, stringMaps) are not documented per entry
    out.push({ path: p, comment });
    if (isMap(pair.value)) walk(pair.value, childSchema, p, out, seen);
  });
}

describe('values.yaml and values.schema.json', () => {
  const documented: { path: string; comment: string | undefined }[] = [];
  const seen = new Set<string>();
  walk(valuesDoc.contents as YAMLMap, schema, '', documented, seen);

  test('values.yaml names its schema on its first line, so editors (yaml-language-server) validate it', () => {
    const first = readFileSync(join(CHART, 'values.yaml'), 'utf8').split('\n')[0];
    const m = /^# yaml-language-server: \$schema=(\S+)$/.exec(first ?? '');
    expect(m?.[1]).toBe('values.schema.json');
    expect(existsSync(join(CHART, m![1]!))).toBe(true);
  });

  test('the schema is strict: every object forbids unknown keys', () => {
    const loose: string[] = [];
    const visit = (n: any, p: string) => {
      if (!n || typeof n !== 'object') return;
      if (n.type === 'object' && n.properties && n.additionalProperties !== false) loose.push(p);
      for (const [k, v] of Object.entries(n)) if (typeof v === 'object') visit(v, `${p}/${k}`);
    };
    visit(schema, '#');
    expect(loose).toEqual([]);
    expect(schema.additionalProperties).toBe(false);
  });

  test('every value the schema defines is in values.yaml, and every values.yaml key is in the schema', () => {
    const missing: string[] = [];
    const visit = (n: any, p: string) => {
      n = resolveRef(n);
      for (const [k, v] of Object.entries<any>(n?.properties ?? {})) {
        const q = p ? `${p}.${k}` : k;
        if (!seen.has(q)) missing.push(q);
        const r = resolveRef(v);
        if (r?.type === 'object' && r.properties && seen.has(q)) visit(r, q);
      }
    };
    visit(schema, '');
    expect(missing).toEqual([]);
    expect(documented.length).toBeGreaterThan(100);
  });

  test('every value has a helm-docs "# --" description', () => {
    const undocumented = documented.filter((d) => !d.comment || !/(^|\n)\s*-- \S/.test(d.comment)).map((d) => d.path);
    expect(undocumented).toEqual([]);
  });

  test('the defaults hold no secret: every secrets.* value and the Redis password are empty', () => {
    const v = valuesDoc.toJS();
    const empty: Record<string, unknown> = { apiKeys: [], webhookSecrets: {}, asFiles: false, existingSecretOutboundKeys: [] };
    for (const [k, val] of Object.entries(v.secrets)) if (k !== 'annotations') expect([k, val]).toEqual([k, k in empty ? empty[k] : '']);
    expect(v.redis.auth.password).toBe('');
  });
});

describe('the schema rejects bad values with a message naming them', () => {
  const bad: [string, Record<string, string>, RegExp][] = [
    ['unknown top-level key', { replicas: '3' }, /additional ?propert(y|ies).*replicas|replicas.*not allowed/i],
    ['unknown nested key', { 'api.replicas': '3' }, /api.*replicas/i],
    ['replicaCount not an integer', { 'api.replicaCount': 'two' }, /api.*replicaCount|replicaCount.*integer/i],
    ['API key with an unknown role', { 'secrets.apiKeyRoles': 'some-key:admin' }, /apiKeyRoles/],
    ['API key item without a role', { 'secrets.apiKeyRoles': 'justakey' }, /apiKeyRoles/],
    ['Redis password with URL-breaking characters', { 'redis.auth.password': 'p@ss/word:with-stuff' }, /password/],
    [
      'namespace that is not a DNS label',
      { 'inventory.hosts.h1.namespace': 'Bad_NS', 'inventory.hosts.h1.deployments[0]': 'web' },
      /namespace/,
    ],
    ['host without deployments', { 'inventory.hosts.h1.namespace': 'shop' }, /deployments/],
    [
      'unknown key in a host entry',
      { 'inventory.hosts.h1.namespace': 'shop', 'inventory.hosts.h1.deployments[0]': 'web', 'inventory.hosts.h1.pods': 'x' },
      /pods/,
    ],
    ['privilege escalation allowed', { 'containerSecurityContext.allowPrivilegeEscalation': 'true' }, /allowPrivilegeEscalation/],
    ['running as root allowed', { 'podSecurityContext.runAsNonRoot': 'false' }, /runAsNonRoot/],
    ['bad pull policy', { 'image.pullPolicy': 'Sometimes' }, /pullPolicy/],
    ['log level', { 'config.logLevel': 'verbose' }, /logLevel/],
    ['port out of range', { 'config.port': '70000' }, /port/],
    ['appendfsync', { 'redis.appendfsync': 'sometimes' }, /appendfsync/],
    ['external Redis URL scheme', { 'secrets.redisUrl': 'http://redis:6379' }, /redisUrl/],
    ['notify URLs that are not http(s)', { 'secrets.notifyWebhookUrls': 'ftp://x' }, /notifyWebhookUrls/],
  ];

  test.each(bad)('%s', async (_name, set, message) => {
    const err = await renderError({ files: ['defaults-values.yaml'], set });
    expect(err).toMatch(/values don't meet the specifications of the schema/);
    expect(err).toMatch(message);
  });

  test('a secret variable cannot be smuggled in through extraEnv', async () => {
    const err = await renderError({
      files: ['defaults-values.yaml'],
      set: { 'api.extraEnv[0].name': 'OPS_BEARER_TOKEN', 'api.extraEnv[0].value': 'plain' },
    });
    expect(err).toMatch(/values don't meet the specifications of the schema/);
    expect(err).toMatch(/extraEnv/);
  });

  test('the good values files all pass (so the refusals above are about the bad value)', async () => {
    for (const f of readdirSync(VALUES_DIR).filter((x) => x.endsWith('.yaml'))) {
      await expect(renderText({ files: [f] })).resolves.toContain('kind: Deployment');
    }
  });
});

describe('helm lint --strict', () => {
  test.each(
    readdirSync(VALUES_DIR)
      .filter((f) => f.endsWith('.yaml'))
      .sort(),
  )('%s', async (f) => {
    const r = await helm(['lint', '--strict', '--kube-version', KUBE_VERSION, CHART, '-f', join(VALUES_DIR, f)]);
    expect(r.stdout + r.stderr).toMatch(/1 chart\(s\) linted, 0 chart\(s\) failed/);
    expect(r.stdout).not.toMatch(/\[(WARNING|ERROR)\]/);
    expect(r.code).toBe(0);
  });

  test('fails on a values file the schema rejects', async () => {
    const r = await helm([
      'lint',
      '--strict',
      '--kube-version',
      KUBE_VERSION,
      CHART,
      '-f',
      join(VALUES_DIR, 'defaults-values.yaml'),
      '--set',
      'api.replicaCount=many',
    ]);
    expect(r.code).not.toBe(0);
    expect(r.stdout + r.stderr).toMatch(/replicaCount/);
  });
});
