/**
 * POST /webhook/bitbucket with Bitbucket Cloud's documented repo:push payload
 * (test/fixtures/bitbucket-push.json, test/fixtures/SOURCES.md): X-Hub-Signature sha256 over the
 * body, X-Event-Key, X-Request-UUID as the delivery id, the change to main among several.
 */
import { createHmac } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { deliveryKey } from '../../../src/shared/keys.js';
import { useHarness } from '../../helpers/apiHarness.js';
import { testSecretOf } from '../../helpers/senders.js';

const ctx = useHarness();
const SECRET = testSecretOf('BITBUCKET_WEBHOOK_SECRET');
const DOC = JSON.parse(readFileSync(new URL('../../fixtures/bitbucket-push.json', import.meta.url), 'utf8')) as {
  push: { changes: Array<Record<string, any>> };
  [k: string]: unknown;
};
type Change = Record<string, any>;
const change = (name: string | null, hash = '709d658dc5b6d6afcd46049c2f332ee3f515a67d'): Change => {
  const doc = DOC.push.changes[0]!;
  return {
    ...doc,
    new: name === null ? null : { ...doc.new, name, target: { ...doc.new.target, hash } },
    old: { ...doc.old, name: name ?? 'main' },
  };
};
const withChanges = (...changes: Change[]) => ({ ...DOC, push: { ...DOC.push, changes } });
const send = (payload: unknown, headers: Record<string, string> = {}) => {
  const body = JSON.stringify(payload);
  return request(ctx.h.app)
    .post('/webhook/bitbucket')
    .set('Content-Type', 'application/json')
    .set('X-Event-Key', 'repo:push')
    .set('X-Request-UUID', 'b1e0c1a2-0000-4000-8000-000000000001')
    .set('X-Hub-Signature', 'sha256=' + createHmac('sha256', SECRET).update(body).digest('hex'))
    .set(headers)
    .send(body);
};

describe('POST /webhook/bitbucket (Bitbucket Cloud)', () => {
  it("Bitbucket's documented repo:push as sent (branch name-of-branch) -> 202 ignored, naming the ref", async () => {
    const res = await send(DOC);
    expect(res.status).toBe(202);
    expect(res.body).toEqual({ ignored: true, reason: 'ref "refs/heads/name-of-branch" is not refs/heads/main' });
  });

  it('the same push to main deploys the pushed commit of repository.full_name; X-Request-UUID is its delivery id', async () => {
    const res = await send(withChanges(change('main')), { 'X-Request-UUID': 'b1e0c1a2-0000-4000-8000-0000000000aa' });
    expect(res.status).toBe(202);
    expect(res.body).toMatchObject({
      accepted: true,
      project: 'team_name/repo_name',
      event_id: 'bitbucket:team_name/repo_name:refs/heads/main:709d658dc5b6d6afcd46049c2f332ee3f515a67d',
    });
    const job = (await ctx.h.queue.bull.getJob(res.body.job_id))!;
    expect(job.data).toMatchObject({
      sha: '709d658dc5b6d6afcd46049c2f332ee3f515a67d',
      delivery_id: 'b1e0c1a2-0000-4000-8000-0000000000aa',
    });
    expect(await ctx.h.inspect.get(deliveryKey('bitbucket', 'b1e0c1a2-0000-4000-8000-0000000000aa'))).toBe(`q:${res.body.job_id}`);
  });

  it('several changes in one delivery: the change to main is the one that counts', async () => {
    const res = await send(withChanges(change('feature/x', 'a'.repeat(40)), change('main', 'b'.repeat(40))), {
      'X-Request-UUID': 'multi-1',
    });
    expect(res.body).toMatchObject({ accepted: true, event_id: `bitbucket:team_name/repo_name:refs/heads/main:${'b'.repeat(40)}` });
  });

  it('a deleted main (new: null) is ignored; a push without changes is ignored; a malformed push is 422', async () => {
    expect((await send(withChanges(change(null)), { 'X-Request-UUID': 'del-1' })).body).toEqual({
      ignored: true,
      reason: 'ref "refs/heads/main" was deleted',
    });
    expect((await send(withChanges(), { 'X-Request-UUID': 'empty-1' })).body).toEqual({ ignored: true, reason: 'push.changes is empty' });
    const bad = await send({ ...DOC, push: { changes: 'nope' } }, { 'X-Request-UUID': 'bad-1' });
    expect(bad.status).toBe(422);
    expect(bad.body).toEqual({ detail: 'push.changes must be an array', code: 'invalid_payload' });
  });

  it('a signature over another body, or without the sha256= prefix, is 403', async () => {
    const body = JSON.stringify(withChanges(change('main')));
    const sig = createHmac('sha256', SECRET).update(body).digest('hex');
    const base = () =>
      request(ctx.h.app).post('/webhook/bitbucket').set('Content-Type', 'application/json').set('X-Event-Key', 'repo:push');
    expect(
      (
        await base()
          .set('X-Hub-Signature', `sha256=${sig}`)
          .send(body + ' ')
      ).status,
    ).toBe(403);
    const bare = await base().set('X-Hub-Signature', sig).send(body);
    expect(bare.status).toBe(403);
    expect(bare.body.detail).toMatch(/must start with sha256=/);
  });
});
