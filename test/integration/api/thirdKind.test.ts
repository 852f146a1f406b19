import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { UnrecoverableError } from 'bullmq';
import { Router } from 'express';
import request from 'supertest';
import { z } from 'zod';
import type { ChangeWays } from '../../../src/app.js';
import { answerChange, answered } from '../../../src/changes/answer.js';
import { gate } from '../../../src/changes/gate.js';
import { handChange } from '../../../src/changes/hand.js';
import { registerKind, type ChangeKind } from '../../../src/changes/kinds/index.js';
import { approvalFieldsOf, requesterFieldsOf } from '../../../src/changes/kinds/common.js';
import { dryRunChange } from '../../../src/changes/dryRun.js';
import { submitChange } from '../../../src/changes/pipeline.js';
import type { Change } from '../../../src/changes/types.js';
import { principalOf } from '../../../src/routes/principal.js';
import { OP_KEY, OP_KEY_2, runWorkerUntil, useHarness } from '../../helpers/apiHarness.js';
import { decide } from '../../helpers/guards.js';
import { startReceiver } from '../../helpers/workerSupport.js';

/**
 * A third kind of change whose module and route live in this test only: a `note` of a namespace,
 * which records what it was asked. Registered beside restart and deploy, it goes through the real
 * app (its route handed to createApp's `changeRoutes`), real Redis and the real worker processor:
 * the pipeline, the approvals, the freezes and their wake and the dead letters' retry look it up
 * in the registry; nothing under src/ names it.
 */
interface NoteTarget {
  kind: 'note';
  namespace: string;
  text: string;
}
const NOTE_JOB = 'note_change';
const noteData = z.object({
  text: z.string(),
  namespace: z.string(),
  audit_id: z.string(),
  requested_by: z.string(),
  requested_owner: z.string().optional(),
  requested_credential: z.string().optional(),
  approval_id: z.string().optional(),
  approvers: z.array(z.string()).optional(),
  reason: z.string().optional(),
});
type NoteData = z.infer<typeof noteData>;

/** A note's dry run: what the worker's rehearsal is asked. */
const noteAsk = z.object({ change: z.literal('note'), namespace: z.string(), text: z.string() });
type NoteAsk = z.infer<typeof noteAsk>;
/** What the worker's rehearsal was asked, in order. */
const rehearsed: NoteAsk[] = [];

/** What the worker was asked to carry out, in order. */
const ran: NoteData[] = [];
/** Texts whose first run fails (their job is dead-lettered at once). */
const failOnce = new Set<string>();

const noteKind: ChangeKind<NoteTarget, NoteData> = {
  name: 'note',
  job: NOTE_JOB as never,
  jobSchema: noteData,
  closedGate: 'hold',
  carry: 'intake',
  describe: (t) => `note in ${t.namespace}: ${t.text}`,
  reportFields: (t) => ({ change: 'note', namespace: t.namespace }),
  reportWhat: (d) => `note in ${d.namespace}`,
  scopeTarget: (t) => ({ kind: 'namespace', namespace: t.namespace }),
  // The namespace `vault` asks one approval.
  policyFacts: (_inventory, freezes, change, now) => ({
    gate: gate(freezes, undefined, { namespace: change.target.namespace }, now),
    ...(change.target.namespace === 'vault' ? { approval: { required: 1, ttl: 600 } } : {}),
  }),
  readFacts: () => Promise.resolve(),
  jobData: (c, approved) => ({
    text: c.target.text,
    namespace: c.target.namespace,
    ...requesterFieldsOf(c),
    ...approvalFieldsOf(c, approved),
  }),
  fromJob: (_inventory, d) => ({
    target: { kind: 'note', namespace: d.namespace, text: d.text },
    ...(d.reason ? { reason: d.reason } : {}),
  }),
  approvalIdentity: (t) => `note:${t.namespace}:${t.text}`,
  toApproval: (c) => ({ kind: 'note', namespace: c.target.namespace, text: c.target.text }) as never,
  fromApproval: (a) => {
    const c = a as unknown as NoteTarget;
    return { target: { kind: 'note', namespace: c.namespace, text: c.text } };
  },
  approvalView: () => ({ host: null, service: null, project: null, ref: null, override: undefined }),
  dryRun: {
    schema: z.unknown(),
    data: (c) => ({ change: 'note', namespace: c.target.namespace, text: c.target.text }),
    rehearsal: {
      schema: noteAsk,
      rehearse: (d: NoteAsk) => {
        rehearsed.push(d);
        return Promise.resolve({
          identity: 'note-rehearsal',
          object: null,
          admitted: d.namespace !== 'vault',
          refused_by: d.namespace === 'vault' ? 'rbac' : null,
          status: null,
          message: null,
        });
      },
    },
    answer: ({ change, decision }, _override, kubernetes) => ({
      change: 'note',
      text: change.target.text,
      would: decision.kind,
      kubernetes,
    }),
  },
  intake: (t) => ({ project: `note/${t.namespace}`, ref: t.text, source: 'note', eventId: `note:${t.namespace}:${t.text}` }),
  handle: (d) => {
    if (failOnce.delete(d.text)) return Promise.reject(new UnrecoverableError(`note ${d.text} failed once`));
    ran.push(d);
    return Promise.resolve({ noted: d.text });
  },
};

/** The note's way in, as a module of its own would mount it: POST /notes/{namespace}?text=...[&dry_run=true]. */
function notesRouter(ways: ChangeWays) {
  const r = Router();
  r.post('/notes/:namespace', ways.operatorKey, async (req, res) => {
    const change: Change = {
      target: { kind: 'note', namespace: req.params.namespace, text: typeof req.query.text === 'string' ? req.query.text : '' } as never,
      requester: principalOf(res),
      origin: 'api',
      auditId: res.locals.requestId,
    };
    if (req.query.dry_run === 'true') {
      res.json(await dryRunChange(ways.pipeline, change));
      return;
    }
    const a = await handChange(ways.confirms, res.locals, {
      submit: async () => answerChange(await submitChange(ways.pipeline, change), 202),
      audit: (a) => (a.body ? { job_id: a.body.job_id, note_status: a.body.status } : undefined),
      handed: (a) =>
        a.body?.status === 'pending_approval'
          ? { wrote: 'approval', approvalId: a.body.approval_id!, event: 'requested' }
          : { wrote: 'job', ...(a.body && a.written ? { written: a.written } : {}) },
    });
    const { status, body } = answered(a);
    res.status(status).json(body);
  });
  return r;
}

let unregister: () => void;
beforeAll(() => {
  unregister = registerKind(noteKind);
});
afterAll(() => unregister());

const ctx = useHarness({ changeRoutes: notesRouter });
const note = (namespace: string, text: string, key = OP_KEY, qs = '') =>
  request(ctx.h.app).post(`/notes/${namespace}?text=${text}${qs}`).set('X-API-Key', key);
const ranText = (text: string) => async () => ran.some((d) => d.text === text);

describe('a kind of change registered by a test only, through every way in', () => {
  it('the API: queued (202), carried out by the worker through the kind’s handler, audited', async () => {
    const res = await note('shop', 'hello');
    expect(res.status).toBe(202);
    expect(res.body).toMatchObject({ status: 'queued', accepted: true, duplicate: false, job_id: expect.any(String) });
    const again = await note('shop', 'hello');
    expect(again.body).toMatchObject({ status: 'queued', accepted: false, duplicate: true, job_id: res.body.job_id });
    await runWorkerUntil(ctx.h.config.REDIS_URL, ranText('hello'));
    expect(ran.find((d) => d.text === 'hello')).toMatchObject({ namespace: 'shop', audit_id: expect.any(String) });
    expect(ctx.h.audits().some((l) => l.job_id === res.body.job_id && l.note_status === 'queued')).toBe(true);
  });

  it('a report: its outcome is reported in its own words to the notification endpoint', async () => {
    const receiver = await startReceiver();
    try {
      const res = await note('shop', 'reported');
      await runWorkerUntil(ctx.h.config.REDIS_URL, async () => receiver.requests('/hook').length > 0, 20000, {
        NOTIFY_WEBHOOK_URLS: receiver.url('/hook'),
        REPORT_OUTCOMES: 'all',
        OPSGATE_PUBLIC_URL: 'https://opsgate.example.com/',
      });
      const body = receiver.requests('/hook')[0]!.body;
      expect(body).toContain('note in shop');
      expect(body).toContain(res.body.job_id as string);
    } finally {
      await receiver.close();
    }
  });

  it('a dry run: the plan, and the worker’s rehearsal of the kind’s own ask; nothing carried out', async () => {
    let res: request.Response | undefined;
    await runWorkerUntil(ctx.h.config.REDIS_URL, async () => {
      res = await note('shop', 'dry', OP_KEY, '&dry_run=true');
      return true;
    });
    expect(res!.status).toBe(200);
    expect(res!.body).toEqual({
      change: 'note',
      text: 'dry',
      would: 'queue',
      kubernetes: expect.objectContaining({ checked: true, identity: 'note-rehearsal', admitted: true, refused_by: null }),
    });
    expect(rehearsed).toEqual([{ change: 'note', namespace: 'shop', text: 'dry' }]);
    expect(ran.some((d) => d.text === 'dry')).toBe(false);
    expect(await ctx.h.queue.bull.getJobCounts('waiting', 'delayed')).toEqual({ waiting: 0, delayed: 0 });
  });

  it('an approval: pending (202), then approved by another owner and carried out', async () => {
    const res = await note('vault', 'secret');
    expect(res.status).toBe(202);
    expect(res.body).toMatchObject({ status: 'pending_approval', approval_id: expect.any(String), required: 1 });
    const list = await request(ctx.h.app).get('/ops/approvals').set('X-API-Key', OP_KEY);
    expect(list.body.approvals).toEqual(expect.arrayContaining([expect.objectContaining({ id: res.body.approval_id, change: 'note' })]));
    const ok = await decide(ctx.h.app, res.body.approval_id, 'approve', OP_KEY_2);
    expect(ok.status).toBe(200);
    expect(ok.body).toMatchObject({ status: 'approved', job_id: res.body.approval_id });
    await runWorkerUntil(ctx.h.config.REDIS_URL, ranText('secret'));
    expect(ran.find((d) => d.text === 'secret')).toMatchObject({ approval_id: res.body.approval_id, approvers: [expect.any(String)] });
  });

  it('a freeze holds it (a delayed job); lifting the freeze wakes it and the worker carries it out', async () => {
    const frz = await request(ctx.h.app)
      .post('/ops/freezes')
      .set('X-API-Key', OP_KEY)
      .set('Content-Type', 'application/json')
      .send(JSON.stringify({ scope: 'namespace', namespace: 'data', reason: 'audit', duration: '2h' }));
    expect(frz.status).toBe(201);
    await ctx.h.freezesFlushed();
    const res = await note('data', 'held');
    expect(res.status).toBe(202);
    expect(res.body).toMatchObject({ status: 'held', held_until: expect.any(String), held_reasons: expect.stringContaining('audit') });
    expect(await (await ctx.h.queue.bull.getJob(res.body.job_id))?.isDelayed()).toBe(true);
    const lifted = await request(ctx.h.app)
      .delete(`/ops/freezes/${frz.body.id}`)
      .set('X-API-Key', OP_KEY)
      .set('Content-Type', 'application/json')
      .send(JSON.stringify({ reason: 'done' }));
    expect(lifted.status).toBe(200);
    await runWorkerUntil(ctx.h.config.REDIS_URL, ranText('held'));
    expect(ran.filter((d) => d.text === 'held')).toHaveLength(1);
  });

  it('a dead letter: its failed job is retried through the pipeline as a new change, and carried out', async () => {
    failOnce.add('flaky');
    const res = await note('shop', 'flaky');
    expect(res.status).toBe(202);
    const id = res.body.job_id as string;
    await runWorkerUntil(ctx.h.config.REDIS_URL, async () => (await ctx.h.queue.bull.getJob(id))?.isFailed() ?? false, 30000);
    const retried = await request(ctx.h.app)
      .post(`/ops/jobs/${id}/retry`)
      .set('X-API-Key', OP_KEY)
      .set('Content-Type', 'application/json')
      .send(JSON.stringify({ reason: 'the cause is gone' }));
    expect(retried.status).toBe(200);
    expect(retried.body).toMatchObject({ retried: true, job: { name: NOTE_JOB } });
    await runWorkerUntil(ctx.h.config.REDIS_URL, ranText('flaky'));
    expect(ran.find((d) => d.text === 'flaky')).toMatchObject({ reason: 'the cause is gone' });
  });
});
