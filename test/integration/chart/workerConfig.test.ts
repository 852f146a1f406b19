import { describe, expect, jest, test } from '@jest/globals';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { WORKER_VARIABLES, loadWorkerConfig, type WorkerConfig } from '../../../src/shared/config.js';
import { CHART, containerEnv, render, renderError } from '../../helpers/helm.js';

/**
 * Every variable the worker reads (src/shared/config.ts: its schema's keys) can be set through the
 * chart and reaches the worker container: the test renders with real helm, builds the container's
 * environment as the kubelet would (ConfigMap, env values, Secret keys) and parses it with the
 * worker's own loadWorkerConfig. A variable added to the worker without its chart value fails here.
 */
jest.setTimeout(120_000);

const schema = JSON.parse(readFileSync(join(CHART, 'values.schema.json'), 'utf8'));
const REDIS_URL = 'redis://:fake-external-redis-password-0012@redis.example.internal:6379/3';
const codeDefaults = loadWorkerConfig({ REDIS_URL }) as Record<string, unknown>;
const OUTBOUND = '/etc/opsgate-outbound';

/** A worker variable's chart value: config.<camelCase of the variable>, unless listed in SPECIAL. */
const camel = (v: string) => v.toLowerCase().replace(/_([a-z])/g, (_m, c: string) => c.toUpperCase());

/** Variables set through other values than config.*: the values that set them, and what the worker gets. */
const SPECIAL: Record<string, { set: Record<string, string>; expected: unknown }> = {
  REDIS_URL: { set: { 'redis.enabled': 'false', 'secrets.redisUrl': REDIS_URL }, expected: REDIS_URL },
  NOTIFY_WEBHOOK_URLS: {
    set: { 'secrets.notifyWebhookUrls': '{https://chat.example.com/hooks/fake-0012,https://pager.example.com/fake-0012}' },
    expected: ['https://chat.example.com/hooks/fake-0012', 'https://pager.example.com/fake-0012'],
  },
  OPS_INVENTORY_FILE: { set: {}, expected: '/etc/opsgate/inventory.yaml' },
  OPSGATE_VERSION: { set: { 'image.tag': '9.8.7' }, expected: '9.8.7' },
  METRICS_TLS_CERT_FILE: {
    set: { 'tls.enabled': 'true', 'tls.existingSecret': 'opsgate-tls', 'tls.metrics': 'true' },
    expected: '/etc/opsgate-tls/tls.crt',
  },
  METRICS_TLS_KEY_FILE: { set: {}, expected: '/etc/opsgate-tls/tls.key' },
  TLS_RELOAD_INTERVAL_MS: { set: { 'tls.reloadIntervalMs': '2500' }, expected: 2500 },
  OPSGATE_PUBLIC_URL: { set: { 'config.publicUrl': 'https://opsgate.example.com/' }, expected: 'https://opsgate.example.com' },
  ALERTMANAGER_URL: {
    set: { 'config.alertmanagerUrl': 'http://alertmanager.monitoring:9093/' },
    expected: 'http://alertmanager.monitoring:9093',
  },
  ALERTMANAGER_BASIC_AUTH_USER: { set: { 'config.alertmanagerBasicAuthUser': 'opsgate' }, expected: 'opsgate' },
  ALERTMANAGER_BASIC_AUTH_PASSWORD_FILE: {
    set: { 'secrets.alertmanagerBasicAuthPassword': 'fake-am-password-0012' },
    expected: `${OUTBOUND}/ALERTMANAGER_BASIC_AUTH_PASSWORD`,
  },
  ALERTMANAGER_TLS_CERT_FILE: { set: { 'config.alertmanagerTls.secret': 'am-client' }, expected: `${OUTBOUND}/alertmanager-client.crt` },
  ALERTMANAGER_TLS_KEY_FILE: { set: {}, expected: `${OUTBOUND}/alertmanager-client.key` },
  ALERTMANAGER_TLS_CA_FILE: { set: {}, expected: `${OUTBOUND}/alertmanager-ca.crt` },
  PROMETHEUS_URL: {
    set: { 'config.prometheusUrl': 'https://thanos-query.monitoring:9091/' },
    expected: 'https://thanos-query.monitoring:9091',
  },
  PROMETHEUS_EXTERNAL_LABELS: {
    set: { 'config.prometheusExternalLabels.cluster': 'eu-2', 'config.prometheusExternalLabels.replica': 'a' },
    expected: { cluster: 'eu-2', replica: 'a' },
  },
  PROMETHEUS_BEARER_TOKEN_FILE: {
    set: { 'secrets.prometheusBearerToken': 'fake-prom-token-0012' },
    expected: `${OUTBOUND}/PROMETHEUS_BEARER_TOKEN`,
  },
  PROMETHEUS_TENANT_FILE: { set: { 'secrets.prometheusTenant': 'team-a' }, expected: `${OUTBOUND}/PROMETHEUS_TENANT` },
  PROMETHEUS_TENANT_HEADER: { set: { 'config.prometheusTenantHeader': 'X-Tenant' }, expected: 'X-Tenant' },
  PROMETHEUS_TLS_CERT_FILE: { set: { 'config.prometheusTls.secret': 'prom-client' }, expected: `${OUTBOUND}/prometheus-client.crt` },
  PROMETHEUS_TLS_KEY_FILE: { set: {}, expected: `${OUTBOUND}/prometheus-client.key` },
  PROMETHEUS_TLS_CA_FILE: { set: {}, expected: `${OUTBOUND}/prometheus-ca.crt` },
  ...Object.fromEntries(
    (['github', 'gitlab', 'gitea', 'bitbucket'] as const).flatMap((host) => {
      const v = `${host.toUpperCase()}_STATUS`;
      return [
        [
          `${v}_API_URL`,
          { set: { [`statusReports.${host}.apiUrl`]: `https://${host}.example.com/api/` }, expected: `https://${host}.example.com/api` },
        ],
        [
          `${v}_BEARER_TOKEN_FILE`,
          {
            set: { [`statusReports.${host}.existingSecret`]: `${host}-status`, [`statusReports.${host}.tokenKey`]: 'pat' },
            expected: `/etc/opsgate-status/${host}/pat`,
          },
        ],
        [`${v}_TLS_CA_FILE`, { set: { [`statusReports.${host}.caKey`]: 'ca.crt' }, expected: `/etc/opsgate-status/${host}/ca.crt` }],
      ];
    }),
  ),
};

/**
 * Variables of the other Authorization header: a server takes a bearer token or basic auth, never
 * both (the render fails), so these are set in a second render, Prometheus with basic auth and
 * Alertmanager with a bearer token.
 */
const SECOND: Record<string, { set: Record<string, string>; expected: unknown }> = {
  PROMETHEUS_BASIC_AUTH_USER: { set: { 'config.prometheusBasicAuthUser': 'opsgate' }, expected: 'opsgate' },
  PROMETHEUS_BASIC_AUTH_PASSWORD_FILE: {
    set: { 'secrets.prometheusBasicAuthPassword': 'fake-prom-password-0012' },
    expected: `${OUTBOUND}/PROMETHEUS_BASIC_AUTH_PASSWORD`,
  },
  ALERTMANAGER_BEARER_TOKEN_FILE: {
    set: { 'secrets.alertmanagerBearerToken': 'fake-am-token-0012' },
    expected: `${OUTBOUND}/ALERTMANAGER_BEARER_TOKEN`,
  },
};

/**
 * The inline forms of the credentials: the chart never puts a secret in an environment value; it
 * sets their <VARIABLE>_FILE, a file of the Secret the processes read again when it changes.
 */
const FILE_ONLY = [
  'PROMETHEUS_BEARER_TOKEN',
  'PROMETHEUS_BASIC_AUTH_PASSWORD',
  'PROMETHEUS_TENANT',
  'ALERTMANAGER_BEARER_TOKEN',
  'ALERTMANAGER_BASIC_AUTH_PASSWORD',
  'GITHUB_STATUS_BEARER_TOKEN',
  'GITLAB_STATUS_BEARER_TOKEN',
  'GITEA_STATUS_BEARER_TOKEN',
  'BITBUCKET_STATUS_BEARER_TOKEN',
];

/** A valid value other than the code's default, for a variable set through config.*. */
function otherValue(variable: string): string | number {
  const d = codeDefaults[variable];
  if (variable === 'LOG_LEVEL') return 'warn';
  if (variable === 'REPORT_OUTCOMES') return 'failures';
  if (typeof d === 'number') return d + 1;
  throw new Error(`${variable}: no test value for a default of ${JSON.stringify(d)}; add one here`);
}

const configVars = WORKER_VARIABLES.filter((v) => !(v in SPECIAL) && !(v in SECOND) && !FILE_ONLY.includes(v));

describe('every worker variable is settable through the chart', () => {
  test('the worker schema is the one this test knows (names it reads from src/shared/config.ts)', () => {
    expect(WORKER_VARIABLES).toEqual(expect.arrayContaining(['REDIS_URL', 'WORKER_CONCURRENCY', 'WORKER_LOCK_DURATION_MS']));
    expect([...Object.keys(SPECIAL), ...Object.keys(SECOND), ...FILE_ONLY].filter((v) => !WORKER_VARIABLES.includes(v))).toEqual([]);
    // Each inline credential has its file form, which the chart sets.
    expect(FILE_ONLY.filter((v) => !(`${v}_FILE` in SPECIAL) && !(`${v}_FILE` in SECOND))).toEqual([]);
  });

  test('each variable without a special route has its value config.<camelCase> in values.schema.json', () => {
    const props = schema.properties.config.properties as Record<string, unknown>;
    expect(configVars.filter((v) => !(camel(v) in props)).map((v) => `${v}: config.${camel(v)}`)).toEqual([]);
  });

  test('set to values other than the defaults, each reaches the worker and parses to that value', async () => {
    const set: Record<string, string> = { 'secrets.apiKeyRoles': 'fake-operator-key-0012:operator' };
    for (const s of Object.values(SPECIAL)) Object.assign(set, s.set);
    for (const v of configVars) set[`config.${camel(v)}`] = String(otherValue(v));
    const objs = await render({ set });
    const env = containerEnv(objs, 'opsgate-worker');
    const parsed = loadWorkerConfig(env) as Record<string, unknown>;
    const first = WORKER_VARIABLES.filter((v) => !(v in SECOND) && !FILE_ONLY.includes(v));
    const got = Object.fromEntries(first.map((v) => [v, parsed[v]]));
    const want = Object.fromEntries(first.map((v) => [v, v in SPECIAL ? SPECIAL[v]!.expected : otherValue(v)]));
    expect(got).toEqual(want);
    for (const v of first) expect([v, v in env]).toEqual([v, true]);
    for (const v of FILE_ONLY) expect([v, v in env]).toEqual([v, false]);
  });

  test('the other Authorization header of each server (Prometheus basic auth, an Alertmanager bearer token) reaches the worker too', async () => {
    const set: Record<string, string> = {
      'secrets.apiKeyRoles': 'fake-operator-key-0012:operator',
      'config.prometheusUrl': 'http://prometheus.monitoring:9090',
      'config.alertmanagerUrl': 'http://alertmanager.monitoring:9093',
    };
    for (const s of Object.values(SECOND)) Object.assign(set, s.set);
    const env = containerEnv(await render({ set }), 'opsgate-worker');
    const parsed = loadWorkerConfig(env) as Record<string, unknown>;
    const vars = Object.keys(SECOND);
    expect(Object.fromEntries(vars.map((v) => [v, parsed[v]]))).toEqual(Object.fromEntries(vars.map((v) => [v, SECOND[v]!.expected])));
    for (const v of FILE_ONLY) expect([v, v in env]).toEqual([v, false]);
  });

  test("the chart's defaults are the code's, except where the chart says why not", async () => {
    const objs = await render({ files: ['defaults-values.yaml'] });
    const parsed = loadWorkerConfig(containerEnv(objs, 'opsgate-worker')) as Partial<WorkerConfig> & Record<string, unknown>;
    // WORKER_SHUTDOWN_GRACE_SECONDS: the chart drains for 60 s inside its 90 s grace period (values.yaml);
    // the rest are the release's own: its Redis, its mounted inventory, its image tag.
    const differs = ['WORKER_SHUTDOWN_GRACE_SECONDS', 'REDIS_URL', 'OPS_INVENTORY_FILE', 'OPSGATE_VERSION'];
    const same = WORKER_VARIABLES.filter((v) => !differs.includes(v));
    expect(Object.fromEntries(same.map((v) => [v, parsed[v]]))).toEqual(Object.fromEntries(same.map((v) => [v, codeDefaults[v]])));
    expect(parsed.WORKER_SHUTDOWN_GRACE_SECONDS).toBe(60);
  });
});

describe('config.shutdownTimeoutSeconds fits the grace periods', () => {
  test('the worker drains and closes, the api sleeps and closes, before Kubernetes kills them; otherwise the render fails', async () => {
    const base = { files: ['defaults-values.yaml'] };
    expect(await renderError({ ...base, set: { 'config.shutdownTimeoutSeconds': '30' } })).toMatch(
      /worker\.terminationGracePeriodSeconds \(90\) must be greater than config\.workerShutdownGraceSeconds \(60\) \+ config\.shutdownTimeoutSeconds \(30\)/,
    );
    expect(
      await renderError({ ...base, set: { 'config.shutdownTimeoutSeconds': '25', 'config.workerShutdownGraceSeconds': '10' } }),
    ).toMatch(
      /api\.terminationGracePeriodSeconds \(30\) must be greater than api\.preStopSleepSeconds \(5\) \+ config\.shutdownTimeoutSeconds \(25\)/,
    );
    const objs = await render({ ...base, set: { 'config.shutdownTimeoutSeconds': '24', 'config.workerShutdownGraceSeconds': '10' } });
    expect(containerEnv(objs, 'opsgate-api').SHUTDOWN_TIMEOUT_SECONDS).toBe('24');
  });
});
