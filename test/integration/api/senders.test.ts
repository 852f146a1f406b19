/**
 * Every sender of the registry (src/sources), on the real app, real Redis and real BullMQ: its
 * documented example deploys once, a second delivery is a duplicate, another event is ignored,
 * a proof made with another secret is 403, and an unset secret refuses everything. A new sender
 * is covered here without a change to this file.
 */
import { describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { createHarness, useHarness } from '../../helpers/apiHarness.js';
import { harnessSecretOf, pushHeaders, pushSources, wrongProofHeaders } from '../../helpers/senders.js';

const ctx = useHarness();
const jobs = () => ctx.h.queue.bull.getJobs(['waiting', 'delayed', 'active', 'completed', 'failed', 'prioritized']);

describe.each(pushSources().map((s) => [s.name, s] as const))('POST /webhook/%s', (_name, source) => {
  const path = `/webhook/${source.name}`;
  const body = JSON.stringify(source.example);
  const secret = () => harnessSecretOf(source, ctx.h.config);

  it('its documented example deploys once; the same delivery again is a duplicate of that job', async () => {
    const res = await request(ctx.h.app)
      .post(path)
      .set(pushHeaders(source, secret(), body))
      .send(body);
    expect(res.status).toBe(202);
    expect(res.body).toMatchObject({ accepted: true, duplicate: false, event_id: expect.stringMatching(`^${source.eventPrefix}:`) });
    const job = (await ctx.h.queue.bull.getJob(res.body.job_id))!;
    expect(job.data).toMatchObject({ ref: 'refs/heads/main', event_id: res.body.event_id, requested_by: `webhook:${source.name}` });
    expect(job.data.project).toBe(res.body.project);
    // The sender's redelivery, proven anew (a timestamped proof is never accepted twice).
    const again = await request(ctx.h.app)
      .post(path)
      .set(pushHeaders(source, secret(), body, Date.now() + 1000))
      .send(body);
    expect(again.body).toMatchObject({ accepted: false, duplicate: true, job_id: res.body.job_id });
    expect((await jobs()).filter((j) => j.data.event_id === res.body.event_id)).toHaveLength(1);
  });

  it('another event is ignored with its reason; nothing queued', async () => {
    const res = await request(ctx.h.app)
      .post(path)
      .set({ ...pushHeaders(source, secret(), body), [source.event.header]: 'not-a-push' })
      .send(body);
    expect(res.status).toBe(202);
    expect(res.body).toEqual({ ignored: true, reason: expect.stringContaining('is not a push') });
  });

  it('a proof made with another secret, or none, is 403 {detail, code} and counted as rejected', async () => {
    const wrong = await request(ctx.h.app)
      .post(path)
      .set({ ...wrongProofHeaders(source, body), [source.event.header]: source.event.push, 'Content-Type': 'application/json' })
      .send(body);
    expect(wrong.status).toBe(403);
    expect(Object.keys(wrong.body)).toEqual(['detail', 'code']);
    expect(['invalid_webhook_token', 'invalid_signature', 'invalid_bearer_token']).toContain(wrong.body.code);
    const none = await request(ctx.h.app).post(path).set('Content-Type', 'application/json').send(body);
    expect(none.status).toBe(403);
    const counted = (await ctx.h.metrics.webhookEvents.get()).values.find(
      (v) => v.labels.source === source.name && v.labels.outcome === 'rejected',
    );
    expect(counted?.value).toBeGreaterThanOrEqual(2);
  });

  it('with its secret unset, every call is 403 (nothing is read)', async () => {
    const env = { [source.secret.env]: '', ...(source.secret.fallbackEnv ? { [source.secret.fallbackEnv]: '' } : {}) };
    const h = await createHarness(ctx.srv.url, { env });
    try {
      const res = await request(h.app)
        .post(path)
        .set(pushHeaders(source, secret(), body))
        .send(body);
      expect(res.status).toBe(403);
      expect(res.body.detail).toMatch(/not configured/);
    } finally {
      await h.close();
    }
  });
});
