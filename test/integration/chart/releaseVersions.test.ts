import { describe, expect, test } from '@jest/globals';
import { cpSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse } from 'yaml';
import { REPO, run } from '../../helpers/cluster.js';

/**
 * One version source for a release: package.json "version" is the chart's appVersion and the tag of
 * both images (hack/release.sh builds them with it and refuses to build or push when they differ).
 */
const pkg = JSON.parse(readFileSync(join(REPO, 'package.json'), 'utf8')) as { version: string };
const chart = parse(readFileSync(join(REPO, 'charts', 'opsgate', 'Chart.yaml'), 'utf8')) as { version: string; appVersion: string };

describe('release versions', () => {
  test('package.json version = Chart.yaml appVersion, and hack/release.sh reads the same', async () => {
    expect(String(chart.appVersion)).toBe(pkg.version);
    const r = await run(join(REPO, 'hack', 'release.sh'), ['versions']);
    expect(r.stderr).toBe('');
    expect(r.stdout.trim()).toBe(`app=${pkg.version} chart=${chart.version}`);
  });

  test('a chart appVersion that differs from package.json stops the release', async () => {
    // A copy of the three files the script reads, with the chart one patch ahead.
    const dir = mkdtempSync(join(tmpdir(), 'opsgate-release-'));
    mkdirSync(join(dir, 'hack'));
    mkdirSync(join(dir, 'charts', 'opsgate'), { recursive: true });
    cpSync(join(REPO, 'hack', 'release.sh'), join(dir, 'hack', 'release.sh'));
    cpSync(join(REPO, 'package.json'), join(dir, 'package.json'));
    const chartYaml = readFileSync(join(REPO, 'charts', 'opsgate', 'Chart.yaml'), 'utf8');
    cpSync(join(REPO, 'charts', 'opsgate', 'Chart.yaml'), join(dir, 'charts', 'opsgate', 'Chart.yaml'));
    writeFileSync(join(dir, 'charts', 'opsgate', 'Chart.yaml'), chartYaml.replace(/^appVersion:.*$/m, 'appVersion: "9.9.9"'));
    for (const cmd of ['build', 'push', 'versions']) {
      const r = await run(join(dir, 'hack', 'release.sh'), [cmd], { env: { REGISTRY: '127.0.0.1:1/x' } });
      expect(r.code).toBe(1);
      expect(r.stderr).toContain(`appVersion (9.9.9) != package.json version (${pkg.version})`);
    }
  });

  test('make push without REGISTRY names the variable instead of pushing anywhere', async () => {
    const r = await run('make', ['--no-print-directory', 'push', 'REGISTRY=']);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toContain('usage: make push REGISTRY=host[:port][/path]');
  });
});
