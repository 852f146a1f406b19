/**
 * Redis Cluster, on real processes: 3 primaries + 3 replicas (Debian redis-server, joined by
 * `redis-cli --cluster create … --cluster-yes`, cluster-node-timeout 1000 ms), the API and the
 * worker with REDIS_URL=redis+cluster://… (test/helpers/redisTopology.ts).
 *
 * 1. The contract on a cluster: scm rules (accepted, duplicate, ignored, 422), alerts dedup
 *    and counts, restart, /ready, DELETE /ops/cache, GET /ops/jobs/{id}; the worker processes
 *    the jobs (notifications posted, deploys dead-lettered without an inventory). BullMQ's keys
 *    all carry the hash tag {opsgate} (one slot), opsgate's seen records their own tags; a
 *    signed push's delivery alias and commit pair share the queue's slot (one MULTI writes both).
 * 2. A primary failover under load: the primary holding the queue's slot is SIGKILLed while two
 *    APIs take unique and duplicate deliveries (REDIS_MIN_REPLICAS_ACK=1, senders retry until
 *    202); its replica takes over, the killed node is started again and rejoins as a replica
 *    (until then that shard has no replica, so WAIT 1 cannot be met there and intake answers
 *    503); every event answered 202 has exactly one job, and the worker drains them all.
 */
import { createHmac } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Queue, type Job } from 'bullmq';
import type { Redis } from 'ioredis';
import { deliveryKey, pushPairKey, queuePrefix, rateLimitKey } from '../../../src/shared/keys.js';
import { QUEUE_NAME } from '../../../src/shared/jobs.js';
import { createRedis, primariesOf } from '../../../src/shared/redis.js';
import { startApi, startWorkerProcess, type OpsProcess } from '../../helpers/processes.js';
import { startRedisCluster, until, type RedisCluster } from '../../helpers/redisTopology.js';
import {
  alertPayload,
  apiEnv,
  makeSecrets,
  pool,
  post,
  scmPush,
  startReceiver,
  workerEnv,
  type Receiver,
} from '../../helpers/reliability.js';

let cluster: RedisCluster;
/** BullMQ's deduplication record of an event on the cluster (the queue's {opsgate} prefix). */
const deKey = (id: string) => `${queuePrefix(cluster.url)}:${QUEUE_NAME}:de:${id}`;
let receiver: Receiver;
let inventoryDir: string;
let inventoryFile: string;
const secrets = makeSecrets('cluster');
const procs: OpsProcess[] = [];

beforeAll(async () => {
  cluster = await startRedisCluster({ primaries: 3, replicasPerPrimary: 1, nodeTimeoutMs: 1000 });
  receiver = await startReceiver();
  inventoryDir = mkdtempSync(join(tmpdir(), 'opsgate-cluster-inv-'));
  inventoryFile = join(inventoryDir, 'inventory.yaml');
  writeFileSync(inventoryFile, 'hosts:\n  web-1:\n    namespace: shop\n    deployments: [frontend]\n');
}, 120_000);

afterAll(async () => {
  await Promise.all(procs.map((p) => p.stop()));
  await receiver?.close();
  await cluster?.destroy();
  if (inventoryDir) rmSync(inventoryDir, { recursive: true, force: true });
});

function queueView(url: string) {
  const conn = createRedis(url, 'blocking', 'opsgate-test-inspect');
  const queue = new Queue(QUEUE_NAME, { connection: conn, prefix: queuePrefix(url) });
  queue.on('error', () => {});
  return {
    conn,
    queue,
    counts: () => queue.getJobCounts('waiting', 'active', 'delayed', 'completed', 'failed', 'prioritized'),
    all: (): Promise<Job[]> => queue.getJobs(['waiting', 'active', 'delayed', 'completed', 'failed', 'prioritized'], 0, -1),
    async close() {
      await queue.close().catch(() => undefined);
      conn.disconnect();
    },
  };
}

/** Every key of every primary (small test data sets only). */
async function allKeys(conn: Redis): Promise<string[]> {
  const out: string[] = [];
  for (const node of primariesOf(conn)) out.push(...(await node.keys('*')));
  return out;
}

describe('Redis Cluster (3 primaries + 3 replicas, real redis-server)', () => {
  it('the contract: scm and alerts dedup + enqueue, restart, cache purge, job view; the worker processes the jobs', async () => {
    const api = await startApi({ env: await apiEnv(cluster.url, secrets, { OPS_INVENTORY_FILE: inventoryFile, JOB_ATTEMPTS: '1' }) });
    procs.push(api);
    const worker = await startWorkerProcess({
      env: await workerEnv(cluster.url, { NOTIFY_WEBHOOK_URLS: receiver.url, REPORT_OUTCOMES: 'none', OPS_INVENTORY_FILE: inventoryFile }),
    });
    procs.push(worker);
    const scmHeaders = { 'X-Scm-Token': secrets.scm, 'X-Scm-Event': 'Push Hook' };

    // scm: accepted, duplicate, another ref or event ignored, no checkout_sha 422, bad token 403
    const first = await post(`${api.baseUrl}/webhook/scm`, scmPush('team/cluster', 'c1a55e7'), scmHeaders);
    expect(first.status).toBe(202);
    expect(first.json).toEqual({
      accepted: true,
      duplicate: false,
      project: 'team/cluster',
      event_id: 'scm:team/cluster:refs/heads/main:c1a55e7',
      job_id: expect.any(String),
    });
    const dup = await post(`${api.baseUrl}/webhook/scm`, scmPush('team/cluster', 'c1a55e7'), scmHeaders);
    expect(dup.json).toMatchObject({ accepted: false, duplicate: true, job_id: first.json!.job_id });
    expect((await post(`${api.baseUrl}/webhook/scm`, scmPush('team/cluster', 'x', 'refs/heads/dev'), scmHeaders)).json).toMatchObject({
      ignored: true,
    });
    expect(
      (await post(`${api.baseUrl}/webhook/scm`, scmPush('team/cluster', 'x'), { ...scmHeaders, 'X-Scm-Event': 'Tag Push Hook' })).json,
    ).toMatchObject({ ignored: true });
    expect((await post(`${api.baseUrl}/webhook/scm`, scmPush('team/cluster', ''), scmHeaders)).status).toBe(422);
    expect((await post(`${api.baseUrl}/webhook/scm`, scmPush('team/cluster', 'y'), { ...scmHeaders, 'X-Scm-Token': 'wrong' })).status).toBe(
      403,
    );

    // A signed push with its delivery id: the alias and the commit pair, written by one MULTI (one slot).
    const ghBody = JSON.stringify({ ref: 'refs/heads/main', before: 'b4', after: 'c1a55e8', repository: { full_name: 'team/cluster' } });
    const gh = await post(`${api.baseUrl}/webhook/github`, ghBody, {
      'X-GitHub-Event': 'push',
      'X-GitHub-Delivery': 'cl-delivery-1',
      'X-Hub-Signature-256': 'sha256=' + createHmac('sha256', secrets.github).update(ghBody).digest('hex'),
    });
    expect(gh.json).toMatchObject({ accepted: true, event_id: 'github:team/cluster:refs/heads/main:c1a55e8' });

    // alerts: 2 firing with fingerprints (one twice), 1 resolved, 1 without fingerprint
    const a = await post(
      `${api.baseUrl}/webhook/alerts`,
      alertPayload([
        { fingerprint: 'cl-fp-1' },
        { fingerprint: 'cl-fp-2' },
        { fingerprint: 'cl-fp-1' },
        { status: 'resolved', fingerprint: 'cl-fp-3' },
        {},
      ]),
    );
    expect(a.status).toBe(202);
    expect(a.json).toEqual({ received: 5, firing: 4, job_ids: [expect.any(String), expect.any(String)] });
    expect((await post(`${api.baseUrl}/webhook/alerts`, { alerts: 'nope' })).status).toBe(422);

    // restart + job view
    const r = await fetch(`${api.baseUrl}/ops/restart?host=web-1&service=frontend`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${secrets.bearer}` },
    });
    expect(r.status).toBe(200);
    const ack = (await r.json()) as { job_id: string; status: string };
    expect(ack.status).toBe('submitted');
    const view = await fetch(`${api.baseUrl}/ops/jobs/${ack.job_id}`, { headers: { 'X-API-Key': secrets.readonlyKey } });
    expect(view.status).toBe(200);
    expect(((await view.json()) as { name: string }).name).toBe('ops_worker.restart_service');
    expect((await fetch(`${api.baseUrl}/ready`)).status).toBe(200);

    // The worker: 2 notifications posted, the deploys dead-lettered (not in the inventory), the
    // restart dead-lettered (no Kubernetes here, JOB_ATTEMPTS=1).
    await until('two notifications posted', async () => receiver.posts.length >= 2, 30_000);
    const q = queueView(cluster.url);
    try {
      await until(
        'every job finished',
        async () => {
          const c = await q.counts();
          return c.completed === 2 && c.failed === 3;
        },
        60_000,
        200,
      );
      const jobs = await q.all();
      expect(jobs).toHaveLength(5);
      expect(new Set(receiver.posts.map((p) => String(p.body.fingerprint)))).toEqual(new Set(['cl-fp-1', 'cl-fp-2']));
      expect(receiver.posts).toHaveLength(2);

      // Keys: BullMQ's all under the {opsgate} hash tag, the events' deduplication records among them.
      const keys = await allKeys(q.conn);
      const bullKeys = keys.filter((k) => k.startsWith('{opsgate}:'));
      expect(bullKeys.length).toBeGreaterThan(4);
      expect(keys.filter((k) => k.startsWith('bull:'))).toEqual([]);
      expect(keys).toContain(deKey('scm:team/cluster:refs/heads/main:c1a55e7'));
      expect(keys).toContain(deKey('alert:cl-fp-1'));
      // The event's job: in the {opsgate} slot with its deduplication record (one script writes both).
      const scmJob = jobs.find((j) => j.data.event_id === 'scm:team/cluster:refs/heads/main:c1a55e7');
      expect(keys).toContain(`${queuePrefix(cluster.url)}:${QUEUE_NAME}:${scmJob?.id}`);
      // The signed push's delivery alias and commit pair: both written, on the queue's primary.
      const pair = pushPairKey('github:team/cluster:refs/heads/main:c1a55e8', 'b4');
      expect(keys).toContain(deliveryKey('github', 'cl-delivery-1'));
      expect(keys).toContain(pair);
      expect((await cluster.primaryFor(pair)).port).toBe((await cluster.primaryFor(deKey('alert:cl-fp-1'))).port);

      // DELETE /ops/cache scans every primary (a cache entry planted on each shard).
      const planted = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'].map((s) => `opsgate:cache:host:${s}`);
      for (const k of planted) await q.conn.set(k, '{}', 'EX', 60);
      const shards = new Set<number>();
      for (const k of planted) shards.add((await cluster.primaryFor(k)).port);
      expect(shards.size).toBeGreaterThan(1);
      const purge = await fetch(`${api.baseUrl}/ops/cache`, { method: 'DELETE', headers: { 'X-API-Key': secrets.operatorKey } });
      expect(purge.status).toBe(200);
      for (const k of planted) expect(await q.conn.exists(k)).toBe(0);
    } finally {
      await q.close();
    }
    for (const p of [api, worker]) {
      expect(p.logs().filter((l) => l.level === 'error' && l.msg !== 'job dead-lettered')).toEqual([]);
      await p.stop();
    }
  }, 120_000);

  it('rate limit on a cluster: the counter (tagged by address) on another primary than the queue; the hit decides (429), and a 429 takes nothing in', async () => {
    // TRUST_PROXY=1: the test picks the client address, so the counter's slot is on a primary
    // other than the {opsgate} slot's.
    const claimsOn = (await cluster.primaryFor('{opsgate}')).port;
    let address = '';
    for (let i = 1; i < 255 && !address; i++) {
      if ((await cluster.primaryFor(rateLimitKey(`10.9.0.${i}`))).port !== claimsOn) address = `10.9.0.${i}`;
    }
    expect(address).not.toBe('');
    const api = await startApi({ env: await apiEnv(cluster.url, secrets, { RATE_LIMIT_RPS: '2', TRUST_PROXY: '1' }) });
    procs.push(api);
    const headers = { 'X-Scm-Token': secrets.scm, 'X-Scm-Event': 'Push Hook', 'X-Forwarded-For': address };
    const q = queueView(cluster.url);
    try {
      const answers = [];
      for (const sha of ['r8te01', 'r8te02', 'r8te03'])
        answers.push(await post(`${api.baseUrl}/webhook/scm`, scmPush('team/rl', sha), headers));
      // The 1 s window may roll over between requests on a loaded machine: at least the first two pass, and any 429 is clean.
      expect(answers.slice(0, 2).map((a) => a.status)).toEqual([202, 202]);
      for (const a of answers.slice(0, 2)) expect(a.json).toMatchObject({ accepted: true });
      // A burst over the limit from the same address: 429 for some, and each 429 left no seen record.
      const burst = await Promise.all(
        ['r8te10', 'r8te11', 'r8te12', 'r8te13', 'r8te14', 'r8te15'].map(async (sha) => ({
          sha,
          res: await post(`${api.baseUrl}/webhook/scm`, scmPush('team/rl', sha), headers),
        })),
      );
      const limited = burst.filter((b) => b.res.status === 429);
      expect(limited.length).toBeGreaterThan(0);
      for (const b of burst) expect([202, 429]).toContain(b.res.status);
      for (const b of limited) {
        expect(b.res.headers.get('retry-after')).toMatch(/^\d+$/);
        expect(await q.conn.exists(deKey(`scm:team/rl:refs/heads/main:${b.sha}`))).toBe(0);
      }
      expect(await q.conn.exists(rateLimitKey(address))).toBe(1);
      const jobs = (await q.all()).filter((j) => j.data.project === 'team/rl');
      expect(jobs).toHaveLength(answers.filter((a) => a.status === 202).length + burst.length - limited.length);
    } finally {
      await q.close();
    }
    expect(api.logs().filter((l) => l.level === 'error' || /rate limit/.test(String(l.msg)))).toEqual([]);
    await api.stop();
  }, 60_000);

  it('failover of the primary holding the queue, under load from 2 APIs: every event answered 202 has exactly one job', async () => {
    await cluster.waitHealthy();
    const extra = { REDIS_MIN_REPLICAS_ACK: '1', REDIS_ACK_TIMEOUT_MS: '500' };
    const [apiA, apiB] = await Promise.all([
      startApi({ env: await apiEnv(cluster.url, secrets, extra) }),
      startApi({ env: await apiEnv(cluster.url, secrets, extra) }),
    ]);
    procs.push(apiA, apiB);
    const worker = await startWorkerProcess({
      env: await workerEnv(cluster.url, {
        NOTIFY_WEBHOOK_URLS: receiver.url,
        REPORT_OUTCOMES: 'none',
        WORKER_CONCURRENCY: '8',
        WORKER_STALLED_INTERVAL_MS: '2000',
        WORKER_LOCK_DURATION_MS: '4000',
      }),
    });
    procs.push(worker);
    receiver.posts.length = 0;

    const run = Date.now().toString(36);
    const events: Array<{ kind: 'scm' | 'alert'; id: string }> = [];
    for (let i = 0; i < 80; i++)
      events.push({ kind: 'scm', id: `${run}${i.toString(16).padStart(6, '0')}` }, { kind: 'alert', id: `fo-${run}-${i}` });
    const deliveries = events.flatMap((e) => [
      { ...e, copy: 0 },
      { ...e, copy: 1 },
    ]);
    const queuePrimary = await cluster.primaryFor('{opsgate}');
    let done = 0;
    let killedAt = 0;
    let promotedAt = 0;
    let restarted: Promise<void> | undefined;
    let answers503 = 0;
    const killAt = Math.floor(deliveries.length / 3);

    const send = async (d: (typeof deliveries)[number]) => {
      const base = d.copy === 0 ? apiA.baseUrl : apiB.baseUrl;
      const deadline = Date.now() + 30_000;
      for (;;) {
        let status: number;
        try {
          const r =
            d.kind === 'scm'
              ? await post(`${base}/webhook/scm`, scmPush('team/cluster-fo', d.id), {
                  'X-Scm-Token': secrets.scm,
                  'X-Scm-Event': 'Push Hook',
                })
              : await post(`${base}/webhook/alerts`, alertPayload([{ fingerprint: d.id }]));
          status = r.status;
        } catch {
          status = 0;
        }
        if (status === 503) answers503++;
        if (status === 202 || Date.now() > deadline) {
          if (++done === killAt) {
            killedAt = Date.now();
            restarted = (async () => {
              await queuePrimary.kill('SIGKILL');
              // Its replica takes over; then the node comes back (as a pod would be restarted),
              // rejoins as the new primary's replica, and REDIS_MIN_REPLICAS_ACK=1 can be met
              // on that shard again.
              await until(
                'the replica to take over the queue slot',
                async () => (await cluster.primaryFor('{opsgate}')).port !== queuePrimary.port,
                30_000,
                100,
              );
              promotedAt = Date.now();
              queuePrimary.restart();
            })();
          }
          return { ...d, status, at: Date.now() };
        }
        expect([0, 503]).toContain(status);
        await new Promise((r) => setTimeout(r, 200));
      }
    };
    const outcomes = await pool(
      deliveries.map((d) => () => send(d)),
      6,
    );
    await restarted;
    expect(outcomes.filter((o) => o.status !== 202)).toEqual([]);
    expect(killedAt).toBeGreaterThan(0);
    await cluster.waitHealthy();

    const q = queueView(cluster.url);
    try {
      await until(
        'the worker to drain the queue on the promoted replica',
        async () => {
          const c = await q.counts();
          return (c.waiting ?? 0) + (c.active ?? 0) + (c.delayed ?? 0) + (c.prioritized ?? 0) === 0;
        },
        90_000,
        250,
      );
      const jobs = (await q.all()).filter(
        (j) => j.data.event_id?.startsWith('scm:team/cluster-fo:') || String(j.data.fingerprint ?? '').startsWith(`fo-${run}-`),
      );
      const per = new Map<string, number>();
      for (const j of jobs) {
        const k = j.name === 'ops_worker.run_deploy_pipeline' ? String(j.data.event_id) : `alert:${String(j.data.fingerprint)}`;
        per.set(k, (per.get(k) ?? 0) + 1);
      }
      const keyOf = (e: { kind: string; id: string }) =>
        e.kind === 'scm' ? `scm:team/cluster-fo:refs/heads/main:${e.id}` : `alert:${e.id}`;
      const lost = events.map(keyOf).filter((k) => !per.has(k));
      const doubled = [...per].filter(([, n]) => n > 1).map(([k]) => k);
      const recovered = Math.min(...outcomes.filter((o) => o.at > promotedAt).map((o) => o.at)) - promotedAt;
      process.stderr.write(
        `[cluster-failover] queue primary SIGKILLed -> replica took over the slot in ${promotedAt - killedAt} ms; ` +
          `${events.length} events answered 202, lost ${lost.length}, with two jobs ${doubled.length}; ` +
          `503 answers (retried) ${answers503}; first 202 ${recovered} ms after the takeover (node restarted as replica meanwhile)\n`,
      );
      expect(lost).toEqual([]);
      expect(doubled).toEqual([]);
      for (const j of jobs) expect(await j.getState()).toBe(j.name === 'ops_worker.notify_oncall' ? 'completed' : 'failed');
    } finally {
      await q.close();
    }
    for (const p of [apiA, apiB, worker]) expect(p.exited).toBe(false);
  }, 180_000);
});
