import { describe, expect, it } from '@jest/globals';
import { createLogger } from '../../../src/shared/logger.js';

function collect(opts: Parameters<typeof createLogger>[0] = {}) {
  const lines: string[] = [];
  const logger = createLogger({ ...opts, write: (l) => lines.push(l) });
  return { logger, lines, records: () => lines.map((l) => JSON.parse(l) as Record<string, unknown>) };
}

describe('logger', () => {
  it('writes one JSON object per line with time, level, msg, base and bound fields', () => {
    const { logger, records } = collect({ base: { component: 'api' } });
    logger.child({ request_id: 'r1' }).info('hello', { n: 1 });
    expect(records()).toEqual([{ time: expect.any(String), level: 'info', msg: 'hello', component: 'api', request_id: 'r1', n: 1 }]);
  });

  it('drops lines below the level', () => {
    const { logger, lines } = collect({ level: 'warn' });
    logger.info('no');
    logger.debug('no');
    logger.warn('yes');
    expect(lines).toHaveLength(1);
  });

  it('logs an error as message and type, never its stack', () => {
    const { logger, lines } = collect();
    logger.error('boom', { err: new TypeError('bad thing') });
    expect(JSON.parse(lines[0]!)).toMatchObject({ error: 'bad thing', error_type: 'TypeError' });
    expect(lines[0]).not.toMatch(/at .*\.ts:\d+/);
  });

  it('redacts every configured secret, raw and JSON-escaped, wherever it appears', () => {
    const quoted = 'se"cr\\et-with-quotes';
    const { logger, lines } = collect({ secrets: ['topsecret-key', quoted, 'topsecret-key-longer'] });
    logger.info('auth failed for topsecret-key', { header: `Bearer ${quoted}`, nested: { v: 'x topsecret-key-longer y' } });
    const line = lines[0]!;
    expect(line).not.toContain('topsecret');
    expect(line).not.toContain('cr\\\\et');
    expect(JSON.parse(line)).toMatchObject({
      msg: 'auth failed for [REDACTED]',
      header: 'Bearer [REDACTED]',
      nested: { v: 'x [REDACTED] y' },
    });
  });

  it('redacts secrets in child bindings and in the message too (the whole serialised line)', () => {
    const { logger, lines } = collect({ secrets: ['topsecret-key'] });
    logger.child({ presented: 'topsecret-key' }).warn('bad key topsecret-key');
    expect(lines[0]).not.toContain('topsecret');
    expect(JSON.parse(lines[0]!)).toMatchObject({ level: 'warn', msg: 'bad key [REDACTED]', presented: '[REDACTED]' });
  });

  it('addSecrets: a credential reloaded while the process runs is redacted from then on, by children too', () => {
    const { logger, lines } = collect({ secrets: ['topsecret-key'] });
    const child = logger.child({ component: 'api' });
    child.info('before rotated-secret-0042');
    logger.addSecrets(['rotated-secret-0042']);
    child.info('after rotated-secret-0042 and topsecret-key');
    expect(JSON.parse(lines[0]!).msg).toBe('before rotated-secret-0042');
    expect(JSON.parse(lines[1]!).msg).toBe('after [REDACTED] and [REDACTED]');
  });

  it('keeps the field names the audit contract and dashboards read: level label, ISO time, msg', () => {
    const { logger, records } = collect();
    logger.info('audit', {
      audit: true,
      who: 'key:0123456789ab',
      method: 'POST',
      path: '/webhook/scm',
      body_sha256: 'ab'.repeat(32),
      status: 202,
      request_id: 'r-1',
      skipped: undefined,
    });
    const [r] = records();
    expect(r).toEqual({
      level: 'info',
      time: expect.any(String),
      msg: 'audit',
      audit: true,
      who: 'key:0123456789ab',
      method: 'POST',
      path: '/webhook/scm',
      body_sha256: 'ab'.repeat(32),
      status: 202,
      request_id: 'r-1',
    });
    expect(new Date(String(r!.time)).toISOString()).toBe(r!.time);
  });

  it('takes messages literally (no printf-style interpolation) and logs a non-Error err as text', () => {
    const { logger, records } = collect();
    logger.info('100% done %s %d');
    logger.warn('50% %j', { err: 'plain string' });
    expect(records()).toEqual([
      expect.objectContaining({ msg: '100% done %s %d' }),
      expect.objectContaining({ msg: '50% %j', error: 'plain string' }),
    ]);
    expect(records()[1]).not.toHaveProperty('err');
  });

  it('survives circular fields', () => {
    const { logger, records } = collect();
    const a: Record<string, unknown> = { name: 'a' };
    a.self = a;
    logger.info('circular', { a });
    expect(records()[0]).toMatchObject({ msg: 'circular', a: { name: 'a', self: '[Circular]' } });
  });

  it('flush resolves (nothing buffered with a synchronous collector)', async () => {
    const { logger, lines } = collect();
    logger.info('x');
    await logger.flush();
    expect(lines).toHaveLength(1);
  });

  it('leaves lines without secrets untouched', () => {
    const { logger, records } = collect({ secrets: ['topsecret-key'] });
    logger.info('plain', { a: 'b' });
    expect(records()[0]).toMatchObject({ msg: 'plain', a: 'b' });
  });
});

describe('line separators', () => {
  it('U+2028 and U+2029 are written escaped, as CR, LF and ESC are; the value reads back the same', () => {
    for (const secrets of [[], ['topsecret-key']]) {
      const { logger, lines, records } = collect({ secrets });
      const value = 'a\u2028b\u2029c\rd\ne\u001bf';
      logger.info('m\u2028sg', { value });
      expect(lines).toHaveLength(1);
      for (const raw of ['\u2028', '\u2029', '\r', '\n', '\u001b']) expect(lines[0]).not.toContain(raw);
      expect(lines[0]).toContain('a\\u2028b\\u2029c\\rd\\ne\\u001bf');
      expect(records()[0]).toMatchObject({ msg: 'm\u2028sg', value });
    }
  });
});
