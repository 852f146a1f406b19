import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import request from 'supertest';
import { JOB } from '../../../src/shared/jobs.js';
import { RO_KEY, type Harness } from '../../helpers/apiHarness.js';
import type { TestPrometheus } from '../../helpers/prometheus.js';
import { startRemediationRig, type RemediationRig } from '../../helpers/remediationRig.js';
import { freePort } from '../../helpers/redis.js';
import { kubeConfigForToken } from '../../../worker/k8s.js';
import { waitFor } from '../../helpers/waitFor.js';

/**
 * Cancel on resolve read where the alert is born: a real Prometheus fires the alerts (sent to a
 * real Debian prometheus-alertmanager whose receiver sends no resolved notifications,
 * send_resolved: false), so nothing but the worker's own look at PROMETHEUS_URL can tell the
 * remediation that its alert resolved. A remediation waiting for approval is withdrawn (the
 * approval rejected by the rule, nothing restarted, the cancellation reported); no silence was
 * ever made for it, since its restart was never queued.
 *
 * A restart a worker already took is never taken back, even while it waits for its retry (a
 * delayed job, as one never started is, but its first attempt may have restarted the Deployment):
 * its outcome is reported. The worker's cluster is an API server address nothing listens on, so
 * every attempt fails and is retried.
 *
 * A restart queued and not yet started cannot be caught by that look while a worker runs: the
 * watch job is queued after the restart it watches (BullMQ takes waiting jobs in order, and a
 * delayed job goes back to the end of the line), so the restart is always taken first. Its
 * cancellation by a resolved notification is in remediation.test.ts.
 */
jest.setTimeout(120_000);

const TOKEN = 'alerts-token-for-remediation-0003';
const INVENTORY = `
hosts:
  pay-1:
    namespace: payments
    deployments: [api, ledger]
    policy:
      approval: {required: 1, ttl: 1h}
  web-1:
    namespace: shop
    deployments: [frontend]
remediations:
  - name: pay
    match: {alertname: PayDown}
    targets: [pay-1]
    silence: true
    verify: 10s
    settle: 2s
  - name: shop
    match: {alertname: ShopDown}
    targets: [web-1]
    verify: 10s
    settle: 2s
`;
/** The restart's retry waits this long: the alert resolves in between. */
const BACKOFF_MS = 6000;
/** Of the jobs the API adds: two attempts, the second BACKOFF_MS after the first. */
const attempts = { JOB_ATTEMPTS: '2', JOB_BACKOFF_MS: String(BACKOFF_MS) };

let prom: TestPrometheus;
let h: Harness;
let rig: RemediationRig | undefined;

beforeAll(async () => {
  const closedPort = await freePort();
  rig = await startRemediationRig({
    inventoryYaml: INVENTORY,
    token: TOKEN,
    sendResolved: false,
    env: attempts,
    kubeConfig: () => kubeConfigForToken(`http://127.0.0.1:${closedPort}`, 'tok', { skipTLSVerify: true }),
    prometheus: { rules: [{ alert: 'PayDown' }, { alert: 'ShopDown' }] },
  });
  h = rig.h;
  prom = rig.prom!;
});
afterAll(async () => {
  await rig?.close();
});

const decisions = async (rule = 'pay') =>
  (await request(h.app).get(`/ops/remediations?rule=${rule}&limit=500`).set('X-API-Key', RO_KEY)).body.remediations as any[];
const decisionOf =
  (pred: (d: any) => boolean, rule = 'pay') =>
  async () =>
    (await decisions(rule)).find(pred);
/** The notifications Alertmanager delivered to the API (its audit lines). */
const deliveries = () => h.audits().filter((a) => a.path === '/webhook/alerts' && a.who === 'webhook:alerts').length;

describe('an alert resolved in Prometheus, no resolved notification sent', () => {
  it('the worker reads the resolution from Prometheus and withdraws the pending approval; nothing restarted, reported, no silence made', async () => {
    const labels = { alertname: 'PayDown', namespace: 'payments', deployment: 'ledger', severity: 'critical' };
    prom.fire(labels);
    const pending = await waitFor(
      'the delivered alert to ask for approval',
      decisionOf((d) => d.decision === 'pending_approval'),
      30_000,
    );
    expect(pending).toMatchObject({ deployment: 'ledger', host: 'pay-1', guard: 'approval', job_id: null });
    const approvalId = pending.approval_id as string;
    const before = await request(h.app).get(`/ops/approvals/${approvalId}`).set('X-API-Key', RO_KEY);
    expect(before.body).toMatchObject({ status: 'pending', requested_by: 'remediation:pay', service: 'ledger' });
    const delivered = deliveries();
    expect(delivered).toBeGreaterThan(0);

    prom.clear(labels);
    const cancelled = await waitFor(
      'the worker to cancel the remediation',
      decisionOf((d) => d.id === pending.id && d.decision === 'cancelled'),
      30_000,
    );
    expect(cancelled).toMatchObject({ outcome: 'cancelled', approval_id: approvalId, job_id: null });
    expect(cancelled.reason).toBe(`the alert resolved while approval ${approvalId} was pending: withdrawn, nothing restarted`);
    // Alertmanager told the API nothing of the resolution: the worker's look at Prometheus found it
    expect(deliveries()).toBe(delivered);

    const after = await request(h.app).get(`/ops/approvals/${approvalId}`).set('X-API-Key', RO_KEY);
    expect(after.body).toMatchObject({
      status: 'rejected',
      rejected: { by: 'remediation:pay', reason: 'the alert resolved before the restart was approved' },
    });
    const jobs = await h.queue.bull.getJobs(['waiting', 'delayed', 'active', 'completed', 'failed', 'prioritized']);
    expect(jobs.filter((j) => j.name === JOB.restartService)).toEqual([]);
    const reports = jobs.filter((j) => j.name === JOB.reportChange).map((j) => j.data as Record<string, any>);
    expect(reports.find((r) => r.remediation?.decision === 'cancelled')).toMatchObject({
      event: 'remediation',
      service: 'ledger',
      approval_id: approvalId,
      remediation: { rule: 'pay', outcome: 'cancelled' },
    });
    // A silence is made once a restart is queued, never while it waits for approval: the alert stayed visible.
    expect((await rig!.am.silences()).filter((s) => s.comment.includes(pending.id))).toEqual([]);
    expect(await h.inspect.scard('opsgate:remediation:silences')).toBe(0);
  });
});

describe('an alert resolved while its restart waits for a retry', () => {
  it("the restart a worker already ran is not taken back: no cancellation, the rollout's own outcome is reported", async () => {
    const labels = { alertname: 'ShopDown', namespace: 'shop', deployment: 'frontend', severity: 'critical' };
    prom.fire(labels);
    const queued = await waitFor(
      'the restart queued',
      decisionOf((d) => d.decision === 'queued', 'shop'),
      30_000,
    );
    const jobId = queued.job_id as string;
    // its first attempt failed (nothing listens at the API server address): it waits for its retry
    await waitFor(
      'the restart waiting for its retry',
      async () => {
        const j = (await request(h.app).get(`/ops/jobs/${jobId}`).set('X-API-Key', RO_KEY)).body;
        return j.state === 'delayed' && j.attempts_made === 1 && j.processed_at !== null;
      },
      BACKOFF_MS,
      100,
    );
    prom.clear(labels);
    const end = await waitFor(
      'the remediation to end',
      decisionOf((d) => d.id === queued.id && (d.decision === 'cancelled' || d.decision === 'outcome'), 'shop'),
      BACKOFF_MS + 30_000,
    );
    expect(end).toMatchObject({ decision: 'outcome', outcome: 'failed', job_id: jobId });
    expect(end.reason).toMatch(new RegExp(`^restart ${jobId} failed: .*ECONNREFUSED`));
    const j = (await request(h.app).get(`/ops/jobs/${jobId}`).set('X-API-Key', RO_KEY)).body;
    expect(j).toMatchObject({ state: 'failed', attempts_made: 2 });
  });
});
