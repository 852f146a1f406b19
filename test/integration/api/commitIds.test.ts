/**
 * The pushed commit, on the real app, real Redis and real BullMQ. The vendor senders (GitHub,
 * GitLab, Gitea, Bitbucket: `commitForm: 'hex'`) always send a commit id, so a signed push to the
 * deploy branch whose commit is not 7 to 64 hex digits is 422 {detail} naming the field, after
 * the sender is verified and after the contract's first rules (another event, another branch:
 * ignored). The contract's /webhook/scm and the in-house /webhook/generic take any non-empty
 * commit (202); the worker then deploys only a safe form of it (worker/jobs/deploy.ts), which the
 * last case shows from the push to the dead letter.
 */
import { describe, expect, it } from '@jest/globals';
import request from 'supertest';
import type { PushSource } from '../../../src/sources/index.js';
import { runWorkerUntil, useHarness } from '../../helpers/apiHarness.js';
import { harnessSecretOf, pushHeaders, pushSources } from '../../helpers/senders.js';

const ctx = useHarness();
const jobs = () => ctx.h.queue.bull.getJobs(['waiting', 'delayed', 'active', 'completed', 'failed', 'prioritized']);
const sourceOf = (name: string): PushSource => pushSources().find((s) => s.name === name)!;

/** The sender's documented example, pushed to `branch` with `sha` as its commit. */
function pushOf(source: PushSource, sha: string, branch = 'main'): string {
  type Side = { name: string; target: { hash: string } };
  const p = structuredClone(source.example) as Record<string, unknown> & { push?: { changes: Array<{ new: Side; old: Side }> } };
  const change = p.push?.changes[0];
  if (change) {
    change.new.target.hash = sha;
    change.new.name = branch;
    change.old.name = branch;
  } else {
    p.ref = `refs/heads/${branch}`;
    p[source.commitField] = sha;
  }
  return JSON.stringify(p);
}

const deliver = (source: PushSource, body: string, headers: Record<string, string> = {}) =>
  request(ctx.h.app)
    .post(`/webhook/${source.name}`)
    .set({ ...pushHeaders(source, harnessSecretOf(source, ctx.h.config), body), ...headers })
    .send(body);

describe.each(['github', 'gitlab', 'gitea', 'bitbucket'])('POST /webhook/%s: the commit must be a commit id', (name) => {
  const source = sourceOf(name);

  it('a signed push to main of "HEAD~3" or "--orphan=x" is 422 {detail} naming the field; nothing queued', async () => {
    expect(source.commitForm).toBe('hex');
    for (const sha of ['HEAD~3', '--orphan=x']) {
      const res = await deliver(source, pushOf(source, sha));
      expect(res.status).toBe(422);
      expect(res.body).toEqual({
        detail: `${source.commitField} must be a commit id of 7 to 64 hex digits, not ${JSON.stringify(sha)}`,
        code: 'invalid_commit',
      });
    }
    expect(await jobs()).toEqual([]);
  });

  it("the contract's order: another event or another branch is ignored first (202); an unsigned one is 403 first", async () => {
    const other = await deliver(source, pushOf(source, 'HEAD~3'), { [source.event.header]: 'not-a-push' });
    expect(other.status).toBe(202);
    expect(other.body).toMatchObject({ ignored: true, reason: expect.stringContaining('is not a push') });
    const dev = await deliver(source, pushOf(source, 'HEAD~3', 'dev'));
    expect(dev.status).toBe(202);
    expect(dev.body).toMatchObject({ ignored: true, reason: expect.stringContaining('refs/heads/dev') });
    const body = pushOf(source, 'HEAD~3');
    const unsigned = await request(ctx.h.app)
      .post(`/webhook/${source.name}`)
      .set({ ...pushHeaders(source, 'not-the-secret', body) })
      .send(body);
    expect(unsigned.status).toBe(403);
    expect(await jobs()).toEqual([]);
  });

  it('an abbreviated (7) or a SHA-256 (64) commit id is accepted', async () => {
    for (const sha of ['abc1234', 'e'.repeat(64)]) {
      const res = await deliver(source, pushOf(source, sha));
      expect(res.status).toBe(202);
      expect(res.body).toMatchObject({ accepted: true, event_id: expect.stringMatching(`:${sha}$`) });
    }
  });
});

describe("the contract's senders take any non-empty commit", () => {
  it('/webhook/scm with checkout_sha "--orphan=x" is 202 accepted, as the contract says; so is /webhook/generic', async () => {
    for (const name of ['scm', 'generic']) {
      const source = sourceOf(name);
      expect(source.commitForm).toBe('any');
      const res = await deliver(source, pushOf(source, '--orphan=x'));
      expect(res.status).toBe(202);
      expect(res.body).toMatchObject({ accepted: true, duplicate: false });
      expect((await ctx.h.queue.bull.getJob(res.body.job_id))?.data.sha).toBe('--orphan=x');
    }
  });

  it('the worker dead-letters that job with the reason before the cluster; a commit id goes on to the cluster', async () => {
    const scm = sourceOf('scm');
    const push = (sha: string) =>
      JSON.stringify({ ref: 'refs/heads/main', checkout_sha: sha, project: { path_with_namespace: 'group/app' } });
    const unsafe = await deliver(scm, push('--orphan=x'));
    const safe = await deliver(scm, push('6113728f27ae82c7b1a177c8d03f9e96e0adf246'));
    expect([unsafe.status, safe.status]).toEqual([202, 202]);
    const finished = async (id: string) => (await ctx.h.queue.jobs.get(id))?.state === 'failed';
    await runWorkerUntil(ctx.srv.url, async () => (await finished(unsafe.body.job_id)) && (await finished(safe.body.job_id)));
    const refused = (await ctx.h.queue.bull.getJob(unsafe.body.job_id))!;
    expect(refused.attemptsMade).toBe(1);
    expect(refused.failedReason).toBe(
      'commit "--orphan=x" is not a safe commit name for the deploy Job: it must start with a letter or digit and hold only letters, digits, ".", "_" and "-" (at most 255 characters)',
    );
    // The safe one reached the Kubernetes configuration (none in this test).
    expect((await ctx.h.queue.bull.getJob(safe.body.job_id))!.failedReason).toMatch(/^no Kubernetes configuration/);
  });
});
