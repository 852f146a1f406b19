/**
 * Intake additions around the contract, each on the real app, real Redis, real
 * BullMQ, with the senders' own sample payloads (test/fixtures):
 * - POST /webhook/gitlab with GitLab's native headers (X-Gitlab-Token, X-Gitlab-Event,
 *   Idempotency-Key / X-Gitlab-Event-UUID), same rules and event id as /webhook/scm;
 * - /webhook/github: X-GitHub-Delivery recorded (a replay after the 24 h event window is still a
 *   duplicate), the commit sha in the job, and GitHub's form encoding (payload=<json>);
 * - ALERTS_MAX_PER_REQUEST: over it 413 {detail}, nothing recorded or queued;
 * - a 413 from the body reader is counted as outcome "invalid", not "failed".
 */
import { createHmac } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { deliveryKey } from '../../../src/shared/keys.js';
import { dedupKey, stateKeys } from '../../helpers/queueOps.js';
import { JOB } from '../../../src/shared/jobs.js';
import { createHarness, GITHUB_SECRET, SCM_SECRET, useHarness } from '../../helpers/apiHarness.js';

const ctx = useHarness();
const fixture = (name: string) => readFileSync(new URL(`../../fixtures/${name}`, import.meta.url), 'utf8');
const GITLAB_DOC = JSON.parse(fixture('gitlab-push-hook.json')) as Record<string, unknown>;
const GITHUB_DOC = JSON.parse(fixture('github-push.json')) as Record<string, unknown>;
const onMain = (p: Record<string, unknown>) => ({ ...p, ref: 'refs/heads/main' });

const jobs = () => ctx.h.queue.bull.getJobs(['waiting', 'delayed', 'active', 'completed', 'failed', 'prioritized']);
const eventsMetric = async (source: string) =>
  Object.fromEntries(
    (await ctx.h.metrics.webhookEvents.get()).values.filter((v) => v.labels.source === source).map((v) => [v.labels.outcome, v.value]),
  );

describe('POST /webhook/gitlab (GitLab native headers)', () => {
  const gitlab = (body: unknown, headers: Record<string, string | undefined> = {}, app = ctx.h.app) => {
    let req = request(app).post('/webhook/gitlab').set('Content-Type', 'application/json');
    const all = { 'X-Gitlab-Token': SCM_SECRET, 'X-Gitlab-Event': 'Push Hook', ...headers };
    for (const [k, v] of Object.entries(all)) if (v !== undefined) req = req.set(k, v);
    return req.send(typeof body === 'string' ? body : JSON.stringify(body));
  };

  it("GitLab's documented Push Hook example as sent (ref master) -> 202 ignored, nothing queued", async () => {
    const res = await gitlab(GITLAB_DOC);
    expect(res.status).toBe(202);
    expect(res.body).toEqual({ ignored: true, reason: 'ref "refs/heads/master" is not refs/heads/main' });
    expect(await jobs()).toHaveLength(0);
  });

  it('the example on main -> accepted with the scm event id, job carries project, ref and sha; a redelivery is a duplicate with the same job_id', async () => {
    const uuid = 'b3e5b0a8-6f1a-4f57-9d3b-2b5a3f0d1e11';
    const res = await gitlab(onMain(GITLAB_DOC), { 'Idempotency-Key': uuid });
    expect(res.status).toBe(202);
    expect(res.body).toEqual({
      accepted: true,
      duplicate: false,
      project: 'mike/diaspora',
      event_id: 'scm:mike/diaspora:refs/heads/main:da1560886d4f094c3e6c9ef40349f7d38b5d27d7',
      job_id: expect.any(String),
    });
    const [job] = await jobs();
    expect(job!.id).toBe(res.body.job_id);
    expect(job!.name).toBe(JOB.runDeployPipeline);
    expect(job!.data).toMatchObject({
      project: 'mike/diaspora',
      ref: 'refs/heads/main',
      sha: 'da1560886d4f094c3e6c9ef40349f7d38b5d27d7',
      delivery_id: uuid,
      requested_by: 'webhook:gitlab',
    });
    const again = await gitlab(onMain(GITLAB_DOC), { 'Idempotency-Key': uuid });
    expect(again.body).toMatchObject({ accepted: false, duplicate: true, job_id: res.body.job_id });
    expect(await jobs()).toHaveLength(1);
  });

  it('a redelivery after the 24 h push window (event record gone) is still a duplicate by its Idempotency-Key', async () => {
    const uuid = 'c0ffee00-0000-4000-8000-000000000001';
    const first = await gitlab(onMain(GITLAB_DOC), { 'Idempotency-Key': uuid });
    expect(first.body.accepted).toBe(true);
    // The 24 h window passes: the event's deduplication record expires.
    await ctx.h.inspect.del(dedupKey(ctx.h.queue, first.body.event_id));
    expect(await ctx.h.inspect.ttl(deliveryKey('gitlab', uuid))).toBeGreaterThan(29 * 86400);
    const replay = await gitlab(onMain(GITLAB_DOC), { 'Idempotency-Key': uuid });
    expect(replay.body).toMatchObject({ accepted: false, duplicate: true, job_id: first.body.job_id });
    expect(await jobs()).toHaveLength(1);
    // Without a delivery id, the same push after the window is a new event (spec: 24 h window).
    await ctx.h.inspect.del(dedupKey(ctx.h.queue, first.body.event_id));
    expect((await gitlab(onMain(GITLAB_DOC))).body.accepted).toBe(true);
  });

  it('X-Gitlab-Event-UUID is used when there is no Idempotency-Key', async () => {
    const uuid = 'ee11ee11-0000-4000-8000-000000000002';
    await gitlab(onMain(GITLAB_DOC), { 'X-Gitlab-Event-UUID': uuid });
    expect(await ctx.h.inspect.get(deliveryKey('gitlab', uuid))).toMatch(/^q:/);
  });

  it('token: missing or wrong -> 403 {detail, code}, counted as rejected; GITLAB_WEBHOOK_SECRET wins over SCM_WEBHOOK_SECRET', async () => {
    expect((await gitlab(onMain(GITLAB_DOC), { 'X-Gitlab-Token': undefined })).status).toBe(403);
    const wrong = await gitlab(onMain(GITLAB_DOC), { 'X-Gitlab-Token': 'nope' });
    expect(wrong.status).toBe(403);
    expect(wrong.body).toEqual({ detail: 'invalid X-Gitlab-Token', code: 'invalid_webhook_token' });
    // X-Scm-Token is not GitLab's header.
    expect((await gitlab(onMain(GITLAB_DOC), { 'X-Gitlab-Token': undefined, 'X-Scm-Token': SCM_SECRET })).status).toBe(403);
    expect((await eventsMetric('gitlab')).rejected).toBe(3);
    const own = await createHarness(ctx.srv.url, { env: { GITLAB_WEBHOOK_SECRET: 'gitlab-only-secret-1' } });
    try {
      expect((await gitlab(onMain(GITLAB_DOC), {}, own.app)).status).toBe(403); // the scm secret no longer opens it
      expect((await gitlab(onMain(GITLAB_DOC), { 'X-Gitlab-Token': 'gitlab-only-secret-1' }, own.app)).status).toBe(202);
    } finally {
      await own.close();
    }
  });

  it('same rules as /webhook/scm: other event -> ignored; no checkout_sha -> 422; /webhook/scm unchanged', async () => {
    expect((await gitlab(onMain(GITLAB_DOC), { 'X-Gitlab-Event': 'Tag Push Hook' })).body).toMatchObject({ ignored: true });
    const noSha = await gitlab({ ...onMain(GITLAB_DOC), checkout_sha: null });
    expect(noSha.status).toBe(422);
    expect(noSha.body.detail).toMatch(/checkout_sha/);
    // /webhook/scm does not read GitLab's headers.
    const scm = await request(ctx.h.app)
      .post('/webhook/scm')
      .set('X-Gitlab-Token', SCM_SECRET)
      .set('X-Gitlab-Event', 'Push Hook')
      .send(onMain(GITLAB_DOC));
    expect(scm.status).toBe(403);
  });

  it('an over-long delivery id -> 422, nothing recorded', async () => {
    const res = await gitlab(onMain(GITLAB_DOC), { 'Idempotency-Key': 'x'.repeat(200) });
    expect(res.status).toBe(422);
    expect(await stateKeys(ctx.h.inspect)).toEqual([]);
  });
});

describe('POST /webhook/github: delivery id, commit sha, form encoding', () => {
  const sign = (body: string) => 'sha256=' + createHmac('sha256', GITHUB_SECRET).update(body).digest('hex');
  const github = (body: string, headers: Record<string, string> = {}, contentType = 'application/json') =>
    request(ctx.h.app)
      .post('/webhook/github')
      .set('Content-Type', contentType)
      .set('X-GitHub-Event', 'push')
      .set('X-Hub-Signature-256', sign(body))
      .set(headers)
      .send(body);
  const json = JSON.stringify(onMain(GITHUB_DOC));
  const form = 'payload=' + encodeURIComponent(json);

  it("GitHub's sample push as application/json: accepted, the job carries the commit sha and the delivery id", async () => {
    const res = await github(json, { 'X-GitHub-Delivery': '72d3162e-cc78-11e3-81ab-4c9367dc0958' });
    expect(res.status).toBe(202);
    expect(res.body).toMatchObject({ accepted: true, project: 'Codertocat/Hello-World', job_id: expect.any(String) });
    const [job] = await jobs();
    expect(job!.data).toMatchObject({
      sha: '6113728f27ae82c7b1a177c8d03f9e96e0adf246',
      delivery_id: '72d3162e-cc78-11e3-81ab-4c9367dc0958',
    });
  });

  it('the same sample as application/x-www-form-urlencoded (payload=<json>), signature over the raw form body: same decision', async () => {
    const res = await github(form, { 'X-GitHub-Delivery': 'form-1' }, 'application/x-www-form-urlencoded');
    expect(res.status).toBe(202);
    expect(res.body).toMatchObject({
      accepted: true,
      event_id: 'github:Codertocat/Hello-World:refs/heads/main:6113728f27ae82c7b1a177c8d03f9e96e0adf246',
    });
    // The JSON delivery of the same push is then a duplicate of it.
    const again = await github(json, { 'X-GitHub-Delivery': 'json-1' });
    expect(again.body).toMatchObject({ duplicate: true, job_id: res.body.job_id });
    expect(await jobs()).toHaveLength(1);
    // As sent (ref master) the sample is ignored in both encodings.
    const master = JSON.stringify(GITHUB_DOC);
    expect((await github('payload=' + encodeURIComponent(master), {}, 'application/x-www-form-urlencoded')).body).toMatchObject({
      ignored: true,
    });
  });

  it('form body: signature checked over the raw body (a re-encoded body -> 403); no payload field -> 400 after verification', async () => {
    const tampered = await request(ctx.h.app)
      .post('/webhook/github')
      .set('Content-Type', 'application/x-www-form-urlencoded')
      .set('X-GitHub-Event', 'push')
      .set('X-Hub-Signature-256', sign(form))
      .send(form.replace('Codertocat%2FHello-World', 'evil%2FHello-World'));
    expect(tampered.status).toBe(403);
    const noPayload = await github('other=1', {}, 'application/x-www-form-urlencoded');
    expect(noPayload.status).toBe(400);
    expect(noPayload.body.detail).toMatch(/payload/);
  });

  it('a replayed delivery after the 24 h event window is a duplicate (X-GitHub-Delivery kept 30 days): no second deploy', async () => {
    const first = await github(json, { 'X-GitHub-Delivery': 'replay-1' });
    expect(first.body.accepted).toBe(true);
    await ctx.h.inspect.del(dedupKey(ctx.h.queue, first.body.event_id));
    const replay = await github(json, { 'X-GitHub-Delivery': 'replay-1' });
    expect(replay.body).toMatchObject({ accepted: false, duplicate: true, job_id: first.body.job_id });
    expect(await jobs()).toHaveLength(1);
  });

  it('a replay cannot deploy another commit under an old delivery id: the delivery id maps to its first job', async () => {
    const first = await github(json, { 'X-GitHub-Delivery': 'pin-1' });
    const other = JSON.stringify({ ...onMain(GITHUB_DOC), after: 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa' });
    const replay = await github(other, { 'X-GitHub-Delivery': 'pin-1' });
    expect(replay.body).toMatchObject({ duplicate: true, job_id: first.body.job_id });
    const all = await jobs();
    expect(all).toHaveLength(1);
    expect(all[0]!.data.sha).toBe('6113728f27ae82c7b1a177c8d03f9e96e0adf246');
  });
});

describe('ALERTS_MAX_PER_REQUEST and 413 outcomes', () => {
  const alerts = (n: number, app = ctx.h.app) =>
    request(app)
      .post('/webhook/alerts')
      .send({ alerts: Array.from({ length: n }, (_, i) => ({ status: 'firing', fingerprint: `cap-${i}` })) });

  it('default 1000: 1000 alerts are queued (job_ids), 1001 -> 413 {detail} naming the cap, nothing recorded or queued', async () => {
    const over = await alerts(1001);
    expect(over.status).toBe(413);
    expect(Object.keys(over.body)).toEqual(['detail', 'code']);
    expect(over.body.code).toBe('too_many_alerts');
    expect(over.body.detail).toMatch(/at most 1000/);
    expect(over.body.detail).toMatch(/max_alerts/);
    expect(await stateKeys(ctx.h.inspect)).toEqual([]);
    const ok = await alerts(1000);
    expect(ok.status).toBe(202);
    expect(ok.body.job_ids).toHaveLength(1000);
    expect(await ctx.h.queue.bull.getJobCountByTypes('waiting')).toBe(1000);
  }, 60_000);

  it('a configured cap is honoured', async () => {
    const small = await createHarness(ctx.srv.url, { env: { ALERTS_MAX_PER_REQUEST: '3' } });
    try {
      expect((await alerts(4, small.app)).status).toBe(413);
      expect((await alerts(3, small.app)).status).toBe(202);
    } finally {
      await small.close();
    }
  });

  it('a webhook body over BODY_LIMIT (413 from the body reader) is counted as outcome "invalid", not "failed"', async () => {
    const small = await createHarness(ctx.srv.url, { env: { BODY_LIMIT: '1kb' } });
    try {
      const res = await request(small.app)
        .post('/webhook/scm')
        .set('X-Scm-Token', SCM_SECRET)
        .set('X-Scm-Event', 'Push Hook')
        .set('Content-Type', 'application/json')
        .send(JSON.stringify({ pad: 'x'.repeat(2048) }));
      expect(res.status).toBe(413);
      const values = (await small.metrics.webhookEvents.get()).values.filter((v) => v.labels.source === 'scm');
      expect(values).toEqual([expect.objectContaining({ labels: { source: 'scm', outcome: 'invalid' }, value: 1 })]);
    } finally {
      await small.close();
    }
  });
});
