import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Queue } from 'bullmq';
import { JOB, QUEUE_NAME } from '../../../src/shared/jobs.js';
import { freePort, startRedis, type RedisServer } from '../../helpers/redis.js';
import { startApi, startWorkerProcess, type OpsProcess } from '../../helpers/processes.js';
import { startReceiver, waitForFinal, type Receiver } from '../../helpers/workerSupport.js';

/**
 * Durability proof (work accepted by the API must survive an API process restart): two real
 * processes sharing only Redis. The API accepts webhooks while no worker is running, is SIGKILLed
 * (no graceful anything), and only then is the worker started: every job the API accepted is
 * processed.
 */
let redis: RedisServer;
let receiver: Receiver;
let queue: Queue;
let dir: string;
const procs: OpsProcess[] = [];

beforeAll(async () => {
  redis = await startRedis({ persistence: true });
  receiver = await startReceiver();
  queue = new Queue(QUEUE_NAME, { connection: { url: redis.url } });
  dir = mkdtempSync(join(tmpdir(), 'opsgate-durability-'));
  writeFileSync(
    join(dir, 'inventory.yaml'),
    [
      'hosts: {}',
      'projects:',
      '  group/shop:',
      '    namespace: shop-deploy',
      '    serviceAccountName: deployer',
      '    image: registry.example/deploy:1',
      '    refs: [refs/heads/main]',
    ].join('\n'),
  );
});

afterAll(async () => {
  await Promise.all(procs.map((p) => p.stop()));
  await queue.close();
  await receiver.close();
  await redis.destroy();
  rmSync(dir, { recursive: true, force: true });
});

describe('durability across an API crash', () => {
  it('jobs accepted by the API before it is SIGKILLed are processed by a worker started afterwards', async () => {
    const scmSecret = 'durability-scm-secret-0123';
    const common = {
      REDIS_URL: redis.url,
      HOME: dir, // no ~/.kube/config: the deploy job fails clearly, which still proves it was processed
      OPS_INVENTORY_FILE: join(dir, 'inventory.yaml'),
      LOG_LEVEL: 'info',
    };
    const api = await startApi({
      env: {
        ...common,
        PORT: String(await freePort()),
        METRICS_PORT: String(await freePort()),
        OPS_API_KEY_ROLES: 'durability-operator-key:operator',
        SCM_WEBHOOK_SECRET: scmSecret,
        RATE_LIMIT_RPS: '0',
      },
    });
    procs.push(api);

    // 1. The API accepts two alerts and one push while no worker exists.
    const alerts = await fetch(`${api.baseUrl}/webhook/alerts`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        alerts: [
          { status: 'firing', labels: { alertname: 'DurableOne' }, annotations: { summary: 'first' }, fingerprint: 'dur-fp-1' },
          { status: 'firing', labels: { alertname: 'DurableTwo' }, annotations: { summary: 'second' }, fingerprint: 'dur-fp-2' },
          { status: 'resolved', labels: { alertname: 'Ignored' }, fingerprint: 'dur-fp-3' },
        ],
      }),
    });
    expect(alerts.status).toBe(202);
    expect(await alerts.json()).toEqual({ received: 3, firing: 2, job_ids: [expect.any(String), expect.any(String)] });

    const push = await fetch(`${api.baseUrl}/webhook/scm`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'X-Scm-Token': scmSecret, 'X-Scm-Event': 'Push Hook' },
      body: JSON.stringify({ ref: 'refs/heads/main', project: { path_with_namespace: 'group/shop' }, checkout_sha: 'd00dfeed' }),
    });
    expect(push.status).toBe(202);
    expect(await push.json()).toMatchObject({
      accepted: true,
      duplicate: false,
      project: 'group/shop',
      event_id: 'scm:group/shop:refs/heads/main:d00dfeed',
    });

    const waiting = await queue.getWaiting();
    expect(waiting.map((j) => j.name).sort()).toEqual([JOB.notifyOncall, JOB.notifyOncall, JOB.runDeployPipeline].sort());
    const ids = waiting.map((j) => j.id!);

    // 2. The API dies without any chance to clean up.
    api.kill('SIGKILL');
    expect((await api.waitExit()).signal).toBe('SIGKILL');

    // 3. Only now a worker starts; it shares nothing with the dead API but Redis.
    const worker = await startWorkerProcess({
      env: {
        ...common,
        METRICS_PORT: String(await freePort()),
        NOTIFY_WEBHOOK_URLS: receiver.url('/durable/hook'),
        REPORT_OUTCOMES: 'none',
      },
    });
    procs.push(worker);

    const posts = await receiver.waitForRequests('/durable/hook', 2, 30000);
    const names = posts.map((p) => (JSON.parse(p.body) as { alertname: string }).alertname).sort();
    expect(names).toEqual(['DurableOne', 'DurableTwo']);

    const outcomes = await Promise.all(ids.map((id) => waitForFinal(queue, id, 30000)));
    const byName = (name: string) => outcomes.filter((o) => o.job.name === name);
    expect(byName(JOB.notifyOncall).map((o) => o.state)).toEqual(['completed', 'completed']);
    // The deploy job reached the worker too: it was processed and dead-lettered for the clear reason
    // that this machine has no cluster (the cluster suite runs it against a real kube-apiserver).
    const [deploy] = byName(JOB.runDeployPipeline);
    expect(deploy!.state).toBe('failed');
    expect(deploy!.job.failedReason).toMatch(/^no Kubernetes configuration: /);
    expect(deploy!.job.data).toMatchObject({ project: 'group/shop', ref: 'refs/heads/main' });

    // Each accepted job was processed exactly once: nothing lost, nothing doubled.
    await new Promise((r) => setTimeout(r, 500));
    expect(receiver.requests('/durable/hook')).toHaveLength(2);
    const summaries = worker
      .logs()
      .filter((l) => l.msg === 'alert notification')
      .map((l) => l.summary)
      .sort();
    expect(summaries).toEqual(['first', 'second']);
  }, 90000);
});
