import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { KubeConfig } from '@kubernetes/client-node';
import request from 'supertest';
import { freePort, startRedis, type RedisServer } from '../../helpers/redis.js';
import { createKubeHostStatusProvider } from '../../../src/domain/kubeHostStatus.js';
import { findKubeConfig, kubeConfigFromEnv, loadKubeConfig, NoKubeConfigError } from '../../../src/shared/kubeconfig.js';
import { createHarness, OP_KEY, RO_KEY, type Harness } from '../../helpers/apiHarness.js';

/**
 * GET /ops/hosts/:host with the real provider (@kubernetes/client-node AppsV1Api) talking HTTP to a
 * small local server that answers readNamespacedDeployment like kube-apiserver does (the full
 * control-plane test lives with the cluster tests in test/e2e/controlplane). Cached in the real Redis for 30 s,
 * cleared by DELETE /ops/cache.
 */
let srv: RedisServer;
let h: Harness;
let api: Server;
let calls: string[] = [];
let replicasReady = 2;
let answerStatus = 200;

const deployment = (ns: string, name: string) => ({
  apiVersion: 'apps/v1',
  kind: 'Deployment',
  metadata: { name, namespace: ns },
  spec: {
    replicas: 3,
    template: { metadata: { annotations: name === 'frontend' ? { 'kubectl.kubernetes.io/restartedAt': '2026-11-20T10:00:00Z' } : {} } },
  },
  status: { replicas: 3, readyReplicas: replicasReady, updatedReplicas: 3, availableReplicas: replicasReady },
});

beforeAll(async () => {
  srv = await startRedis();
  api = createServer((req, res) => {
    calls.push(`${req.method} ${req.url}`);
    const m = /^\/apis\/apps\/v1\/namespaces\/([^/]+)\/deployments\/([^/?]+)/.exec(req.url ?? '');
    res.setHeader('Content-Type', 'application/json');
    if (answerStatus !== 200) {
      res.statusCode = answerStatus;
      res.end(JSON.stringify({ kind: 'Status', apiVersion: 'v1', status: 'Failure', code: answerStatus, reason: 'Forbidden' }));
      return;
    }
    if (!m || m[2] === 'checkout') {
      res.statusCode = 404;
      res.end(JSON.stringify({ kind: 'Status', apiVersion: 'v1', status: 'Failure', reason: 'NotFound', code: 404 }));
      return;
    }
    res.end(JSON.stringify(deployment(m[1]!, m[2]!)));
  });
  await new Promise<void>((r) => api.listen(0, '127.0.0.1', () => r()));
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: 'local', server: `http://127.0.0.1:${(api.address() as AddressInfo).port}`, skipTLSVerify: true }],
    users: [{ name: 'u', token: 'test-token' }],
    contexts: [{ name: 'ctx', cluster: 'local', user: 'u' }],
    currentContext: 'ctx',
  });
  h = await createHarness(srv.url, { hostStatus: createKubeHostStatusProvider(() => kc) });
});
afterAll(async () => {
  await h?.close();
  await srv?.destroy();
  await new Promise<void>((r) => (api ? api.close(() => r()) : r()));
});
beforeEach(async () => {
  await h.inspect.flushall();
  calls = [];
  replicasReady = 2;
  answerStatus = 200;
});

const get = (host: string, key = RO_KEY) => request(h.app).get(`/ops/hosts/${host}`).set('X-API-Key', key);

describe('GET /ops/hosts/:host', () => {
  it('reports replicas/ready/updated/last restart of each Deployment; a missing one is found:false', async () => {
    const res = await get('web-1');
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({
      host: 'web-1',
      namespace: 'shop',
      cached: false,
      deployments: [
        { name: 'frontend', found: true, replicas: 3, ready: 2, updated: 3, available: 2, restarted_at: '2026-11-20T10:00:00Z' },
        { name: 'checkout', found: false, replicas: null, ready: 0, updated: 0, restarted_at: null },
      ],
    });
    expect(calls.sort()).toEqual([
      'GET /apis/apps/v1/namespaces/shop/deployments/checkout',
      'GET /apis/apps/v1/namespaces/shop/deployments/frontend',
    ]);
  });
  it('is cached in Redis for 30 s: a second call does not reach the API server', async () => {
    await get('db-1');
    replicasReady = 0;
    const second = await get('db-1');
    expect(second.body.cached).toBe(true);
    expect(second.body.deployments[0].ready).toBe(2);
    expect(calls).toHaveLength(1);
    const ttl = await h.inspect.ttl('opsgate:cache:host-status:db-1');
    expect(ttl).toBeGreaterThan(25);
    expect(ttl).toBeLessThanOrEqual(30);
  });
  it('DELETE /ops/cache clears it: the next call reads live status', async () => {
    await get('db-1');
    replicasReady = 1;
    const del = await request(h.app).delete('/ops/cache').set('X-API-Key', OP_KEY);
    expect(del.body).toEqual({ cleared: true });
    const res = await get('db-1');
    expect(res.body.cached).toBe(false);
    expect(res.body.deployments[0].ready).toBe(1);
    expect(calls).toHaveLength(2);
  });
  it('unknown host -> 404 without calling the cluster', async () => {
    const res = await get('nope-1');
    expect(res.status).toBe(404);
    expect(res.body).toEqual({ detail: 'unknown host', code: 'unknown_host' });
    expect(calls).toHaveLength(0);
  });
  it('no key -> 401; any valid key (readonly or operator) -> 200', async () => {
    expect((await request(h.app).get('/ops/hosts/web-1')).status).toBe(401);
    expect((await get('web-1', OP_KEY)).status).toBe(200);
  });
  it('API server refusing (403) -> 503 {detail} + Retry-After, nothing cached', async () => {
    answerStatus = 403;
    const res = await get('web-1');
    expect(res.status).toBe(503);
    expect(res.headers['retry-after']).toBeDefined();
    expect(res.body.detail).toMatch(/Kubernetes API answered 403/);
    expect(await h.inspect.exists('opsgate:cache:host-status:web-1')).toBe(0);
  });
  it('Redis down: the cache is skipped and the status is still served live', async () => {
    const own = await startRedis();
    const kc = new KubeConfig();
    kc.loadFromOptions({
      clusters: [{ name: 'local', server: `http://127.0.0.1:${(api.address() as AddressInfo).port}`, skipTLSVerify: true }],
      users: [{ name: 'u', token: 't' }],
      contexts: [{ name: 'ctx', cluster: 'local', user: 'u' }],
      currentContext: 'ctx',
    });
    const hh = await createHarness(own.url, { hostStatus: createKubeHostStatusProvider(() => kc) });
    try {
      await own.stop();
      const res = await request(hh.app).get('/ops/hosts/db-1').set('X-API-Key', RO_KEY);
      expect(res.body).toMatchObject({ host: 'db-1' });
      expect(res.status).toBe(200);
      expect(res.body.cached).toBe(false);
    } finally {
      await hh.close();
      await own.destroy();
    }
  });
});

describe('no cluster reachable', () => {
  it('no kubeconfig / in-cluster account -> 503 {detail}', async () => {
    const none = await createHarness(srv.url); // the harness default: the real provider with no KubeConfig
    try {
      const res = await request(none.app).get('/ops/hosts/web-1').set('X-API-Key', RO_KEY);
      expect(res.status).toBe(503);
      expect(res.body.detail).toMatch(/no Kubernetes cluster configured/);
      expect(res.headers['retry-after']).toBeDefined();
    } finally {
      await none.close();
    }
  });
  it('API server address refusing connections -> 503 {detail}', async () => {
    const kc = new KubeConfig();
    kc.loadFromOptions({
      // client-node refuses plain http unless skipTLSVerify is set; set it so the failure is the connection.
      clusters: [{ name: 'gone', server: `http://127.0.0.1:${await freePort()}`, skipTLSVerify: true }],
      users: [{ name: 'u', token: 't' }],
      contexts: [{ name: 'ctx', cluster: 'gone', user: 'u' }],
      currentContext: 'ctx',
    });
    const gone = await createHarness(srv.url, { hostStatus: createKubeHostStatusProvider(() => kc, { timeoutMs: 3000 }) });
    try {
      const res = await request(gone.app).get('/ops/hosts/web-1').set('X-API-Key', RO_KEY);
      expect(res.status).toBe(503);
      expect(res.body).toEqual({ detail: 'Kubernetes API unavailable; retry later', code: 'cluster_unavailable' });
    } finally {
      await gone.close();
    }
  });
  it('loadKubeConfig finds nothing in an empty environment (no silent localhost:8080 fallback)', async () => {
    await expect(loadKubeConfig({ HOME: '/nonexistent-home' })).rejects.toThrow(NoKubeConfigError);
  });
});

describe("the environment's configuration (what src/server.ts uses: read by the worker's loader, client-node loaded on first use)", () => {
  const writeKubeConfig = (file: string) => {
    const kc = new KubeConfig();
    kc.loadFromOptions({
      clusters: [{ name: 'local', server: `http://127.0.0.1:${(api.address() as AddressInfo).port}`, skipTLSVerify: true }],
      users: [{ name: 'u', token: 'test-token' }],
      contexts: [{ name: 'ctx', cluster: 'local', user: 'u' }],
      currentContext: 'ctx',
    });
    writeFileSync(file, kc.exportConfig());
  };

  it('reads the cluster named by KUBECONFIG on the first request', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'opsgate-kubeconfig-'));
    const file = join(dir, 'config');
    writeKubeConfig(file);
    const fromEnv = await createHarness(srv.url, { hostStatus: createKubeHostStatusProvider(kubeConfigFromEnv({ KUBECONFIG: file })) });
    try {
      const res = await request(fromEnv.app).get('/ops/hosts/web-1').set('X-API-Key', RO_KEY);
      expect(res.status).toBe(200);
      expect(res.body.deployments.find((d: { name: string }) => d.name === 'frontend')).toMatchObject({
        found: true,
        restarted_at: '2026-11-20T10:00:00Z',
      });
      expect(calls.some((c) => c.startsWith('GET /apis/apps/v1/namespaces/'))).toBe(true);
    } finally {
      await fromEnv.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('with no configuration it answers 503, and finds one that appears later on the next request', async () => {
    const home = mkdtempSync(join(tmpdir(), 'opsgate-home-'));
    const fromEnv = await createHarness(srv.url, { hostStatus: createKubeHostStatusProvider(kubeConfigFromEnv({ HOME: home })) });
    try {
      const res = await request(fromEnv.app).get('/ops/hosts/web-1').set('X-API-Key', RO_KEY);
      expect(res.status).toBe(503);
      expect(res.body).toEqual({
        detail: 'no Kubernetes cluster configured (no kubeconfig or in-cluster service account)',
        code: 'cluster_unavailable',
      });
      mkdirSync(join(home, '.kube'));
      writeKubeConfig(join(home, '.kube', 'config'));
      const again = await request(fromEnv.app).get('/ops/hosts/web-1').set('X-API-Key', RO_KEY);
      expect(again.status).toBe(200);
    } finally {
      await fromEnv.close();
      rmSync(home, { recursive: true, force: true });
    }
  });

  it('findKubeConfig follows the loader, without reading a file: KUBECONFIG, ~/.kube/config, in-cluster', () => {
    const dir = mkdtempSync(join(tmpdir(), 'opsgate-kubeconfig-'));
    try {
      const file = join(dir, 'config');
      writeFileSync(file, 'not yaml at all: [');
      expect(findKubeConfig({ KUBECONFIG: file })).toEqual({ kind: 'files', name: 'KUBECONFIG', files: [file] });
      expect(() => findKubeConfig({ KUBECONFIG: join(dir, 'missing') })).toThrow(NoKubeConfigError);
      expect(() =>
        findKubeConfig({ HOME: dir, KUBERNETES_SERVICE_HOST: '10.0.0.1', KUBERNETES_SERVICE_PORT: '443' }, { pathPrefix: dir }),
      ).toThrow(NoKubeConfigError);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
