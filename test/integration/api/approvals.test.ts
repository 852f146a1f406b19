import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { credentialId } from '../../../src/shared/crypto.js';
import { JOB } from '../../../src/shared/jobs.js';
import { approvalIndexKey } from '../../../src/shared/keys.js';
import { BEARER, OP_KEY, OP_KEY_2, RO_KEY, createHarness, useHarness, type Harness } from '../../helpers/apiHarness.js';
import { GUARDED_INVENTORY_YAML, decide, restartAs } from '../../helpers/guards.js';
import { waitFor } from '../../helpers/waitFor.js';
import { metricValue } from '../../helpers/workerSupport.js';

/**
 * Four-eyes approval on a real Redis: a policy turns a restart (or a deploy) into a pending
 * approval; another operator approves or rejects it with a reason; the requester cannot approve
 * it; an expired one cannot be approved; two approvers racing (on two API instances) make exactly
 * one job, whose id is the approval id and whose data carries the approvers.
 */
const OP_KEY_3 = 'op-key-third-0007-approver';
const OP_KEY_4 = 'op-key-fourth-0008-requester';
let clock = Date.parse('2026-03-02T10:00:00Z');
const env = { OPS_API_KEY_ROLES: `${RO_KEY}:readonly,${OP_KEY}:operator,${OP_KEY_2}:operator,${OP_KEY_3}:operator,${OP_KEY_4}:operator` };
const ctx = useHarness({ inventoryYaml: GUARDED_INVENTORY_YAML, now: () => clock, env });
let other: Harness; // a second API process's app on the same Redis

beforeAll(async () => {
  other = await createHarness(ctx.srv.url, { inventoryYaml: GUARDED_INVENTORY_YAML, now: () => clock, env });
});
afterAll(async () => {
  await other?.close();
});

const keyId = (k: string) => `key:${credentialId(k)}`;
const bearerId = `bearer:${credentialId(BEARER)}`;

async function jobsNamed(h: Harness, name: string) {
  return (await h.queue.bull.getJobs(['waiting', 'active', 'delayed', 'completed', 'failed', 'prioritized'])).filter(
    (j) => j.name === name,
  );
}

describe('a restart whose host asks for approval', () => {
  it('answers 202 pending_approval with the approval id and expiry, queues no restart, and tells the on-call channel', async () => {
    const res = await restartAs(ctx.h.app, '?host=pay-1&service=api&reason=memory%20leak');
    expect(res.status).toBe(202);
    expect(res.body).toEqual({
      host: 'pay-1',
      service: 'api',
      status: 'pending_approval',
      approval_id: expect.stringMatching(/^apr-[a-z0-9]{20}$/),
      expires_at: '2026-03-02T11:00:00.000Z',
      // The shared bearer token hides who asked: one approver more than the policy's 1.
      required: 2,
      coalesced: false,
    });
    expect(await jobsNamed(ctx.h, JOB.restartService)).toEqual([]);
    const reports = await jobsNamed(ctx.h, JOB.reportChange);
    expect(reports.map((j) => [j.id, j.data.event]).sort()).toEqual([
      [`report.${res.body.approval_id}.expiry`, 'approval_expiry'],
      [`report.${res.body.approval_id}.requested`, 'approval_requested'],
    ]);
    expect(reports.find((j) => j.data.event === 'approval_requested')!.data).toMatchObject({
      change: 'restart',
      host: 'pay-1',
      service: 'api',
      namespace: 'payments',
      approval_id: res.body.approval_id,
      reason: 'memory leak',
      requested_by: bearerId,
    });
    // the expiry report waits for the expiry (real time: a BullMQ delayed job of 1 h)
    const expiry = reports.find((j) => j.data.event === 'approval_expiry')!;
    expect(await expiry.getState()).toBe('delayed');
    expect(expiry.delay).toBe(3600_000);
    expect(ctx.h.audits().at(-1)).toMatchObject({ who: bearerId, status: 202, approval_id: res.body.approval_id, reason: 'memory leak' });
  });

  it('a read-only key lists and reads pending approvals, and GET /ops/jobs/{approval id} says pending_approval; it cannot decide (403)', async () => {
    const { body } = await restartAs(ctx.h.app, '?host=pay-1&service=api');
    const list = await request(ctx.h.app).get('/ops/approvals').set('X-API-Key', RO_KEY);
    expect(list.status).toBe(200);
    expect(list.body.approvals).toEqual([
      expect.objectContaining({
        id: body.approval_id,
        status: 'pending',
        change: 'restart',
        host: 'pay-1',
        service: 'api',
        namespace: 'payments',
        requested_by: bearerId,
        required: 2,
        approvals: [],
        job_id: body.approval_id,
      }),
    ]);
    expect((await request(ctx.h.app).get(`/ops/approvals/${body.approval_id}`).set('X-API-Key', RO_KEY)).body.status).toBe('pending');
    const job = await request(ctx.h.app).get(`/ops/jobs/${body.approval_id}`).set('X-API-Key', RO_KEY);
    expect(job.status).toBe(200);
    expect(job.body).toMatchObject({
      id: body.approval_id,
      name: JOB.restartService,
      state: 'pending_approval',
      approval: { status: 'pending' },
    });
    for (const action of ['approve', 'reject'] as const) {
      const r = await decide(ctx.h.app, body.approval_id, action, RO_KEY);
      expect(r.status).toBe(403);
      expect(r.body).toEqual({ detail: 'this operation requires an operator key', code: 'operator_role_required' });
    }
    expect((await request(ctx.h.app).get('/ops/approvals').set('X-API-Key', RO_KEY)).body.approvals[0].status).toBe('pending');
  });

  it('a second request for the same Deployment joins the pending approval (coalesced); another Deployment is another approval', async () => {
    const a = await restartAs(ctx.h.app, '?host=pay-1&service=api');
    const b = await restartAs(ctx.h.app, '?host=pay-1&service=api', { 'X-API-Key': OP_KEY });
    expect(b.status).toBe(202);
    expect(b.body).toMatchObject({ approval_id: a.body.approval_id, coalesced: true });
    const c = await restartAs(ctx.h.app, '?host=pay-1&service=ledger');
    expect(c.body.approval_id).not.toBe(a.body.approval_id);
    // the pending approvals, one per page, soonest expiry first
    const list = (qs: string) => request(ctx.h.app).get(`/ops/approvals${qs}`).set('X-API-Key', RO_KEY);
    const all = (await list('')).body;
    expect(all.next_cursor).toBeNull();
    const page1 = await list('?limit=1');
    expect(page1.body.approvals).toEqual([all.approvals[0]]);
    const page2 = await list(`?limit=1&cursor=${encodeURIComponent(page1.body.next_cursor)}`);
    expect(page2.body.approvals).toEqual(all.approvals.slice(1, 2));
    const ids = [...page1.body.approvals, ...page2.body.approvals].map((x: { id: string }) => x.id);
    expect(ids.sort()).toEqual([a.body.approval_id, c.body.approval_id].sort());
    expect(page2.body.next_cursor).toBeNull();
    expect((await list('?limit=0')).body.code).toBe('invalid_query');
    expect((await list('?cursor=nope')).body.code).toBe('invalid_cursor');
  });

  it('the requester cannot approve their own change (403, by key or by the same secret as bearer); another operator approves: one job, id = approval id, approvers in its data', async () => {
    const asked = await restartAs(ctx.h.app, '?host=pay-1&service=api&reason=deadlock', { 'X-API-Key': OP_KEY });
    expect(asked.status).toBe(202);
    const id = asked.body.approval_id as string;
    const self = await decide(ctx.h.app, id, 'approve', OP_KEY);
    expect(self.status).toBe(403);
    expect(self.body.detail).toMatch(/requester cannot approve their own change/);
    expect(await metricValue(ctx.h.metrics as never, 'opsgate_approvals_total', { event: 'refused_self' })).toBeGreaterThan(0);

    const ok = await decide(ctx.h.app, id, 'approve', OP_KEY_2, { reason: 'checked the dashboards' });
    expect(ok.status).toBe(200);
    expect(ok.body).toMatchObject({
      status: 'approved',
      job_id: id,
      coalesced: false,
      approvals_needed: 0,
      approval: { status: 'approved', approvals: [{ by: keyId(OP_KEY_2), reason: 'checked the dashboards' }], requested_by: keyId(OP_KEY) },
    });
    const [job, ...more] = await jobsNamed(ctx.h, JOB.restartService);
    expect(more).toEqual([]);
    expect(job!.id).toBe(id);
    expect(job!.data).toEqual({
      host: 'pay-1',
      service: 'api',
      approval_id: id,
      approvers: [keyId(OP_KEY_2)],
      reason: 'deadlock',
      audit_id: expect.any(String),
      requested_by: keyId(OP_KEY),
      requested_owner: `env:${credentialId(OP_KEY)}`,
      requested_credential: credentialId(OP_KEY),
    });
    expect(ctx.h.audits().at(-1)).toMatchObject({
      who: keyId(OP_KEY_2),
      path: `/ops/approvals/${id}/approve`,
      status: 200,
      approval_id: id,
      decision: 'approve',
      reason: 'checked the dashboards',
      job_id: id,
    });
    // the same secret under another scheme is the same person: a bearer token also configured as an operator key
    const sameSecret = await createHarness(ctx.srv.url, {
      inventoryYaml: GUARDED_INVENTORY_YAML,
      now: () => clock,
      env: { OPS_API_KEY_ROLES: `${RO_KEY}:readonly,${BEARER}:operator` },
    });
    try {
      const viaBearer = await restartAs(sameSecret.app, '?host=pay-1&service=ledger');
      const viaKey = await decide(sameSecret.app, viaBearer.body.approval_id, 'approve', BEARER);
      expect(viaKey.status).toBe(403);
    } finally {
      await sameSecret.close();
    }
    // decided: approving again is a 409 and adds nothing; the approval is no longer listed as pending
    const again = await decide(ctx.h.app, id, 'approve', OP_KEY_3);
    expect(again.status).toBe(409);
    expect(again.body.detail).toBe(`approval ${id} is already approved (job ${id})`);
    expect(await jobsNamed(ctx.h, JOB.restartService)).toHaveLength(1);
    expect((await request(ctx.h.app).get('/ops/approvals').set('X-API-Key', RO_KEY)).body.approvals.map((a: any) => a.id)).not.toContain(
      id,
    );
  });

  it('two approvers racing on two API instances: exactly one 200 approved, one 409, one job (20 rounds)', async () => {
    for (let round = 0; round < 20; round++) {
      await ctx.h.inspect.flushall();
      const { body } = await restartAs(ctx.h.app, '?host=pay-1&service=ledger', { 'X-API-Key': OP_KEY_3 });
      const [a, b] = await Promise.all([
        decide(ctx.h.app, body.approval_id, 'approve', OP_KEY),
        decide(other.app, body.approval_id, 'approve', OP_KEY_2),
      ]);
      expect([a.status, b.status].sort()).toEqual([200, 409]);
      const winner = a.status === 200 ? a : b;
      expect(winner.body).toMatchObject({ status: 'approved', job_id: body.approval_id });
      const jobs = await jobsNamed(ctx.h, JOB.restartService);
      expect(jobs.map((j) => j.id)).toEqual([body.approval_id]);
      expect(jobs[0]!.data.approvers).toHaveLength(1);
    }
  });

  it('two approvals required: the first is recorded (still pending), the same operator twice is a 409, a second operator approves', async () => {
    const { body } = await restartAs(ctx.h.app, '?host=vault-1&service=core', { 'X-API-Key': OP_KEY_4 });
    expect(body.required).toBe(2);
    const first = await decide(ctx.h.app, body.approval_id, 'approve', OP_KEY);
    expect(first.status).toBe(202); // recorded: the change still waits for approval
    expect(first.body).toMatchObject({ status: 'pending', job_id: null, approvals_needed: 1 });
    expect(await jobsNamed(ctx.h, JOB.restartService)).toEqual([]);
    const twice = await decide(ctx.h.app, body.approval_id, 'approve', OP_KEY);
    expect(twice.status).toBe(409);
    expect(twice.body.detail).toMatch(/you already approved/);
    // the last two racing: one approves, the other finds it decided
    const [a, b] = await Promise.all([
      decide(ctx.h.app, body.approval_id, 'approve', OP_KEY_2),
      decide(other.app, body.approval_id, 'approve', OP_KEY_3),
    ]);
    expect([a.status, b.status].sort()).toEqual([200, 409]);
    const jobs = await jobsNamed(ctx.h, JOB.restartService);
    expect(jobs.map((j) => j.id)).toEqual([body.approval_id]);
    expect(jobs[0]!.data.approvers).toEqual([keyId(OP_KEY), a.status === 200 ? keyId(OP_KEY_2) : keyId(OP_KEY_3)]);
  });

  it('rejected: 200 status rejected, no job, a rejected report; GET /ops/jobs/{id} says rejected with who and why', async () => {
    const { body } = await restartAs(ctx.h.app, '?host=pay-1&service=api');
    const r = await decide(ctx.h.app, body.approval_id, 'reject', OP_KEY, { reason: 'not during the sale' });
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({
      status: 'rejected',
      job_id: null,
      approval: { rejected: { by: keyId(OP_KEY), reason: 'not during the sale' } },
    });
    expect(await jobsNamed(ctx.h, JOB.restartService)).toEqual([]);
    const report = (await jobsNamed(ctx.h, JOB.reportChange)).find((j) => j.data.event === 'approval_rejected');
    expect(report?.data.outcome).toEqual({
      result: 'rejected',
      reason: `${keyId(OP_KEY)}: not during the sale`,
    });
    const job = await request(ctx.h.app).get(`/ops/jobs/${body.approval_id}`).set('X-API-Key', RO_KEY);
    expect(job.body).toMatchObject({ state: 'rejected', outcome: { result: 'rejected', reason: `${keyId(OP_KEY)}: not during the sale` } });
    expect((await decide(ctx.h.app, body.approval_id, 'approve', OP_KEY_2)).status).toBe(409);
  });

  it('expired: approving after the ttl is a 409 and queues nothing; GET /ops/jobs/{id} says expired', async () => {
    const { body } = await restartAs(ctx.h.app, '?host=pay-1&service=api');
    const start = clock;
    try {
      clock += 3600_000; // the ttl, on the clock the app is given
      const late = await decide(ctx.h.app, body.approval_id, 'approve', OP_KEY);
      expect(late.status).toBe(409);
      expect(late.body.detail).toBe(`approval ${body.approval_id} expired at 2026-03-02T11:00:00.000Z; ask for the change again`);
      expect(await jobsNamed(ctx.h, JOB.restartService)).toEqual([]);
      const job = await request(ctx.h.app).get(`/ops/jobs/${body.approval_id}`).set('X-API-Key', RO_KEY);
      expect(job.body).toMatchObject({ state: 'expired', outcome: { result: 'expired' } });
      // a new request after the expiry is a new approval
      const again = await restartAs(ctx.h.app, '?host=pay-1&service=api');
      expect(again.body.approval_id).not.toBe(body.approval_id);
    } finally {
      clock = start;
    }
  });

  it('errors are {detail, code}: unknown approval 404, no reason 422, bad JSON 400, override on reject 422', async () => {
    expect((await decide(ctx.h.app, 'apr-aaaaaaaaaaaaaaaaaaaa', 'approve', OP_KEY)).status).toBe(404);
    expect((await request(ctx.h.app).get('/ops/approvals/nope').set('X-API-Key', RO_KEY)).body).toEqual({
      detail: 'approval not found',
      code: 'approval_not_found',
    });
    const { body } = await restartAs(ctx.h.app, '?host=pay-1&service=api');
    const noReason = await decide(ctx.h.app, body.approval_id, 'approve', OP_KEY_2, {});
    expect(noReason.status).toBe(422);
    expect(noReason.body.detail).toMatch(/^invalid body field reason/);
    expect(noReason.body.code).toBe('invalid_body');
    const bad = await request(ctx.h.app)
      .post(`/ops/approvals/${body.approval_id}/approve`)
      .set('X-API-Key', OP_KEY_2)
      .set('Content-Type', 'application/json')
      .send('{nope');
    expect(bad.status).toBe(400);
    expect(bad.body.code).toBe('invalid_json');
    const overrideOnReject = await decide(ctx.h.app, body.approval_id, 'reject', OP_KEY_2, { reason: 'x', override: true });
    expect(overrideOnReject.status).toBe(422);
    expect(overrideOnReject.body).toEqual({ detail: 'override applies to approve only', code: 'invalid_body' });
  });

  it('an Idempotency-Key makes a retried request find its approval', async () => {
    const a = await restartAs(ctx.h.app, '?host=pay-1&service=api').set('Idempotency-Key', 'chg-1001');
    expect(await ctx.h.inspect.del(approvalIndexKey('restart:payments/api'))).toBe(1); // even without the change's index
    const b = await restartAs(ctx.h.app, '?host=pay-1&service=api').set('Idempotency-Key', 'chg-1001');
    expect(b.body.approval_id).toBe(a.body.approval_id);
  });
});

describe('a deploy whose project asks for approval', () => {
  it('a push answers 202 with the approval instead of a job; the same event again joins it; approval queues the deploy with the event as its deduplication', async () => {
    const push = JSON.stringify({ ref: 'refs/heads/main', checkout_sha: 'f00d', project: { path_with_namespace: 'group/guarded' } });
    const send = () =>
      request(ctx.h.app)
        .post('/webhook/scm')
        .set('Content-Type', 'application/json')
        .set('X-Scm-Token', ctx.h.config.SCM_WEBHOOK_SECRET as string)
        .set('X-Scm-Event', 'Push Hook')
        .send(push);
    const first = await send();
    expect(first.status).toBe(202);
    expect(first.body).toMatchObject({
      accepted: true,
      duplicate: false,
      project: 'group/guarded',
      status: 'pending_approval',
      approval_id: expect.stringMatching(/^apr-/),
      job_id: first.body.approval_id,
    });
    expect(await jobsNamed(ctx.h, JOB.runDeployPipeline)).toEqual([]);
    // the history lists the push as it waits: the API writes it with the approval record
    const waiting = await request(ctx.h.app).get(`/ops/deploys/${first.body.approval_id}`).set('X-API-Key', RO_KEY);
    expect(waiting.status).toBe(200);
    expect(waiting.body).toMatchObject({
      project: 'group/guarded',
      commit: 'f00d',
      origin: 'push',
      state: 'pending_approval',
      job_id: null,
    });
    const again = await send();
    expect(again.body).toMatchObject({ accepted: false, duplicate: true, approval_id: first.body.approval_id });
    // a replay of the delivery joins the approval too: the change still waits for it (202, as a restart)
    const delivery = await waitFor('the push in the deliveries log', async () => {
      const list = await request(ctx.h.app).get('/ops/deliveries?source=scm&verdict=duplicate').set('X-API-Key', RO_KEY);
      return (list.body.deliveries as Array<{ id: string }>)[0]?.id;
    });
    const replay = await request(ctx.h.app)
      .post(`/ops/deliveries/${delivery}/replay`)
      .set('X-API-Key', OP_KEY_2)
      .set('Content-Type', 'application/json')
      .send({ reason: 'redeliver' });
    expect(replay.status).toBe(202);
    expect(replay.body).toMatchObject({ replayed: true, duplicate: true, status: 'pending_approval', approval_id: first.body.approval_id });
    expect(await jobsNamed(ctx.h, JOB.runDeployPipeline)).toEqual([]);

    const ok = await decide(ctx.h.app, first.body.approval_id, 'approve', OP_KEY);
    expect(ok.body).toMatchObject({ status: 'approved', job_id: first.body.approval_id, held_until: null });
    const [job] = await jobsNamed(ctx.h, JOB.runDeployPipeline);
    expect(job!.data).toMatchObject({ project: 'group/guarded', sha: 'f00d', approvers: [keyId(OP_KEY)], requested_by: 'webhook:scm' });
    const approved = await request(ctx.h.app).get(`/ops/deploys/${first.body.approval_id}`).set('X-API-Key', RO_KEY);
    expect(approved.body).toMatchObject({ origin: 'push', state: 'queued', job_id: first.body.approval_id });
    // the event now has its job: a redelivery is a duplicate of it
    expect((await send()).body).toMatchObject({ duplicate: true, job_id: first.body.approval_id });
  });
});
