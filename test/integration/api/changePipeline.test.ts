import { afterAll, afterEach, describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import request from 'supertest';
import { JOB } from '../../../src/shared/jobs.js';
import { budgetKey } from '../../../src/shared/keys.js';
import { BEARER, SCM_SECRET, createHarness, useHarness, type Harness } from '../../helpers/apiHarness.js';
import { GUARDED_INVENTORY_YAML, decide, guardedWorker, restartAs } from '../../helpers/guards.js';
import { enqueue } from '../../helpers/queueOps.js';

/**
 * The change pipeline's promises on a real Redis, through the real app: four eyes between people
 * (owners, not credentials), an approval that never reads approved without its job, a dead
 * letter's retry that meets every guard from the API and from Bull Board alike, and a freeze
 * declared after an approval holding the approved deploy.
 */
const LONG_REQUESTER = 'r'.repeat(63);
const LONG_APPROVER = 'a'.repeat(63);
const KEYS = {
  alice: 'alice-laptop-key-000000001',
  aliceCi: 'alice-ci-key-0000000000002',
  bob: 'bob-operator-key-00000003',
  carol: 'carol-operator-key-0000004',
  longRequester: 'long-requester-key-000005',
  longApprover: 'long-approver-key-0000006',
};
const dir = mkdtempSync(join(tmpdir(), 'opsgate-pipeline-'));
const keysFile = join(dir, 'api-keys.yaml');
writeFileSync(
  keysFile,
  `- { id: alice, role: operator, key: ${KEYS.alice} }
- { id: alice-ci, role: operator, key: ${KEYS.aliceCi}, owner: alice }
- { id: bob, role: operator, key: ${KEYS.bob} }
- { id: carol, role: operator, key: ${KEYS.carol} }
- { id: ${LONG_REQUESTER}, role: operator, key: ${KEYS.longRequester} }
- { id: ${LONG_APPROVER}, role: operator, key: ${KEYS.longApprover} }
`,
);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

// Near the real time: freezes are kept in Redis until they end, by Redis's clock.
let clock = Date.now();
const ctx = useHarness({
  inventoryYaml: GUARDED_INVENTORY_YAML,
  now: () => clock,
  env: { OPS_API_KEYS_FILE: keysFile, OPS_BEARER_TOKEN_OWNER: 'alice', ADMIN_UI_ENABLED: 'true' },
});
const asKey = (key: string) => ({ 'X-API-Key': key });
const freeze = (key: string, body: Record<string, string>) =>
  request(ctx.h.app).post('/ops/freezes').set(asKey(key)).set('Content-Type', 'application/json').send(JSON.stringify(body));
const approval = (h: Harness, id: string) => request(h.app).get(`/ops/approvals/${id}`).set(asKey(KEYS.carol));
const restartJobs = async (h: Harness) =>
  (await h.queue.bull.getJobs(['waiting', 'delayed', 'active', 'completed', 'failed'])).filter((j) => j.name === JOB.restartService);

describe('four eyes between people', () => {
  it('the bearer token with OPS_BEARER_TOKEN_OWNER: that owner cannot approve with their own key (403); whoever holds the token, two other people approve', async () => {
    const asked = await restartAs(ctx.h.app, '?host=pay-1&service=api');
    expect(asked.status).toBe(202);
    expect(asked.body).toMatchObject({ status: 'pending_approval', required: 2 });
    const self = await decide(ctx.h.app, asked.body.approval_id, 'approve', KEYS.alice);
    expect(self.status).toBe(403);
    expect(self.body.detail).toMatch(/requester cannot approve their own change: the credential belongs to alice/);
    expect(await restartJobs(ctx.h)).toEqual([]);
    // Bob may hold the token as well: his approval alone does not let the change through.
    const first = await decide(ctx.h.app, asked.body.approval_id, 'approve', KEYS.bob);
    expect(first.status).toBe(202);
    expect(first.body).toMatchObject({ status: 'pending', approvals_needed: 1 });
    expect(await restartJobs(ctx.h)).toEqual([]);
    const ok = await decide(ctx.h.app, asked.body.approval_id, 'approve', KEYS.carol);
    expect(ok.status).toBe(200);
    expect(ok.body).toMatchObject({ status: 'approved', job_id: asked.body.approval_id });
    expect(ok.body.approval).toMatchObject({
      requested_owner: 'alice',
      approvals: [
        { by: 'key:bob', owner: 'bob' },
        { by: 'key:carol', owner: 'carol' },
      ],
    });
  });

  it('two keys of one owner: the second cannot approve what the first asked for (403), nor approve twice', async () => {
    const asked = await restartAs(ctx.h.app, '?host=vault-1&service=core', asKey(KEYS.aliceCi));
    expect(asked.body).toMatchObject({ status: 'pending_approval', required: 2 });
    expect((await decide(ctx.h.app, asked.body.approval_id, 'approve', KEYS.alice)).status).toBe(403);
    // recorded, still waiting for the second person: 202, as a change that waits
    expect((await decide(ctx.h.app, asked.body.approval_id, 'approve', KEYS.bob)).status).toBe(202);
    const bobAgain = await request(ctx.h.app)
      .post(`/ops/approvals/${asked.body.approval_id}/approve`)
      .set(asKey(KEYS.bob))
      .set('Content-Type', 'application/json')
      .send(JSON.stringify({ reason: 'me again' }));
    expect(bobAgain.status).toBe(409);
    const last = await decide(ctx.h.app, asked.body.approval_id, 'approve', KEYS.carol);
    expect(last.body).toMatchObject({ status: 'approved', approvals_needed: 0 });
  });

  it('without an owner for the bearer token, a change it asks for needs one approving person more', async () => {
    const h = await createHarness(ctx.srv.url, {
      inventoryYaml: GUARDED_INVENTORY_YAML,
      now: () => clock,
      env: { OPS_API_KEYS_FILE: keysFile, OPS_BEARER_TOKEN_OWNER: undefined },
    });
    try {
      const asked = await request(h.app).post('/ops/restart?host=pay-1&service=ledger').set('Authorization', `Bearer ${BEARER}`);
      expect(asked.status).toBe(202);
      expect(asked.body).toMatchObject({ status: 'pending_approval', required: 2 });
      const first = await decide(h.app, asked.body.approval_id, 'approve', KEYS.bob);
      expect(first.status).toBe(202);
      expect(first.body).toMatchObject({ status: 'pending', job_id: null, approvals_needed: 1 });
      expect(await restartJobs(h)).toEqual([]);
      const second = await decide(h.app, asked.body.approval_id, 'approve', KEYS.carol);
      expect(second.body).toMatchObject({ status: 'approved', job_id: asked.body.approval_id });
    } finally {
      await h.close();
    }
  });

  it('a 63-character key id requests, approves and gets its job', async () => {
    const asked = await restartAs(ctx.h.app, '?host=pay-1&service=ledger', asKey(KEYS.longRequester));
    expect(asked.status).toBe(202);
    const ok = await decide(ctx.h.app, asked.body.approval_id, 'approve', KEYS.longApprover);
    expect(ok.status).toBe(200);
    expect(ok.body).toMatchObject({ status: 'approved', job_id: asked.body.approval_id });
    const job = await ctx.h.queue.bull.getJob(asked.body.approval_id);
    expect(job!.data).toMatchObject({ requested_by: `key:${LONG_REQUESTER}`, approvers: [`key:${LONG_APPROVER}`] });
    expect((await approval(ctx.h, asked.body.approval_id)).body).toMatchObject({ status: 'approved', job_id: asked.body.approval_id });
  });
});

describe('an Idempotency-Key names one change', () => {
  it('reused for another target: 422 on a host that needs approval as on any other, before anything is recorded', async () => {
    const first = await restartAs(ctx.h.app, '?host=pay-1&service=api', { ...asKey(KEYS.bob), 'Idempotency-Key': 'k-1' });
    expect(first.status).toBe(202);
    const again = await restartAs(ctx.h.app, '?host=pay-1&service=api', { ...asKey(KEYS.bob), 'Idempotency-Key': 'k-1' });
    expect(again.body).toMatchObject({ status: 'pending_approval', approval_id: first.body.approval_id });
    for (const qs of ['?host=pay-1&service=ledger', '?host=web-1&service=checkout']) {
      const other = await restartAs(ctx.h.app, qs, { ...asKey(KEYS.bob), 'Idempotency-Key': 'k-1' });
      expect(other.status).toBe(422);
      expect(other.body.detail).toBe('this Idempotency-Key was already used for a restart of another host or service');
    }
    const queued = await restartAs(ctx.h.app, '?host=web-1&service=frontend', { ...asKey(KEYS.bob), 'Idempotency-Key': 'k-2' });
    expect(queued.status).toBe(200);
    const otherHost = await restartAs(ctx.h.app, '?host=pay-1&service=api', { ...asKey(KEYS.bob), 'Idempotency-Key': 'k-2' });
    expect(otherHost.status).toBe(422);
    expect((await request(ctx.h.app).get('/ops/approvals').set(asKey(KEYS.bob))).body.approvals).toHaveLength(1);
  });
});

describe('an approval never reads approved without its job', () => {
  it('its job cannot be added (the budget spent meanwhile): it stays pending with its last error, 429; later approved with its job', async () => {
    // batch-2 asks for approval and shares namespace batch's budget of 3 restarts per 10 minutes.
    const asked = await restartAs(ctx.h.app, '?host=batch-2&service=archive', asKey(KEYS.bob));
    expect(asked.status).toBe(202);
    for (const svc of ['reports', 'exports', 'imports']) {
      expect((await restartAs(ctx.h.app, `?host=batch-1&service=${svc}`, asKey(KEYS.bob))).status).toBe(200);
    }
    const spent = await decide(ctx.h.app, asked.body.approval_id, 'approve', KEYS.carol);
    expect(spent.status).toBe(429);
    expect(spent.headers['retry-after']).toBe('600');
    const read = await approval(ctx.h, asked.body.approval_id);
    expect(read.body).toMatchObject({
      status: 'pending',
      last_error: expect.stringMatching(/^restart budget of namespace batch exhausted/),
    });
    expect(await ctx.h.queue.bull.getJob(asked.body.approval_id)).toBeUndefined();
    // Rejecting it now is refused: it was approved, only its carrying out waits.
    expect((await decide(ctx.h.app, asked.body.approval_id, 'reject', KEYS.bob)).status).toBe(409);

    clock += 600_000;
    const later = await decide(ctx.h.app, asked.body.approval_id, 'approve', KEYS.alice);
    expect(later.status).toBe(200);
    expect(later.body).toMatchObject({ status: 'approved', job_id: asked.body.approval_id });
    expect(await ctx.h.queue.bull.getJob(asked.body.approval_id)).toBeDefined();
    expect(await ctx.h.inspect.zscore(budgetKey('batch'), asked.body.approval_id)).not.toBeNull();
    expect((await approval(ctx.h, asked.body.approval_id)).body).toMatchObject({ status: 'approved', last_error: null });
  });

  it('an override given with the request does not cover a freeze declared after it: the last approval is refused (409), nothing recorded', async () => {
    const first = await freeze(KEYS.bob, { scope: 'namespace', namespace: 'payments', reason: 'db migration', duration: '1h' });
    expect(first.status).toBe(201);
    const asked = await restartAs(ctx.h.app, '?host=pay-1&service=api&override=true&reason=pods%20stuck', asKey(KEYS.bob));
    expect(asked.status).toBe(202);
    expect((await approval(ctx.h, asked.body.approval_id)).body.override).toMatchObject({
      by: 'key:bob',
      covers: [`freeze:${first.body.id}`],
    });
    const second = await freeze(KEYS.carol, { scope: 'all', reason: 'incident', duration: '1h' });
    expect(second.status).toBe(201);
    const refused = await decide(ctx.h.app, asked.body.approval_id, 'approve', KEYS.carol);
    expect(refused.status).toBe(409);
    expect(refused.body.detail).toContain(second.body.id);
    expect(refused.body.detail).not.toContain(first.body.id);
    expect((await approval(ctx.h, asked.body.approval_id)).body).toMatchObject({ status: 'pending', approvals: [] });
    // The approver may override the new freeze with a reason: reported, and carried by the job.
    const forced = await decide(ctx.h.app, asked.body.approval_id, 'approve', KEYS.carol, { reason: 'incident needs it', override: true });
    expect(forced.status).toBe(200);
    const job = await ctx.h.queue.bull.getJob(forced.body.job_id);
    expect(job!.data.override).toMatchObject({ covers: expect.arrayContaining([`freeze:${first.body.id}`, `freeze:${second.body.id}`]) });
    expect((await ctx.h.queue.bull.getJob(`report.${forced.body.job_id}.override`))!.data).toMatchObject({ event: 'override' });
  });

  it('a freeze declared after a deploy waits for approval holds the approved deploy', async () => {
    const sha = 'a'.repeat(40);
    const res = await request(ctx.h.app)
      .post('/webhook/scm')
      .set('X-Scm-Token', SCM_SECRET)
      .set('X-Scm-Event', 'Push Hook')
      .set('Content-Type', 'application/json')
      .send(JSON.stringify({ ref: 'refs/heads/main', checkout_sha: sha, project: { path_with_namespace: 'group/guarded' } }));
    expect(res.status).toBe(202);
    const approvalId = res.body.approval_id as string;
    expect(approvalId).toMatch(/^apr-/);
    const declared = await freeze(KEYS.bob, { scope: 'project', project: 'group/guarded', reason: 'release freeze', duration: '2h' });
    expect(declared.status).toBe(201);
    const ok = await decide(ctx.h.app, approvalId, 'approve', KEYS.carol);
    expect(ok.status).toBe(200);
    expect(ok.body).toMatchObject({ status: 'approved', job_id: approvalId, held_until: new Date(clock + 2 * 3600_000).toISOString() });
    expect(await (await ctx.h.queue.bull.getJob(approvalId))!.getState()).toBe('delayed');
  });
});

describe("a dead letter's retry is a new change: every guard, from the API and from Bull Board", () => {
  let worker: Awaited<ReturnType<typeof guardedWorker>> | undefined;
  afterEach(async () => {
    await worker?.close();
    worker = undefined;
  });

  /** A restart the real worker dead-letters (no cluster here), stopped once it has. */
  async function deadRestart(host: string, service: string, override?: { by: string; reason: string; covers: string[] }): Promise<string> {
    const id = await enqueue(ctx.h.queue, JOB.restartService, {
      host,
      service,
      ...(override ? { override } : {}),
      audit_id: 'a',
      requested_by: 'key:bob',
    });
    worker = await guardedWorker(ctx.srv.url, { now: () => clock });
    const deadline = Date.now() + 20_000;
    while ((await (await ctx.h.queue.bull.getJob(id))!.getState()) !== 'failed') {
      if (Date.now() > deadline) throw new Error(`restart ${id} was not dead-lettered in time`);
      await new Promise((r) => setTimeout(r, 50));
    }
    await worker.close();
    worker = undefined;
    return id;
  }
  const retryApi = (id: string) =>
    request(ctx.h.app)
      .post(`/ops/jobs/${id}/retry`)
      .set(asKey(KEYS.bob))
      .set('Content-Type', 'application/json')
      .send('{"reason":"again"}');
  const retryBoard = (id: string) => request(ctx.h.app).put(`/admin/queues/api/queues/ops/${id}/retry`).set(asKey(KEYS.bob));

  it('during a freeze: 409 from both, nothing re-queued; the old override is not carried over', async () => {
    const id = await deadRestart('web-1', 'checkout', { by: 'key:bob', reason: 'stuck', covers: ['window'] });
    const f = await freeze(KEYS.bob, { scope: 'namespace', namespace: 'shop', reason: 'sale', duration: '1h' });
    expect(f.status).toBe(201);
    for (const res of [await retryApi(id), await retryBoard(id)]) {
      expect(res.status).toBe(409);
      expect(res.body.detail).toContain(f.body.id);
    }
    expect(await (await ctx.h.queue.bull.getJob(id))!.getState()).toBe('failed');
    expect(await ctx.h.queue.bull.getJob(`${id}.retry`)).toBeUndefined();
  });

  it("past the namespace's budget: the budget's 429 with Retry-After from both", async () => {
    const id = await deadRestart('batch-1', 'sync');
    for (const svc of ['reports', 'exports', 'imports']) {
      expect((await restartAs(ctx.h.app, `?host=batch-1&service=${svc}`, asKey(KEYS.bob))).status).toBe(200);
    }
    for (const res of [await retryApi(id), await retryBoard(id)]) {
      expect(res.status).toBe(429);
      expect(res.headers['retry-after']).toBe('600');
      expect(res.body.detail).toMatch(/^restart budget of namespace batch exhausted/);
    }
    expect(await (await ctx.h.queue.bull.getJob(id))!.getState()).toBe('failed');
  });

  it('with room and no freeze: re-queued as <id>.retry through the pipeline (its budget place taken), from Bull Board too', async () => {
    const id = await deadRestart('batch-1', 'sync');
    const res = await retryBoard(id);
    expect(res.status).toBe(204);
    expect(await ctx.h.queue.bull.getJob(id)).toBeUndefined();
    const again = await ctx.h.queue.bull.getJob(`${id}.retry`);
    expect(again!.data).toMatchObject({ host: 'batch-1', service: 'sync', requested_by: 'key:bob', reason: 'retried from Bull Board' });
    expect(await ctx.h.inspect.zscore(budgetKey('batch'), `${id}.retry`)).not.toBeNull();
  });

  it('a host that asks for approval: the retry waits for approval (202), the dead letter stays', async () => {
    const id = await deadRestart('pay-1', 'ledger');
    const res = await retryApi(id);
    expect(res.status).toBe(202);
    expect(res.body).toMatchObject({ retried: false, outcome: 'pending_approval', approval_id: expect.stringMatching(/^apr-/) });
    expect(await (await ctx.h.queue.bull.getJob(id))!.getState()).toBe('failed');
  });
});
