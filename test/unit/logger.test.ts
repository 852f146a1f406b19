import { describe, expect, it } from '@jest/globals';
import { createLogger } from '../../src/shared/logger.js';

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

  it('leaves lines without secrets untouched', () => {
    const { logger, records } = collect({ secrets: ['topsecret-key'] });
    logger.info('plain', { a: 'b' });
    expect(records()[0]).toMatchObject({ msg: 'plain', a: 'b' });
  });
});
