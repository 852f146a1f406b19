/**
 * REDIS_MIN_REPLICAS_ACK with remediation rules, on a real primary and a real replica that follows
 * it through a link lagging 300 ms: the 202 of an alert notification waits until the replica holds
 * every write of it, the restart a rule queued included, not only the contract's notify_oncall
 * jobs. Not acknowledged (the replica paused): 503, the notify_oncall jobs taken back, the
 * remediation's restart kept; the sender's retry is answered by the cooldown, one restart in all.
 * The alert is confirmed by a real Prometheus firing it (PROMETHEUS_URL).
 */
import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { JOB } from '../../../src/shared/jobs.js';
import { createHarness, type Harness } from '../../helpers/apiHarness.js';
import { startPrometheus, type TestPrometheus } from '../../helpers/prometheus.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { startLaggingLink, startReplica } from '../../helpers/redisTopology.js';

const TOKEN = 'alerts-token-for-remediation-ack-01';
const INVENTORY = `
hosts:
  web-1:
    namespace: shop
    deployments: [frontend]
remediations:
  - name: down
    match: {alertname: Down}
    targets: [web-1]
    cooldown: 1h
`;
const LAG_MS = 300;

let srv: RedisServer;
let link: Awaited<ReturnType<typeof startLaggingLink>>;
let replica: Awaited<ReturnType<typeof startReplica>>;
let h: Harness;
let prom: TestPrometheus;

beforeAll(async () => {
  prom = await startPrometheus({ rules: [{ alert: 'Down' }] });
  srv = await startRedis();
  link = await startLaggingLink(srv.port, LAG_MS);
  replica = await startReplica(link.port);
  h = await createHarness(srv.url, {
    inventoryYaml: INVENTORY,
    env: { ALERTS_WEBHOOK_TOKEN: TOKEN, REDIS_MIN_REPLICAS_ACK: '1', REDIS_ACK_TIMEOUT_MS: '1500', PROMETHEUS_URL: prom.url },
  });
  await prom.ensureFiring(down.labels);
});
afterAll(async () => {
  await h?.close();
  await replica?.destroy();
  await link?.close();
  await srv?.destroy();
  await prom?.close();
});
beforeEach(async () => {
  await h.inspect.flushall();
});

const down = {
  status: 'firing',
  labels: { alertname: 'Down', namespace: 'shop', deployment: 'frontend' },
  annotations: {},
  startsAt: new Date(Date.now() - 60_000).toISOString(),
  endsAt: '0001-01-01T00:00:00Z',
  fingerprint: 'f00dfeed00000001',
};
const notify = () =>
  request(h.app)
    .post('/webhook/alerts')
    .set('Authorization', `Bearer ${TOKEN}`)
    .set('Content-Type', 'application/json')
    .send(JSON.stringify({ version: '4', status: 'firing', receiver: 'opsgate', alerts: [down] }));
const jobsNamed = async (name: string) =>
  (await h.queue.bull.getJobs(['waiting', 'delayed', 'active', 'completed', 'failed', 'prioritized'])).filter((j) => j.name === name);

describe('REDIS_MIN_REPLICAS_ACK=1 and a remediation rule', () => {
  it("202 once the replica holds the notify_oncall job and the rule's restart", async () => {
    const res = await notify();
    expect(res.status).toBe(202);
    expect(res.body.remediations).toEqual([expect.objectContaining({ rule: 'down', decision: 'queued' })]);
    // Read at once: the replica lags 300 ms, so only writes the answer waited for are there.
    const onReplica = replica.client();
    try {
      const [restart] = await jobsNamed(JOB.restartService);
      const [oncall] = await jobsNamed(JOB.notifyOncall);
      expect(await onReplica.exists(`bull:ops:${restart!.id}`, `bull:ops:${oncall!.id}`)).toBe(2);
    } finally {
      onReplica.disconnect();
    }
  });

  it("not acknowledged (replica paused): 503, notify_oncall taken back, the restart kept; the retry meets the rule's cooldown", async () => {
    replica.proc.kill('SIGSTOP');
    let res;
    try {
      res = await notify();
    } finally {
      replica.proc.kill('SIGCONT');
    }
    expect(res.status).toBe(503);
    expect(res.body.code).toBe('not_replicated');
    expect(await jobsNamed(JOB.notifyOncall)).toHaveLength(0);
    expect(await jobsNamed(JOB.restartService)).toHaveLength(1);
    const retry = await notify();
    expect(retry.status).toBe(202);
    expect(retry.body.remediations).toEqual([expect.objectContaining({ rule: 'down', decision: 'suppressed' })]);
    expect(retry.body.remediations[0].reason).toMatch(/cooldown/);
    expect(await jobsNamed(JOB.notifyOncall)).toHaveLength(1);
    expect(await jobsNamed(JOB.restartService)).toHaveLength(1);
  });
});
