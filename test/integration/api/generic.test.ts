/**
 * POST /webhook/generic, the in-house sender: `X-Opsgate-Signature: t=<unix>,v1=<hex>` over
 * "<t>.<body>", a 5-minute window, and no signature accepted twice (the replay record lives in
 * the real Redis, shared by every replica).
 */
import { createHmac } from 'node:crypto';
import { describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { signatureSeenKey } from '../../../src/shared/keys.js';
import { createHarness, useHarness } from '../../helpers/apiHarness.js';
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
