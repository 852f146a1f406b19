import { afterAll, describe, expect, it } from '@jest/globals';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REPO_ROOT } from '../../helpers/processes.js';

/** hack/test-summary.mjs: each tier's slowest suites and the closing line CI ends with. */
describe('test-summary', () => {
  const dir = mkdtempSync(join(tmpdir(), 'opsgate-summary-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  const result = (name: string, r: { passed: number; failed: number; suites: Array<[string, number]> }) => {
    const file = join(dir, name);
    writeFileSync(
      file,
      JSON.stringify({
        success: r.failed === 0,
        numPassedTests: r.passed,
        numFailedTests: r.failed,
        numPendingTests: 0,
        numRuntimeErrorTestSuites: 0,
        testResults: r.suites.map(([suite, ms]) => ({ name: join(REPO_ROOT, suite), startTime: 1000, endTime: 1000 + ms })),
      }),
    );
    return file;
  };
  const summary = (args: string[]) => {
    const r = spawnSync(process.execPath, [join(REPO_ROOT, 'hack/test-summary.mjs'), ...args], { cwd: REPO_ROOT, encoding: 'utf8' });
    return { status: r.status, lines: r.stdout.trim().split('\n'), stderr: r.stderr };
  };

  it('lists the slowest suites of every file, slowest first, and sums the tests', () => {
    const a = result('a.json', {
      passed: 3,
      failed: 0,
      suites: [
        ['test/unit/a.test.ts', 1200],
        ['test/unit/b.test.ts', 300],
      ],
    });
    const b = result('b.json', { passed: 4, failed: 0, suites: [['test/integration/c.test.ts', 45_000]] });
    const r = summary(['--label', 'test', '--slowest', '2', a, b]);
    expect(r.lines).toEqual([
      'test: slowest 2 of 3 suites',
      '     45.0 s  test/integration/c.test.ts',
      '      1.2 s  test/unit/a.test.ts',
      'test: 7 passed, 0 failed',
    ]);
    expect(r.status).toBe(0);
  });

  it('fails on a failed test and on a missing result file (a tier that did not run to its end)', () => {
    const ok = result('ok.json', { passed: 2, failed: 0, suites: [] });
    const bad = result('bad.json', { passed: 1, failed: 1, suites: [] });
    const failed = summary([ok, bad]);
    expect(failed.lines.at(-1)).toBe('tests: 3 passed, 1 failed');
    expect(failed.status).toBe(1);
    const missing = summary([ok, join(dir, 'never-written.json')]);
    expect(missing.lines.at(-1)).toBe('tests: 2 passed, 1 failed');
    expect(missing.stderr).toContain('no result file');
    expect(missing.status).toBe(1);
  });
});
