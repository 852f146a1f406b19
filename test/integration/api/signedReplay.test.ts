/**
 * A captured push cannot roll a project back, on the real app, real Redis, real BullMQ: the
 * signed senders without a timestamp (GitHub, Gitea, Bitbucket: `replayGuard`) remember each
 * push's (project, before, after) for 30 days, so a delivery resent after the event's 24 h with a
 * new delivery id is answered ignored, naming the earlier job, instead of deploying the old
 * commit again. A force-push back (another `before`) deploys; an operator's replay can deploy the
 * ignored push (audited); the token senders (/webhook/scm, GitLab) keep the contract's 24 h rule.
 *
 * The 24 h pass as in the other intake tests: BullMQ's deduplication record of the event is
 * dropped, and the app's clock (createApp's `now`) moves a day on.
 */
import { readFileSync } from 'node:fs';
import { beforeEach, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { PAIR_CLOCK_SKEW_MS, SEEN_PAIR_TTL_SECONDS } from '../../../src/domain/intake.js';
import { pushPairKey } from '../../../src/shared/keys.js';
import { SOURCES, type PushSource } from '../../../src/sources/index.js';
import { OP_KEY, RO_KEY, SCM_SECRET, useHarness } from '../../helpers/apiHarness.js';
import { dedupKey } from '../../helpers/queueOps.js';
import { harnessSecretOf, pushHeaders } from '../../helpers/senders.js';
import { waitFor } from '../../helpers/waitFor.js';

const DAY_MS = 86_400_000;
let offsetMs = 0;
const ctx = useHarness({ now: () => Date.now() + offsetMs });
beforeEach(() => {
  offsetMs = 0;
});

const PROJECT = 'octo/app';
const A = 'a'.repeat(40);
const B = 'b'.repeat(40);
const C = 'c'.repeat(40);

const sourceOf = (name: string) => SOURCES.find((s): s is PushSource => s.kind === 'push' && s.name === name)!;

/** A push of `before` -> `after` to main, as each sender shapes it. */
function payload(sender: string, before: string, after: string): Record<string, unknown> {
  if (sender === 'bitbucket') {
    return {
      repository: { full_name: PROJECT },
      push: {
        changes: [
          {
            new: { type: 'branch', name: 'main', target: { hash: after } },
            old: { type: 'branch', name: 'main', target: { hash: before } },
          },
        ],
      },
    };
  }
  return { ref: 'refs/heads/main', before, after, repository: { full_name: PROJECT } };
}

/** One signed delivery of the push, with its own delivery id. */
function deliver(sender: string, before: string, after: string, deliveryId: string) {
  const source = sourceOf(sender);
  const body = JSON.stringify(payload(sender, before, after));
  return request(ctx.h.app)
    .post(`/webhook/${sender}`)
    .set(pushHeaders(source, harnessSecretOf(source, ctx.h.config), body))
    .set(source.deliveryHeaders![0]!, deliveryId)
    .send(body);
}

/** The event's 24 h pass: its deduplication record expires, and the clock moves a day on. */
async function windowPasses(eventId: string): Promise<void> {
  await ctx.h.inspect.del(dedupKey(ctx.h.queue, eventId));
  offsetMs += DAY_MS + PAIR_CLOCK_SKEW_MS;
}

const jobs = () => ctx.h.queue.bull.getJobs(['waiting', 'delayed', 'active', 'completed', 'failed', 'prioritized']);

describe.each(['github', 'gitea', 'bitbucket'])('POST /webhook/%s: a push resent after its 24 h', (sender) => {
  it('is a duplicate within the 24 h, then answered ignored naming the earlier job: nothing queued, kept with its event', async () => {
    const first = await deliver(sender, A, B, `${sender}-d1`);
    expect(first.status).toBe(202);
    expect(first.body).toMatchObject({ accepted: true, event_id: `${sender}:${PROJECT}:refs/heads/main:${B}` });

    // Within the 24 h the event's own deduplication answers, as for every push.
    const early = await deliver(sender, A, B, `${sender}-d2`);
    expect(early.body).toMatchObject({ accepted: false, duplicate: true, job_id: first.body.job_id });

    await windowPasses(first.body.event_id);
    const resent = await deliver(sender, A, B, `${sender}-d3`);
    expect(resent.status).toBe(202);
    expect(resent.body).toEqual({ ignored: true, reason: expect.stringContaining(`job ${first.body.job_id}`) });
    expect(resent.body.reason).toContain(`from ${A} to ${B}`);
    expect((await jobs()).map((j) => j.id)).toEqual([first.body.job_id]);

    // The same delivery again meets the same rule (its delivery id stands for no job).
    expect((await deliver(sender, A, B, `${sender}-d3`)).body).toMatchObject({ ignored: true });
    expect(await jobs()).toHaveLength(1);

    const logged = await waitFor('the ignored delivery logged', async () => {
      const res = await request(ctx.h.app).get(`/ops/deliveries?source=${sender}&verdict=ignored`).set('X-API-Key', RO_KEY);
      return res.body.deliveries?.length === 2 ? (res.body.deliveries as Array<Record<string, unknown>>) : false;
    });
    expect(logged[1]).toMatchObject({
      status: 202,
      job_id: first.body.job_id,
      delivery_id: `${sender}-d3`,
      detail: resent.body.reason,
      event: { project: PROJECT, sha: B, event_id: first.body.event_id },
    });
    const audit = ctx.h.audits().find((a) => a.delivery_id === `${sender}-d3`);
    expect(audit).toMatchObject({ status: 202, outcome: 'ignored', job_id: first.body.job_id });
  });

  it('a force-push back to an old commit (another before) deploys it', async () => {
    const first = await deliver(sender, A, B, `${sender}-f1`);
    const next = await deliver(sender, B, C, `${sender}-f2`);
    expect(next.body.accepted).toBe(true);
    await windowPasses(first.body.event_id);
    await windowPasses(next.body.event_id);
    // main is at C; a force-push moves it back to B: a push from C, not from A.
    const back = await deliver(sender, C, B, `${sender}-f3`);
    expect(back.body).toMatchObject({ accepted: true, event_id: first.body.event_id });
    expect(back.body.job_id).not.toBe(first.body.job_id);
    expect((await ctx.h.queue.bull.getJob(back.body.job_id))!.data.sha).toBe(B);
    // The captured first push is still a rollback, and still ignored.
    await windowPasses(first.body.event_id);
    expect((await deliver(sender, A, B, `${sender}-f4`)).body).toMatchObject({ ignored: true });
  });
});

describe('the commit pair record', () => {
  it('is kept 30 days beside the delivery alias, in the intake slot: "<until>:<job id>"', async () => {
    const first = await deliver('github', A, B, 'pair-1');
    const key = pushPairKey(first.body.event_id, A);
    expect(key.startsWith('{opsgate}:')).toBe(true);
    expect(await ctx.h.inspect.get(key)).toMatch(new RegExp(`^\\d+:${first.body.job_id}$`));
    expect(await ctx.h.inspect.ttl(key)).toBeGreaterThan(SEEN_PAIR_TTL_SECONDS - 60);
  });

  it("a new branch (Bitbucket's old: null) is a pair of its own, from no commit, guarded the same way", async () => {
    const created = payload('bitbucket', A, B) as { push: { changes: Array<Record<string, unknown>> } };
    created.push.changes[0]!.old = null;
    const source = sourceOf('bitbucket');
    const send = (id: string) => {
      const body = JSON.stringify(created);
      return request(ctx.h.app)
        .post('/webhook/bitbucket')
        .set(pushHeaders(source, harnessSecretOf(source, ctx.h.config), body))
        .set('X-Request-UUID', id)
        .send(body);
    };
    const first = await send('new-branch-1');
    expect(first.body.accepted).toBe(true);
    await windowPasses(first.body.event_id);
    const resent = await send('new-branch-2');
    expect(resent.body).toEqual({ ignored: true, reason: expect.stringContaining('from a new branch') });
  });
});

describe('POST /ops/deliveries/{id}/replay of an ignored push', () => {
  it('deploys it again, audited with the operator and the reason', async () => {
    const first = await deliver('github', A, B, 'op-1');
    await windowPasses(first.body.event_id);
    expect((await deliver('github', A, B, 'op-2')).body).toMatchObject({ ignored: true });
    const [ignored] = await waitFor('the ignored delivery logged', async () => {
      const res = await request(ctx.h.app).get('/ops/deliveries?source=github&verdict=ignored').set('X-API-Key', RO_KEY);
      return res.body.deliveries?.length === 1 ? (res.body.deliveries as Array<{ id: string; event: Record<string, string> }>) : false;
    });
    // Its event keeps the commit before the push: the replay submits the same pair.
    expect(ignored!.event).toMatchObject({ before: A, sha: B, event_id: first.body.event_id });

    const replay = await request(ctx.h.app)
      .post(`/ops/deliveries/${ignored!.id}/replay`)
      .set('X-API-Key', OP_KEY)
      .set('Content-Type', 'application/json')
      .send({ reason: 'roll back to B on purpose (INC-9)' });
    expect(replay.status).toBe(200);
    expect(replay.body).toMatchObject({ replayed: true, accepted: true, duplicate: false, event_id: first.body.event_id });
    expect(replay.body.job_id).not.toBe(first.body.job_id);
    const job = (await ctx.h.queue.bull.getJob(replay.body.job_id))!;
    expect(job.data).toMatchObject({ sha: B, delivery_id: 'op-2', requested_by: expect.stringMatching(/^key:[0-9a-f]{12}$/) });
    const audit = ctx.h.audits().find((a) => a.path === `/ops/deliveries/${ignored!.id}/replay`);
    expect(audit).toMatchObject({
      status: 200,
      replay_reason: 'roll back to B on purpose (INC-9)',
      job_id: replay.body.job_id,
      outcome: 'accepted',
    });

    // The replayed delivery id stands for the operator's job, and so does the pair: within the
    // replay's 24 h a delivery of it is a duplicate of that job, after them it is ignored naming it.
    expect((await deliver('github', A, B, 'op-2')).body).toMatchObject({ duplicate: true, job_id: replay.body.job_id });
    expect((await deliver('github', A, B, 'op-3')).body).toMatchObject({ duplicate: true, job_id: replay.body.job_id });
    await windowPasses(first.body.event_id);
    const later = await deliver('github', A, B, 'op-4');
    expect(later.body).toEqual({ ignored: true, reason: expect.stringContaining(`job ${replay.body.job_id}`) });
    expect(await jobs()).toHaveLength(2);
  });
});

describe('the token senders keep the contract rule', () => {
  const scmPush = { ref: 'refs/heads/main', before: A, checkout_sha: B, project: { path_with_namespace: PROJECT } };

  it('/webhook/scm: the same push after 24 h is queued again', async () => {
    const scm = () => request(ctx.h.app).post('/webhook/scm').set('X-Scm-Token', SCM_SECRET).set('X-Scm-Event', 'Push Hook').send(scmPush);
    const first = await scm();
    expect(first.body.accepted).toBe(true);
    expect((await scm()).body).toMatchObject({ duplicate: true, job_id: first.body.job_id });
    await windowPasses(first.body.event_id);
    const again = await scm();
    expect(again.body).toMatchObject({ accepted: true, duplicate: false, event_id: first.body.event_id });
    expect(again.body.job_id).not.toBe(first.body.job_id);
    expect(await ctx.h.inspect.keys('{opsgate}:seen:pair:*')).toEqual([]);
  });

  it('/webhook/gitlab: the same push with a new delivery id after 24 h is queued again', async () => {
    const gitlab = (uuid: string) =>
      request(ctx.h.app)
        .post('/webhook/gitlab')
        .set('X-Gitlab-Token', SCM_SECRET)
        .set('X-Gitlab-Event', 'Push Hook')
        .set('X-Gitlab-Event-UUID', uuid)
        .send(scmPush);
    const first = await gitlab('gl-1');
    expect(first.body.accepted).toBe(true);
    await windowPasses(first.body.event_id);
    const again = await gitlab('gl-2');
    expect(again.body).toMatchObject({ accepted: true, event_id: first.body.event_id });
    expect(again.body.job_id).not.toBe(first.body.job_id);
  });
});

describe("the record's Redis memory (docs/senders.md)", () => {
  it("MEMORY USAGE of the pair of GitHub's example push is the documented figure, measured by the documented command", async () => {
    const github = sourceOf('github');
    const example = github.example as { before: string };
    const body = JSON.stringify(github.example);
    const first = await request(ctx.h.app)
      .post('/webhook/github')
      .set(pushHeaders(github, harnessSecretOf(github, ctx.h.config), body))
      .set('X-GitHub-Delivery', '72d3162e-cc78-11e3-81ab-4c9367dc0958')
      .send(body);
    expect(first.body.accepted).toBe(true);
    const key = pushPairKey(first.body.event_id, example.before);
    const bytes = Number(await ctx.h.inspect.call('MEMORY', 'USAGE', key));
    const readme = readFileSync(new URL('../../../docs/senders.md', import.meta.url), 'utf8');
    const stated = /commit pair costs (\d+) bytes of\s+Redis memory per push/.exec(readme);
    expect(stated).not.toBeNull();
    expect(bytes).toBe(Number(stated![1]));
    // The documented command writes this key with a value of the same length, and states the same figure.
    expect(readme).toContain(`K='${key}'`);
    const value = /redis-cli SET "\$K" '([^']+)' EX (\d+)/.exec(readme);
    expect(value?.[1]?.length).toBe((await ctx.h.inspect.get(key))!.length);
    expect(Number(value?.[2])).toBe(SEEN_PAIR_TTL_SECONDS);
    expect(readme).toContain(`MEMORY USAGE "$K"   # ${bytes}`);
  });
});
