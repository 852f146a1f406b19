import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { credentialId } from '../../../src/shared/crypto.js';
import { JOB } from '../../../src/shared/jobs.js';
import { BEARER, OP_KEY, OP_KEY_2, RO_KEY, createHarness, useHarness, type Harness } from '../../helpers/apiHarness.js';
import { GUARDED_INVENTORY_YAML, decide, guardedWorker, restartAs } from '../../helpers/guards.js';
import { waitFor } from '../../helpers/waitFor.js';
import { metricValue, startReceiver, type Receiver } from '../../helpers/workerSupport.js';

/**
 * The outcome of guarded changes, reported back by a real worker to a real HTTP receiver (the
 * notification endpoint): a restart's end with its job id, requester, approvers and duration; an
 * approval asked for, with how to approve it; an approval that expired unanswered (the worker's
 * delayed expiry job) or was rejected. GET /ops/jobs/{id} carries the same outcome. A rollout that
 * succeeds, and its Kubernetes Events, need a cluster: test/e2e/controlplane/dryRun.test.ts and the
 * node e2e (test/e2e/node/guards.test.ts).
 */
const ctx = useHarness({ inventoryYaml: GUARDED_INVENTORY_YAML });
let receiver: Receiver;
let worker: Awaited<ReturnType<typeof guardedWorker>> | undefined;
beforeAll(async () => {
  receiver = await startReceiver();
});
afterEach(async () => {
  await worker?.close(2000);
  worker = undefined;
});
afterAll(async () => {
  await receiver?.close();
});

const startWorkerFor = async () => {
  worker = await guardedWorker(ctx.srv.url, {
    env: { NOTIFY_WEBHOOK_URLS: receiver.url('/hook'), OPSGATE_PUBLIC_URL: 'https://opsgate.example.com/' },
  });
  return worker;
};
const posts = () => receiver.requests('/hook').map((r) => ({ ...JSON.parse(r.body), delivery: r.headers['x-opsgate-delivery'] }));
const until = (what: string, pred: (p: any) => boolean) => waitFor(what, () => posts().find(pred));
const bearerId = `bearer:${credentialId(BEARER)}`;

describe('reports to the notification endpoint', () => {
  it('a restart that fails reports failed with its reason, job id, requester, approvers and duration; GET /ops/jobs/{id} shows the outcome', async () => {
    const w = await startWorkerFor();
    const res = await restartAs(ctx.h.app, '?host=web-1&service=frontend&reason=oom');
    const id = res.body.job_id as string;
    const post = await until('the outcome report', (p) => p.event === 'outcome' && p.job_id === id);
    expect(post).toMatchObject({
      event: 'outcome',
      change: 'restart',
      host: 'web-1',
      service: 'frontend',
      namespace: 'shop',
      job_id: id,
      requester: bearerId,
      approvers: [],
      reason: 'oom',
      outcome: { result: 'failed', reason: expect.stringMatching(/none in this test/) },
      duration_s: expect.any(Number),
      delivery: `report.${id}.outcome`,
    });
    expect(post.text).toMatch(
      new RegExp(`^:checkered_flag: Failed in [0-9.]+ s: restart of Deployment shop/frontend \\(host web-1\\) requested by ${bearerId}: `),
    );
    const job = await request(ctx.h.app).get(`/ops/jobs/${id}`).set('X-API-Key', RO_KEY);
    expect(job.body).toMatchObject({ state: 'failed', outcome: { result: 'failed', duration_s: expect.any(Number) } });
    expect(await metricValue(w.metrics, 'opsgate_change_outcomes_total', { change: 'restart', result: 'failed' })).toBe(1);
  });

  it('an approval asked for: the on-call channel gets its id and how to approve it; approved, the outcome names the approvers', async () => {
    await startWorkerFor();
    const asked = await restartAs(ctx.h.app, '?host=pay-1&service=api&reason=leak');
    const id = asked.body.approval_id as string;
    const note = await until('the approval request', (p) => p.event === 'approval_requested' && p.approval_id === id);
    expect(note).toMatchObject({
      approve_url: `https://opsgate.example.com/ops/approvals/${id}/approve`,
      reject_url: `https://opsgate.example.com/ops/approvals/${id}/reject`,
      requester: bearerId,
      reason: 'leak',
    });
    expect(note.text).toContain(`POST https://opsgate.example.com/ops/approvals/${id}/approve`);
    // The shared bearer token hides who asked: two people approve where the policy asks one.
    await decide(ctx.h.app, id, 'approve', OP_KEY, { reason: 'go' });
    await decide(ctx.h.app, id, 'approve', OP_KEY_2, { reason: 'go' });
    const outcome = await until('the approved restart outcome', (p) => p.event === 'outcome' && p.job_id === id);
    expect(outcome).toMatchObject({
      approval_id: id,
      approvers: [`key:${credentialId(OP_KEY)}`, `key:${credentialId(OP_KEY_2)}`],
      requester: bearerId,
    });
    expect(outcome.text).toContain(`approved by key:${credentialId(OP_KEY)}`);
  });

  it('rejected: reported with who rejected and why', async () => {
    await startWorkerFor();
    const asked = await restartAs(ctx.h.app, '?host=pay-1&service=ledger');
    await decide(ctx.h.app, asked.body.approval_id, 'reject', OP_KEY, { reason: 'wrong service' });
    const post = await until('the rejection', (p) => p.event === 'approval_rejected' && p.approval_id === asked.body.approval_id);
    expect(post.outcome).toEqual({ result: 'rejected', reason: `key:${credentialId(OP_KEY)}: wrong service` });
  });

  it('unanswered: at its expiry the worker expires the approval and reports it; it can no longer be approved (409)', async () => {
    const shortTtl = GUARDED_INVENTORY_YAML.replace('approval: {required: 1, ttl: 1h}', 'approval: {required: 1, ttl: 2s}');
    const h: Harness = await createHarness(ctx.srv.url, { inventoryYaml: shortTtl });
    try {
      const w = await startWorkerFor();
      const asked = await restartAs(h.app, '?host=pay-1&service=api');
      const id = asked.body.approval_id as string;
      const post = await until('the expiry report', (p) => p.event === 'approval_expiry' && p.approval_id === id);
      expect(post.outcome).toMatchObject({ result: 'expired' });
      expect(post.text).toMatch(/^:hourglass: Expired: restart of Deployment payments\/api/);
      expect((await request(h.app).get(`/ops/approvals/${id}`).set('X-API-Key', RO_KEY)).body.status).toBe('expired');
      expect((await decide(h.app, id, 'approve', OP_KEY)).status).toBe(409);
      expect(await metricValue(w.metrics, 'opsgate_change_outcomes_total', { change: 'restart', result: 'expired' })).toBe(1);
      expect(
        (await h.queue.bull.getJobs(['waiting', 'active', 'delayed', 'completed', 'failed'])).filter((j) => j.name === JOB.restartService),
      ).toEqual([]);
    } finally {
      await h.close();
    }
  });

  it('an approval decided in time makes its expiry report a no-op', async () => {
    const shortTtl = GUARDED_INVENTORY_YAML.replace('approval: {required: 1, ttl: 1h}', 'approval: {required: 1, ttl: 2s}');
    const h: Harness = await createHarness(ctx.srv.url, { inventoryYaml: shortTtl });
    try {
      const w = await startWorkerFor();
      const asked = await restartAs(h.app, '?host=pay-1&service=ledger');
      await decide(h.app, asked.body.approval_id, 'reject', OP_KEY, { reason: 'no' });
      const expiry = `report.${asked.body.approval_id}.expiry`;
      await waitFor('the expiry job run', async () => (await h.queue.bull.getJobState(expiry)) === 'completed');
      expect((await h.queue.bull.getJob(expiry))!.returnvalue).toEqual({ delivered: 0, endpoints: 0, event: 'decided in time' });
      expect(posts().filter((p) => p.event === 'approval_expiry' && p.approval_id === asked.body.approval_id)).toEqual([]);
      expect(w.logs.records().length).toBeGreaterThan(0);
    } finally {
      await h.close();
    }
  });
});
