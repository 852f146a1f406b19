/**
 * POST /webhook/gitea with Gitea's documented push payload (test/fixtures/gitea-push.json,
 * test/fixtures/SOURCES.md): X-Gitea-Signature, the hex HMAC-SHA256 of the body without a prefix,
 * as Gitea and Forgejo send it; X-Gitea-Event; X-Gitea-Delivery as the delivery id.
 */
import { createHmac } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { deliveryKey } from '../../../src/shared/keys.js';
import { useHarness } from '../../helpers/apiHarness.js';
import { testSecretOf } from '../../helpers/senders.js';

const ctx = useHarness();
const SECRET = testSecretOf('GITEA_WEBHOOK_SECRET');
const DOC = readFileSync(new URL('../../fixtures/gitea-push.json', import.meta.url), 'utf8');
const onMain = DOC.replace('"ref": "refs/heads/develop"', '"ref": "refs/heads/main"');
const send = (body: string, headers: Record<string, string> = {}) =>
  request(ctx.h.app)
    .post('/webhook/gitea')
    .set('Content-Type', 'application/json')
    .set('X-Gitea-Event', 'push')
    .set('X-Gitea-Delivery', 'f6266f16-1bf3-46a5-9ea4-602e06ead473')
    .set('X-Gitea-Signature', createHmac('sha256', SECRET).update(body).digest('hex'))
    .set(headers)
    .send(body);

describe('POST /webhook/gitea (Gitea / Forgejo)', () => {
  it("Gitea's documented push as sent (ref develop), signed over its exact bytes -> 202 ignored, naming the ref", async () => {
    const res = await send(DOC);
    expect(res.status).toBe(202);
    expect(res.body).toEqual({ ignored: true, reason: 'ref "refs/heads/develop" is not refs/heads/main' });
  });

  it('the same push to main deploys `after` of repository.full_name; its delivery id is remembered', async () => {
    const res = await send(onMain);
    expect(res.status).toBe(202);
    expect(res.body).toMatchObject({
      accepted: true,
      project: 'gitea/webhooks',
      event_id: 'gitea:gitea/webhooks:refs/heads/main:bffeb74224043ba2feb48d137756c8a9331c449a',
    });
    const job = (await ctx.h.queue.bull.getJob(res.body.job_id))!;
    expect(job.data).toMatchObject({
      sha: 'bffeb74224043ba2feb48d137756c8a9331c449a',
      delivery_id: 'f6266f16-1bf3-46a5-9ea4-602e06ead473',
    });
    expect(await ctx.h.inspect.get(deliveryKey('gitea', 'f6266f16-1bf3-46a5-9ea4-602e06ead473'))).toBe(`q:${res.body.job_id}`);
    expect((await send(onMain)).body).toMatchObject({ duplicate: true, job_id: res.body.job_id });
  });

  it('a digest over other bytes, with a sha256= prefix, or empty (no secret on the Gitea side) is 403', async () => {
    const digest = createHmac('sha256', SECRET).update(onMain).digest('hex');
    expect((await send(onMain + '\n', { 'X-Gitea-Signature': digest })).status).toBe(403);
    expect((await send(onMain, { 'X-Gitea-Signature': `sha256=${digest}` })).status).toBe(403);
    const empty = await send(onMain, { 'X-Gitea-Signature': '' });
    expect(empty.status).toBe(403);
    expect(empty.body).toEqual({ detail: 'missing signature (X-Gitea-Signature)', code: 'missing_signature' });
  });

  it('a branch deletion (after all zeros) is ignored; another event is ignored', async () => {
    const deleted = onMain.replace('"after": "bffeb74224043ba2feb48d137756c8a9331c449a"', `"after": "${'0'.repeat(40)}"`);
    expect((await send(deleted, { 'X-Gitea-Delivery': 'del-1' })).body).toEqual({
      ignored: true,
      reason: 'ref "refs/heads/main" was deleted',
    });
    expect((await send(onMain, { 'X-Gitea-Event': 'issues', 'X-Gitea-Delivery': 'iss-1' })).body).toMatchObject({ ignored: true });
  });
});
