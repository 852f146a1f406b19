import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { useCluster } from '../../helpers/cluster.js';
import { adminKubeConfig, createNamespaces, deleteNamespaces } from '../../helpers/controlPlaneFixtures.js';
import { runDeployJobs, type DeployJobs, type RanJob } from '../../helpers/deployJobs.js';
import { startApi, startWorkerProcess, type OpsProcess } from '../../helpers/processes.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { apiEnv, makeSecrets, post, scmPush, waitFor, workerEnv } from '../../helpers/reliability.js';

jest.setTimeout(180_000);

/**
 * Deploys in order across restarts: the real API and worker processes (dist/), a real Redis, the
 * real kube-apiserver and Job controller of the shared control plane (test/helpers/deployJobs.ts
 * ends each Job's pod, no kubelet runs here). Pushes of one project are accepted, the API and the
 * worker are stopped with SIGTERM while a deploy Job runs and started again, more pushes are
 * accepted, and the worker is SIGKILLed while a deploy Job runs and started again. Every accepted
 * deploy ends succeeded or superseded, one Job at a time, in the order they were accepted, and the
 * history lists each of them, what it held before the restarts unchanged.
 */
const NS = 'drst-deploy';
const PROJECT = 'group/app';
/** How long a Job's pod runs before it is ended: long enough to stop the processes during it. */
const RUN_MS = 1500;
const secrets = makeSecrets('deploy-restart');
const scmHeaders = { 'X-Scm-Token': secrets.scm, 'X-Scm-Event': 'Push Hook' };

type Deploy = { id: string; commit: string; state: string; superseded_by: string | null; kubernetes_job: string | null } & Record<
  string,
  unknown
>;

describe('deploys of one group while the API and the worker restart', () => {
  let cluster: Awaited<ReturnType<typeof useCluster>>;
  let kube: DeployJobs;
  let redis: RedisServer;
  let dir: string;
  let apiVars: Record<string, string | undefined>;
  let workerVars: Record<string, string | undefined>;
  let api: (OpsProcess & { baseUrl: string }) | undefined;
  let worker: OpsProcess | undefined;

  beforeAll(async () => {
    cluster = await useCluster();
    const admin = adminKubeConfig(cluster);
    await createNamespaces(cluster, [NS]);
    await admin.makeApiClient(k8s.CoreV1Api).createNamespacedServiceAccount({ namespace: NS, body: { metadata: { name: 'deployer' } } });
    kube = await runDeployJobs(admin, NS, RUN_MS);
    redis = await startRedis();
    dir = mkdtempSync(join(tmpdir(), 'opsgate-deploy-restart-'));
    const inventory = join(dir, 'inventory.json');
    writeFileSync(
      inventory,
      JSON.stringify({ projects: { [PROJECT]: { namespace: NS, serviceAccountName: 'deployer', image: 'alpine:3.20' } } }),
    );
    apiVars = await apiEnv(redis.url, secrets, { OPS_INVENTORY_FILE: inventory });
    workerVars = await workerEnv(redis.url, {
      OPS_INVENTORY_FILE: inventory,
      KUBECONFIG: cluster.kubeconfigPath,
      ROLLOUT_POLL_INTERVAL_MS: '100',
      // A killed worker's deploy is found stalled within seconds, not the default half minute.
      WORKER_LOCK_DURATION_MS: '3000',
      WORKER_STALLED_INTERVAL_MS: '1000',
    });
    api = await startApi({ env: apiVars });
    worker = await startWorkerProcess({ env: workerVars });
  }, 240_000); // starts a cluster when run outside make test-k8s

  afterAll(async () => {
    await api?.stop();
    await worker?.stop();
    await kube?.close();
    await redis?.destroy();
    if (dir) rmSync(dir, { recursive: true, force: true });
    if (cluster) {
      await deleteNamespaces(cluster, [NS]);
      await cluster.release();
    }
  }, 120_000);

  const push = async (sha: string) => {
    const res = await post(`${api!.baseUrl}/webhook/scm`, scmPush(PROJECT, sha), scmHeaders);
    expect({ status: res.status, body: res.json }).toMatchObject({ status: 202, body: { accepted: true, duplicate: false } });
    return res.json!.job_id as string;
  };
  const history = async (): Promise<Deploy[]> => {
    const res = await fetch(`${api!.baseUrl}/ops/deploys?project=${encodeURIComponent(PROJECT)}`, {
      headers: { 'X-API-Key': secrets.readonlyKey },
    });
    expect(res.status).toBe(200);
    return ((await res.json()) as { deploys: Deploy[] }).deploys;
  };
  const aJobRunning = (not: RanJob[] = []) =>
    waitFor('a deploy Job running', () => kube.jobs.find((j) => j.ended === undefined && !not.includes(j)), 30_000, 50);

  it('every accepted deploy ends succeeded or superseded, one Job at a time, the newest last, and the history lists them all', async () => {
    const accepted: string[] = [];
    for (const sha of ['rst1', 'rst2', 'rst3']) accepted.push(await push(sha));
    const first = await aJobRunning();

    // SIGTERM to both while the Job runs: the worker lets the deploy end within its grace period.
    api!.kill('SIGTERM');
    worker!.kill('SIGTERM');
    expect(await api!.waitExit()).toEqual({ code: 0, signal: null });
    expect(await worker!.waitExit()).toEqual({ code: 0, signal: null });
    // The deploy that ran when they stopped ended first: its Job completed, the worker saw it.
    await waitFor('the running Job ended', () => first.ended !== undefined, 10_000, 50);
    expect(first).toMatchObject({ succeeded: true });
    api = await startApi({ env: apiVars });
    worker = await startWorkerProcess({ env: workerVars });
    for (const sha of ['rst4', 'rst5']) accepted.push(await push(sha));

    // SIGKILL of the worker while a Job runs: its deploy is found stalled and waited for again.
    const killedDuring = await aJobRunning([first]);
    const before = (await history()).filter((d) => d.state === 'succeeded' || d.state === 'superseded');
    expect(before.find((d) => d.id === first.queueJobId)).toMatchObject({ state: 'succeeded', kubernetes_job: first.name });
    worker.kill('SIGKILL');
    expect((await worker.waitExit()).signal).toBe('SIGKILL');
    worker = await startWorkerProcess({ env: workerVars });

    const deploys = await waitFor(
      'every accepted deploy ended',
      async () => {
        const list = await history();
        return list.length === accepted.length && list.every((d) => d.state === 'succeeded' || d.state === 'superseded') ? list : false;
      },
      90_000,
      250,
    );
    // Nothing lost: every accepted deploy, newest first, and nothing else.
    expect(deploys.map((d) => d.id)).toEqual([...accepted].reverse());
    expect(deploys.map((d) => d.commit)).toEqual(['rst5', 'rst4', 'rst3', 'rst2', 'rst1']);
    const [newest] = deploys;
    expect(newest).toMatchObject({ state: 'succeeded', superseded_by: null });
    // What the history held before the SIGKILL is unchanged.
    for (const d of before) expect(deploys.find((x) => x.id === d.id)).toEqual(d);

    // One Job at a time, in the order the deploys were accepted, the newest created and ended last.
    expect(kube.mostAtOnce).toBe(1);
    const order = kube.jobs.map((j) => accepted.indexOf(j.queueJobId));
    expect(order).toEqual([...order].sort((a, b) => a - b));
    expect(kube.jobs.at(-1)).toMatchObject({ name: newest!.kubernetes_job, sha: 'rst5', succeeded: true });
    expect(Math.max(...kube.jobs.map((j) => j.ended!))).toBe(kube.jobs.at(-1)!.ended);
    // The killed worker's deploy ran once: its Job waited for again, not created twice.
    expect(kube.jobs.filter((j) => j.queueJobId === killedDuring.queueJobId)).toHaveLength(1);
    expect(deploys.find((d) => d.id === killedDuring.queueJobId)).toMatchObject({ state: 'succeeded', kubernetes_job: killedDuring.name });
    for (const d of deploys) {
      const job = kube.jobs.find((j) => j.queueJobId === d.id);
      if (d.state === 'succeeded') {
        expect(job).toMatchObject({ name: d.kubernetes_job, succeeded: true });
      } else {
        expect(accepted.indexOf(d.superseded_by!)).toBeGreaterThan(accepted.indexOf(d.id));
        expect({ id: d.id, job, kubernetes_job: d.kubernetes_job }).toEqual({ id: d.id, job: undefined, kubernetes_job: null });
      }
    }
  });
});
