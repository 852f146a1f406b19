/**
 * The comparison of a presented secret with a configured one (secretsMatcher, src/shared/crypto.ts,
 * behind every API key, bearer token and webhook token check) must not short-circuit: the time it
 * takes must not depend on where the first differing character is, nor on whether the strings are
 * equal, otherwise a
 * caller could guess an API key / token / webhook secret one character at a time.
 *
 * How this is shown without flaky wall-clock thresholds on a loaded 2-core machine:
 * - the secret is large (256 KiB), so the work a short-circuiting comparison would skip is
 *   milliseconds, far above scheduler noise;
 * - the variants (first char differs, middle differs, last differs, equal) are measured
 *   interleaved in random order in every round, so load spikes hit all variants alike, and
 *   compared by their medians (robust to preemption outliers);
 * - only ratios between variants are asserted, never absolute times;
 * - a positive control runs the same harness on an early-exit comparator and must see the
 *   leak (ratio far below 1), proving the harness can detect what it claims is absent.
 * Expected ratios: early-exit ~0.001, secretsMatcher ~1.0; the assertion bounds (0.2 / 0.5..2) leave a
 * wide margin on both sides.
 */
import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import { performance } from 'node:perf_hooks';
import express from 'express';
import request from 'supertest';
import { createHmac } from 'node:crypto';
import { secretsMatcher } from '../../../src/shared/crypto.js';
import { verifySender } from '../../../src/middleware/auth.js';
import { errorHandler } from '../../../src/middleware/errors.js';
import { silentLogger } from '../../../src/shared/logger.js';
import { createMetrics } from '../../../src/shared/metrics.js';

const SIZE = 256 * 1024;
const secret = 'k'.repeat(SIZE);
const differAt = (pos: number) => secret.slice(0, pos) + 'X' + secret.slice(pos + 1);
const variants = {
  first: differAt(0),
  middle: differAt(SIZE >> 1),
  last: differAt(SIZE - 1),
  equal: 'k'.repeat(SIZE), // a distinct string object with the same content
};
type Variant = keyof typeof variants;

/** Whether `presented` is `secret`, as the API compares a presented credential with a configured one. */
const secretEquals = (secret: string, presented: string): boolean => secretsMatcher(() => [secret])(presented) === 0;

/** A comparator that returns at the first difference: what the harness must catch. */
function earlyExitEqual(a: string, b: string): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a.charCodeAt(i) !== b.charCodeAt(i)) return false;
  return true;
}

function median(xs: number[]): number {
  const s = [...xs].sort((x, y) => x - y);
  return s[s.length >> 1]!;
}

function shuffle<T>(xs: T[]): T[] {
  for (let i = xs.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [xs[i], xs[j]] = [xs[j]!, xs[i]!];
  }
  return xs;
}

function measure(cmp: (a: string, b: string) => boolean, rounds: number, callsPerSample: number) {
  const samples: Record<Variant, number[]> = { first: [], middle: [], last: [], equal: [] };
  const names = Object.keys(variants) as Variant[];
  let sink = 0;
  // warm-up (JIT, hash state)
  for (const n of names) for (let i = 0; i < 5; i++) sink += cmp(secret, variants[n]) ? 1 : 0;
  for (let r = 0; r < rounds; r++) {
    for (const n of shuffle([...names])) {
      const candidate = variants[n];
      const t0 = performance.now();
      for (let i = 0; i < callsPerSample; i++) sink += cmp(secret, candidate) ? 1 : 0;
      samples[n].push(performance.now() - t0);
    }
  }
  // The results must be right too (and `sink` keeps the calls from being optimised away).
  expect(sink).toBe((rounds * callsPerSample + 5) * 1);
  return {
    first: median(samples.first),
    middle: median(samples.middle),
    last: median(samples.last),
    equal: median(samples.equal),
  };
}

describe('the comparison of a presented secret does not short-circuit', () => {
  it('positive control: the harness detects an early-exit comparator', () => {
    const m = measure(earlyExitEqual, 41, 3);
    // Stopping at the first character is orders of magnitude faster than reading 256 KiB.
    expect(m.first / m.last).toBeLessThan(0.2);
    expect(m.first / m.equal).toBeLessThan(0.2);
  });

  it('takes the same time wherever the first difference is, and for equal inputs', () => {
    const m = measure(secretEquals, 41, 3);
    const ratios = [m.first / m.last, m.middle / m.last, m.first / m.equal, m.last / m.equal];
    for (const r of ratios) {
      expect(r).toBeGreaterThan(0.5);
      expect(r).toBeLessThan(2);
    }
  }, 120_000);
});

describe('the comparison of a presented secret is a correct equality', () => {
  it('equals === on arbitrary strings (unicode, control characters, different lengths)', () => {
    fc.assert(
      fc.property(fc.string({ unit: 'binary' }), fc.string({ unit: 'binary' }), (a, b) => {
        expect(secretEquals(a, b)).toBe(a === b);
        expect(secretEquals(a, a)).toBe(true);
      }),
      { numRuns: 500 },
    );
  });

  it('does not confuse a secret with its prefixes, extensions or case variants', () => {
    fc.assert(
      fc.property(fc.string({ minLength: 1, maxLength: 64 }), fc.string({ minLength: 1, maxLength: 8 }), (s, extra) => {
        expect(secretEquals(s, s + extra)).toBe(false);
        expect(secretEquals(s + extra, s)).toBe(false);
        expect(secretEquals(s, s.slice(0, -1))).toBe(false);
        if (s.toUpperCase() !== s) expect(secretEquals(s, s.toUpperCase())).toBe(false);
      }),
      { numRuns: 300 },
    );
  });
});

describe("a sender's HMAC signature (verifySender, the X-Hub-Signature-256 form)", () => {
  it('accepts exactly the right digest and rejects any single-character change of it', async () => {
    const source = {
      name: 'test',
      title: 'Test',
      verification: { kind: 'hmac', header: 'x-sig', algorithm: 'sha256', prefix: 'sha256=', encoding: 'hex' },
    } as const;
    const metrics = createMetrics('api', 'test', { defaults: false });
    let key = '';
    const sig = verifySender({ source, secret: () => [key], metrics });
    const app = express();
    app.post('/x', sig.before, express.raw({ type: () => true }), sig.after, (_req, res) => {
      res.json({});
    });
    app.use(errorHandler(silentLogger));
    const codeOf = async (body: Buffer, header: string | undefined) => {
      const req = request(app).post('/x').set('Content-Type', 'application/octet-stream');
      const res = await (header === undefined ? req : req.set('x-sig', header)).send(body);
      return res.status === 200 ? 'ok' : (res.body as { code: string }).code;
    };
    await fc.assert(
      fc.asyncProperty(fc.string({ minLength: 1 }), fc.uint8Array({ maxLength: 512 }), fc.nat(), async (k, bytes, pos) => {
        key = k;
        const body = Buffer.from(bytes);
        const good = 'sha256=' + createHmac('sha256', k).update(body).digest('hex');
        expect(await codeOf(body, good)).toBe('ok');
        const i = 7 + (pos % 64);
        const flipped = good.slice(0, i) + (good[i] === '0' ? '1' : '0') + good.slice(i + 1);
        expect(await codeOf(body, flipped)).toBe('invalid_signature');
        expect(await codeOf(body, good.slice(0, -1))).toBe('invalid_signature');
        expect(await codeOf(body, good.slice(7))).toBe('malformed_signature');
        expect(await codeOf(body, undefined)).toBe('missing_signature');
      }),
      { numRuns: 100 },
    );
  }, 60_000);
});
