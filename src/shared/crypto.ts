import { createHmac, hash, timingSafeEqual } from 'node:crypto';

/**
 * Constant-time string equality. Both sides are hashed to a fixed 32-byte digest first, so
 * the comparison takes the same time whatever the lengths or the position of the first
 * differing byte, and a length mismatch is not revealed early.
 */
export function safeEqual(a: string, b: string): boolean {
  // Compare the digests in constant time, then the inputs' equality is implied (SHA-256 collision-free in practice).
  return timingSafeEqual(sha256(a), sha256(b));
}

/**
 * safeEqual against one configured secret, its digest computed once (a webhook token is checked
 * on every delivery): the same constant-time comparison, one hash per call instead of two.
 */
export function secretMatcher(secret: string): (presented: string) => boolean {
  const digest = sha256(secret);
  return (presented) => timingSafeEqual(sha256(presented), digest);
}

// The hex form, decoded: measured faster than crypto.hash's 'buffer' output and than createHash().digest() (Node 26).
const sha256 = (data: string | Buffer): Buffer => Buffer.from(hash('sha256', data, 'hex'), 'hex');

/** SHA-256 as 32 bytes: what a configured API key is kept as, and compared with in constant time. */
export function sha256Digest(data: string | Buffer): Buffer {
  return sha256(data);
}

export function sha256Hex(data: string | Buffer): string {
  return hash('sha256', data, 'hex');
}

/** The audit identity of a credential: first 12 hex characters of its SHA-256. Never the credential itself. */
export function credentialId(secret: string): string {
  return sha256Hex(secret).slice(0, 12);
}

export type SignatureCheck = { ok: true } | { ok: false; reason: 'missing' | 'malformed' | 'mismatch' };

/**
 * Verifies `sha256=<hex>` = HMAC-SHA256(secret, rawBody): the signature variant for senders that
 * sign the body.
 * Missing value or no `sha256=` prefix: missing/malformed; digest mismatch (constant time): mismatch.
 */
export function verifySha256Signature(secret: string, rawBody: Buffer, header: string | undefined): SignatureCheck {
  if (header === undefined || header === '') return { ok: false, reason: 'missing' };
  if (!header.startsWith('sha256=')) return { ok: false, reason: 'malformed' };
  const expected = 'sha256=' + createHmac('sha256', secret).update(rawBody).digest('hex');
  return safeEqual(header.toLowerCase(), expected) ? { ok: true } : { ok: false, reason: 'mismatch' };
}

/** HMAC-SHA256 of `data` keyed by `secret`, in `encoding`. */
export function hmacSha256(secret: string, data: Buffer | string, encoding: 'hex' | 'base64'): string {
  return createHmac('sha256', secret).update(data).digest(encoding);
}
