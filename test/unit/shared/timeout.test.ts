import { describe, expect, it } from '@jest/globals';
import { settlesWithin, TimeoutError, withFallback, withTimeout } from '../../../src/shared/timeout.js';

/** The one deadline helper of both processes, on real timers. */
const never = () => new Promise<never>(() => {});
const later = <T>(ms: number, v: T) => new Promise<T>((resolve) => setTimeout(() => resolve(v), ms));
const failLater = (ms: number, message: string) => new Promise<never>((_, reject) => setTimeout(() => reject(new Error(message)), ms));

describe('withTimeout', () => {
  it('settles like the promise when it is in time', async () => {
    await expect(withTimeout(later(5, 'v'), 1000)).resolves.toBe('v');
    await expect(withTimeout(failLater(5, 'boom'), 1000)).rejects.toThrow('boom');
  });
  it('rejects with TimeoutError naming what timed out', async () => {
    const err = await withTimeout(never(), 20, 'queue read').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TimeoutError);
    expect((err as Error).message).toBe('queue read timed out after 20 ms');
  });
  it('rejects with the error onTimeout makes, calling it once at the deadline', async () => {
    let calls = 0;
    const p = withTimeout(never(), 20, () => {
      calls++;
      return new Error('attempt deadline');
    });
    expect(calls).toBe(0);
    await expect(p).rejects.toThrow('attempt deadline');
    expect(calls).toBe(1);
  });
  it('a late rejection after the deadline is ignored, never unhandled', async () => {
    const unhandled: unknown[] = [];
    const onUnhandled = (e: unknown) => unhandled.push(e);
    process.on('unhandledRejection', onUnhandled);
    try {
      await expect(withTimeout(failLater(40, 'late'), 10, 'x')).rejects.toBeInstanceOf(TimeoutError);
      await later(60, undefined);
      expect(unhandled).toEqual([]);
    } finally {
      process.off('unhandledRejection', onUnhandled);
    }
  });
});

describe('withFallback', () => {
  it('resolves with the fallback at the deadline, calling it once', async () => {
    let calls = 0;
    await expect(
      withFallback(never(), 20, () => {
        calls++;
        return -1;
      }),
    ).resolves.toBe(-1);
    expect(calls).toBe(1);
  });
  it('in time: the value, or the rejection, and no fallback', async () => {
    let calls = 0;
    const fallback = () => {
      calls++;
      return 'fallback';
    };
    await expect(withFallback(later(5, 'v'), 1000, fallback)).resolves.toBe('v');
    await expect(withFallback(failLater(5, 'boom'), 1000, fallback)).rejects.toThrow('boom');
    expect(calls).toBe(0);
  });
});

describe('settlesWithin', () => {
  it('true when the promise resolves or rejects in time, false past the deadline', async () => {
    await expect(settlesWithin(later(5, 'v'), 1000)).resolves.toBe(true);
    await expect(settlesWithin(failLater(5, 'boom'), 1000)).resolves.toBe(true);
    await expect(settlesWithin(never(), 20)).resolves.toBe(false);
    await expect(settlesWithin(never(), -5)).resolves.toBe(false);
  });
});
