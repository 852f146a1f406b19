import { afterAll, describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigError, type ConfigProblem } from '../../../src/shared/errors.js';
import { contentsDigest, FileProblem, watchFiles } from '../../../src/shared/fileReload.js';

/**
 * The reload poll every file-backed setting uses (TLS files, the keys file, the senders' secret
 * files), driven by check() instead of its timer: a changed valid file is put in use once, an
 * invalid one refused once per distinct contents while what is in use stays, and nothing throws.
 */
const dir = mkdtempSync(join(tmpdir(), 'opsgate-filereload-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function setup(initial: string) {
  const path = join(dir, `f-${Math.random().toString(36).slice(2)}`);
  writeFileSync(path, initial);
  const events: string[] = [];
  let inUse = initial;
  const reloader = watchFiles<string>({
    files: [{ variable: 'SOME_FILE', path }],
    initialDigest: contentsDigest([Buffer.from(initial)]),
    intervalMs: 3_600_000,
    parse: ([b]) => {
      const text = b!.toString('utf8');
      if (text.startsWith('bad')) throw new ConfigError([{ variable: 'SOME_FILE', problem: `is ${text}` }]);
      return text;
    },
    apply: (v) => {
      if (v === 'unusable') throw new FileProblem('SOME_FILE', 'was refused where it is used');
      inUse = v;
    },
    onApplied: (v) => events.push(`applied ${v}`),
    onRefused: (problems: readonly ConfigProblem[]) => events.push(`refused ${problems.map((p) => p.problem).join(';')}`),
    onRestored: () => events.push('restored'),
  });
  return { path, events, reloader, inUse: () => inUse };
}

describe('watchFiles', () => {
  it('unchanged contents do nothing; changed valid contents are applied once', async () => {
    const t = setup('one');
    await t.reloader.check();
    expect(t.events).toEqual([]);
    writeFileSync(t.path, 'two');
    await t.reloader.check();
    await t.reloader.check();
    expect(t.events).toEqual(['applied two']);
    expect(t.inUse()).toBe('two');
    t.reloader.close();
  });

  it('invalid contents are refused once per distinct contents; what is in use stays; a later valid change is applied', async () => {
    const t = setup('one');
    writeFileSync(t.path, 'bad-1');
    await t.reloader.check();
    await t.reloader.check();
    writeFileSync(t.path, 'bad-2');
    await t.reloader.check();
    writeFileSync(t.path, 'unusable');
    await t.reloader.check();
    expect(t.inUse()).toBe('one');
    writeFileSync(t.path, 'three');
    await t.reloader.check();
    expect(t.events).toEqual(['refused is bad-1', 'refused is bad-2', 'refused was refused where it is used', 'applied three']);
    t.reloader.close();
  });

  it('a file gone is refused once (the problem names the variable, not the path); back to the contents in use is a restore', async () => {
    const t = setup('one');
    rmSync(t.path);
    await t.reloader.check();
    await t.reloader.check();
    writeFileSync(t.path, 'one');
    await t.reloader.check();
    expect(t.events).toEqual(['refused cannot be read (ENOENT)', 'restored']);
    expect(t.events.join('\n')).not.toContain(dir);
    t.reloader.close();
  });
});
