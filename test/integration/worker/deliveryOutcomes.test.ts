import { createHmac } from 'node:crypto';
import { afterEach, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { kubeConfigForToken } from '../../../worker/k8s.js';
import { OP_KEY, RO_KEY, useHarness } from '../../helpers/apiHarness.js';
import { parseInventory } from '../../../src/shared/inventory.js';
import { deliveriesKey } from '../../../src/shared/keys.js';
import { startWorker, type WorkerHandle } from '../../../worker/index.js';
import { freePort } from '../../helpers/redis.js';
import { testSecretOf } from '../../helpers/senders.js';
import { waitFor } from '../../helpers/waitFor.js';
import { collectLogs, workerConfig, type LogCollector } from '../../helpers/workerSupport.js';

/**
 * A pushed deploy that never runs ends `superseded`, and that end is appended to its sender's
 * deliveries log (GET /ops/deliveries) after the push's own `queued` entry, and written by the
 * worker as an audit line carrying the push request's audit id. Real Redis, the real API and the
 * real worker; no cluster: each deploy's first attempt fails on an API server that refuses
 * connections and waits out a backoff no test waits for, so the newer deploy starts (and fails)
 * before the older one's retry, which is promoted by hand and finds itself superseded without
 * asking Kubernetes anything.
 */
const INVENTORY_YAML = `
projects:
  group/app:
    namespace: deploys
    serviceAccountName: deployer
    image: alpine:3.20
  group/ci:
    namespace: deploys
    serviceAccountName: deployer
    image: alpine:3.20
    deploy_from: ci
`;
// The API queues each deploy with 2 attempts and a backoff no test waits out (a retry is promoted by hand).
const ctx = useHarness({ inventoryYaml: INVENTORY_YAML, env: { JOB_ATTEMPTS: '2', JOB_BACKOFF_MS: '600000' } });
let worker: (WorkerHandle & { logs: LogCollector }) | undefined;
afterEach(async () => {
  await worker?.close(2000);
  worker = undefined;
});
/** An API server that refuses connections: each deploy's attempt fails, to be retried. */
const start = async () => {
  const closedPort = await freePort();
  const logs = collectLogs();
  const w = await startWorker(workerConfig({ REDIS_URL: ctx.srv.url, JOB_ATTEMPTS: '2' }), {
    logger: logs.logger,
    inventory: parseInventory(INVENTORY_YAML),
    kubeConfig: () => kubeConfigForToken(`http://127.0.0.1:${closedPort}`, 'tok', { skipTLSVerify: true }),
  });
  worker = Object.assign(w, { logs });
  return worker;
};

const SECRET = testSecretOf('GENERIC_WEBHOOK_SECRET');
const push = (sha: string, delivery: string) => {
  const body = JSON.stringify({ project: 'group/app', ref: 'refs/heads/main', sha });
  const t = Math.floor(Date.now() / 1000);
  return request(ctx.h.app)
    .post('/webhook/generic')
    .set('Content-Type', 'application/json')
    .set('X-Opsgate-Event', 'push')
    .set('X-Opsgate-Delivery', delivery)
    .set('X-Opsgate-Signature', `t=${t},v1=${createHmac('sha256', SECRET).update(`${t}.${body}`).digest('hex')}`)
    .send(body);
};
const deliveries = async (query: string) => {
  const res = await request(ctx.h.app).get(`/ops/deliveries${query}`).set('X-API-Key', RO_KEY);
  expect(res.status).toBe(200);
  return res.body.deliveries as Array<Record<string, any>>;
};
/** The job's first attempt failed (no cluster) and its retry waits. */
const retryWaits = (id: string) =>
  waitFor(`job ${id}'s retry scheduled`, async () => {
    const job = await ctx.h.queue.bull.getJob(id);
    return job?.attemptsMade === 1 && (await job.isDelayed()) ? job : false;
  });
const ended = (id: string) =>
  waitFor(`job ${id} completed`, async () => {
    const job = await ctx.h.queue.bull.getJob(id);
    return job && (await job.getState()) === 'completed' ? job : false;
  });

describe('a superseded deploy in the deliveries log and the audit log', () => {
  it("a push's retry after a newer push started: its sender's log shows the push queued, then superseded naming the newer deploy; the worker's audit line carries the push's audit id", async () => {
    worker = await start();
    const first = await push('0a0a0001', 'dlv-older');
    expect(first.status).toBe(202);
    const older = first.body.job_id as string;
    await retryWaits(older);
    const second = await push('0a0a0002', 'dlv-newer');
    expect(second.status).toBe(202);
    const newer = second.body.job_id as string;
    await retryWaits(newer);
    await (await ctx.h.queue.bull.getJob(older))!.promote();
    const job = await ended(older);
    expect(job.progress).toMatchObject({ outcome: { result: 'superseded', reason: `superseded by deploy ${newer}, accepted after it` } });

    const entry = await waitFor('the superseded entry', async () => (await deliveries('?source=generic&verdict=superseded'))[0]);
    expect(entry).toMatchObject({
      source: 'generic',
      verdict: 'superseded',
      status: 202,
      job_id: older,
      delivery_id: 'dlv-older',
      detail: `superseded by deploy ${newer}, accepted after it`,
      event: { project: 'group/app', ref: 'refs/heads/main', sha: '0a0a0001', event_id: expect.stringContaining('0a0a0001') },
      verified: true,
    });
    // Appended: the push's own entry stays as it was answered, the end comes after it (newest first).
    const all = await deliveries('?source=generic');
    expect(all.map((d) => [d.verdict, d.job_id])).toEqual([
      ['superseded', older],
      ['queued', newer],
      ['queued', older],
    ]);
    expect(all[2]!.event).toEqual(entry.event);
    expect(await deliveries('?source=generic&verdict=cancelled')).toEqual([]);

    // The audit line of the push and the worker's audit line of its end share the audit id.
    const asked = ctx.h.audits().find((a) => a.job_id === older)!;
    expect(asked.request_id).toEqual(expect.any(String));
    expect(entry.request_id).toBe(asked.request_id);
    const end = worker.logs.find('change outcome').filter((l) => l.job_id === older);
    expect(end).toEqual([
      expect.objectContaining({
        audit: true,
        audit_id: asked.request_id,
        who: 'webhook:generic',
        result: 'superseded',
        superseded_by: newer,
        reason: `superseded by deploy ${newer}, accepted after it`,
      }),
    ]);
  });

  it("a CI job's deploy (POST /ops/deploys, from no sender) ends superseded without a deliveries entry", async () => {
    worker = await start();
    const deploy = async (sha: string) => {
      const res = await request(ctx.h.app)
        .post('/ops/deploys')
        .set('X-API-Key', OP_KEY)
        .set('Content-Type', 'application/json')
        .send(JSON.stringify({ project: 'group/ci', ref: 'refs/heads/main', sha }));
      expect(res.status).toBe(202);
      return res.body.job_id as string;
    };
    const older = await deploy('0b0b0001'.repeat(5));
    await retryWaits(older);
    const newer = await deploy('0b0b0002'.repeat(5));
    await retryWaits(newer);
    await (await ctx.h.queue.bull.getJob(older))!.promote();
    expect((await ended(older)).progress).toMatchObject({ outcome: { result: 'superseded' } });
    expect(worker.logs.find('change outcome').filter((l) => l.job_id === older)).toEqual([
      expect.objectContaining({ audit: true, result: 'superseded', superseded_by: newer }),
    ]);
    expect(await deliveries('?verdict=superseded')).toEqual([]);
    // A CI job is no sender: nothing is written under its name either.
    expect(await ctx.h.inspect.exists(deliveriesKey('ci'))).toBe(0);
  });

  it('OpenAPI lists both verdicts as filters of GET /ops/deliveries', async () => {
    const doc = (await request(ctx.h.app).get('/openapi.json')).body;
    const verdict = (doc.paths['/ops/deliveries'].get.parameters as Array<{ name: string; schema: { enum?: string[] } }>).find(
      (p) => p.name === 'verdict',
    );
    expect(verdict?.schema.enum).toEqual(expect.arrayContaining(['queued', 'superseded', 'cancelled']));
  });
});
