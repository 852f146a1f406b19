import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { CONFIRM_SLACK_MS, replicationGate, TAKE_BACK_BUDGET_MS } from '../../../src/domain/replication.js';
import { NotReplicatedError } from '../../../src/shared/errors.js';
import { JOB } from '../../../src/shared/jobs.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { startReplica } from '../../helpers/redisTopology.js';
import { createHarness, SCM_SECRET, type Harness } from '../../helpers/apiHarness.js';
import { enqueue } from '../../helpers/queueOps.js';

/**
 * REDIS_MIN_REPLICAS_ACK=1 with the largest REDIS_ACK_TIMEOUT_MS (1500), on a real primary with one
 * real replica: the time between the writes and a 503 is bounded by REDIS_ACK_TIMEOUT_MS +
 * CONFIRM_SLACK_MS + TAKE_BACK_BUDGET_MS = 2 s, below webhook senders' timeouts, also when the
 * primary stops answering right after the writes (frozen with SIGSTOP, as a primary that is gone
 * in a failover): without the bound each WAIT and take-back command waited for the connection's
 * 2 s command timeout in turn.
 */
const ACK_TIMEOUT_MS = 1500;
const BOUND_MS = ACK_TIMEOUT_MS + CONFIRM_SLACK_MS + TAKE_BACK_BUDGET_MS;
/** Timers fire late on a loaded 2-core machine; this much lateness is tolerated on top of the bound. */
const JITTER_MS = 300;

/**
 * How late a timer of `ms`, set now, fires in this process: what CPU starvation adds to any timed
 * wait here. The bound is measured in the process's own timer time: the code under test cuts its
 * waits with two timers in a row (the WAITs' cut, then the take-back's budget), each as late as this one.
 */
function timerLateness(ms: number): Promise<number> {
  const t = Date.now();
  return new Promise((resolve) => setTimeout(() => resolve(Math.max(0, Date.now() - t - ms)), ms));
}

let primary: RedisServer;
let replica: Awaited<ReturnType<typeof startReplica>>;
let h: Harness;

beforeAll(async () => {
  primary = await startRedis();
  replica = await startReplica(primary.port);
  h = await createHarness(primary.url, { env: { REDIS_MIN_REPLICAS_ACK: '1', REDIS_ACK_TIMEOUT_MS: String(ACK_TIMEOUT_MS) } });
}, 60_000);

afterAll(async () => {
  primary?.resume();
  replica?.proc.kill('SIGCONT');
  await h?.close();
  await replica?.destroy();
  await primary?.destroy();
});

describe('the wait before a 503 is bounded', () => {
  it('the bound is 2 s with the largest REDIS_ACK_TIMEOUT_MS', () => {
    expect(BOUND_MS).toBe(2000);
  });

  it('replica frozen: a webhook is answered 503 within the bound', async () => {
    replica.proc.kill('SIGSTOP');
    let res;
    const t0 = Date.now();
    const late = timerLateness(BOUND_MS);
    try {
      res = await request(h.app)
        .post('/webhook/scm')
        .set('Content-Type', 'application/json')
        .set('X-Scm-Token', SCM_SECRET)
        .set('X-Scm-Event', 'Push Hook')
        .send({ ref: 'refs/heads/main', checkout_sha: 'bound-1', project: { path_with_namespace: 'group/app' } });
    } finally {
      replica.proc.kill('SIGCONT');
    }
    const elapsed = Date.now() - t0;
    expect(res.status).toBe(503);
    expect(res.headers['retry-after']).toMatch(/^\d+$/);
    expect(elapsed).toBeLessThan(BOUND_MS + JITTER_MS + 2 * (await late));
  });

  it('primary frozen right after the writes: the confirm step still ends in NotReplicatedError within the bound', async () => {
    const confirm = replicationGate({
      redis: h.redis,
      queue: h.queue.producer,
      logger: h.logger,
      minReplicas: 1,
      timeoutMs: ACK_TIMEOUT_MS,
    });
    const jobId = await enqueue(h.queue, JOB.notifyOncall, { alertname: 'x', annotations: {}, audit_id: 'a', requested_by: 'b' });
    const record = 'opsgate:test:bound-record';
    await h.redis.set(record, `q:${jobId}`);
    primary.pause();
    const t0 = Date.now();
    const late = timerLateness(BOUND_MS);
    let outcome: unknown;
    try {
      outcome = await confirm([{ jobId, keys: [record] }]).then(
        () => 'confirmed',
        (err: unknown) => err,
      );
    } finally {
      primary.resume();
    }
    const elapsed = Date.now() - t0;
    expect(outcome).toBeInstanceOf(NotReplicatedError);
    expect(elapsed).toBeLessThan(BOUND_MS + JITTER_MS + 2 * (await late));
    expect(h.logs().some((l) => l.msg === 'taking back the writes that were not replicated did not finish in time; answering 503')).toBe(
      true,
    );
  });
});
