import { createHmac } from 'node:crypto';
import { describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { JOB } from '../../../src/shared/jobs.js';
import { createHarness, GITHUB_SECRET, useHarness } from '../../helpers/apiHarness.js';
import { dedupKey } from '../../helpers/queueOps.js';

/** POST /webhook/github: HMAC-SHA256 X-Hub-Signature-256, X-GitHub-Event push, same deploy + dedup rules as scm. */
const ctx = useHarness();

const sign = (body: string, secret = GITHUB_SECRET) => 'sha256=' + createHmac('sha256', secret).update(body).digest('hex');

const payload = (sha = '0123abcd', overrides: Record<string, unknown> = {}) =>
  JSON.stringify({ ref: 'refs/heads/main', after: sha, repository: { full_name: 'octo/app' }, ...overrides });

const post = (body: string, headers: Record<string, string | undefined> = {}) => {
  let req = request(ctx.h.app).post('/webhook/github').set('Content-Type', 'application/json');
  const all: Record<string, string | undefined> = { 'X-GitHub-Event': 'push', 'X-Hub-Signature-256': sign(body), ...headers };
  for (const [k, v] of Object.entries(all)) if (v !== undefined) req = req.set(k, v);
  return req.send(body);
};

describe('signature verification (403)', () => {
  it('missing signature header -> 403', async () => {
    const res = await post(payload(), { 'X-Hub-Signature-256': undefined });
    expect(res.status).toBe(403);
    expect(res.body.detail).toMatch(/missing signature/);
  });
  it('value without sha256= prefix -> 403 (missing signature)', async () => {
    const body = payload();
    const res = await post(body, { 'X-Hub-Signature-256': sign(body).replace('sha256=', 'sha1=') });
    expect(res.status).toBe(403);
    expect(res.body.detail).toMatch(/missing signature/);
  });
  it('digest of another secret -> 403 mismatch', async () => {
    const body = payload();
    const res = await post(body, { 'X-Hub-Signature-256': sign(body, 'other') });
    expect(res.status).toBe(403);
    expect(res.body.detail).toBe('signature mismatch');
  });
  it('body changed after signing -> 403', async () => {
    const body = payload();
    const res = await request(ctx.h.app)
      .post('/webhook/github')
      .set('X-GitHub-Event', 'push')
      .set('X-Hub-Signature-256', sign(body))
      .send(body.replace('octo/app', 'evil/app'));
    expect(res.status).toBe(403);
  });
  it('bad signature with invalid JSON -> 403, not 400', async () => {
    const res = await post('{nope', { 'X-Hub-Signature-256': 'sha256=' + '0'.repeat(64) });
    expect(res.status).toBe(403);
  });
  it('GITHUB_WEBHOOK_SECRET unset -> 403 even with a signature', async () => {
    const other = await createHarness(ctx.srv.url, { env: { GITHUB_WEBHOOK_SECRET: undefined } });
    try {
      const body = payload();
      const res = await request(other.app)
        .post('/webhook/github')
        .set('X-GitHub-Event', 'push')
        .set('X-Hub-Signature-256', sign(body))
        .send(body);
      expect(res.status).toBe(403);
      expect(res.body.detail).toMatch(/not configured/);
    } finally {
      await other.close();
    }
  });
  it("verifies GitHub's published test vector end to end", async () => {
    // https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
    const res = await request(ctx.h.app)
      .post('/webhook/github')
      .set('X-GitHub-Event', 'ping')
      .set('X-Hub-Signature-256', 'sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17')
      .send('Hello, World!');
    // Signature OK, so the body is parsed: "Hello, World!" is not JSON -> 400 (a bad signature would be 403).
    expect(res.status).toBe(400);
  });
});

describe('event, ref, sha and dedup', () => {
  it('X-GitHub-Event other than push -> 202 ignored', async () => {
    const body = JSON.stringify({ zen: 'Keep it logically awesome.' });
    const res = await post(body, { 'X-GitHub-Event': 'ping' });
    expect(res.status).toBe(202);
    expect(res.body).toEqual({ ignored: true, reason: expect.stringMatching(/not a push/) });
  });
  it('another ref -> 202 ignored naming it', async () => {
    const res = await post(payload('1', { ref: 'refs/heads/dev' }));
    expect(res.status).toBe(202);
    expect(res.body.reason).toContain('refs/heads/dev');
  });
  it('missing after -> 422', async () => {
    const res = await post(JSON.stringify({ ref: 'refs/heads/main', repository: { full_name: 'octo/app' } }));
    expect(res.status).toBe(422);
  });
  it('branch deletion (deleted: true, after all zeros) -> 202 ignored, nothing queued', async () => {
    const res = await post(payload('0000000000000000000000000000000000000000', { deleted: true }));
    expect(res.status).toBe(202);
    expect(res.body.ignored).toBe(true);
    expect(await ctx.h.queue.bull.getJobs(['waiting'])).toHaveLength(0);
  });
  it('push to main -> accepted, one job; redelivery -> duplicate, still one job', async () => {
    const body = payload('feedface');
    const a = await post(body);
    const b = await post(body);
    expect(a.status).toBe(202);
    expect(a.body).toEqual({
      accepted: true,
      duplicate: false,
      project: 'octo/app',
      event_id: 'github:octo/app:refs/heads/main:feedface',
      job_id: expect.any(String),
    });
    expect(b.body).toEqual({
      accepted: false,
      duplicate: true,
      project: 'octo/app',
      event_id: 'github:octo/app:refs/heads/main:feedface',
      job_id: a.body.job_id,
    });
    const jobs = await ctx.h.queue.bull.getJobs(['waiting']);
    expect(jobs).toHaveLength(1);
    expect(jobs[0]!.id).toBe(a.body.job_id);
    expect(jobs[0]!.name).toBe(JOB.runDeployPipeline);
    expect(jobs[0]!.data).toMatchObject({ project: 'octo/app', ref: 'refs/heads/main', requested_by: 'webhook:github' });
    const ttl = await ctx.h.inspect.ttl(dedupKey(ctx.h.queue, 'github:octo/app:refs/heads/main:feedface'));
    expect(ttl).toBeGreaterThan(86000);
  });
  it('audit line names the github source', async () => {
    await post(payload('a0d1a0d1')).set('X-Request-Id', 'gh-audit-1');
    const line = ctx.h.audits().find((a) => a.caller_request_id === 'gh-audit-1');
    expect(line).toMatchObject({ who: 'webhook:github', status: 202, path: '/webhook/github' });
  });
});
