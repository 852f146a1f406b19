import { createHash, createHmac, timingSafeEqual } from 'node:crypto';

/**
 * Constant-time string equality. Both sides are hashed to a fixed 32-byte digest first, so
 * the comparison takes the same time whatever the lengths or the position of the first
 * differing byte, and a length mismatch is not revealed early.
 */
export function safeEqual(a: string, b: string): boolean {
  const da = createHash('sha256').update(a, 'utf8').digest();
  const db = createHash('sha256').update(b, 'utf8').digest();
  // Compare the digests in constant time, then the inputs' equality is implied (SHA-256 collision-free in practice).
  return timingSafeEqual(da, db);
}

export function sha256Hex(data: string | Buffer): string {
  return createHash('sha256').update(data).digest('hex');
}

/** The audit identity of a credential: first 12 hex characters of its SHA-256. Never the credential itself. */
export function credentialId(secret: string): string {
  return sha256Hex(secret).slice(0, 12);
}

export type SignatureCheck = { ok: true } | { ok: false; reason: 'missing' | 'malformed' | 'mismatch' };

/**
 * Verifies `sha256=<hex>` = HMAC-SHA256(secret, rawBody), per spec section 5 (signature variant).
 * Missing value or no `sha256=` prefix: missing/malformed; digest mismatch (constant time): mismatch.
 */
export function verifySha256Signature(secret: string, rawBody: Buffer, header: string | undefined): SignatureCheck {
  if (header === undefined || header === '') return { ok: false, reason: 'missing' };
  if (!header.startsWith('sha256=')) return { ok: false, reason: 'malformed' };
  const expected = 'sha256=' + createHmac('sha256', secret).update(rawBody).digest('hex');
  return safeEqual(header.toLowerCase(), expected) ? { ok: true } : { ok: false, reason: 'mismatch' };
}
