import { describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { coalesceId } from '../../../src/changes/restart.js';
import { credentialId } from '../../../src/shared/crypto.js';
import { JOB } from '../../../src/shared/jobs.js';
import { restartedAtKey } from '../../../src/shared/keys.js';
import { BEARER, containsSecret, OP_KEY, RO_KEY, runWorkerUntil as runWorkerUntilOn, useHarness } from '../../helpers/apiHarness.js';
import { enqueue } from '../../helpers/queueOps.js';

/**
 * Dead letters without a browser: GET /ops/jobs?state=failed and
 * POST /ops/jobs/{id}/retry, on a real Redis; the dead letters are made by the real worker
 * processor (BullMQ Worker) failing jobs for real reasons (no cluster configured, host not in the
 * inventory).
 */
const ctx = useHarness();

const runWorkerUntil = (done: () => Promise<boolean>) => runWorkerUntilOn(ctx.srv.url, done);

const failedCount = async () => await ctx.h.queue.bull.getJobCountByTypes('failed');

/** n restart jobs for hosts that are not in the inventory: the worker dead-letters each at once. */
async function deadLetters(n: number): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    ids.push(
      await enqueue(ctx.h.queue, JOB.restartService, {
        host: `gone-${i}`,
        service: 'api',
        audit_id: `a-${i}`,
        requested_by: 'key:000000000000',
      }),
    );
  }
  await runWorkerUntil(async () => (await failedCount()) === n);
  return ids;
}

const list = (qs: string, key: string | null = RO_KEY) => {
  const req = request(ctx.h.app).get(`/ops/jobs${qs}`);
  return key === null ? req : req.set('X-API-Key', key);
};
const retry = (id: string, body: unknown = { reason: 'cluster fixed' }, key = OP_KEY) =>
  request(ctx.h.app).post(`/ops/jobs/${id}/retry`).set('X-API-Key', key).set('Content-Type', 'application/json').send(JSON.stringify(body));

describe('GET /ops/jobs?state=failed (any valid key)', () => {
  it('lists the dead letters with name, reason, attempts and timestamps, never their data', async () => {
    const [id] = await deadLetters(1);
    const res = await list('?state=failed');
    expect(res.status).toBe(200);
    expect(res.body).toEqual({
      state: 'failed',
      total: 1,
      offset: 0,
      limit: 20,
      next_offset: null,
      next_cursor: null,
      jobs: [
        {
          id,
          name: JOB.restartService,
          state: 'failed',
          attempts_made: 1,
          attempts_max: 5,
          failed_reason: 'host "gone-0" is not in the inventory',
          // the worker's outcome of the restart, in its progress and on the view
          progress: { outcome: { result: 'failed', reason: 'host "gone-0" is not in the inventory', duration_s: expect.any(Number) } },
          outcome: { result: 'failed', reason: 'host "gone-0" is not in the inventory', duration_s: expect.any(Number) },
          created_at: expect.stringMatching(/^\d{4}-\d\d-\d\dT/),
          processed_at: expect.stringMatching(/^\d{4}-\d\d-\d\dT/),
          finished_at: expect.stringMatching(/^\d{4}-\d\d-\d\dT/),
        },
      ],
    });
    expect(JSON.stringify(res.body)).not.toContain('audit_id');
    expect(JSON.stringify(res.body)).not.toContain('requested_by');
    expect(containsSecret(JSON.stringify(res.body))).toBeUndefined();
    // state defaults to failed
    expect((await list('')).body.jobs.map((j: { id: string }) => j.id)).toEqual([id]);
  });

  it('pages newest first with offset/limit and next_offset', async () => {
    const ids = await deadLetters(5);
    const seen: string[] = [];
    const offsets: Array<number | null> = [];
    let offset: number | null = 0;
    while (offset !== null) {
      const res = await list(`?state=failed&limit=2&offset=${offset}`);
      expect(res.status).toBe(200);
      expect(res.body.total).toBe(5);
      seen.push(...res.body.jobs.map((j: { id: string }) => j.id));
      offset = res.body.next_offset;
      offsets.push(offset);
    }
    expect(offsets).toEqual([2, 4, null]);
    expect(seen.sort()).toEqual([...ids].sort());
    // the same pages through the cursor; the cursor carries the state, so it alone continues the query
    const first = await list('?state=failed&limit=2');
    const byCursor: string[][] = [first.body.jobs.map((j: { id: string }) => j.id)];
    let cursor: string | null = first.body.next_cursor;
    while (cursor !== null) {
      const res = await list(`?limit=2&cursor=${encodeURIComponent(cursor)}`);
      expect(res.status).toBe(200);
      expect(res.body.state).toBe('failed');
      byCursor.push(res.body.jobs.map((j: { id: string }) => j.id));
      cursor = res.body.next_cursor;
    }
    expect(byCursor.map((p) => p.length)).toEqual([2, 2, 1]);
    expect(byCursor.flat().sort()).toEqual([...ids].sort());
    const finished = (await list('?limit=5')).body.jobs.map((j: { finished_at: string }) => j.finished_at);
    expect([...finished].sort().reverse()).toEqual(finished);
  });

  it('a cursor is refused (422) with offset, with another state, or when it is not one of this list', async () => {
    await deadLetters(3);
    const cursor = (await list('?state=failed&limit=1')).body.next_cursor as string;
    expect(typeof cursor).toBe('string');
    expect((await list(`?state=failed&cursor=${encodeURIComponent(cursor)}`)).status).toBe(200); // the same state: fine
    const both = await list(`?offset=1&cursor=${encodeURIComponent(cursor)}`);
    expect(both.status).toBe(422);
    expect(both.body).toEqual({ detail: 'give cursor or offset, not both', code: 'invalid_query' });
    // the shape of a cursor of another list (opaque to clients: base64url of JSON naming its list)
    const ofDeliveries = Buffer.from(JSON.stringify({ l: 'deliveries', p: 'scm.1-0', f: {} })).toString('base64url');
    for (const bad of [
      `state=waiting&cursor=${encodeURIComponent(cursor)}`,
      'cursor=not-a-cursor',
      `cursor=${cursor.slice(0, -4)}`,
      `cursor=${ofDeliveries}`,
    ]) {
      const res = await list(`?${bad}`);
      expect([bad, res.status, res.body.code]).toEqual([bad, 422, 'invalid_cursor']);
    }
  });

  it('other states: waiting jobs are listed too', async () => {
    const res = await request(ctx.h.app).post('/ops/restart?host=web-1&service=checkout').set('Authorization', `Bearer ${BEARER}`);
    const waiting = await list('?state=waiting');
    expect(waiting.body.jobs.map((j: { id: string }) => j.id)).toEqual([res.body.job_id]);
    expect((await list('?state=failed')).body).toMatchObject({ total: 0, jobs: [], next_offset: null });
  });

  it.each([
    ['unknown state', '?state=bogus', /state/],
    ['limit 0', '?limit=0', /limit/],
    ['limit over 100', '?limit=101', /limit/],
    ['limit not a number', '?limit=ten', /limit/],
    ['negative offset', '?offset=-1', /offset/],
    ['state given twice', '?state=failed&state=completed', /"state" must be given once/],
  ])('%s -> 422 {detail, code: invalid_query}', async (_name, qs, detail) => {
    const res = await list(qs);
    expect(res.status).toBe(422);
    expect(Object.keys(res.body)).toEqual(['detail', 'code']);
    expect(res.body.code).toBe('invalid_query');
    expect(res.body.detail).toMatch(detail);
  });

  it('no key -> 401; POST -> 405', async () => {
    expect((await list('?state=failed', null)).status).toBe(401);
    const res = await request(ctx.h.app).post('/ops/jobs').set('X-API-Key', OP_KEY);
    expect(res.status).toBe(405);
    expect(res.headers.allow).toContain('GET');
  });
});

describe('POST /ops/jobs/{id}/retry (operator key)', () => {
  it('re-queues a dead-lettered restart as a new change <id>.retry with a fresh attempt budget; audited with principal, job and reason', async () => {
    const [id] = await deadLetters(1);
    const res = await retry(id!, { reason: 'inventory fixed (CHG-1234)' });
    expect(res.status).toBe(200);
    expect(res.body).toEqual({
      retried: true,
      job: expect.objectContaining({
        id: `${id}.retry`,
        name: JOB.restartService,
        state: 'waiting',
        attempts_made: 0,
        failed_reason: null,
      }),
    });
    expect((await ctx.h.queue.jobs.get(`${id}.retry`))?.state).toBe('waiting');
    expect(await ctx.h.queue.jobs.get(id!)).toBeUndefined();
    // the retry is the operator's change, with their reason
    const data = (await ctx.h.queue.bull.getJob(`${id}.retry`))!.data as { requested_by: string; reason: string };
    expect(data).toMatchObject({ requested_by: `key:${credentialId(OP_KEY)}`, reason: 'inventory fixed (CHG-1234)' });
    const audit = ctx.h.audits().find((a) => a.path === `/ops/jobs/${id}/retry`);
    expect(audit).toMatchObject({
      who: `key:${credentialId(OP_KEY)}`,
      role: 'operator',
      status: 200,
      job_id: id,
      job_name: JOB.restartService,
      retry_reason: 'inventory fixed (CHG-1234)',
      body_sha256: expect.stringMatching(/^[0-9a-f]{64}$/),
    });
    // The retry runs and is dead-lettered again with its own attempt count.
    await runWorkerUntil(async () => (await ctx.h.queue.jobs.get(`${id}.retry`))?.state === 'failed');
    expect((await ctx.h.queue.jobs.get(`${id}.retry`))?.attempts_made).toBe(1);
  });

  it('a job that is not failed -> 409; unknown -> 404; a readonly key -> 403; nothing changes', async () => {
    const [id] = await deadLetters(1);
    expect((await retry(id!)).status).toBe(200);
    const again = await retry(id!);
    expect(again.status).toBe(409);
    expect(again.body).toEqual({ detail: 'job is waiting; only a failed (dead-lettered) job can be retried', code: 'job_not_failed' });
    expect((await retry('no-such-job')).status).toBe(404);
    expect((await retry('bad id!')).status).toBe(404);
    const ro = await retry(id!, { reason: 'x' }, RO_KEY);
    expect(ro.status).toBe(403);
    expect(ctx.h.audits().filter((a) => a.status === 409)[0]).toMatchObject({ job_id: id, retry_reason: 'cluster fixed' });
  });

  it.each([
    ['no reason', {}, 422],
    ['blank reason', { reason: '  ' }, 422],
    ['reason not a string', { reason: 7 }, 422],
  ])('%s -> 422, the job stays failed', async (_name, body, status) => {
    const [id] = await deadLetters(1);
    const res = await retry(id!, body);
    expect(res.status).toBe(status);
    expect(res.body.detail).toMatch(/reason/);
    expect((await ctx.h.queue.jobs.get(id!))?.state).toBe('failed');
  });

  it('invalid JSON -> 400', async () => {
    const res = await request(ctx.h.app)
      .post('/ops/jobs/1/retry')
      .set('X-API-Key', OP_KEY)
      .set('Content-Type', 'application/json')
      .send('{nope');
    expect(res.status).toBe(400);
    expect(res.body).toEqual({ detail: expect.any(String), code: 'invalid_json' });
  });

  it('a retried restart is a new restart (<id>.retry, no restartedAt of the old one) holding its coalescing record; repeating the call answers it again', async () => {
    const first = await request(ctx.h.app).post('/ops/restart?host=web-1&service=checkout').set('Authorization', `Bearer ${BEARER}`);
    const id = first.body.job_id as string;
    await runWorkerUntil(async () => (await ctx.h.queue.jobs.get(id))?.state === 'failed');
    expect((await ctx.h.queue.jobs.get(id))?.failed_reason).toMatch(/^no Kubernetes configuration/);
    await ctx.h.inspect.set(restartedAtKey(id), '2026-01-01T00:00:00Z');

    const res = await retry(id);
    expect(res.status).toBe(200);
    expect(res.body.job).toMatchObject({ id: `${id}.retry`, state: 'waiting', attempts_made: 0 });
    expect(await ctx.h.inspect.exists(restartedAtKey(id))).toBe(0);
    expect(await ctx.h.queue.jobs.get(id)).toBeUndefined(); // the dead letter is replaced by its retry
    const joined = await request(ctx.h.app).post('/ops/restart?host=web-1&service=checkout').set('Authorization', `Bearer ${BEARER}`);
    expect(joined.body).toMatchObject({ job_id: `${id}.retry`, coalesced: true });
    const repeated = await retry(id);
    expect(repeated.status).toBe(409);
    expect(repeated.body).toEqual({ detail: 'job is waiting; only a failed (dead-lettered) job can be retried', code: 'job_not_failed' });
  });

  it('a dead-lettered restart whose Deployment has another restart in progress -> 409, not a second restart', async () => {
    const first = await request(ctx.h.app).post('/ops/restart?host=web-1&service=frontend').set('Authorization', `Bearer ${BEARER}`);
    const id = first.body.job_id as string;
    await runWorkerUntil(async () => (await ctx.h.queue.jobs.get(id))?.state === 'failed');
    const second = await request(ctx.h.app).post('/ops/restart?host=web-1&service=frontend').set('Authorization', `Bearer ${BEARER}`);
    expect(second.body.coalesced).toBe(false);
    const res = await retry(id);
    expect(res.status).toBe(409);
    expect(res.body.detail).toContain(`job ${second.body.job_id}`);
    expect((await ctx.h.queue.jobs.get(id))?.state).toBe('failed');
    expect(await ctx.h.queue.bull.getDeduplicationJobId(coalesceId('shop', 'frontend'))).toBe(second.body.job_id);
  });
});
