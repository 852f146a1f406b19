/**
 * "Why didn't my push deploy?" on the real app, real Redis, real BullMQ: each delivery's verdict
 * in GET /ops/deliveries (ignored, refused, invalid, rate-limited, queued, duplicate, failed),
 * newest first and paged, never the body or a secret; and POST /ops/deliveries/{id}/replay
 * through the same intake and deduplication, audited.
 */
import { createHash, createHmac } from 'node:crypto';
import { describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { createDeliveryLog, FLUSH_MAX } from '../../../src/domain/deliveries.js';
import { createRateLimiter } from '../../../src/middleware/rateLimit.js';
import { createLogger } from '../../../src/shared/logger.js';
import { createRedis } from '../../../src/shared/redis.js';
import { createHarness, GITHUB_SECRET, OP_KEY, RO_KEY, SCM_SECRET, useHarness, waitReady, type Harness } from '../../helpers/apiHarness.js';
import { startRedis } from '../../helpers/redis.js';
import { waitFor } from '../../helpers/waitFor.js';

const ctx = useHarness();
const push = (sha: string, ref = 'refs/heads/main') =>
  JSON.stringify({ ref, checkout_sha: sha, project: { path_with_namespace: 'team/app' } });
const scm = (body: string, headers: Record<string, string> = {}, app = ctx.h.app) =>
  request(app)
    .post('/webhook/scm')
    .set('Content-Type', 'application/json')
    .set({ 'X-Scm-Token': SCM_SECRET, 'X-Scm-Event': 'Push Hook', ...headers })
    .send(body);
const list = (query = '', key = RO_KEY, app = ctx.h.app) => request(app).get(`/ops/deliveries${query}`).set('X-API-Key', key);
const replay = (id: string, reason = 'the queue was down (INC-42)', key = OP_KEY) =>
  request(ctx.h.app).post(`/ops/deliveries/${id}/replay`).set('X-API-Key', key).set('Content-Type', 'application/json').send({ reason });

/** The log is written a moment after the answer: wait until it holds `n` deliveries. */
const logged = (n: number, query = '', h: Harness = ctx.h) =>
  waitFor(`${n} deliveries${query}`, async () => {
    const res = await list(query, RO_KEY, h.app);
    return res.body.deliveries?.length >= n ? (res.body.deliveries as Array<Record<string, any>>) : false;
  });

describe('GET /ops/deliveries', () => {
  it('explains an ignored, a refused and a duplicate push (newest first), with the job and body digest, never the body', async () => {
    const secretBody = push('c0ffee', 'refs/heads/feature');
    expect((await scm(secretBody)).body).toMatchObject({ ignored: true });
    expect((await scm(push('c0ffee'), { 'X-Scm-Token': 'wrong-token' })).status).toBe(403);
    const first = await scm(push('c0ffee'));
    const dup = await scm(push('c0ffee'));
    expect(dup.body).toMatchObject({ duplicate: true, job_id: first.body.job_id });

    const [d4, d3, d2, d1] = await logged(4);
    expect(d1).toMatchObject({
      source: 'scm',
      verdict: 'not_deploy_branch',
      status: 202,
      detail: 'ref "refs/heads/feature" is not refs/heads/main',
      code: null,
      job_id: null,
    });
    expect(d1!.body_sha256).toMatch(/^[0-9a-f]{64}$/);
    expect(d2).toMatchObject({
      verdict: 'bad_signature',
      status: 403,
      detail: 'invalid X-Scm-Token',
      code: 'invalid_webhook_token',
      body_sha256: null,
      event: null,
    });
    expect(d3).toMatchObject({ verdict: 'queued', job_id: first.body.job_id, event: { event_id: 'scm:team/app:refs/heads/main:c0ffee' } });
    expect(d4).toMatchObject({ verdict: 'duplicate', job_id: first.body.job_id });
    expect(new Date(d1!.at).getTime()).toBeLessThanOrEqual(new Date(d4!.at).getTime());
    const text = JSON.stringify(await logged(4));
    for (const secret of [SCM_SECRET, 'wrong-token', 'refs/heads/feature"', 'path_with_namespace']) {
      if (secret === 'refs/heads/feature"') continue; // the reason names the ref, by design
      expect(text).not.toContain(secret);
    }
  });

  it('invalid payloads and other events; filters by sender and verdict; pages with the next cursor', async () => {
    expect((await scm('{nope')).status).toBe(400);
    expect((await scm(push('x'), { 'X-Scm-Event': 'Tag Push Hook' })).body.ignored).toBe(true);
    const gh = JSON.stringify({ ref: 'refs/heads/main', after: 'abc1234', repository: { full_name: 'o/r' } });
    const ghRes = await request(ctx.h.app)
      .post('/webhook/github')
      .set('Content-Type', 'application/json')
      .set('X-GitHub-Event', 'push')
      .set('X-GitHub-Delivery', 'gh-delivery-1')
      .set('X-Hub-Signature-256', 'sha256=' + createHmac('sha256', GITHUB_SECRET).update(gh).digest('hex'))
      .send(gh);
    expect(ghRes.body.accepted).toBe(true);
    await logged(3);
    expect((await list('?verdict=invalid_payload')).body.deliveries).toEqual([expect.objectContaining({ source: 'scm', status: 400 })]);
    expect((await list('?verdict=not_a_push')).body.deliveries).toHaveLength(1);
    const github = (await list('?source=github')).body.deliveries;
    expect(github).toEqual([expect.objectContaining({ verdict: 'queued', delivery_id: 'gh-delivery-1', job_id: ghRes.body.job_id })]);

    const page1 = await list('?limit=2');
    expect(page1.body.deliveries).toHaveLength(2);
    expect(page1.body.next).toBe(page1.body.deliveries[1].id);
    const page2 = await list(`?limit=2&before=${encodeURIComponent(page1.body.next)}`);
    expect(page2.body.deliveries).toHaveLength(1);
    expect(page2.body.next).toBeNull();
    expect(page2.body.next_cursor).toBeNull();
    // the cursor pages the same way, and carries the filters of its query
    const byCursor = await list(`?limit=2&cursor=${encodeURIComponent(page1.body.next_cursor)}`);
    expect(byCursor.body).toEqual(page2.body);
    const scmPage1 = await list('?source=scm&limit=1');
    const scmPage2 = await list(`?limit=1&cursor=${encodeURIComponent(scmPage1.body.next_cursor)}`);
    expect(scmPage2.body.deliveries).toEqual([expect.objectContaining({ source: 'scm' })]);
    expect(scmPage2.body.next_cursor).toBeNull();
    for (const [q, code] of [
      [`?source=github&cursor=${encodeURIComponent(scmPage1.body.next_cursor)}`, 'invalid_cursor'],
      [`?cursor=${encodeURIComponent(page1.body.next_cursor)}&before=${encodeURIComponent(page1.body.next)}`, 'invalid_query'],
      ['?cursor=xyz', 'invalid_cursor'],
    ]) {
      const res = await list(q);
      expect([q, res.status, res.body.code]).toEqual([q, 422, code]);
    }
    const ids = [...page1.body.deliveries, ...page2.body.deliveries].map((d: { id: string }) => d.id);
    expect(new Set(ids).size).toBe(3);
    expect((await request(ctx.h.app).get(`/ops/deliveries/${ids[0]}`).set('X-API-Key', RO_KEY)).body.id).toBe(ids[0]);
  });

  it('bad queries are 422 {detail, code}; no key 401; unknown id 404', async () => {
    for (const q of ['?source=nope', '?verdict=nope', '?limit=0', '?before=xyz']) {
      const res = await list(q);
      expect(res.status).toBe(422);
      expect(res.body).toEqual({ detail: expect.any(String), code: 'invalid_query' });
    }
    expect((await request(ctx.h.app).get('/ops/deliveries')).status).toBe(401);
    const unknown = await request(ctx.h.app).get('/ops/deliveries/scm.1-0').set('X-API-Key', RO_KEY);
    expect(unknown.status).toBe(404);
    expect(unknown.body).toEqual({ detail: 'delivery not found', code: 'delivery_not_found' });
  });

  it('a rate-limited delivery is recorded as rate_limited', async () => {
    const limited = await createHarness(ctx.srv.url, {
      rateLimit: (d) => createRateLimiter({ ...d, rps: 1, windowMs: 60_000, keyPrefix: 'opsgate:rl-deliveries:' }),
    });
    try {
      await scm(push('rl-1'), {}, limited.app);
      expect((await scm(push('rl-2'), {}, limited.app)).status).toBe(429);
      const [entry] = await logged(1, '?verdict=rate_limited');
      expect(entry).toMatchObject({
        source: 'scm',
        status: 429,
        detail: expect.stringMatching(/too many requests/i),
        code: 'rate_limited',
      });
    } finally {
      await limited.close();
    }
  });
});

describe('unverified deliveries are kept apart', () => {
  // GitHub sends full commit ids: each label stands for one.
  const ghBody = (label: string) =>
    JSON.stringify({ ref: 'refs/heads/main', after: createHash('sha1').update(label).digest('hex'), repository: { full_name: 'o/r' } });
  const github = (app: Harness['app'], body: string, delivery: string, secret = GITHUB_SECRET) =>
    request(app)
      .post('/webhook/github')
      .set('Content-Type', 'application/json')
      .set('X-GitHub-Event', 'push')
      .set('X-GitHub-Delivery', delivery)
      .set('X-Hub-Signature-256', 'sha256=' + createHmac('sha256', secret).update(body).digest('hex'))
      .send(body);

  it('a flood of bad signatures, many times the verified stream, evicts no genuine delivery: it is still listed and replayed', async () => {
    // Small streams, so the flood is many times the verified one's cap (and past Redis' trimming
    // granularity: MAXLEN ~ drops whole nodes, of up to 100 entries).
    const small = await createHarness(ctx.srv.url, { env: { DELIVERIES_KEPT: '20', DELIVERIES_UNVERIFIED_KEPT: '10' } });
    try {
      const genuine = await github(small.app, ghBody('genuine-1'), 'gh-genuine-1');
      expect(genuine.body).toMatchObject({ accepted: true });
      const refused = await github(small.app, ghBody('genuine-2'), 'gh-genuine-2', 'a-stale-secret');
      expect(refused.status).toBe(403);
      // Strangers: wrong signatures with delivery ids of their choosing, 300 of them.
      for (let round = 0; round < 6; round++) {
        const answers = await Promise.all(
          Array.from({ length: 50 }, (_, i) => github(small.app, ghBody(`flood-${round}-${i}`), `flood-${round}-${i}`, 'not-the-secret')),
        );
        expect(answers.every((a) => a.status === 403)).toBe(true);
      }
      await small.deliveries.flush();
      // The sender's stream holds the genuine delivery alone; the strangers' stream its cap and at most a node more.
      expect(await small.inspect.xlen('opsgate:deliveries:{github}')).toBe(1);
      expect(await small.inspect.xlen('opsgate:deliveries:unverified:{github}')).toBeLessThanOrEqual(10 + 100);

      const listed = (await list('?source=github&limit=200', RO_KEY, small.app)).body.deliveries as Array<Record<string, any>>;
      const queued = listed.filter((d) => d.verdict === 'queued');
      expect(queued).toEqual([
        expect.objectContaining({ delivery_id: 'gh-genuine-1', job_id: genuine.body.job_id, verified: true, event: expect.any(Object) }),
      ]);
      // The unverified ones are listed too, newest first, and told apart.
      expect(listed[0]).toMatchObject({ verdict: 'bad_signature', verified: false, id: expect.stringMatching(/^github\.unverified\./) });
      expect((await list('?verdict=queued', RO_KEY, small.app)).body.deliveries).toEqual([queued[0]]);
      const bad = (await list('?source=github&verdict=bad_signature&limit=200', RO_KEY, small.app)).body.deliveries;
      expect(bad.length).toBeGreaterThanOrEqual(10);
      expect(bad.every((d: { verified: boolean }) => !d.verified)).toBe(true);
      expect(bad[0].delivery_id).toBe('flood-5-49');
      // The flood pushed out the oldest unverified ones: the genuine sender's refused delivery among them.
      expect(bad.some((d: { delivery_id: string }) => d.delivery_id === 'gh-genuine-2')).toBe(false);

      const res = await request(small.app)
        .post(`/ops/deliveries/${queued[0]!.id}/replay`)
        .set('X-API-Key', OP_KEY)
        .set('Content-Type', 'application/json')
        .send({ reason: 'after the flood' });
      expect(res.status).toBe(200);
      expect(res.body).toMatchObject({ replayed: true, duplicate: true, job_id: genuine.body.job_id });
      const [replayed] = await logged(1, '?verdict=duplicate', small);
      expect(replayed).toMatchObject({ replay_of: queued[0]!.id, verified: true });
    } finally {
      await small.close();
    }
  }, 60_000);

  it('pages through both streams newest first; an unverified delivery is read by its id and has nothing to replay', async () => {
    expect((await scm(push('pg-1'))).status).toBe(202);
    expect((await scm(push('pg-2'), { 'X-Scm-Token': 'wrong' })).status).toBe(403);
    expect((await scm(push('pg-3'))).status).toBe(202);
    expect((await scm(push('pg-4'), { 'X-Scm-Token': 'wrong' })).status).toBe(403);
    const all = await logged(4);
    // Newest first to the millisecond (one millisecond's entries of two streams: verified first).
    expect(all.map((d) => [d.verdict, d.verified, d.event?.sha]).sort()).toEqual([
      ['bad_signature', false, undefined],
      ['bad_signature', false, undefined],
      ['queued', true, 'pg-1'],
      ['queued', true, 'pg-3'],
    ]);
    const at = all.map((d) => Date.parse(d.at));
    expect(at).toEqual([...at].sort((a, b) => b - a));
    const seen: string[] = [];
    let next: string | null = null;
    do {
      const res = await list(`?limit=1${next ? `&before=${encodeURIComponent(next)}` : ''}`);
      expect(res.status).toBe(200);
      seen.push(...res.body.deliveries.map((d: { id: string }) => d.id));
      next = res.body.next;
    } while (next);
    expect(seen).toEqual(all.map((d) => d.id));
    const unverified = all.find((d) => !d.verified)!;
    const one = await request(ctx.h.app).get(`/ops/deliveries/${unverified.id}`).set('X-API-Key', RO_KEY);
    expect(one.body).toEqual(unverified);
    expect((await replay(unverified.id)).status).toBe(409);
  });

  it('a delivery refused after its sender proved itself (a payload that cannot be read) stays with the verified ones', async () => {
    expect((await scm('{nope')).status).toBe(400);
    const [d] = await logged(1);
    expect(d).toMatchObject({ verdict: 'invalid_payload', verified: true, id: expect.stringMatching(/^scm\.\d/) });
    expect(await ctx.h.inspect.exists('opsgate:deliveries:unverified:{scm}')).toBe(0);
  });
});

describe('POST /ops/deliveries/{id}/replay', () => {
  it('a push that failed while the queue was down is replayed once the queue is back: queued, then a duplicate', async () => {
    const queueSrv = await startRedis();
    const split = await createHarness(ctx.srv.url, { queueUrl: queueSrv.url });
    try {
      await split.queue.bull.waitUntilReady();
      await queueSrv.stop();
      expect((await scm(push('down-1'), {}, split.app)).status).toBe(503);
      const [failed] = await logged(1, '?verdict=failed');
      expect(failed).toMatchObject({ status: 503, code: 'queue_unavailable', event: { sha: 'down-1' } });
      await queueSrv.start();
      // Until the queue's connection is back the replay answers 503 (nothing queued): repeat it.
      const res = await waitFor('the replay accepted', async () => {
        const r = await request(split.app)
          .post(`/ops/deliveries/${failed!.id}/replay`)
          .set('X-API-Key', OP_KEY)
          .set('Content-Type', 'application/json')
          .send({ reason: 'queue back (INC-7)' });
        if (r.status !== 503) return r;
        return false;
      });
      expect(res.status).toBe(200);
      expect(res.body).toMatchObject({ replayed: true, accepted: true, duplicate: false, event_id: 'scm:team/app:refs/heads/main:down-1' });
      const job = (await split.queue.bull.getJob(res.body.job_id))!;
      expect(job.data.requested_by).toMatch(/^key:[0-9a-f]{12}$/);
      const again = await request(split.app)
        .post(`/ops/deliveries/${failed!.id}/replay`)
        .set('X-API-Key', OP_KEY)
        .set('Content-Type', 'application/json')
        .send({ reason: 'twice' });
      expect(again.body).toMatchObject({ accepted: false, duplicate: true, job_id: res.body.job_id });
      const audit = split.audits().find((a) => a.path === `/ops/deliveries/${failed!.id}/replay` && a.status === 200);
      expect(audit).toMatchObject({ replay_reason: 'queue back (INC-7)', job_id: res.body.job_id, outcome: 'accepted' });
      const [queued] = await logged(1, '?verdict=queued');
      expect(queued).toMatchObject({
        replay_of: failed!.id,
        status: 200,
        job_id: res.body.job_id,
        detail: expect.stringContaining('queue back (INC-7)'),
      });
      const [duplicate] = await logged(1, '?verdict=duplicate');
      expect(duplicate).toMatchObject({ replay_of: failed!.id, job_id: res.body.job_id });
    } finally {
      await split.close();
      await queueSrv.destroy();
    }
  });

  it('a delivery that reached no push event is 409; a readonly key 403; a missing reason 422; an unknown id 404', async () => {
    await scm(push('x', 'refs/heads/dev'));
    const [ignored] = await logged(1);
    const res = await replay(ignored!.id);
    expect(res.status).toBe(409);
    expect(res.body.detail).toMatch(/reached no push event/);
    expect((await replay(ignored!.id, 'r', RO_KEY)).status).toBe(403);
    expect((await replay(ignored!.id, '')).status).toBe(422);
    expect((await replay('scm.1-0')).status).toBe(404);
  });
});

describe('the log is written in batches', () => {
  /** The details of a sender's stream, oldest first. */
  const details = async (source: string) =>
    (await ctx.h.inspect.xrange(`opsgate:deliveries:{${source}}`, '-', '+')).map(([, f]) => f[f.indexOf('detail') + 1]);

  it('keeps every verdict of a burst larger than one batch, in the order recorded, per sender', async () => {
    const n = FLUSH_MAX * 2 + 37;
    for (let i = 0; i < n; i++) {
      ctx.h.deliveries.record({ source: i % 3 === 0 ? 'github' : 'scm', verdict: 'queued', status: 202, detail: `burst ${i}` });
    }
    await ctx.h.deliveries.flush();
    const all = Array.from({ length: n }, (_, i) => `burst ${i}`);
    expect(await details('github')).toEqual(all.filter((_, i) => i % 3 === 0));
    expect(await details('scm')).toEqual(all.filter((_, i) => i % 3 !== 0));
  });

  it("lists a sender's verified and unverified deliveries of one batch in the order they came, newest first", async () => {
    const kinds = ['queued', 'bad_signature', 'duplicate', 'rate_limited', 'bad_signature', 'not_a_push'] as const;
    kinds.forEach((verdict, i) => ctx.h.deliveries.record({ source: 'scm', verdict, status: 202, detail: `came ${i}` }));
    const listed = (await list()).body.deliveries as Array<{ detail: string; id: string }>;
    expect(listed.map((d) => d.detail)).toEqual(kinds.map((_, i) => `came ${i}`).reverse());
    // Paged one at a time, the cursor keeps that order.
    const paged: string[] = [];
    for (let before = ''; paged.length < kinds.length;) {
      const res = await list(`?limit=1${before ? `&cursor=${encodeURIComponent(before)}` : ''}`);
      paged.push(res.body.deliveries[0].detail);
      before = res.body.next_cursor;
    }
    expect(paged).toEqual(listed.map((d) => d.detail));
  });

  it('sends what waits before its connection closes at shutdown (flush), none lost', async () => {
    const redis = createRedis(ctx.srv.url, 'request', 'test-deliveries-shutdown');
    await waitReady(redis);
    const log = createDeliveryLog({ redis, logger: createLogger({ level: 'error', write: () => {} }), keep: 1000, keepUnverified: 100 });
    for (let i = 0; i < 5; i++) log.record({ source: 'scm', verdict: 'duplicate', status: 202, detail: `last ${i}` });
    // As src/server.ts stops: flush, then QUIT (which waits for the replies of what was sent).
    await log.flush();
    await redis.quit();
    expect(await details('scm')).toEqual(['last 0', 'last 1', 'last 2', 'last 3', 'last 4']);
  });

  it('GET /ops/deliveries right after a burst of answers lists every one (the process reads its own verdicts)', async () => {
    const answers = await Promise.all(Array.from({ length: 40 }, (_, i) => scm(push(`burst-${i}`))));
    expect(answers.every((a) => a.status === 202)).toBe(true);
    const res = await list('?limit=100');
    expect(res.body.deliveries).toHaveLength(40);
    expect(new Set(res.body.deliveries.map((d: { job_id: string }) => d.job_id))).toEqual(new Set(answers.map((a) => a.body.job_id)));
  });
});
