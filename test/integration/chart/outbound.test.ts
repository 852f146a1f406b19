import { afterAll, beforeAll, describe, expect, jest, test } from '@jest/globals';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { loadWorkerConfig } from '../../../src/shared/config.js';
import { loadOutboundAuth, outboundCall } from '../../../src/shared/outboundAuth.js';
import { containerEnv, find, one, render, renderError, secretData, type K8sObject } from '../../helpers/helm.js';

/**
 * The credentials of PROMETHEUS_URL and ALERTMANAGER_URL through the chart (real helm): kept in the
 * Secret under their variable names (or in an existingSecret), they reach the api and the worker as
 * files of one projected volume (<VARIABLE>_FILE), never as environment values or ConfigMap data;
 * the client certificates come from Secrets of their own. The files the kubelet would write are
 * written here and read by the processes' own loadOutboundAuth, whose call a real HTTP server
 * answers, so the test sees the very headers Prometheus and Alertmanager would get.
 */
jest.setTimeout(120_000);

const dir = mkdtempSync(join(tmpdir(), 'opsgate-chart-outbound-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const OUTBOUND = '/etc/opsgate-outbound';
const pod = (objs: K8sObject[], name: string) => one(objs, 'Deployment', name).spec.template.spec;
const base = { 'secrets.apiKeyRoles': 'fake-operator-key-0013:operator' };

/** A values file (a rotation's two lines cannot go through --set). */
function valuesFile(name: string, values: unknown): string {
  const path = join(dir, name);
  writeFileSync(path, stringify(values));
  return path;
}

/**
 * The files a pod sees under /etc/opsgate-outbound, written into `root`: each item of the projected
 * volume, from the rendered Secret or, for another Secret, from `others` (its name -> key -> text).
 */
function kubeletFiles(objs: K8sObject[], deployment: string, root: string, others: Record<string, Record<string, string>> = {}) {
  const vol = pod(objs, deployment).volumes.find((v: { name: string }) => v.name === 'outbound');
  const mount = pod(objs, deployment).containers[0].volumeMounts.find((m: { name: string }) => m.name === 'outbound');
  expect(mount).toEqual({ name: 'outbound', mountPath: OUTBOUND, readOnly: true });
  mkdirSync(root, { recursive: true });
  for (const src of vol.projected.sources) {
    const data = others[src.secret.name] ?? secretData(objs, src.secret.name);
    for (const item of src.secret.items) writeFileSync(join(root, item.path), data[item.key]!);
  }
}

/** The container's environment with the outbound paths moved to where the test wrote the files. */
function movedEnv(objs: K8sObject[], deployment: string, root: string): Record<string, string> {
  const env = containerEnv(objs, deployment);
  for (const [k, v] of Object.entries(env)) if (v.startsWith(`${OUTBOUND}/`)) env[k] = join(root, v.slice(OUTBOUND.length + 1));
  return env;
}

let server: Server;
let url: string;
const seen: IncomingHttpHeaders[] = [];
beforeAll(async () => {
  server = createServer((req, res) => {
    seen.push(req.headers);
    res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => new Promise<void>((r) => server.close(() => r())));

/** The headers the server got from one call with the credentials of `prefix` read from `env`. */
async function headersSent(env: Record<string, string>, prefix: 'PROMETHEUS' | 'ALERTMANAGER'): Promise<IncomingHttpHeaders> {
  const auth = loadOutboundAuth(env, prefix, { tenant: prefix === 'PROMETHEUS' });
  const before = seen.length;
  const r = await outboundCall(prefix, url, auth, 5000, 'GET', '/api/v1/query');
  expect(r.status).toBe(200);
  expect(seen.length).toBe(before + 1);
  return seen[before]!;
}

describe('credentials of the chart-made Secret', () => {
  let objs: K8sObject[];
  const promTls = { 'tls.crt': 'fake-client-certificate-0013', 'tls.key': 'fake-client-key-0013', 'ca.crt': 'fake-ca-0013' };
  beforeAll(async () => {
    objs = await render({
      files: [
        valuesFile('chart-made.yaml', {
          config: {
            prometheusUrl: 'https://thanos-query.monitoring:9091',
            prometheusTenantHeader: 'X-Tenant',
            prometheusExternalLabels: { cluster: 'eu-2', replica: 'a' },
            prometheusTls: { secret: 'prom-client', certKey: 'tls.crt', keyKey: 'tls.key', caKey: 'ca.crt' },
            alertmanagerUrl: 'http://alertmanager.monitoring:9093',
            alertmanagerBasicAuthUser: 'opsgate',
          },
          secrets: {
            // During a rotation: the token in use, then the previous one.
            prometheusBearerToken: 'fake-prom-token-0013-new\nfake-prom-token-0013-old',
            prometheusTenant: 'team-a',
            alertmanagerBasicAuthPassword: 'fake-am-password-0013',
          },
        }),
      ],
      set: base,
    });
  });

  test('the Secret holds each under its variable name; both processes get <VARIABLE>_FILE into one projected volume, no value in their environment', () => {
    const data = secretData(objs);
    expect(data.PROMETHEUS_BEARER_TOKEN).toBe('fake-prom-token-0013-new\nfake-prom-token-0013-old');
    expect(data.PROMETHEUS_TENANT).toBe('team-a');
    expect(data.ALERTMANAGER_BASIC_AUTH_PASSWORD).toBe('fake-am-password-0013');
    for (const name of ['opsgate-api', 'opsgate-worker']) {
      const env = pod(objs, name).containers[0].env as { name: string; value?: string }[];
      const files = env.filter((e) => e.value?.startsWith(`${OUTBOUND}/`)).map((e) => [e.name, e.value]);
      expect([name, files]).toEqual([
        name,
        [
          ['PROMETHEUS_BEARER_TOKEN_FILE', `${OUTBOUND}/PROMETHEUS_BEARER_TOKEN`],
          ['PROMETHEUS_TENANT_FILE', `${OUTBOUND}/PROMETHEUS_TENANT`],
          ['ALERTMANAGER_BASIC_AUTH_PASSWORD_FILE', `${OUTBOUND}/ALERTMANAGER_BASIC_AUTH_PASSWORD`],
        ],
      ]);
      for (const e of env) expect([name, e.name, /fake-(prom|am)-|team-a/.test(e.value ?? '')]).toEqual([name, e.name, false]);
      const vol = pod(objs, name).volumes.find((v: { name: string }) => v.name === 'outbound');
      expect(vol.projected).toEqual({
        defaultMode: 0o440,
        sources: [
          {
            secret: {
              name: 'opsgate',
              items: ['PROMETHEUS_BEARER_TOKEN', 'PROMETHEUS_TENANT', 'ALERTMANAGER_BASIC_AUTH_PASSWORD'].map((k) => ({ key: k, path: k })),
            },
          },
          {
            secret: {
              name: 'prom-client',
              items: [
                { key: 'tls.crt', path: 'prometheus-client.crt' },
                { key: 'tls.key', path: 'prometheus-client.key' },
                { key: 'ca.crt', path: 'prometheus-ca.crt' },
              ],
            },
          },
        ],
      });
    }
  });

  test('the ConfigMap holds the addresses, the user, the tenant header, the external labels and the TLS paths, and no credential', () => {
    const cm = one(objs, 'ConfigMap', 'opsgate-config').data as Record<string, string>;
    expect(cm).toMatchObject({
      PROMETHEUS_URL: 'https://thanos-query.monitoring:9091',
      PROMETHEUS_TENANT_HEADER: 'X-Tenant',
      PROMETHEUS_EXTERNAL_LABELS: 'cluster=eu-2,replica=a',
      PROMETHEUS_TLS_CERT_FILE: `${OUTBOUND}/prometheus-client.crt`,
      PROMETHEUS_TLS_KEY_FILE: `${OUTBOUND}/prometheus-client.key`,
      PROMETHEUS_TLS_CA_FILE: `${OUTBOUND}/prometheus-ca.crt`,
      ALERTMANAGER_URL: 'http://alertmanager.monitoring:9093',
      ALERTMANAGER_BASIC_AUTH_USER: 'opsgate',
    });
    for (const c of find(objs, 'ConfigMap'))
      for (const [k, v] of Object.entries(c.data ?? {}))
        expect([c.metadata.name, k, /fake-(prom|am)-|team-a/.test(String(v))]).toEqual([c.metadata.name, k, false]);
  });

  test('read from the files as the worker reads them: Prometheus gets the token in use and the tenant, Alertmanager basic auth', async () => {
    const root = join(dir, 'worker');
    kubeletFiles(objs, 'opsgate-worker', root, { 'prom-client': promTls });
    const env = movedEnv(objs, 'opsgate-worker', root);
    const config = loadWorkerConfig(env);
    expect(config.PROMETHEUS_EXTERNAL_LABELS).toEqual({ cluster: 'eu-2', replica: 'a' });
    const prom = await headersSent(env, 'PROMETHEUS');
    expect(prom.authorization).toBe('Bearer fake-prom-token-0013-new');
    expect(prom['x-tenant']).toBe('team-a');
    const am = await headersSent(env, 'ALERTMANAGER');
    expect(am.authorization).toBe(`Basic ${Buffer.from('opsgate:fake-am-password-0013').toString('base64')}`);
    const tls = loadOutboundAuth(env, 'PROMETHEUS', { tenant: true }).tls!;
    expect([tls.cert!.bytes().toString(), tls.key!.bytes().toString(), tls.ca!.bytes().toString()]).toEqual([
      promTls['tls.crt'],
      promTls['tls.key'],
      promTls['ca.crt'],
    ]);
  });

  test('a rotated credential is a changed file: with secrets.asFiles it rolls no pod', async () => {
    const set = {
      ...base,
      'redis.auth.password': 'fake-redis-password-0014',
      'config.prometheusUrl': 'http://prometheus:9090',
      'secrets.asFiles': 'true',
    };
    const [before, after] = await Promise.all([
      render({ set: { ...set, 'secrets.prometheusBearerToken': 'fake-prom-token-0014' } }),
      render({ set: { ...set, 'secrets.prometheusBearerToken': 'fake-prom-token-0015' } }),
    ]);
    expect(secretData(after).PROMETHEUS_BEARER_TOKEN).toBe('fake-prom-token-0015');
    for (const name of ['opsgate-api', 'opsgate-worker'])
      expect(one(after, 'Deployment', name).spec.template).toEqual(one(before, 'Deployment', name).spec.template);
  });
});

describe('credentials of an existingSecret', () => {
  test('the keys listed in secrets.existingSecretOutboundKeys are required items of that Secret; a CA alone from its own Secret', async () => {
    const objs = await render({
      set: {
        'secrets.existingSecret': 'mine',
        'secrets.existingSecretOutboundKeys': '{PROMETHEUS_BASIC_AUTH_PASSWORD,ALERTMANAGER_BEARER_TOKEN}',
        'config.prometheusUrl': 'http://prometheus:9090',
        'config.prometheusBasicAuthUser': 'opsgate',
        'config.alertmanagerUrl': 'https://alertmanager:9093',
        'config.alertmanagerTls.secret': 'am-ca',
        'config.alertmanagerTls.certKey': '',
        'config.alertmanagerTls.keyKey': '',
      },
    });
    expect(find(objs, 'Secret')).toHaveLength(0);
    const vol = pod(objs, 'opsgate-worker').volumes.find((v: { name: string }) => v.name === 'outbound');
    expect(vol.projected.sources).toEqual([
      {
        secret: {
          name: 'mine',
          items: ['PROMETHEUS_BASIC_AUTH_PASSWORD', 'ALERTMANAGER_BEARER_TOKEN'].map((k) => ({ key: k, path: k })),
        },
      },
      { secret: { name: 'am-ca', items: [{ key: 'ca.crt', path: 'alertmanager-ca.crt' }] } },
    ]);
    // The pod's own variables and the ConfigMap's (the rest come from a Secret this render does not hold).
    const env: Record<string, string> = { ...one(objs, 'ConfigMap', 'opsgate-config').data };
    for (const e of pod(objs, 'opsgate-api').containers[0].env) if (typeof e.value === 'string') env[e.name] = e.value;
    expect(env.PROMETHEUS_BASIC_AUTH_USER).toBe('opsgate');
    expect(env.PROMETHEUS_BASIC_AUTH_PASSWORD_FILE).toBe(`${OUTBOUND}/PROMETHEUS_BASIC_AUTH_PASSWORD`);
    expect(env.ALERTMANAGER_BEARER_TOKEN_FILE).toBe(`${OUTBOUND}/ALERTMANAGER_BEARER_TOKEN`);
    expect(env.ALERTMANAGER_TLS_CA_FILE).toBe(`${OUTBOUND}/alertmanager-ca.crt`);
    expect(env.ALERTMANAGER_TLS_CERT_FILE).toBeUndefined();
    expect(env.PROMETHEUS_BEARER_TOKEN_FILE).toBeUndefined();
  });

  test('none given, none asked: no outbound volume and no credential variable', async () => {
    const objs = await render({ set: { ...base, 'config.prometheusUrl': 'http://prometheus:9090' } });
    for (const name of ['opsgate-api', 'opsgate-worker']) {
      expect(pod(objs, name).volumes.some((v: { name: string }) => v.name === 'outbound')).toBe(false);
      const env = containerEnv(objs, name);
      expect(Object.keys(env).filter((k) => /^(PROMETHEUS|ALERTMANAGER)_/.test(k))).toEqual(['PROMETHEUS_URL']);
    }
  });
});

describe('values that cannot work fail the render, naming them', () => {
  const cases: [string, Record<string, string>, RegExp][] = [
    [
      'a credential without its server',
      { 'secrets.prometheusBearerToken': 'fake-0013' },
      /secrets\.prometheusBearerToken set for config\.prometheusUrl, which is empty/,
    ],
    [
      'external labels without Prometheus',
      { 'config.prometheusExternalLabels.cluster': 'eu-2' },
      /config\.prometheusExternalLabels set for config\.prometheusUrl, which is empty/,
    ],
    [
      'a basic auth user without its password',
      { 'config.alertmanagerUrl': 'http://am:9093', 'config.alertmanagerBasicAuthUser': 'opsgate' },
      /config\.alertmanagerBasicAuthUser needs its password: secrets\.alertmanagerBasicAuthPassword/,
    ],
    [
      'a basic auth password without its user',
      { 'config.prometheusUrl': 'http://p:9090', 'secrets.prometheusBasicAuthPassword': 'fake-0013' },
      /needs config\.prometheusBasicAuthUser/,
    ],
    [
      'a bearer token and basic auth (one Authorization header)',
      {
        'config.prometheusUrl': 'http://p:9090',
        'secrets.prometheusBearerToken': 'fake-0013',
        'config.prometheusBasicAuthUser': 'opsgate',
        'secrets.prometheusBasicAuthPassword': 'fake-0014',
      },
      /has a bearer token and basic auth .*set one of them/,
    ],
    [
      'a client certificate without its key',
      { 'config.prometheusUrl': 'https://p:9090', 'config.prometheusTls.secret': 'prom-client', 'config.prometheusTls.keyKey': '' },
      /config\.prometheusTls\.certKey and config\.prometheusTls\.keyKey go together/,
    ],
    [
      'keys of an existingSecret that is not set',
      { 'config.prometheusUrl': 'http://p:9090', 'secrets.existingSecretOutboundKeys': '{PROMETHEUS_TENANT}' },
      /secrets\.existingSecretOutboundKeys names keys of secrets\.existingSecret, which is not set/,
    ],
    [
      'a key the chart does not know',
      { 'secrets.existingSecret': 'mine', 'secrets.existingSecretOutboundKeys': '{OPS_BEARER_TOKEN}' },
      /existingSecretOutboundKeys/,
    ],
    [
      'external labels with a comma',
      { 'config.prometheusUrl': 'http://p:9090', 'config.prometheusExternalLabels.a': 'b\\,c' },
      /prometheusExternalLabels/,
    ],
    ['a tenant header that is no header name', { 'config.prometheusTenantHeader': 'X Tenant' }, /prometheusTenantHeader/],
  ];
  test.each(cases)('%s', async (_name, set, message) => {
    expect(await renderError({ set: { ...base, ...set } })).toMatch(message);
  });
});

describe('an act rule needs a way to confirm its alerts, as the api and worker do at start', () => {
  const rule = {
    ...base,
    'secrets.alertsWebhookToken': 'fake-alerts-token-0013',
    'inventory.hosts.shop-01.namespace': 'shop',
    'inventory.hosts.shop-01.deployments[0]': 'storefront',
    'inventory.remediations[0].name': 'storefront-down',
    'inventory.remediations[0].match.alertname': 'StorefrontDown',
    'inventory.remediations[0].targets[0]': 'shop-01',
  };
  test('confirm: prometheus (the default) without config.prometheusUrl fails, naming both ways; with it, or as a dry run, it renders', async () => {
    expect(await renderError({ set: rule })).toMatch(
      /rule "storefront-down" acts on alerts confirmed by Prometheus, but config\.prometheusUrl is empty: .*confirm: alertmanager .*mode: dry-run/,
    );
    const inventory = async (set: Record<string, string>) =>
      String(one(await render({ set: { ...rule, ...set } }), 'ConfigMap', 'opsgate-inventory').data['inventory.yaml']);
    expect(await inventory({ 'config.prometheusUrl': 'http://prometheus:9090' })).toMatch(/targets:\n\s+- shop-01/);
    expect(await inventory({ 'inventory.remediations[0].mode': 'dry-run' })).toContain('mode: dry-run');
  });

  test('confirm: alertmanager needs credentials of its API, not the URL alone', async () => {
    const am = { ...rule, 'inventory.remediations[0].confirm': 'alertmanager', 'config.alertmanagerUrl': 'http://alertmanager:9093' };
    expect(await renderError({ set: am })).toMatch(
      /rule "storefront-down" confirms its alerts with Alertmanager, but config\.alertmanagerUrl has no credentials/,
    );
    // A CA alone verifies Alertmanager but tells it nothing of opsgate.
    expect(
      await renderError({
        set: { ...am, 'config.alertmanagerTls.secret': 'am-ca', 'config.alertmanagerTls.certKey': '', 'config.alertmanagerTls.keyKey': '' },
      }),
    ).toMatch(/has no credentials of its API/);
    const credentials: Record<string, string>[] = [
      { 'secrets.alertmanagerBearerToken': 'fake-am-token-0013' },
      { 'config.alertmanagerBasicAuthUser': 'opsgate', 'secrets.alertmanagerBasicAuthPassword': 'fake-am-password-0013' },
      { 'config.alertmanagerTls.secret': 'am-client' },
    ];
    for (const creds of credentials) {
      const objs = await render({ set: { ...am, ...creds } });
      expect(String(one(objs, 'ConfigMap', 'opsgate-inventory').data['inventory.yaml'])).toContain('confirm: alertmanager');
    }
  });
});
