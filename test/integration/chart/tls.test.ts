import { describe, expect, jest, test } from '@jest/globals';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { ROOT, find, one, render, renderError, renderNotes, run, type K8sObject } from '../../helpers/helm.js';

/**
 * TLS inside the cluster as the chart renders it (ci/tls-values.yaml: a cert-manager Certificate,
 * mutual TLS on /webhook/alerts, Traefik, a ServiceMonitor): the Secret mounted whole into both
 * pods, the variables pointing into it, HTTPS probes, the ServiceMonitor and Traefik verifying with
 * the CA for a name the certificate holds, and no rollout when only the certificate changes.
 */
jest.setTimeout(120_000);

const SERVER_NAME = 'opsgate-api.opsgate.svc';
const podSpec = (objs: K8sObject[], name: string) => one(objs, 'Deployment', name).spec.template.spec;
const cm = (objs: K8sObject[]) => one(objs, 'ConfigMap', 'opsgate-config').data as Record<string, string>;

describe('tls-values.yaml: cert-manager, mutual TLS, Traefik, ServiceMonitor', () => {
  let objs: K8sObject[];
  test('renders', async () => {
    objs = await render({ files: ['tls-values.yaml'] });
  });

  test('a Certificate for both Services (and the extra names), its Secret the one the pods mount', () => {
    const cert = one(objs, 'Certificate', 'opsgate');
    expect(cert.apiVersion).toBe('cert-manager.io/v1');
    expect(cert.spec.secretName).toBe('opsgate-tls');
    expect(cert.spec.issuerRef).toEqual({ name: 'opsgate-ca', kind: 'ClusterIssuer', group: 'cert-manager.io' });
    expect(cert.spec.dnsNames).toEqual(
      expect.arrayContaining([SERVER_NAME, 'opsgate-api', 'opsgate-worker.opsgate.svc', 'opsgate.internal.example.com']),
    );
    expect(cert.spec.privateKey.rotationPolicy).toBe('Always');
    expect(cert.spec.usages).toContain('server auth');
  });

  test('the ConfigMap points every TLS variable into the mounted Secrets; both pods mount them whole (no subPath), read-only', () => {
    expect(cm(objs)).toMatchObject({
      TLS_CERT_FILE: '/etc/opsgate-tls/tls.crt',
      TLS_KEY_FILE: '/etc/opsgate-tls/tls.key',
      METRICS_TLS_CERT_FILE: '/etc/opsgate-tls/tls.crt',
      METRICS_TLS_KEY_FILE: '/etc/opsgate-tls/tls.key',
      TLS_CLIENT_CA_FILE: '/etc/opsgate-client-ca/ca.crt',
      TLS_CLIENT_ALLOWED_NAMES: 'URI:spiffe://cluster.local/ns/monitoring/sa/alertmanager,CN=alertmanager',
      TLS_RELOAD_INTERVAL_MS: '10000',
    });
    for (const name of ['opsgate-api', 'opsgate-worker']) {
      const spec = podSpec(objs, name);
      const tls = spec.volumes.find((v: any) => v.name === 'tls');
      expect([name, tls.secret.secretName]).toEqual([name, 'opsgate-tls']);
      const mounts = spec.containers[0].volumeMounts;
      for (const m of mounts) expect([name, m.name, m.subPath]).toEqual([name, m.name, undefined]);
      expect(mounts.find((m: any) => m.name === 'tls')).toEqual({ name: 'tls', mountPath: '/etc/opsgate-tls', readOnly: true });
    }
    // The client CA only where it is used: the API.
    const ca = podSpec(objs, 'opsgate-api').volumes.find((v: any) => v.name === 'tls-client-ca');
    expect(ca.secret.secretName).toBe('alertmanager-client-ca');
    expect(podSpec(objs, 'opsgate-worker').volumes.some((v: any) => v.name === 'tls-client-ca')).toBe(false);
  });

  test('the API Service listens on 443 (HTTPS) unless api.service.port says otherwise; its port name stays http', async () => {
    expect(one(objs, 'Service', 'opsgate-api').spec.ports[0]).toEqual({ name: 'http', port: 443, targetPort: 'http', protocol: 'TCP' });
    const other = await render({ files: ['tls-values.yaml'], set: { 'api.service.port': '8443' } });
    expect(one(other, 'Service', 'opsgate-api').spec.ports[0].port).toBe(8443);
    const plain = await render({ files: ['tls-values.yaml'], set: { 'tls.enabled': 'false', 'tls.clientAuth.enabled': 'false' } });
    expect(one(plain, 'Service', 'opsgate-api').spec.ports[0].port).toBe(80);
  });

  test('probes use HTTPS', () => {
    const api = podSpec(objs, 'opsgate-api').containers[0];
    for (const p of ['startupProbe', 'livenessProbe', 'readinessProbe']) expect([p, api[p].httpGet.scheme]).toEqual([p, 'HTTPS']);
    expect(podSpec(objs, 'opsgate-worker').containers[0].livenessProbe.httpGet.scheme).toBe('HTTPS');
  });

  test('the ServiceMonitor scrapes over HTTPS, verifying with the Secret CA for a name the certificate holds', () => {
    const ep = one(objs, 'ServiceMonitor', 'opsgate').spec.endpoints[0];
    expect(ep.scheme).toBe('https');
    expect(ep.tlsConfig).toEqual({ serverName: SERVER_NAME, ca: { secret: { name: 'opsgate-tls', key: 'ca.crt' } } });
    expect(one(objs, 'Certificate', 'opsgate').spec.dnsNames).toContain(ep.tlsConfig.serverName);
  });

  test('Traefik talks HTTPS to the pods through a ServersTransport that verifies them with the CA', () => {
    const svc = one(objs, 'Service', 'opsgate-api');
    expect(svc.metadata.annotations).toMatchObject({
      'traefik.ingress.kubernetes.io/service.serversscheme': 'https',
      'traefik.ingress.kubernetes.io/service.serverstransport': 'opsgate-opsgate-backend@kubernetescrd',
    });
    const st = one(objs, 'ServersTransport', 'opsgate-backend');
    expect(st.apiVersion).toBe('traefik.io/v1alpha1');
    // The annotation's <namespace>-<name>@kubernetescrd names exactly this object.
    expect(`${st.metadata.namespace}-${st.metadata.name}@kubernetescrd`).toBe(
      svc.metadata.annotations!['traefik.ingress.kubernetes.io/service.serverstransport'],
    );
    expect(st.spec).toEqual({ serverName: SERVER_NAME, rootCAs: [{ secret: 'opsgate-tls' }] });
    // No client certificate: a request through the Ingress never passes the mutual-TLS check.
    expect(st.spec.certificatesSecrets).toBeUndefined();
    // The worker's Service is not behind the Ingress.
    expect(one(objs, 'Service', 'opsgate-worker').metadata.annotations).toBeUndefined();
  });

  test('the helm test pod checks /health over HTTPS with the CA only (readable by its user)', () => {
    const pod = one(objs, 'Pod', 'opsgate-test-health');
    expect(pod.spec.containers[0].command.join(' ')).toContain(`--cacert /etc/opsgate-ca/ca.crt "https://${SERVER_NAME}:443/health"`);
    expect(pod.spec.volumes.find((v: any) => v.name === 'ca').secret).toEqual({
      secretName: 'opsgate-tls',
      items: [{ key: 'ca.crt', path: 'ca.crt', mode: 0o444 }],
    });
  });

  test('NOTES.txt: curl with the CA for the certificate name, and Alertmanager with tls_config', async () => {
    const notes = await renderNotes('tls-values.yaml');
    expect(notes).toContain(`--cacert opsgate-ca.crt --resolve ${SERVER_NAME}:8080:127.0.0.1`);
    expect(notes).toContain(`ogcurl -s https://${SERVER_NAME}:8080/health`);
    expect(notes).toContain('http_config.tls_config.ca_file');
    expect(notes).toContain('http_config.tls_config.cert_file/key_file');
    expect(notes).toContain(`url: https://${SERVER_NAME}:443/webhook/alerts`);
    expect(notes).toContain(
      'allowed certificates (TLS_CLIENT_ALLOWED_NAMES): URI:spiffe://cluster.local/ns/monitoring/sa/alertmanager, CN=alertmanager; any other: 403',
    );
    for (const secret of ['fake-alerts-token-0008', 'fake-operator-key-0008']) expect(notes).not.toContain(secret);
  });
});

describe('where the certificate comes from', () => {
  test('tls.existingSecret: no Certificate; the pods, the ServiceMonitor and Traefik use that Secret', async () => {
    const objs = await render({
      files: ['tls-values.yaml'],
      set: { 'tls.certManager.issuerRef.name': '', 'tls.existingSecret': 'my-opsgate-tls', 'tls.clientAuth.caSecret': '' },
    });
    expect(find(objs, 'Certificate')).toHaveLength(0);
    expect(podSpec(objs, 'opsgate-api').volumes.find((v: any) => v.name === 'tls').secret.secretName).toBe('my-opsgate-tls');
    expect(one(objs, 'ServiceMonitor', 'opsgate').spec.endpoints[0].tlsConfig.ca.secret.name).toBe('my-opsgate-tls');
    expect(one(objs, 'ServersTransport', 'opsgate-backend').spec.rootCAs).toEqual([{ secret: 'my-opsgate-tls' }]);
    // Without a client CA Secret of its own, the client CA is the TLS Secret's CA.
    expect(cm(objs).TLS_CLIENT_CA_FILE).toBe('/etc/opsgate-tls/ca.crt');
    expect(podSpec(objs, 'opsgate-api').volumes.some((v: any) => v.name === 'tls-client-ca')).toBe(false);
  });

  test('off by default: no TLS variables, volumes, Certificate or ServersTransport; probes and scrapes over HTTP', async () => {
    const objs = await render({ files: ['all-integrations-values.yaml'] });
    // The client certificates opsgate presents to Prometheus and Alertmanager are not the TLS it serves.
    expect(Object.keys(cm(objs)).filter((k) => k.includes('TLS') && !/^(PROMETHEUS|ALERTMANAGER)_TLS_/.test(k))).toEqual([]);
    for (const name of ['opsgate-api', 'opsgate-worker'])
      expect(podSpec(objs, name).volumes.some((v: any) => v.name === 'tls')).toBe(false);
    expect(find(objs, 'Certificate')).toHaveLength(0);
    expect(find(objs, 'ServersTransport')).toHaveLength(0);
    expect(one(objs, 'ServiceMonitor', 'opsgate').spec.endpoints[0].scheme).toBeUndefined();
  });

  test('metrics over plain HTTP on request (tls.metrics=false): the API alone serves HTTPS', async () => {
    const objs = await render({ files: ['tls-values.yaml'], set: { 'tls.metrics': 'false' } });
    expect(cm(objs).TLS_CERT_FILE).toBe('/etc/opsgate-tls/tls.crt');
    expect(cm(objs).METRICS_TLS_CERT_FILE).toBeUndefined();
    expect(one(objs, 'ServiceMonitor', 'opsgate').spec.endpoints[0].scheme).toBeUndefined();
    expect(podSpec(objs, 'opsgate-worker').containers[0].livenessProbe.httpGet.scheme).toBeUndefined();
    expect(podSpec(objs, 'opsgate-worker').volumes.some((v: any) => v.name === 'tls')).toBe(false);
  });

  test('ingressBackend none: no Traefik objects or annotations', async () => {
    const objs = await render({ files: ['tls-values.yaml'], set: { 'tls.ingressBackend': 'none' } });
    expect(find(objs, 'ServersTransport')).toHaveLength(0);
    expect(one(objs, 'Service', 'opsgate-api').metadata.annotations).toBeUndefined();
  });

  test.each([
    [
      { 'tls.certManager.issuerRef.name': '' },
      /tls\.enabled needs a certificate: tls\.existingSecret .* or tls\.certManager\.issuerRef\.name/,
    ],
    [{ 'tls.existingSecret': 'mine' }, /tls\.existingSecret and tls\.certManager\.issuerRef\.name are both set/],
    [{ 'tls.enabled': 'false' }, /tls\.clientAuth\.enabled needs tls\.enabled/],
    [{ 'tls.ingressBackend': 'nginx' }, /ingressBackend/],
    [{ 'tls.reloadIntervalMs': '10' }, /reloadIntervalMs/],
  ])('refused: %j', async (set, message) => {
    expect(await renderError({ files: ['tls-values.yaml'], set })).toMatch(message);
  });
});

describe('tls.clientAuth.allowedNames: which certificates of the client CA may post alerts', () => {
  test('empty (the default): no TLS_CLIENT_ALLOWED_NAMES, and NOTES.txt warns that every certificate of the issuer passes', async () => {
    // The defaults with mutual TLS on, the CA being the TLS Secret's own (a cluster issuer's).
    const set = { 'tls.enabled': 'true', 'tls.existingSecret': 'my-opsgate-tls', 'tls.clientAuth.enabled': 'true' };
    const objs = await render({ files: ['defaults-values.yaml'], set });
    expect(cm(objs).TLS_CLIENT_CA_FILE).toBe('/etc/opsgate-tls/ca.crt');
    expect(cm(objs).TLS_CLIENT_ALLOWED_NAMES).toBeUndefined();
    const notes = await renderNotes('defaults-values.yaml', set);
    expect(notes).toContain(
      'WARNING: tls.clientAuth.allowedNames is empty: every certificate the issuer of "my-opsgate-tls" (any workload it serves) signed is accepted',
    );
  });

  test('a change of the list rolls the api pods (the ConfigMap checksum): no connection outlives it', async () => {
    const [base, changed] = await Promise.all([
      render({ files: ['tls-values.yaml'] }),
      render({ files: ['tls-values.yaml'], set: { 'tls.clientAuth.allowedNames[0]': 'DNS:alertmanager.monitoring.svc' } }),
    ]);
    expect(cm(changed).TLS_CLIENT_ALLOWED_NAMES).toBe('DNS:alertmanager.monitoring.svc,CN=alertmanager');
    const checksum = (objs: K8sObject[]) => one(objs, 'Deployment', 'opsgate-api').spec.template.metadata.annotations['checksum/config'];
    expect(checksum(changed)).not.toBe(checksum(base));
  });

  test.each([
    ['alertmanager'],
    // Helm's --set takes "\\," as a comma inside the value: two entries in one.
    ['DNS:a\\,DNS:b'],
    ['URI:spiffe://x y'],
    ['dns:alertmanager'],
    ['CN='],
  ])('the schema refuses the entry %j', async (entry) => {
    const err = await renderError({ files: ['tls-values.yaml'], set: { 'tls.clientAuth.allowedNames[0]': entry } });
    expect(err).toMatch(/values don't meet the specifications of the schema/);
    expect(err).toMatch(/allowedNames/);
  });
});

describe('a renewed certificate rolls no pod', () => {
  const annotations = (objs: K8sObject[], name: string) => one(objs, 'Deployment', name).spec.template.metadata.annotations;
  test('changing only what the certificate is (its lifetime, names) leaves both pod templates as they were; turning TLS on rolls them', async () => {
    const [base, renewed, plain] = await Promise.all([
      render({ files: ['tls-values.yaml'] }),
      render({
        files: ['tls-values.yaml'],
        set: {
          'tls.certManager.duration': '720h',
          'tls.certManager.renewBefore': '240h',
          'tls.certManager.extraDnsNames': '{opsgate.other.example.com}',
        },
      }),
      render({ files: ['tls-values.yaml'], set: { 'tls.enabled': 'false', 'tls.clientAuth.enabled': 'false' } }),
    ]);
    expect(one(renewed, 'Certificate', 'opsgate').spec.duration).toBe('720h');
    for (const name of ['opsgate-api', 'opsgate-worker']) {
      expect(one(renewed, 'Deployment', name).spec.template).toEqual(one(base, 'Deployment', name).spec.template);
      expect(annotations(plain, name)['checksum/config']).not.toBe(annotations(base, name)['checksum/config']);
    }
  });
});

describe('k8s/examples/alertmanager-receiver-tls.yaml', () => {
  const file = join(ROOT, 'k8s/examples/alertmanager-receiver-tls.yaml');
  test('an HTTPS receiver for the name the chart certificate holds, with tls_config.ca_file and a client certificate', async () => {
    const am = parseYaml(readFileSync(file, 'utf8'));
    const wh = am.receivers.find((r: any) => r.name === 'opsgate').webhook_configs[0];
    const url = new URL(wh.url);
    expect(url.protocol).toBe('https:');
    expect(url.pathname).toBe('/webhook/alerts');
    const objs = await render({ files: ['tls-values.yaml'] });
    expect(one(objs, 'Certificate', 'opsgate').spec.dnsNames).toContain(url.hostname);
    expect(wh.http_config.tls_config.ca_file).toMatch(/ca\.crt$/);
    expect(wh.http_config.tls_config.cert_file).toBeTruthy();
    expect(wh.http_config.tls_config.key_file).toBeTruthy();
  });
  test('Alertmanager accepts it (amtool check-config)', async () => {
    const r = await run(process.env.AMTOOL ?? 'amtool', ['check-config', file]);
    expect(r.stdout + r.stderr).toMatch(/SUCCESS/);
    expect(r.code).toBe(0);
  });
});
