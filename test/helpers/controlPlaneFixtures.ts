import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { stringify } from 'yaml';
import { helm, kubectl, ok, REPO, useCluster, type ClusterInfo } from './cluster.js';

export const CHART = join(REPO, 'charts', 'opsgate');

/** Namespaces a test file uses: each file has its own prefix, so files never collide on the shared cluster. */
export function namespaces(prefix: string) {
  return {
    release: `${prefix}-opsgate`,
    apps: `${prefix}-apps`,
    data: `${prefix}-data`,
    deploy: `${prefix}-deploy`,
    other: `${prefix}-other`,
  };
}
export type Namespaces = ReturnType<typeof namespaces>;

export const PROJECT = 'group/shop';

/** The inventory both the chart (values.inventory) and the worker use. */
export function inventory(ns: Namespaces) {
  return {
    hosts: {
      'web-1.example.com': { namespace: ns.apps, deployments: ['web', 'checkout'] },
      'cache-1': { namespace: ns.data, deployments: ['cache'] },
    },
    projects: {
      [PROJECT]: {
        namespace: ns.deploy,
        serviceAccountName: 'deployer',
        image: 'registry.example.com/shop/deployer:1.4.2',
        command: ['/bin/deploy'],
        args: ['--apply'],
        refs: ['refs/heads/main'],
        env: { DEPLOY_ENV: 'production' },
        activeDeadlineSeconds: 600,
        // No kubelet here: a deploy Job's pod never runs, so the worker does not wait for it to end.
        waitForCompletion: false,
      },
    },
  };
}

/** Chart values with every secret set by value and the inventory above. */
export function chartValues(ns: Namespaces, extra: Record<string, unknown> = {}) {
  return {
    secrets: {
      apiKeyRoles: 'k8s-test-readonly-key-0001:readonly,k8s-test-operator-key-0001:operator',
      bearerToken: 'k8s-test-bearer-token',
      scmWebhookSecret: 'k8s-test-scm-secret',
      githubWebhookSecret: 'k8s-test-github-secret',
      alertsWebhookToken: 'k8s-test-alerts-token',
      notifyWebhookUrls: 'https://chat.example.com/hooks/abc',
    },
    inventory: inventory(ns),
    ...extra,
  };
}

/** Every optional toggle of the chart on. */
export const ALL_TOGGLES = {
  adminUI: { enabled: true, ingress: true },
  ingress: { enabled: true, className: 'nginx', host: 'ops.example.com', tls: [{ secretName: 'ops-tls', hosts: ['ops.example.com'] }] },
  networkPolicy: { enabled: true },
  podDisruptionBudget: { enabled: true },
  autoscaling: { enabled: true, minReplicas: 2, maxReplicas: 5 },
  serviceMonitor: { enabled: true, labels: { release: 'kube-prometheus-stack' } },
  prometheusRule: { enabled: true, labels: { release: 'kube-prometheus-stack' } },
  grafanaDashboard: { enabled: true },
};

export function writeValues(values: unknown, name = 'values.yaml'): string {
  const dir = mkdtempSync(join(tmpdir(), 'opsgate-values-'));
  const file = join(dir, name);
  writeFileSync(file, stringify(values));
  return file;
}

export async function createNamespaces(cluster: ClusterInfo, names: string[]): Promise<void> {
  const yaml = names.map((n) => `apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ${n}\n`).join('---\n');
  ok(await kubectl(cluster.kubeconfigPath, ['apply', '-f', '-'], yaml), 'create namespaces');
}

export async function deleteNamespaces(cluster: ClusterInfo, names: string[]): Promise<void> {
  await kubectl(cluster.kubeconfigPath, ['delete', 'namespace', '--ignore-not-found', '--wait=false', ...names]);
}

export function adminKubeConfig(cluster: ClusterInfo): k8s.KubeConfig {
  const kc = new k8s.KubeConfig();
  kc.loadFromFile(cluster.kubeconfigPath);
  return kc;
}

/**
 * The chart released in namespaces of a test file's own (prefix), on the shared cluster:
 * `setUp` (beforeAll) takes the cluster, creates the namespaces and, with `install`, runs
 * `helm install` of charts/opsgate with chartValues; `tearDown` (afterAll) uninstalls, deletes
 * the namespaces and lets the cluster go. `cluster` is the one setUp took.
 */
export function chartRelease(prefix: string) {
  const ns = namespaces(prefix);
  const allNs = [ns.release, ns.apps, ns.data, ns.deploy, ns.other];
  const release = 'opsgate';
  let cluster: Awaited<ReturnType<typeof useCluster>> | undefined;
  return {
    ns,
    allNs,
    release,
    get cluster() {
      if (!cluster) throw new Error('no cluster: setUp() did not run (beforeAll)');
      return cluster;
    },
    async setUp(opts: { install: boolean }) {
      cluster = await useCluster();
      await createNamespaces(cluster, allNs);
      if (opts.install)
        ok(
          await helm(cluster.kubeconfigPath, ['install', release, CHART, '-n', ns.release, '-f', writeValues(chartValues(ns))]),
          'helm install',
        );
      return cluster;
    },
    async tearDown() {
      if (!cluster) return;
      await helm(cluster.kubeconfigPath, ['uninstall', release, '-n', ns.release, '--ignore-not-found']);
      await deleteNamespaces(cluster, allNs);
      await cluster.release();
    },
  };
}

/** A token of a ServiceAccount from the TokenRequest API (what its pods would be given). */
export async function serviceAccountToken(
  admin: k8s.KubeConfig,
  namespace: string,
  name: string,
  expirationSeconds = 600,
): Promise<string> {
  const req = await admin
    .makeApiClient(k8s.CoreV1Api)
    .createNamespacedServiceAccountToken({ name, namespace, body: { spec: { audiences: [], expirationSeconds } } });
  return req.status!.token!;
}

/** A KubeConfig for the admin's cluster that authenticates with `token` only. */
export function tokenKubeConfig(admin: k8s.KubeConfig, token: string): k8s.KubeConfig {
  const cl = admin.getCurrentCluster()!;
  const kc = new k8s.KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: 'c', server: cl.server, caData: cl.caData }],
    users: [{ name: 'sa', token }],
    contexts: [{ name: 'x', cluster: 'c', user: 'sa' }],
    currentContext: 'x',
  });
  return kc;
}

/** A Deployment with 0 replicas (no kubelet here: pods never run, so rollouts complete only at 0). */
export function deployment(name: string, namespace: string): k8s.V1Deployment {
  return {
    apiVersion: 'apps/v1',
    kind: 'Deployment',
    metadata: { name, namespace, labels: { app: name } },
    spec: {
      replicas: 0,
      selector: { matchLabels: { app: name } },
      template: {
        metadata: { labels: { app: name } },
        spec: { containers: [{ name, image: `registry.example.com/${name}:1` }] },
      },
    },
  };
}

export async function createDeployments(cluster: ClusterInfo, items: Array<[namespace: string, name: string]>) {
  const apps = adminKubeConfig(cluster).makeApiClient(k8s.AppsV1Api);
  for (const [namespace, name] of items) {
    await apps.createNamespacedDeployment({ namespace, body: deployment(name, namespace) });
  }
}

/**
 * Minimal CustomResourceDefinitions of the Prometheus Operator kinds the chart renders
 * (monitoring.coreos.com/v1 ServiceMonitor and PrometheusRule), written here: the real
 * operator's CRDs are not a Go module or registry package. The schemas keep the operator's
 * required structure (ServiceMonitor: selector + endpoints[]; PrometheusRule: groups[] of
 * name + rules[] with expr and alert or record) so server-side validation of the chart's
 * objects checks something, and leave the rest open.
 */
export const MONITORING_CRDS = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: servicemonitors.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: ServiceMonitor, listKind: ServiceMonitorList, plural: servicemonitors, singular: servicemonitor, shortNames: [smon]}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          required: [spec]
          properties:
            spec:
              type: object
              required: [selector, endpoints]
              properties:
                jobLabel: {type: string}
                namespaceSelector:
                  type: object
                  properties:
                    any: {type: boolean}
                    matchNames: {type: array, items: {type: string}}
                selector:
                  type: object
                  properties:
                    matchLabels: {type: object, additionalProperties: {type: string}}
                    matchExpressions:
                      type: array
                      items:
                        type: object
                        required: [key, operator]
                        properties:
                          key: {type: string}
                          operator: {type: string}
                          values: {type: array, items: {type: string}}
                endpoints:
                  type: array
                  minItems: 1
                  items:
                    type: object
                    x-kubernetes-preserve-unknown-fields: true
                    properties:
                      port: {type: string}
                      targetPort: {x-kubernetes-int-or-string: true}
                      path: {type: string}
                      scheme: {type: string, enum: [http, https]}
                      interval: {type: string, pattern: '^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$'}
                      scrapeTimeout: {type: string, pattern: '^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$'}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: prometheusrules.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: PrometheusRule, listKind: PrometheusRuleList, plural: prometheusrules, singular: prometheusrule, shortNames: [promrule]}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          required: [spec]
          properties:
            spec:
              type: object
              properties:
                groups:
                  type: array
                  items:
                    type: object
                    required: [name, rules]
                    properties:
                      name: {type: string, minLength: 1}
                      interval: {type: string}
                      limit: {type: integer}
                      rules:
                        type: array
                        items:
                          type: object
                          required: [expr]
                          properties:
                            alert: {type: string}
                            record: {type: string}
                            expr: {x-kubernetes-int-or-string: true}
                            for: {type: string}
                            keep_firing_for: {type: string}
                            labels: {type: object, additionalProperties: {type: string}}
                            annotations: {type: object, additionalProperties: {type: string}}
                          x-kubernetes-validations:
                            - rule: "has(self.alert) != has(self.record)"
                              message: "a rule has exactly one of alert or record"
`;

export async function installMonitoringCrds(cluster: ClusterInfo): Promise<void> {
  ok(await kubectl(cluster.kubeconfigPath, ['apply', '--server-side', '-f', '-'], MONITORING_CRDS), 'apply CRDs');
  ok(
    await kubectl(cluster.kubeconfigPath, [
      'wait',
      '--for=condition=Established',
      '--timeout=60s',
      'crd/servicemonitors.monitoring.coreos.com',
      'crd/prometheusrules.monitoring.coreos.com',
    ]),
    'wait for CRDs',
  );
}

/** Split a multi-document YAML stream into {kind, name, namespace} of each object. */
export function objectsOf(docs: Array<Record<string, unknown> | null>) {
  return docs
    .filter((d): d is Record<string, unknown> => !!d && typeof d === 'object' && 'kind' in d)
    .map((d) => {
      const md = (d.metadata ?? {}) as { name?: string; namespace?: string };
      return { kind: String(d.kind), apiVersion: String(d.apiVersion), name: md.name ?? '', namespace: md.namespace };
    });
}
