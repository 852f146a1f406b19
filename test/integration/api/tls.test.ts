import { connect } from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { connect as tlsConnect, type TLSSocket } from 'node:tls';
import type { AddressInfo } from 'node:net';
import { Agent } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { freePort, startRedis, type RedisServer } from '../../helpers/redis.js';
import { API_ENTRY, WORKER_ENTRY, spawnNode, type OpsProcess } from '../../helpers/processes.js';
import { RO_KEY, SCM_SECRET } from '../../helpers/apiHarness.js';
import { httpsCall, makeCa, makeLeaf, SecretVolume, type Pem } from '../../helpers/certs.js';
import { waitFor } from '../../helpers/waitFor.js';
import { createListener, loadTlsMaterial } from '../../../src/shared/tls.js';

/**
 * TLS on the real processes (dist/, spawned): HTTPS on the API and metrics ports from a Secret
 * volume laid out as the kubelet writes it, a renewal picked up under a live keep-alive client and
 * a request in flight, a bad renewal refused, a plaintext client closed cleanly, and mutual TLS on
 * /webhook/alerts. Clients are real HTTPS clients verifying the server against the test's CA.
 */
const PROCESS_TIMEOUT = 120_000;
const ALERTS_TOKEN = 'alerts-token-0006-abcdef';

let srv: RedisServer;
let dir: string;
let ca: Pem;
let certA: Pem;
let certB: Pem;
let clientCa: Pem;
let client: Pem;
let rogueCa: Pem;
let rogueClient: Pem;
// One issuer for every workload of a cluster (the chart's default client CA: the TLS Secret's ca.crt).
let clusterCa: Pem;
let amByCluster: Pem;
let billing: Pem;
let vmalert: Pem;
const AM_SPIFFE = 'spiffe://cluster.local/ns/monitoring/sa/alertmanager';

beforeAll(async () => {
  srv = await startRedis();
  dir = mkdtempSync(join(tmpdir(), 'opsgate-tls-'));
  ca = makeCa(dir, 'opsgate-test-ca');
  certA = makeLeaf(dir, ca, 'opsgate-a');
  certB = makeLeaf(dir, ca, 'opsgate-b');
  clientCa = makeCa(dir, 'alertmanager-ca');
  client = makeLeaf(dir, clientCa, 'alertmanager', 'client');
  rogueCa = makeCa(dir, 'rogue-ca');
  rogueClient = makeLeaf(dir, rogueCa, 'rogue', 'client');
  clusterCa = makeCa(dir, 'cluster-issuer');
  amByCluster = makeLeaf(dir, clusterCa, 'alertmanager', 'client', [`URI:${AM_SPIFFE}`, 'DNS:alertmanager.monitoring.svc']);
  billing = makeLeaf(dir, clusterCa, 'billing', 'client', ['URI:spiffe://cluster.local/ns/billing/sa/billing', 'DNS:billing.billing.svc']);
  vmalert = makeLeaf(dir, clusterCa, 'vmalert', 'client');
}, 60_000);
afterAll(async () => {
  await srv?.destroy();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const alerts = JSON.stringify({ alerts: [{ status: 'firing', labels: { alertname: 'Tls' }, fingerprint: `fp-${Date.now()}` }] });

async function metricValue(port: number, name: string, labels: string): Promise<number> {
  const r = await httpsCall({ port, path: '/metrics', ca: ca.cert });
  const line = r.body.split('\n').find((l) => l.startsWith(`${name}{${labels}}`));
  return line ? Number(line.split(' ').pop()) : 0;
}

describe('API and metrics over HTTPS (real process)', () => {
  let vol: SecretVolume;
  let api: OpsProcess;
  let port: number;
  let metricsPort: number;

  beforeAll(async () => {
    vol = new SecretVolume(join(dir, 'api-tls'));
    vol.write({ 'tls.crt': certA.cert, 'tls.key': certA.key, 'ca.crt': clientCa.cert });
    port = await freePort();
    metricsPort = await freePort();
    api = spawnNode(API_ENTRY, {
      env: {
        PORT: String(port),
        METRICS_PORT: String(metricsPort),
        REDIS_URL: srv.url,
        OPS_API_KEY_ROLES: `${RO_KEY}:readonly`,
        SCM_WEBHOOK_SECRET: SCM_SECRET,
        ALERTS_WEBHOOK_TOKEN: ALERTS_TOKEN,
        RATE_LIMIT_RPS: '0',
        TLS_CERT_FILE: vol.path('tls.crt'),
        TLS_KEY_FILE: vol.path('tls.key'),
        TLS_CLIENT_CA_FILE: vol.path('ca.crt'),
        METRICS_TLS_CERT_FILE: vol.path('tls.crt'),
        METRICS_TLS_KEY_FILE: vol.path('tls.key'),
        TLS_RELOAD_INTERVAL_MS: '200',
      },
    });
    await api.waitForLog((l) => l.msg === 'api listening', 60_000);
    await waitFor('API ready over HTTPS', async () => (await httpsCall({ port, path: '/ready', ca: ca.cert })).status === 200, 60_000);
  }, PROCESS_TIMEOUT);
  afterAll(async () => {
    await api?.stop();
  });

  it('serves the certificate of TLS_CERT_FILE on both ports; plaintext HTTP to the HTTPS port is closed without an answer or a crash', async () => {
    expect(api.logs().find((l) => l.msg === 'api listening')).toMatchObject({ scheme: 'https', client_certificates: 'requested' });
    const health = await httpsCall({ port, path: '/health', ca: ca.cert });
    expect(health).toMatchObject({ status: 200, served: certA.fingerprint });
    expect(JSON.parse(health.body)).toEqual({ status: 'ok' });
    const metrics = await httpsCall({ port: metricsPort, path: '/metrics', ca: ca.cert });
    expect(metrics).toMatchObject({ status: 200, served: certA.fingerprint });
    expect(metrics.body).toContain('opsgate_build_info');

    // A plaintext HTTP request: the TLS layer refuses the bytes and closes the connection.
    const plain = await new Promise<{ data: string; closed: boolean }>((resolve, reject) => {
      const s = connect(port, '127.0.0.1', () => s.write('GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n'));
      let data = '';
      s.on('data', (d: Buffer) => (data += d.toString('latin1')));
      s.on('error', () => {}); // a reset is a close too
      s.on('close', () => resolve({ data, closed: true }));
      s.setTimeout(20_000, () => {
        s.destroy();
        reject(new Error('the HTTPS port kept a plaintext connection open'));
      });
    });
    expect(plain.closed).toBe(true);
    expect(plain.data).not.toMatch(/^HTTP\//);
    await expect(fetch(`http://127.0.0.1:${port}/health`)).rejects.toThrow();
    expect(api.exited).toBe(false);
    expect((await httpsCall({ port, path: '/health', ca: ca.cert })).status).toBe(200);
    expect(await metricValue(metricsPort, 'opsgate_tls_handshake_errors_total', 'listener="api"')).toBeGreaterThanOrEqual(2);
    const expiry = await metricValue(metricsPort, 'opsgate_tls_certificate_expiry_timestamp_seconds', 'listener="api"');
    expect(expiry * 1000).toBeGreaterThan(Date.now());
  });

  it(
    'a renewed certificate (the volume swapped under a live keep-alive client) is served to new connections; the kept-alive connection and a request in flight complete',
    async () => {
      // A live client: one kept-alive connection, a request every 250 ms through the whole renewal
      // (which also keeps the connection from idling out).
      const keepAlive = new Agent({ keepAlive: true, maxSockets: 1, ca: ca.cert });
      const live: Array<{ status: number; served: string; reusedSocket: boolean }> = [];
      let stopLive = false;
      const liveLoop = (async () => {
        while (!stopLive) {
          const r = await httpsCall({ port, path: '/health', ca: ca.cert, agent: keepAlive });
          live.push({ status: r.status, served: r.served, reusedSocket: r.reusedSocket });
          await new Promise((res) => setTimeout(res, 250));
        }
      })();
      try {
        await waitFor('the live client to run', () => live.length >= 2);

        // A push whose body is half sent when the certificate changes.
        let release!: () => void;
        const hold = new Promise<void>((r) => (release = r));
        let sent!: () => void;
        const halfSent = new Promise<void>((r) => (sent = r));
        const push = JSON.stringify({
          ref: 'refs/heads/main',
          checkout_sha: `tls-${Date.now()}`,
          project: { path_with_namespace: 'g/tls' },
        });
        const inflight = httpsCall({
          port,
          path: '/webhook/scm',
          method: 'POST',
          ca: ca.cert,
          headers: { 'Content-Type': 'application/json', 'X-Scm-Token': SCM_SECRET, 'X-Scm-Event': 'Push Hook' },
          body: push,
          hold,
          onSent: sent,
        });
        await halfSent;

        vol.write({ 'tls.crt': certB.cert, 'tls.key': certB.key, 'ca.crt': clientCa.cert });
        await waitFor(
          'both listeners to reload the renewed certificate',
          () => api.logs().filter((l) => l.msg === 'tls certificate reloaded' && l.fingerprint === certB.fingerprint).length === 2,
          30_000,
        );
        expect(
          api
            .logs()
            .filter((l) => l.msg === 'tls certificate reloaded')
            .map((l) => l.listener)
            .sort(),
        ).toEqual(['api', 'metrics']);

        // New connections: the new certificate, on both ports.
        expect(await httpsCall({ port, path: '/health', ca: ca.cert })).toMatchObject({ status: 200, served: certB.fingerprint });
        expect(await httpsCall({ port: metricsPort, path: '/metrics', ca: ca.cert })).toMatchObject({
          status: 200,
          served: certB.fingerprint,
        });
        // The request in flight completes, on its connection opened with the old certificate.
        release();
        const done = await inflight;
        expect(done.status).toBe(202);
        expect(JSON.parse(done.body)).toMatchObject({ accepted: true });
        expect(done.served).toBe(certA.fingerprint);
        // The live client went on after the renewal on the connection it had, never dropped.
        const n = live.length;
        await waitFor('more live requests after the renewal', () => live.length >= n + 2);
        stopLive = true;
        await liveLoop;
        expect(live.every((r) => r.status === 200 && r.served === certA.fingerprint)).toBe(true);
        expect(live.slice(1).every((r) => r.reusedSocket)).toBe(true);
        expect(await metricValue(metricsPort, 'opsgate_tls_reloads_total', 'listener="api",outcome="reloaded"')).toBe(1);
      } finally {
        stopLive = true;
        await liveLoop.catch(() => {});
        keepAlive.destroy();
      }
    },
    PROCESS_TIMEOUT,
  );

  it('an invalid renewal (key of another certificate, then no certificate at all) is refused and logged; the last good certificate stays; a valid one is taken', async () => {
    vol.write({ 'tls.crt': certA.cert, 'tls.key': certB.key, 'ca.crt': clientCa.cert });
    const refused = await api.waitForLog(
      (l) => l.msg === 'tls reload refused: keeping the certificate in use' && l.listener === 'api',
      30_000,
    );
    expect(refused).toMatchObject({ level: 'error', variable: 'TLS_KEY_FILE', problem: 'does not match the certificate of TLS_CERT_FILE' });
    expect(await httpsCall({ port, path: '/health', ca: ca.cert })).toMatchObject({ status: 200, served: certB.fingerprint });
    expect(await metricValue(metricsPort, 'opsgate_tls_reloads_total', 'listener="api",outcome="refused"')).toBe(1);

    vol.write({ 'tls.crt': 'not a certificate\n', 'tls.key': certA.key, 'ca.crt': clientCa.cert });
    await waitFor(
      'the second refusal',
      () =>
        api
          .logs()
          .some(
            (l) => l.msg === 'tls reload refused: keeping the certificate in use' && l.listener === 'api' && l.variable === 'TLS_CERT_FILE',
          ),
      30_000,
    );
    expect(await httpsCall({ port, path: '/health', ca: ca.cert })).toMatchObject({ status: 200, served: certB.fingerprint });
    expect(api.exited).toBe(false);

    vol.write({ 'tls.crt': certA.cert, 'tls.key': certA.key, 'ca.crt': clientCa.cert });
    await waitFor(
      'the valid renewal',
      async () => (await httpsCall({ port, path: '/health', ca: ca.cert })).served === certA.fingerprint,
      30_000,
    );
    // Refused once per bad set, not once per poll.
    expect(await metricValue(metricsPort, 'opsgate_tls_reloads_total', 'listener="api",outcome="refused"')).toBe(2);
    expect(api.lines.join('\n')).not.toContain('PRIVATE KEY');
  });

  describe('mutual TLS on /webhook/alerts (TLS_CLIENT_CA_FILE and ALERTS_WEBHOOK_TOKEN both set: both required)', () => {
    const post = (opts: { clientCert?: Pem; token?: string }) =>
      httpsCall({
        port,
        path: '/webhook/alerts',
        method: 'POST',
        ca: ca.cert,
        ...(opts.clientCert ? { clientCert: opts.clientCert } : {}),
        headers: { 'Content-Type': 'application/json', ...(opts.token ? { Authorization: `Bearer ${opts.token}` } : {}) },
        body: alerts,
      });

    it('no certificate or one of another CA: 403 {detail, code}; a trusted certificate still needs the token; both: 202; other paths need no certificate', async () => {
      // No list of allowed names: every certificate of the CA is accepted, and the start said so.
      expect(
        api
          .logs()
          .find((l) => l.level === 'warn' && String(l.msg).startsWith('TLS_CLIENT_CA_FILE is set without TLS_CLIENT_ALLOWED_NAMES')),
      ).toBeDefined();
      const none = await post({ token: ALERTS_TOKEN });
      expect(none.status).toBe(403);
      expect(JSON.parse(none.body)).toEqual({ detail: 'a client certificate is required', code: 'client_certificate_required' });
      const rogue = await post({ clientCert: rogueClient, token: ALERTS_TOKEN });
      expect(rogue.status).toBe(403);
      expect(JSON.parse(rogue.body)).toEqual({
        detail: 'client certificate is not signed by a trusted CA',
        code: 'untrusted_client_certificate',
      });
      const noToken = await post({ clientCert: client });
      expect(noToken.status).toBe(401);
      const ok = await post({ clientCert: client, token: ALERTS_TOKEN });
      expect(ok.status).toBe(202);
      expect(JSON.parse(ok.body)).toMatchObject({ received: 1, firing: 1 });
      expect((await httpsCall({ port, path: '/health', ca: ca.cert })).status).toBe(200);
      const audit = await waitFor('the audit line of the accepted delivery', () =>
        api.logs().find((l) => l.msg === 'audit' && l.path === '/webhook/alerts' && l.status === 202),
      );
      expect(audit.client_certificate).toMatch(/^cert:[0-9a-f]{12}$/);
      expect(await metricValue(metricsPort, 'opsgate_auth_failures_total', 'scheme="client_certificate",reason="untrusted"')).toBe(1);
    });

    it('the CA file reloads like the certificate: a CA added to it is trusted on new connections', async () => {
      vol.write({ 'tls.crt': certA.cert, 'tls.key': certA.key, 'ca.crt': clientCa.cert + rogueCa.cert });
      await waitFor(
        'the rogue CA to be trusted',
        async () => (await post({ clientCert: rogueClient, token: ALERTS_TOKEN })).status === 202,
        30_000,
      );
      vol.write({ 'tls.crt': certA.cert, 'tls.key': certA.key, 'ca.crt': clientCa.cert });
      await waitFor(
        'the rogue CA to be dropped',
        async () => (await post({ clientCert: rogueClient, token: ALERTS_TOKEN })).status === 403,
        30_000,
      );
      expect((await post({ clientCert: client, token: ALERTS_TOKEN })).status).toBe(202);
    });
  });
});

/** Alerts to /webhook/alerts (no token configured: the client certificate is the only gate). */
const postAlerts = (port: number, clientCert: Pem | undefined, agent?: Agent) =>
  httpsCall({
    port,
    path: '/webhook/alerts',
    method: 'POST',
    ca: ca.cert,
    ...(clientCert ? { clientCert } : {}),
    ...(agent ? { agent } : {}),
    headers: { 'Content-Type': 'application/json' },
    body: alerts,
  });

/** A keep-alive client presenting `cert`: two deliveries on one connection, which it returns. */
async function keptAlive(port: number, cert: Pem): Promise<{ agent: Agent; socket: TLSSocket }> {
  const agent = new Agent({ keepAlive: true, maxSockets: 1, ca: ca.cert, cert: cert.cert, key: cert.key });
  const first = await postAlerts(port, cert, agent);
  const second = await postAlerts(port, cert, agent);
  expect([first.status, second.status, second.reusedSocket, second.socket === first.socket]).toEqual([202, 202, true, true]);
  return { agent, socket: first.socket };
}

/** Requests every 200 ms on one kept-alive connection presenting no certificate, until stopped. */
function liveWithoutCertificate(port: number) {
  const agent = new Agent({ keepAlive: true, maxSockets: 1, ca: ca.cert });
  const seen: Array<{ status: number; reusedSocket: boolean }> = [];
  let stop = false;
  const loop = (async () => {
    while (!stop) {
      const r = await httpsCall({ port, path: '/health', ca: ca.cert, agent });
      seen.push({ status: r.status, reusedSocket: r.reusedSocket });
      await new Promise((res) => setTimeout(res, 200));
    }
  })();
  return {
    seen,
    async stop() {
      stop = true;
      await loop.catch(() => {});
      agent.destroy();
    },
  };
}

describe('allowed client certificates on /webhook/alerts: a CA that signs for every workload (real process)', () => {
  const spawnApi = async (vol: SecretVolume, env: Record<string, string>) => {
    const port = await freePort();
    const p = spawnNode(API_ENTRY, {
      env: {
        PORT: String(port),
        METRICS_PORT: String(await freePort()),
        REDIS_URL: srv.url,
        OPS_API_KEY_ROLES: `${RO_KEY}:readonly`,
        RATE_LIMIT_RPS: '0',
        TLS_CERT_FILE: vol.path('tls.crt'),
        TLS_KEY_FILE: vol.path('tls.key'),
        TLS_CLIENT_CA_FILE: vol.path('ca.crt'),
        TLS_RELOAD_INTERVAL_MS: '200',
        ...env,
      },
    });
    await p.waitForLog((l) => l.msg === 'api listening', 60_000);
    await waitFor('API ready over HTTPS', async () => (await httpsCall({ port, path: '/ready', ca: ca.cert })).status === 200, 60_000);
    return { p, port };
  };

  describe('TLS_CLIENT_ALLOWED_NAMES', () => {
    let vol: SecretVolume;
    let api: OpsProcess;
    let port: number;
    beforeAll(async () => {
      vol = new SecretVolume(join(dir, 'allowed-env-tls'));
      vol.write({ 'tls.crt': certA.cert, 'tls.key': certA.key, 'ca.crt': clusterCa.cert });
      ({ p: api, port } = await spawnApi(vol, { TLS_CLIENT_ALLOWED_NAMES: `URI:${AM_SPIFFE}, CN=vmalert` }));
    }, PROCESS_TIMEOUT);
    afterAll(async () => {
      await api?.stop();
    });

    it("another workload's certificate of the same CA, not on the list: 403 {detail, code}; a listed one, by URI or by subject: 202", async () => {
      expect(api.logs().find((l) => l.msg === 'api listening')).toMatchObject({
        client_certificates: 'requested',
        client_allowed_names: [`URI:${AM_SPIFFE}`, 'CN=vmalert'],
      });
      expect(api.logs().some((l) => l.level === 'warn' && String(l.msg).includes('TLS_CLIENT_ALLOWED_NAMES'))).toBe(false);

      const other = await postAlerts(port, billing);
      expect(other.status).toBe(403);
      expect(JSON.parse(other.body)).toEqual({
        detail: 'client certificate is not on the list of allowed names',
        code: 'client_certificate_not_allowed',
      });
      expect((await postAlerts(port, undefined)).status).toBe(403);

      const am = await postAlerts(port, amByCluster);
      expect(am.status).toBe(202);
      expect(JSON.parse(am.body)).toMatchObject({ received: 1, firing: 1 });
      expect((await postAlerts(port, vmalert)).status).toBe(202);
      const audits = await waitFor('the audit lines of both accepted deliveries', () => {
        const a = api.logs().filter((l) => l.msg === 'audit' && l.path === '/webhook/alerts' && l.status === 202);
        return a.length === 2 ? a : false;
      });
      expect(audits.map((a) => a.client_name)).toEqual([`URI:${AM_SPIFFE}`, 'CN=vmalert']);
      const refused = api.logs().find((l) => l.msg === 'audit' && l.path === '/webhook/alerts' && l.status === 403);
      expect(refused).toBeDefined();
    });

    it(
      'a changed CA closes the connections that presented a certificate before it; their next request is judged again; connections without one stay',
      async () => {
        const live = liveWithoutCertificate(port);
        const { agent, socket } = await keptAlive(port, amByCluster);
        try {
          await waitFor('the live client to run', () => live.seen.length >= 2);
          // The cluster issuer is no longer trusted: only Alertmanager's own CA is.
          vol.write({ 'tls.crt': certA.cert, 'tls.key': certA.key, 'ca.crt': clientCa.cert });
          const changed = await api.waitForLog(
            (l) => l.msg === 'tls client CA changed: connections that presented a client certificate closed',
            30_000,
          );
          expect(changed).toMatchObject({ listener: 'api', closed: 1 });
          await waitFor('the kept-alive connection closed', () => socket.destroyed, 5_000);
          const next = await postAlerts(port, amByCluster, agent);
          expect([next.status, next.reusedSocket]).toEqual([403, false]);
          expect(JSON.parse(next.body)).toEqual({
            detail: 'client certificate is not signed by a trusted CA',
            code: 'untrusted_client_certificate',
          });
          const n = live.seen.length;
          await waitFor('the live client to go on', () => live.seen.length >= n + 2);
        } finally {
          await live.stop();
          agent.destroy();
        }
        expect(live.seen.every((r) => r.status === 200)).toBe(true);
        expect(live.seen.slice(1).every((r) => r.reusedSocket)).toBe(true);
      },
      PROCESS_TIMEOUT,
    );
  });

  describe('TLS_CLIENT_ALLOWED_NAMES_FILE', () => {
    let vol: SecretVolume;
    let names: SecretVolume;
    let api: OpsProcess;
    let port: number;
    beforeAll(async () => {
      vol = new SecretVolume(join(dir, 'allowed-file-tls'));
      vol.write({ 'tls.crt': certA.cert, 'tls.key': certA.key, 'ca.crt': clusterCa.cert });
      names = new SecretVolume(join(dir, 'allowed-file-names'));
      names.write({ 'allowed-names': `# Alertmanager, by its ServiceAccount\nURI:${AM_SPIFFE}\n` });
      ({ p: api, port } = await spawnApi(vol, { TLS_CLIENT_ALLOWED_NAMES_FILE: names.path('allowed-names') }));
    }, PROCESS_TIMEOUT);
    afterAll(async () => {
      await api?.stop();
    });

    it(
      'a changed list applies at once and closes the connections that presented a certificate before it; an emptied file is refused',
      async () => {
        expect((await postAlerts(port, billing)).status).toBe(403);
        const { agent, socket } = await keptAlive(port, amByCluster);
        try {
          names.write({ 'allowed-names': 'DNS:billing.billing.svc\n' });
          const reloaded = await api.waitForLog(
            (l) => l.msg === 'credentials reloaded' && l.variable === 'TLS_CLIENT_ALLOWED_NAMES_FILE',
            30_000,
          );
          expect(reloaded).toMatchObject({ allowed_names: ['DNS:billing.billing.svc'], closed_connections: 1 });
          await waitFor('the kept-alive connection closed', () => socket.destroyed, 5_000);
          const next = await postAlerts(port, amByCluster, agent);
          expect([next.status, next.reusedSocket]).toEqual([403, false]);
          expect((await postAlerts(port, billing)).status).toBe(202);
        } finally {
          agent.destroy();
        }

        // An emptied file would let every certificate of the CA in: refused, the last list stays.
        names.write({ 'allowed-names': '# nobody\n' });
        const refused = await api.waitForLog((l) => l.msg === 'credentials reload refused: keeping the ones in use', 30_000);
        expect(refused).toMatchObject({
          variable: 'TLS_CLIENT_ALLOWED_NAMES_FILE',
          problems: [{ variable: 'TLS_CLIENT_ALLOWED_NAMES_FILE', problem: expect.stringContaining('lists no name') }],
        });
        expect((await postAlerts(port, amByCluster)).status).toBe(403);
        expect((await postAlerts(port, billing)).status).toBe(202);
      },
      PROCESS_TIMEOUT,
    );
  });
});

describe('createListener: a handshake under way when the client CA changes (in process)', () => {
  it('a connection accepted before the change and verified after it is closed at the end of its handshake; a later one is served', async () => {
    const vol = new SecretVolume(join(dir, 'listener-tls'));
    vol.write({ 'tls.crt': certA.cert, 'tls.key': certA.key, 'ca.crt': clusterCa.cert });
    const files = {
      certFile: vol.path('tls.crt'),
      keyFile: vol.path('tls.key'),
      caFile: vol.path('ca.crt'),
      vars: { cert: 'TLS_CERT_FILE', key: 'TLS_KEY_FILE', ca: 'TLS_CLIENT_CA_FILE' },
    };
    const { server, clientConnections } = createListener((_req, res) => res.end('ok'), {
      tls: { files, material: loadTlsMaterial(files), intervalMs: 60_000 },
      listener: 'api',
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const port = (server.address() as AddressInfo).port;
    const connections = () => new Promise<number>((resolve, reject) => server.getConnections((e, n) => (e ? reject(e) : resolve(n))));
    try {
      // Accepted (TCP), its handshake not begun: then the change.
      const raw = connect(port, '127.0.0.1');
      await new Promise<void>((resolve) => raw.once('connect', () => resolve()));
      await waitFor('the server to accept the connection', async () => (await connections()) === 1);
      expect(clientConnections!.closeAll()).toBe(0);
      // The handshake now, verified by the context the connection was accepted with.
      const late = tlsConnect({ socket: raw, ca: ca.cert, cert: amByCluster.cert, key: amByCluster.key, servername: 'localhost' });
      let answered = '';
      late.on('data', (d: Buffer) => (answered += d.toString('latin1')));
      late.on('error', () => {}); // a reset is a close too
      late.once('secureConnect', () => late.write('GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n'));
      await waitFor('the late connection closed', () => late.destroyed || late.closed, 10_000);
      expect(answered).toBe('');
      // Accepted after the change: served.
      const after = await httpsCall({ port, path: '/', ca: ca.cert, clientCert: amByCluster });
      expect([after.status, after.body]).toEqual([200, 'ok']);
    } finally {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
});

describe('worker metrics over HTTPS (real process)', () => {
  it(
    'METRICS_TLS_CERT_FILE/METRICS_TLS_KEY_FILE: /metrics and /livez over HTTPS',
    async () => {
      const vol = new SecretVolume(join(dir, 'worker-tls'));
      vol.write({ 'tls.crt': certB.cert, 'tls.key': certB.key });
      const metricsPort = await freePort();
      const w = spawnNode(WORKER_ENTRY, {
        env: {
          REDIS_URL: srv.url,
          METRICS_PORT: String(metricsPort),
          METRICS_TLS_CERT_FILE: vol.path('tls.crt'),
          METRICS_TLS_KEY_FILE: vol.path('tls.key'),
        },
      });
      try {
        expect(await w.waitForLog((l) => l.msg === 'metrics listening', 60_000)).toMatchObject({ scheme: 'https' });
        const m = await httpsCall({ port: metricsPort, path: '/metrics', ca: ca.cert });
        expect(m).toMatchObject({ status: 200, served: certB.fingerprint });
        expect(m.body).toContain('component="worker"');
        expect((await httpsCall({ port: metricsPort, path: '/livez', ca: ca.cert })).served).toBe(certB.fingerprint);
      } finally {
        await w.stop();
      }
    },
    PROCESS_TIMEOUT,
  );
});

describe('start-up refusals (real process)', () => {
  it.each([
    { name: 'a certificate without its key', env: (v: SecretVolume) => ({ TLS_CERT_FILE: v.path('tls.crt') }), variable: 'TLS_KEY_FILE' },
    {
      name: 'a key that does not match the certificate',
      env: (v: SecretVolume) => ({ TLS_CERT_FILE: v.path('tls.crt'), TLS_KEY_FILE: v.path('other.key') }),
      variable: 'TLS_KEY_FILE',
    },
    {
      name: 'an unreadable certificate',
      env: (v: SecretVolume) => ({ TLS_CERT_FILE: v.path('missing.crt'), TLS_KEY_FILE: v.path('tls.key') }),
      variable: 'TLS_CERT_FILE',
    },
    {
      name: 'a client CA without TLS',
      env: (v: SecretVolume) => ({ TLS_CLIENT_CA_FILE: v.path('tls.crt') }),
      variable: 'TLS_CLIENT_CA_FILE',
    },
    {
      name: 'an allowed name that is not DNS:<name>, URI:<uri> or <ATTR>=<value>',
      env: (v: SecretVolume) => ({
        TLS_CERT_FILE: v.path('tls.crt'),
        TLS_KEY_FILE: v.path('tls.key'),
        TLS_CLIENT_CA_FILE: v.path('tls.crt'),
        TLS_CLIENT_ALLOWED_NAMES: 'URI:spiffe://cluster.local/ns/monitoring/sa/alertmanager,alertmanager',
      }),
      variable: 'TLS_CLIENT_ALLOWED_NAMES',
    },
  ])(
    '$name -> exit 1, one stderr line naming $variable, no key material',
    async ({ env, variable }) => {
      const vol = new SecretVolume(join(dir, `refusal-${variable}-${Date.now()}`));
      vol.write({ 'tls.crt': certA.cert, 'tls.key': certA.key, 'other.key': certB.key });
      const p = spawnNode(API_ENTRY, {
        env: {
          PORT: String(await freePort()),
          METRICS_PORT: String(await freePort()),
          REDIS_URL: srv.url,
          OPS_API_KEY_ROLES: `${RO_KEY}:readonly`,
          ...env(vol),
        },
      });
      try {
        const exit = await p.waitExit(60_000);
        expect(exit.code).toBe(1);
        const stderr = p.stderr.filter((l) => l !== '');
        expect(stderr).toHaveLength(1);
        expect(stderr[0]).toMatch(new RegExp(`^opsgate-api: configuration error: ${variable}: `));
        expect([...p.lines, ...p.stderr].join('\n')).not.toContain('PRIVATE KEY');
      } finally {
        await p.stop();
      }
    },
    PROCESS_TIMEOUT,
  );
});
