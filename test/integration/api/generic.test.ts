/**
 * POST /webhook/generic, the in-house sender: `X-Opsgate-Signature: t=<unix>,v1=<hex>` over
 * "<t>.<body>", a 5-minute window, and no signature accepted twice (the replay record lives in
 * the real Redis, shared by every replica). A signature is spent with its delivery: a 2xx or 4xx
 * answer keeps it, a 5xx gives it back (the add failing on a real Redis: BullMQ's job-id counter
 * made unusable, as in test/integration/reliability/faults.test.ts).
 */
import { createHmac } from 'node:crypto';
import { describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { signatureSeenKey } from '../../../src/shared/keys.js';
import { createHarness, useHarness } from '../../helpers/apiHarness.js';
import { waitFor } from '../../helpers/waitFor.js';
import { testSecretOf } from '../../helpers/senders.js';

const ctx = useHarness();
const SECRET = testSecretOf('GENERIC_WEBHOOK_SECRET');
const sign = (t: number, body: string, secret = SECRET) => `t=${t},v1=${createHmac('sha256', secret).update(`${t}.${body}`).digest('hex')}`;
const now = () => Math.floor(Date.now() / 1000);
const push = (sha: string) => JSON.stringify({ project: 'team/app', ref: 'refs/heads/main', sha });
const send = (body: string, signature: string, app = ctx.h.app) =>
  request(app)
    .post('/webhook/generic')
    .set('Content-Type', 'application/json')
    .set('X-Opsgate-Event', 'push')
    .set('X-Opsgate-Signature', signature)
    .send(body);

describe('POST /webhook/generic (timestamped HMAC)', () => {
  it('a fresh signature deploys; the same signed request again is refused as a replay (403), even on another replica', async () => {
    const body = push('g-1');
    const sig = sign(now(), body);
    const first = await send(body, sig);
    expect(first.status).toBe(202);
    expect(first.body).toMatchObject({ accepted: true, event_id: 'generic:team/app:refs/heads/main:g-1' });
    const v1 = sig.split('v1=')[1]!;
    expect(await ctx.h.inspect.ttl(signatureSeenKey('generic', v1))).toBeGreaterThan(600);
    const replica = await createHarness(ctx.srv.url);
    try {
      const replay = await send(body, sig, replica.app);
      expect(replay.status).toBe(403);
      expect(replay.body).toEqual({ detail: 'signature already used (a replayed delivery)', code: 'replayed_signature' });
    } finally {
      await replica.close();
    }
    // The sender's own retry signs anew: a duplicate of the first job, not a replay.
    const retry = await send(body, sign(now() + 1, body));
    expect(retry.body).toMatchObject({ accepted: false, duplicate: true, job_id: first.body.job_id });
  });

  it('a timestamp outside the 5-minute window, either way, is 403 before the body is read', async () => {
    const body = push('g-2');
    for (const t of [now() - 301, now() + 301]) {
      const res = await send(body, sign(t, body));
      expect(res.status).toBe(403);
      expect(res.body.detail).toMatch(/more than 300 s from the server's clock/);
    }
    expect((await send(body, sign(now() - 240, body))).status).toBe(202);
  });

  it('a signature over another timestamp, body or secret, or malformed, is 403', async () => {
    const body = push('g-3');
    const t = now();
    expect((await send(body, sign(t, body).replace(`t=${t}`, `t=${t - 1}`))).status).toBe(403);
    expect((await send(body, sign(t, push('other')))).status).toBe(403);
    expect((await send(body, sign(t, body, 'another-secret'))).status).toBe(403);
    const malformed = await send(body, `sha256=${'0'.repeat(64)}`);
    expect(malformed.status).toBe(403);
    expect(malformed.body.detail).toMatch(/t=<unix seconds>,v1=<hex HMAC-SHA256>/);
  });

  it("the payload is opsgate's own: no sha -> 422 naming it", async () => {
    const body = JSON.stringify({ project: 'team/app', ref: 'refs/heads/main' });
    const res = await send(body, sign(now(), body));
    expect(res.status).toBe(422);
    expect(res.body).toEqual({ detail: 'sha is required', code: 'missing_commit' });
  });
});

describe('a signature is spent only when its delivery is', () => {
  const seen = (sig: string) => ctx.h.inspect.exists(signatureSeenKey('generic', sig.split('v1=')[1]!));
  const replayRefused = { detail: 'signature already used (a replayed delivery)', code: 'replayed_signature' };

  it("answered 503 (Redis failed the add): the sender's retry with the same signature and timestamp is accepted, then spent", async () => {
    const body = push('g-503');
    const sig = sign(now(), body);
    // BullMQ's add script fails at its INCR of the job-id counter, before it writes anything.
    const idKey = ctx.h.queue.bull.toKey('id');
    const counter = await ctx.h.inspect.get(idKey);
    await ctx.h.inspect.set(idKey, 'not-a-number');
    try {
      const failed = await send(body, sig);
      expect(failed.status).toBe(503);
      expect(Object.keys(failed.body)).toEqual(['detail', 'code']);
      expect(failed.headers['retry-after']).toBeDefined();
      await waitFor('the signature given back', async () => (await seen(sig)) === 0, 5_000, 20);
    } finally {
      if (counter === null) await ctx.h.inspect.del(idKey);
      else await ctx.h.inspect.set(idKey, counter);
    }
    const retry = await send(body, sig);
    expect(retry.status).toBe(202);
    expect(retry.body).toMatchObject({ accepted: true, duplicate: false, event_id: 'generic:team/app:refs/heads/main:g-503' });
    expect(await seen(sig)).toBe(1);
    // A 202 spends it: the same request again is a replay.
    const replay = await send(body, sig);
    expect(replay.status).toBe(403);
    expect(replay.body).toEqual(replayRefused);
  });

  it('answered 503, its retry at once (no wait for the give-back) is heard too', async () => {
    const body = push('g-503-at-once');
    const sig = sign(now(), body);
    const idKey = ctx.h.queue.bull.toKey('id');
    await ctx.h.inspect.set(idKey, 'not-a-number');
    let retryStatus: number;
    try {
      expect((await send(body, sig)).status).toBe(503);
      // Still failing: a 503 again, not a 403 replay.
      retryStatus = (await send(body, sig)).status;
    } finally {
      await ctx.h.inspect.del(idKey);
    }
    expect(retryStatus).toBe(503);
    expect((await send(body, sig)).status).toBe(202);
  });

  it('answered 4xx (422: no sha), the signature stays spent: the same request again is 403', async () => {
    const body = JSON.stringify({ project: 'team/app', ref: 'refs/heads/main' });
    const sig = sign(now(), body);
    expect((await send(body, sig)).status).toBe(422);
    const replay = await send(body, sig);
    expect(replay.status).toBe(403);
    expect(replay.body).toEqual(replayRefused);
    expect(await seen(sig)).toBe(1);
  });
});
