import { afterAll, describe, expect, jest, test } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadApiConfig } from '../../../src/api/config.js';
import { parseOidcFile } from '../../../src/api/oidcConfig.js';
import { containerEnv, find, one, render, renderError, secretData, type K8sObject } from '../../helpers/helm.js';

/**
 * The chart's keyless callers (real helm): oidc.issuers become the OIDC file of a ConfigMap of its
 * own, mounted whole into the api pods (the kubelet updates it in place and the API re-reads it,
 * so it is kept out of the pods' checksums: no rollout), OPS_OIDC_FILE points at it, and an issuer
 * read with the pod's own token mounts that token. What renders is what the API accepts; the
 * schema refuses what it would not.
 */
jest.setTimeout(120_000);

const dir = mkdtempSync(join(tmpdir(), 'opsgate-chart-oidc-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const CA = '-----BEGIN CERTIFICATE-----\nMIIBtest\n-----END CERTIFICATE-----';
function valuesFile(name: string, text: string): string {
  const f = join(dir, name);
  writeFileSync(f, text);
  return f;
}
const apiPod = (objs: K8sObject[]) => one(objs, 'Deployment', 'opsgate-api').spec.template.spec;

const issuers = (ref: string) => `
oidc:
  caBundle: |
    ${CA.split('\n').join('\n    ')}
  issuers:
    - issuer: https://token.actions.githubusercontent.com
      kind: github
      audience: opsgate
      max_token_lifetime: 10m
      rules:
        - name: storefront
          match: {repository: acme/storefront, ref: ${ref}}
          owner: "github:{repository}"
          person: "{actor}"
          may_override: true
          role: operator
          scope: {projects: [acme/storefront], hosts: [web-01]}
    - issuer: https://kubernetes.default.svc.cluster.local
      kind: kubernetes
      audience: opsgate
      discovery_auth: serviceaccount
      ca_file: /etc/opsgate-oidc/ca.pem
      rules:
        - match: {/kubernetes.io/namespace: ci}
          owner: "k8s:{/kubernetes.io/namespace}/{/kubernetes.io/serviceaccount/name}"
          role: operator
          scope: {namespaces: [ci]}
secrets:
  apiKeys:
    - {id: ci-scoped, role: operator, key: scoped-key-0123456789, scope: {hosts: [web-01]}}
`;

describe('oidc.issuers', () => {
  test('render the OIDC file the API reads, mounted whole into the api pods, with OPS_OIDC_FILE pointing at it', async () => {
    const objs = await render({ files: [valuesFile('oidc.yaml', issuers('refs/heads/main'))] });
    const cm = one(objs, 'ConfigMap', 'opsgate-oidc');
    expect(cm.data['ca.pem'].trim()).toBe(CA);
    const parsed = parseOidcFile(cm.data['oidc.yaml'], (p) => {
      expect(p).toBe('/etc/opsgate-oidc/ca.pem');
      return cm.data['ca.pem'];
    });
    expect(parsed.map((i) => [i.issuer, i.kind, i.rules.length])).toEqual([
      ['https://token.actions.githubusercontent.com', 'github', 1],
      ['https://kubernetes.default.svc.cluster.local', 'kubernetes', 1],
    ]);
    expect(parsed[0]).toMatchObject({ maxTokenLifetime: 600, rules: [{ mayOverride: true, person: { text: '{actor}' } }] });
    expect(parsed[1]).toMatchObject({ discoveryAuth: 'serviceaccount', ca: `${CA}\n` });
    expect(containerEnv(objs, 'opsgate-api').OPS_OIDC_FILE).toBe('/etc/opsgate-oidc/oidc.yaml');
    expect(containerEnv(objs, 'opsgate-worker').OPS_OIDC_FILE).toBe('/etc/opsgate-oidc/oidc.yaml');
    const pod = apiPod(objs);
    expect(pod.volumes).toContainEqual({ name: 'oidc', configMap: { name: 'opsgate-oidc' } });
    expect(pod.containers[0].volumeMounts).toContainEqual({ name: 'oidc', mountPath: '/etc/opsgate-oidc', readOnly: true });
    expect(pod.containers[0].volumeMounts.find((m: { name: string }) => m.name === 'oidc').subPath).toBeUndefined();
    // discovery_auth: serviceaccount reads the pod's own token, allowed by the built-in discovery ClusterRole.
    expect(pod.automountServiceAccountToken).toBe(true);
    const binding = one(objs, 'ClusterRoleBinding', 'opsgate-api-oidc-discovery');
    expect(binding.roleRef).toEqual({
      apiGroup: 'rbac.authorization.k8s.io',
      kind: 'ClusterRole',
      name: 'system:service-account-issuer-discovery',
    });
    expect(binding.subjects).toEqual([{ kind: 'ServiceAccount', name: pod.serviceAccountName, namespace: 'opsgate' }]);
    // The API server's advertised addresses, where its discovery document may point jwks_uri: one EndpointSlice, read only.
    const role = one(objs, 'Role', 'opsgate-api-oidc-apiserver');
    expect(role.metadata.namespace).toBe('default');
    expect(role.rules).toEqual([
      { apiGroups: ['discovery.k8s.io'], resources: ['endpointslices'], resourceNames: ['kubernetes'], verbs: ['get'] },
    ]);
    const roleBinding = one(objs, 'RoleBinding', 'opsgate-api-oidc-apiserver');
    expect([roleBinding.metadata.namespace, roleBinding.roleRef.name]).toEqual(['default', 'opsgate-api-oidc-apiserver']);
    expect(roleBinding.subjects).toEqual([{ kind: 'ServiceAccount', name: pod.serviceAccountName, namespace: 'opsgate' }]);
  });

  test("a keys-file entry's scope reaches the keys file the API reads", async () => {
    const objs = await render({ files: [valuesFile('oidc.yaml', issuers('refs/heads/main'))] });
    const file = join(dir, 'api-keys.yaml');
    writeFileSync(file, secretData(objs)['api-keys.yaml']!);
    const keys = loadApiConfig({ REDIS_URL: 'redis://r:6379', OPS_API_KEYS_FILE: file }).apiKeys;
    expect(keys.find((k) => k.id === 'ci-scoped')?.scope).toEqual({ hosts: ['web-01'] });
  });

  test('a change of the rules rolls no pod (the file is re-read in place)', async () => {
    const a = await render({ files: [valuesFile('a.yaml', issuers('refs/heads/main'))] });
    const b = await render({ files: [valuesFile('b.yaml', issuers('refs/heads/release'))] });
    expect(one(a, 'ConfigMap', 'opsgate-oidc').data).not.toEqual(one(b, 'ConfigMap', 'opsgate-oidc').data);
    // The Secret's checksum follows the chart's generated passwords, different at each render; the config's is the one at stake.
    for (const d of ['opsgate-api', 'opsgate-worker']) {
      const [ta, tb] = [one(a, 'Deployment', d).spec.template, one(b, 'Deployment', d).spec.template];
      expect(ta.metadata.annotations['checksum/config']).toBe(tb.metadata.annotations['checksum/config']);
      expect(ta.spec.volumes).toEqual(tb.spec.volumes);
    }
  });

  test('without issuers: no ConfigMap, no OPS_OIDC_FILE, no token mounted for it', async () => {
    const objs = await render({});
    expect(find(objs, 'ConfigMap', 'opsgate-oidc')).toEqual([]);
    expect(containerEnv(objs, 'opsgate-api').OPS_OIDC_FILE).toBeUndefined();
    expect(apiPod(objs).volumes.map((v: { name: string }) => v.name)).not.toContain('oidc');
    expect(apiPod(objs).automountServiceAccountToken).toBe(false);
    expect(find(objs, 'ClusterRoleBinding')).toEqual([]);
    expect(find(objs, 'Role', 'opsgate-api-oidc-apiserver')).toEqual([]);
  });

  test.each([
    [
      'an unknown kind',
      '/kind',
      '    - {issuer: https://a.example, kind: okta, audience: opsgate, rules: [{match: {sub: a}, owner: a, role: operator}]}\n',
    ],
    [
      'an http issuer',
      '/issuer',
      '    - {issuer: http://a.example, kind: generic, audience: opsgate, rules: [{match: {sub: a}, owner: a, role: operator}]}\n',
    ],
    ['no rules', '/rules', '    - {issuer: https://a.example, kind: generic, audience: opsgate, rules: []}\n'],
    [
      'may_override that is not a boolean',
      '/rules/0/may_override',
      '    - {issuer: https://a.example, kind: generic, audience: opsgate, rules: [{match: {sub: a}, owner_claim: sub, owner: a, role: operator, may_override: "yes"}]}\n',
    ],
    [
      'a field it does not know',
      '',
      '    - {issuer: https://a.example, kind: generic, audience: opsgate, allow_all: true, rules: [{match: {sub: a}, owner: a, role: operator}]}\n',
    ],
  ])('the schema refuses %s', async (_name, where, entry) => {
    const err = await renderError({ files: [valuesFile('bad.yaml', `oidc:\n  issuers:\n${entry}`)] });
    expect(err).toMatch(/values don't meet the specifications of the schema/);
    expect(err).toMatch(new RegExp(`at '/oidc/issuers/0${where}'`));
  });
});
