import { afterEach, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { credentialId } from '../../../src/shared/crypto.js';
import { JOB } from '../../../src/shared/jobs.js';
import { HOLDS_KEY } from '../../../src/shared/keys.js';
import { OP_KEY, RO_KEY, createHarness, useHarness, type Harness } from '../../helpers/apiHarness.js';
import { GUARDED_INVENTORY_YAML, guardedWorker, restartAs } from '../../helpers/guards.js';
import { enqueue } from '../../helpers/queueOps.js';
import { waitFor } from '../../helpers/waitFor.js';
import { metricValue } from '../../helpers/workerSupport.js';

/**
 * Freezes, holds and change windows on a real Redis with a real worker: a freeze refuses the
 * restarts it covers (409, unless overridden with a reason) and holds the deploys (a BullMQ
 * delayed job, visible as held with its reason); lifting it releases them and the worker runs
 * them; a worker that wakes to a closed gate holds the deploy again; a window opens on a clock the
 * test controls and the held deploy runs then.
 */
const ctx = useHarness({ inventoryYaml: GUARDED_INVENTORY_YAML });
type Worker = Awaited<ReturnType<typeof guardedWorker>>;
let worker: Worker | undefined;
afterEach(async () => {
  await worker?.close(2000);
  worker = undefined;
});

const op = { 'X-API-Key': OP_KEY };
const json = (r: request.Test, body: unknown) => r.set('Content-Type', 'application/json').send(JSON.stringify(body));
const declare = (app: Harness['app'], body: Record<string, unknown>, key = OP_KEY) =>
  json(request(app).post('/ops/freezes').set('X-API-Key', key), body);
const lift = (app: Harness['app'], id: string, key = OP_KEY) =>
  json(request(app).delete(`/ops/freezes/${id}`).set('X-API-Key', key), { reason: 'incident closed' });
const getJob = async (app: Harness['app'], id: string) => (await request(app).get(`/ops/jobs/${id}`).set('X-API-Key', RO_KEY)).body;

function push(app: Harness['app'], project: string, sha: string, secret: string) {
  return request(app)
    .post('/webhook/scm')
    .set('Content-Type', 'application/json')
    .set('X-Scm-Token', secret)
    .set('X-Scm-Event', 'Push Hook')
    .send(JSON.stringify({ ref: 'refs/heads/main', checkout_sha: sha, project: { path_with_namespace: project } }));
}

describe('declaring, reading and lifting freezes', () => {
  it('an operator declares one (201); a read-only key lists and reads it but can neither declare nor lift (403)', async () => {
    const res = await declare(ctx.h.app, { scope: 'namespace', namespace: 'shop', reason: 'black friday', duration: '2h' });
    expect(res.status).toBe(201);
    expect(res.body).toEqual({
      id: expect.stringMatching(/^frz-[0-9a-f]{16}$/),
      scope: 'namespace',
      namespace: 'shop',
      project: null,
      reason: 'black friday',
      created_by: `key:${credentialId(OP_KEY)}`,
      created_at: expect.any(String),
      starts_at: expect.any(String),
      ends_at: expect.any(String),
      in_force: true,
    });
    expect(Date.parse(res.body.ends_at) - Date.parse(res.body.starts_at)).toBe(2 * 3600_000);
    expect(ctx.h.audits().at(-1)).toMatchObject({
      who: `key:${credentialId(OP_KEY)}`,
      status: 201,
      freeze_id: res.body.id,
      reason: 'black friday',
    });
    const list = await request(ctx.h.app).get('/ops/freezes').set('X-API-Key', RO_KEY);
    expect(list.body).toEqual({ freezes: [res.body], next_cursor: null });
    expect((await request(ctx.h.app).get(`/ops/freezes/${res.body.id}`).set('X-API-Key', RO_KEY)).body).toEqual(res.body);
    expect((await declare(ctx.h.app, { scope: 'all', reason: 'x', duration: '1h' }, RO_KEY)).status).toBe(403);
    expect((await lift(ctx.h.app, res.body.id, RO_KEY)).status).toBe(403);
    const lifted = await lift(ctx.h.app, res.body.id);
    expect(lifted.status).toBe(200);
    expect(lifted.body).toMatchObject({ lifted: true, freeze: { id: res.body.id }, released: [] });
    expect(ctx.h.audits().at(-1)).toMatchObject({ method: 'DELETE', freeze_id: res.body.id, reason: 'incident closed' });
    expect((await lift(ctx.h.app, res.body.id)).status).toBe(404);
    expect((await request(ctx.h.app).get('/ops/freezes').set('X-API-Key', RO_KEY)).body).toEqual({ freezes: [], next_cursor: null });
  });

  it.each([
    [{ scope: 'namespace', namespace: 'nowhere', reason: 'r', duration: '1h' }, 'namespace nowhere is not a namespace of the inventory'],
    [{ scope: 'project', project: 'group/unknown', reason: 'r', duration: '1h' }, 'project "group/unknown" is not in the inventory'],
    [{ scope: 'all', namespace: 'shop', reason: 'r', duration: '1h' }, 'namespace is only for scope namespace'],
    [{ scope: 'all', reason: 'r' }, 'give exactly one of ends_at or duration'],
    [{ scope: 'all', reason: 'r', duration: '1h', ends_at: '2099-01-01T00:00:00Z' }, 'give exactly one of ends_at or duration'],
    [{ scope: 'all', reason: 'r', ends_at: '2020-01-01T00:00:00Z' }, 'the freeze must end after it starts and after now'],
    [{ scope: 'all', reason: 'r', duration: '31d' }, 'a freeze may last at most 30 days from now'],
    [{ scope: 'all', reason: 'r', duration: 'soon' }, 'duration must be a duration such as 90m, 2h or 3d'],
    [{ scope: 'all', reason: ' ', duration: '1h' }, /^invalid body field reason/],
    [{ scope: 'galaxy', reason: 'r', duration: '1h' }, /^invalid body field scope/],
  ])('refused with 422 {detail, code: invalid_body}: %j', async (body, detail) => {
    const res = await declare(ctx.h.app, body);
    expect(res.status).toBe(422);
    expect(res.body.code).toBe('invalid_body');
    if (typeof detail === 'string') expect(res.body).toEqual({ detail, code: 'invalid_body' });
    else expect(res.body.detail).toMatch(detail);
  });

  it('lists page by their end, soonest first: a freeze lifted between two pages moves no other to another page', async () => {
    const ids: string[] = [];
    for (const duration of ['3h', '1h', '2h']) ids.push((await declare(ctx.h.app, { scope: 'all', reason: 'r', duration })).body.id);
    const list = (qs: string) => request(ctx.h.app).get(`/ops/freezes${qs}`).set('X-API-Key', RO_KEY);
    const page1 = await list('?limit=2');
    expect(page1.body.freezes.map((f: { id: string }) => f.id)).toEqual([ids[1], ids[2]]);
    expect((await lift(ctx.h.app, ids[1]!)).status).toBe(200);
    const page2 = await list(`?limit=2&cursor=${encodeURIComponent(page1.body.next_cursor)}`);
    expect(page2.body).toEqual({ freezes: [expect.objectContaining({ id: ids[0] })], next_cursor: null });
    const holds = await request(ctx.h.app).get('/ops/holds?limit=1').set('X-API-Key', RO_KEY);
    expect(holds.body).toEqual({ holds: [], next_cursor: null });
    expect((await request(ctx.h.app).get('/ops/holds?limit=x').set('X-API-Key', RO_KEY)).body.code).toBe('invalid_query');
  });

  it('each API process keeps the freezes in memory, told of changes through pub/sub: one declared on another replica stops restarts here', async () => {
    const other = await createHarness(ctx.srv.url, { inventoryYaml: GUARDED_INVENTORY_YAML });
    try {
      expect((await restartAs(other.app, '?host=web-1&service=frontend')).status).toBe(200);
      const f = await declare(ctx.h.app, { scope: 'namespace', namespace: 'shop', reason: 'replica test', duration: '1h' });
      await waitFor('the other replica to refuse', async () => (await restartAs(other.app, '?host=web-1&service=checkout')).status === 409);
      await lift(ctx.h.app, f.body.id);
      await waitFor(
        'the other replica to accept again',
        async () => (await restartAs(other.app, '?host=web-1&service=checkout')).status === 200,
      );
    } finally {
      await other.close();
    }
  });

  it('a freeze that starts later holds nothing yet', async () => {
    const starts = new Date(Date.now() + 3600_000).toISOString();
    const f = await declare(ctx.h.app, { scope: 'all', reason: 'planned', starts_at: starts, duration: '1h' });
    expect(f.body.in_force).toBe(false);
    expect(Date.parse(f.body.starts_at)).toBe(Date.parse(starts));
    expect((await restartAs(ctx.h.app, '?host=web-1&service=frontend')).status).toBe(200);
  });
});

describe('a restart a freeze covers', () => {
  it('is refused with 409 naming the freeze and its reason; override=true needs a reason; with one it goes, audited, reported, carried by the job', async () => {
    const f = await declare(ctx.h.app, { scope: 'namespace', namespace: 'shop', reason: 'black friday', duration: '2h' });
    const refused = await restartAs(ctx.h.app, '?host=web-1&service=frontend');
    expect(refused.status).toBe(409);
    expect(refused.body.detail).toMatch(
      new RegExp(
        `^restart of Deployment shop/frontend refused: freeze ${f.body.id} of namespace shop until .* \\(black friday\\)\\. An operator may restart anyway with override=true and a reason$`,
      ),
    );
    expect(await metricValue(ctx.h.metrics as never, 'opsgate_guard_refusals_total', { guard: 'freeze' })).toBeGreaterThan(0);
    // another namespace is not frozen
    expect((await restartAs(ctx.h.app, '?host=batch-1&service=reports')).status).toBe(200);

    const noReason = await restartAs(ctx.h.app, '?host=web-1&service=frontend&override=true');
    expect(noReason.status).toBe(422);
    expect(noReason.body).toEqual({ detail: 'override=true needs a reason (query parameter "reason")', code: 'invalid_query' });

    const forced = await restartAs(ctx.h.app, '?host=web-1&service=frontend&override=true&reason=payment%20pods%20stuck', op);
    expect(forced.status).toBe(200);
    const job = await ctx.h.queue.bull.getJob(forced.body.job_id);
    expect(job!.data).toMatchObject({
      override: { by: `key:${credentialId(OP_KEY)}`, reason: 'payment pods stuck' },
      reason: 'payment pods stuck',
    });
    expect(ctx.h.audits().at(-1)).toMatchObject({ status: 200, override: true, reason: 'payment pods stuck', job_id: forced.body.job_id });
    const report = await ctx.h.queue.bull.getJob(`report.${forced.body.job_id}.override`);
    expect(report!.data).toMatchObject({ event: 'override', reason: expect.stringContaining('payment pods stuck (overriding: freeze') });
    expect(await metricValue(ctx.h.metrics as never, 'opsgate_guard_overrides_total', {})).toBe(1);
  });

  it('a restart queued before the freeze and taken by the worker during it is refused (outcome refused), unless an override covers that freeze', async () => {
    const jobId = await enqueue(ctx.h.queue, JOB.restartService, {
      host: 'web-1',
      service: 'checkout',
      audit_id: 'a',
      requested_by: 'key:x',
    });
    const freeze = await declare(ctx.h.app, { scope: 'all', reason: 'incident', duration: '1h' });
    // An override of another (earlier) freeze, or one that names no freeze, does not cover this one.
    const stale = await enqueue(ctx.h.queue, JOB.restartService, {
      host: 'web-1',
      service: 'api',
      override: { by: 'key:ops', reason: 'stuck', covers: ['freeze:frz-0000000000000000'] },
      audit_id: 'a',
      requested_by: 'key:ops',
    });
    worker = await guardedWorker(ctx.srv.url);
    const done = await waitFor('the restart refused', async () => {
      const j = await getJob(ctx.h.app, jobId);
      return j.state === 'failed' ? j : undefined;
    });
    expect(done.failed_reason).toMatch(/^restart refused: freeze frz-[0-9a-f]+ of everything until .* \(incident\)$/);
    expect(done.outcome).toMatchObject({ result: 'refused' });
    const staleDone = await waitFor('the stale override refused', async () => {
      const j = await getJob(ctx.h.app, stale);
      return j.state === 'failed' ? j : undefined;
    });
    expect(staleDone.outcome).toMatchObject({ result: 'refused' });
    const forced = await enqueue(ctx.h.queue, JOB.restartService, {
      host: 'web-1',
      service: 'frontend',
      override: { by: 'key:ops', reason: 'stuck', covers: [`freeze:${freeze.body.id}`] },
      audit_id: 'a',
      requested_by: 'key:ops',
    });
    const ran = await waitFor('the overridden restart run', async () => {
      const j = await getJob(ctx.h.app, forced);
      return j.state === 'failed' ? j : undefined;
    });
    expect(ran.outcome.result).toBe('failed'); // it ran (and found no cluster here), it was not refused
    expect(worker.logs.find('restart runs through a closed gate (overridden)')).toHaveLength(1);
  });
});

describe('a deploy a freeze covers is held, and lifting the freeze releases it to a real worker', () => {
  it('held at intake: 202 held, GET /ops/jobs/{id} state held with the reason, listed by GET /ops/holds; the worker leaves it; lifted: promoted and run', async () => {
    const f = await declare(ctx.h.app, { scope: 'project', project: 'group/app', reason: 'release candidate testing', duration: '2h' });
    const res = await push(ctx.h.app, 'group/app', 'held-1', ctx.h.config.SCM_WEBHOOK_SECRET as string);
    expect(res.status).toBe(202);
    expect(res.body).toMatchObject({ accepted: true, status: 'held', held_until: f.body.ends_at });
    const id = res.body.job_id as string;
    const held = await getJob(ctx.h.app, id);
    expect(held).toMatchObject({
      id,
      name: JOB.runDeployPipeline,
      state: 'held',
      outcome: { result: 'held', until: f.body.ends_at, reason: expect.stringContaining('release candidate testing') },
      hold: {
        job_id: id,
        project: 'group/app',
        held_by: 'api',
        reasons: [{ guard: 'freeze', freeze_id: f.body.id, reason: 'release candidate testing' }],
      },
    });
    expect((await request(ctx.h.app).get('/ops/holds').set('X-API-Key', RO_KEY)).body.holds.map((h: any) => h.job_id)).toEqual([id]);
    expect((await ctx.h.queue.bull.getJob(`report.${id}.held`))?.data.event).toBe('held');

    // a running worker leaves it alone: it runs another job meanwhile, the deploy stays held
    worker = await guardedWorker(ctx.srv.url);
    const other = await enqueue(ctx.h.queue, JOB.notifyOncall, { alertname: 'x', annotations: {}, audit_id: 'a', requested_by: 'b' });
    await waitFor('the other job done', async () => (await getJob(ctx.h.app, other)).state === 'completed');
    expect((await getJob(ctx.h.app, id)).state).toBe('held');

    const lifted = await lift(ctx.h.app, f.body.id);
    expect(lifted.body.released).toEqual([id]);
    expect(ctx.h.audits().at(-1)).toMatchObject({ released: [id] });
    const ran = await waitFor('the released deploy run by the worker', async () => {
      const j = await getJob(ctx.h.app, id);
      return j.state === 'failed' || j.state === 'completed' ? j : undefined;
    });
    // it ran (this worker has no cluster: the deploy fails there, with that outcome)
    expect(ran).toMatchObject({ state: 'failed', attempts_made: 1, outcome: { result: 'failed' } });
    expect(ran.outcome.reason).toMatch(/none in this test/);
    expect(await ctx.h.inspect.hexists(HOLDS_KEY, id)).toBe(0);
    expect((await request(ctx.h.app).get('/ops/holds').set('X-API-Key', RO_KEY)).body.holds).toEqual([]);
  });

  it('a freeze declared after the deploy was queued: the worker holds it when it takes it (held by worker), and runs it once lifted', async () => {
    const res = await push(ctx.h.app, 'group/app', 'held-2', ctx.h.config.SCM_WEBHOOK_SECRET as string);
    expect(res.body.status).toBeUndefined();
    const id = res.body.job_id as string;
    const f = await declare(ctx.h.app, { scope: 'namespace', namespace: 'deploys', reason: 'cluster upgrade', duration: '1h' });
    worker = await guardedWorker(ctx.srv.url);
    const held = await waitFor('the worker holding it', async () => {
      const j = await getJob(ctx.h.app, id);
      return j.state === 'held' ? j : undefined;
    });
    expect(held.hold).toMatchObject({ held_by: 'worker', reasons: [{ guard: 'freeze', freeze_id: f.body.id }] });
    expect(held.attempts_made).toBe(0); // being held is not an attempt
    expect(await metricValue(worker.metrics, 'opsgate_holds_total', { by: 'worker', guard: 'freeze' })).toBe(1);
    expect(worker.logs.find('deploy held')).toHaveLength(1);
    expect((await lift(ctx.h.app, f.body.id)).body.released).toEqual([id]);
    await waitFor('the deploy run', async () => (await getJob(ctx.h.app, id)).state === 'failed');
  });
});

describe('change windows on a clock the test controls', () => {
  it('a restart outside its host windows is refused (409) with the next opening', async () => {
    const saturday = Date.parse('2026-03-07T12:00:00Z');
    const h = await createHarness(ctx.srv.url, { inventoryYaml: GUARDED_INVENTORY_YAML, now: () => saturday });
    try {
      const res = await restartAs(h.app, '?host=office-1&service=intranet');
      expect(res.status).toBe(409);
      expect(res.body.detail).toBe(
        'restart of Deployment office/intranet refused: outside its change windows (mon,tue,wed,thu,fri 09:00-17:00 Europe/Paris); the next opens at 2026-03-09T08:00:00.000Z. An operator may restart anyway with override=true and a reason',
      );
    } finally {
      await h.close();
    }
  });

  it('a deploy pushed 3 s before its window opens is held until it opens, then the worker (same clock) runs it', async () => {
    // The clock of both processes: real time shifted so that "now" is Monday 2 March 2026, 08:59:57 in Paris.
    const offset = Date.parse('2026-03-02T07:59:57Z') - Date.now();
    const clock = () => Date.now() + offset;
    const h = await createHarness(ctx.srv.url, { inventoryYaml: GUARDED_INVENTORY_YAML, now: clock });
    try {
      worker = await guardedWorker(ctx.srv.url, { now: clock });
      const res = await push(h.app, 'group/office', 'window-1', h.config.SCM_WEBHOOK_SECRET as string);
      expect(res.body).toMatchObject({ status: 'held', held_until: '2026-03-02T08:00:00.000Z' });
      const id = res.body.job_id as string;
      expect((await getJob(h.app, id)).hold.reasons).toEqual([
        { guard: 'window', opens_at: '2026-03-02T08:00:00.000Z', windows: ['mon,tue,wed,thu,fri 09:00-17:00 Europe/Paris'] },
      ]);
      const ran = await waitFor('the deploy run once the window opened', async () => {
        const j = await getJob(h.app, id);
        return j.state === 'failed' || j.state === 'completed' ? j : undefined;
      });
      // it ran at or after the opening (on the shared clock) and was not held again
      expect(Date.parse(ran.processed_at) + offset).toBeGreaterThanOrEqual(Date.parse('2026-03-02T08:00:00Z') - 50);
      expect(worker.logs.find('deploy held')).toEqual([]);
    } finally {
      await h.close();
    }
  });

  it('a worker that wakes to a closed window (its clock an hour behind) holds the deploy again until the window opens on its clock', async () => {
    const offset = Date.parse('2026-03-02T07:59:58Z') - Date.now();
    const h = await createHarness(ctx.srv.url, { inventoryYaml: GUARDED_INVENTORY_YAML, now: () => Date.now() + offset });
    try {
      worker = await guardedWorker(ctx.srv.url, { now: () => Date.now() + offset - 3600_000 });
      const res = await push(h.app, 'group/office', 'window-2', h.config.SCM_WEBHOOK_SECRET as string);
      const id = res.body.job_id as string;
      const held = await waitFor('held again by the worker', async () => {
        const j = await getJob(h.app, id);
        return j.hold?.held_by === 'worker' ? j : undefined;
      });
      expect(held).toMatchObject({
        state: 'held',
        attempts_made: 0,
        hold: { reasons: [{ guard: 'window', opens_at: '2026-03-02T08:00:00.000Z' }] },
      });
      // BullMQ delays it by what the worker's clock still has to wait: about an hour
      const delayed = await h.queue.bull.getJob(id);
      expect(delayed!.delay).toBeGreaterThan(3500_000);
    } finally {
      await h.close();
    }
  });
});
