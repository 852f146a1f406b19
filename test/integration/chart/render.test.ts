import { beforeAll, describe, expect, jest, test } from '@jest/globals';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse as parseYaml, stringify as stringifyYaml } from 'yaml';
import { API_VARIABLES } from '../../../src/api/config.js';
import { WORKER_VARIABLES } from '../../../src/shared/config.js';
import { parseInventory } from '../../../src/shared/inventory.js';
import { SOURCES } from '../../../src/sources/index.js';
import { buildDeployJob } from '../../../worker/jobs/deploy.js';
import {
  ROOT,
  NAMESPACE,
  SECRET_VARS,
  VALUES_DIR,
  find,
  one,
  parseManifests,
  podSpecs,
  render,
  renderError,
  renderNotes,
  type K8sObject,
} from '../../helpers/helm.js';

/**
 * `helm template` of charts/opsgate over every values file in charts/opsgate/ci, with assertions
 * on the rendered objects (parsed with the yaml package): secrets only through secretKeyRef,
 * hardened pods, RBAC limited to exactly the inventory, Ingress paths, toggles, checksums.
 */
// helm renders take a second or two each; other agents share the machine.
jest.setTimeout(120_000);

const valueFiles = readdirSync(VALUES_DIR)
  .filter((f) => f.endsWith('.yaml'))
  .sort();
const chartDefaults = parseYaml(readFileSync(join(ROOT, 'charts/opsgate/values.yaml'), 'utf8'));

type Values = Record<string, any>;

function deepMerge(a: any, b: any): any {
  if (b === undefined) return a;
  if (a && b && typeof a === 'object' && typeof b === 'object' && !Array.isArray(a) && !Array.isArray(b)) {
    const out: any = { ...a };
    for (const [k, v] of Object.entries(b)) out[k] = deepMerge(a[k], v);
    return out;
  }
  return b;
}

function valuesOf(file: string): Values {
  return deepMerge(chartDefaults, parseYaml(readFileSync(join(VALUES_DIR, file), 'utf8')) ?? {});
}

/**
 * The secret of each enabled webhook sender a values file gives, by its variable (the registry's
 * name); a secret in rotation (a list, secrets.asFiles) is its lines.
 */
function senderSecrets(v: Values): Record<string, string> {
  const compat: Record<string, string> = {
    scm: v.secrets.scmWebhookSecret,
    github: v.secrets.githubWebhookSecret,
    gitlab: v.secrets.gitlabWebhookSecret,
    alerts: v.secrets.alertsWebhookToken,
  };
  const out: Record<string, string> = {};
  for (const s of SOURCES) {
    const given = v.secrets.webhookSecrets?.[s.name];
    const value = (Array.isArray(given) ? given.join('\n') : given) || compat[s.name];
    if (v.webhooks.senders[s.name]?.enabled && value) out[s.secret.env] = value;
  }
  return out;
}

/** The values give a keys file (secrets.apiKeys entries with an id, or existingSecretApiKeysFile): OPS_API_KEY_ROLES may then be absent. */
const hasKeysFile = (v: Values): boolean =>
  Boolean(v.secrets.existingSecretApiKeysFile) || (v.secrets.apiKeys ?? []).some((k: any) => k.id || k.sha256 || k.expires);

/** The variables of the enabled webhook senders of a values file. */
const senderVars = (v: Values) => SOURCES.filter((s) => v.webhooks.senders[s.name]?.enabled).map((s) => s.secret.env);

/** Every secret string a values file holds (and the API keys inside OPS_API_KEY_ROLES). */
function secretStrings(v: Values): string[] {
  const s = v.secrets;
  const out = [
    s.bearerToken,
    s.scmWebhookSecret,
    s.githubWebhookSecret,
    s.gitlabWebhookSecret,
    s.alertsWebhookToken,
    ...Object.values<string | string[]>(s.webhookSecrets ?? {}).flat(),
    s.notifyWebhookUrls,
    s.redisUrl,
    v.redis.auth.password,
    s.apiKeyRoles,
    s.prometheusBearerToken,
    s.prometheusBasicAuthPassword,
    s.prometheusTenant,
    s.alertmanagerBearerToken,
    s.alertmanagerBasicAuthPassword,
  ];
  for (const item of String(s.apiKeyRoles ?? '').split(',')) out.push(item.slice(0, item.lastIndexOf(':')));
  for (const url of String(s.notifyWebhookUrls ?? '').split(',')) out.push(url);
  const m = /:\/\/[^:@/]*:([^@]+)@/.exec(String(s.redisUrl ?? ''));
  if (m) out.push(m[1]);
  return out.filter((x): x is string => typeof x === 'string' && x.trim().length >= 4);
}

const fullname = 'opsgate';
const rendered = new Map<string, K8sObject[]>();

beforeAll(async () => {
  await Promise.all(valueFiles.map(async (f) => rendered.set(f, await render({ files: [f] }))));
}, 180_000);

test('there are several values files, including the ones the chart must support', () => {
  expect(valueFiles).toEqual(
    expect.arrayContaining([
      'defaults-values.yaml',
      'existing-secret-values.yaml',
      'all-integrations-values.yaml',
      'in-chart-redis-values.yaml',
      'external-redis-values.yaml',
    ]),
  );
});

describe.each(valueFiles)('%s', (file) => {
  const objs = () => rendered.get(file)!;
  const values = () => valuesOf(file);

  test('every object is labelled and namespaced', () => {
    for (const o of objs()) {
      const l = o.metadata.labels ?? {};
      expect([o.kind, o.metadata.name, l['app.kubernetes.io/name']]).toEqual([o.kind, o.metadata.name, 'opsgate']);
      expect(l['app.kubernetes.io/instance']).toBe('opsgate');
      expect(l['app.kubernetes.io/managed-by']).toBe('Helm');
      expect(l['helm.sh/chart']).toMatch(/^opsgate-\d+\.\d+\.\d+/);
      expect(o.metadata.namespace).toBeTruthy();
      if (['Deployment', 'StatefulSet', 'Service', 'ServiceAccount', 'Role', 'RoleBinding', 'Pod'].includes(o.kind)) {
        expect(['api', 'worker', 'redis', 'test']).toContain(l['app.kubernetes.io/component']);
      }
    }
  });

  test('secret variables reach containers only through secretKeyRef; no secret value in any ConfigMap or env value', () => {
    const secrets = secretStrings(values());
    expect(secrets.length > 0).toBe(!values().secrets.existingSecret); // otherwise this test would check nothing
    const secretName = values().secrets.existingSecret || fullname;
    for (const { owner, spec } of podSpecs(objs())) {
      for (const c of [...(spec.containers ?? []), ...(spec.initContainers ?? [])]) {
        for (const ef of c.envFrom ?? []) expect([owner, Object.keys(ef)]).toEqual([owner, ['configMapRef']]);
        for (const e of c.env ?? []) {
          if (typeof e.value === 'string')
            for (const s of secrets) expect([owner, e.name, e.value.includes(s)]).toEqual([owner, e.name, false]);
          if (!SECRET_VARS.includes(e.name) && e.name !== 'REDISCLI_AUTH') continue;
          if (e.name === 'REDIS_URL' && values().redis.enabled) {
            // In-chart Redis: the URL is composed by the kubelet from REDIS_PASSWORD (a secretKeyRef).
            if (values().redis.architecture === 'replication') {
              // Sentinel form: the three sentinels of the release, the same password for them.
              expect(e.value).toMatch(
                /^redis\+sentinel:\/\/:\$\(REDIS_PASSWORD\)@opsgate-redis-0\.opsgate-redis-headless\.opsgate\.svc:26379,opsgate-redis-1\.opsgate-redis-headless\.opsgate\.svc:26379,opsgate-redis-2\.opsgate-redis-headless\.opsgate\.svc:26379\/opsgate\/0\?sentinelPassword=\$\(REDIS_PASSWORD\)$/,
              );
            } else expect(e.value).toMatch(/^redis:\/\/:\$\(REDIS_PASSWORD\)@opsgate-redis\.opsgate\.svc:6379\/0$/);
            const names = c.env.map((x: any) => x.name);
            expect(names.indexOf('REDIS_PASSWORD')).toBeGreaterThanOrEqual(0);
            expect(names.indexOf('REDIS_PASSWORD')).toBeLessThan(names.indexOf('REDIS_URL'));
            continue;
          }
          expect([owner, e.name, e.value]).toEqual([owner, e.name, undefined]);
          const ref = e.valueFrom?.secretKeyRef;
          expect([owner, e.name, ref?.name]).toEqual([owner, e.name, secretName]);
          const key = e.name === 'REDISCLI_AUTH' ? 'REDIS_PASSWORD' : e.name;
          expect(ref.key).toBe(key);
          const required = ['REDIS_URL', 'REDIS_PASSWORD'].includes(key) || (key === 'OPS_API_KEY_ROLES' && !hasKeysFile(values()));
          expect([e.name, ref.optional === true]).toEqual([e.name, !required]);
        }
      }
    }
    for (const cm of find(objs(), 'ConfigMap')) {
      for (const [k, v] of Object.entries(cm.data ?? {})) {
        expect(SECRET_VARS).not.toContain(k);
        for (const s of secrets) expect([cm.metadata.name, k, String(v).includes(s)]).toEqual([cm.metadata.name, k, false]);
      }
    }
  });

  test('api and worker get exactly the secret variables they use', () => {
    const envNames = (kind: string, name: string) => one(objs(), kind, name).spec.template.spec.containers[0].env.map((e: any) => e.name);
    const redisVars = values().redis.enabled ? ['REDIS_PASSWORD', 'REDIS_URL'] : ['REDIS_URL'];
    expect(
      envNames('Deployment', 'opsgate-api')
        .filter((n: string) => SECRET_VARS.includes(n))
        .sort(),
    ).toEqual(
      // In file mode the senders' secrets are files (<VARIABLE>_FILE, test/integration/chart/secretFiles.test.ts).
      ['OPS_API_KEY_ROLES', 'OPS_BEARER_TOKEN', ...(values().secrets.asFiles ? [] : senderVars(values())), ...redisVars].sort(),
    );
    expect(
      envNames('Deployment', 'opsgate-worker')
        .filter((n: string) => SECRET_VARS.includes(n))
        .sort(),
    ).toEqual(['NOTIFY_WEBHOOK_URLS', ...redisVars].sort());
  });

  test('the Secret is chart-made from values, or absent with existingSecret', () => {
    const v = values();
    const secrets = find(objs(), 'Secret');
    if (v.secrets.existingSecret) {
      expect(secrets).toHaveLength(0);
      return;
    }
    expect(secrets).toHaveLength(1);
    const data = Object.fromEntries(
      Object.entries(secrets[0]!.data as Record<string, string>).map(([k, b]) => [k, Buffer.from(b, 'base64').toString()]),
    );
    expect(data.OPS_API_KEY_ROLES).toBe(v.secrets.apiKeyRoles);
    const optional: Record<string, string> = {
      OPS_BEARER_TOKEN: v.secrets.bearerToken,
      NOTIFY_WEBHOOK_URLS: v.secrets.notifyWebhookUrls,
    };
    for (const [k, val] of Object.entries(optional)) expect([k, data[k]]).toEqual([k, val === '' ? undefined : val]);
    const senders = senderSecrets(v);
    for (const s of SOURCES) expect([s.secret.env, data[s.secret.env]]).toEqual([s.secret.env, senders[s.secret.env]]);
    if (v.redis.enabled) {
      expect(data.REDIS_URL).toBeUndefined();
      if (v.redis.auth.password) expect(data.REDIS_PASSWORD).toBe(v.redis.auth.password);
      else expect(data.REDIS_PASSWORD).toMatch(/^[A-Za-z0-9]{32}$/);
    } else {
      expect(data.REDIS_URL).toBe(v.secrets.redisUrl);
      expect(data.REDIS_PASSWORD).toBeUndefined();
    }
    for (const k of Object.keys(data)) expect([...SECRET_VARS, ...(hasKeysFile(v) ? ['api-keys.yaml'] : [])]).toContain(k);
  });

  test('pods are hardened: non-root, seccomp RuntimeDefault, read-only root with a /tmp emptyDir, no privilege escalation, ALL capabilities dropped', () => {
    const specs = podSpecs(objs());
    expect(specs.length).toBeGreaterThanOrEqual(3);
    for (const { owner, spec } of specs) {
      expect([owner, spec.securityContext?.runAsNonRoot]).toEqual([owner, true]);
      expect([owner, spec.securityContext?.seccompProfile?.type]).toEqual([owner, 'RuntimeDefault']);
      expect([owner, spec.securityContext?.runAsUser > 0]).toEqual([owner, true]);
      const tmpVolumes = new Set((spec.volumes ?? []).filter((v: any) => v.emptyDir).map((v: any) => v.name));
      for (const c of spec.containers) {
        const sc = c.securityContext ?? {};
        expect([owner, c.name, sc.allowPrivilegeEscalation, sc.readOnlyRootFilesystem, sc.runAsNonRoot]).toEqual([
          owner,
          c.name,
          false,
          true,
          true,
        ]);
        expect(sc.capabilities?.drop).toContain('ALL');
        expect(sc.capabilities?.add ?? []).toEqual([]);
        expect(sc.privileged ?? false).toBe(false);
        const tmp = (c.volumeMounts ?? []).find((m: any) => m.mountPath === '/tmp');
        expect([owner, c.name, tmp && tmpVolumes.has(tmp.name)]).toEqual([owner, c.name, true]);
        expect([owner, c.name, c.resources?.limits?.memory]).toEqual([owner, c.name, expect.any(String)]);
      }
      expect([owner, spec.enableServiceLinks]).toEqual([owner, false]);
      expect(spec.hostNetwork ?? false).toBe(false);
      expect(spec.hostPID ?? false).toBe(false);
    }
  });

  test('api Deployment: replicas, probes, resources, spread, config checksums', () => {
    const v = values();
    const d = one(objs(), 'Deployment', 'opsgate-api');
    if (v.autoscaling.enabled) expect(d.spec.replicas).toBeUndefined();
    else expect(d.spec.replicas).toBe(v.api.replicaCount);
    const pod = d.spec.template;
    const c = pod.spec.containers[0];
    expect(c.image).toBe(`${v.image.registry ? v.image.registry + '/' : ''}opsgate-api:${v.image.tag || '0.1.0'}`);
    expect(c.command).toBeUndefined(); // the image's CMD: node dist/src/server.js
    // With TLS the kubelet probes over HTTPS (it does not verify the certificate).
    const scheme = v.tls.enabled ? { scheme: 'HTTPS' } : {};
    expect(c.livenessProbe.httpGet).toEqual({ path: '/health', port: 'http', ...scheme });
    expect(c.readinessProbe.httpGet).toEqual({ path: '/ready', port: 'http', ...scheme });
    expect(c.startupProbe.httpGet).toEqual({ path: '/health', port: 'http', ...scheme });
    expect(c.ports).toEqual([
      { name: 'http', containerPort: v.config.port, protocol: 'TCP' },
      { name: 'metrics', containerPort: v.config.metricsPort, protocol: 'TCP' },
    ]);
    expect(c.resources.requests).toEqual(v.api.resources.requests);
    expect(pod.spec.topologySpreadConstraints.map((t: any) => t.topologyKey)).toEqual([
      'topology.kubernetes.io/zone',
      'kubernetes.io/hostname',
    ]);
    expect(
      pod.spec.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.labelSelector.matchLabels,
    ).toEqual(d.spec.selector.matchLabels);
    expect(pod.metadata.annotations['checksum/config']).toMatch(/^[a-f0-9]{64}$/);
    expect(pod.metadata.annotations['checksum/secret']).toMatch(/^[a-f0-9]{64}$/);
    expect(d.spec.selector.matchLabels).toEqual({
      'app.kubernetes.io/name': 'opsgate',
      'app.kubernetes.io/instance': 'opsgate',
      'app.kubernetes.io/component': 'api',
    });
  });

  test('worker Deployment: grace period outlasts the job drain, token only when the inventory needs it', () => {
    const v = values();
    const d = one(objs(), 'Deployment', 'opsgate-worker');
    const cm = one(objs(), 'ConfigMap', 'opsgate-config');
    const drain = Number(cm.data.WORKER_SHUTDOWN_GRACE_SECONDS);
    expect(drain).toBe(v.config.workerShutdownGraceSeconds);
    expect(d.spec.template.spec.terminationGracePeriodSeconds).toBeGreaterThan(drain);
    expect(d.spec.template.spec.containers[0].image).toMatch(/opsgate-worker:/);
    expect(d.spec.template.spec.containers[0].livenessProbe.httpGet).toEqual({
      path: '/livez',
      port: 'metrics',
      ...(v.tls.enabled && v.tls.metrics ? { scheme: 'HTTPS' } : {}),
    }); // event loop + Redis
    const namespaces = Object.keys(v.inventory.hosts).length + Object.keys(v.inventory.projects).length;
    expect(d.spec.template.spec.automountServiceAccountToken).toBe(namespaces > 0);
    expect(one(objs(), 'Deployment', 'opsgate-api').spec.template.spec.automountServiceAccountToken).toBe(
      Object.keys(v.inventory.hosts).length > 0,
    );
    for (const sa of find(objs(), 'ServiceAccount')) expect(sa.automountServiceAccountToken).toBe(false);
  });

  test('ConfigMaps: non-secret config the app knows, and the inventory it parses', async () => {
    const v = values();
    const cm = one(objs(), 'ConfigMap', 'opsgate-config');
    // Every key is a variable the api's or the worker's configuration schema reads.
    const known = new Set([...API_VARIABLES, ...WORKER_VARIABLES]);
    for (const key of Object.keys(cm.data)) expect([key, known.has(key)]).toEqual([key, true]);
    // Both processes append to the deliveries log, trimmed to the same caps: both read this ConfigMap.
    for (const name of ['opsgate-api', 'opsgate-worker']) {
      const c = one(objs(), 'Deployment', name).spec.template.spec.containers.find((x: any) => x.name === name.replace('opsgate-', ''));
      expect(c.envFrom).toContainEqual({ configMapRef: { name: 'opsgate-config' } });
    }
    expect(WORKER_VARIABLES).toEqual(expect.arrayContaining(['DELIVERIES_KEPT', 'DELIVERIES_UNVERIFIED_KEPT']));
    expect(cm.data.DELIVERIES_KEPT).toBe(String(v.config.deliveriesKept));
    expect(cm.data.OPS_INVENTORY_FILE).toBe('/etc/opsgate/inventory.yaml');
    expect(cm.data.LOG_LEVEL).toBe(v.config.logLevel);
    const inv = one(objs(), 'ConfigMap', 'opsgate-inventory');
    const parsed = parseInventory(inv.data['inventory.yaml']);
    expect(Object.keys(parsed.hosts).sort()).toEqual(Object.keys(v.inventory.hosts).sort());
    expect(Object.keys(parsed.projects).sort()).toEqual(Object.keys(v.inventory.projects).sort());
    for (const [name, h] of Object.entries<any>(v.inventory.hosts)) expect(parsed.hosts[name]).toEqual(h);
    for (const d of find(objs(), 'Deployment')) {
      const spec = d.spec.template.spec;
      const mount = spec.containers[0].volumeMounts.find((m: any) => m.mountPath === '/etc/opsgate');
      expect(mount.readOnly).toBe(true);
      expect(spec.volumes.find((x: any) => x.name === mount.name).configMap.name).toBe('opsgate-inventory');
    }
  });

  test('RBAC: a Role per inventory namespace, worker get/patch on exactly its Deployments, Jobs only where projects deploy, create on events, api get only', () => {
    const v = values();
    const expected = new Map<string, { deployments: Set<string>; jobs: boolean; deleteJobs: boolean }>();
    const entry = (ns: string) => expected.get(ns) ?? expected.set(ns, { deployments: new Set(), jobs: false, deleteJobs: false }).get(ns)!;
    for (const h of Object.values<any>(v.inventory.hosts)) for (const d of h.deployments) entry(h.namespace).deployments.add(d);
    for (const p of Object.values<any>(v.inventory.projects)) {
      entry(p.namespace).jobs = true;
      if (p.cancel_in_progress === true && p.waitForCompletion !== false) entry(p.namespace).deleteJobs = true;
    }

    expect(find(objs(), 'ClusterRole')).toHaveLength(0);
    expect(find(objs(), 'ClusterRoleBinding')).toHaveLength(0);
    const roles = find(objs(), 'Role');
    expect(new Set(roles.map((r) => r.metadata.namespace))).toEqual(new Set(expected.keys()));
    for (const [ns, e] of expected) {
      const worker = roles.find((r) => r.metadata.namespace === ns && r.metadata.name === 'opsgate-worker')!;
      const rules = worker.rules as any[];
      const dep = rules.filter((r) => r.resources.includes('deployments'));
      if (e.deployments.size) {
        expect(dep).toEqual([
          { apiGroups: ['apps'], resources: ['deployments'], resourceNames: [...e.deployments].sort(), verbs: ['get', 'patch'] },
        ]);
      } else expect(dep).toHaveLength(0);
      const jobs = rules.filter((r) => r.resources.includes('jobs'));
      // create, and get to wait for the Job's outcome (delete: cancel_in_progress); no list/watch: never used
      const jobVerbs = e.deleteJobs ? ['create', 'get', 'delete'] : ['create', 'get'];
      expect(jobs).toEqual(e.jobs ? [{ apiGroups: ['batch'], resources: ['jobs'], verbs: jobVerbs }] : []);
      const events = rules.filter((r) => r.resources.includes('events'));
      expect(events).toEqual([{ apiGroups: ['events.k8s.io'], resources: ['events'], verbs: ['create'] }]);
      expect(rules).toHaveLength(dep.length + jobs.length + events.length);
      for (const r of rules) {
        expect(r.resources).not.toContain('secrets');
        expect(r.verbs).not.toContain('*');
        expect(r.resources).not.toContain('*');
      }
      const api = roles.find((r) => r.metadata.namespace === ns && r.metadata.name === 'opsgate-api');
      if (e.deployments.size) {
        expect(api!.rules).toEqual([
          { apiGroups: ['apps'], resources: ['deployments'], resourceNames: [...e.deployments].sort(), verbs: ['get'] },
        ]);
      } else expect(api).toBeUndefined();
    }
    for (const rb of find(objs(), 'RoleBinding')) {
      expect(rb.roleRef).toEqual({ apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: rb.metadata.name });
      const component = rb.metadata.name.endsWith('-api') ? 'api' : 'worker';
      expect(rb.subjects).toEqual([{ kind: 'ServiceAccount', name: `opsgate-${component}`, namespace: NAMESPACE }]);
      expect(roles.some((r) => r.metadata.namespace === rb.metadata.namespace && r.metadata.name === rb.metadata.name)).toBe(true);
    }
    const sa = (name: string) => one(objs(), 'ServiceAccount', name);
    expect(one(objs(), 'Deployment', 'opsgate-api').spec.template.spec.serviceAccountName).toBe(sa('opsgate-api').metadata.name);
    expect(one(objs(), 'Deployment', 'opsgate-worker').spec.template.spec.serviceAccountName).toBe(sa('opsgate-worker').metadata.name);
  });

  test('Services expose http + metrics (api) and metrics (worker)', () => {
    const v = values();
    const api = one(objs(), 'Service', 'opsgate-api');
    expect(api.spec.ports.map((p: any) => [p.name, p.targetPort])).toEqual([
      ['http', 'http'],
      ['metrics', 'metrics'],
    ]);
    expect(api.spec.selector['app.kubernetes.io/component']).toBe('api');
    const worker = one(objs(), 'Service', 'opsgate-worker');
    expect(worker.spec.ports).toEqual([{ name: 'metrics', port: v.config.metricsPort, targetPort: 'metrics', protocol: 'TCP' }]);
    expect(worker.spec.selector['app.kubernetes.io/component']).toBe('worker');
  });

  test('Redis: in-chart StatefulSet with AOF on a PVC, or nothing when external', () => {
    const v = values();
    const sts = find(objs(), 'StatefulSet');
    if (!v.redis.enabled) {
      expect(sts).toHaveLength(0);
      expect(objs().some((o) => o.metadata.name.includes('redis'))).toBe(false);
      return;
    }
    expect(sts).toHaveLength(1);
    const s = sts[0]!;
    const conf = one(objs(), 'ConfigMap', 'opsgate-redis').data['redis.conf'] as string;
    expect(conf).toMatch(/^appendonly yes$/m);
    expect(conf).toMatch(new RegExp(`^appendfsync ${v.redis.appendfsync}$`, 'm'));
    expect(conf).toMatch(/^maxmemory-policy noeviction$/m);
    expect(conf).not.toMatch(/requirepass/);
    const c = s.spec.template.spec.containers[0];
    expect(c.command.join(' ')).not.toMatch(/--requirepass|-a /);
    expect(c.env.map((e: any) => e.name).sort()).toEqual(['REDISCLI_AUTH', 'REDIS_PASSWORD']);
    expect(s.spec.template.spec.automountServiceAccountToken).toBe(false);
    if (v.redis.persistence.enabled) {
      const pvc = s.spec.volumeClaimTemplates[0];
      expect(pvc.metadata.name).toBe('data');
      expect(pvc.spec.resources.requests.storage).toBe(v.redis.persistence.size);
      if (v.redis.persistence.storageClass) expect(pvc.spec.storageClassName).toBe(v.redis.persistence.storageClass);
    }
    expect(c.volumeMounts.find((m: any) => m.mountPath === '/data').name).toBe('data');
  });

  test("Ingress: each enabled sender's webhook path, ops and health paths; /admin only when adminUI.ingress", () => {
    const v = values();
    const ing = find(objs(), 'Ingress');
    if (!v.ingress.enabled) {
      expect(ing).toHaveLength(0);
      return;
    }
    const paths = ing[0]!.spec.rules[0].http.paths;
    const byPath = Object.fromEntries(paths.map((p: any) => [p.path, p.pathType]));
    const routed = SOURCES.filter((s) => v.webhooks.senders[s.name]?.enabled && (s.name !== 'alerts' || v.ingress.routeAlertsWebhook));
    expect(Object.keys(byPath).filter((p) => p.startsWith('/webhook'))).toEqual(routed.map((s) => `/webhook/${s.name}`));
    for (const s of routed) expect(byPath[`/webhook/${s.name}`]).toBe('Exact');
    expect(byPath['/ops']).toBe('Prefix');
    expect(byPath['/health']).toBe('Exact');
    expect('/admin' in byPath).toBe(Boolean(v.adminUI.ingress));
    expect(paths.some((p: any) => ['/metrics', '/ready', '/'].includes(p.path))).toBe(false);
    for (const p of paths) expect(p.backend.service).toEqual({ name: 'opsgate-api', port: { name: 'http' } });
  });

  test('NOTES.txt renders with the demo request and where Bull Board is', async () => {
    const notes = await renderNotes(file);
    expect(notes).toMatch(/X-API-Key: \$KEY/);
    expect(notes).toMatch(/\/ops\/hosts/);
    expect(notes).toContain(`port-forward svc/opsgate-api 8080:${values().tls.enabled ? 443 : 80}`);
    for (const hook of ['/webhook/scm', '/webhook/gitlab', '/webhook/github', '/webhook/alerts']) expect(notes).toContain(`POST ${hook} `);
    if (values().adminUI.enabled) expect(notes).toMatch(/http:\/\/127\.0\.0\.1:8080\/admin\/queues/);
    else expect(notes).toMatch(/disabled \(adminUI\.enabled=false\)/);
    if (values().ingress.enabled && values().adminUI.ingress)
      expect(notes).toMatch(/also routed by the Ingress: https:\/\/opsgate\.example\.com\/admin\/queues/);
    else if (values().adminUI.enabled) expect(notes).toMatch(/not routed by the Ingress/);
    for (const s of secretStrings(values())) expect([s, notes.includes(s)]).toEqual([s, false]);
  });
});

test('NOTES.txt says the API keys were generated only when no key was given', async () => {
  const generated = /the chart generated one operator and one readonly key/;
  expect(await renderNotes(join(VALUES_DIR, 'defaults-values.yaml'), {}, { 'secrets.apiKeyRoles': '' })).toMatch(generated);
  expect(
    await renderNotes(join(VALUES_DIR, 'defaults-values.yaml'), {
      'secrets.apiKeys[0].key': 'k-0123456789abcdef',
      'secrets.apiKeys[0].role': 'operator',
    }),
  ).not.toMatch(generated);
  expect(
    await renderNotes(join(VALUES_DIR, 'defaults-values.yaml'), {}, { 'secrets.apiKeyRoles': 'k-0123456789abcdef:operator' }),
  ).not.toMatch(generated);
});

describe('toggles', () => {
  test('defaults: no Ingress, NetworkPolicy, PDB, HPA, ServiceMonitor, PrometheusRule or dashboard; only built-in kinds', () => {
    const objs = rendered.get('defaults-values.yaml')!;
    const kinds = new Set(objs.map((o) => o.kind));
    for (const k of ['Ingress', 'NetworkPolicy', 'PodDisruptionBudget', 'HorizontalPodAutoscaler', 'ServiceMonitor', 'PrometheusRule'])
      expect(kinds.has(k)).toBe(false);
    expect(find(objs, 'ConfigMap', 'opsgate-dashboard')).toHaveLength(0);
    for (const o of objs) expect(o.apiVersion).toMatch(/^(v1|apps\/v1|rbac\.authorization\.k8s\.io\/v1)$/);
    expect([...kinds].sort()).toEqual(['ConfigMap', 'Deployment', 'Pod', 'Secret', 'Service', 'ServiceAccount', 'StatefulSet']);
  });

  test('all integrations on: each optional object renders and points at the right pods', () => {
    const objs = rendered.get('all-integrations-values.yaml')!;
    const selector = (c: string) => ({
      'app.kubernetes.io/name': 'opsgate',
      'app.kubernetes.io/instance': 'opsgate',
      'app.kubernetes.io/component': c,
    });
    const nps = find(objs, 'NetworkPolicy');
    expect(nps.map((n) => n.metadata.name).sort()).toEqual(['opsgate-api', 'opsgate-redis', 'opsgate-worker']);
    expect(one(objs, 'NetworkPolicy', 'opsgate-api').spec.podSelector.matchLabels).toEqual(selector('api'));
    const redisFrom = one(objs, 'NetworkPolicy', 'opsgate-redis').spec.ingress[0].from.map((f: any) => f.podSelector.matchLabels);
    expect(redisFrom).toEqual([selector('api'), selector('worker')]);
    expect(one(objs, 'PodDisruptionBudget', 'opsgate-api').spec).toEqual({ minAvailable: 1, selector: { matchLabels: selector('api') } });
    expect(one(objs, 'PodDisruptionBudget', 'opsgate-worker').spec.maxUnavailable).toBe(1);
    const hpa = one(objs, 'HorizontalPodAutoscaler', 'opsgate-api');
    expect(hpa.spec.scaleTargetRef).toEqual({ apiVersion: 'apps/v1', kind: 'Deployment', name: 'opsgate-api' });
    expect([hpa.spec.minReplicas, hpa.spec.maxReplicas]).toEqual([3, 6]);
    const sm = one(objs, 'ServiceMonitor', 'opsgate');
    expect(sm.metadata.labels?.release).toBe('kube-prometheus-stack');
    expect(sm.spec.endpoints[0].port).toBe('metrics');
    const rule = one(objs, 'PrometheusRule', 'opsgate');
    const file = parseYaml(readFileSync(join(ROOT, 'charts/opsgate/files/prometheus-rules.yaml'), 'utf8'));
    expect(rule.spec).toEqual(file);
    expect(rule.spec.groups.length).toBeGreaterThan(0);
    const dash = one(objs, 'ConfigMap', 'opsgate-dashboard');
    expect(dash.metadata.namespace).toBe('monitoring');
    expect(dash.metadata.labels?.grafana_dashboard).toBe('1');
    expect(JSON.parse(dash.data['opsgate.json'])).toEqual(
      JSON.parse(readFileSync(join(ROOT, 'charts/opsgate/files/grafana-dashboard.json'), 'utf8')),
    );
    for (const o of objs) expect(o.metadata.labels?.team).toBe('sre');
  });
});

describe('api memory', () => {
  const apiEnv = (objs: K8sObject[]) =>
    one(objs, 'Deployment', 'opsgate-api').spec.template.spec.containers[0].env as { name: string; value?: string }[];

  test("the API's V8 heap is sized by default (what `make bench` measures as the deployed RSS), the worker is left alone", async () => {
    const objs = await render({ files: ['defaults-values.yaml'] });
    expect(apiEnv(objs).find((e) => e.name === 'NODE_OPTIONS')?.value).toBe('--max-old-space-size=96 --max-semi-space-size=8');
    const worker = one(objs, 'Deployment', 'opsgate-worker').spec.template.spec.containers[0].env as { name: string }[];
    expect(worker.some((e) => e.name === 'NODE_OPTIONS')).toBe(false);
  });
  test("api.maxOldSpaceSizeMb / maxSemiSpaceSizeMb set them, 0 leaves V8's default, a negative value is refused by the schema", async () => {
    const [custom, semiOff, off] = await Promise.all([
      render({ files: ['defaults-values.yaml'], set: { 'api.maxOldSpaceSizeMb': '160', 'api.maxSemiSpaceSizeMb': '16' } }),
      render({ files: ['defaults-values.yaml'], set: { 'api.maxSemiSpaceSizeMb': '0' } }),
      render({ files: ['defaults-values.yaml'], set: { 'api.maxOldSpaceSizeMb': '0', 'api.maxSemiSpaceSizeMb': '0' } }),
    ]);
    expect(apiEnv(custom).find((e) => e.name === 'NODE_OPTIONS')?.value).toBe('--max-old-space-size=160 --max-semi-space-size=16');
    expect(apiEnv(semiOff).find((e) => e.name === 'NODE_OPTIONS')?.value).toBe('--max-old-space-size=96');
    expect(apiEnv(off).some((e) => e.name === 'NODE_OPTIONS')).toBe(false);
    expect(await renderError({ files: ['defaults-values.yaml'], set: { 'api.maxOldSpaceSizeMb': '-1' } })).toMatch(/maxOldSpaceSizeMb/);
  });
});

describe('checksums', () => {
  const podAnnotations = (objs: K8sObject[], name: string) => one(objs, 'Deployment', name).spec.template.metadata.annotations;
  const base = { files: ['in-chart-redis-values.yaml'] };

  test('are stable for the same input, change with config (not secret) and with secrets (not config)', async () => {
    const [a, b, cfg, sec, inv] = await Promise.all([
      render(base),
      render(base),
      render({ ...base, set: { 'config.logLevel': 'debug' } }),
      render({ ...base, set: { 'secrets.bearerToken': 'fake-rotated-token-9999' } }),
      render({ ...base, set: { 'inventory.hosts.db-2.namespace': 'data', 'inventory.hosts.db-2.deployments[0]': 'replica' } }),
    ]);
    for (const name of ['opsgate-api', 'opsgate-worker']) {
      const [pa, pb, pc, ps, pi] = [a, b, cfg, sec, inv].map((o) => podAnnotations(o, name));
      expect(pb).toEqual(pa);
      expect(pc['checksum/config']).not.toBe(pa['checksum/config']);
      expect(pc['checksum/secret']).toBe(pa['checksum/secret']);
      expect(ps['checksum/secret']).not.toBe(pa['checksum/secret']);
      expect(ps['checksum/config']).toBe(pa['checksum/config']);
      expect(pi['checksum/config']).not.toBe(pa['checksum/config']);
    }
  }, 120_000);

  test('a generated Redis password is the same everywhere in one render (Secret, api, worker, Redis agree)', async () => {
    const objs = rendered.get('defaults-values.yaml')!;
    const pw = (o: K8sObject[]) => Buffer.from(one(o, 'Secret', 'opsgate').data.REDIS_PASSWORD, 'base64').toString();
    expect(podAnnotations(objs, 'opsgate-api')['checksum/secret']).toBe(podAnnotations(objs, 'opsgate-worker')['checksum/secret']);
    const redisSum = one(objs, 'StatefulSet', 'opsgate-redis').spec.template.metadata.annotations['checksum/secret'];
    expect(redisSum).toBe(
      createHash('sha256')
        .update(`opsgate:${pw(objs)}`)
        .digest('hex'),
    );
    // ...and differs between two renders (it is random, not a constant in the chart).
    const again = await render({ files: ['defaults-values.yaml'] });
    expect(pw(again)).not.toBe(pw(objs));
  }, 60_000);

  test('Redis rolls when its password changes, not when API keys or tokens rotate', async () => {
    const [a, tokens, password] = await Promise.all([
      render(base),
      render({ ...base, set: { 'secrets.apiKeyRoles': 'fake-new-key-9999:operator', 'secrets.bearerToken': 'fake-rotated-token-9999' } }),
      render({ ...base, set: { 'redis.auth.password': 'fake-rotated-redis-password-9999' } }),
    ]);
    const sum = (o: K8sObject[]) => one(o, 'StatefulSet', 'opsgate-redis').spec.template.metadata.annotations['checksum/secret'];
    expect(sum(tokens)).toBe(sum(a));
    expect(sum(password)).not.toBe(sum(a));
    expect(podAnnotations(password, 'opsgate-api')['checksum/secret']).not.toBe(podAnnotations(a, 'opsgate-api')['checksum/secret']);
  }, 120_000);
});

describe('admin UI', () => {
  test('off by default: the chart, its values and the generated k8s/opsgate.yaml say ADMIN_UI_ENABLED "false"', async () => {
    expect(chartDefaults.adminUI).toEqual({ enabled: false, ingress: false });
    expect(one(await render({ files: ['defaults-values.yaml'] }), 'ConfigMap', 'opsgate-config').data.ADMIN_UI_ENABLED).toBe('false');
    const manifests = parseManifests(readFileSync(join(ROOT, 'k8s/opsgate.yaml'), 'utf8'));
    expect(manifests.find((o) => o.kind === 'ConfigMap' && o.metadata.name === 'opsgate-config')!.data.ADMIN_UI_ENABLED).toBe('false');
    expect(
      one(await render({ files: ['defaults-values.yaml'], set: { 'adminUI.enabled': 'true' } }), 'ConfigMap', 'opsgate-config').data
        .ADMIN_UI_ENABLED,
    ).toBe('true');
  });
});

describe('API preStop sleep', () => {
  const container = (o: K8sObject[]) => one(o, 'Deployment', 'opsgate-api').spec.template.spec.containers[0];
  test('native sleep action on Kubernetes >= 1.30, before it a node command (the image has no shell or sleep); none when 0', async () => {
    const base = { files: ['defaults-values.yaml'] };
    expect(container(await render({ ...base, kubeVersion: '1.35.0' })).lifecycle).toEqual({ preStop: { sleep: { seconds: 5 } } });
    expect(container(await render({ ...base, kubeVersion: '1.29.0' })).lifecycle).toEqual({
      preStop: { exec: { command: ['node', '-e', 'setTimeout(() => {}, 5000)'] } },
    });
    expect(container(await render({ ...base, set: { 'api.preStopSleepSeconds': '0' } })).lifecycle).toBeUndefined();
  });
});

describe('API keys when none are given', () => {
  test('the chart-made Secret gets one generated operator and one readonly key, the same in every template of a render', async () => {
    const objs = await render({});
    const secret = one(objs, 'Secret', 'opsgate');
    const roles = Buffer.from(secret.data.OPS_API_KEY_ROLES, 'base64').toString();
    expect(roles).toMatch(/^[A-Za-z0-9]{40}:operator,[A-Za-z0-9]{40}:readonly$/);
    // a second render (no cluster to look up) makes other keys: nothing is a fixed default
    const again = Buffer.from(one(await render({}), 'Secret', 'opsgate').data.OPS_API_KEY_ROLES, 'base64').toString();
    expect(again).not.toBe(roles);
    // the checksum the pods roll on is computed over the same generated Secret
    const sum = (o: K8sObject[]) =>
      o.find((x) => x.kind === 'Deployment' && x.metadata.name === 'opsgate-api')!.spec.template.metadata.annotations['checksum/secret'];
    expect(sum(objs)).toMatch(/^[0-9a-f]{64}$/);
  });
});

describe('render-time refusals', () => {
  test('external Redis without a URL', async () => {
    expect(await renderError({ files: ['defaults-values.yaml'], set: { 'redis.enabled': 'false' } })).toMatch(
      /secrets\.redisUrl \(REDIS_URL of the external Redis\) is required/,
    );
  });
  test('admin Ingress route without the admin UI', async () => {
    expect(await renderError({ files: ['defaults-values.yaml'], set: { 'adminUI.enabled': 'false', 'adminUI.ingress': 'true' } })).toMatch(
      /adminUI\.ingress needs adminUI\.enabled/,
    );
  });
  test('API preStop sleep not shorter than its grace period', async () => {
    expect(
      await renderError({
        files: ['defaults-values.yaml'],
        set: { 'api.preStopSleepSeconds': '30', 'api.terminationGracePeriodSeconds': '30' },
      }),
    ).toMatch(/api\.preStopSleepSeconds \(30\) must be below api\.terminationGracePeriodSeconds \(30\)/);
  });
  test('worker grace period not longer than its job drain', async () => {
    expect(
      await renderError({
        files: ['defaults-values.yaml'],
        set: { 'worker.terminationGracePeriodSeconds': '60', 'config.workerShutdownGraceSeconds': '60' },
      }),
    ).toMatch(/worker\.terminationGracePeriodSeconds \(60\) must be greater than config\.workerShutdownGraceSeconds \(60\)/);
  });
  test("existingSecret alone renders (keys come from the user's Secret)", async () => {
    const objs = await render({ set: { 'secrets.existingSecret': 'mine' } });
    expect(find(objs, 'Secret')).toHaveLength(0);
    const env = one(objs, 'Deployment', 'opsgate-api').spec.template.spec.containers[0].env as { name: string; valueFrom?: any }[];
    expect(env.find((e) => e.name === 'OPS_API_KEY_ROLES')?.valueFrom.secretKeyRef).toEqual({ name: 'mine', key: 'OPS_API_KEY_ROLES' });
  });
});

/** The alerts webhook behind the Ingress, Redis maxmemory, TRUST_PROXY, NetworkPolicy. */
describe('security defaults', () => {
  const ingressOn = { 'ingress.enabled': 'true', 'ingress.host': 'opsgate.example.com' };
  const cm = (objs: K8sObject[]) => one(objs, 'ConfigMap', 'opsgate-config').data as Record<string, string>;
  const apiEnv = (objs: K8sObject[]) =>
    one(objs, 'Deployment', 'opsgate-api').spec.template.spec.containers[0].env as { name: string; valueFrom?: any }[];
  const paths = (objs: K8sObject[]) =>
    Object.fromEntries(one(objs, 'Ingress', 'opsgate').spec.rules[0].http.paths.map((p: any) => [p.path, p.pathType]));

  test('an Ingress that would route /webhook/alerts without a token is refused with a clear message', async () => {
    const err = await renderError({ files: ['defaults-values.yaml'], set: ingressOn });
    expect(err).toMatch(
      /ingress\.enabled would route \/webhook\/alerts to the outside without a token: set secrets\.webhookSecrets\.alerts/,
    );
    expect(err).toMatch(/ingress\.routeAlertsWebhook=false/);
  });

  test("with a token it routes each enabled sender's path; routeAlertsWebhook=false routes every one but alerts", async () => {
    const [withToken, noAlerts] = await Promise.all([
      render({ files: ['defaults-values.yaml'], set: { ...ingressOn, 'secrets.alertsWebhookToken': 'fake-alerts-token-0009' } }),
      render({ files: ['defaults-values.yaml'], set: { ...ingressOn, 'ingress.routeAlertsWebhook': 'false' } }),
    ]);
    expect(paths(withToken)).toEqual({
      '/webhook/alerts': 'Exact',
      '/webhook/github': 'Exact',
      '/webhook/gitlab': 'Exact',
      '/webhook/scm': 'Exact',
      '/ops': 'Prefix',
      '/health': 'Exact',
    });
    const p = paths(noAlerts);
    expect(p).toEqual({
      '/webhook/github': 'Exact',
      '/webhook/gitlab': 'Exact',
      '/webhook/scm': 'Exact',
      '/ops': 'Prefix',
      '/health': 'Exact',
    });
  });

  test('existingSecret + Ingress routing alerts: ALERTS_WEBHOOK_TOKEN becomes a required key (the pod does not start without it)', async () => {
    const [routed, internal] = await Promise.all([
      render({ set: { ...ingressOn, 'secrets.existingSecret': 'mine' } }),
      render({ set: { 'secrets.existingSecret': 'mine' } }),
    ]);
    expect(apiEnv(routed).find((e) => e.name === 'ALERTS_WEBHOOK_TOKEN')?.valueFrom.secretKeyRef).toEqual({
      name: 'mine',
      key: 'ALERTS_WEBHOOK_TOKEN',
      optional: false,
    });
    expect(apiEnv(routed).find((e) => e.name === 'OPS_BEARER_TOKEN')?.valueFrom.secretKeyRef.optional).toBe(true);
    expect(apiEnv(internal).find((e) => e.name === 'ALERTS_WEBHOOK_TOKEN')?.valueFrom.secretKeyRef.optional).toBe(true);
  });

  test('Redis gets a maxmemory below its memory limit (default 75% of it), noeviction; one at or above the limit is refused', async () => {
    const conf = (objs: K8sObject[]) => one(objs, 'ConfigMap', 'opsgate-redis').data['redis.conf'] as string;
    const [defaults, explicit, kubeUnits] = await Promise.all([
      render({ files: ['defaults-values.yaml'] }),
      render({ files: ['defaults-values.yaml'], set: { 'redis.maxmemory': '256mb' } }),
      render({ files: ['defaults-values.yaml'], set: { 'redis.resources.limits.memory': '1Gi' } }),
    ]);
    expect(conf(defaults)).toMatch(/^maxmemory 402653184$/m); // 75% of 512Mi
    expect(conf(defaults)).toMatch(/^maxmemory-policy noeviction$/m);
    expect(conf(explicit)).toMatch(/^maxmemory 268435456$/m);
    expect(conf(kubeUnits)).toMatch(/^maxmemory 805306368$/m);
    expect(await renderError({ files: ['defaults-values.yaml'], set: { 'redis.maxmemory': '512mb' } })).toMatch(
      /redis\.maxmemory \(512mb\) must be below redis\.resources\.limits\.memory \(512Mi\)/,
    );
  });

  test('TRUST_PROXY: 0 without the Ingress, the hop count with it, an explicit value wins', async () => {
    const [plain, ingress, hops, explicit] = await Promise.all([
      render({ files: ['defaults-values.yaml'] }),
      render({ files: ['defaults-values.yaml'], set: { ...ingressOn, 'secrets.alertsWebhookToken': 'fake-alerts-token-0009' } }),
      render({
        files: ['defaults-values.yaml'],
        set: { ...ingressOn, 'secrets.alertsWebhookToken': 'fake-alerts-token-0009', 'ingress.proxyHops': '2' },
      }),
      render({ files: ['defaults-values.yaml'], setString: { 'config.trustProxy': '3' } }),
    ]);
    expect(cm(plain).TRUST_PROXY).toBe('0');
    expect(cm(ingress).TRUST_PROXY).toBe('1');
    expect(cm(hops).TRUST_PROXY).toBe('2');
    expect(cm(explicit).TRUST_PROXY).toBe('3');
  });

  test('NetworkPolicy follows the Ingress: API port only from the ingress controller namespace, metrics only from monitoring', async () => {
    const [plain, ingress, forcedOff, custom] = await Promise.all([
      render({ files: ['defaults-values.yaml'] }),
      render({ files: ['defaults-values.yaml'], set: { ...ingressOn, 'secrets.alertsWebhookToken': 'fake-alerts-token-0009' } }),
      render({
        files: ['defaults-values.yaml'],
        set: { ...ingressOn, 'secrets.alertsWebhookToken': 'fake-alerts-token-0009', 'networkPolicy.enabled': 'false' },
      }),
      render({
        files: ['defaults-values.yaml'],
        set: {
          ...ingressOn,
          'secrets.alertsWebhookToken': 'fake-alerts-token-0009',
          'networkPolicy.ingressControllerNamespace': 'traefik',
          'networkPolicy.monitoringNamespace': 'observability',
        },
      }),
    ]);
    expect(find(plain, 'NetworkPolicy')).toHaveLength(0);
    expect(find(forcedOff, 'NetworkPolicy')).toHaveLength(0);
    const ns = (name: string) => [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': name } } }];
    for (const [objs, ingressNs, monNs] of [
      [ingress, 'ingress-nginx', 'monitoring'],
      [custom, 'traefik', 'observability'],
    ] as const) {
      const api = one(objs, 'NetworkPolicy', 'opsgate-api').spec.ingress;
      expect(api).toEqual([
        { ports: [{ port: 'http', protocol: 'TCP' }], from: ns(ingressNs) },
        { ports: [{ port: 'metrics', protocol: 'TCP' }], from: ns(monNs) },
      ]);
      expect(one(objs, 'NetworkPolicy', 'opsgate-worker').spec.ingress).toEqual([
        { ports: [{ port: 'metrics', protocol: 'TCP' }], from: ns(monNs) },
      ]);
      expect(find(objs, 'NetworkPolicy', 'opsgate-redis')).toHaveLength(1);
    }
  });
});

describe('worker liveness', () => {
  test('the worker livenessProbe is GET /livez on its metrics port (event loop + Redis), not a TCP check', async () => {
    const objs = await render({ files: ['defaults-values.yaml'], set: { 'config.workerLivenessMaxLagMs': '3000' } });
    const c = one(objs, 'Deployment', 'opsgate-worker').spec.template.spec.containers[0];
    expect(c.livenessProbe.httpGet).toEqual({ path: '/livez', port: 'metrics' });
    expect(c.livenessProbe.tcpSocket).toBeUndefined();
    expect(one(objs, 'ConfigMap', 'opsgate-config').data.WORKER_LIVENESS_MAX_LAG_MS).toBe('3000');
  });
});

describe('worker admission policy', () => {
  const VAP = 'admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy';
  const allowedOf = (objs: K8sObject[]) =>
    JSON.parse(
      one(objs, 'ValidatingAdmissionPolicy', 'opsgate-opsgate-worker-jobs').spec.variables.find((v: any) => v.name === 'allowed')
        .expression,
    );

  /**
   * The template the policy admits for each project, taken from the Job the worker builds from the
   * same inventory (buildDeployJob): its image, ServiceAccount, command, args, and every variable
   * but the request's (OPSGATE_REF, checked against refs; OPSGATE_AUDIT_ID; OPSGATE_COMMIT_SHA).
   */
  function templatesFromWorker(inventoryYaml: string): Record<string, unknown[]> {
    const inv = parseInventory(inventoryYaml);
    const out: Record<string, unknown[]> = {};
    for (const [project, entry] of Object.entries(inv.projects)) {
      const c = buildDeployJob({ name: 'x', project, ref: 'r', auditId: 'a', requestedBy: 'k', queueJobId: '1', sha: 'abc', entry }).spec!
        .template.spec!.containers[0]!;
      const perRequest = ['OPSGATE_REF', 'OPSGATE_AUDIT_ID', 'OPSGATE_COMMIT_SHA'];
      (out[entry.namespace] ??= []).push({
        project: [project],
        image: [c.image],
        sa: [entry.serviceAccountName],
        command: c.command ?? [],
        args: c.args ?? [],
        refs: entry.refs,
        env: c.env!.filter((e) => !perRequest.includes(e.name)).map((e) => `${e.name}=${e.value}`),
      });
    }
    return out;
  }
  const sortEnv = (a: Record<string, any[]>) =>
    Object.fromEntries(Object.entries(a).map(([ns, ps]) => [ns, ps.map((p) => ({ ...p, env: [...p.env].sort() }))]));

  test('rendered when the cluster serves admissionregistration.k8s.io/v1 and the inventory names something; off on request', async () => {
    const [withApi, withoutApi, disabled, noInventory] = await Promise.all([
      render({ files: ['all-integrations-values.yaml'], apiVersions: [VAP] }),
      render({ files: ['all-integrations-values.yaml'] }),
      render({ files: ['all-integrations-values.yaml'], apiVersions: [VAP], set: { 'rbac.admissionPolicy.enabled': 'false' } }),
      render({ files: ['defaults-values.yaml'], apiVersions: [VAP] }),
    ]);
    for (const objs of [withoutApi, disabled, noInventory]) {
      expect(find(objs, 'ValidatingAdmissionPolicy')).toHaveLength(0);
      expect(find(objs, 'ValidatingAdmissionPolicyBinding')).toHaveLength(0);
    }
    // One policy per kind, each matching that kind's one version (so the apiserver type-checks it)
    const policies = find(withApi, 'ValidatingAdmissionPolicy');
    expect(policies.map((p) => p.metadata.name).sort()).toEqual(['opsgate-opsgate-worker-deployments', 'opsgate-opsgate-worker-jobs']);
    for (const policy of policies) {
      expect(policy.metadata.namespace).toBeUndefined(); // cluster-scoped
      expect(policy.spec.failurePolicy).toBe('Fail');
      expect(policy.spec.matchConditions[0].expression).toBe('request.userInfo.username == "system:serviceaccount:opsgate:opsgate-worker"');
      const binding = one(withApi, 'ValidatingAdmissionPolicyBinding', policy.metadata.name);
      expect(binding.spec).toEqual({ policyName: policy.metadata.name, validationActions: ['Deny'] });
    }
    expect(one(withApi, 'ValidatingAdmissionPolicy', 'opsgate-opsgate-worker-deployments').spec.matchConstraints.resourceRules).toEqual([
      { apiGroups: ['apps'], apiVersions: ['v1'], operations: ['UPDATE'], resources: ['deployments'] },
    ]);
    const jobs = one(withApi, 'ValidatingAdmissionPolicy', 'opsgate-opsgate-worker-jobs');
    expect(jobs.spec.matchConstraints.resourceRules).toEqual([
      { apiGroups: ['batch'], apiVersions: ['v1'], operations: ['CREATE'], resources: ['jobs'] },
    ]);
    expect(allowedOf(withApi)).toEqual({
      shop: [
        {
          project: ['acme/shop'],
          image: ['registry.example.com/acme/deployer:1.0'],
          sa: ['shop-deployer'],
          command: ['/bin/deploy'],
          args: ['--verbose'],
          refs: ['refs/heads/main'],
          env: ['TARGET=production', 'OPSGATE_PROJECT=acme/shop', 'TMPDIR=/tmp'],
        },
      ],
      deploys: [
        {
          project: ['acme/infra'],
          image: ['registry.example.com/acme/terraform-runner:2.1'],
          sa: ['infra-deployer'],
          command: [],
          args: [],
          refs: ['refs/heads/main', 'refs/heads/release'],
          env: ['OPSGATE_PROJECT=acme/infra', 'TMPDIR=/tmp'],
        },
      ],
    });
    // One validation per rule of a Job, each with its own message
    const messages = jobs.spec.validations.map((v: any) => v.message);
    expect(messages).toHaveLength(8);
    expect(new Set(messages).size).toBe(8);
    expect(jobs.spec.validations.map((v: any) => v.reason)).toEqual(Array(8).fill('Forbidden'));
  });

  test("each project's template is the Job the worker builds from the same inventory (reserved env names dropped, refs defaulted, no ref at all)", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'opsgate-vap-'));
    const file = join(dir, 'values.yaml');
    writeFileSync(
      file,
      stringifyYaml({
        inventory: {
          hosts: {},
          projects: {
            'acme/shop': {
              namespace: 'shop',
              serviceAccountName: 'shop-deployer',
              image: 'registry.example.com/acme/deployer:1.0',
              command: ['/bin/sh', '-c', 'deploy "$OPSGATE_REF"'],
              args: [],
              // the worker sets these itself and drops them from the project's env
              env: { OPSGATE_REF: 'refs/heads/evil', OPSGATE_PROJECT: 'other', ZONE: 'eu=1', EMPTY: '', TMPDIR: '/var/tmp' },
            },
            'acme/docs': { namespace: 'shop', serviceAccountName: 'docs-deployer', image: 'registry.example.com/acme/docs:2', refs: [] },
            'acme/infra': {
              namespace: 'deploys',
              serviceAccountName: 'infra-deployer',
              image: 'registry.example.com/acme/terraform-runner:2.1',
              args: ['apply', '--auto-approve'],
            },
          },
        },
      }),
    );
    const objs = await render({ files: ['defaults-values.yaml', file], apiVersions: [VAP] });
    const inventoryYaml = one(objs, 'ConfigMap', 'opsgate-inventory').data['inventory.yaml'];
    const allowed = allowedOf(objs);
    expect(sortEnv(allowed)).toEqual(sortEnv(templatesFromWorker(inventoryYaml)));
    // spelled out, so the comparison above is known to compare something
    const shop = allowed.shop.find((p: any) => p.project[0] === 'acme/shop');
    expect([...shop.env].sort()).toEqual(['EMPTY=', 'OPSGATE_PROJECT=acme/shop', 'TMPDIR=/tmp', 'TMPDIR=/var/tmp', 'ZONE=eu=1']);
    expect(allowed.shop.find((p: any) => p.project[0] === 'acme/docs').refs).toEqual([]);
    expect(allowed.deploys[0]).toMatchObject({ command: [], args: ['apply', '--auto-approve'], refs: ['refs/heads/main'] });
  });
});

describe('NOTES.txt warnings on risky values', () => {
  test('each risky value gets its WARNING line; a hardened install gets none', async () => {
    const risky = await renderNotes(
      'defaults-values.yaml',
      { 'networkPolicy.enabled': 'false', 'rbac.admissionPolicy.enabled': 'false' },
      { 'config.trustProxy': '1' },
    );
    expect(risky).toMatch(/SECURITY WARNINGS:/);
    expect(risky).toMatch(/WARNING: secrets\.webhookSecrets\.alerts \(ALERTS_WEBHOOK_TOKEN\) is empty/);
    expect(risky).toMatch(/WARNING: config\.trustProxy="1" without the chart's Ingress/);
    expect(risky).toMatch(/WARNING: No NetworkPolicy/);
    expect(risky).toMatch(/WARNING: rbac\.admissionPolicy\.enabled=false/);
    const admin = await renderNotes('all-integrations-values.yaml');
    expect(admin).toMatch(/WARNING: Bull Board \(\/admin\) is routed by the Ingress/);
    const hardened = await renderNotes('all-integrations-values.yaml', { 'adminUI.ingress': 'false' });
    expect(hardened).not.toMatch(/WARNING/);
  });
});
