import { createHmac, hash, timingSafeEqual } from 'node:crypto';

/**
 * Which of the configured secrets (current, then previous) a presented one equals: its index, or -1. Both sides are hashed
 * to 32-byte SHA-256 digests, so a comparison takes the same time whatever the lengths or the first differing byte; every
 * value is compared, without stopping at a match, so timing tells neither which matched nor how many are configured.
 */
export function secretsMatcher(values: () => readonly string[]): (presented: string) => number {
  let last: readonly string[] | undefined;
  let digests: Buffer[] = [];
  return (presented) => {
    const current = values();
    if (current !== last) {
      last = current;
      digests = current.map((v) => sha256Digest(v));
    }
    return firstMatch(sha256Digest(presented), digests);
  };
}

/** The index of the first of `candidates` equal to `digest` (all compared, constant time each), or -1. */
export function firstMatch(digest: Buffer, candidates: readonly Buffer[]): number {
  let found = -1;
  candidates.forEach((c, i) => {
    const eq = c.length === digest.length && timingSafeEqual(c, digest);
    if (eq && found < 0) found = i;
  });
  return found;
}

/**
 * SHA-256 as 32 bytes: what a configured API key is kept as, and compared with in constant time.
 * The hex form, decoded: measured faster than crypto.hash's 'buffer' output and than createHash().digest() (Node 26).
 */
export function sha256Digest(data: string | Buffer): Buffer {
  return Buffer.from(hash('sha256', data, 'hex'), 'hex');
}

export function sha256Hex(data: string | Buffer): string {
  return hash('sha256', data, 'hex');
}

/** The audit identity of a credential: first 12 hex characters of its SHA-256. Never the credential itself. */
export function credentialId(secret: string): string {
  return sha256Hex(secret).slice(0, 12);
}

export function hmacSha256(secret: string, data: Buffer | string, encoding: 'hex' | 'base64'): string {
  return createHmac('sha256', secret).update(data).digest(encoding);
}
