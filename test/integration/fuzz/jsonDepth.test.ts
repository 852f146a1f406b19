/**
 * The nesting-depth guard of webhook payloads (src/middleware/body.ts valueDeeperThan): agrees
 * with the real nesting depth of any JSON value, whatever strings (quotes, backslashes, brackets)
 * or keys it contains; parseJson turns too-deep payloads into 422 instead of letting them reach the queue.
 */
import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import { MAX_JSON_DEPTH, parseJson, valueDeeperThan } from '../../../src/middleware/body.js';
import { AppError } from '../../../src/shared/errors.js';

/** Reference: nesting depth by walking the parsed value (fine for the small values generated here). */
function depthOf(v: unknown): number {
  if (Array.isArray(v)) return 1 + Math.max(0, ...v.map(depthOf));
  if (v !== null && typeof v === 'object') return 1 + Math.max(0, ...Object.values(v).map(depthOf));
  return 0;
}

const tricky = fc.string({ unit: 'binary' }).map((s) => s + '\\"{[}]');

describe('valueDeeperThan', () => {
  it('matches the real depth of any JSON value, strings with brackets and escapes included', () => {
    const value = fc.letrec((tie) => ({
      node: fc.oneof(
        { depthSize: 'small', withCrossShrink: true },
        fc.oneof(tricky, fc.integer(), fc.constant(null), fc.boolean()),
        fc.array(tie('node'), { maxLength: 3 }),
        fc.dictionary(tricky, tie('node'), { maxKeys: 3 }),
      ),
    })).node;
    fc.assert(
      fc.property(value, fc.integer({ min: 0, max: 8 }), (v, max) => {
        const text = JSON.stringify(v);
        expect(valueDeeperThan(JSON.parse(text), max)).toBe(depthOf(v) > max);
      }),
      { numRuns: 1000 },
    );
  });

  it('parseJson: payloads deeper than the limit are 422, at the limit they parse', () => {
    const at = '['.repeat(MAX_JSON_DEPTH) + ']'.repeat(MAX_JSON_DEPTH);
    expect(parseJson(Buffer.from(at))).toBeDefined();
    for (const d of [MAX_JSON_DEPTH + 1, 5000, 100_000]) {
      const deep = '{"a":'.repeat(d) + '1' + '}'.repeat(d);
      let err: unknown;
      try {
        parseJson(Buffer.from(deep));
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(AppError);
      expect((err as AppError).statusCode).toBe(422);
    }
    // Invalid JSON stays 400 whatever its depth.
    expect(() => parseJson(Buffer.from('['.repeat(10_000)))).toThrow(/not valid JSON/);
  });
});
