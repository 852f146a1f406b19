/**
 * REDIS_MIN_REPLICAS_ACK for guarded changes (src/domain/replication.ts changeReplicationGate) on
 * a real redis-server: a pending approval, an approval's decision with the job it queues, and a
 * freeze declared or lifted are confirmed on the replicas before their success answer.
 * - No replica (WAIT never satisfied): 503 {detail, code} + Retry-After saying the change may still take
 *   effect, and nothing is taken back: reading it back shows it.
 * - One real replica: the usual answers, and at that moment the approval, its job and the freeze
 *   are on the replica.
 */
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Queue } from 'bullmq';
import request from 'supertest';
import { QUEUE_NAME } from '../../../src/shared/jobs.js';
import { FREEZES_KEY, approvalKey } from '../../../src/shared/keys.js';
import { OP_KEY, OP_KEY_2, RO_KEY, createHarness, type Harness } from '../../helpers/apiHarness.js';
import { GUARDED_INVENTORY_YAML, decide, restartAs } from '../../helpers/guards.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { startReplica } from '../../helpers/redisTopology.js';

let srv: RedisServer;
let h: Harness;

const MAY_STILL = /not acknowledged by 1 Redis replica in time; it may still take effect: read it back before repeating it$/;

const declareFreeze = (app: Harness['app']) =>
  request(app)
    .post('/ops/freezes')
    .set('X-API-Key', OP_KEY)
    .set('Content-Type', 'application/json')
    .send(JSON.stringify({ scope: 'namespace', namespace: 'shop', reason: 'release night', duration: '2h' }));

const harness = (timeoutMs: number) =>
  createHarness(srv.url, {
    inventoryYaml: GUARDED_INVENTORY_YAML,
    env: { REDIS_MIN_REPLICAS_ACK: '1', REDIS_ACK_TIMEOUT_MS: String(timeoutMs) },
  });

beforeAll(async () => {
  srv = await startRedis();
  h = await harness(200);
});
afterAll(async () => {
  await h?.close();
  await srv?.destroy();
});

describe('guarded changes, REDIS_MIN_REPLICAS_ACK=1 without a replica', () => {
  it('a restart that asks for approval -> 503 that says it may still take effect; the pending approval stays and reads back', async () => {
    const res = await restartAs(h.app, '?host=pay-1&service=api&reason=leak');
    expect(res.status).toBe(503);
    expect(res.headers['retry-after']).toMatch(/^\d+$/);
    expect(res.body).toEqual({ detail: expect.stringMatching(/^approval apr-[a-z0-9]{20} requested, /), code: 'not_replicated' });
    expect(res.body.detail).toMatch(MAY_STILL);
    const id = /^approval (apr-[a-z0-9]{20})/.exec(res.body.detail as string)![1]!;
    const read = await request(h.app).get(`/ops/approvals/${id}`).set('X-API-Key', RO_KEY);
    expect(read.status).toBe(200);
    expect(read.body).toMatchObject({ id, status: 'pending' });
  });

  it('a freeze declared -> 503 that says it may still take effect; GET /ops/freezes shows it', async () => {
    const res = await declareFreeze(h.app);
    expect(res.status).toBe(503);
    expect(res.body.detail).toMatch(/^freeze \S+ declared, /);
    expect(res.body.detail).toMatch(MAY_STILL);
    const list = await request(h.app).get('/ops/freezes').set('X-API-Key', RO_KEY);
    expect(list.body.freezes).toEqual([expect.objectContaining({ scope: 'namespace', namespace: 'shop', reason: 'release night' })]);
  });
});

describe('guarded changes, REDIS_MIN_REPLICAS_ACK=1 with one real replica', () => {
  let replica: Awaited<ReturnType<typeof startReplica>>;
  beforeAll(async () => {
    replica = await startReplica(srv.port);
    // The replica must ack in time on a loaded 2-core machine: the largest timeout the config allows.
    await h.close();
    h = await harness(1500);
  });
  afterAll(async () => {
    await replica?.destroy();
  });

  it('202 pending_approval with the approval on the replica; approved: 200 with its job on the replica', async () => {
    const asked = await restartAs(h.app, '?host=pay-1&service=ledger&reason=leak', { 'X-API-Key': OP_KEY_2 });
    expect(asked.status).toBe(202);
    expect(asked.body).toMatchObject({ status: 'pending_approval' });
    const id = asked.body.approval_id as string;
    const onReplica = replica.client();
    const replicaQueue = new Queue(QUEUE_NAME, { connection: { host: '127.0.0.1', port: replica.port } });
    replicaQueue.on('error', () => {});
    try {
      expect(await onReplica.exists(approvalKey(id))).toBe(1);
      const approved = await decide(h.app, id, 'approve', OP_KEY);
      expect(approved.status).toBe(200);
      expect(approved.body).toMatchObject({ status: 'approved', job_id: expect.any(String) });
      expect((await replicaQueue.getJob(approved.body.job_id as string))?.data).toMatchObject({ host: 'pay-1', service: 'ledger' });
    } finally {
      onReplica.disconnect();
      await replicaQueue.close();
    }
  });

  it('a freeze declared: 201, and it is on the replica', async () => {
    const res = await declareFreeze(h.app);
    expect(res.status).toBe(201);
    const onReplica = replica.client();
    try {
      expect(await onReplica.hexists(FREEZES_KEY, res.body.id as string)).toBe(1);
    } finally {
      onReplica.disconnect();
    }
  });
});
