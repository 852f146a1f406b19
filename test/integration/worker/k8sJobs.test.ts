import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtempSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Queue } from 'bullmq';
import { JOB, QUEUE_NAME, defaultJobOptions } from '../../../src/shared/jobs.js';
import type { Inventory } from '../../../src/shared/inventory.js';
import { freePort, startRedis, type RedisServer } from '../../helpers/redis.js';
import { startWorker, type WorkerHandle } from '../../../worker/index.js';
import { kubeConfigFromEnv, loadKubeConfig, type KubeConfigFactory } from '../../../src/shared/kubeconfig.js';
import { kubeConfigForToken } from '../../../worker/k8s.js';
import { audit, collectLogs, metricValue, testMetrics, waitForFinal, workerConfig } from '../../helpers/workerSupport.js';

/**
 * restart_service and run_deploy_pipeline through the real queue and worker, for everything that
 * does not need a cluster (the real kube-apiserver suite is test/e2e/controlplane/**): the inventory and ref
 * allow-lists, a missing cluster configuration, an unreachable API server and rejected credentials.
 */
const inventory: Inventory = {
  remediations: [],
  hosts: { 'web-1': { namespace: 'shop', deployments: ['frontend', 'api'] } },
  projects: {
    'group/shop': {
      namespace: 'shop-deploy',
      serviceAccountName: 'deployer',
      image: 'registry.example/deploy:1',
      command: ['/bin/deploy'],
      refs: ['refs/heads/main'],
      env: {},
      activeDeadlineSeconds: 900,
      backoffLimit: 0,
      ttlSecondsAfterFinished: 3600,
      waitForCompletion: true,
      deploy_from: 'push',
    },
  },
};

let redis: RedisServer;
let queue: Queue;
let handle: WorkerHandle | undefined;
let emptyHome: string;

beforeAll(async () => {
  redis = await startRedis();
  queue = new Queue(QUEUE_NAME, { connection: { url: redis.url }, defaultJobOptions: defaultJobOptions({ attempts: 3, backoffMs: 100 }) });
  emptyHome = mkdtempSync(join(tmpdir(), 'opsgate-home-'));
});

afterEach(async () => {
  await handle?.close(2000);
  handle = undefined;
});

afterAll(async () => {
  await queue.close();
  await redis.destroy();
  rmSync(emptyHome, { recursive: true, force: true });
});

async function start(kubeConfig: KubeConfigFactory) {
  const logs = collectLogs();
  const metrics = testMetrics();
  handle = await startWorker(workerConfig({ REDIS_URL: redis.url, ROLLOUT_POLL_INTERVAL_MS: '100' }), {
    logger: logs.logger,
    metrics,
    inventory,
    kubeConfig,
  });
  return { logs, metrics };
}

/** The environment of a worker that has no cluster configuration at all. */
const noClusterEnv = () => ({ HOME: emptyHome });

describe('missing cluster configuration', () => {
  it('loadKubeConfig names what it looked for', async () => {
    await expect(loadKubeConfig(noClusterEnv())).rejects.toThrow(
      /^no Kubernetes configuration: KUBECONFIG is not set, ~\/\.kube\/config does not exist and this process is not running in a cluster/,
    );
    await expect(loadKubeConfig({ KUBECONFIG: join(emptyHome, 'missing.yaml') })).rejects.toThrow(
      `no Kubernetes configuration: KUBECONFIG names ${join(emptyHome, 'missing.yaml')}, which does not exist`,
    );
    // In-cluster variables without a mounted token are not a configuration either.
    await expect(
      loadKubeConfig({ ...noClusterEnv(), KUBERNETES_SERVICE_HOST: '10.0.0.1', KUBERNETES_SERVICE_PORT: '443' }, { pathPrefix: emptyHome }),
    ).rejects.toThrow(/^no Kubernetes configuration/);
  });

  it('loadKubeConfig finds ~/.kube/config and the in-cluster ServiceAccount', async () => {
    const home = mkdtempSync(join(tmpdir(), 'opsgate-home-'));
    try {
      mkdirSync(join(home, '.kube'));
      writeFileSync(
        join(home, '.kube', 'config'),
        [
          'apiVersion: v1',
          'kind: Config',
          'clusters: [{name: c, cluster: {server: "https://10.1.2.3:6443"}}]',
          'users: [{name: u, user: {token: abc}}]',
          'contexts: [{name: x, context: {cluster: c, user: u}}]',
          'current-context: x',
        ].join('\n'),
      );
      expect((await loadKubeConfig({ HOME: home })).getCurrentCluster()?.server).toBe('https://10.1.2.3:6443');

      const sa = join(home, 'sa');
      mkdirSync(join(sa, 'var/run/secrets/kubernetes.io/serviceaccount'), { recursive: true });
      writeFileSync(join(sa, 'var/run/secrets/kubernetes.io/serviceaccount/token'), 'tok');
      const kc = await loadKubeConfig(
        { HOME: emptyHome, KUBERNETES_SERVICE_HOST: '10.0.0.1', KUBERNETES_SERVICE_PORT: '443' },
        { pathPrefix: sa },
      );
      expect(kc.getCurrentCluster()?.server).toBe('https://10.0.0.1:443');
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  });

  it('dead-letters restart_service and run_deploy_pipeline at once with a clear reason', async () => {
    const { logs, metrics } = await start(kubeConfigFromEnv(noClusterEnv()));
    const restart = await queue.add(JOB.restartService, { host: 'web-1', service: 'frontend', ...audit });
    const deploy = await queue.add(JOB.runDeployPipeline, { project: 'group/shop', ref: 'refs/heads/main', ...audit });

    for (const id of [restart.id!, deploy.id!]) {
      const { state, job } = await waitForFinal(queue, id);
      expect(state).toBe('failed');
      expect(job.attemptsMade).toBe(1); // 3 allowed: not retried
      expect(job.failedReason).toMatch(/^no Kubernetes configuration: KUBECONFIG is not set/);
    }
    expect(logs.find('job dead-lettered')).toHaveLength(2);
    expect(await metricValue(metrics, 'opsgate_jobs_processed_total', { outcome: 'dead_lettered' })).toBe(2);
  });
});

describe('allow-lists (checked again by the worker)', () => {
  it('dead-letters a host/service or project/ref that is not in the inventory, before touching the cluster', async () => {
    let factoryCalls = 0;
    await start(() => {
      factoryCalls++;
      return loadKubeConfig(noClusterEnv());
    });
    const cases = [
      { name: JOB.restartService, data: { host: 'db-9', service: 'frontend' }, reason: 'host "db-9" is not in the inventory' },
      {
        name: JOB.restartService,
        data: { host: 'web-1', service: 'payments' },
        reason: 'service "payments" is not a Deployment of host "web-1" in the inventory',
      },
      { name: JOB.restartService, data: { host: '__proto__', service: 'frontend' }, reason: 'host "__proto__" is not in the inventory' },
      {
        name: JOB.runDeployPipeline,
        data: { project: 'group/other', ref: 'refs/heads/main' },
        reason: 'project "group/other" is not in the inventory',
      },
      {
        name: JOB.runDeployPipeline,
        data: { project: 'group/shop', ref: 'refs/heads/evil' },
        reason: 'ref "refs/heads/evil" is not allowed for project "group/shop"',
      },
    ];
    for (const c of cases) {
      const job = await queue.add(c.name, { ...c.data, ...audit });
      const { state, job: failed } = await waitForFinal(queue, job.id!);
      expect(state).toBe('failed');
      expect(failed.attemptsMade).toBe(1);
      expect(failed.failedReason).toBe(c.reason);
    }
    expect(factoryCalls).toBe(0);
  });
});

describe('the pushed commit (checked by the worker, whatever queued it)', () => {
  it('a run_deploy_pipeline whose commit is not a safe name is dead-lettered with the reason before any Kubernetes client exists', async () => {
    let factoryCalls = 0;
    const { logs, metrics } = await start(() => {
      factoryCalls++;
      return loadKubeConfig(noClusterEnv());
    });
    for (const sha of ['--orphan=x', 'HEAD~3']) {
      const job = await queue.add(JOB.runDeployPipeline, { project: 'group/shop', ref: 'refs/heads/main', sha, ...audit });
      const { state, job: failed } = await waitForFinal(queue, job.id!);
      expect(state).toBe('failed');
      expect(failed.attemptsMade).toBe(1); // 3 allowed: not retried
      expect(failed.failedReason).toBe(
        `commit ${JSON.stringify(sha)} is not a safe commit name for the deploy Job: it must start with a letter or digit and hold only letters, digits, ".", "_" and "-" (at most 255 characters)`,
      );
    }
    // No cluster configuration was even loaded: no Job can have been created.
    expect(factoryCalls).toBe(0);
    expect(logs.find('job dead-lettered')).toHaveLength(2);
    expect(await metricValue(metrics, 'opsgate_jobs_processed_total', { outcome: 'dead_lettered' })).toBe(2);

    // The same job with a commit id goes on to the cluster (here: none configured).
    const ok = await queue.add(JOB.runDeployPipeline, {
      project: 'group/shop',
      ref: 'refs/heads/main',
      sha: '6113728f27ae82c7b1a177c8d03f9e96e0adf246',
      ...audit,
    });
    const { job: reached } = await waitForFinal(queue, ok.id!);
    expect(reached.failedReason).toMatch(/^no Kubernetes configuration/);
    expect(factoryCalls).toBe(1);
  });
});

describe('Kubernetes API failures', () => {
  let apiServer: Server;
  let apiPort: number;
  const seen: string[] = [];

  beforeAll(async () => {
    // An API server that refuses every credential, like kube-apiserver with an invalid token.
    apiServer = createServer((req, res) => {
      seen.push(`${req.method} ${req.url} ${req.headers['content-type'] ?? ''} ${req.headers.authorization ?? ''}`);
      res.writeHead(401, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({ kind: 'Status', apiVersion: 'v1', status: 'Failure', message: 'Unauthorized', reason: 'Unauthorized', code: 401 }),
      );
    });
    await new Promise<void>((r) => apiServer.listen(0, '127.0.0.1', r));
    apiPort = (apiServer.address() as AddressInfo).port;
  });
  afterAll(async () => {
    apiServer.closeAllConnections();
    await new Promise((r) => apiServer.close(r));
  });

  it('401 from the API server dead-letters at once with a clear reason; the token is not in it', async () => {
    const token = 'sa-token-abcdef0123456789';
    const { logs } = await start(() => kubeConfigForToken(`http://127.0.0.1:${apiPort}`, token, { skipTLSVerify: true }));
    const job = await queue.add(JOB.restartService, { host: 'web-1', service: 'api', ...audit });
    const { state, job: failed } = await waitForFinal(queue, job.id!);
    expect(state).toBe('failed');
    expect(failed.attemptsMade).toBe(1);
    expect(failed.failedReason).toBe(
      "Kubernetes API rejected the worker's credentials (401 Unauthorized) while trying to read Deployment shop/api; check the kubeconfig or ServiceAccount token",
    );
    // What reached the server: the read kubectl makes before it patches (is it paused?), with the
    // bearer token; refused, so nothing was patched.
    expect(seen).toContain(`GET /apis/apps/v1/namespaces/shop/deployments/api  Bearer ${token}`);
    expect(seen.filter((l) => l.startsWith('PATCH'))).toEqual([]);
    expect(logs.lines.join('\n')).not.toContain(token);
  });

  it('an unreachable API server is retried, then dead-lettered with the reason', async () => {
    const closedPort = await freePort();
    const { metrics } = await start(() => kubeConfigForToken(`http://127.0.0.1:${closedPort}`, 'tok', { skipTLSVerify: true }));
    const job = await queue.add(JOB.runDeployPipeline, { project: 'group/shop', ref: 'refs/heads/main', ...audit });
    const { state, job: failed } = await waitForFinal(queue, job.id!, 60000);
    expect(state).toBe('failed');
    expect(failed.attemptsMade).toBe(3);
    expect(failed.failedReason).toMatch(
      /^Kubernetes API unreachable while trying to create Job shop-deploy\/opsgate-deploy-group-shop-[0-9a-f]{12}: ECONNREFUSED$/,
    );
    expect(await metricValue(metrics, 'opsgate_job_retries_total', { name: JOB.runDeployPipeline })).toBe(2);
  }, 90000);
});
