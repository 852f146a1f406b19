import { createHmac } from 'node:crypto';
import { describe, expect, it } from '@jest/globals';
import { credentialId, safeEqual, sha256Hex, verifySha256Signature } from '../../../src/shared/crypto.js';

describe('safeEqual', () => {
  it.each([
    ['abc', 'abc', true],
    ['abc', 'abd', false],
    ['abc', 'abcd', false],
    ['', '', true],
    ['', 'a', false],
    ['ключ', 'ключ', true],
  ])('%j vs %j -> %s', (a, b, eq) => {
    expect(safeEqual(a, b)).toBe(eq);
  });
});

describe('credentialId / sha256Hex', () => {
  it('sha256 of the empty string', () => {
    expect(sha256Hex('')).toBe('e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855');
  });
  it('credential id = first 12 hex of SHA-256', () => {
    expect(credentialId('abc')).toBe('ba7816bf8f01');
  });
});

describe('verifySha256Signature', () => {
  // GitHub's published test vector:
  // https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries#testing-the-webhook-payload-validation
  const secret = "It's a Secret to Everybody";
  const payload = Buffer.from('Hello, World!');
  const signature = 'sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17';

  it('accepts the GitHub test vector', () => {
    expect(verifySha256Signature(secret, payload, signature)).toEqual({ ok: true });
  });
  it('rejects it with another secret, another payload, or a flipped digit', () => {
    expect(verifySha256Signature(secret + '!', payload, signature)).toEqual({ ok: false, reason: 'mismatch' });
    expect(verifySha256Signature(secret, Buffer.from('Hello, World?'), signature)).toEqual({ ok: false, reason: 'mismatch' });
    expect(verifySha256Signature(secret, payload, signature.slice(0, -1) + '8')).toEqual({ ok: false, reason: 'mismatch' });
    expect(verifySha256Signature(secret, payload, signature + '00')).toEqual({ ok: false, reason: 'mismatch' });
  });
  it('missing value -> missing; no sha256= prefix -> malformed', () => {
    expect(verifySha256Signature(secret, payload, undefined)).toEqual({ ok: false, reason: 'missing' });
    expect(verifySha256Signature(secret, payload, '')).toEqual({ ok: false, reason: 'missing' });
    expect(verifySha256Signature(secret, payload, signature.slice('sha256='.length))).toEqual({ ok: false, reason: 'malformed' });
    expect(verifySha256Signature(secret, payload, 'sha1=' + signature.slice(7))).toEqual({ ok: false, reason: 'malformed' });
  });
  it('agrees with an independent HMAC computation on arbitrary bytes', () => {
    const body = Buffer.from([0, 255, 10, 13, 0x7b]);
    const sig = 'sha256=' + createHmac('sha256', 'k').update(body).digest('hex');
    expect(verifySha256Signature('k', body, sig).ok).toBe(true);
  });
});
