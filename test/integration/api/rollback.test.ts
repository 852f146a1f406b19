import { beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { parseInventory } from '../../../src/shared/inventory.js';
import { JOB } from '../../../src/shared/jobs.js';
import { createDeployHistory } from '../../../src/changes/deployOrder/history.js';
import { concurrencyGroup } from '../../../src/changes/deployOrder/store.js';
import { BEARER, OP_KEY, RO_KEY, useHarness } from '../../helpers/apiHarness.js';

/**
 * POST /ops/deploys/rollback (src/changes/rollback.ts) on real Redis through the real app: who may
 * call it, its refusals ({detail, code} with the right status), which commit it picks from the
 * history and the job it queues. The history's deploys are written through its store, as the
 * worker writes them; deploys and rollbacks run by the worker on a real API server are
 * test/e2e/controlplane/rollback.test.ts's.
 */
const INVENTORY_YAML = `
projects:
  group/app:
    namespace: deploys
    serviceAccountName: deployer
    image: alpine:3.20
  group/fresh:
    namespace: deploys
    serviceAccountName: deployer
    image: alpine:3.20
`;
const inventory = parseInventory(INVENTORY_YAML);
// The history the tests read is made once, before them: Redis is not emptied between tests.
const ctx = useHarness({ inventoryYaml: INVENTORY_YAML, flush: false });
const REF = 'refs/heads/main';

/** The deploys of group/app that succeeded, oldest first: commits aaa1, aaa2, then aaa3 (failed). */
const ids: string[] = [];

const view = async (id: string) => (await request(ctx.h.app).get(`/ops/deploys/${id}`).set('X-API-Key', RO_KEY)).body;

beforeAll(async () => {
  // The history the worker writes as deploys end, written through the same store (real Redis):
  // the worker's runs of deploys on a real API server are test/e2e/controlplane's.
  const history = createDeployHistory(ctx.h.redis, 100);
  const group = concurrencyGroup(inventory, 'group/app', REF);
  const t0 = Date.now() - 60_000;
  for (const [i, sha, state] of [
    [0, 'aaa1', 'succeeded'],
    [1, 'aaa2', 'succeeded'],
    // A failed deploy of another commit is never a target.
    [2, 'aaa3', 'failed'],
  ] as const) {
    const id = `hist-${i + 1}`;
    const first = { project: 'group/app', ref: REF, commit: sha, group, origin: 'push' as const, owner: null, queue_job: id };
    await history.record({ id, accepted: t0 + i * 1000, first, step: { state: 'running', started_at: t0 + i * 1000 + 10 } });
    await history.record({ id, accepted: t0 + i * 1000, first, step: { state, finished_at: t0 + i * 1000 + 500 } });
    if (state === 'succeeded') ids.push(id);
  }
});

const rollback = (body: unknown, headers: Record<string, string> = { 'X-API-Key': OP_KEY }) =>
  request(ctx.h.app)
    .post('/ops/deploys/rollback')
    .set(headers)
    .set('Content-Type', 'application/json')
    .send(typeof body === 'string' ? body : JSON.stringify(body));

describe('POST /ops/deploys/rollback', () => {
  it("by default: the newest succeeded deploy's commit other than the current one, queued as a rollback job", async () => {
    const res = await rollback({ project: 'group/app', ref: REF, reason: 'bad release' });
    expect(res.status).toBe(202);
    expect(res.body).toMatchObject({
      project: 'group/app',
      ref: REF,
      sha: 'aaa1',
      rolled_back_from: ids[1],
      rolled_back_to: ids[0],
      accepted: true,
      duplicate: false,
      status: 'queued',
    });
    const job = await ctx.h.queue.bull.getJob(res.body.job_id as string);
    expect(job?.name).toBe(JOB.runDeployPipeline);
    expect(job?.data).toMatchObject({ sha: 'aaa1', rollback: true, rolled_back_from: ids[1], reason: 'bad release' });
    expect(await view(res.body.job_id as string)).toMatchObject({
      origin: 'rollback',
      commit: 'aaa1',
      state: 'queued',
      rolled_back_from: ids[1],
    });
  });

  it('to a named commit that succeeded (the current one too); a second request is a second deploy, never a duplicate', async () => {
    const one = await rollback({ project: 'group/app', ref: REF, to: 'aaa2', reason: 'r' });
    const two = await rollback({ project: 'group/app', ref: REF, to: 'aaa2', reason: 'r' });
    for (const res of [one, two]) {
      expect(res.status).toBe(202);
      expect(res.body).toMatchObject({ sha: 'aaa2', rolled_back_to: ids[1], accepted: true, duplicate: false });
    }
    expect(two.body.job_id).not.toBe(one.body.job_id);
    expect(two.body.event_id).not.toBe(one.body.event_id);
  });

  it('a commit that never succeeded there (a failed one, an unknown one): 409 rollback_target_unknown', async () => {
    for (const to of ['aaa3', 'ffff']) {
      const res = await rollback({ project: 'group/app', ref: REF, to, reason: 'r' });
      expect(res.status).toBe(409);
      expect(res.body).toEqual({ detail: expect.stringContaining(to), code: 'rollback_target_unknown' });
    }
    const none = await rollback({ project: 'group/fresh', ref: REF, reason: 'r' });
    expect(none.status).toBe(409);
    expect(none.body.code).toBe('rollback_target_unknown');
  });

  it("under a freeze: held; a person's override lets it through, the job carrying what it covers", async () => {
    const freeze = await request(ctx.h.app)
      .post('/ops/freezes')
      .set('X-API-Key', OP_KEY)
      .set('Content-Type', 'application/json')
      .send(JSON.stringify({ scope: 'project', project: 'group/app', reason: 'incident', duration: '1h' }));
    expect(freeze.status).toBe(201);
    try {
      const held = await rollback({ project: 'group/app', ref: REF, reason: 'r' });
      expect(held.status).toBe(202);
      expect(held.body).toMatchObject({ status: 'held', held_reasons: expect.stringContaining('incident') });
      expect(await view(held.body.job_id as string)).toMatchObject({ state: 'held', origin: 'rollback' });

      const through = await rollback({ project: 'group/app', ref: REF, reason: 'the release breaks checkout', override: true });
      expect(through.status).toBe(202);
      expect(through.body).toMatchObject({ status: 'queued', sha: 'aaa1' });
      const job = await ctx.h.queue.bull.getJob(through.body.job_id as string);
      expect(job?.data).toMatchObject({
        rollback: true,
        override: { reason: 'the release breaks checkout', covers: [`freeze:${freeze.body.id}`] },
      });
    } finally {
      await request(ctx.h.app)
        .delete(`/ops/freezes/${freeze.body.id}`)
        .set('X-API-Key', OP_KEY)
        .set('Content-Type', 'application/json')
        .send('{"reason":"over"}');
    }
  });

  it('refuses bad input with {detail, code}: 400, 404, 422', async () => {
    const cases: Array<[unknown, number, string]> = [
      ['{nope', 400, 'invalid_json'],
      [{ project: 'group/nope', ref: REF, reason: 'r' }, 404, 'unknown_project'],
      [{ project: 'group/app', ref: 'refs/heads/dev', reason: 'r' }, 422, 'ref_not_deployable'],
      [{ project: 'group/app', ref: REF }, 422, 'invalid_body'],
      [{ project: 'group/app', ref: REF, reason: '   ' }, 422, 'invalid_body'],
      [{ ref: REF, reason: 'r' }, 422, 'invalid_body'],
      [{ project: 'group/app', ref: REF, reason: 'r', to: '--orphan=x' }, 422, 'invalid_body'],
      [{ project: 'group/app', ref: REF, reason: 'r', sha: 'aaa1' }, 422, 'invalid_body'],
      [{ project: 'group/app', ref: REF, reason: 'r', override: false }, 422, 'invalid_body'],
      ['', 422, 'invalid_body'],
    ];
    for (const [body, status, code] of cases) {
      const res = await rollback(body);
      expect({ body, status: res.status, code: res.body.code, detail: typeof res.body.detail }).toEqual({
        body,
        status,
        code,
        detail: 'string',
      });
    }
  });

  it('needs an operator: 401 without a credential, 403 for a readonly key and for the shared bearer token; 405 for another method', async () => {
    const body = { project: 'group/app', ref: REF, reason: 'r' };
    expect((await rollback(body, {})).status).toBe(401);
    const ro = await rollback(body, { 'X-API-Key': RO_KEY });
    expect([ro.status, ro.body.code]).toEqual([403, 'operator_role_required']);
    const shared = await rollback(body, { Authorization: `Bearer ${BEARER}` });
    expect([shared.status, shared.body.code]).toEqual([403, 'bearer_token_not_accepted']);
    const get = await request(ctx.h.app).get('/ops/deploys/rollback').set('X-API-Key', RO_KEY);
    expect(get.status).toBe(405);
  });
});
